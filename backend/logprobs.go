package main

import (
	"math"

	"gollm/batchmanager"
)

// topLogprobs computes, from res's generation logits (one row per generated token of
// the response, the model's logits after the embedding bias and before penalties and
// temperature), each generated token's log-probability under the model's distribution
// (a log-softmax in float64) and the k most likely tokens of its position with theirs,
// best first (ties: lower id). The rows belong to the last tokens of res.Tokens[:Length]
// (non-streaming answers may begin with the prompt).
func topLogprobs(res *batchmanager.Result, vocab, k int) (lps []float32, topIDs []int32, topLPs []float32) {
	rows := 0
	if vocab > 0 {
		rows = min(len(res.GenerationLogits)/vocab, res.Length)
	}
	ids := res.Tokens[res.Length-rows : res.Length]
	lps = make([]float32, rows)
	topIDs = make([]int32, 0, rows*k)
	topLPs = make([]float32, 0, rows*k)
	best := make([]int, 0, k+1)
	for i, id := range ids {
		row := res.GenerationLogits[i*vocab : (i+1)*vocab]
		lse := logSumExp(row)
		lps[i] = float32(float64(row[id]) - lse)
		best = topK(best[:0], row, k)
		for _, j := range best {
			topIDs = append(topIDs, int32(j))
			topLPs = append(topLPs, float32(float64(row[j])-lse))
		}
	}
	return lps, topIDs, topLPs
}

// logSumExp is log Σ exp(row), computed stably in float64 (exp from the math package:
// these figures are reported, so they are exact to float64 rather than fast).
func logSumExp(row []float32) float64 {
	m := math.Inf(-1)
	for _, v := range row {
		m = max(m, float64(v))
	}
	if math.IsInf(m, -1) {
		return m
	}
	var s float64
	for _, v := range row {
		s += math.Exp(float64(v) - m)
	}
	return m + math.Log(s)
}

// topK appends to best (empty, capacity k+1) the indexes of the k largest values of row,
// largest first (ties: the lower index).
func topK(best []int, row []float32, k int) []int {
	if k <= 0 {
		return best
	}
	for j, v := range row {
		if len(best) == k && v <= row[best[k-1]] {
			continue
		}
		i := len(best)
		for i > 0 && v > row[best[i-1]] {
			i--
		}
		best = append(best, 0)
		copy(best[i+1:], best[i:])
		best[i] = j
		if len(best) > k {
			best = best[:k]
		}
	}
	return best
}

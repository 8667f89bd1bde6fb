package batchmanager

import (
	"math"

	"gollm/engine"
)

// addTopLogprobs records a generated token's log-probability under its position's
// logits row and the k best tokens of the row with theirs (ReturnTopLogprobs): the
// log-softmax in float64, ties to the lower id. best is scratch of capacity k+1,
// returned for reuse. Only these k+1 numbers outlive the step, never the row.
func (b *branch) addTopLogprobs(row []float32, tok int32, k int, best []int) []int {
	best = bestOf(best[:0], row, k)
	lse := logSumExp(row)
	lp := func(v float32) float32 {
		if math.IsInf(lse, -1) {
			return float32(math.Inf(-1))
		}
		return float32(float64(v) - lse)
	}
	b.tokLPs = append(b.tokLPs, lp(row[tok]))
	for _, j := range best {
		b.topIDs = append(b.topIDs, int32(j))
		b.topLPs = append(b.topLPs, lp(row[j]))
	}
	return best
}

// logSumExp is log Σ exp(row), in float64 around the row's maximum (engine.ExpFast:
// exact to a few parts in 10^9, far below a float32's resolution).
func logSumExp(row []float32) float64 {
	m := math.Inf(-1)
	for _, v := range row {
		m = max(m, float64(v))
	}
	if math.IsInf(m, 0) || math.IsNaN(m) {
		return m
	}
	var s float64
	for _, v := range row {
		s += engine.ExpFast(float64(v) - m)
	}
	return m + math.Log(s)
}

// bestOf appends to best (empty, capacity k+1) the indexes of the k largest values of row,
// largest first (ties: the lower index).
func bestOf(best []int, row []float32, k int) []int {
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

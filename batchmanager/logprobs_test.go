package batchmanager

import (
	"math"
	"reflect"
	"slices"
	"testing"

	"gollm/engine"
)

// TestBestOfAndLogSumExp checks the logprob helpers against hand values.
func TestBestOfAndLogSumExp(t *testing.T) {
	row := []float32{1, 5, 3, 5, -2}
	for _, c := range []struct {
		k    int
		want []int
	}{
		{3, []int{1, 3, 2}}, // the tie goes to the lower index
		{0, nil},
		{9, []int{1, 3, 2, 0, 4}}, // more than the row: all of it
	} {
		if got := bestOf(make([]int, 0, c.k+1), row, c.k); !reflect.DeepEqual(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
			t.Errorf("bestOf(%d) = %v, want %v", c.k, got, c.want)
		}
	}
	if lse := logSumExp([]float32{0, 0}); math.Abs(lse-math.Ln2) > 1e-9 {
		t.Errorf("logSumExp(0, 0) = %v, want ln 2", lse)
	}
	if lse := logSumExp([]float32{float32(math.Inf(-1))}); !math.IsInf(lse, -1) {
		t.Errorf("logSumExp(-Inf) = %v, want -Inf", lse)
	}
}

// TestTopLogprobsMatchTheGenerationLogits: each generated token's TokenLogprobs is the
// log-softmax of its position's row at its id, and TopLogprobIDs / TopLogprobs are the
// row's k best with theirs, streamed and not, for sampled tokens and for a group's
// sequences.
func TestTopLogprobsMatchTheGenerationLogits(t *testing.T) {
	_, c := start(t, cpuEngine(t, 64, 8), Config{})
	const k = 4
	reqs := []*InferenceRequest{
		{ID: 1, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 6, PadID: -1, ExcludeInputInOutput: true},
		{ID: 2, InputIDs: []int32{4, 5}, MaxNewTokens: 6, PadID: -1, Streaming: true, Sampling: engine.SamplingParams{Temperature: 1, Seed: 3}},
		{ID: 3, InputIDs: []int32{6}, MaxNewTokens: 5, PadID: -1, Streaming: true, NumReturnSequences: 2, Sampling: engine.SamplingParams{Temperature: 1, Seed: 4}},
	}
	for _, r := range reqs {
		r.ReturnGenerationLogits, r.ReturnTopLogprobs, r.TopLogprobs = true, true, k
	}
	c.add(reqs...)
	c.wait(t, len(reqs))
	for _, r := range reqs {
		rows := map[int][]float32{}
		var toks, topIDs = map[int][]int32{}, map[int][]int32{}
		lps, tops := map[int][]float32{}, map[int][]float32{}
		for _, resp := range c.responses(r.ID) {
			if resp.err != nil {
				t.Fatalf("request %d: %v", r.ID, resp.err)
			}
			o := resp.out
			n := len(o.TokenLogprobs)
			i := o.SequenceIndex
			toks[i] = append(toks[i], o.Tokens[o.Length-n:o.Length]...)
			rows[i], lps[i] = append(rows[i], o.GenerationLogits...), append(lps[i], o.TokenLogprobs...)
			topIDs[i], tops[i] = append(topIDs[i], o.TopLogprobIDs...), append(tops[i], o.TopLogprobs...)
		}
		for i := range toks {
			V := len(rows[i]) / max(1, len(toks[i]))
			if len(toks[i]) == 0 || len(topIDs[i]) != k*len(toks[i]) || len(tops[i]) != k*len(toks[i]) {
				t.Fatalf("request %d sequence %d: %d tokens, %d and %d alternatives", r.ID, i, len(toks[i]), len(topIDs[i]), len(tops[i]))
			}
			for j, id := range toks[i] {
				row := rows[i][j*V : (j+1)*V]
				var z float64
				for _, l := range row {
					z += math.Exp(float64(l))
				}
				lse := math.Log(z)
				if d := float64(lps[i][j]) - (float64(row[id]) - lse); math.Abs(d) > 1e-5 {
					t.Errorf("request %d sequence %d token %d: logprob %g, log-softmax %g", r.ID, i, j, lps[i][j], float64(row[id])-lse)
				}
				order := make([]int, V)
				for x := range order {
					order[x] = x
				}
				slices.SortStableFunc(order, func(a, b int) int {
					switch {
					case row[a] > row[b]:
						return -1
					case row[a] < row[b]:
						return 1
					}
					return 0
				})
				for x := range k {
					if topIDs[i][j*k+x] != int32(order[x]) || math.Abs(float64(tops[i][j*k+x])-(float64(row[order[x]])-lse)) > 1e-5 {
						t.Errorf("request %d sequence %d token %d alternative %d: %d %g, want %d %g", r.ID, i, j, x,
							topIDs[i][j*k+x], tops[i][j*k+x], order[x], float64(row[order[x]])-lse)
					}
				}
			}
		}
	}
}

package tests

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// TestTopLogprobsThroughTriton checks return_top_logprobs against the generation logits
// of the same request: each generated token's token_logprobs is the log-softmax of its
// row at its id, and top_logprob_ids / top_logprobs are the row's k best with theirs,
// streamed and not; generation_logits come only when asked.
func TestTopLogprobsThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ctx := testContext(t, 3*time.Minute)
	prompt := []int32{464, 2068, 7586, 21831}
	const n, k = 5, 3
	for _, streaming := range []bool{false, true} {
		t.Run(fmt.Sprintf("streaming %v", streaming), func(t *testing.T) {
			in := append(tokenInputs(prompt, n, streaming), int32s("end_id", []int64{1, 1}, -1),
				int32s("return_top_logprobs", []int64{1, 1}, k), boolean("exclude_input_in_output", true))
			plain := collect(t, ctx, c, inferRequest(modelName, "top", in))
			for _, r := range plain {
				if _, _, ok := outputFP32(r, "generation_logits"); ok {
					t.Fatal("generation_logits sent without return_generation_logits")
				}
			}
			rs := collect(t, ctx, c, inferRequest(modelName, "top+logits", append(in, boolean("return_generation_logits", true))))
			var ids []int32
			var lps, tops, logits []float32
			var topIDs []int32
			for _, r := range rs {
				v, _, ok, _ := outputInt32(r, "output_ids")
				if !ok {
					continue
				}
				lp, shape, _ := outputFP32(r, "token_logprobs")
				tp, tshape, _ := outputFP32(r, "top_logprobs")
				ti, ishape, _, _ := outputInt32(r, "top_logprob_ids")
				gl, _, _ := outputFP32(r, "generation_logits")
				rows := int64(len(v))
				if !slices.Equal(shape, []int64{1, rows}) || !slices.Equal(tshape, []int64{1, rows, k}) || !slices.Equal(ishape, []int64{1, rows, k}) {
					t.Fatalf("%d tokens: token_logprobs %v, top_logprobs %v, top_logprob_ids %v", rows, shape, tshape, ishape)
				}
				ids, lps, tops, topIDs, logits = append(ids, v...), append(lps, lp...), append(tops, tp...), append(topIDs, ti...), append(logits, gl...)
			}
			if len(ids) != n || len(logits)%n != 0 {
				t.Fatalf("%d tokens, %d logits", len(ids), len(logits))
			}
			vocab := len(logits) / n
			for i, id := range ids {
				row := logits[i*vocab : (i+1)*vocab]
				var z float64
				for _, l := range row {
					z += math.Exp(float64(l))
				}
				lse := math.Log(z)
				if d := float64(lps[i]) - (float64(row[id]) - lse); math.Abs(d) > 1e-4 {
					t.Errorf("token %d (%d): token_logprobs %g, log-softmax %g", i, id, lps[i], float64(row[id])-lse)
				}
				order := make([]int, vocab)
				for j := range order {
					order[j] = j
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
				for j := range k {
					if topIDs[i*k+j] != int32(order[j]) || math.Abs(float64(tops[i*k+j])-(float64(row[order[j]])-lse)) > 1e-4 {
						t.Errorf("token %d alternative %d: id %d logprob %g, want %d %g", i, j, topIDs[i*k+j], tops[i*k+j], order[j], float64(row[order[j]])-lse)
					}
				}
			}
		})
	}
}

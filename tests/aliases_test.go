package tests

import (
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/tests/harness"
)

// TestOneCheckpointUnderSeveralNames serves the demo checkpoint as the models
// "ensemble" and "tensorrt_llm", the names TensorRT-LLM's client scripts default to:
// both answer, with the same greedy tokens, and the checkpoint's weights are read once —
// the second model logs that it shares them.
func TestOneCheckpointUnderSeveralNames(t *testing.T) {
	s := harness.Start(t, harness.Options{Models: []harness.Model{{Name: "ensemble"}, {Name: "tensorrt_llm"}}})
	c := s.Client(t)
	ctx := testContext(t, time.Minute)
	var got [][]int32
	for _, name := range []string{"ensemble", "tensorrt_llm"} {
		inputs := append(tokenInputs(tokenPrompt, 6, true), int32s("end_id", []int64{1, 1}, -1))
		res, err := streamInfer(ctx, c, inferRequest(name, name, inputs))
		if err != nil || res.errMsg != "" || len(res.tokens) != 6 {
			t.Fatalf("%s: %+v, %v; want 6 tokens", name, res, err)
		}
		got = append(got, res.tokens)
	}
	if !slices.Equal(got[0], got[1]) {
		t.Errorf("ensemble %v, tensorrt_llm %v: one checkpoint, two answers", got[0], got[1])
	}
	if n := strings.Count(s.Log(), "its weights are shared, not loaded again"); n != 1 {
		t.Errorf("%d models logged that they share the checkpoint's weights, want 1", n)
	}
}

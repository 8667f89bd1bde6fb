package tests

// The mixture-of-experts families through tritonserver on the CPU engine (issue 37):
// Mixtral's, Qwen2-MoE's and Qwen3-MoE's fixtures, served as transformers wrote them, give
// transformers' greedy tokens — streamed and not, with prompts cut into chunks (each
// chunk routed on its own) and prefixes reused from the KV cache.

import (
	"slices"
	"testing"
	"time"

	"gollm/engine/enginetest"
	"gollm/tests/harness"
)

func TestMoEFamiliesServeTransformersTokens(t *testing.T) {
	fixtures := []string{"mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny"}
	var models []harness.Model
	for _, f := range fixtures {
		models = append(models,
			harness.Model{Name: f, Checkpoint: "testdata/" + f},
			harness.Model{Name: f + "-chunked", Checkpoint: "testdata/" + f, Parameters: map[string]string{
				"enable_chunked_context": "true", "max_num_tokens": "5", "enable_kv_cache_reuse": "true", "tokens_per_block": "4"}})
	}
	s := harness.Start(t, harness.Options{Models: models})
	c := s.Client(t)
	for _, f := range fixtures {
		g, err := enginetest.LoadGolden("../testdata/" + f + "-golden.safetensors")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{f, f + "-chunked"} {
			for _, streaming := range []bool{true, false} {
				ctx := testContext(t, time.Minute)
				// Greedy asked for: Qwen3-MoE's generation_config.json samples.
				inputs := append(tokenInputs(g.PromptIDs, len(g.Greedy), streaming), int32s("end_id", []int64{1, 1}, -1),
					float32s("temperature", []int64{1, 1}, 0))
				// Twice: the second run finds the prompt's blocks cached where reuse is on.
				for run := range 2 {
					res, err := streamInfer(ctx, c, inferRequest(name, "golden", inputs))
					if err != nil || res.errMsg != "" {
						t.Fatalf("%s (streaming %v, run %d): %v %q", name, streaming, run, err, res.errMsg)
					}
					got := res.tokens
					if !streaming {
						got = got[len(got)-len(g.Greedy):]
					}
					if !slices.Equal(got, g.Greedy) {
						t.Errorf("%s (streaming %v, run %d): tokens %v, transformers' greedy %v", name, streaming, run, got, g.Greedy)
					}
				}
			}
		}
	}
}

package tests

// The LLaMA family through tritonserver on the CPU engine (issue 13): the fixtures of
// testdata/ that transformers wrote, served as they are, must give transformers' greedy
// tokens — streamed and not, with chunked prompts and KV reuse too.

import (
	"slices"
	"testing"
	"time"

	"gollm/engine/enginetest"
	"gollm/tests/harness"
)

func TestLlamaFamilyServesTransformersTokens(t *testing.T) {
	fixtures := []string{"llama-tiny", "llama3-tiny", "qwen2-tiny", "mistral-tiny"}
	var models []harness.Model
	for _, f := range fixtures {
		models = append(models,
			harness.Model{Name: f, Checkpoint: "testdata/" + f},
			// Prompts cut into chunks of 5 tokens, and prefixes shared through KV reuse.
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
				inputs := append(tokenInputs(g.PromptIDs, len(g.Greedy), streaming), int32s("end_id", []int64{1, 1}, -1))
				// Twice: the second run finds the prompt's blocks cached where reuse is on.
				for run := range 2 {
					res, err := streamInfer(ctx, c, inferRequest(name, "golden", inputs))
					if err != nil || res.errMsg != "" {
						t.Fatalf("%s (streaming %v, run %d): %v %q", name, streaming, run, err, res.errMsg)
					}
					got := res.tokens
					if !streaming {
						// The shipped config leaves the prompt out of non-streaming output.
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

package tests

// The LLaMA family through tritonserver on the CPU engine (issue 13): the fixtures of
// testdata/ that transformers wrote, served as they are, must give transformers' greedy
// tokens — streamed and not, with chunked prompts and KV reuse too.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"gollm/engine"
	"gollm/engine/enginetest"
	"gollm/kserve"
	"gollm/model"
	"gollm/tests/harness"
)

func TestLlamaFamilyServesTransformersTokens(t *testing.T) {
	fixtures := []string{"llama-tiny", "llama3-tiny", "qwen2-tiny", "mistral-tiny", "phi3-tiny"}
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

// llamaJob is one request of TestLlamaFamilyControlsThroughTriton and what to check of
// its responses.
type llamaJob struct {
	// name says what it tests.
	name string
	// model names the served model.
	model string
	// streaming asks for one response per token.
	streaming bool
	// inputs are sent as they are.
	inputs []tensor
	// check checks the responses, in the test's goroutine.
	check func(t *testing.T, rs []*kserve.ModelInferResponse)
}

// TestLlamaFamilyControlsThroughTriton serves LLaMA fixtures through tritonserver with
// many requests in flight at once — streamed and not, on llama3-tiny (two end tokens,
// llama3 rope) and mistral-tiny (a sliding window shorter than its prompt) side by side —
// and checks each against its definition and the CPU engine run here: output_log_probs
// are the log-softmax of the generation_logits returned with them, which are the CPU
// engine's; a stop word ends the output after it; a bad word is never generated; the
// second of llama3-tiny's end tokens ends a sequence. Then a long stream is cancelled
// beside a running one, and its KV blocks return to the pool long before it could have
// finished.
func TestLlamaFamilyControlsThroughTriton(t *testing.T) {
	// llama-long is llama-tiny with 8192 positions (its rotary positions need no
	// table), for a request of thousands of iterations, which is cancelled mid-way.
	longDir := t.TempDir()
	cfg, err := os.ReadFile("../testdata/llama-tiny/config.json")
	if err != nil {
		t.Fatal(err)
	}
	var cm map[string]any
	if err := json.Unmarshal(cfg, &cm); err != nil {
		t.Fatal(err)
	}
	cm["max_position_embeddings"] = 8192
	if cfg, err = json.Marshal(cm); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(longDir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"model.safetensors", "generation_config.json"} {
		abs, err := filepath.Abs(filepath.Join("../testdata/llama-tiny", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(longDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	const long = "llama-long"
	s := harness.Start(t, harness.Options{Models: []harness.Model{
		{Name: "llama3-tiny", Checkpoint: "testdata/llama3-tiny"},
		{Name: "mistral-tiny", Checkpoint: "testdata/mistral-tiny"},
		{Name: long, Checkpoint: longDir, Parameters: map[string]string{"max_tokens_in_paged_kv_cache": "16384"}},
	}})

	t.Run("log probs, stop words, bad words and a second end id, all in flight at once", func(t *testing.T) {
		var jobs []llamaJob
		noEnd := int32s("end_id", []int64{1, 1}, -1)
		for _, fx := range []struct {
			name   string
			prompt []int32
		}{
			// Prompts whose greedy continuations vary from token to token (llama3-tiny's
			// golden prompt repeats one token), so that the stop word, the bad word and the
			// tokens after them tell one outcome from another; mistral-tiny's is longer
			// than its sliding window.
			{"llama3-tiny", []int32{350, 701, 929, 175, 588, 86, 811, 23}},
			{"mistral-tiny", []int32{17, 401, 3, 998, 250, 250, 12, 77, 640, 5, 31, 900}},
		} {
			name, prompt := fx.name, fx.prompt
			dir := "../testdata/" + name
			const n = 12
			gen := greedyTokens(t, dir, prompt, n)
			// The CPU engine's logits at each generated position: the context logits of
			// the prompt and greedy's tokens, from the prompt's last row on.
			ctxLogits := refContextLogits(t, dir, append(slices.Clone(prompt), gen[:n-1]...))
			vocab := len(ctxLogits) / (len(prompt) + n - 1)
			refLogits := ctxLogits[(len(prompt)-1)*vocab:]
			stop := gen[3:5]
			stopAt := 5
			for e := 2; e < 5; e++ {
				if slices.Equal(gen[e-2:e], stop) {
					stopAt = e
					break
				}
			}
			k, ok := firstNew(gen, 2)
			if !ok {
				t.Fatalf("%s: greedy %v has no token from the third on that it had not had before", name, gen)
			}
			banned := gen[k]
			withoutBanned := refTokens(t, dir, prompt, engine.SamplingParams{BadWords: [][]int32{{banned}}}, n, nil)
			for _, streaming := range []bool{false, true} {
				jobs = append(jobs, llamaJob{
					name: "log probs", model: name, streaming: streaming,
					inputs: append(tokenInputs(prompt, n, streaming), noEnd, boolean("return_log_probs", true), boolean("return_generation_logits", true)),
					check: func(t *testing.T, rs []*kserve.ModelInferResponse) {
						got := generated(t, rs, prompt, streaming)
						var lps, logits []float32
						for _, r := range rs {
							lp, _, _ := outputFP32(r, "output_log_probs")
							gl, _, _ := outputFP32(r, "generation_logits")
							lps, logits = append(lps, lp...), append(logits, gl...)
						}
						if !slices.Equal(got, gen) || len(lps) != n || len(logits) != n*vocab {
							t.Fatalf("%v with %d log probs and %d logits; want greedy %v, %d and %d", got, len(lps), len(logits), gen, n, n*vocab)
						}
						if e := enginetest.RelL2(logits, refLogits); e > 1e-5 {
							t.Errorf("generation_logits differ from the CPU engine's by relative L2 %.3g", e)
						}
						var sum float64
						for i, id := range got {
							row := logits[i*vocab : (i+1)*vocab]
							lse := logSumExp(row)
							if d := float64(lps[i]) - (float64(row[id]) - lse); math.Abs(d) > 1e-4 {
								t.Errorf("token %d (%d): output_log_probs %g, log-softmax of its generation_logits %g", i, id, lps[i], float64(row[id])-lse)
							}
							sum += float64(lps[i])
						}
						cum, _, ok := outputFP32(lastWithOutputs(t, rs), "cum_log_probs")
						if !ok || len(cum) != 1 || math.Abs(float64(cum[0])-sum) > 1e-3 {
							t.Errorf("cum_log_probs %v, sum of output_log_probs %g", cum, sum)
						}
					}},
					llamaJob{
						name: "stop word", model: name, streaming: streaming,
						inputs: append(tokenInputs(prompt, n, streaming), noEnd, wordList("stop_words_list", stop)),
						check: func(t *testing.T, rs []*kserve.ModelInferResponse) {
							if got := generated(t, rs, prompt, streaming); !slices.Equal(got, gen[:stopAt]) {
								t.Errorf("stop word %v: %v; want greedy %v up to and with it", stop, got, gen[:stopAt])
							}
						}},
					llamaJob{
						name: "bad word", model: name, streaming: streaming,
						inputs: append(tokenInputs(prompt, n, streaming), noEnd, wordList("bad_words_list", []int32{banned})),
						check: func(t *testing.T, rs []*kserve.ModelInferResponse) {
							got := generated(t, rs, prompt, streaming)
							if slices.Contains(got, banned) || !slices.Equal(got[:min(k, len(got))], gen[:k]) || !slices.Equal(got, withoutBanned) {
								t.Errorf("bad word %d (greedy's token %d): %v; greedy %v, with it masked %v", banned, k, got, gen, withoutBanned)
							}
						}})
			}
		}
		jobs = append(jobs, secondEndIDJobs(t, "llama3-tiny")...)

		ctx := testContext(t, 3*time.Minute)
		results := make([][]*kserve.ModelInferResponse, len(jobs))
		errs := allAtOnce(s, len(jobs), func(i int, c kserve.GRPCInferenceServiceClient) (err error) {
			j := jobs[i]
			results[i], err = collectResponses(ctx, c, inferRequest(j.model, fmt.Sprintf("%s-%d", j.model, i), j.inputs))
			return err
		})
		for i, j := range jobs {
			t.Run(fmt.Sprintf("%s %s streaming %v", j.model, j.name, j.streaming), func(t *testing.T) {
				if errs[i] != nil {
					t.Fatal(errs[i])
				}
				j.check(t, results[i])
			})
		}
	})

	t.Run("a cancelled stream frees its KV blocks while another runs on", func(t *testing.T) {
		ctx := testContext(t, 2*time.Minute)
		waitModelMetric(t, ctx, s, long, metricKVBlocksUsed, 0, 30*time.Second)
		freeIdle := mustModelMetric(t, ctx, s, long, metricKVBlocksFree)
		iterations := mustModelMetric(t, ctx, s, long, "gollm_iterations")
		if freeIdle <= 0 {
			t.Fatalf("%s = %v when idle, want a positive pool", metricKVBlocksFree, freeIdle)
		}
		// The survivor runs beside the cancelled stream and must keep its solo tokens.
		survivorPrompt := []int32{1, 306, 496, 29, 12}
		const survivorN = 48
		want := greedyTokens(t, longDir, survivorPrompt, survivorN)
		survivor := make(chan error, 1)
		sc := s.Client(t)
		go func() {
			res, err := streamInfer(ctx, sc, inferRequest(long, "survivor", append(tokenInputs(survivorPrompt, survivorN, true),
				int32s("end_id", []int64{1, 1}, -1))))
			switch {
			case err != nil:
				survivor <- err
			case res.errMsg != "" || !slices.Equal(res.tokens, want):
				survivor <- fmt.Errorf("tokens %v, error %q; want solo greedy %v", res.tokens, res.errMsg, want)
			default:
				survivor <- nil
			}
		}()

		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := s.Client(t).ModelStreamInfer(sctx)
		if err != nil {
			t.Fatal(err)
		}
		prompt := []int32{1, 17, 401, 3, 998}
		n := 8192 - len(prompt)
		if err := stream.Send(inferRequest(long, "cancelled", append(tokenInputs(prompt, n, true), int32s("end_id", []int64{1, 1}, -1)))); err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			msg, err := stream.Recv()
			if err != nil {
				t.Fatalf("response %d: %v", i, err)
			}
			if msg.GetErrorMessage() != "" {
				t.Fatalf("response %d: error %s", i, msg.GetErrorMessage())
			}
		}
		if used := mustModelMetric(t, ctx, s, long, metricKVBlocksUsed); used <= 0 {
			t.Errorf("%s = %v mid-generation, want the request's blocks", metricKVBlocksUsed, used)
		}
		cancel()
		waitModelMetric(t, ctx, s, long, metricKVBlocksUsed, 0, 30*time.Second)
		waitModelMetric(t, ctx, s, long, metricActiveRequests, 0, 30*time.Second)
		if free := mustModelMetric(t, ctx, s, long, metricKVBlocksFree); free != freeIdle {
			t.Errorf("%s = %v after the cancellation, want %v as before", metricKVBlocksFree, free, freeIdle)
		}
		// Each iteration gives the stream at most one token: far fewer iterations than
		// its length mean the blocks came back because it was cancelled, not finished.
		ran := mustModelMetric(t, ctx, s, long, "gollm_iterations") - iterations
		if ran >= float64(n)/2 {
			t.Errorf("%v iterations ran for a stream of %d tokens cancelled after 10: it was not stopped", ran, n)
		}
		t.Logf("the cancelled stream's blocks came back after %v iterations of its %d tokens", ran, n)
		if err := <-survivor; err != nil {
			t.Errorf("the stream beside the cancelled one: %v", err)
		}
	})
}

// secondEndIDJobs are requests on a checkpoint whose generation_config.json lists two end
// tokens: an embedding bias of +1000 makes greedy take the second as soon as min_length
// (4) stops masking the end tokens. With the checkpoint's end tokens the sequence ends
// there, the token left out; with end_id naming the first alone, it generates the second
// to its length.
func secondEndIDJobs(t *testing.T, name string) []llamaJob {
	t.Helper()
	dir := "../testdata/" + name
	m, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	vocab := m.Config.VocabSize
	m.Close()
	g, err := model.LoadGeneration(dir, vocab)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.EOSIDs) < 2 {
		t.Fatalf("%s's end tokens %v: want two", name, g.EOSIDs)
	}
	second := g.EOSIDs[1]
	const minLen, n = 4, 10
	prompt := []int32{1, 17, 401, 99, 250, 12}
	masked := refTokens(t, dir, prompt, engine.SamplingParams{MinLength: minLen, EndIDs: g.EOSIDs}, minLen, nil)
	bias := make([]float32, vocab)
	bias[second] = 1000
	var jobs []llamaJob
	for _, streaming := range []bool{false, true} {
		in := append(tokenInputs(prompt, n, streaming), int32s("min_length", []int64{1, 1}, minLen), float32s("embedding_bias", []int64{1, int64(vocab)}, bias...))
		jobs = append(jobs, llamaJob{
			name: fmt.Sprintf("second end id %d", second), model: name, streaming: streaming, inputs: in,
			check: func(t *testing.T, rs []*kserve.ModelInferResponse) {
				if got := generated(t, rs, prompt, streaming); !slices.Equal(got, masked) {
					t.Errorf("end tokens %v: %v; want greedy with them masked %v, then the end at token %d", g.EOSIDs, got, masked, second)
				}
			}},
			llamaJob{
				name: fmt.Sprintf("end_id %d alone", g.EOSIDs[0]), model: name, streaming: streaming,
				inputs: append(slices.Clone(in), int32s("end_id", []int64{1, 1}, g.EOSIDs[0])),
				check: func(t *testing.T, rs []*kserve.ModelInferResponse) {
					got := generated(t, rs, prompt, streaming)
					if len(got) != n || slices.ContainsFunc(got, func(tok int32) bool { return tok != second }) {
						t.Errorf("end_id %d: %v; want %d × %d (not an end token now)", g.EOSIDs[0], got, n, second)
					}
				}})
	}
	return jobs
}

// firstNew is the first index k ≥ from of a token seq has not had before k.
func firstNew(seq []int32, from int) (int, bool) {
	for k := from; k < len(seq); k++ {
		if !slices.Contains(seq[:k], seq[k]) {
			return k, true
		}
	}
	return 0, false
}

// logSumExp is log Σ exp(row), in float64.
func logSumExp(row []float32) float64 {
	best := math.Inf(-1)
	for _, v := range row {
		best = max(best, float64(v))
	}
	var z float64
	for _, v := range row {
		z += math.Exp(float64(v) - best)
	}
	return best + math.Log(z)
}

package tests

// Speculative decoding through tritonserver (issue 36): the Austen demo model served
// plain, with prompt lookup and with a draft model (itself), on the CPU engine.

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
	"gollm/tokenizer"
)

// austenCheckpoint is the shipped demo checkpoint, from the repository root.
const austenCheckpoint = "model_repository/austen/1"

// lastResponse sends req on a stream and returns its last response (the final one).
func lastResponse(ctx context.Context, c kserve.GRPCInferenceServiceClient, req *kserve.ModelInferRequest) (*kserve.ModelInferResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.ModelStreamInfer(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(req); err != nil {
		return nil, err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if msg.GetErrorMessage() != "" {
			return nil, fmt.Errorf("request %s: %s", req.GetId(), msg.GetErrorMessage())
		}
		if r := msg.GetInferResponse(); isFinal(r) {
			_ = stream.CloseSend()
			if _, err := stream.Recv(); err != io.EOF {
				return nil, fmt.Errorf("request %s: after the final response: %v", req.GetId(), err)
			}
			return r, nil
		}
	}
}

// TestSpeculativeDecodingThroughTriton: prompt lookup and a draft model (the model as
// its own draft, pinned and under the adaptive policy) give the streamed tokens of the
// plain model, greedy and (prompt lookup) sampled; their proposals show in the perf outputs and the gollm_speculative_* metrics;
// a request that opts out proposes nothing; and drafts that do not fit the model —
// another vocabulary and tokenizer, a bad num_speculative_tokens — are refused at load
// with a message naming what is wrong, the server serving on.
func TestSpeculativeDecodingThroughTriton(t *testing.T) {
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	austen := filepath.Join(root, austenCheckpoint)
	gpt2, err := harness.DemoCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	models := []harness.Model{
		{Name: "plain", Checkpoint: austenCheckpoint},
		// Pinned (speculative_adaptive false): these check what proposals do, which the
		// adaptive policy would hold back where they do not pay on this machine.
		{Name: "lookup", Checkpoint: austenCheckpoint, Parameters: map[string]string{
			"speculative_decoding_mode": "prompt_lookup", "num_speculative_tokens": "6", "speculative_adaptive": "false"}},
		{Name: "drafted", Checkpoint: austenCheckpoint, Parameters: map[string]string{
			"speculative_draft_model_path": austen, "num_speculative_tokens": "3", "speculative_adaptive": "false"}},
		{Name: "adaptive", Checkpoint: austenCheckpoint, Parameters: map[string]string{
			"speculative_draft_model_path": austen, "num_speculative_tokens": "3"}},
		{Name: "other-vocabulary", Checkpoint: austenCheckpoint, Parameters: map[string]string{
			"speculative_draft_model_path": gpt2}},
		{Name: "too-many", Checkpoint: austenCheckpoint, Parameters: map[string]string{
			"speculative_decoding_mode": "prompt_lookup", "num_speculative_tokens": "17"}},
	}
	s := harness.Start(t, harness.Options{Models: models, Flags: []string{"--model-control-mode=explicit",
		"--load-model=plain", "--load-model=lookup", "--load-model=drafted", "--load-model=adaptive"}})
	c := s.Client(t)
	ctx := testContext(t, 4*time.Minute)
	tok, err := tokenizer.Load(filepath.Join(austen, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	prompts := []string{"It is a truth universally acknowledged", "Hello, my name is", "The weather at Bath",
		"\"I am sure,\" said she,"}
	// The checkpoint samples by default (generation_config.json): greedy is asked for.
	greedy := float32s("temperature", []int64{1, 1}, 0)
	run := func(model, id string, prompt []int32, extra ...tensor) streamResult {
		t.Helper()
		if len(extra) == 0 {
			extra = []tensor{greedy}
		}
		in := append(tokenInputs(prompt, 40, true), extra...)
		res, err := streamInfer(ctx, c, inferRequest(model, id, in))
		if err != nil || res.errMsg != "" {
			t.Fatalf("%s, request %s: %v, error %q", model, id, err, res.errMsg)
		}
		return res
	}
	sampled := []tensor{float32s("temperature", []int64{1, 1}, 0.8), float32s("runtime_top_p", []int64{1, 1}, 0.95)}
	for i, p := range prompts {
		ids := tok.EncodePrompt(p)
		seed := tensor{"random_seed", "UINT64", []int64{1, 1}, []byte{byte(i + 1), 0, 0, 0, 0, 0, 0, 0}}
		want := run("plain", fmt.Sprintf("plain-%d", i), ids)
		wantSampled := run("plain", fmt.Sprintf("plain-s-%d", i), ids, append(slices.Clone(sampled), seed)...)
		for _, m := range []string{"lookup", "drafted", "adaptive"} {
			got := run(m, fmt.Sprintf("%s-%d", m, i), ids)
			if !slices.Equal(got.tokens, want.tokens) || got.withTokens != want.withTokens {
				t.Errorf("%s, %q: %v in %d responses; want %v in %d", m, p, got.tokens, got.withTokens, want.tokens, want.withTokens)
			}
		}
		got := run("lookup", fmt.Sprintf("lookup-s-%d", i), ids, append(slices.Clone(sampled), seed)...)
		if !slices.Equal(got.tokens, wantSampled.tokens) {
			t.Errorf("lookup, sampled, %q: %v; want %v", p, got.tokens, wantSampled.tokens)
		}
	}
	t.Run("the perf outputs count a request's proposals", func(t *testing.T) {
		ids := tok.EncodePrompt(prompts[0])
		perf := func(model, id string, extra ...tensor) (drafted, accepted int32) {
			in := append(tokenInputs(ids, 40, false), boolean("return_perf_metrics", true), greedy)
			r, err := lastResponse(ctx, c, inferRequest(model, id, append(in, extra...)))
			if err != nil {
				t.Fatal(err)
			}
			d, _, ok1, err1 := outputInt32(r, "total_draft_tokens")
			a, _, ok2, err2 := outputInt32(r, "total_accepted_draft_tokens")
			if !ok1 || !ok2 || err1 != nil || err2 != nil || len(d) != 1 || len(a) != 1 {
				t.Fatalf("%s: perf outputs %v %v (%v, %v)", model, d, a, err1, err2)
			}
			return d[0], a[0]
		}
		if d, a := perf("drafted", "perf-drafted"); d == 0 || a != d {
			t.Errorf("the model as its own draft: %d of %d proposals accepted; want all, and some", a, d)
		}
		if d, a := perf("lookup", "perf-lookup"); d == 0 || a == 0 {
			t.Errorf("prompt lookup on a text that repeats itself: %d of %d proposals accepted; want some", a, d)
		}
		if d, _ := perf("lookup", "perf-optout", boolean("speculative_decoding", false)); d != 0 {
			t.Errorf("a request with speculative_decoding false had %d proposals", d)
		}
	})
	t.Run("the metrics show acceptance per model", func(t *testing.T) {
		for _, m := range []string{"lookup", "drafted"} {
			drafted := mustModelMetric(t, ctx, s, m, "gollm_speculative_draft_tokens")
			accepted := mustModelMetric(t, ctx, s, m, "gollm_speculative_accepted_tokens")
			rate := mustModelMetric(t, ctx, s, m, "gollm_speculative_acceptance_rate")
			length := mustModelMetric(t, ctx, s, m, "gollm_speculative_mean_accepted_length")
			if drafted == 0 || accepted == 0 || rate <= 0 || rate > 1 || length <= 1 {
				t.Errorf("%s: %v of %v accepted, rate %v, mean accepted length %v", m, accepted, drafted, rate, length)
			}
			t.Logf("%s: %v of %v proposals accepted (rate %.3f), %.2f tokens per verifying step", m, accepted, drafted, rate, length)
		}
		if d := mustModelMetric(t, ctx, s, "plain", "gollm_speculative_draft_tokens"); d != 0 {
			t.Errorf("the plain model counts %v proposals", d)
		}
		// The adaptive instance measured plain steps first, then proposed (its first
		// measurements with proposals) and kept them or held them off; the pinned ones
		// never hold off.
		drafted := mustModelMetric(t, ctx, s, "adaptive", "gollm_speculative_draft_tokens")
		held := mustModelMetric(t, ctx, s, "adaptive", "gollm_speculative_held_off_steps")
		t.Logf("adaptive: %v proposals, %v iterations held off", drafted, held)
		if drafted == 0 {
			t.Error("the adaptive instance never proposed")
		}
		for _, m := range []string{"lookup", "drafted"} {
			if h := mustModelMetric(t, ctx, s, m, "gollm_speculative_held_off_steps"); h != 0 {
				t.Errorf("%s (speculative_adaptive false) held %v iterations off", m, h)
			}
		}
	})
	for _, b := range []struct{ name, says string }{
		{"other-vocabulary", "the draft's vocabulary has"},
		{"too-many", `parameter "num_speculative_tokens": 17: want at most 16`},
	} {
		t.Run("a load of "+b.name+" is refused", func(t *testing.T) {
			_, err := c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: b.name})
			if err == nil || !strings.Contains(err.Error(), b.says) {
				t.Fatalf("load %s: %v; want a refusal saying %q", b.name, err, b.says)
			}
			run("lookup", "after-"+b.name, tok.EncodePrompt(prompts[1]))
		})
	}
}

// TestEagle3ThroughTriton: an EAGLE-3 head in the published format (the fixture, random
// weights, for llama-tiny), named by speculative_draft_model_path alone, serves
// llama-tiny with the plain model's greedy tokens and makes proposals; the head named as
// a draft_model, or given to a model it was not made for, is refused at load.
func TestEagle3ThroughTriton(t *testing.T) {
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	head := filepath.Join(root, "testdata", "eagle3-tiny")
	models := []harness.Model{
		{Name: "plain", Checkpoint: "testdata/llama-tiny"},
		{Name: "eagle", Checkpoint: "testdata/llama-tiny", Parameters: map[string]string{
			"speculative_draft_model_path": head, "num_speculative_tokens": "3"}},
		{Name: "as-draft-model", Checkpoint: "testdata/llama-tiny", Parameters: map[string]string{
			"speculative_decoding_mode": "draft_model", "speculative_draft_model_path": head}},
		{Name: "other-target", Checkpoint: austenCheckpoint, Parameters: map[string]string{
			"speculative_decoding_mode": "eagle3", "speculative_draft_model_path": head}},
	}
	s := harness.Start(t, harness.Options{Models: models, Flags: []string{"--model-control-mode=explicit",
		"--load-model=plain", "--load-model=eagle"}})
	c := s.Client(t)
	ctx := testContext(t, 3*time.Minute)
	greedy := float32s("temperature", []int64{1, 1}, 0)
	for i, p := range [][]int32{{5, 77, 301, 9}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {600}} {
		in := append(tokenInputs(p, 20, true), greedy)
		want, err := streamInfer(ctx, c, inferRequest("plain", fmt.Sprintf("plain-%d", i), in))
		if err != nil || want.errMsg != "" {
			t.Fatalf("plain: %v %q", err, want.errMsg)
		}
		got, err := streamInfer(ctx, c, inferRequest("eagle", fmt.Sprintf("eagle-%d", i), in))
		if err != nil || got.errMsg != "" || !slices.Equal(got.tokens, want.tokens) || got.withTokens != want.withTokens {
			t.Errorf("eagle, prompt %v: %v in %d responses (%v %q); want %v in %d", p, got.tokens, got.withTokens, err, got.errMsg, want.tokens, want.withTokens)
		}
	}
	if d := mustModelMetric(t, ctx, s, "eagle", "gollm_speculative_draft_tokens"); d == 0 {
		t.Error("the EAGLE-3 head proposed nothing")
	}
	for _, b := range []struct{ name, says string }{
		{"as-draft-model", `is an EAGLE-3 head (LlamaForCausalLMEagle3): set "speculative_decoding_mode" to eagle3`},
		{"other-target", "the EAGLE-3 head's vocabulary has 1000 tokens, the model's 4096"},
	} {
		if _, err := c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: b.name}); err == nil || !strings.Contains(err.Error(), b.says) {
			t.Errorf("load %s: %v; want a refusal saying %q", b.name, err, b.says)
		}
	}
}

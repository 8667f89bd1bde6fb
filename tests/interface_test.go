package tests

// The rest of the TensorRT-LLM request interface through tritonserver: beam search,
// num_return_sequences, runtime top-p decay, text stop strings, and the inputs and
// output shapes TensorRT-LLM's clients and genai-perf use.

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"gollm/engine"
	"gollm/kserve"
	"gollm/tokenizer"
)

// outputFP32 decodes an FP32 output of a response.
func outputFP32(r *kserve.ModelInferResponse, name string) ([]float32, []int64, bool) {
	for i, o := range r.GetOutputs() {
		if o.GetName() != name || i >= len(r.GetRawOutputContents()) {
			continue
		}
		raw := r.GetRawOutputContents()[i]
		v := make([]float32, len(raw)/4)
		for j := range v {
			v[j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
		}
		return v, o.GetShape(), true
	}
	return nil, nil, false
}

// outputStrings decodes a BYTES output of a response.
func outputStrings(r *kserve.ModelInferResponse, name string) ([]string, []int64, bool) {
	for i, o := range r.GetOutputs() {
		if o.GetName() != name || i >= len(r.GetRawOutputContents()) {
			continue
		}
		raw := r.GetRawOutputContents()[i]
		var out []string
		for len(raw) >= 4 {
			n := binary.LittleEndian.Uint32(raw)
			out = append(out, string(raw[4:4+n]))
			raw = raw[4+n:]
		}
		return out, o.GetShape(), true
	}
	return nil, nil, false
}

// strings1 is a BYTES input of strings, shape [1, n].
func strings1(name string, v ...string) tensor {
	var b []byte
	for _, s := range v {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return tensor{name, "BYTES", []int64{1, int64(len(v))}, b}
}

// collect sends one request on a new stream and returns its responses up to the final
// one; an error response fails.
func collect(t *testing.T, ctx context.Context, c kserve.GRPCInferenceServiceClient, req *kserve.ModelInferRequest) []*kserve.ModelInferResponse {
	t.Helper()
	rs, err := collectResponses(ctx, c, req)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// collectResponses is collect for goroutines other than the test's: an error response,
// or any other failure, is returned.
func collectResponses(ctx context.Context, c kserve.GRPCInferenceServiceClient, req *kserve.ModelInferRequest) ([]*kserve.ModelInferResponse, error) {
	stream, err := c.ModelStreamInfer(ctx)
	if err != nil {
		return nil, fmt.Errorf("request %s: open stream: %w", req.GetId(), err)
	}
	if err := stream.Send(req); err != nil {
		return nil, fmt.Errorf("request %s: send: %w", req.GetId(), err)
	}
	var rs []*kserve.ModelInferResponse
	for {
		msg, err := stream.Recv()
		if err != nil {
			return rs, fmt.Errorf("request %s: after %d responses: %w", req.GetId(), len(rs), err)
		}
		if msg.GetErrorMessage() != "" {
			return rs, fmt.Errorf("request %s: error response %q", req.GetId(), msg.GetErrorMessage())
		}
		rs = append(rs, msg.GetInferResponse())
		if isFinal(msg.GetInferResponse()) {
			break
		}
	}
	_ = stream.CloseSend()
	if _, err := stream.Recv(); err != io.EOF {
		return rs, fmt.Errorf("request %s: the stream goes on after the final response: %v", req.GetId(), err)
	}
	return rs, nil
}

// lastWithOutputs is the last response that carries output_ids.
func lastWithOutputs(t *testing.T, rs []*kserve.ModelInferResponse) *kserve.ModelInferResponse {
	t.Helper()
	for i := len(rs) - 1; i >= 0; i-- {
		if _, _, ok, _ := outputInt32(rs[i], "output_ids"); ok {
			return rs[i]
		}
	}
	t.Fatal("no response carries output_ids")
	return nil
}

func TestBeamSearchThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ctx := testContext(t, 3*time.Minute)
	prompt := []int32{464, 2068, 7586, 21831, 18045}
	const n, W = 8, 4
	for _, streaming := range []bool{false, true} {
		t.Run(fmt.Sprintf("streaming %v", streaming), func(t *testing.T) {
			in := append(tokenInputs(prompt, n, streaming), int32s("beam_width", []int64{1, 1}, W), int32s("end_id", []int64{1, 1}, -1),
				boolean("return_log_probs", true), boolean("exclude_input_in_output", true))
			rs := collect(t, ctx, c, inferRequest(modelName, fmt.Sprint("beam-", streaming), in))
			if streaming && len(rs) < n {
				t.Errorf("%d streamed responses for %d steps", len(rs), n)
			}
			last := lastWithOutputs(t, rs)
			ids, shape, _, err := outputInt32(last, "output_ids")
			if err != nil || !slices.Equal(shape, []int64{1, W, n}) {
				t.Fatalf("output_ids shape %v (%v), want [1 %d %d]", shape, err, W, n)
			}
			lens, lshape, _, _ := outputInt32(last, "sequence_length")
			cums, cshape, _ := outputFP32(last, "cum_log_probs")
			lps, pshape, _ := outputFP32(last, "output_log_probs")
			if !slices.Equal(lshape, []int64{1, W}) || !slices.Equal(cshape, []int64{1, W}) || !slices.Equal(pshape, []int64{1, W, n}) {
				t.Fatalf("shapes: sequence_length %v, cum_log_probs %v, output_log_probs %v", lshape, cshape, pshape)
			}
			for b := range W {
				var sum float64
				for _, lp := range lps[b*n : (b+1)*n] {
					sum += float64(lp)
				}
				if lens[b] != n || math.Abs(sum-float64(cums[b])) > 1e-3 {
					t.Errorf("beam %d: length %d, cum_log_probs %g, sum of its log-probs %g", b, lens[b], cums[b], sum)
				}
				if b > 0 && cums[b] > cums[b-1] {
					t.Errorf("beam %d (%g) is ranked after beam %d (%g)", b, cums[b], b-1, cums[b-1])
				}
			}
			// Greedy's cumulative log-probability, from a plain request.
			g := lastWithOutputs(t, collect(t, ctx, c, inferRequest(modelName, "greedy", append(tokenInputs(prompt, n, false),
				int32s("end_id", []int64{1, 1}, -1), boolean("return_log_probs", true)))))
			gc, _, _ := outputFP32(g, "cum_log_probs")
			if cums[0] < gc[0]-1e-4 {
				t.Errorf("best beam %g is worse than greedy %g", cums[0], gc[0])
			}
			if want := greedyTokens(t, demoCheckpoint(t).dir, prompt, n); slices.Equal(ids[:n], want) && cums[0] > gc[0]+1e-4 {
				t.Errorf("the best beam is greedy's tokens but scores %g, greedy %g", cums[0], gc[0])
			}
		})
	}
}

func TestNumReturnSequencesThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ctx := testContext(t, 3*time.Minute)
	prompt := []int32{40, 1101, 284, 766}
	const n = 6
	seed := tensor{"random_seed", "UINT64", []int64{1, 1}, binary.LittleEndian.AppendUint64(nil, 1234)}
	sampling := []tensor{float32s("temperature", []int64{1, 1}, 1), int32s("runtime_top_k", []int64{1, 1}, 40), seed,
		int32s("end_id", []int64{1, 1}, -1)}
	for _, streaming := range []bool{false, true} {
		t.Run(fmt.Sprintf("streaming %v", streaming), func(t *testing.T) {
			in := append(append(tokenInputs(prompt, n, streaming), sampling...), int32s("num_return_sequences", []int64{1, 1}, 3))
			req := inferRequest(modelName, "three", in)
			req.Outputs = []*kserve.ModelInferRequest_InferRequestedOutputTensor{{Name: "output_ids"}, {Name: "sequence_index"}}
			rs := collect(t, ctx, c, req)
			seqs := map[int32][]int32{}
			finals := 0
			for i, r := range rs {
				if isFinal(r) {
					finals++
					if i != len(rs)-1 {
						t.Errorf("response %d of %d is final", i, len(rs))
					}
				}
				ids, _, ok, _ := outputInt32(r, "output_ids")
				if !ok {
					continue
				}
				idx, shape, ok, _ := outputInt32(r, "sequence_index")
				if !ok || !slices.Equal(shape, []int64{1, 1}) || idx[0] < 0 || idx[0] > 2 {
					t.Fatalf("response %d: sequence_index %v shape %v", i, idx, shape)
				}
				seqs[idx[0]] = append(seqs[idx[0]], ids...)
			}
			if finals != 1 || len(seqs) != 3 {
				t.Fatalf("%d final responses, sequences %v", finals, seqs)
			}
			for i, toks := range seqs {
				if !streaming && !excludeInputInOutput(t) {
					toks = toks[len(prompt):]
				}
				if len(toks) != n {
					t.Errorf("sequence %d: %d tokens, want %d", i, len(toks), n)
				}
				seqs[i] = toks
			}
			if slices.Equal(seqs[0], seqs[1]) && slices.Equal(seqs[1], seqs[2]) {
				t.Errorf("three identical sequences %v", seqs[0])
			}
			// Sequence 0 draws from the request's own seed, as a plain request does.
			one := lastWithOutputs(t, collect(t, ctx, c, inferRequest(modelName, "one", append(append(tokenInputs(prompt, n, false), sampling...),
				boolean("exclude_input_in_output", true)))))
			if ids, _, _, _ := outputInt32(one, "output_ids"); !slices.Equal(ids, seqs[0]) {
				t.Errorf("sequence 0 %v, the plain request with its seed %v", seqs[0], ids)
			}
		})
	}
}

func TestTopPDecayThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ctx := testContext(t, 2*time.Minute)
	prompt := []int32{464, 3290, 318}
	const n = 10
	params := engine.SamplingParams{Temperature: 1, TopP: 0.95, Seed: 99}
	seed := tensor{"random_seed", "UINT64", []int64{1, 1}, binary.LittleEndian.AppendUint64(nil, params.Seed)}
	in := append(tokenInputs(prompt, n, true), float32s("temperature", []int64{1, 1}, 1), float32s("runtime_top_p", []int64{1, 1}, 0.95),
		seed, int32s("end_id", []int64{1, 1}, -1), float32s("runtime_top_p_decay", []int64{1, 1}, 0.5),
		float32s("runtime_top_p_min", []int64{1, 1}, 0.1))
	res, err := streamInfer(ctx, c, inferRequest(modelName, "decay", in))
	if err != nil || res.errMsg != "" {
		t.Fatalf("%v %s", err, res.errMsg)
	}
	// By the definition: top-p 0.95 for the first token, then max(p·0.5, 0.1) after each.
	var decayed, flat []float32
	p := float32(0.95)
	for range n {
		decayed = append(decayed, p)
		flat = append(flat, 0.95)
		p = max(p*0.5, 0.1)
	}
	dir := demoCheckpoint(t).dir
	if want := refTokens(t, dir, prompt, params, n, atStep(decayed)); !slices.Equal(res.tokens, want) {
		t.Errorf("tokens %v, by the definition of the decay %v", res.tokens, want)
	}
	if plain := refTokens(t, dir, prompt, params, n, atStep(flat)); slices.Equal(res.tokens, plain) {
		t.Errorf("the decay changed nothing: %v", plain)
	}
}

// splitStop finds, in the greedy continuation of prompt, a string that spans two
// generated tokens (the end of token k and the start of token k+1, both plain ASCII
// pieces) and returns it with k.
func splitStop(t *testing.T, tok *tokenizer.Tokenizer, gen []int32) (string, int) {
	t.Helper()
	for k := 1; k+1 < len(gen); k++ {
		a, b := tok.Decode(gen[k:k+1]), tok.Decode(gen[k+1:k+2])
		if len(a) >= 2 && len(b) >= 2 && isASCII(a+b) && !strings.Contains(tok.Decode(gen[:k]), a[len(a)-1:]+b[:1]) {
			return a[len(a)-1:] + b[:1], k
		}
	}
	t.Skip("no two ASCII tokens in the greedy continuation to split a stop string over")
	return "", 0
}

// isASCII says whether s is printable ASCII.
func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func TestStopStringSplitAcrossTokensThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ck := demoCheckpoint(t)
	ctx := testContext(t, 2*time.Minute)
	prompt := ck.tok.Encode(testPrompt)
	const n = 24
	gen := greedyTokens(t, ck.dir, prompt, n)
	stop, k := splitStop(t, ck.tok, gen)
	// The text stops before the stop string; generation stops at the token completing it.
	wantText := tokenizer.ValidUTF8(ck.tok.Decode(gen[:k+2]))
	wantText = wantText[:strings.Index(wantText, stop)]
	for _, streaming := range []bool{false, true} {
		t.Run(fmt.Sprintf("streaming %v", streaming), func(t *testing.T) {
			in := []tensor{text("text_input", testPrompt), int32s("max_tokens", []int64{1, 1}, n), boolean("stream", streaming),
				strings1("stop_words", "never appears \u2603", stop), boolean("exclude_input_in_output", true), int32s("end_id", []int64{1, 1}, -1)}
			rs := collect(t, ctx, c, inferRequest(modelName, "stop", in))
			var got string
			var toks []int32
			for _, r := range rs {
				if ss, shape, ok := outputStrings(r, "text_output"); ok {
					if len(ss) != 1 || !slices.Equal(shape, []int64{1}) {
						t.Fatalf("text_output %q of shape %v, want one string of shape [1]", ss, shape)
					}
					got += ss[0]
				}
				ids, _, _, _ := outputInt32(r, "output_ids")
				toks = append(toks, ids...)
			}
			if got != wantText {
				t.Errorf("text %q, want %q (stop string %q)", got, wantText, stop)
			}
			if !slices.Equal(toks, gen[:k+2]) {
				t.Errorf("tokens %v, want the greedy ones up to the one completing %q: %v", toks, stop, gen[:k+2])
			}
		})
	}
	t.Run("on the generate endpoint", func(t *testing.T) {
		body, err := postJSON(ctx, s.HTTP(), s.HTTPURL()+"/v2/models/"+modelName+"/generate",
			map[string]any{"text_input": testPrompt, "max_tokens": n, "stop_words": []string{stop}, "exclude_input_in_output": true, "end_id": -1})
		if err != nil {
			t.Fatal(err)
		}
		g, err := decodeGenerate(body)
		if err != nil {
			t.Fatal(err)
		}
		if *g.TextOutput != wantText {
			t.Errorf("text_output %q, want %q", *g.TextOutput, wantText)
		}
	})
}

func TestTensorRTLLMClientInputsThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ck := demoCheckpoint(t)
	ctx := testContext(t, 3*time.Minute)
	prompt := ck.tok.Encode(testPrompt)
	const n = 6
	gen := greedyTokens(t, ck.dir, prompt, n)

	t.Run("exclude_input_in_output per request", func(t *testing.T) {
		for _, exclude := range []bool{false, true} {
			in := append(tokenInputs(prompt, n, false), boolean("exclude_input_in_output", exclude), int32s("end_id", []int64{1, 1}, -1))
			ids, _, _, _ := outputInt32(lastWithOutputs(t, collect(t, ctx, c, inferRequest(modelName, "ex", in))), "output_ids")
			want := append(slices.Clone(prompt), gen...)
			if exclude {
				want = gen
			}
			if !slices.Equal(ids, want) {
				t.Errorf("exclude %v: %v, want %v", exclude, ids, want)
			}
		}
	})

	t.Run("everything the ensemble clients send is accepted", func(t *testing.T) {
		in := []tensor{text("text_input", testPrompt), int32s("max_tokens", []int64{1, 1}, n), boolean("stream", false),
			int32s("beam_width", []int64{1, 1}, 1), float32s("temperature", []int64{1, 1}, 0), int32s("num_return_sequences", []int64{1, 1}, 1),
			strings1("bad_words", "zzzz"), strings1("stop_words", "\u2603\u2603"), strings1("embedding_bias_words", "the"),
			float32s("embedding_bias_weights", []int64{1, 1}, 0), boolean("exclude_input_in_output", true), int32s("end_id", []int64{1, 1}, -1),
			int32s("pad_id", []int64{1, 1}, 0), int32s("top_k", []int64{1, 1}, 1), float32s("top_p", []int64{1, 1}, 0),
			float32s("length_penalty", []int64{1, 1}, 1), float32s("repetition_penalty", []int64{1, 1}, 1), int32s("min_length", []int64{1, 1}, 1),
			float32s("presence_penalty", []int64{1, 1}, 0), float32s("frequency_penalty", []int64{1, 1}, 0), boolean("return_log_probs", true),
			boolean("return_context_logits", false), boolean("return_generation_logits", false), boolean("return_perf_metrics", true)}
		req := inferRequest(modelName, "ensemble-like", in)
		for _, o := range []string{"text_output", "cum_log_probs", "sequence_index", "batch_index", "kv_cache_alloc_new_blocks",
			"kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
			"last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"} {
			req.Outputs = append(req.Outputs, &kserve.ModelInferRequest_InferRequestedOutputTensor{Name: o})
		}
		r := lastWithOutputsOrText(t, collect(t, ctx, c, req))
		ss, shape, _ := outputStrings(r, "text_output")
		if len(ss) != 1 || !slices.Equal(shape, []int64{1}) || ss[0] != tokenizer.ValidUTF8(ck.tok.Decode(gen)) {
			t.Errorf("text_output %q of shape %v, want [%q] of shape [1]", ss, shape, ck.tok.Decode(gen))
		}
		if bi, _, ok, _ := outputInt32(r, "batch_index"); !ok || bi[0] != 0 {
			t.Errorf("batch_index %v", bi)
		}
		times := map[string]int64{}
		for _, name := range []string{"arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns"} {
			for i, o := range r.GetOutputs() {
				if o.GetName() == name {
					times[name] = int64(binary.LittleEndian.Uint64(r.GetRawOutputContents()[i]))
				}
			}
		}
		now := time.Now().UnixNano()
		if a, f, l := times["arrival_time_ns"], times["first_token_time_ns"], times["last_token_time_ns"]; !(a > now-int64(time.Hour) && a <= f && f <= l && l <= now) {
			t.Errorf("perf times %v (now %d): want arrival ≤ first token ≤ last token, all in the last hour", times, now)
		}
		if nb, _, ok, _ := outputInt32(r, "kv_cache_alloc_total_blocks"); !ok || nb[0] < 1 {
			t.Errorf("kv_cache_alloc_total_blocks %v", nb)
		}
	})

	t.Run("a stop request ends its target with a normal final response", func(t *testing.T) {
		stream, err := c.ModelStreamInfer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(inferRequest(modelName, "long-one", tokenInputs(prompt, 500, true))); err != nil {
			t.Fatal(err)
		}
		var toks []int32
		for len(toks) < 3 {
			msg, err := stream.Recv()
			if err != nil || msg.GetErrorMessage() != "" {
				t.Fatalf("%v %s", err, msg.GetErrorMessage())
			}
			ids, _, _, _ := outputInt32(msg.GetInferResponse(), "output_ids")
			toks = append(toks, ids...)
		}
		// A stop request with the same id, on its own stream, as TensorRT-LLM's client sends it.
		stopRs := collect(t, ctx, c, inferRequest(modelName, "long-one", []tensor{boolean("stop", true)}))
		if len(stopRs) != 1 {
			t.Errorf("the stop request got %d responses, want its empty final one", len(stopRs))
		}
		for {
			msg, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if msg.GetErrorMessage() != "" {
				t.Fatalf("the stopped request ended with an error: %s", msg.GetErrorMessage())
			}
			ids, _, _, _ := outputInt32(msg.GetInferResponse(), "output_ids")
			toks = append(toks, ids...)
			if isFinal(msg.GetInferResponse()) {
				break
			}
		}
		_ = stream.CloseSend()
		if len(toks) >= 500 {
			t.Errorf("the stopped request generated all %d tokens", len(toks))
		}
	})

	t.Run("text_output is valid UTF-8, streamed or not", func(t *testing.T) {
		// The random demo weights make byte-level tokens that split characters.
		const m = 96
		in := []tensor{text("text_input", "\u00e9t\u00e9 \u65e5\u672c"), int32s("max_tokens", []int64{1, 1}, m),
			float32s("temperature", []int64{1, 1}, 1), int32s("end_id", []int64{1, 1}, -1), boolean("exclude_input_in_output", true)}
		whole, _, _ := outputStrings(lastWithOutputsOrText(t, collect(t, ctx, c, inferRequest(modelName, "u", append(in, boolean("stream", false))))), "text_output")
		var streamed string
		for _, r := range collect(t, ctx, c, inferRequest(modelName, "u", append(in, boolean("stream", true)))) {
			if ss, _, ok := outputStrings(r, "text_output"); ok {
				if !utf8.ValidString(ss[0]) {
					t.Fatalf("a streamed text_output is not UTF-8: %q", ss[0])
				}
				streamed += ss[0]
			}
		}
		if len(whole) != 1 || !utf8.ValidString(whole[0]) || streamed != whole[0] {
			t.Errorf("streamed %q, whole %q", streamed, whole)
		}
	})
}

// lastWithOutputsOrText is the last response carrying output_ids or text_output.
func lastWithOutputsOrText(t *testing.T, rs []*kserve.ModelInferResponse) *kserve.ModelInferResponse {
	t.Helper()
	for i := len(rs) - 1; i >= 0; i-- {
		if _, _, ok := outputStrings(rs[i], "text_output"); ok {
			return rs[i]
		}
		if _, _, ok, _ := outputInt32(rs[i], "output_ids"); ok {
			return rs[i]
		}
	}
	t.Fatal("no response carries outputs")
	return nil
}

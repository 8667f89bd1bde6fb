package tests

// Controls of the TensorRT-LLM request interface through tritonserver, each checked
// against its definition and the CPU engine run in the test process: bad words (text
// and token ids), embedding bias words, context logits on every streamed response,
// num_return_sequences of a beam search, the runtime top-p reset id, and errors that
// name the client's request id.

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/engine"
	"gollm/kserve"
	"gollm/tokenizer"
)

// refTokens runs the CPU engine on the checkpoint: the prompt, then n steps, step k
// drawn with params at the top-p topP(k, tokens so far) (nil: params' own).
func refTokens(t *testing.T, dir string, prompt []int32, params engine.SamplingParams, n int, topP func(k int, out []int32) float32) []int32 {
	t.Helper()
	refEngines.mu.Lock()
	defer refEngines.mu.Unlock()
	r, err := loadRefEngine(dir)
	if err != nil {
		t.Fatal(err)
	}
	history := slices.Clone(prompt)
	next := prompt
	var out []int32
	for k := range n {
		sp := params
		if topP != nil {
			sp.TopP = topP(k, out)
		}
		outs, err := r.e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: next, Pos: len(history) - len(next),
			Blocks: r.blocks, Sample: true, Sampling: sp, History: history, NumGenerated: k}}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, outs[0].Token)
		history = append(history, outs[0].Token)
		next = history[len(history)-1:]
	}
	return out
}

// atStep is refTokens' topP for a top-p given step by step: topP[k] at step k.
func atStep(topP []float32) func(k int, _ []int32) float32 {
	return func(k int, _ []int32) float32 { return topP[k] }
}

// refContextLogits are the CPU engine's logits of every prompt position, [len][vocab].
func refContextLogits(t *testing.T, dir string, prompt []int32) []float32 {
	t.Helper()
	refEngines.mu.Lock()
	defer refEngines.mu.Unlock()
	r, err := loadRefEngine(dir)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := r.e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: prompt, Blocks: r.blocks, History: prompt,
		ContextLogits: true}}})
	if err != nil {
		t.Fatal(err)
	}
	return outs[0].ContextLogits
}

// generated is the tokens a request generated: every response's output_ids joined,
// less the prompt where a non-streaming response carries it.
func generated(t *testing.T, rs []*kserve.ModelInferResponse, prompt []int32, streaming bool) []int32 {
	t.Helper()
	var toks []int32
	for _, r := range rs {
		ids, _, _, err := outputInt32(r, "output_ids")
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, ids...)
	}
	if !streaming && !excludeInputInOutput(t) {
		if !slices.Equal(toks[:min(len(prompt), len(toks))], prompt) {
			t.Fatalf("output_ids %v do not start with the prompt %v", toks, prompt)
		}
		toks = toks[len(prompt):]
	}
	return toks
}

// containsWord says whether word occurs anywhere in seq.
func containsWord(seq, word []int32) bool {
	for i := 0; i+len(word) <= len(seq); i++ {
		if slices.Equal(seq[i:i+len(word)], word) {
			return true
		}
	}
	return false
}

// wordList is TensorRT-LLM's [2, L] encoding of words, [1, 2, L] with the batch.
func wordList(name string, words ...[]int32) tensor {
	var toks, ends []int32
	for _, w := range words {
		toks = append(toks, w...)
		ends = append(ends, int32(len(toks)))
	}
	for len(ends) < len(toks) {
		ends = append(ends, -1)
	}
	return int32s(name, []int64{1, 2, int64(len(toks))}, append(toks, ends...)...)
}

// roundTrip finds the first greedy token, at k ≥ from, whose text tokenizes back to it
// alone and that greedy has not generated before k; it returns k and the text.
func roundTrip(t *testing.T, tok *tokenizer.Tokenizer, gen []int32, from int) (int, string) {
	t.Helper()
	for k := from; k < len(gen); k++ {
		w := tok.Decode(gen[k : k+1])
		if slices.Equal(tok.Encode(w), gen[k:k+1]) && !slices.Contains(gen[:k], gen[k]) {
			return k, w
		}
	}
	t.Fatalf("no greedy token of %v whose text tokenizes back to it", gen)
	return 0, ""
}

func TestBadWordsThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ck := demoCheckpoint(t)
	ctx := testContext(t, 2*time.Minute)
	prompt := ck.tok.EncodePrompt(testPrompt)
	const n = 12
	gen := greedyTokens(t, ck.dir, prompt, n)
	noEnd := int32s("end_id", []int64{1, 1}, -1)

	t.Run("text bad_words keep greedy from its token", func(t *testing.T) {
		k, word := roundTrip(t, ck.tok, gen, 0)
		banned := gen[k]
		t.Logf("greedy %v; bad word %q is its token %d (%d)", gen, word, k, banned)
		want := refTokens(t, ck.dir, prompt, engine.SamplingParams{BadWords: [][]int32{{banned}}}, n, nil)
		for _, streaming := range []bool{false, true} {
			in := append(tokenInputs(prompt, n, streaming), noEnd, strings1("bad_words", word))
			got := generated(t, collect(t, ctx, c, inferRequest(modelName, "bad-text", in)), prompt, streaming)
			if slices.Contains(got, banned) {
				t.Errorf("streaming %v: bad word %q (token %d) generated: %v", streaming, word, banned, got)
			}
			if slices.Equal(got, gen) || !slices.Equal(got[:k], gen[:k]) {
				t.Errorf("streaming %v: %v; greedy %v, which it should follow up to token %d (%q) and then leave", streaming, got, gen, k, word)
			}
			if !slices.Equal(got, want) {
				t.Errorf("streaming %v: %v; greedy with token %d masked %v", streaming, got, banned, want)
			}
		}
		// The generate endpoint, as TensorRT-LLM's ensemble clients send it.
		body, err := postJSON(ctx, s.HTTP(), s.HTTPURL()+"/v2/models/"+modelName+"/generate",
			map[string]any{"text_input": testPrompt, "max_tokens": n, "bad_words": []string{word}, "exclude_input_in_output": true, "end_id": -1})
		if err != nil {
			t.Fatal(err)
		}
		g, err := decodeGenerate(body)
		if err != nil {
			t.Fatal(err)
		}
		if wantText := tokenizer.ValidUTF8(ck.tok.Decode(want)); *g.TextOutput != wantText {
			t.Errorf("generate: text_output %q, want %q (bad word %q; greedy %q)", *g.TextOutput, wantText, word, ck.tok.Decode(gen))
		}
	})

	t.Run("bad_words_list [2, L] of a one-token and a two-token word", func(t *testing.T) {
		// Two words: greedy's pair (1, 2), banned only after its first token, and a later
		// greedy token, banned anywhere.
		k, _ := roundTrip(t, ck.tok, gen, 4)
		pair, single := gen[1:3:3], gen[k:k+1]
		words := [][]int32{pair, single}
		t.Logf("greedy %v; bad words %v", gen, words)
		want := refTokens(t, ck.dir, prompt, engine.SamplingParams{BadWords: words}, n, nil)
		for _, streaming := range []bool{false, true} {
			in := append(tokenInputs(prompt, n, streaming), noEnd, wordList("bad_words_list", words...))
			got := generated(t, collect(t, ctx, c, inferRequest(modelName, "bad-ids", in)), prompt, streaming)
			for _, w := range words {
				if containsWord(append(slices.Clone(prompt), got...), w) {
					t.Errorf("streaming %v: bad word %v generated: %v", streaming, w, got)
				}
			}
			// Token 1 alone is no bad word: greedy keeps it, and leaves token 2 after it.
			if len(got) < 3 || !slices.Equal(got[:2], gen[:2]) || got[2] == gen[2] {
				t.Errorf("streaming %v: %v; want greedy's first two tokens %v, then not %d", streaming, got, gen[:2], gen[2])
			}
			if !slices.Equal(got, want) {
				t.Errorf("streaming %v: %v; greedy with the words masked %v", streaming, got, want)
			}
		}
	})
}

func TestEmbeddingBiasWordsThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ck := demoCheckpoint(t)
	ctx := testContext(t, 2*time.Minute)
	prompt := ck.tok.EncodePrompt(testPrompt)
	const n = 8
	gen := greedyTokens(t, ck.dir, prompt, n)
	biased := func(w float32, ids ...int32) []int32 {
		bias := make([]float32, ck.cfg.VocabSize)
		for _, id := range ids {
			bias[id] = w
		}
		return refTokens(t, ck.dir, prompt, engine.SamplingParams{EmbeddingBias: bias}, n, nil)
	}
	// A one-token word greedy never emits, and a two-token one whose tokens, both
	// biased, both appear (so that biasing only one of them would show).
	var word, pair string
	var wordID int32 = -1
	var pairIDs, pairWant []int32
	for _, w := range []string{" ocean", " Paris", " river", " garden", " silver"} {
		ids := ck.tok.Encode(w)
		if len(ids) == 1 && !slices.Contains(gen, ids[0]) && wordID < 0 {
			word, wordID = w, ids[0]
		}
	}
	for _, w := range []string{" overcoat", " moonlight", " waterfall", " sunflower", " lighthouse", " snowstorm"} {
		if ids := ck.tok.Encode(w); len(ids) == 2 && ids[0] != ids[1] && pairIDs == nil {
			if want := biased(1000, ids...); slices.Contains(want, ids[0]) && slices.Contains(want, ids[1]) {
				pair, pairIDs, pairWant = w, ids, want
			}
		}
	}
	if wordID < 0 || pairIDs == nil {
		t.Fatalf("no one-token word outside greedy's %v, or no two-token word greedy takes both tokens of when biased", gen)
	}
	t.Logf("greedy %v; biased words %q %d, %q %v (greedy then %v)", gen, word, wordID, pair, pairIDs, pairWant)
	request := func(name string, words []string, weights []float32, streaming bool) []int32 {
		in := []tensor{text("text_input", testPrompt), int32s("max_tokens", []int64{1, 1}, n), boolean("stream", streaming),
			boolean("exclude_input_in_output", true), int32s("end_id", []int64{1, 1}, -1), strings1("embedding_bias_words", words...),
			float32s("embedding_bias_weights", []int64{1, int64(len(weights))}, weights...)}
		rs := collect(t, ctx, c, inferRequest(modelName, name, in))
		var toks []int32
		var txt string
		for _, r := range rs {
			ids, _, _, _ := outputInt32(r, "output_ids")
			toks = append(toks, ids...)
			if ss, _, ok := outputStrings(r, "text_output"); ok {
				txt += ss[0]
			}
		}
		if want := tokenizer.ValidUTF8(ck.tok.Decode(toks)); txt != want {
			t.Errorf("%s: text_output %q, the tokens' text %q", name, txt, want)
		}
		return toks
	}
	for _, streaming := range []bool{false, true} {
		t.Run(fmt.Sprintf("streaming %v", streaming), func(t *testing.T) {
			// A weight far above any logit: greedy emits the word at every step.
			if got := request("bias-up", []string{word}, []float32{1000}, streaming); !slices.Equal(got, slices.Repeat([]int32{wordID}, n)) {
				t.Errorf("weight 1000 on %q (token %d): %v; want it %d times (greedy %v)", word, wordID, got, n, gen)
			}
			// Every token of a word gets its weight: greedy keeps to the word's tokens,
			// choosing between them by their logits.
			if got := request("bias-pair", []string{pair}, []float32{1000}, streaming); !slices.Equal(got, pairWant) {
				t.Errorf("weight 1000 on %q (tokens %v): %v; greedy with both tokens biased %v", pair, pairIDs, got, pairWant)
			}
			// A weight far below: greedy's first word is never emitted, and the tokens
			// are greedy's with that logit lowered.
			k, first := roundTrip(t, ck.tok, gen, 0)
			want := biased(-1000, gen[k])
			got := request("bias-down", []string{first}, []float32{-1000}, streaming)
			if slices.Contains(got, gen[k]) || !slices.Equal(got, want) {
				t.Errorf("weight -1000 on %q (token %d): %v; want %v (greedy %v)", first, gen[k], got, want, gen)
			}
		})
	}
}

func TestStreamedContextLogitsThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ck := demoCheckpoint(t)
	ctx := testContext(t, 2*time.Minute)
	prompt := []int32{464, 2068, 7586, 21831, 18045}
	const n = 4
	vocab := ck.cfg.VocabSize
	ref := refContextLogits(t, ck.dir, prompt)
	gen := greedyTokens(t, ck.dir, prompt, n)
	// By their definition the last row's best token is greedy's first.
	last := ref[(len(prompt)-1)*vocab:]
	if best := int32(slices.Index(last, slices.Max(last))); best != gen[0] {
		t.Fatalf("the reference's last context row picks %d, greedy %v", best, gen)
	}
	if slices.Contains(gen[:3], gen[3]) {
		t.Fatalf("greedy %v repeats a token: an end token would end it elsewhere than this test means", gen)
	}
	seed := tensor{"random_seed", "UINT64", []int64{1, 1}, binary.LittleEndian.AppendUint64(nil, 3)}
	end := func(id int32) tensor { return int32s("end_id", []int64{1, 1}, id) }
	for _, tc := range []struct {
		name  string
		extra []tensor
	}{
		{"greedy to the length limit", []tensor{end(-1)}},
		// The end token after three tokens: the final response has no new token.
		{"greedy to an end token", []tensor{end(gen[3])}},
		// The end token first: no token at all.
		{"greedy ending at once", []tensor{end(gen[0])}},
		{"beam search", []tensor{end(-1), int32s("beam_width", []int64{1, 1}, 2)}},
		{"num_return_sequences", []tensor{end(-1), int32s("num_return_sequences", []int64{1, 1}, 2), float32s("temperature", []int64{1, 1}, 1), seed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, streaming := range []bool{true, false} {
				in := append(append(tokenInputs(prompt, n, streaming), boolean("return_context_logits", true)), tc.extra...)
				rs := collect(t, ctx, c, inferRequest(modelName, "ctx", in))
				// Every response, the final one included: a client keeps the last one's.
				for i, r := range rs {
					got, shape, ok := outputFP32(r, "context_logits")
					if !ok {
						t.Errorf("streaming %v: response %d of %d (final %v) carries no context_logits", streaming, i, len(rs), isFinal(r))
						continue
					}
					if !slices.Equal(shape, []int64{1, int64(len(prompt)), int64(vocab)}) || len(got) != len(ref) {
						t.Fatalf("streaming %v: response %d: context_logits shape %v (%d values), want [1 %d %d]", streaming, i, shape, len(got), len(prompt), vocab)
					}
					for j := range ref {
						if d := math.Abs(float64(got[j] - ref[j])); d > 1e-3*(1+math.Abs(float64(ref[j]))) {
							t.Fatalf("streaming %v: response %d: context_logits[%d] %g, the CPU engine's %g", streaming, i, j, got[j], ref[j])
						}
					}
				}
				if streaming && tc.name == "greedy to the length limit" && len(rs) < n {
					t.Errorf("%d streamed responses for %d tokens", len(rs), n)
				}
			}
		})
	}
}

func TestBeamNumReturnSequencesThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ctx := testContext(t, 2*time.Minute)
	prompt := []int32{40, 1101, 284, 766, 257}
	const n, W = 6, 4
	for _, streaming := range []bool{false, true} {
		t.Run(fmt.Sprintf("streaming %v", streaming), func(t *testing.T) {
			base := append(tokenInputs(prompt, n, streaming), int32s("beam_width", []int64{1, 1}, W), int32s("end_id", []int64{1, 1}, -1),
				boolean("return_log_probs", true), boolean("exclude_input_in_output", true))
			all := lastWithOutputs(t, collect(t, ctx, c, inferRequest(modelName, "beams-all", base)))
			allIDs, _, _, _ := outputInt32(all, "output_ids")
			allCums, _, _ := outputFP32(all, "cum_log_probs")
			if len(allIDs) != W*n || len(allCums) != W {
				t.Fatalf("all beams: %d ids, %d cum_log_probs; want %d, %d", len(allIDs), len(allCums), W*n, W)
			}
			for _, N := range []int32{1, 2, 3} {
				rs := collect(t, ctx, c, inferRequest(modelName, fmt.Sprint("beams-", N),
					append(slices.Clone(base), int32s("num_return_sequences", []int64{1, 1}, N))))
				// Every response carries N beams, the streamed ones too (TensorRT-LLM's).
				for i, r := range rs {
					if _, shape, ok, _ := outputInt32(r, "output_ids"); ok && (len(shape) != 3 || shape[1] != int64(N)) {
						t.Errorf("num_return_sequences %d: response %d of %d: output_ids shape %v", N, i, len(rs), shape)
					}
				}
				r := lastWithOutputs(t, rs)
				ids, shape, _, _ := outputInt32(r, "output_ids")
				cums, cshape, _ := outputFP32(r, "cum_log_probs")
				if !slices.Equal(shape, []int64{1, int64(N), n}) || !slices.Equal(cshape, []int64{1, int64(N)}) {
					t.Fatalf("num_return_sequences %d: output_ids %v, cum_log_probs %v; want [1 %d %d], [1 %d]", N, shape, cshape, N, n, N)
				}
				// The best N of the search's beams, in its order: the first N rows.
				if !slices.Equal(ids, allIDs[:int(N)*n]) || !slices.Equal(cums, allCums[:N]) {
					t.Errorf("num_return_sequences %d: beams %v (cum %v); the first %d of all %d: %v (cum %v)", N, ids, cums, N, W, allIDs[:int(N)*n], allCums[:N])
				}
				for i := 1; i < len(cums); i++ {
					if cums[i] > cums[i-1] {
						t.Errorf("num_return_sequences %d: beam %d (cum %g) after beam %d (cum %g)", N, i, cums[i], i-1, cums[i-1])
					}
				}
				if _, _, ok, _ := outputInt32(r, "sequence_index"); ok && N > 1 {
					if idx, _, _, _ := outputInt32(r, "sequence_index"); idx[0] != 0 {
						t.Errorf("num_return_sequences %d: sequence_index %v on a beam response", N, idx)
					}
				}
			}
		})
	}
}

func TestTopPResetIDThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ck := demoCheckpoint(t)
	ctx := testContext(t, 2*time.Minute)
	prompt := []int32{464, 3290, 318}
	const n = 12
	const p0, decay, pMin = 0.6, 0.5, 0.05
	params := engine.SamplingParams{Temperature: 1.5, Seed: 5}
	// By the definition: top-p p0 for the first token; after each token, p0 again if it
	// was the reset id, else max(p·decay, pMin).
	byDefinition := func(reset int32) []int32 {
		p := float32(p0)
		return refTokens(t, ck.dir, prompt, params, n, func(k int, out []int32) float32 {
			if k > 0 {
				if out[k-1] == reset {
					p = p0
				} else {
					p = max(p*decay, pMin)
				}
			}
			return p
		})
	}
	plain := byDefinition(-1)
	// A reset id the decayed run first generates at step j ≥ 2 (the top-p has decayed
	// by then), where resetting changes the draws after it.
	reset, want := int32(-1), []int32(nil)
	for j := 2; j < n-1 && reset < 0; j++ {
		if w := byDefinition(plain[j]); !slices.Contains(plain[:j], plain[j]) && !slices.Equal(w, plain) {
			reset, want = plain[j], w
		}
	}
	if reset < 0 {
		t.Fatalf("no token of %v whose reset changes the draws", plain)
	}
	t.Logf("decayed %v; reset id %d: %v", plain, reset, want)
	seed := tensor{"random_seed", "UINT64", []int64{1, 1}, binary.LittleEndian.AppendUint64(nil, params.Seed)}
	for _, r := range []struct {
		id   int32
		want []int32
	}{{reset, want}, {-1, plain}} {
		in := append(tokenInputs(prompt, n, true), float32s("temperature", []int64{1, 1}, params.Temperature),
			float32s("runtime_top_p", []int64{1, 1}, p0), seed, int32s("end_id", []int64{1, 1}, -1),
			float32s("runtime_top_p_decay", []int64{1, 1}, decay), float32s("runtime_top_p_min", []int64{1, 1}, pMin),
			int32s("runtime_top_p_reset_ids", []int64{1, 1}, r.id))
		got := generated(t, collect(t, ctx, c, inferRequest(modelName, "reset", in)), prompt, true)
		if !slices.Equal(got, r.want) {
			t.Errorf("reset id %d: %v; by the definition %v", r.id, got, r.want)
		}
	}
}

// internalID matches an error naming the backend's own request number.
var internalID = regexp.MustCompile(`request [0-9]+:`)

func TestErrorsNameTheClientRequestID(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ctx := testContext(t, time.Minute)
	prompt := []int32{464, 3290, 318}
	// More sequences than max_batch_size: the request passes the backend's checks and
	// the batch manager refuses it.
	in := append(tokenInputs(prompt, 4, false), float32s("temperature", []int64{1, 1}, 1), int32s("num_return_sequences", []int64{1, 1}, 65))
	for _, tc := range []struct{ id, prefix string }{
		{"client-abc", `request "client-abc": `},
		{"", "request: "},
	} {
		res, err := streamInfer(ctx, c, inferRequest(modelName, tc.id, in))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(res.errMsg, tc.prefix) || !strings.Contains(res.errMsg, "num_return_sequences") || internalID.MatchString(res.errMsg) {
			t.Errorf("id %q: error %q; want it to begin %q, name num_return_sequences and no internal request number", tc.id, res.errMsg, tc.prefix)
		}
		t.Logf("id %q: %s", tc.id, res.errMsg)
	}
	// An input the backend refuses before queueing names its tensor (backend/README's
	// inputs table); the response Triton sends it in carries the client's id.
	stream, err := c.ModelStreamInfer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	vocab := int32(demoCheckpoint(t).cfg.VocabSize)
	bad := append(tokenInputs(prompt, 4, false)[1:], int32s("input_ids", []int64{1, 3}, prompt[0], vocab, prompt[2]))
	if err := stream.Send(inferRequest(modelName, "client-bad", bad)); err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	// End the call as clients do (a cancelled stream keeps tritonserver 2.51's model busy).
	_ = stream.CloseSend()
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("after the error response: %v, want the end of the stream", err)
	}
	if m := msg.GetErrorMessage(); !strings.HasPrefix(m, `input "input_ids": token id`) || internalID.MatchString(m) || msg.GetInferResponse().GetId() != "client-bad" {
		t.Errorf("error %q in a response for request %q; want the input_ids rule, in the response for %q", m, msg.GetInferResponse().GetId(), "client-bad")
	}
}

package tests

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/kserve"
)

// finishReasons reads finish_reason from every response: the reason of each response
// that carries the output (its first element; a request of one sequence has one), and
// the generated tokens of all.
func finishReasons(t *testing.T, rs []*kserve.ModelInferResponse) (reasons []string, tokens []int32) {
	t.Helper()
	for _, r := range rs {
		if ss, shape, ok := outputStrings(r, "finish_reason"); ok {
			if len(shape) != 2 || shape[0] != 1 || int64(len(ss)) != shape[1] || len(ss) == 0 {
				t.Fatalf("finish_reason %q of shape %v, want BYTES [1, beams]", ss, shape)
			}
			reasons = append(reasons, ss[0])
		}
		ids, _, _, _ := outputInt32(r, "output_ids")
		tokens = append(tokens, ids...)
	}
	return reasons, tokens
}

// TestFinishReasonThroughTriton checks the backend's finish_reason on every way a
// sequence ends — its length, a stop word, a stop string (also one completed by the
// last token allowed), its end token, the stop input — streamed and not: the reason is
// on the last response and "" on the ones before; the tokens are where the reason says
// generation ended. The batch manager decides it; gollm's OpenAI server passes it on.
func TestFinishReasonThroughTriton(t *testing.T) {
	s := sharedServer(t)
	c := s.Client(t)
	ck := demoCheckpoint(t)
	ctx := testContext(t, 3*time.Minute)
	prompt := ck.tok.Encode(testPrompt)
	const n = 16
	gen := greedyTokens(t, ck.dir, prompt, n)
	// A token that first appears at position k ≥ 2 serves as a stop word and as an end
	// token: generation must end right there.
	k := -1
	for i := 2; i < n-2 && k < 0; i++ {
		if !slices.Contains(gen[:i], gen[i]) {
			k = i
		}
	}
	if k < 0 {
		t.Fatalf("greedy tokens %v: none appears first past position 2 to end on", gen)
	}
	stop, j := splitStop(t, ck.tok, gen)
	base := func(max int, streaming bool) []tensor {
		return []tensor{text("text_input", testPrompt), int32s("max_tokens", []int64{1, 1}, int32(max)),
			boolean("stream", streaming), boolean("exclude_input_in_output", true), boolean("return_finish_reason", true)}
	}
	endID := func(id int32) tensor { return int32s("end_id", []int64{1, 1}, id) }
	cases := []struct {
		name   string
		inputs func(streaming bool) []tensor
		reason string
		tokens []int32
	}{
		{"length", func(st bool) []tensor { return append(base(n, st), endID(-1)) }, "length", gen},
		{"stop word", func(st bool) []tensor {
			return append(base(n, st), endID(-1), wordList("stop_words_list", gen[k:k+1]))
		}, "stop", gen[:k+1]},
		{"stop string", func(st bool) []tensor {
			return append(base(n, st), endID(-1), strings1("stop_words", stop))
		}, "stop", gen[:j+2]},
		{"stop string at the last token allowed", func(st bool) []tensor {
			return append(base(j+2, st), endID(-1), strings1("stop_words", stop))
		}, "stop", gen[:j+2]},
		{"end token", func(st bool) []tensor { return append(base(n, st), endID(gen[k])) }, "stop", gen[:k]},
		{"end token first", func(st bool) []tensor { return append(base(n, st), endID(gen[0])) }, "stop", nil},
	}
	for _, streaming := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s, streaming %v", tc.name, streaming), func(t *testing.T) {
				rs := collect(t, ctx, c, inferRequest(modelName, "fr", tc.inputs(streaming)))
				reasons, toks := finishReasons(t, rs)
				if len(reasons) == 0 || reasons[len(reasons)-1] != tc.reason {
					t.Fatalf("finish_reason %q, want %q last (the final response must carry it)", reasons, tc.reason)
				}
				if !isFinal(rs[len(rs)-1]) || len(reasons) != len(rs) {
					t.Errorf("%d responses, %d with finish_reason: every response of the request carries it", len(rs), len(reasons))
				}
				for i, r := range reasons[:len(reasons)-1] {
					if r != "" {
						t.Errorf("response %d of %d: finish_reason %q before the end", i, len(reasons), r)
					}
				}
				if !slices.Equal(toks, tc.tokens) {
					t.Errorf("tokens %v, want %v", toks, tc.tokens)
				}
			})
		}
	}

	t.Run("beams end one by one", func(t *testing.T) {
		in := append(tokenInputs(prompt, 6, false), int32s("beam_width", []int64{1, 1}, 2), endID(-1), boolean("return_finish_reason", true))
		r := lastWithOutputs(t, collect(t, ctx, c, inferRequest(modelName, "fr-beams", in)))
		if ss, shape, _ := outputStrings(r, "finish_reason"); !slices.Equal(ss, []string{"length", "length"}) || !slices.Equal(shape, []int64{1, 2}) {
			t.Errorf("finish_reason %q of shape %v, want [length length] of [1, 2]", ss, shape)
		}
	})

	t.Run("each sequence of num_return_sequences says its own", func(t *testing.T) {
		in := append(tokenInputs(prompt, n, true), int32s("num_return_sequences", []int64{1, 1}, 2),
			float32s("temperature", []int64{1, 1}, 1), endID(gen[k]), boolean("return_finish_reason", true))
		rs := collect(t, ctx, c, inferRequest(modelName, "fr-seqs", in))
		last := map[int32]string{}
		for _, r := range rs {
			idx, _, ok, _ := outputInt32(r, "sequence_index")
			ss, _, has := outputStrings(r, "finish_reason")
			if !ok || !has {
				continue
			}
			if prev, done := last[idx[0]]; done && prev != "" {
				t.Errorf("sequence %d: a response after its last (finish_reason %q)", idx[0], prev)
			}
			last[idx[0]] = ss[0]
		}
		for _, seq := range []int32{0, 1} {
			if r := last[seq]; r != "stop" && r != "length" {
				t.Errorf("sequence %d ended with finish_reason %q, want stop or length", seq, r)
			}
		}
	})

	t.Run("the stop input aborts", func(t *testing.T) {
		stream, err := c.ModelStreamInfer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		in := append(tokenInputs(prompt, 500, true), endID(-1), boolean("return_finish_reason", true))
		if err := stream.Send(inferRequest(modelName, "fr-long", in)); err != nil {
			t.Fatal(err)
		}
		var rs []*kserve.ModelInferResponse
		stopped := false
		for {
			msg, err := stream.Recv()
			if err != nil || msg.GetErrorMessage() != "" {
				t.Fatalf("%v %s", err, msg.GetErrorMessage())
			}
			rs = append(rs, msg.GetInferResponse())
			if isFinal(msg.GetInferResponse()) {
				break
			}
			if !stopped && len(rs) >= 3 {
				collect(t, ctx, c, inferRequest(modelName, "fr-long", []tensor{boolean("stop", true)}))
				stopped = true
			}
		}
		// Half-close and read to the end, as clients should: a stream cancelled after
		// its final response keeps tritonserver 2.51's model busy (README, Known limits).
		_ = stream.CloseSend()
		if _, err := stream.Recv(); err != io.EOF {
			t.Errorf("after the final response: %v, want the end of the stream", err)
		}
		reasons, toks := finishReasons(t, rs)
		if got := reasons[len(reasons)-1]; got != "abort" {
			t.Errorf("finish_reason %q after the stop input, want abort", got)
		}
		if len(toks) >= 500 || strings.Join(reasons[:len(reasons)-1], "") != "" {
			t.Errorf("%d tokens, reasons before the last %q: the request was not stopped", len(toks), reasons[:len(reasons)-1])
		}
	})
}

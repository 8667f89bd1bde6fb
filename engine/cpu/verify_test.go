package cpu

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gollm/engine"
	"gollm/model"
)

// decodeOneByOne generates n tokens after prompt on a fresh engine, one step per token,
// and returns them with their log-probabilities.
func decodeOneByOne(t *testing.T, e *Engine, prompt []int32, n int, p SamplingParams) ([]int32, []float32) {
	t.Helper()
	blocks := []int32{0, 1, 2, 3, 4, 5}
	hist := slices.Clone(prompt)
	var lps []float32
	pos := 0
	toks := prompt
	for i := range n {
		outs := mustStep(t, e, Sequence{ID: 1, Tokens: toks, Pos: pos, Blocks: blocks, Sample: true,
			Sampling: p, History: hist, NumGenerated: i})
		pos += len(toks)
		hist = append(hist, outs[0].Token)
		lps = append(lps, outs[0].LogProb)
		toks = hist[len(hist)-1:]
	}
	return hist[len(prompt):], lps
}

// TestVerificationStepsGiveTheTokensOfDecoding: a sequence that carries proposals gets,
// in one step, the tokens one step per token gives — the right proposals up to the
// first wrong one, then the token sampled there — and the decoding that follows the
// step, over the keys and values left by rejected proposals, goes on exactly as without
// them; beside it in the same batch an ordinary sequence is untouched. Greedy and
// sampled, on each kernel path.
func TestVerificationStepsGiveTheTokensOfDecoding(t *testing.T) {
	m := randomGPT2(64, 64, 32, 2, 2, 5)
	rng := rand.New(rand.NewPCG(3, 4))
	prompt := randomTokens(rng, 7, 64)
	other := randomTokens(rng, 5, 64)
	forEachKernelPath(t, func(t *testing.T) {
		for _, p := range []SamplingParams{{}, {Temperature: 1.1, TopK: 20, Seed: 9, RepetitionPenalty: 1.2}} {
			ref := newCPU(t, m, 10, 4)
			want, wantLP := decodeOneByOne(t, ref, prompt, 12, p)
			ref2 := newCPU(t, m, 10, 4)
			wantOther, _ := decodeOneByOne(t, ref2, other, 2, p)
			for good := 0; good <= 4; good++ {
				e := newCPU(t, m, 10, 4)
				blocks := []int32{0, 1, 2, 3, 4, 5}
				// The prompt, sampling the first token.
				outs := mustStep(t, e, Sequence{ID: 1, Tokens: prompt, Blocks: blocks, Sample: true, Sampling: p, History: prompt})
				hist := append(slices.Clone(prompt), outs[0].Token)
				// Proposals: good right ones, then a wrong one and one more.
				drafts := slices.Clone(want[1 : 1+good])
				drafts = append(drafts, (want[1+good]+1)%64, want[2+good])
				full := append(slices.Clone(hist), drafts...)
				L := len(hist)
				otherOut := mustStep(t, e, Sequence{ID: 2, Tokens: other, Blocks: []int32{6, 7}, Sample: true, Sampling: p, History: other})
				outs = mustStep(t, e,
					Sequence{ID: 1, Tokens: full[L-1:], Pos: L - 1, Blocks: blocks, Sample: true, Sampling: p,
						History: full, NumGenerated: 1, Draft: len(drafts)},
					Sequence{ID: 2, Tokens: []int32{otherOut[0].Token}, Pos: len(other), Blocks: []int32{6, 7}, Sample: true,
						Sampling: p, History: append(slices.Clone(other), otherOut[0].Token), NumGenerated: 1})
				got := outs[0].Tokens
				if !slices.Equal(got, want[1:2+good]) {
					t.Fatalf("%v, %d right proposals: tokens %v, want %v", p, good, got, want[1:2+good])
				}
				if !slices.Equal(outs[0].LogProbs, wantLP[1:2+good]) {
					t.Fatalf("%v, %d right proposals: log-probs %v, want %v", p, good, outs[0].LogProbs, wantLP[1:2+good])
				}
				if outs[1].Tokens != nil || outs[1].Token != wantOther[1] {
					t.Fatalf("the ordinary sequence beside it got %d (Tokens %v), want %d", outs[1].Token, outs[1].Tokens, wantOther[1])
				}
				// Decoding goes on from the accepted tokens, one at a time.
				hist = append(hist, got...)
				for len(hist)-len(prompt) < len(want) {
					n := len(hist) - len(prompt)
					outs = mustStep(t, e, Sequence{ID: 1, Tokens: hist[len(hist)-1:], Pos: len(hist) - 1, Blocks: blocks,
						Sample: true, Sampling: p, History: hist, NumGenerated: n})
					hist = append(hist, outs[0].Token)
				}
				if !slices.Equal(hist[len(prompt):], want) {
					t.Fatalf("%v, %d right proposals: after the step, decoding gave %v, want %v", p, good, hist[len(prompt):], want)
				}
			}
		}
	})
}

// TestProposalsThatBreakTheRulesAreRefused: every engine refuses a malformed draft
// before it runs anything, naming the rule; the tensor-parallel CPU engine, which has
// no verification rows, refuses every draft.
func TestProposalsThatBreakTheRulesAreRefused(t *testing.T) {
	m := randomGPT2(64, 64, 32, 2, 2, 5)
	e := newCPU(t, m, 10, 4)
	base := Sequence{ID: 1, Tokens: []int32{1, 2, 3}, Blocks: []int32{0}, Sample: true, History: []int32{1, 2, 3}, Draft: 2}
	cases := map[string]struct {
		edit func(s *Sequence)
		want string
	}{
		"negative draft":       {func(s *Sequence) { s.Draft = -1 }, "negative"},
		"no token to verify":   {func(s *Sequence) { s.Draft = 3 }, "leave none"},
		"too many proposals":   {func(s *Sequence) { s.Draft = engine.MaxDraftTokens + 1 }, "exceed the engine's"},
		"no sampling":          {func(s *Sequence) { s.Sample = false }, "need Sample"},
		"context logits":       {func(s *Sequence) { s.ContextLogits = true }, "need Sample"},
		"wrong probs length":   {func(s *Sequence) { s.DraftProbs = make([]float32, 5) }, "hold 5 values"},
		"probs out of range":   {func(s *Sequence) { s.DraftProbs = make([]float32, 128); s.DraftProbs[3] = 2 }, "not a probability"},
		"probs without drafts": {func(s *Sequence) { s.Draft = 0; s.DraftProbs = make([]float32, 64) }, "without proposals"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			s := base
			c.edit(&s)
			_, err := e.Step(&Batch{Seqs: []Sequence{s}})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			}
		})
	}
	ck, err := model.Open(filepath.Join("..", "..", "testdata", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ws, err := ck.Weights()
	if err != nil {
		t.Fatal(err)
	}
	tp, err := NewTensorParallel(&ck.Config, ws, 2, KVConfig{NumBlocks: 8, TokensPerBlock: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	if _, err := tp.Step(&Batch{Seqs: []Sequence{base}}); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Fatalf("tensor-parallel step with a draft: err = %v, want a refusal", err)
	}
}

// TestHiddenStatesAreTheResidualStream: a sequence with ReturnHidden gets each asked
// layer's output at every position, the same whether its prompt runs in one step or
// two; the last layer's output, normed and through the LM head, gives the logits.
func TestHiddenStatesAreTheResidualStream(t *testing.T) {
	m := randomGPT2(64, 64, 32, 2, 2, 5)
	prompt := []int32{3, 9, 27, 1, 50, 7}
	layers := []int{1, 0}
	whole := newCPU(t, m, 4, 8)
	outs, err := whole.Step(&Batch{HiddenLayers: layers, Seqs: []Sequence{{Tokens: prompt, Blocks: []int32{0}, History: prompt,
		ReturnHidden: true, ReturnLogits: true}}})
	if err != nil {
		t.Fatal(err)
	}
	H := 32
	if len(outs[0].Hidden) != len(prompt)*2*H {
		t.Fatalf("%d hidden values, want %d", len(outs[0].Hidden), len(prompt)*2*H)
	}
	split := newCPU(t, m, 4, 8)
	a, err := split.Step(&Batch{HiddenLayers: layers, Seqs: []Sequence{{Tokens: prompt[:4], Blocks: []int32{0}, History: prompt[:4], ReturnHidden: true}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := split.Step(&Batch{HiddenLayers: layers, Seqs: []Sequence{{Tokens: prompt[4:], Pos: 4, Blocks: []int32{0}, History: prompt, ReturnHidden: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := append(slices.Clone(a[0].Hidden), b[0].Hidden...); relL2(got, outs[0].Hidden) > 1e-6 {
		t.Errorf("hidden states of a prompt in two steps differ from one step's (rel L2 %g)", relL2(got, outs[0].Hidden))
	}
	last := outs[0].Hidden[(len(prompt)-1)*2*H : (len(prompt)-1)*2*H+H] // layer 1, the last
	normed := make([]float32, H)
	whole.norm(normed, last) // the final norm: the step's last norm stage
	logits := make([]float32, 64)
	whole.w.lmHead.mul([][]float32{logits}, [][]float32{normed}, nil, &mulScratch{})
	if d := relL2(logits, outs[0].Logits); d > 1e-5 {
		t.Errorf("the last layer's output through the head differs from the logits (rel L2 %g)", d)
	}
	if _, err := whole.Step(&Batch{HiddenLayers: []int{2}, Seqs: []Sequence{{Tokens: prompt, Blocks: []int32{1}, History: prompt}}}); err == nil ||
		!strings.Contains(err.Error(), "outside the model's") {
		t.Errorf("a hidden layer outside the model: err = %v", err)
	}
}

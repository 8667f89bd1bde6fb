package speculate

import (
	"slices"
	"testing"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/model"
)

// targetFeatures runs llama-tiny over toks and returns the outputs of layers at every
// position [len(toks)][len(layers)·hidden].
func targetFeatures(t *testing.T, target *model.Float32, toks []int32, layers []int) []float32 {
	t.Helper()
	e, err := cpu.NewFromModel(target, engine.KVConfig{NumBlocks: 8, TokensPerBlock: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	outs, err := e.Step(&engine.Batch{HiddenLayers: layers, Seqs: []engine.Sequence{{Tokens: toks, Blocks: []int32{0, 1, 2, 3},
		History: toks, ReturnHidden: true}}})
	if err != nil {
		t.Fatal(err)
	}
	return outs[0].Hidden
}

// TestEagle3CatchesUpAfterARejection: the proposals made after the target kept some
// proposals and replaced the rest — the head's KV of its own outputs overwritten by the
// target's features — are those of a fresh proposer handed every feature at once; and
// a sampled request's proposals carry distributions over the target's vocabulary that
// only the draft vocabulary's tokens share.
func TestEagle3CatchesUpAfterARejection(t *testing.T) {
	target, err := model.LoadFloat32("../testdata/llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	h, err := model.LoadEagle3("../testdata/eagle3-tiny")
	if err != nil {
		t.Fatal(err)
	}
	newProposer := func() *Eagle3 {
		head, err := cpu.NewEagle3(h, 2, target.Model[model.RoleEmbed], engine.KVConfig{NumBlocks: 16, TokensPerBlock: 4})
		if err != nil {
			t.Fatal(err)
		}
		g, err := NewEagle3(head, 1000)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		return g
	}
	layers := []int{0, 1, 1}
	prompt := []int32{5, 77, 301, 9, 42, 600}
	tokens := append(slices.Clone(prompt), 13) // the prompt's step sampled 13
	feats := targetFeatures(t, target, tokens, layers)
	F := 3 * 64
	a := newProposer()
	a.Observe(1, 0, len(prompt), feats[:len(prompt)*F])
	r := &Request{Key: 1, Tokens: tokens, Max: 4}
	if err := a.Propose([]*Request{r}); err != nil || len(r.Draft) != 4 {
		t.Fatalf("proposals %v, %v", r.Draft, err)
	}
	// The target keeps the first proposal and samples a token of its own after it.
	next := append(append(slices.Clone(tokens), r.Draft[0]), (r.Draft[1]+1)%1000)
	feats = targetFeatures(t, target, next, layers)
	a.Observe(1, len(tokens)-1, 2, feats[(len(tokens)-1)*F:(len(tokens)+1)*F])
	r = &Request{Key: 1, Tokens: next, Max: 3}
	if err := a.Propose([]*Request{r}); err != nil {
		t.Fatal(err)
	}
	b := newProposer()
	b.Observe(1, 0, len(next)-1, feats[:(len(next)-1)*F])
	fresh := &Request{Key: 1, Tokens: next, Max: 3}
	if err := b.Propose([]*Request{fresh}); err != nil {
		t.Fatal(err)
	}
	if len(r.Draft) == 0 || !slices.Equal(r.Draft, fresh.Draft) {
		t.Fatalf("after a rejection: %v; a fresh proposer: %v", r.Draft, fresh.Draft)
	}
	s := &Request{Key: 1, Tokens: next, Max: 2, Sampling: engine.SamplingParams{Temperature: 1, Seed: 4}}
	if err := b.Propose([]*Request{s}); err != nil || len(s.Draft) != 2 || len(s.Probs) != 2*1000 {
		t.Fatalf("sampled: %v with %d probabilities, %v", s.Draft, len(s.Probs), err)
	}
	inDraft := map[int32]bool{}
	for d, off := range h.D2T {
		inDraft[int32(d)+off] = true
	}
	for i, tok := range s.Draft {
		if !inDraft[tok] || s.Probs[i*1000+int(tok)] <= 0 {
			t.Fatalf("sampled proposal %d (%d) is not a draft token with a chance", i, tok)
		}
		for x := range 1000 {
			if s.Probs[i*1000+x] > 0 && !inDraft[int32(x)] {
				t.Fatalf("token %d, outside the draft vocabulary, has probability %g", x, s.Probs[i*1000+x])
			}
		}
	}
	// A sequence first met midway has no features before: it gets nothing.
	a.Observe(2, 3, 1, feats[:F])
	mid := &Request{Key: 2, Tokens: next, Max: 2}
	if err := a.Propose([]*Request{mid}); err != nil || len(mid.Draft) != 0 {
		t.Fatalf("a sequence met midway: %v, %v", mid.Draft, err)
	}
}

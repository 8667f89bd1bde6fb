package cuda

import (
	"math"
	"slices"
	"testing"

	"gollm/engine"
)

// TestProposalsComeBackAsRowsAndAreVerifiedOnTheHost: a sequence with proposals asks
// the library for the logits of every row and no sampling, even split over two calls;
// verifyDrafts then gives what engine.Sampler.Verify gives on those rows, and the rows
// are not handed out as context logits.
func TestProposalsComeBackAsRowsAndAreVerifiedOnTheHost(t *testing.T) {
	info := testInfo()
	info.MaxDraft = engine.MaxDraftTokens
	V := info.VocabSize
	var p stepPrep
	p.init(V)
	hist := []int32{3, 4, 5, 6, 7, 8}
	sq := engine.Sequence{ID: 1, Tokens: hist[3:], Pos: 3, Blocks: []int32{0, 1}, Sample: true, History: hist,
		NumGenerated: 2, Draft: 2, Sampling: engine.SamplingParams{Temperature: 0.7, Seed: 3}}
	b := &engine.Batch{Seqs: []engine.Sequence{sq}}
	if _, err := engine.NewBatchChecker(info, "cuda").Check(b); err != nil {
		t.Fatal(err)
	}
	row := func(pos, v int) float32 { return float32(math.Sin(float64(pos*131+v*17))) * 4 }
	outs := make([]engine.Output, 1)
	for _, part := range splitBatch(b, 2, 10) {
		p.build(b, part, info)
		d := p.seqs[0]
		if d.flags != 4 {
			t.Fatalf("flags %d, want context logits only (4)", d.flags)
		}
		logits := make([]float32, p.logitsLen)
		n := part[0].to - part[0].from
		if p.logitsLen != n*V {
			t.Fatalf("%d logits for %d rows", p.logitsLen, n)
		}
		for r := range n {
			for v := range V {
				logits[r*V+v] = row(part[0].from+r, v)
			}
		}
		p.collect(b, part, logits, outs, V)
	}
	e := &Engine{info: info, verifier: engine.NewSampler(V)}
	if err := e.verifyDrafts(b, outs); err != nil {
		t.Fatal(err)
	}
	var rows [][]float32
	for r := range 3 {
		x := make([]float32, V)
		for v := range x {
			x[v] = row(r, v)
		}
		rows = append(rows, x)
	}
	var want engine.Output
	if err := engine.NewSampler(V).Verify(rows, &sq, &want); err != nil {
		t.Fatal(err)
	}
	got := outs[0]
	if !slices.Equal(got.Tokens, want.Tokens) || !slices.Equal(got.LogProbs, want.LogProbs) || got.Token != want.Token || got.ContextLogits != nil {
		t.Fatalf("verified %v %v (token %d, %d context logits), want %v %v", got.Tokens, got.LogProbs, got.Token, len(got.ContextLogits), want.Tokens, want.LogProbs)
	}
}

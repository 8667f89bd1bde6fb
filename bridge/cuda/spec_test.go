package cuda

import (
	"errors"
	"math"
	"slices"
	"testing"

	"gollm/engine"
)

// TestProposalsComeBackAsRowsAndAreVerifiedOnTheHost: a sequence with proposals drawn
// from a distribution (DraftProbs, sampled) asks the library for the logits of every row
// and no sampling, even split over two calls;
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
	sq.DraftProbs = make([]float32, 2*V)
	for i := range 2 {
		sq.DraftProbs[i*V+int(hist[4+i])] = 0.5
		sq.DraftProbs[i*V+1] = 0.5
	}
	b := &engine.Batch{Seqs: []engine.Sequence{sq}}
	if _, err := engine.NewBatchChecker(info, "cuda").Check(b); err != nil {
		t.Fatal(err)
	}
	row := func(pos, v int) float32 { return float32(math.Sin(float64(pos*131+v*17))) * 4 }
	outs := make([]engine.Output, 1)
	parts := splitBatch(b, 2, 10)
	for _, part := range parts {
		if part[0].rows {
			t.Fatal("proposals with their distributions are verified in rows on the GPU")
		}
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
	if err := e.verifyDrafts(b, outs, parts); err != nil {
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

// TestCertainProposalsAreSampledInRowsOnTheGPU: a sequence with certain proposals
// (prompt lookup, a greedy draft) becomes Draft+1 sequences of one token, chained over
// its block table — each row's position, block count, history-dependent masks and draw
// those of Verify's row i — beside an ordinary decode row; the tokens sampled there are
// accepted by Verify's rule (the proposals up to the first the row's token differs
// from, then that token; a row with every token masked ends it, at the first row the
// sequence's failure), with collect and collectLaunched alike, and the same as
// engine.Sampler.Verify on logits whose maxima are those tokens.
func TestCertainProposalsAreSampledInRowsOnTheGPU(t *testing.T) {
	info := testInfo()
	info.MaxDraft = engine.MaxDraftTokens
	V := info.VocabSize
	hist := []int32{3, 4, 5, 6, 7, 8}
	bias := make([]float32, V)
	sq := engine.Sequence{ID: 1, Tokens: hist[3:], Pos: 3, Blocks: []int32{0, 1}, Sample: true, History: hist,
		NumGenerated: 2, Draft: 2, Sampling: engine.SamplingParams{Seed: 3, MinLength: 4, EndIDs: []int32{9}, EmbeddingBias: bias}}
	other := engine.Sequence{ID: 2, Tokens: []int32{11}, Pos: 5, Blocks: []int32{2, 3}, Sample: true, History: []int32{1, 1, 1, 1, 1, 11},
		NumGenerated: 1}
	b := &engine.Batch{Seqs: []engine.Sequence{other, sq}}
	if _, err := engine.NewBatchChecker(info, "cuda").Check(b); err != nil {
		t.Fatal(err)
	}
	if parts := splitBatch(b, 2, 10); parts[0][1].rows || len(parts) != 2 {
		t.Fatalf("with 2 tokens a call the proposals cannot go in rows: %v", parts)
	}
	parts := splitBatch(b, 100, 4)
	if len(parts) != 1 || !parts[0][1].rows || parts[0][0].rows {
		t.Fatalf("parts %v: want one call, the second sequence in rows", parts)
	}
	if parts := splitBatch(b, 100, 3); len(parts) != 2 {
		t.Fatalf("parts %v: rows count as sequences of the call", parts)
	}
	var p stepPrep
	p.init(V)
	p.build(b, parts[0], info)
	if len(p.seqs) != 4 || p.first[1] != 1 || p.rows[1] != 3 || !p.chained || p.logitsLen != 0 {
		t.Fatalf("%d sequences, first %v, rows %v, %d logits", len(p.seqs), p.first, p.rows, p.logitsLen)
	}
	for i := range 3 {
		d := p.seqs[1+i]
		wantBlocks := []int{1, 2, 2}[i]
		wantMasks := []int{1, 1, 0}[i]
		if d.token_count != 1 || int(d.pos) != 3+i || p.tokens[d.token_offset] != hist[3+i] ||
			int(d.block_count) != wantBlocks || d.flags != 9 /* SAMPLE | CHAINED */ ||
			int(d.mask_count) != wantMasks || float64(d.uniform) != engine.Uniform(3, 2+i) || d.bias_offset != 0 {
			t.Fatalf("row %d: %+v", i, d)
		}
	}
	if len(p.bias) != V {
		t.Fatalf("%d biases: the rows share one copy", len(p.bias))
	}
	// The tokens the GPU would sample at the rows, and what is accepted.
	for _, tc := range []struct {
		rows   []int32
		tokens []int32
		fails  bool
	}{
		{[]int32{7, 8, 12}, []int32{7, 8, 12}, false},
		{[]int32{7, 13, 12}, []int32{7, 13}, false},
		{[]int32{14, 8, 12}, []int32{14}, false},
		{[]int32{7, -2, 12}, []int32{7}, false},
		{[]int32{-2, 8, 12}, nil, true},
	} {
		for launched := range 2 {
			p.outTok[0], p.outLP[0] = 20, -0.5
			for i, tk := range tc.rows {
				p.outTok[1+i], p.outLP[1+i] = tk, -float32(i+1)
			}
			outs := make([]engine.Output, 2)
			if launched == 1 {
				p.collectLaunched(nil, outs, V)
			} else {
				p.collect(b, parts[0], nil, outs, V)
				e := &Engine{info: info, verifier: engine.NewSampler(V)}
				if err := e.verifyDrafts(b, outs, parts); err != nil {
					t.Fatal(err)
				}
			}
			if outs[0].Token != 20 || outs[0].Tokens != nil {
				t.Fatalf("the decode row beside: %+v", outs[0])
			}
			o := outs[1]
			if tc.fails {
				if o.Err == nil || !errors.Is(o.Err, engine.ErrAllMasked) || o.Token != -1 {
					t.Fatalf("rows %v: %+v, want the sequence's failure", tc.rows, o)
				}
				continue
			}
			if o.Err != nil || !slices.Equal(o.Tokens, tc.tokens) || o.Token != tc.tokens[0] || len(o.LogProbs) != len(tc.tokens) || o.LogProbs[len(o.LogProbs)-1] != -float32(len(tc.tokens)) {
				t.Fatalf("rows %v (launched %d): %v %v (err %v), want %v", tc.rows, launched, o.Tokens, o.LogProbs, o.Err, tc.tokens)
			}
			if slices.Contains(tc.rows, -2) {
				continue
			}
			// Verify on logits peaked at the rows' tokens keeps the same ones.
			var rows [][]float32
			for _, tk := range tc.rows {
				x := make([]float32, V)
				x[tk] = 5
				rows = append(rows, x)
			}
			var want engine.Output
			if err := engine.NewSampler(V).Verify(rows, &sq, &want); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(want.Tokens, o.Tokens) {
				t.Fatalf("rows %v: %v, Verify keeps %v", tc.rows, o.Tokens, want.Tokens)
			}
		}
	}
}

// TestRowsBesideALateMask: in a launch whose guided row's mask comes late, a sequence
// verified in rows takes no mask room, and the supplied offsets cover every sequence of
// the call — the guided row's, then -1 for each row of the verification.
func TestRowsBesideALateMask(t *testing.T) {
	info := testInfo()
	info.MaxDraft = engine.MaxDraftTokens
	hist := []int32{3, 4, 5, 6}
	b := &engine.Batch{Seqs: []engine.Sequence{
		{ID: 1, Tokens: []int32{1}, Blocks: []int32{0}, Sample: true, History: []int32{1}, LateMask: true},
		{ID: 2, Tokens: hist[1:], Pos: 1, Blocks: []int32{1}, Sample: true, History: hist, NumGenerated: 1, Draft: 2},
	}}
	if _, err := engine.NewBatchChecker(info, "cuda").CheckLaunch(b); err != nil {
		t.Fatal(err)
	}
	var p stepPrep
	p.init(info.VocabSize)
	p.build(b, splitBatch(b, 100, 10)[0], info)
	if n := p.lateRows(b); n != 1 || len(p.seqs) != 4 {
		t.Fatalf("%d rows with mask room among %d sequences, want 1 among 4", n, len(p.seqs))
	}
	words := engine.MaskWords(info.VocabSize)
	b.Seqs[0].Allowed = make([]uint64, words)
	if got := p.supplyOffsets(b, 2, (info.VocabSize+31)/32); !slices.Equal(got, []int32{0, -1, -1, -1}) {
		t.Fatalf("supplied offsets %v", got)
	}
	if got := p.supplyOffsets(nil, 2, (info.VocabSize+31)/32); !slices.Equal(got, []int32{-1, -1, -1, -1}) {
		t.Fatalf("no masks: offsets %v", got)
	}
}

package engine

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// toyModel is a language model small enough to enumerate: the logits of the next token
// are a fixed function of the last token and the position.
type toyModel struct {
	// vocab is the number of tokens.
	vocab int
	// salt varies the function, so that a draft model differs from the target.
	salt uint64
	// sharp scales the logits.
	sharp float32
}

// logits returns the next-token logits after ctx.
func (m toyModel) logits(ctx []int32) []float32 {
	row := make([]float32, m.vocab)
	last := uint64(0)
	if len(ctx) > 0 {
		last = uint64(ctx[len(ctx)-1])
	}
	for t := range row {
		h := mix64(m.salt ^ last*0x9e3779b97f4a7c15 ^ uint64(len(ctx))<<20 ^ uint64(t)<<40)
		row[t] = m.sharp * float32(float64(h>>11)/(1<<53)-0.5)
	}
	return row
}

// sampleSeq is a sequence with history ctx, NumGenerated n, sampling p.
func sampleSeq(ctx []int32, n int, p SamplingParams) *Sequence {
	return &Sequence{Tokens: ctx[len(ctx)-1:], History: ctx, NumGenerated: n, Sample: true, Sampling: p}
}

// plainDecode generates n tokens from prompt one at a time, without speculation.
func plainDecode(t *testing.T, m toyModel, s *Sampler, prompt []int32, n int, p SamplingParams) ([]int32, []float32) {
	t.Helper()
	ctx := slices.Clone(prompt)
	var lps []float32
	for i := range n {
		tok, lp, _, err := s.Sample(m.logits(ctx), sampleSeq(ctx, i, p))
		if err != nil {
			t.Fatal(err)
		}
		ctx = append(ctx, tok)
		lps = append(lps, lp)
	}
	return ctx[len(prompt):], lps
}

// verifyStep runs one speculative step of m after ctx with drafts (probs: their
// distributions, or nil), as an engine would: the rows of the last real token and of
// every draft.
func verifyStep(t *testing.T, m toyModel, s *Sampler, ctx []int32, gen int, drafts []int32, probs []float32, p SamplingParams) Output {
	t.Helper()
	full := append(slices.Clone(ctx), drafts...)
	var rows [][]float32
	for i := 0; i <= len(drafts); i++ {
		rows = append(rows, m.logits(full[:len(ctx)+i]))
	}
	sq := &Sequence{Tokens: full[len(ctx)-1:], History: full, NumGenerated: gen, Sample: true,
		Sampling: p, Draft: len(drafts), DraftProbs: probs}
	var out Output
	if err := s.Verify(rows, sq, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestVerifyKeepsTheTokensOfPlainDecoding: with proposals counted as certain, the
// tokens (and log-probabilities) of a speculative step are exactly those of decoding
// one token at a time, whatever the proposals — right ones are kept up to the first
// wrong one, which is replaced by the token sampled there — for greedy and sampled
// sequences, with penalties reading the proposals in the history.
func TestVerifyKeepsTheTokensOfPlainDecoding(t *testing.T) {
	m := toyModel{vocab: 40, salt: 7, sharp: 6}
	prompt := []int32{3, 1, 4, 1, 5}
	cases := map[string]SamplingParams{
		"greedy":                   {},
		"sampled":                  {Temperature: 0.9, Seed: 11},
		"top-k and top-p":          {Temperature: 1.2, TopK: 8, TopP: 0.8, Seed: 5},
		"penalties and min length": {Temperature: 0.7, RepetitionPenalty: 1.3, FrequencyPenalty: 0.4, MinLength: 3, EndIDs: []int32{2}, Seed: 3},
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			s := NewSampler(m.vocab)
			want, wantLP := plainDecode(t, m, s, prompt, 6, p)
			for good := 0; good <= 4; good++ {
				drafts := slices.Clone(want[:good])
				if good < 4 {
					// A wrong proposal after the right ones, then more that must be ignored.
					drafts = append(drafts, (want[good]+1)%int32(m.vocab), want[good], 0)
				}
				out := verifyStep(t, m, s, prompt, 0, drafts, nil, p)
				n := min(good, len(drafts)) + 1
				if !slices.Equal(out.Tokens, want[:n]) {
					t.Fatalf("%d right proposals %v: tokens %v, want %v", good, drafts, out.Tokens, want[:n])
				}
				for i, lp := range out.LogProbs {
					if math.Abs(float64(lp-wantLP[i])) > 1e-5 {
						t.Fatalf("%d right proposals: log-prob %d is %g, want %g", good, i, lp, wantLP[i])
					}
				}
				if out.Token != out.Tokens[0] || out.LogProb != out.LogProbs[0] {
					t.Fatalf("Token %d/%g does not repeat Tokens[0] %d/%g", out.Token, out.LogProb, out.Tokens[0], out.LogProbs[0])
				}
			}
		})
	}
}

// TestVerifyReturnsOneLogitsRowPerToken: ReturnLogits gives each new token's biased row.
func TestVerifyReturnsOneLogitsRowPerToken(t *testing.T) {
	m := toyModel{vocab: 12, salt: 1, sharp: 4}
	s := NewSampler(m.vocab)
	bias := make([]float32, m.vocab)
	bias[3] = 0.5
	p := SamplingParams{EmbeddingBias: bias}
	prompt := []int32{1, 2}
	want, _ := plainDecode(t, m, s, prompt, 3, p)
	full := append(slices.Clone(prompt), want[0], want[1])
	rows := [][]float32{m.logits(full[:2]), m.logits(full[:3]), m.logits(full[:4])}
	sq := &Sequence{Tokens: full[1:], History: full, Sample: true, Sampling: p, Draft: 2, ReturnLogits: true}
	var out Output
	if err := s.Verify(rows, sq, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Tokens) != 3 || len(out.Logits) != 3*m.vocab {
		t.Fatalf("%d tokens and %d logits, want 3 and %d", len(out.Tokens), len(out.Logits), 3*m.vocab)
	}
	for i, r := range rows {
		for j, l := range r {
			if got := out.Logits[i*m.vocab+j]; got != l+bias[j] {
				t.Fatalf("row %d logit %d is %g, want %g", i, j, got, l+bias[j])
			}
		}
	}
}

// TestSpeculativeSamplingKeepsTheTargetDistribution: on a vocabulary of 3, a draft model
// unlike the target proposes 2 tokens from its own distribution (DraftProbs) and the
// step keeps them by speculative sampling's rule; over 60,000 seeds the first two
// generated tokens follow the target's own joint distribution (chi-squared, 8 degrees
// of freedom, below the 0.001 critical value), while the draft's distribution would
// fail the same test — the test can tell them apart.
func TestSpeculativeSamplingKeepsTheTargetDistribution(t *testing.T) {
	const V, runs = 3, 60000
	target := toyModel{vocab: V, salt: 1, sharp: 3}
	draft := toyModel{vocab: V, salt: 99, sharp: 3}
	prompt := []int32{0}
	p := SamplingParams{Temperature: 1}
	s, ds := NewSampler(V), NewSampler(V)
	probsOf := func(m toyModel, ctx []int32, sm *Sampler) []float64 {
		w := m.logits(ctx)
		pr, err := sm.Probs(w, &p)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(pr)
	}
	// The exact joint distributions of the first two tokens.
	var want, draftWant [V * V]float64
	for a := range V {
		pa, qa := probsOf(target, prompt, s), probsOf(draft, prompt, ds)
		pb, qb := probsOf(target, []int32{0, int32(a)}, s), probsOf(draft, []int32{0, int32(a)}, ds)
		for b := range V {
			want[a*V+b] = pa[a] * pb[b]
			draftWant[a*V+b] = qa[a] * qb[b]
		}
	}
	var got [V * V]float64
	accepted, proposed := 0, 0
	for run := range runs {
		p.Seed = uint64(run)
		ctx := slices.Clone(prompt)
		for len(ctx) < 3 {
			gen := len(ctx) - 1
			var drafts []int32
			var probs []float32
			for i := range 2 {
				q := probsOf(draft, append(slices.Clone(ctx), drafts...), ds)
				for _, x := range q {
					probs = append(probs, float32(x))
				}
				drafts = append(drafts, SampleProbs(probs[i*V:], Uniform(p.Seed^0x5eed, gen+i)))
			}
			out := verifyStep(t, target, s, ctx, gen, drafts, probs, p)
			accepted += len(out.Tokens) - 1
			proposed += 2
			ctx = append(ctx, out.Tokens...)
		}
		got[ctx[1]*V+ctx[2]]++
	}
	chi := func(dist [V * V]float64) float64 {
		var x float64
		for i, w := range dist {
			e := w * runs
			x += (got[i] - e) * (got[i] - e) / e
		}
		return x
	}
	const critical = 26.12 // chi-squared, 8 degrees of freedom, p = 0.001
	if x := chi(want); x > critical {
		t.Errorf("chi-squared %.1f against the target's distribution exceeds %.2f: counts %v, want %v × %d", x, critical, got, want, runs)
	}
	if x := chi(draftWant); x < critical {
		t.Errorf("chi-squared %.1f against the draft's distribution: the test cannot tell the draft from the target", x)
	}
	if accepted == 0 || accepted == proposed {
		t.Errorf("%d of %d proposals accepted: the rule was not exercised both ways", accepted, proposed)
	}
	t.Logf("acceptance %.3f (%d of %d)", float64(accepted)/float64(proposed), accepted, proposed)
}

// TestVerifyRefusesRowsThatDoNotMatch: the row count must be Draft+1.
func TestVerifyRefusesRowsThatDoNotMatch(t *testing.T) {
	s := NewSampler(4)
	sq := &Sequence{Tokens: []int32{1, 2}, History: []int32{0, 1, 2}, Sample: true, Draft: 1}
	var out Output
	if err := s.Verify([][]float32{make([]float32, 4)}, sq, &out); err == nil {
		t.Fatal("Verify took 1 row for 1 proposal")
	}
}

// TestSampleProbsFollowsTheDistribution: SampleProbs inverts the cumulative
// distribution.
func TestSampleProbsFollowsTheDistribution(t *testing.T) {
	q := []float32{0.2, 0, 0.5, 0.3}
	r := rand.New(rand.NewPCG(1, 2))
	var n [4]int
	for range 40000 {
		n[SampleProbs(q, r.Float64())]++
	}
	for i, c := range n {
		if got := float64(c) / 40000; math.Abs(got-float64(q[i])) > 0.01 {
			t.Errorf("token %d drawn %.3f of the time, want %.1f", i, got, q[i])
		}
	}
}

// TestVerifyStopsBeforeAFailingRow: when the rules leave no token at a row after the
// first, the step keeps the proposals before it and reports no error — the next step
// fails there, as one token at a time fails — and a failure at the first row is the
// step's error, as Sample's.
func TestVerifyStopsBeforeAFailingRow(t *testing.T) {
	const V, X = 6, 3
	bias := make([]float32, V)
	for i := range bias {
		if i != X {
			bias[i] = float32(math.Inf(-1))
		}
	}
	// Only X may follow anything, and X may not follow X.
	p := SamplingParams{EmbeddingBias: bias, BadWords: [][]int32{{X, X}}}
	s := NewSampler(V)
	rows := [][]float32{make([]float32, V), make([]float32, V), make([]float32, V)}
	sq := &Sequence{Tokens: []int32{1, X, X}, History: []int32{0, 1, X, X}, Sample: true, Sampling: p, Draft: 2}
	var out Output
	if err := s.Verify(rows, sq, &out); err != nil || !slices.Equal(out.Tokens, []int32{X}) {
		t.Fatalf("tokens %v, err %v; want [%d] and no error", out.Tokens, err, X)
	}
	first := &Sequence{Tokens: []int32{X, 1}, History: []int32{0, X, 1}, Sample: true, Sampling: p, Draft: 1}
	if err := s.Verify(rows[:2], first, &out); !errors.Is(err, ErrAllMasked) {
		t.Fatalf("a failure at the first row: %v, want ErrAllMasked", err)
	}
}

package engine

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// newSampler returns a sampler for a vocabulary of v tokens.
func newSampler(v int) *Sampler { return NewSampler(v) }

// sampleOne samples from logits with p, failing the test on error.
func sampleOne(t testing.TB, s *Sampler, logits []float32, p SamplingParams, hist []int32, numGenerated int) (int32, float32) {
	t.Helper()
	tok, lp, _, err := s.Sample(logits, &Sequence{ID: 1, Sampling: p, History: hist, NumGenerated: numGenerated, Sample: true})
	if err != nil {
		t.Fatalf("sample: %v", err)
	}
	return tok, lp
}

// logProbs returns log p of probabilities p (as logits whose softmax is p).
func logProbs(p ...float64) []float32 {
	l := make([]float32, len(p))
	for i, x := range p {
		l[i] = float32(math.Log(x))
	}
	return l
}

// randomLogits returns n logits with a spread like a real model's.
func randomLogits(rng *rand.Rand, n int, std float64) []float32 {
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(rng.NormFloat64() * std)
	}
	return l
}

func TestSamplingIsDeterministicPerSeedAndStep(t *testing.T) {
	s := newSampler(500)
	logits := randomLogits(rand.New(rand.NewPCG(1, 1)), 500, 1)
	p := SamplingParams{Temperature: 1, Seed: 1234}
	first, _ := sampleOne(t, s, logits, p, nil, 3)
	for range 5 {
		if tok, _ := sampleOne(t, s, logits, p, nil, 3); tok != first {
			t.Fatalf("same seed and step drew %d, then %d", first, tok)
		}
	}
	seen := map[int32]bool{}
	for seed := range uint64(50) {
		p.Seed = seed
		tok, _ := sampleOne(t, s, logits, p, nil, 3)
		seen[tok] = true
	}
	if len(seen) < 10 {
		t.Errorf("50 seeds over a flat distribution drew only %d distinct tokens", len(seen))
	}
	steps := map[int32]bool{}
	p.Seed = 1234
	for n := range 50 {
		tok, _ := sampleOne(t, s, logits, p, nil, n)
		steps[tok] = true
	}
	if len(steps) < 10 {
		t.Errorf("50 steps of one seed drew only %d distinct tokens", len(steps))
	}
}

func TestTopKOfOneIsGreedy(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	s := newSampler(1000)
	for i := range 20 {
		logits := randomLogits(rng, 1000, 3)
		greedy, glp := sampleOne(t, s, logits, SamplingParams{}, nil, i)
		if want := int32(argmax(logits)); greedy != want {
			t.Fatalf("greedy chose %d, argmax is %d", greedy, want)
		}
		for _, temp := range []float32{0.3, 1, 2.5} {
			tok, lp := sampleOne(t, s, logits, SamplingParams{Temperature: temp, TopK: 1, TopP: 0.5, Seed: uint64(i)}, nil, i)
			if tok != greedy || lp != glp {
				t.Errorf("top_k=1 at temperature %g chose %d (%g), greedy %d (%g)", temp, tok, lp, greedy, glp)
			}
		}
	}
}

func TestTopKKeepsTheKBestTokens(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	logits := randomLogits(rng, 2000, 0.5)
	order := make([]int, len(logits))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return logits[order[a]] > logits[order[b]] })
	s := newSampler(len(logits))
	for _, k := range []int{2, 5, 40} {
		allowed := map[int32]bool{}
		for _, i := range order[:k] {
			allowed[int32(i)] = true
		}
		seen := map[int32]bool{}
		for seed := range uint64(3000) {
			tok, _ := sampleOne(t, s, logits, SamplingParams{Temperature: 5, TopK: k, Seed: seed}, nil, 0)
			if !allowed[tok] {
				t.Fatalf("top_k=%d drew token %d, outside the %d best", k, tok, k)
			}
			seen[tok] = true
		}
		if len(seen) != k {
			t.Errorf("top_k=%d at a high temperature drew %d distinct tokens in 3000 draws, want all %d", k, len(seen), k)
		}
	}
}

// referenceNucleus computes top-k then top-p by sorting the whole row: the set of
// tokens kept, best first.
func referenceNucleus(logits []float32, temp float64, k int, topP float64) []int32 {
	ids := make([]int32, len(logits))
	for i := range ids {
		ids[i] = int32(i)
	}
	sort.SliceStable(ids, func(a, b int) bool { return logits[ids[a]] > logits[ids[b]] })
	if k > 0 && k < len(ids) {
		ids = ids[:k]
	}
	mx := float64(logits[ids[0]])
	var total float64
	for _, i := range ids {
		total += math.Exp((float64(logits[i]) - mx) / temp)
	}
	if topP <= 0 || topP >= 1 {
		return ids
	}
	var cum float64
	for n, i := range ids {
		cum += math.Exp((float64(logits[i]) - mx) / temp)
		if cum >= topP*total {
			return ids[:n+1]
		}
	}
	return ids
}

func TestTopPKeepsTheNucleus(t *testing.T) {
	t.Run("a hand-built row keeps the tokens reaching the mass", func(t *testing.T) {
		// Probabilities 0.5, 0.3, 0.15, 0.05 in a scrambled order: top_p 0.75 keeps the
		// first two, whose renormalised shares are 0.625 and 0.375.
		logits := logProbs(0.15, 0.5, 0.05, 0.3)
		s := newSampler(4)
		counts := map[int32]int{}
		const draws = 8000
		for seed := range uint64(draws) {
			tok, _ := sampleOne(t, s, logits, SamplingParams{Temperature: 1, TopP: 0.75, Seed: seed}, nil, 0)
			counts[tok]++
		}
		if counts[0] != 0 || counts[2] != 0 {
			t.Errorf("top_p 0.75 drew tokens outside the nucleus {1, 3}: %v", counts)
		}
		if share := float64(counts[1]) / draws; math.Abs(share-0.625) > 0.025 {
			t.Errorf("token 1 drawn %.3f of the time, want 0.625 (its share of the nucleus)", share)
		}
	})
	t.Run("the nucleus equals a full sort's", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(4, 4))
		for _, tc := range []struct {
			vocab int
			std   float64
			temp  float64
			k     int
			p     float64
		}{
			{5000, 4, 1, 0, 0.9},     // peaked: the nucleus fits the first partial sort
			{5000, 0.3, 1, 0, 0.9},   // flat: the nucleus needs most of the row
			{5000, 2, 0.7, 100, 0.8}, // top-k first, then top-p
			{5000, 2, 1.5, 7, 1},     // top-k alone
			{300, 1, 1, 0, 0.5},
		} {
			logits := randomLogits(rng, tc.vocab, tc.std)
			s := newSampler(tc.vocab)
			mx := float64(logits[argmax(logits)])
			k := tc.k
			if k == 0 {
				k = tc.vocab
			}
			got, _ := s.nucleus(logits, k, tc.p < 1, tc.p, mx, 1/tc.temp)
			want := referenceNucleus(logits, tc.temp, tc.k, tc.p)
			ids := make([]int32, len(got))
			for i, c := range got {
				ids[i] = c.id
			}
			if !slices.Equal(ids, want) {
				t.Errorf("vocab %d std %g temp %g k %d p %g: nucleus of %d tokens, full sort keeps %d (first %v vs %v)",
					tc.vocab, tc.std, tc.temp, tc.k, tc.p, len(ids), len(want), ids[:min(5, len(ids))], want[:min(5, len(want))])
			}
		}
	})
}

func TestPenaltiesChangeTheSeenTokens(t *testing.T) {
	base := []float32{2, -2, 1, 0.5, 3}
	hist := []int32{0, 1, 0, 3, 0}
	for _, tc := range []struct {
		name string
		p    SamplingParams
		want []float32
	}{
		{"repetition divides positive and multiplies negative logits", SamplingParams{RepetitionPenalty: 2}, []float32{1, -4, 1, 0.25, 3}},
		{"repetition below one favours seen tokens", SamplingParams{RepetitionPenalty: 0.5}, []float32{4, -1, 1, 1, 3}},
		{"presence subtracts once per seen token", SamplingParams{PresencePenalty: 0.5}, []float32{1.5, -2.5, 1, 0, 3}},
		{"frequency subtracts once per occurrence", SamplingParams{FrequencyPenalty: 0.25}, []float32{1.25, -2.25, 1, 0.25, 3}},
		{"all three compose in order", SamplingParams{RepetitionPenalty: 2, PresencePenalty: 1, FrequencyPenalty: 0.5},
			[]float32{-1.5, -5.5, 1, -1.25, 3}}, // 2/2-1-3·0.5, -2·2-1-0.5, …
		{"none leaves the row alone", SamplingParams{RepetitionPenalty: 1}, base},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSampler(len(base))
			w := slices.Clone(base)
			s.applyPenalties(w, &tc.p, hist)
			if !slices.Equal(w, tc.want) {
				t.Errorf("got %v, want %v", w, tc.want)
			}
			// The counts start from zero again: a second pass gives the same row.
			again := slices.Clone(base)
			s.applyPenalties(again, &tc.p, hist)
			if !slices.Equal(again, tc.want) {
				t.Errorf("second pass got %v, want %v", again, tc.want)
			}
		})
	}
	t.Run("a repetition penalty moves greedy off a repeated token", func(t *testing.T) {
		s := newSampler(len(base))
		if tok, _ := sampleOne(t, s, base, SamplingParams{}, []int32{4}, 0); tok != 4 {
			t.Fatalf("greedy without penalty chose %d, want 4", tok)
		}
		if tok, _ := sampleOne(t, s, base, SamplingParams{RepetitionPenalty: 2}, []int32{4, 4}, 0); tok != 0 {
			t.Errorf("greedy with repetition penalty chose %d, want 0", tok)
		}
	})
}

func TestMinLengthMasksTheEndToken(t *testing.T) {
	logits := []float32{0, 1, 5, 2} // token 2 is the end token and the favourite
	s := newSampler(len(logits))
	p := SamplingParams{MinLength: 3, EndIDs: []int32{2}}
	for n, want := range []int32{3, 3, 3, 2, 2} {
		if tok, _ := sampleOne(t, s, logits, p, nil, n); tok != want {
			t.Errorf("after %d generated tokens with min_length 3: chose %d, want %d", n, tok, want)
		}
	}
	p.EndIDs = nil
	if tok, _ := sampleOne(t, s, logits, p, nil, 0); tok != 2 {
		t.Errorf("min_length without an end id chose %d, want 2", tok)
	}
}

func TestBadWordsMaskTheirLastToken(t *testing.T) {
	logits := []float32{0, 1, 2, 3, 9, 8, 7} // preference: 4, 5, 6, 3, …
	bad := [][]int32{{1, 4}, {2, 3, 5}, {6}}
	for _, tc := range []struct {
		name string
		hist []int32
		bad  [][]int32
		want int32
	}{
		{"a one-token word is always masked", nil, [][]int32{{4}}, 5},
		{"a two-token word masks after its prefix", []int32{0, 1}, bad, 5},
		{"a two-token word leaves others alone", []int32{1, 0}, bad, 4},
		{"a three-token word masks after its two-token prefix", []int32{1, 2, 3}, [][]int32{{2, 3, 4}}, 5},
		{"a partial prefix does not mask", []int32{3}, [][]int32{{2, 3, 4}}, 4},
		{"masks stack", []int32{1, 2, 3}, [][]int32{{1, 4}, {4}, {2, 3, 5}, {6}}, 3},
		{"a prefix longer than the history does not mask", []int32{3}, [][]int32{{1, 2, 3, 4}}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSampler(len(logits))
			if tok, _ := sampleOne(t, s, logits, SamplingParams{BadWords: tc.bad}, tc.hist, 0); tok != tc.want {
				t.Errorf("chose %d, want %d", tok, tc.want)
			}
		})
	}
	t.Run("masking every token is an error", func(t *testing.T) {
		s := newSampler(2)
		_, _, _, err := s.Sample([]float32{1, 2}, &Sequence{Sampling: SamplingParams{BadWords: [][]int32{{0}, {1}}}})
		if err == nil {
			t.Error("sampling with every token masked succeeded")
		}
	})
}

func TestEmbeddingBiasShiftsTheChoice(t *testing.T) {
	logits := []float32{3, 1, 0, 2}
	bias := []float32{0, 0, 5, float32(math.Inf(-1))}
	s := newSampler(len(logits))
	seq := &Sequence{Sample: true, ReturnLogits: true, Sampling: SamplingParams{EmbeddingBias: bias, RepetitionPenalty: 3},
		History: []int32{2}}
	tok, _, returned, err := s.Sample(logits, seq)
	if err != nil {
		t.Fatal(err)
	}
	// Token 2 (0+5, then divided by the repetition penalty: 5/3) loses to token 0 (3);
	// the returned logits are after the bias and before the penalty.
	if tok != 0 {
		t.Errorf("chose %d, want 0", tok)
	}
	if want := []float32{3, 1, 5, float32(math.Inf(-1))}; !slices.Equal(returned, want) {
		t.Errorf("returned logits %v, want %v (raw plus bias)", returned, want)
	}
	seq.Sampling.RepetitionPenalty = 0
	if tok, _, _, _ := s.Sample(logits, seq); tok != 2 {
		t.Errorf("with the bias alone chose %d, want 2", tok)
	}
	if logits[2] != 0 {
		t.Errorf("sampling modified the raw logits: %v", logits)
	}
}

func TestLogProbsAreLogSoftmax(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	logits := randomLogits(rng, 3000, 2)
	s := newSampler(len(logits))
	for _, tc := range []struct {
		name string
		p    SamplingParams
		temp float64 // the temperature the log-softmax uses
	}{
		{"greedy uses temperature 1", SamplingParams{}, 1},
		{"greedy by top_k=1 uses temperature 1", SamplingParams{Temperature: 0.3, TopK: 1}, 1},
		{"sampling uses the sampling temperature", SamplingParams{Temperature: 0.7, TopK: 20, TopP: 0.9, Seed: 3}, 0.7},
		{"sampling at a high temperature", SamplingParams{Temperature: 2, Seed: 4}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, lp := sampleOne(t, s, logits, tc.p, nil, 0)
			lse := logSumExp(logits, 1/tc.temp)
			var sum float64
			for _, l := range logits {
				sum += math.Exp(float64(l)/tc.temp - lse)
			}
			if math.Abs(sum-1) > 1e-9 {
				t.Errorf("Σ exp(log-softmax) = %.12f, want 1", sum)
			}
			want := float64(logits[tok])/tc.temp - lse
			if math.Abs(float64(lp)-want) > 1e-5 || lp > 0 {
				t.Errorf("log-prob of token %d = %g, want %g", tok, lp, want)
			}
		})
	}
}

package engine

import (
	"math"
	"strings"
	"testing"
)

func TestValidateNamesTheBrokenSetting(t *testing.T) {
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name   string
		mutate func(p *SamplingParams)
		want   string
	}{
		{"a negative temperature", func(p *SamplingParams) { p.Temperature = -1 }, "temperature"},
		{"a NaN temperature", func(p *SamplingParams) { p.Temperature = nan }, "temperature"},
		{"a negative top_k", func(p *SamplingParams) { p.TopK = -3 }, "top_k"},
		{"top_p above one", func(p *SamplingParams) { p.TopP = 1.5 }, "top_p"},
		{"a negative repetition penalty", func(p *SamplingParams) { p.RepetitionPenalty = -1 }, "repetition_penalty"},
		{"a NaN presence penalty", func(p *SamplingParams) { p.PresencePenalty = nan }, "presence_penalty"},
		{"an infinite frequency penalty", func(p *SamplingParams) { p.FrequencyPenalty = float32(math.Inf(1)) }, "frequency_penalty"},
		{"a negative min length", func(p *SamplingParams) { p.MinLength = -1 }, "min_length"},
		{"an end id beyond the vocabulary", func(p *SamplingParams) { p.EndIDs = []int32{2, 300} }, "end_id 300"},
		{"an embedding bias of the wrong length", func(p *SamplingParams) { p.EmbeddingBias = make([]float32, 299) }, "embedding_bias has 299 values"},
		{"a NaN in the embedding bias", func(p *SamplingParams) {
			p.EmbeddingBias = make([]float32, 300)
			p.EmbeddingBias[7] = nan
		}, "embedding_bias[7]"},
		{"an empty bad word", func(p *SamplingParams) { p.BadWords = [][]int32{{5}, {}} }, "bad_words[1] is empty"},
		{"a bad word beyond the vocabulary", func(p *SamplingParams) { p.BadWords = [][]int32{{5, 301}} }, "bad_words[0][1] = 301"},
		{"an embedding bias of -Inf everywhere", func(p *SamplingParams) { p.EmbeddingBias = filled(300, negInf) }, "embedding_bias is -Inf for every one of the 300 tokens"},
		{"one-token bad words over the whole vocabulary", func(p *SamplingParams) { p.BadWords = eachToken(0, 300) }, "bad_words forbid all 300 tokens"},
		{"a -Inf bias and bad words that cover the vocabulary together", func(p *SamplingParams) {
			p.EmbeddingBias = filled(300, 0)
			copy(p.EmbeddingBias, filled(150, negInf))
			p.BadWords = eachToken(150, 300)
		}, "embedding_bias (-Inf for 150 tokens) and the one-token bad_words"},
		{"min_length with a bias that leaves only the end token", func(p *SamplingParams) {
			p.MinLength, p.EmbeddingBias = 3, filled(300, negInf)
			p.EmbeddingBias[2] = 0
		}, "min_length 3 forbids the end tokens [2]"},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			p := SamplingParams{Temperature: 1, EndIDs: []int32{2}}
			if err := p.Validate(300); err != nil {
				t.Fatalf("the good settings fail: %v", err)
			}
			tc.mutate(&p)
			err := p.Validate(300)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestAppendMasks(t *testing.T) {
	sq := Sequence{History: []int32{4, 7, 9}, NumGenerated: 1,
		Sampling: SamplingParams{MinLength: 2, EndIDs: []int32{5, 6}, BadWords: [][]int32{{3}, {7, 9, 11}, {9, 12}, {8, 13}}}}
	got := AppendMasks(nil, &sq)
	want := []int32{5, 6, 3, 11, 12}
	if len(got) != len(want) {
		t.Fatalf("masks %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("masks %v, want %v", got, want)
		}
	}
	sq.NumGenerated = 2
	if got := AppendMasks(nil, &sq); len(got) != 3 {
		t.Errorf("after min length: masks %v, want the bad words' 3, 11, 12 only", got)
	}
}

func TestUniformDrawsAreUniform(t *testing.T) {
	const n = 20000
	var buckets [10]int
	for i := range n {
		u := Uniform(uint64(i/100), i%100)
		if u < 0 || u >= 1 {
			t.Fatalf("Uniform(%d, %d) = %g outside [0, 1)", i/100, i%100, u)
		}
		buckets[int(u*10)]++
	}
	for b, c := range buckets {
		if c < n/10-300 || c > n/10+300 {
			t.Errorf("bucket %d holds %d of %d draws, want about %d", b, c, n, n/10)
		}
	}
}

// negInf is -Inf as a float32.
var negInf = float32(math.Inf(-1))

// filled is n copies of v.
func filled(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// eachToken is a one-token bad word for each token of [from, to).
func eachToken(from, to int) [][]int32 {
	var out [][]int32
	for t := from; t < to; t++ {
		out = append(out, []int32{int32(t)})
	}
	return out
}

func TestValidateAcceptsWhatLeavesAChoice(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params SamplingParams
	}{
		{"a bias of -Inf but for one token", func() SamplingParams {
			p := SamplingParams{EmbeddingBias: filled(300, negInf)}
			p.EmbeddingBias[42] = 0
			return p
		}()},
		{"bad words of two tokens over the whole vocabulary (their prefix decides)", func() SamplingParams {
			var bad [][]int32
			for t := range 300 {
				bad = append(bad, []int32{7, int32(t)})
			}
			return SamplingParams{BadWords: bad}
		}()},
		{"min_length once only the end token is left, without min_length", func() SamplingParams {
			p := SamplingParams{EmbeddingBias: filled(300, negInf), EndIDs: []int32{2}}
			p.EmbeddingBias[2] = 0
			return p
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.params.Validate(300); err != nil {
				t.Errorf("Validate = %v", err)
			}
		})
	}
}

func TestAllowedMask(t *testing.T) {
	const v = 130
	w := make([]float32, v)
	for i := range w {
		w[i] = float32(i % 7)
	}
	allowed := make([]uint64, MaskWords(v))
	for _, id := range []int{3, 64, 129} {
		allowed[id/64] |= 1 << (id % 64)
	}
	ApplyAllowed(w, allowed)
	for i, x := range w {
		want := !math.IsInf(float64(x), -1)
		if got := i == 3 || i == 64 || i == 129; got != want {
			t.Fatalf("token %d: allowed %v, logit %v", i, got, x)
		}
	}
	if _, ok := OnlyAllowed(allowed); ok {
		t.Fatal("three tokens read as one")
	}
	one := make([]uint64, MaskWords(v))
	one[2] = 1 << 1
	if tok, ok := OnlyAllowed(one); !ok || tok != 129 {
		t.Fatalf("OnlyAllowed = %d, %v; want 129", tok, ok)
	}
	// The sampler: greedy picks the best allowed token; a single allowed token is taken
	// without a draw even when it is the least likely, unless another mask forbids it.
	s := NewSampler(v)
	raw := make([]float32, v)
	for i := range raw {
		raw[i] = float32(i)
	}
	sq := &Sequence{Sampling: SamplingParams{Temperature: 1, Seed: 5}, Allowed: allowed}
	for n := range 50 {
		sq.NumGenerated = n
		tok, _, _, err := s.Sample(raw, sq)
		if err != nil || (tok != 3 && tok != 64 && tok != 129) {
			t.Fatalf("sampled %d (%v) outside the mask", tok, err)
		}
	}
	low := make([]uint64, MaskWords(v))
	low[0] = 1
	sq = &Sequence{Sampling: SamplingParams{Temperature: 1}, Allowed: low}
	if tok, lp, _, err := s.Sample(raw, sq); err != nil || tok != 0 || lp != 0 {
		t.Fatalf("forced token: got %d lp %v (%v); want 0 at log-probability 0", tok, lp, err)
	}
	sq.Sampling.MinLength, sq.Sampling.EndIDs = 1, []int32{0}
	if _, _, _, err := s.Sample(raw, sq); err == nil {
		t.Fatal("a forced token that min_length forbids was sampled")
	}
}

func TestMinP(t *testing.T) {
	s := NewSampler(3)
	raw := []float32{0, -1, -5}
	seen := map[int32]bool{}
	for n := range 200 {
		sq := &Sequence{Sampling: SamplingParams{Temperature: 1, Seed: 7, MinP: 0.5}, NumGenerated: n}
		tok, _, _, err := s.Sample(raw, sq)
		if err != nil {
			t.Fatal(err)
		}
		seen[tok] = true
	}
	if len(seen) != 1 || !seen[0] {
		t.Fatalf("min_p 0.5 drew %v; only token 0 is at least half as likely as the first", seen)
	}
	clear(seen)
	for n := range 400 {
		sq := &Sequence{Sampling: SamplingParams{Temperature: 1, Seed: 7, MinP: 0.3, TopK: 3}, NumGenerated: n}
		tok, _, _, _ := s.Sample(raw, sq)
		seen[tok] = true
	}
	if len(seen) != 2 || seen[2] {
		t.Fatalf("min_p 0.3 drew %v; want tokens 0 and 1 (e^-1 ≥ 0.3, e^-5 < 0.3)", seen)
	}
	if err := (&SamplingParams{MinP: 1.5}).Validate(3); err == nil {
		t.Fatal("min_p 1.5 validated")
	}
}

package engine

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Sampling turns one row of logits into a token. The logits pass through, in order:
// the embedding bias; the repetition, presence and frequency penalties over History;
// the min-length mask on EndID; the bad-words mask; then either greedy choice
// (Temperature 0 or TopK 1) or temperature → top-k → top-p → a draw. The draw reads a
// counter-based random stream keyed by (Seed, NumGenerated), so a sequence's tokens
// depend only on its own parameters and history, never on the rest of the batch.

// sampler holds the buffers sampling reuses between sequences and steps.
type sampler struct {
	// work is the processed logits row [vocab].
	work []float32
	// hist counts History's tokens for the penalties.
	hist TokenCounts
	// cand holds top-k / top-p candidates, best first.
	cand []candidate
}

// candidate is a token with its processed logit.
type candidate struct {
	// id is the token.
	id int32
	// logit is its processed logit.
	logit float32
}

// init sizes the buffers for a vocabulary.
func (s *sampler) init(vocab int) {
	s.work = make([]float32, vocab)
	s.hist = NewTokenCounts(vocab)
}

// errAllMasked is returned when penalties and masks leave no token to choose.
var errAllMasked = errors.New("every token is masked (bad words, min length and bias leave no choice)")

// sample chooses a token from the raw logits row of sq's last position. It returns the
// token, its log-probability, and a copy of the biased logits when sq.ReturnLogits is
// set. raw is not modified.
func (s *sampler) sample(raw []float32, sq *Sequence) (int32, float32, []float32, error) {
	p := &sq.Sampling
	w := s.work[:len(raw)]
	copy(w, raw)
	addBias(w, p.EmbeddingBias)
	var logits []float32
	if sq.ReturnLogits {
		logits = slices.Clone(w)
	}
	s.applyPenalties(w, p, sq.History)
	applyMinLength(w, p, sq.NumGenerated)
	applyBadWords(w, p.BadWords, sq.History)
	tok, lp, err := s.pick(w, p, sq.NumGenerated)
	return tok, lp, logits, err
}

// Validate checks p for a vocabulary of v tokens. The CPU and GPU engines refuse a
// sequence whose settings fail it; the batch manager checks requests with it first, so
// that one bad request fails alone rather than failing a whole batch's step.
func (p *SamplingParams) Validate(v int) error {
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	switch {
	case !finite(p.Temperature) || p.Temperature < 0:
		return fmt.Errorf("temperature %g must be finite and ≥ 0", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("top_k %d must be ≥ 0", p.TopK)
	case !(p.TopP >= 0 && p.TopP <= 1):
		return fmt.Errorf("top_p %g must be in [0, 1]", p.TopP)
	case !finite(p.RepetitionPenalty) || p.RepetitionPenalty < 0:
		return fmt.Errorf("repetition_penalty %g must be finite and ≥ 0", p.RepetitionPenalty)
	case !finite(p.PresencePenalty):
		return fmt.Errorf("presence_penalty %g must be finite", p.PresencePenalty)
	case !finite(p.FrequencyPenalty):
		return fmt.Errorf("frequency_penalty %g must be finite", p.FrequencyPenalty)
	case p.MinLength < 0:
		return fmt.Errorf("min_length %d must be ≥ 0", p.MinLength)
	case p.EndID < -1 || int(p.EndID) >= v:
		return fmt.Errorf("end_id %d must be -1 or in [0, %d)", p.EndID, v)
	case len(p.EmbeddingBias) != 0 && len(p.EmbeddingBias) != v:
		return fmt.Errorf("embedding_bias has %d values, want the vocabulary size %d", len(p.EmbeddingBias), v)
	}
	for i, b := range p.EmbeddingBias {
		if math.IsNaN(float64(b)) || math.IsInf(float64(b), 1) {
			return fmt.Errorf("embedding_bias[%d] = %g must be finite or -Inf", i, b)
		}
	}
	for i, word := range p.BadWords {
		if len(word) == 0 {
			return fmt.Errorf("bad_words[%d] is empty", i)
		}
		for j, t := range word {
			if t < 0 || int(t) >= v {
				return fmt.Errorf("bad_words[%d][%d] = %d is outside the vocabulary [0, %d)", i, j, t, v)
			}
		}
	}
	return nil
}

// addBias adds bias to w when bias is set.
func addBias(w, bias []float32) {
	if len(bias) == 0 {
		return
	}
	bias = bias[:len(w)]
	for i := range w {
		w[i] += bias[i]
	}
}

// applyBias returns a copy of raw with bias added.
func applyBias(raw, bias []float32) []float32 {
	w := slices.Clone(raw)
	addBias(w, bias)
	return w
}

// applyPenalties applies the repetition penalty (divide a positive logit, multiply a
// negative one), then the presence penalty (once per distinct token) and the frequency
// penalty (once per occurrence) to every token of hist.
func (s *sampler) applyPenalties(w []float32, p *SamplingParams, hist []int32) {
	rep := p.RepetitionPenalty
	useRep := rep != 0 && rep != 1
	if !useRep && p.PresencePenalty == 0 && p.FrequencyPenalty == 0 {
		return
	}
	s.hist.Each(hist, func(t, n int32) {
		l := w[t]
		if useRep {
			if l > 0 {
				l /= rep
			} else {
				l *= rep
			}
		}
		w[t] = l - (p.PresencePenalty + p.FrequencyPenalty*float32(n))
	})
}

// applyMinLength masks EndID while fewer than MinLength tokens have been generated.
func applyMinLength(w []float32, p *SamplingParams, numGenerated int) {
	if p.EndID >= 0 && numGenerated < p.MinLength {
		w[p.EndID] = float32(math.Inf(-1))
	}
}

// applyBadWords masks the last token of every bad word whose other tokens end hist; a
// one-token bad word is always masked.
func applyBadWords(w []float32, bad [][]int32, hist []int32) {
	for _, word := range bad {
		prefix := word[:len(word)-1]
		if len(hist) >= len(prefix) && slices.Equal(hist[len(hist)-len(prefix):], prefix) {
			w[word[len(word)-1]] = float32(math.Inf(-1))
		}
	}
}

// pick chooses the token from the processed logits w. Greedy takes the first maximum
// and reports its log-softmax at temperature 1; otherwise the logits are divided by the
// temperature, cut to the top k, cut to the nucleus of mass top_p, and one token is
// drawn; its log-probability is the log-softmax of the whole temperature-scaled row.
func (s *sampler) pick(w []float32, p *SamplingParams, numGenerated int) (int32, float32, error) {
	best := argmax(w)
	if math.IsInf(float64(w[best]), -1) || math.IsNaN(float64(w[best])) {
		return -1, 0, errAllMasked
	}
	if p.Temperature == 0 || p.TopK == 1 {
		return int32(best), float32(float64(w[best]) - logSumExpAt(w, w[best], 1)), nil
	}
	scale := 1 / float64(p.Temperature)
	mx := float64(w[best])
	u := Uniform(p.Seed, numGenerated)
	v := len(w)
	k := p.TopK
	if k <= 0 || k > v {
		k = v
	}
	useP := p.TopP > 0 && p.TopP < 1
	tok := -1
	if k == v && !useP {
		// No cut: draw over the whole row in index order, without sorting.
		var z float64
		for _, l := range w {
			z += expFast((float64(l) - mx) * scale)
		}
		target, cum := u*z, 0.0
		for i, l := range w {
			e := expFast((float64(l) - mx) * scale)
			if e == 0 {
				continue
			}
			cum += e
			tok = i
			if cum > target {
				break
			}
		}
	} else {
		cands, z := s.nucleus(w, k, useP, float64(p.TopP), mx, scale)
		target, cum := u*z, 0.0
		for _, c := range cands {
			e := expFast((float64(c.logit) - mx) * scale)
			if e == 0 {
				continue
			}
			cum += e
			tok = int(c.id)
			if cum > target {
				break
			}
		}
	}
	if tok < 0 {
		tok = best
	}
	return int32(tok), float32(float64(w[tok])*scale - logSumExpAt(w, w[best], scale)), nil
}

// nucleus returns the candidates left by top-k and top-p, best first, and the sum of
// their unnormalised probabilities exp((logit-mx)·scale). Top-p keeps the smallest
// prefix whose share of the top-k mass reaches topP (at least one token).
func (s *sampler) nucleus(w []float32, k int, useP bool, topP, mx, scale float64) ([]candidate, float64) {
	v := len(w)
	var cands []candidate
	var total float64
	if k < v {
		cands = s.top(w, k)
		for _, c := range cands {
			total += expFast((float64(c.logit) - mx) * scale)
		}
	} else {
		// No top-k: the nucleus is usually small, so sort a growing head of the row
		// rather than the whole vocabulary.
		for _, l := range w {
			total += expFast((float64(l) - mx) * scale)
		}
		for n := min(64, v); ; n = min(n*8, v) {
			cands = s.top(w, n)
			var mass float64
			for _, c := range cands {
				mass += expFast((float64(c.logit) - mx) * scale)
			}
			if mass >= topP*total || n == v {
				break
			}
		}
	}
	if !useP {
		return cands, total
	}
	var cum float64
	for i, c := range cands {
		cum += expFast((float64(c.logit) - mx) * scale)
		if cum >= topP*total {
			return cands[:i+1], cum
		}
	}
	return cands, cum
}

// better orders candidates: higher logit first, then lower id, so that ties resolve
// the same way every time.
func better(a, b candidate) bool {
	return a.logit > b.logit || (a.logit == b.logit && a.id < b.id)
}

// top returns the n best tokens of w, best first, in s.cand.
func (s *sampler) top(w []float32, n int) []candidate {
	c := s.cand[:0]
	if n*8 >= len(w) {
		for i, l := range w {
			c = append(c, candidate{int32(i), l})
		}
	} else {
		// A min-heap of the n best so far, worst at the root.
		for i, l := range w {
			x := candidate{int32(i), l}
			if len(c) < n {
				c = append(c, x)
				for j := len(c) - 1; j > 0; {
					parent := (j - 1) / 2
					if !better(c[parent], c[j]) {
						break
					}
					c[parent], c[j] = c[j], c[parent]
					j = parent
				}
				continue
			}
			if !better(x, c[0]) {
				continue
			}
			c[0] = x
			for j := 0; ; {
				worst, l, r := j, 2*j+1, 2*j+2
				if l < n && better(c[worst], c[l]) {
					worst = l
				}
				if r < n && better(c[worst], c[r]) {
					worst = r
				}
				if worst == j {
					break
				}
				c[j], c[worst] = c[worst], c[j]
				j = worst
			}
		}
	}
	slices.SortFunc(c, func(a, b candidate) int {
		if better(a, b) {
			return -1
		}
		if better(b, a) {
			return 1
		}
		return 0
	})
	s.cand = c
	return c[:min(n, len(c))]
}

// argmax returns the index of the first largest value.
func argmax(w []float32) int {
	best := 0
	for i, l := range w {
		if l > w[best] {
			best = i
		}
	}
	return best
}

// logSumExp returns log Σ exp(w[i]·scale), computed in float64 around the maximum.
func logSumExp(w []float32, scale float64) float64 {
	return logSumExpAt(w, w[argmax(w)], scale)
}

// logSumExpAt is logSumExp for a row whose maximum is known to be top.
func logSumExpAt(w []float32, top float32, scale float64) float64 {
	mx := float64(top)
	var z float64
	for _, l := range w {
		z += expFast((float64(l) - mx) * scale)
	}
	return mx*scale + math.Log(z)
}

// mix64 is splitmix64's finaliser: a bijection of uint64 with full avalanche.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Uniform returns the draw in [0, 1) of step n of the random stream seed: a hash of
// the pair, so any step can be drawn without the ones before it. Every engine draws its
// sampling numbers from it, so that they all draw the same.
func Uniform(seed uint64, n int) float64 {
	x := mix64(mix64(seed+0x9e3779b97f4a7c15) ^ (uint64(n)+1)*0xd1b54a32d192ed03)
	return float64(x>>11) / (1 << 53)
}

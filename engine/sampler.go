package engine

import (
	"errors"
	"math"
	"slices"
)

// Sampling turns one row of logits into a token, following the rules of rules.go: bias,
// penalties, masks, then greedy or temperature → top-k → top-p → a draw from Uniform.
// The CPU engine samples with it, and so does the batch manager for the sequences whose
// logits it takes back from any engine (beam search, logits post-processors), so that
// both follow the rules with the same code.

// Sampler holds the buffers sampling reuses between sequences and steps. One goroutine
// uses a Sampler at a time.
type Sampler struct {
	// work holds a logits row [vocab] after bias, penalties and masks.
	work []float32
	// hist counts History's tokens for the penalties.
	hist TokenCounts
	// cand holds top-k / top-p candidates, best first.
	cand []candidate
	// masks holds the tokens the masks forbid at this step.
	masks []int32
	// probs holds a row's distribution (Probs, speculative verification) [vocab].
	probs []float64
}

// candidate is a token with its processed logit.
type candidate struct {
	// id indexes the vocabulary.
	id int32
	// logit is its processed logit.
	logit float32
}

// NewSampler makes a sampler for a vocabulary of vocab tokens.
func NewSampler(vocab int) *Sampler {
	return &Sampler{work: make([]float32, vocab), hist: NewTokenCounts(vocab)}
}

// ErrAllMasked is a sequence's failure when the bias, penalties and masks leave no
// token to choose (engines report it in Output.Err).
var ErrAllMasked = errors.New("every token is masked (bad words, min length, bias and the guided decoding constraint leave no choice)")

// Sample chooses a token from the raw logits row of sq's last position. It returns the
// token, its log-probability, and a copy of the biased logits when sq.ReturnLogits is
// set. raw is not modified.
func (s *Sampler) Sample(raw []float32, sq *Sequence) (int32, float32, []float32, error) {
	p := &sq.Sampling
	w := s.work[:len(raw)]
	copy(w, raw)
	AddBias(w, p.EmbeddingBias)
	var logits []float32
	if sq.ReturnLogits {
		logits = slices.Clone(w)
	}
	if tok, ok := OnlyAllowed(sq.Allowed); ok {
		// A forced continuation: no draw, unless another mask forbids it.
		s.masks = AppendMasks(s.masks[:0], sq)
		if !slices.Contains(s.masks, tok) && !math.IsInf(float64(w[tok]), -1) && !math.IsNaN(float64(w[tok])) {
			return tok, 0, logits, nil
		}
	}
	s.Process(w, sq)
	tok, lp, err := s.Pick(w, p, sq.NumGenerated)
	return tok, lp, logits, err
}

// Process applies, in place, what follows the bias in the rules to a row of biased
// logits: the penalties over sq.History, then the masks (min length, bad words, the
// guided decoding mask Allowed).
func (s *Sampler) Process(w []float32, sq *Sequence) {
	s.applyPenalties(w, &sq.Sampling, sq.History)
	s.masks = AppendMasks(s.masks[:0], sq)
	for _, t := range s.masks {
		w[t] = float32(math.Inf(-1))
	}
	ApplyAllowed(w, sq.Allowed)
}

// AddBias adds bias to w when bias is set (len(bias) is len(w) or 0).
func AddBias(w, bias []float32) {
	if len(bias) == 0 {
		return
	}
	bias = bias[:len(w)]
	for i := range w {
		w[i] += bias[i]
	}
}

// LogSoftmax writes log softmax(w·scale) into dst (len(w)), computed in float64 around
// the maximum; -Inf logits stay -Inf. It returns false when every entry is -Inf or NaN
// (nothing to choose).
func LogSoftmax(dst, w []float32, scale float64) bool {
	best := argmax(w)
	if math.IsInf(float64(w[best]), -1) || math.IsNaN(float64(w[best])) {
		return false
	}
	lse := logSumExpAt(w, w[best], scale)
	for i, l := range w {
		dst[i] = float32(float64(l)*scale - lse)
	}
	return true
}

// applyPenalties applies the repetition penalty (divide a positive logit, multiply a
// negative one), then the presence penalty (once per distinct token) and the frequency
// penalty (once per occurrence) to every token of hist.
func (s *Sampler) applyPenalties(w []float32, p *SamplingParams, hist []int32) {
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

// Pick chooses the token from the processed logits w (after Process). Greedy takes the first maximum
// and reports its log-softmax at temperature 1; otherwise the logits are divided by the
// temperature, cut to the top k, cut to the nucleus of mass top_p, cut to the tokens at
// least min_p times as likely as the first, and one token is drawn; its log-probability is the log-softmax of the whole temperature-scaled row.
func (s *Sampler) Pick(w []float32, p *SamplingParams, numGenerated int) (int32, float32, error) {
	best := argmax(w)
	if math.IsInf(float64(w[best]), -1) || math.IsNaN(float64(w[best])) {
		return -1, 0, ErrAllMasked
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
	if k == v && !useP && p.MinP <= 0 {
		// No cut: draw over the whole row in index order, without sorting.
		var z float64
		for _, l := range w {
			z += ExpFast((float64(l) - mx) * scale)
		}
		target, cum := u*z, 0.0
		for i, l := range w {
			e := ExpFast((float64(l) - mx) * scale)
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
		var cands []candidate
		var z float64
		if k < v || useP {
			cands, z = s.nucleus(w, k, useP, float64(p.TopP), mx, scale)
		}
		if p.MinP > 0 {
			// Min-p keeps a prefix of the sorted order too: the tokens at or above the
			// threshold, computed in float32 as the GPU does.
			thr := float32(mx) + float32(math.Log(float64(p.MinP)))/float32(scale)
			if k < v || useP {
				n := 0
				for n < len(cands) && cands[n].logit >= thr {
					n++
				}
				cands = cands[:n]
			} else {
				cands = s.above(w, thr)
			}
			z = 0
			for _, c := range cands {
				z += ExpFast((float64(c.logit) - mx) * scale)
			}
		}
		target, cum := u*z, 0.0
		for _, c := range cands {
			e := ExpFast((float64(c.logit) - mx) * scale)
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
func (s *Sampler) nucleus(w []float32, k int, useP bool, topP, mx, scale float64) ([]candidate, float64) {
	v := len(w)
	var cands []candidate
	var total float64
	if k < v {
		cands = s.top(w, k)
		for _, c := range cands {
			total += ExpFast((float64(c.logit) - mx) * scale)
		}
	} else {
		// No top-k: the nucleus is usually small, so sort a growing head of the row
		// rather than the whole vocabulary.
		for _, l := range w {
			total += ExpFast((float64(l) - mx) * scale)
		}
		for n := min(64, v); ; n = min(n*8, v) {
			cands = s.top(w, n)
			var mass float64
			for _, c := range cands {
				mass += ExpFast((float64(c.logit) - mx) * scale)
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
		cum += ExpFast((float64(c.logit) - mx) * scale)
		if cum >= topP*total {
			return cands[:i+1], cum
		}
	}
	return cands, cum
}

// above returns the tokens of w with a logit of at least thr, best first, in s.cand.
func (s *Sampler) above(w []float32, thr float32) []candidate {
	c := s.cand[:0]
	for i, l := range w {
		if l >= thr {
			c = append(c, candidate{int32(i), l})
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
	return c
}

// better orders candidates: higher logit first, then lower id, so that ties resolve
// the same way every time.
func better(a, b candidate) bool {
	return a.logit > b.logit || (a.logit == b.logit && a.id < b.id)
}

// top returns the n best tokens of w, best first, in s.cand.
func (s *Sampler) top(w []float32, n int) []candidate {
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
		z += ExpFast((float64(l) - mx) * scale)
	}
	return mx*scale + math.Log(z)
}

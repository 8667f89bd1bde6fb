package engine

import (
	"fmt"
	"math"
	"slices"
)

// Speculative verification. A sequence with Sequence.Draft carries k proposed tokens
// after its last real one; the engine computes the logits of all k+1 positions in one
// step and Verify turns them into the step's new tokens, row by row, each row under the
// rules of rules.go with the history and generation count it would have had one token
// at a time:
//
//   - A proposal without a distribution (prompt lookup, a greedy draft) counts as
//     certain. Row i samples its token as decoding without speculation would, from
//     Uniform(Seed, NumGenerated+i); the proposal is kept when that token is the
//     proposal, and otherwise the sampled token ends the step. This is speculative
//     sampling's rule for a point-mass proposal (kept with probability p(d), else a
//     draw from p without d), and the tokens are exactly those without speculation, for
//     greedy and sampled sequences alike.
//   - A proposal d drawn from a distribution q (DraftProbs) is kept when u·q(d) < p(d),
//     u = Uniform(Seed, NumGenerated+i); otherwise the step ends with a draw from the
//     residual max(0, p-q), normalised, using (u - p(d)/q(d)) / (1 - p(d)/q(d)) — given a
//     rejection, u is uniform above p(d)/q(d), so this is a fresh uniform and one number
//     per position is drawn, as without speculation. Every token then has the target's
//     distribution p (Leviathan et al. 2023, Chen et al. 2023), where q may differ
//     from p as it likes.
//   - After k kept proposals, row k samples one more token, as without speculation.
//
// p is the distribution Pick draws from: the processed logits at the temperature, cut to
// the top k and the nucleus. A log-probability is reported as Pick reports it, from the
// whole temperature-scaled row, whichever way the token was chosen.

// Verify fills out for sq (Draft > 0) from rows, the raw logits of its last Draft+1
// positions in order: Tokens and LogProbs, Token and LogProb (their first), and with
// ReturnLogits one biased row per token. rows are not modified. When the rules leave no
// token at a row after the first, the tokens end before it (the kept proposals, the
// last of them then not a sampled token); at the first row the error (ErrAllMasked) is
// returned, as Sample returns it.
func (s *Sampler) Verify(rows [][]float32, sq *Sequence, out *Output) error {
	k := sq.Draft
	if k <= 0 || k >= len(sq.Tokens) || len(rows) != k+1 || len(sq.History) < k {
		return fmt.Errorf("verify: %d rows for %d proposals among %d new tokens", len(rows), k, len(sq.Tokens))
	}
	p := &sq.Sampling
	drafts := sq.Tokens[len(sq.Tokens)-k:]
	V := len(rows[0])
	certain := sq.DraftProbs == nil || p.Temperature == 0 || p.TopK == 1
	row := *sq
	out.Tokens = make([]int32, 0, k+1)
	out.LogProbs = make([]float32, 0, k+1)
	out.Logits = nil
	if sq.ReturnLogits {
		out.Logits = make([]float32, 0, (k+1)*V)
	}
	for i := 0; i <= k; i++ {
		row.History = sq.History[:len(sq.History)-k+i]
		row.NumGenerated = sq.NumGenerated + i
		w := s.work[:V]
		copy(w, rows[i])
		AddBias(w, p.EmbeddingBias)
		if sq.ReturnLogits {
			out.Logits = append(out.Logits, w...)
		}
		s.Process(w, &row)
		var tok int32
		var lp float32
		var err error
		kept := false
		if i == k || certain {
			tok, lp, err = s.Pick(w, p, row.NumGenerated)
			kept = i < k && tok == drafts[i]
		} else {
			tok, lp, kept, err = s.speculate(w, p, row.NumGenerated, drafts[i], sq.DraftProbs[i*V:(i+1)*V])
		}
		if err != nil {
			if i > 0 {
				// Every token is masked at this row: the kept proposals before it stand, and
				// the next step meets the failure at this position, as one token at a time
				// would.
				break
			}
			return err
		}
		out.Tokens = append(out.Tokens, tok)
		out.LogProbs = append(out.LogProbs, lp)
		if !kept {
			break
		}
	}
	out.Token, out.LogProb = out.Tokens[0], out.LogProbs[0]
	return nil
}

// speculate decides one proposal d drawn from q against the processed logits w: kept
// with probability min(1, p(d)/q(d)), else replaced by a draw from the residual.
func (s *Sampler) speculate(w []float32, p *SamplingParams, n int, d int32, q []float32) (int32, float32, bool, error) {
	probs, err := s.Probs(w, p)
	if err != nil {
		return -1, 0, false, err
	}
	u := Uniform(p.Seed, n)
	pd, qd := probs[d], float64(q[d])
	if qd <= 0 {
		// The proposer claims it could not have drawn d: judge it as a certain proposal.
		tok, lp, err := s.Pick(w, p, n)
		return tok, lp, tok == d, err
	}
	r := pd / qd
	if u < r {
		return d, s.logProb(w, p, d), true, nil
	}
	u = (u - r) / (1 - r)
	var z float64
	for x, px := range probs {
		z += max(0, px-float64(q[x]))
	}
	tok := int32(-1)
	if z > 0 {
		target, cum := u*z, 0.0
		for x, px := range probs {
			e := max(0, px-float64(q[x]))
			if e == 0 {
				continue
			}
			cum += e
			tok = int32(x)
			if cum > target {
				break
			}
		}
	}
	if tok < 0 {
		// p and q agree to rounding: the residual is empty, and p itself is the answer.
		tok = SampleProbs64(probs, u)
	}
	return tok, s.logProb(w, p, tok), false, nil
}

// logProb is the log-probability Pick reports for tok: the log-softmax of the whole
// row at the temperature (at 1 for greedy).
func (s *Sampler) logProb(w []float32, p *SamplingParams, tok int32) float32 {
	scale := 1.0
	if p.Temperature != 0 && p.TopK != 1 {
		scale = 1 / float64(p.Temperature)
	}
	best := argmax(w)
	return float32(float64(w[tok])*scale - logSumExpAt(w, w[best], scale))
}

// Probs returns the distribution Pick draws from for the processed logits w (after
// Process): a point mass at the first maximum for greedy settings, else the
// temperature-scaled softmax over what top-k and top-p keep, zero elsewhere. The slice
// is the sampler's own, valid until its next use.
func (s *Sampler) Probs(w []float32, p *SamplingParams) ([]float64, error) {
	if cap(s.probs) < len(w) {
		s.probs = make([]float64, len(w))
	}
	dst := s.probs[:len(w)]
	clear(dst)
	best := argmax(w)
	if math.IsInf(float64(w[best]), -1) || math.IsNaN(float64(w[best])) {
		return nil, ErrAllMasked
	}
	if p.Temperature == 0 || p.TopK == 1 {
		dst[best] = 1
		return dst, nil
	}
	scale := 1 / float64(p.Temperature)
	mx := float64(w[best])
	v := len(w)
	k := p.TopK
	if k <= 0 || k > v {
		k = v
	}
	useP := p.TopP > 0 && p.TopP < 1
	if k == v && !useP {
		var z float64
		for i, l := range w {
			e := ExpFast((float64(l) - mx) * scale)
			dst[i] = e
			z += e
		}
		for i := range dst {
			dst[i] /= z
		}
		return dst, nil
	}
	cands, z := s.nucleus(w, k, useP, float64(p.TopP), mx, scale)
	for _, c := range cands {
		dst[c.id] = ExpFast((float64(c.logit)-mx)*scale) / z
	}
	return dst, nil
}

// SampleProbs draws a token from the distribution q (summing to 1, to rounding) with the
// uniform u: the first token whose cumulative probability, in index order, passes u.
// Proposers draw their proposals with it.
func SampleProbs(q []float32, u float64) int32 {
	var z float64
	for _, x := range q {
		z += float64(x)
	}
	target, cum, tok := u*z, 0.0, int32(-1)
	for i, x := range q {
		if x <= 0 {
			continue
		}
		cum += float64(x)
		tok = int32(i)
		if cum > target {
			break
		}
	}
	if tok < 0 {
		return int32(slices.Index(q, slices.Max(q)))
	}
	return tok
}

// SampleProbs64 is SampleProbs for a float64 distribution.
func SampleProbs64(q []float64, u float64) int32 {
	var z float64
	for _, x := range q {
		z += x
	}
	target, cum, tok := u*z, 0.0, int32(-1)
	for i, x := range q {
		if x <= 0 {
			continue
		}
		cum += x
		tok = int32(i)
		if cum > target {
			break
		}
	}
	if tok < 0 {
		return int32(slices.Index(q, slices.Max(q)))
	}
	return tok
}

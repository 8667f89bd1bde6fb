package engine

import (
	"fmt"
	"math"
	mathbits "math/bits"
	"slices"
)

// The sampling rules every engine follows. A sequence's logits pass through, in order:
// the embedding bias; the repetition, presence and frequency penalties over its
// History; the masks (every end token while fewer than MinLength tokens have been
// generated, the last token of each bad word whose other tokens end the history, and
// every token outside Allowed — guided decoding's mask, which the batch manager makes
// from the request's constraint); then either greedy choice (Temperature 0 or TopK 1)
// or temperature → top-k → top-p → min-p → a draw. When Allowed holds one token that the
// other masks leave, that token is taken without a draw (a forced continuation), with
// log-probability 0. The draw reads Uniform(Seed, NumGenerated), a counter-based random stream, so
// a sequence's tokens depend only on its own parameters and history, never on the rest
// of the batch. The CPU engine implements the rules in Go (engine/cpu), the GPU engine
// in CUDA, with the masks decided here for both.

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
	case !(p.MinP >= 0 && p.MinP <= 1):
		return fmt.Errorf("min_p %g must be in [0, 1]", p.MinP)
	case !finite(p.RepetitionPenalty) || p.RepetitionPenalty < 0:
		return fmt.Errorf("repetition_penalty %g must be finite and ≥ 0", p.RepetitionPenalty)
	case !finite(p.PresencePenalty):
		return fmt.Errorf("presence_penalty %g must be finite", p.PresencePenalty)
	case !finite(p.FrequencyPenalty):
		return fmt.Errorf("frequency_penalty %g must be finite", p.FrequencyPenalty)
	case p.MinLength < 0:
		return fmt.Errorf("min_length %d must be ≥ 0", p.MinLength)
	case len(p.EmbeddingBias) != 0 && len(p.EmbeddingBias) != v:
		return fmt.Errorf("embedding_bias has %d values, want the vocabulary size %d", len(p.EmbeddingBias), v)
	}
	for _, id := range p.EndIDs {
		if id < 0 || int(id) >= v {
			return fmt.Errorf("end_id %d must be in [0, %d)", id, v)
		}
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
	return p.checkChoice(v)
}

// checkChoice refuses settings that can be seen at admission to leave no token to
// choose at some step: the tokens an embedding bias of -Inf and the one-token bad words
// forbid at every step cover the vocabulary, or leave only the end tokens, which
// min_length forbids at the first step. What depends on the history (bad words of
// several tokens, penalties) shows only when sampling: that sequence then fails alone
// (Output.Err).
func (p *SamplingParams) checkChoice(v int) error {
	if len(p.EmbeddingBias) == 0 && len(p.BadWords) == 0 {
		return nil
	}
	banned := make([]uint64, (v+63)/64)
	n := 0
	ban := func(t int) {
		if banned[t/64]&(1<<(t%64)) == 0 {
			banned[t/64] |= 1 << (t % 64)
			n++
		}
	}
	for i, b := range p.EmbeddingBias {
		if math.IsInf(float64(b), -1) {
			ban(i)
		}
	}
	byBias := n
	for _, word := range p.BadWords {
		if len(word) == 1 {
			ban(int(word[0]))
		}
	}
	switch {
	case byBias == v:
		return fmt.Errorf("embedding_bias is -Inf for every one of the %d tokens: no token can be chosen", v)
	case n == v:
		return fmt.Errorf("embedding_bias (-Inf for %d tokens) and the one-token bad_words forbid all %d tokens of the vocabulary: no token can be chosen", byBias, v)
	}
	if p.MinLength > 0 && len(p.EndIDs) > 0 {
		for _, id := range p.EndIDs {
			ban(int(id))
		}
		if n == v {
			return fmt.Errorf("min_length %d forbids the end tokens %v at first, and embedding_bias and bad_words forbid every other token: no first token can be chosen", p.MinLength, p.EndIDs)
		}
	}
	return nil
}

// AppendMasks appends the tokens the masks forbid at sq's next token: the end tokens
// while fewer than MinLength tokens have been generated, and the last token of every bad
// word whose other tokens end the history (a one-token bad word always).
func AppendMasks(dst []int32, sq *Sequence) []int32 {
	p := &sq.Sampling
	if sq.NumGenerated < p.MinLength {
		dst = append(dst, p.EndIDs...)
	}
	for _, word := range p.BadWords {
		prefix := word[:len(word)-1]
		if len(sq.History) >= len(prefix) && slices.Equal(sq.History[len(sq.History)-len(prefix):], prefix) {
			dst = append(dst, word[len(word)-1])
		}
	}
	return dst
}

// ApplyAllowed sets every logit of w outside the mask allowed to -Inf.
func ApplyAllowed(w []float32, allowed []uint64) {
	if allowed == nil {
		return
	}
	ninf := float32(math.Inf(-1))
	for wi, bits := range allowed {
		base := wi * 64
		if base >= len(w) {
			return
		}
		if bits == ^uint64(0) {
			continue
		}
		end := min(base+64, len(w))
		for i := base; i < end; i++ {
			if bits&(1<<uint(i-base)) == 0 {
				w[i] = ninf
			}
		}
	}
}

// OnlyAllowed returns the one token of a mask that allows exactly one, and whether it
// does.
func OnlyAllowed(allowed []uint64) (int32, bool) {
	tok := int32(-1)
	for wi, bits := range allowed {
		if bits == 0 {
			continue
		}
		if tok >= 0 || bits&(bits-1) != 0 {
			return -1, false
		}
		tok = int32(wi*64 + mathbits.TrailingZeros64(bits))
	}
	return tok, tok >= 0
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

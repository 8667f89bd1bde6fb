package engine

// TokenCounts counts the tokens of a history without a map: a per-vocabulary array kept
// at zero between uses, and the distinct tokens in the order they first occur. The CPU
// sampler's penalties and the GPU bridge (which hands the pairs to the GPU) both use it.
type TokenCounts struct {
	// counts holds each token's occurrences during Each [vocab]; zero between calls.
	counts []int32
	// seen lists the distinct tokens counted, to visit and reset them.
	seen []int32
}

// NewTokenCounts makes counts for a vocabulary of vocab tokens.
func NewTokenCounts(vocab int) TokenCounts {
	return TokenCounts{counts: make([]int32, vocab)}
}

// Each calls f with every distinct token of hist, in the order of first occurrence, and
// its number of occurrences. Every token of hist must be in [0, vocab).
func (c *TokenCounts) Each(hist []int32, f func(tok, n int32)) {
	c.seen = c.seen[:0]
	for _, t := range hist {
		if c.counts[t] == 0 {
			c.seen = append(c.seen, t)
		}
		c.counts[t]++
	}
	for _, t := range c.seen {
		f(t, c.counts[t])
		c.counts[t] = 0
	}
}

package speculate

import (
	"fmt"
	"slices"
)

// NGram is prompt lookup (n-gram) speculation: it proposes the tokens that followed the
// latest earlier occurrence of the sequence's last n tokens, prompt and output alike,
// for n from MaxN down to MinN, the longest match first. It needs no model and keeps no
// state; it pays off where the output copies from the prompt or repeats itself
// (summaries, edits, code, extraction). Its proposals count as certain, so the tokens
// are those of decoding without speculation.
type NGram struct {
	// MinN and MaxN bound the length of the suffix matched.
	MinN, MaxN int
}

// NewNGram checks the match lengths (1 ≤ minN ≤ maxN ≤ 64).
func NewNGram(minN, maxN int) (*NGram, error) {
	if minN < 1 || maxN < minN || maxN > 64 {
		return nil, fmt.Errorf("prompt lookup: n-gram sizes %d to %d: want 1 ≤ min ≤ max ≤ 64", minN, maxN)
	}
	return &NGram{MinN: minN, MaxN: maxN}, nil
}

// Propose fills each request with its lookup.
func (g *NGram) Propose(reqs []*Request) error {
	for _, r := range reqs {
		r.Draft = g.lookup(r.Draft[:0], r.Tokens, r.Max, r.EndIDs)
		r.Probs = r.Probs[:0]
	}
	return nil
}

// lookup appends to dst up to max tokens that followed the latest earlier occurrence of
// toks' longest matching suffix, stopping after an end token.
func (g *NGram) lookup(dst, toks []int32, max int, ends []int32) []int32 {
	L := len(toks)
	for n := min(g.MaxN, L-1); n >= g.MinN; n-- {
		suffix := toks[L-n:]
		// The latest start j < L-n with toks[j:j+n] == suffix; what followed it is
		// toks[j+n:], which may run into the suffix itself.
		for j := L - n - 1; j >= 0; j-- {
			if toks[j] != suffix[0] || !slices.Equal(toks[j:j+n], suffix) {
				continue
			}
			for _, t := range toks[j+n : min(L, j+n+max)] {
				dst = append(dst, t)
				if slices.Contains(ends, t) {
					break
				}
			}
			return dst
		}
	}
	return dst
}

// Forget does nothing: prompt lookup keeps no state.
func (g *NGram) Forget(uint64) {}

// Reset does nothing.
func (g *NGram) Reset() {}

// Close does nothing.
func (g *NGram) Close() error { return nil }

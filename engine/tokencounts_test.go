package engine

import (
	"slices"
	"testing"
)

func TestTokenCountsVisitsDistinctTokensInFirstOrder(t *testing.T) {
	c := NewTokenCounts(10)
	hist := []int32{7, 2, 7, 9, 2, 7, 0}
	for pass := range 2 { // the second pass shows the counts were reset
		var toks, ns []int32
		c.Each(hist, func(tok, n int32) {
			toks = append(toks, tok)
			ns = append(ns, n)
		})
		if !slices.Equal(toks, []int32{7, 2, 9, 0}) || !slices.Equal(ns, []int32{3, 2, 1, 1}) {
			t.Fatalf("pass %d: tokens %v counts %v, want [7 2 9 0] [3 2 1 1]", pass, toks, ns)
		}
	}
	c.Each(nil, func(tok, n int32) { t.Fatalf("empty history visited %d", tok) })
}

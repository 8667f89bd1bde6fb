package speculate

import (
	"slices"
	"strings"
	"testing"
)

// TestNGramProposesWhatFollowedTheLatestMatch: prompt lookup proposes what followed the
// latest earlier occurrence of the longest matching suffix, up to Max tokens and
// through an end token at most, and nothing without a match.
func TestNGramProposesWhatFollowedTheLatestMatch(t *testing.T) {
	g, err := NewNGram(2, 3)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		toks []int32
		max  int
		ends []int32
		want []int32
	}{
		{"the longest suffix wins", []int32{1, 2, 3, 9, 9, 5, 2, 3, 7, 1, 2, 3}, 3, nil, []int32{9, 9, 5}},
		{"the latest occurrence wins", []int32{2, 3, 4, 4, 2, 3, 5, 6, 8, 2, 3}, 2, nil, []int32{5, 6}},
		{"a shorter suffix when the longer has no match", []int32{7, 2, 3, 4, 1, 8, 2, 3}, 4, nil, []int32{4, 1, 8, 2}},
		{"the match may run into the suffix", []int32{6, 5, 5, 5, 5}, 3, nil, []int32{5}},
		{"what follows is cut at the sequence end", []int32{1, 2, 7, 1, 2}, 5, nil, []int32{7, 1, 2}},
		{"up to Max", []int32{1, 2, 3, 4, 5, 6, 1, 2}, 2, nil, []int32{3, 4}},
		{"through an end token at most", []int32{1, 2, 3, 0, 4, 1, 2}, 5, []int32{0}, []int32{3, 0}},
		{"nothing without a match", []int32{1, 2, 3, 4, 5}, 3, nil, nil},
		{"nothing from one token", []int32{4}, 3, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &Request{Tokens: c.toks, Max: c.max, EndIDs: c.ends, Draft: []int32{99}, Probs: []float32{1}}
			if err := g.Propose([]*Request{r}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(r.Draft, c.want) || len(r.Probs) != 0 {
				t.Fatalf("proposed %v (probs %v), want %v", r.Draft, r.Probs, c.want)
			}
		})
	}
}

// TestNGramSizesAreChecked: bad match lengths are refused with the rule.
func TestNGramSizesAreChecked(t *testing.T) {
	for _, c := range [][2]int{{0, 3}, {3, 2}, {1, 65}} {
		if _, err := NewNGram(c[0], c[1]); err == nil || !strings.Contains(err.Error(), "1 ≤ min ≤ max ≤ 64") {
			t.Errorf("NewNGram(%d, %d): err = %v", c[0], c[1], err)
		}
	}
}

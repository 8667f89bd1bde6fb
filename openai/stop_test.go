package openai

import (
	"strings"
	"testing"
)

// TestStopMatcher feeds text in pieces and checks what comes out: nothing of a stop
// string, even split across pieces; everything else, in order.
func TestStopMatcher(t *testing.T) {
	cases := []struct {
		stops   []string
		pieces  []string
		want    string
		matched bool
	}{
		{nil, []string{"a", "b"}, "ab", false},
		{[]string{"END"}, []string{"hello ", "E", "N", "D", " more"}, "hello ", true},
		{[]string{"END"}, []string{"hello E", "Nd", "!"}, "hello ENd!", false},
		{[]string{"\n\n", "."}, []string{"one\n", "two.", "x"}, "one\ntwo", true},
		{[]string{"ab", "b"}, []string{"xa", "b"}, "x", true},
		{[]string{"ééé"}, []string{"é", "éx"}, "ééx", false},
		{[]string{"xyz"}, []string{"x", "y"}, "xy", false},
	}
	for _, c := range cases {
		m := newStopMatcher(c.stops)
		var sb strings.Builder
		matched := false
		for _, p := range c.pieces {
			out, ok := m.push(p)
			sb.WriteString(out)
			if ok {
				matched = true
				break
			}
		}
		if !matched {
			sb.WriteString(m.flush())
		}
		if sb.String() != c.want || matched != c.matched {
			t.Errorf("stops %q pieces %q: got %q matched %v, want %q %v", c.stops, c.pieces, sb.String(), matched, c.want, c.matched)
		}
		if m.emitted != len(c.want) {
			t.Errorf("stops %q pieces %q: emitted %d, want %d", c.stops, c.pieces, m.emitted, len(c.want))
		}
	}
}

package guide

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

func TestRegexSamplesMatch(t *testing.T) {
	for _, tc := range []struct{ vocab, pattern string }{
		{gpt2Tok, `[a-z]{3,8}@[a-z]+\.(com|org)`},
		{gpt2Tok, `(yes|no|maybe)`},
		{gpt2Tok, `\d{1,4}-\d{2}`},
		{austenTok, `[A-Z][a-z]+( [a-z]+){0,5}\.`},
		{llamaTok, `[0-9a-f]{8}-[0-9a-f]{4}`},
		{llamaTok, `héllo (wörld|мир)!`},
		{gpt2Tok, `.{0,20}`},
	} {
		v, _ := testVocab(t, tc.vocab)
		gr, err := CompileRegex(tc.pattern)
		if err != nil {
			t.Fatalf("%s: %v", tc.pattern, err)
		}
		g, err := gr.Bind(v)
		if err != nil {
			t.Fatal(err)
		}
		re := regexp.MustCompile(`^(?s:` + tc.pattern + `)$`)
		if tc.pattern == `.{0,20}` {
			re = regexp.MustCompile(`^.{0,20}$`)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range 50 {
			out, _, st := sampleText(t, g, rng, 64, 0.3)
			if !st.Accepting() {
				t.Fatalf("%s: sample %d %q ended unfinished", tc.pattern, i, out)
			}
			if !re.Match(out) {
				t.Fatalf("%s: sample %d %q does not match", tc.pattern, i, out)
			}
		}
	}
}

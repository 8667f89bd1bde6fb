package guide

import (
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestMaskKeyNamesEqualMasks walks random texts of a regex, a JSON schema and a grammar
// and checks at every step, under several budgets, that states MaskKey gives one key
// have the same mask and Accepting: what the batch manager shares between sequences.
func TestMaskKeyNamesEqualMasks(t *testing.T) {
	v, _ := testVocab(t, austenTok)
	c := NewCompiler(v, 0)
	for _, tc := range []struct {
		kind Kind
		src  string
	}{
		{KindRegex, `[a-zA-Z ,.;:!?]*`},
		{KindRegex, `(yes|no|maybe)( [0-9]{1,3})?`},
		{KindJSONSchema, schema20},
		{KindEBNF, `root ::= "(" items ")"
items ::= item ("," item)*
item ::= [a-z]+ | root`},
	} {
		g, err := c.Guide(tc.kind, tc.src)
		if err != nil {
			t.Fatal(err)
		}
		type seen struct {
			mask   []uint64
			accept bool
		}
		byKey := map[uint64]seen{}
		rng := rand.New(rand.NewPCG(1, 2))
		mask := make([]uint64, v.MaskWords())
		keyed := 0
		for range 20 {
			st, err := g.Start()
			if err != nil {
				t.Fatal(err)
			}
			for step := 0; step < 60 && !st.Done(); step++ {
				for _, budget := range []int{-1, 1, 3, 200 - step} {
					key, ok, err := st.MaskKey(budget)
					if err != nil {
						t.Fatal(err)
					}
					if !ok {
						continue
					}
					keyed++
					if _, err := st.Mask(mask, budget); err != nil {
						t.Fatal(err)
					}
					if s, ok := byKey[key]; !ok {
						byKey[key] = seen{slices.Clone(mask), st.Accepting()}
					} else if !slices.Equal(s.mask, mask) || s.accept != st.Accepting() {
						t.Fatalf("%s: key %d names two masks (or Accepting %v, %v)", tc.src, key, s.accept, st.Accepting())
					}
				}
				n, err := st.Mask(mask, 200-step)
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
				k := rng.IntN(n)
				tok := int32(-1)
				for i, w := range mask {
					if c := bits.OnesCount64(w); k >= c {
						k -= c
						continue
					}
					for ; k > 0; k-- {
						w &= w - 1
					}
					tok = int32(i*64 + bits.TrailingZeros64(w))
					break
				}
				if st, err = st.Advance(tok); err != nil {
					t.Fatal(err)
				}
			}
		}
		if keyed == 0 {
			t.Errorf("%s: no state had a key", tc.src)
		}
		t.Logf("%s: %d keyed masks, %d keys", tc.src, keyed, len(byKey))
	}
}

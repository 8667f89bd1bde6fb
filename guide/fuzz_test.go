package guide

import (
	"encoding/binary"
	"errors"
	"testing"
)

// fuzzLimits are small enough that a fuzz input is compiled in milliseconds; the
// limits themselves are what is under test, not their size.
var fuzzLimits = Limits{NFAStates: 1 << 14, DFAStates: 1 << 12, Work: 1 << 20, InlineSize: 512}

// runGuide binds g to the austen vocabulary and walks a few tokens chosen by seed
// bytes: every allowed token must advance, the mask must never be empty while the
// text is unfinished (the austen vocabulary has every byte).
func runGuide(t *testing.T, gr *Grammar, seed []byte) {
	v, _ := testVocab(t, austenTok)
	g, err := gr.Bind(v)
	if err != nil {
		if errors.Is(err, ErrTooComplex) {
			return
		}
		t.Fatalf("bind: %v", err)
	}
	g.memLimit = 1 << 20
	st, err := g.Start()
	if err != nil {
		return // too ambiguous at the start: a refusal, not a crash
	}
	mask := make([]uint64, v.MaskWords())
	for i := 0; i < 8 && len(seed) >= 2; i++ {
		pick := int(binary.LittleEndian.Uint16(seed))
		seed = seed[2:]
		n, err := st.Mask(mask, 1+pick%50)
		if err != nil {
			return
		}
		if n == 0 {
			if !st.Accepting() {
				t.Fatalf("no token allowed and the text unfinished")
			}
			return
		}
		k := pick % n
		tok := int32(-1)
		for id := range v.size {
			if mask[id>>6]>>(uint(id)&63)&1 != 0 {
				if k == 0 {
					tok = int32(id)
					break
				}
				k--
			}
		}
		if st, err = st.Advance(tok); err != nil {
			t.Fatalf("an allowed token %d was refused: %v", tok, err)
		}
	}
}

func FuzzCompileJSONSchema(f *testing.F) {
	for _, s := range testSchemas {
		f.Add(s, []byte("\x01\x02\x03\x04\x05\x06"))
	}
	f.Add(`{"type":"object","properties":{"a":{"type":"array","items":{"$ref":"#"}}}}`, []byte("abcdefgh"))
	f.Add(`{"anyOf":[{"type":"integer","minimum":-7,"maximum":12},{"type":"string","maxLength":3}]}`, []byte("zz"))
	f.Fuzz(func(t *testing.T, schema string, seed []byte) {
		if len(schema) > 4096 {
			return
		}
		b := newJSBuilder(DefaultJSONOptions)
		doc, err := b.decodeSchema(schema)
		if err != nil {
			return
		}
		b.doc = doc
		root := b.rule("root")
		e, err := b.value(doc, "", 0)
		if err != nil {
			return
		}
		b.def.bodies[root] = e
		b.def.root = root
		gr, err := newGrammar(b.def, "json_schema", schema, fuzzLimits)
		if err != nil {
			return
		}
		runGuide(t, gr, seed)
	})
}

func FuzzCompileEBNF(f *testing.F) {
	f.Add(testJSONGrammar, []byte("\x00\x01\x02\x03"))
	f.Add(`root ::= "a" root? "b" | [x-z]{2,3}`, []byte("abcd"))
	f.Add(`root ::= (x | y)* ; x ::= "q" ; y ::= x "r"`, []byte("q"))
	f.Fuzz(func(t *testing.T, src string, seed []byte) {
		if len(src) > 4096 {
			return
		}
		def, err := parseEBNF(src)
		if err != nil {
			return
		}
		gr, err := newGrammar(def, "ebnf_grammar", src, fuzzLimits)
		if err != nil {
			return
		}
		runGuide(t, gr, seed)
	})
}

func FuzzCompileRegex(f *testing.F) {
	for _, p := range []string{`[a-z]{3,8}@[a-z]+\.(com|org)`, `\d{1,4}-\d{2}`, `(?:x|y)+z?`, `[^\x00-\x1f"]*`, `é{2}|\u00e9`} {
		f.Add(p, []byte("\x03\x02\x01"))
	}
	f.Fuzz(func(t *testing.T, pattern string, seed []byte) {
		if len(pattern) > 1024 {
			return
		}
		gr, err := compileRegex(pattern, fuzzLimits)
		if err != nil {
			return
		}
		runGuide(t, gr, seed)
	})
}

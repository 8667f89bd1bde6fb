package guide

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// testJSONGrammar is JSON in GBNF: recursive (value within arrays and objects).
const testJSONGrammar = `
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* )? ws "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n]{0,4}   # bounded
`

func TestEBNFRecursiveJSONSamplesParse(t *testing.T) {
	for _, vp := range []string{gpt2Tok, austenTok, llamaTok} {
		v, _ := testVocab(t, vp)
		gr, err := CompileEBNF(testJSONGrammar)
		if err != nil {
			t.Fatal(err)
		}
		if gr.Regular() {
			t.Fatal("the JSON grammar should keep its recursion")
		}
		g, err := gr.Bind(v)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(3, 4))
		for i := range 40 {
			out, _, st := sampleText(t, g, rng, 40, 0.5)
			if !st.Accepting() {
				t.Fatalf("%s: sample %d %q ended unfinished within its budget", vp, i, out)
			}
			if !json.Valid(out) {
				t.Fatalf("%s: sample %d %q is not JSON", vp, i, out)
			}
		}
	}
}

// TestBudgetEndsAcceptingTexts: with no chance to end early, a sample must still be a
// whole text when its tokens run out (an accepting state with no room for more allows
// nothing but the end).
func TestBudgetEndsAcceptingTexts(t *testing.T) {
	v, _ := testVocab(t, austenTok)
	gr, err := CompileEBNF("root ::= item (\", \" item)*\nitem ::= \"tea\" | \"cake\" | [0-9]+ \" \" (\"cups\" | \"plates\")")
	if err != nil {
		t.Fatal(err)
	}
	g, err := gr.Bind(v)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 200 {
		if out, _, st := sampleText(t, g, rng, 4+i%12, 0); !st.Accepting() {
			t.Fatalf("sample %d: %q unfinished when its tokens ran out", i, out)
		}
	}
}

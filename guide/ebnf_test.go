package guide

import (
	"encoding/json"
	"math/rand/v2"
	"regexp"
	"strings"
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

func TestEBNFEmbedsJSONSchemas(t *testing.T) {
	v, _ := testVocab(t, austenTok)
	src := `root ::= call ("\n" call)*
call ::= "<tool_call>\n" %json {"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object","properties":{"city":{"type":"string","maxLength":8}},"required":["city"]}},"required":["name","arguments"]} "\n</tool_call>"`
	gr, err := CompileEBNF(src)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gr.Bind(v)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(8, 9))
	re := regexp.MustCompile(`(?s)^<tool_call>\n(.*)\n</tool_call>$`)
	for i := range 30 {
		out, _, st := sampleText(t, g, rng, 120, 0.7)
		if !st.Accepting() {
			t.Fatalf("sample %d unfinished: %q", i, out)
		}
		for _, call := range strings.Split(string(out), "\n<tool_call>") {
			if !strings.HasPrefix(call, "<tool_call>") {
				call = "<tool_call>" + call
			}
			if !strings.HasSuffix(call, "</tool_call>") {
				call += "\n</tool_call>"
			}
			m := re.FindStringSubmatch(call)
			if m == nil {
				t.Fatalf("sample %d: %q is not a tool call", i, call)
			}
			var c struct {
				Name      string            `json:"name"`
				Arguments map[string]string `json:"arguments"`
			}
			if err := json.Unmarshal([]byte(m[1]), &c); err != nil || c.Name != "get_weather" || len([]rune(c.Arguments["city"])) > 8 {
				t.Fatalf("sample %d: %q: %v", i, m[1], err)
			}
		}
	}
	if _, err := CompileEBNF(`root ::= %json {"type":`); err == nil {
		t.Fatal("a broken %json schema compiled")
	}
}

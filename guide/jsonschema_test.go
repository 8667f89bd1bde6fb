package guide

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// testSchemas are schemas the sampling test draws texts from.
var testSchemas = []string{
	`{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":120},
	  "tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3},"ok":{"type":"boolean"},
	  "score":{"type":"number","minimum":-5,"exclusiveMaximum":10},"child":{"$ref":"#"}},"required":["name","age","tags"]}`,
	`{"type":"array","prefixItems":[{"type":"integer","exclusiveMinimum":-3,"maximum":1000000},{"const":{"k":[1,"x"]}}],"items":{"type":"null"},"minItems":2,"maxItems":4}`,
	`{"anyOf":[{"type":"string","pattern":"^[a-z]{2,4}-[0-9]+$"},{"type":"number","minimum":0,"maximum":1}]}`,
	`{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"}`,
	`{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"when":{"type":"string","format":"date-time"},"s":{"type":"string","minLength":2,"maxLength":3}},"required":["id","when","s"],"additionalProperties":false}`,
	`{"type":"object","additionalProperties":{"type":"integer","minimum":5,"maximum":7}}`,
	`{"type":["string","null"],"enum":["x",null,3]}`,
}

func TestJSONSchemaSamplesValidate(t *testing.T) {
	for _, vp := range []string{gpt2Tok, llamaTok, austenTok} {
		v, _ := testVocab(t, vp)
		for si, schema := range testSchemas {
			gr, err := CompileJSONSchema(schema, DefaultJSONOptions)
			if err != nil {
				t.Fatalf("schema %d: %v", si, err)
			}
			g, err := gr.Bind(v)
			if err != nil {
				t.Fatal(err)
			}
			var doc any
			dec := json.NewDecoder(strings.NewReader(schema))
			dec.UseNumber()
			if err := dec.Decode(&doc); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(si), 9))
			for i := range 25 {
				// The budget is the grammar's shortest text plus a little: the mask
				// must still finish every sample.
				st0, _ := g.Start()
				budget := st0.Rest() + rng.IntN(60)
				out, _, st := sampleText(t, g, rng, budget, 0.5)
				if !st.Accepting() {
					t.Fatalf("%s schema %d sample %d: unfinished within %d tokens: %s", vp, si, i, budget, out)
				}
				dec := json.NewDecoder(bytes.NewReader(out))
				dec.UseNumber()
				var val any
				if err := dec.Decode(&val); err != nil {
					t.Fatalf("%s schema %d sample %d: not JSON: %v: %s", vp, si, i, err, out)
				}
				if err := validate(doc, doc, val); err != nil {
					t.Fatalf("%s schema %d sample %d: %v: %s", vp, si, i, err, out)
				}
			}
		}
	}
}

func TestJSONSchemaRefusals(t *testing.T) {
	for _, tc := range []struct{ schema, want string }{
		{`{"type":"array","uniqueItems":true}`, `"uniqueItems"`},
		{`{"type":"number","multipleOf":3}`, `"multipleOf"`},
		{`{"type":"object","patternProperties":{"a":{}}}`, `"patternProperties"`},
		{`{"not":{"type":"string"}}`, `"not"`},
		{`{"$ref":"http://example.com/s.json"}`, `not local`},
		{`{"$ref":"#/$defs/missing"}`, `not found`},
		{`{"type":"strin"}`, `unknown type "strin"`},
		{`{"type":"string","pattern":"(a)\\1"}`, `backreferences`},
		{`{"type":"number","minimum":0.5}`, `not a whole number`},
		{`{"type":"string","maxLength":100000}`, `maxLength`},
		{`{"type":"string","enum":[1,2]}`, `no JSON value`},
		{`{"type":"object","properties":{"a":false},"required":["a"]}`, `no JSON value`},
		{`false`, `no JSON value`},
		{`{"$ref":"#"}`, `no JSON value`},
		{`{"anyOf":[{"$ref":"#"},{"type":"null"}]}`, `left recursion`},
		{`{"type":`, `not valid JSON`},
		{`[1,2]`, `must be an object or a boolean`},
		{strings.Repeat(`{"items":`, 200) + `{}` + strings.Repeat(`}`, 200), `nests`},
		{`{"type":"string","pattern":"^(a|b)*a(a|b){24}$"}`, `too complex`},
	} {
		t0 := time.Now()
		_, err := CompileJSONSchema(tc.schema, DefaultJSONOptions)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.60s: got %v, want an error containing %q", tc.schema, err, tc.want)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("%.60s: refused after %v", tc.schema, d)
		}
		var se *SchemaError
		if err != nil && !errors.As(err, &se) && !errors.Is(err, ErrTooComplex) && !strings.Contains(err.Error(), "left recursion") {
			t.Errorf("%.60s: %v is not a SchemaError", tc.schema, err)
		}
	}
}

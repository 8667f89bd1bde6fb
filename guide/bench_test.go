package guide

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// schema20 is a typical 20-field schema: the shapes structured-output requests carry
// (strings with and without bounds, enums, integers and numbers with ranges, booleans,
// a date, arrays, a nested object, optional fields).
const schema20 = `{
  "type": "object",
  "properties": {
    "id": {"type": "string", "format": "uuid"},
    "name": {"type": "string", "maxLength": 40},
    "email": {"type": "string", "format": "email"},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "height_cm": {"type": "number", "minimum": 30, "maximum": 300},
    "active": {"type": "boolean"},
    "role": {"type": "string", "enum": ["admin", "editor", "viewer", "guest"]},
    "country": {"type": "string", "minLength": 2, "maxLength": 2},
    "city": {"type": "string"},
    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
    "joined": {"type": "string", "format": "date"},
    "score": {"type": "number"},
    "rank": {"type": "integer", "minimum": 1},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 8},
    "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}},
    "address": {"type": "object", "properties": {
        "street": {"type": "string"}, "number": {"type": "integer"}, "unit": {"type": ["string", "null"]}},
      "required": ["street", "number"]},
    "notes": {"type": ["string", "null"]},
    "level": {"type": "string", "enum": ["low", "medium", "high"]},
    "verified": {"type": "boolean"},
    "nickname": {"type": "string", "maxLength": 20}
  },
  "required": ["id", "name", "email", "age", "active", "role", "country", "city", "joined", "tags", "address", "level"]
}`

// BenchmarkCompileSchema20 compiles schema20 into its automaton (no cache).
func BenchmarkCompileSchema20(b *testing.B) {
	for b.Loop() {
		if _, err := CompileJSONSchema(schema20, DefaultJSONOptions); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCompileSchema20Tables compiles schema20 and makes every state's token
// table for GPT-2's vocabulary: the whole cost a new schema can have.
func BenchmarkCompileSchema20Tables(b *testing.B) {
	v, _ := testVocab(b, gpt2Tok)
	for b.Loop() {
		gr, err := CompileJSONSchema(schema20, DefaultJSONOptions)
		if err != nil {
			b.Fatal(err)
		}
		g, err := gr.Bind(v)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Precompute(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCompilerCacheHit is a request whose schema was compiled before.
func BenchmarkCompilerCacheHit(b *testing.B) {
	v, _ := testVocab(b, gpt2Tok)
	c := NewCompiler(v, 0)
	if _, err := c.Guide(KindJSONSchema, schema20); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := c.Guide(KindJSONSchema, schema20); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMask is one mask of a sequence partway through schema20 (its tables made),
// for GPT-2's vocabulary, and of one inside json_object's recursion.
func BenchmarkMask(b *testing.B) {
	v, _ := testVocab(b, gpt2Tok)
	for _, tc := range []struct{ name, kind, text, prefix string }{
		{"schema20/in-string", string(KindJSONSchema), schema20, `{"id":"0a1b2c3d-0000-4000-8000-000000000000","name":"Ann`},
		{"schema20/after-key", string(KindJSONSchema), schema20, `{"id":"0a1b2c3d-0000-4000-8000-000000000000","name":"Ann","email":`},
		{"json_object/nested-number", string(KindJSONObject), "", `{"a":[{"b":12`},
		{"json_object/nested-string", string(KindJSONObject), "", `{"a":[{"b":"xy`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			g, err := NewCompiler(v, 0).Guide(Kind(tc.kind), tc.text)
			if err != nil {
				b.Fatal(err)
			}
			st, err := g.Start()
			if err != nil {
				b.Fatal(err)
			}
			for _, c := range []byte(tc.prefix) {
				tok := int32(-1)
				for id, bs := range v.bytes {
					if len(bs) == 1 && bs[0] == c {
						tok = int32(id)
						break
					}
				}
				if st, err = st.Advance(tok); err != nil {
					b.Fatal(err)
				}
			}
			mask := make([]uint64, v.MaskWords())
			if _, err := st.Mask(mask, 1000); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := st.Mask(mask, 1000); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestSchema20Compiles(t *testing.T) {
	t0 := time.Now()
	gr, err := CompileJSONSchema(schema20, DefaultJSONOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("schema20: %d states, regular %v, compiled in %v", gr.States(), gr.Regular(), time.Since(t0))
}

// BenchmarkMaskBatch64 is one step's masks for 64 sequences at random places in
// schema20 (GPT-2's vocabulary), spread over the cores as the batch manager spreads
// them (batchmanager/guide.go): the host's share of a guided step at batch 64, with
// 1000 tokens left (a budget that does not bind; one below the schema's shortest
// text, at one byte a token, walks the trie for every mask).
func BenchmarkMaskBatch64(b *testing.B) {
	v, _ := testVocab(b, gpt2Tok)
	g, err := NewCompiler(v, 0).Guide(KindJSONSchema, schema20)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Precompute(); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(64, 64))
	states := make([]State, 64)
	for i := range states {
		_, _, st := sampleText(b, g, rng, rng.IntN(40), 0)
		states[i] = st
	}
	masks := make([][]uint64, 64)
	for i := range masks {
		masks[i] = make([]uint64, v.MaskWords())
	}
	workers := min(runtime.GOMAXPROCS(0), 16)
	for b.Loop() {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for k := next.Add(1) - 1; k < 64; k = next.Add(1) - 1 {
					if _, err := states[k].Mask(masks[k], 1000); err != nil {
						panic(err)
					}
				}
			})
		}
		wg.Wait()
	}
}

// BenchmarkMaskBatch64TightBudget is BenchmarkMaskBatch64 with 100 tokens left, below
// schema20's shortest text at one byte a token: every mask allows the tokens that leave
// the least to finish.
func BenchmarkMaskBatch64TightBudget(b *testing.B) {
	v, _ := testVocab(b, gpt2Tok)
	g, err := NewCompiler(v, 0).Guide(KindJSONSchema, schema20)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Precompute(); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(64, 64))
	states := make([]State, 64)
	for i := range states {
		_, _, st := sampleText(b, g, rng, rng.IntN(40), 0)
		states[i] = st
	}
	mask := make([]uint64, v.MaskWords())
	for b.Loop() {
		for k := range states {
			if _, err := states[k].Mask(mask, 100); err != nil {
				b.Fatal(err)
			}
		}
	}
}

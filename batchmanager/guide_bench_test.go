package batchmanager

import (
	"math/bits"
	"os"
	"path/filepath"
	"testing"

	"gollm/engine"
	"gollm/guide"
	"gollm/tokenizer"
)

// guidedEngine is instantEngine for guided rows: each sampled token is an allowed one
// (the first allowed at or after a position-dependent start), so that the constraint
// holds and every request generates all its tokens.
type guidedEngine struct{ instantEngine }

func (e *guidedEngine) Step(b *engine.Batch) ([]engine.Output, error) {
	outs, err := e.instantEngine.Step(b)
	if err != nil {
		return nil, err
	}
	for i := range b.Seqs {
		if s := &b.Seqs[i]; s.Sample && s.Allowed != nil {
			outs[i].Token = firstAllowed(s.Allowed, int(outs[i].Token))
		}
	}
	return outs, nil
}

// firstAllowed is the first token set in mask at or after from, wrapping; -2 if none.
func firstAllowed(mask []uint64, from int) int32 {
	n := len(mask) * 64
	for k := 0; k <= len(mask); k++ {
		w := (from/64 + k) % len(mask)
		x := mask[w]
		if k == 0 {
			x &^= 1<<(uint(from)&63) - 1
		}
		if x != 0 {
			return int32((w*64 + bits.TrailingZeros64(x)) % n)
		}
	}
	return -2
}

// gpt2Guide compiles re over GPT-2's vocabulary (the tokenizer `make demo` writes),
// every table made first; the benchmark skips without it.
func gpt2Guide(b *testing.B, re string) *guide.Guide {
	b.Helper()
	path := filepath.Join("..", "model_repository", "gpt2", "1", "tokenizer.json")
	if _, err := os.Stat(path); err != nil {
		b.Skip("no GPT-2 tokenizer (make demo): ", err)
	}
	tok, err := tokenizer.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	tb, err := tok.TokenBytes()
	if err != nil {
		b.Fatal(err)
	}
	v, err := guide.NewVocab(tb, 50257)
	if err != nil {
		b.Fatal(err)
	}
	g, err := guide.NewCompiler(v, 0).Guide(guide.KindRegex, re)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Precompute(); err != nil {
		b.Fatal(err)
	}
	return g
}

// BenchmarkGuidedIteration is BenchmarkIteration at 64 sequences with every request
// under gpubench's guided constraint over GPT-2's vocabulary, beside the same without:
// the host's share of guided decoding per step.
func BenchmarkGuidedIteration(b *testing.B) {
	g := gpt2Guide(b, `[a-zA-Z ,.;:!?]*`)
	for _, overlap := range []bool{false, true} {
		name := "sync"
		if overlap {
			name = "overlap"
		}
		b.Run(name+"/plain", func(b *testing.B) { schedBenchWith(b, 64, nil, overlap) })
		b.Run(name+"/guided", func(b *testing.B) { schedBenchWith(b, 64, g, overlap) })
	}
}

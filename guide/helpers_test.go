package guide

import (
	"math/bits"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"gollm/tokenizer"
)

// testVocabs caches the vocabularies of the checkpoints the tests read.
var (
	testVocabMu sync.Mutex
	testVocabs  = map[string]*Vocab{}
)

// repoRoot is the project's folder.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// testVocab loads a checkpoint's tokenizer (relative to the repository) as a Vocab.
func testVocab(t testing.TB, rel string) (*Vocab, *tokenizer.Tokenizer) {
	t.Helper()
	path := filepath.Join(repoRoot(), rel)
	tok, err := tokenizer.Load(path)
	if err != nil {
		t.Skipf("tokenizer %s: %v (run `make demo`)", rel, err)
	}
	testVocabMu.Lock()
	defer testVocabMu.Unlock()
	if v := testVocabs[rel]; v != nil {
		return v, tok
	}
	tb, err := tok.TokenBytes()
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVocab(tb, tok.VocabSize())
	if err != nil {
		t.Fatal(err)
	}
	testVocabs[rel] = v
	return v, tok
}

const (
	austenTok = "model_repository/austen/1/tokenizer.json"
	gpt2Tok   = "model_repository/gpt2/1/tokenizer.json"
	llamaTok  = "model_repository/llama/1/tokenizer.json"
)

// sampleText draws tokens uniformly from each mask until the guide is done, ends
// (when accepting, with probability pEnd) or budget tokens are used; it returns the
// bytes and the tokens.
func sampleText(t testing.TB, g *Guide, rng *rand.Rand, budget int, pEnd float64) ([]byte, []int32, State) {
	t.Helper()
	st, err := g.Start()
	if err != nil {
		t.Fatal(err)
	}
	mask := make([]uint64, g.v.MaskWords())
	var out []byte
	var toks []int32
	for left := budget; left > 0; left-- {
		if st.Done() || st.Accepting() && rng.Float64() < pEnd {
			break
		}
		n, err := st.Mask(mask, left)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			if !st.Accepting() {
				t.Fatalf("no token allowed and the text is not complete after %q", out)
			}
			break
		}
		k := rng.IntN(n)
		var tok int32 = -1
		for i, w := range mask {
			c := bits.OnesCount64(w)
			if k < c {
				for ; ; k-- {
					b := bits.TrailingZeros64(w)
					if k == 0 {
						tok = int32(i*64 + b)
						break
					}
					w &= w - 1
				}
				break
			}
			k -= c
		}
		nst, err := st.Advance(tok)
		if err != nil {
			t.Fatalf("a token the mask allowed was refused: %v (text %q)", err, out)
		}
		st = nst
		b := g.v.bytes[tok]
		if len(toks) == 0 && g.v.firstDropsSpace && len(b) > 0 && b[0] == ' ' {
			b = b[1:]
		}
		out = append(out, b...)
		toks = append(toks, tok)
	}
	return out, toks, st
}

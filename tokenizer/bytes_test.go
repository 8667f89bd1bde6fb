package tokenizer

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
)

// TestTokenBytesJoinToTheText: a sequence's tokens' bytes, joined (the first one's
// leading space dropped where the decoder drops it), are the text the decoder gives, for
// the byte-level BPE of the austen and gpt2 demos and the SentencePiece byte fallback of
// the llama demo; special tokens have none.
func TestTokenBytesJoinToTheText(t *testing.T) {
	for _, rel := range []string{"austen", "gpt2", "llama"} {
		path := filepath.Join("..", "model_repository", rel, "1", "tokenizer.json")
		tk, err := Load(path)
		if err != nil {
			t.Skipf("%s: %v (make demo writes it)", path, err)
		}
		tb, err := tk.TokenBytes()
		if err != nil {
			t.Fatal(err)
		}
		if got := tb.FirstDropsSpace; got != (rel == "llama") {
			t.Errorf("%s: FirstDropsSpace %v", rel, got)
		}
		for _, text := range []string{"It is a truth, universally acknowledged.", " Llamas 🦙 hum\n\tand 日本語 sing", "{\"a\": [1, 2]}"} {
			ids := tk.Encode(text)
			var joined []byte
			for i, id := range ids {
				b := tb.Bytes[id]
				if i == 0 && tb.FirstDropsSpace {
					b = bytes.TrimPrefix(b, []byte(" "))
				}
				joined = append(joined, b...)
			}
			if want := tk.Decode(ids); string(joined) != want {
				t.Errorf("%s %q: joined bytes %q, decoded %q", rel, text, joined, want)
			}
		}
		for id := range tb.Bytes {
			if tk.IsSpecial(int32(id)) && tb.Bytes[id] != nil {
				t.Errorf("%s: special token %d has bytes %q", rel, id, tb.Bytes[id])
			}
		}
	}
}

func TestTokenBytesRefusesTokensJoinedWithSpaces(t *testing.T) {
	tk := &Tokenizer{}
	if _, err := tk.TokenBytes(); !errors.Is(err, ErrNoTokenBytes) {
		t.Fatalf("got %v, want ErrNoTokenBytes", err)
	}
}

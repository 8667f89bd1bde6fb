package tokenizer

import (
	"errors"
	"fmt"
	"strings"
)

// Token bytes: what each token adds to decoded text, for guided decoding, which
// constrains the bytes of the text rather than the tokens. The decoder chain is run on
// each token alone, without the lossy UTF-8 step at its end (a byte-level token may
// hold part of a character), and the stages that act only at a sequence's start (a
// Strip after Fuse, Metaspace's first token) are reported instead of applied.

// TokenBytes describes the bytes of every token of a vocabulary.
type TokenBytes struct {
	// Bytes holds, by id, the bytes a token adds when it is not a sequence's first;
	// nil for ids that are undefined or special (those decode to no text in answers).
	Bytes [][]byte
	// FirstDropsSpace says decoding drops one leading space from a sequence's first
	// token (Llama 2's Strip decoder, Metaspace's prepend scheme).
	FirstDropsSpace bool
	// FirstDiffers lists the ids whose first-token text is not Bytes with at most its
	// leading space dropped (a Metaspace token with a second ▁); guided decoding does
	// not start a sequence with them.
	FirstDiffers []int32
}

// ErrNoTokenBytes says a tokenizer's decoder does not let each token's bytes be known
// on its own.
var ErrNoTokenBytes = errors.New("token bytes unknown")

// TokenBytes returns every token's bytes as the decoder yields them. It fails for a
// decoder whose output is not the concatenation of its tokens' (no decoder: tokens
// joined with spaces; a Strip that removes a sequence's last characters).
func (t *Tokenizer) TokenBytes() (*TokenBytes, error) {
	if t.dec == nil {
		return nil, fmt.Errorf("%w: the tokenizer has no decoder (its tokens are joined with spaces)", ErrNoTokenBytes)
	}
	tb := &TokenBytes{Bytes: make([][]byte, len(t.tokens))}
	// A stage after a Fuse sees the whole text: a Strip there acts only at its ends.
	fused := false
	var metaFirst *metaspaceDecoder
	for _, d := range t.dec {
		switch d := d.(type) {
		case fuseDecoder:
			fused = true
		case stripDecoder:
			if !fused {
				continue // per token: applied below
			}
			if d.stop > 0 {
				return nil, fmt.Errorf("%w: the decoder strips the end of the text (Strip stop %d)", ErrNoTokenBytes, d.stop)
			}
			if d.start > 0 {
				if d.content != ' ' || d.start != 1 {
					return nil, fmt.Errorf("%w: the decoder strips %d × %q from the text's start", ErrNoTokenBytes, d.start, d.content)
				}
				tb.FirstDropsSpace = true
			}
		case metaspaceDecoder:
			if d.dropFirst {
				m := d
				metaFirst = &m
			}
		}
	}
	if metaFirst != nil {
		tb.FirstDropsSpace = true
	}
	for id, tok := range t.tokens {
		if !t.ok[id] || t.special[id] {
			continue
		}
		b, first := t.rawBytes(tok)
		tb.Bytes[id] = b
		if metaFirst != nil && first != strings.TrimPrefix(string(b), " ") {
			tb.FirstDiffers = append(tb.FirstDiffers, int32(id))
		}
	}
	return tb, nil
}

// rawBytes runs the decoder chain on one token, keeping bytes that are not a whole
// character. It returns the token's bytes in a sequence's middle and, for a Metaspace
// decoder that drops the first token's replacement characters, its text as a first
// token.
func (t *Tokenizer) rawBytes(tok string) ([]byte, string) {
	s, first := tok, tok
	fused := false
	for _, d := range t.dec {
		switch d := d.(type) {
		case byteLevelDecoder:
			s, first = string(decodeByteLevel(s)), string(decodeByteLevel(first))
		case replaceDecoder:
			in := []string{s, first}
			d.decode(in)
			s, first = in[0], in[1]
		case byteFallbackDecoder:
			if b, ok := parseByteToken(s); ok {
				s, first = string([]byte{b}), string([]byte{b})
			}
		case fuseDecoder:
			fused = true
		case stripDecoder:
			if !fused {
				in := []string{s, first}
				d.decode(in)
				s, first = in[0], in[1]
			}
		case metaspaceDecoder:
			s = strings.ReplaceAll(s, d.repl, " ")
			if d.dropFirst {
				first = strings.ReplaceAll(first, d.repl, "")
			} else {
				first = strings.ReplaceAll(first, d.repl, " ")
			}
		}
	}
	return []byte(s), first
}

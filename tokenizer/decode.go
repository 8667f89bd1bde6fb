package tokenizer

import (
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Decoders turn tokens back into text, stage by stage over the token list, as the
// Hugging Face library's decode_chain does; the stages' outputs are joined at the end.

// decoder is one stage.
type decoder interface{ decode(toks []string) []string }

// byteLevelDecoder maps byte-level characters back to bytes (a token with a character
// outside the table stands for its own UTF-8) and reads the bytes as UTF-8, U+FFFD for
// what is not.
type byteLevelDecoder struct{}

func (byteLevelDecoder) decode(toks []string) []string {
	var raw []byte
	for _, t := range toks {
		raw = append(raw, decodeByteLevel(t)...)
	}
	return []string{ValidUTF8(string(raw))}
}

// decodeByteLevel maps a token back to its bytes.
func decodeByteLevel(tok string) []byte {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := runeBytes[r]
		if !ok {
			return []byte(tok)
		}
		out = append(out, b)
	}
	return out
}

// replaceDecoder replaces a string (or an expression's matches) in each token.
type replaceDecoder struct {
	// old is replaced by content when re is nil.
	old, content string
	// re is the pattern of a Regex replace.
	re *regexp.Regexp
}

func (r replaceDecoder) decode(toks []string) []string {
	for i, t := range toks {
		if r.re != nil {
			toks[i] = r.re.ReplaceAllLiteralString(t, r.content)
		} else {
			toks[i] = strings.ReplaceAll(t, r.old, r.content)
		}
	}
	return toks
}

// byteFallbackDecoder turns runs of <0xNN> tokens into their bytes when the run is valid
// UTF-8, and into one U+FFFD per token when it is not.
type byteFallbackDecoder struct{}

func (byteFallbackDecoder) decode(toks []string) []string {
	out := toks[:0:0]
	var run []byte
	n := 0
	flush := func() {
		if n == 0 {
			return
		}
		if utf8.Valid(run) {
			out = append(out, string(run))
		} else {
			for range n {
				out = append(out, "\uFFFD")
			}
		}
		run, n = run[:0], 0
	}
	for _, t := range toks {
		if b, ok := parseByteToken(t); ok {
			run = append(run, b)
			n++
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// parseByteToken reads a <0xNN> token.
func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(t[3:5], 16, 8)
	return byte(v), err == nil
}

// fuseDecoder joins the tokens into one.
type fuseDecoder struct{}

func (fuseDecoder) decode(toks []string) []string { return []string{strings.Join(toks, "")} }

// stripDecoder removes up to start copies of a character from each token's start and up
// to stop from its end.
type stripDecoder struct {
	// content is stripped from the ends.
	content rune
	// start and stop are the most removed at each end.
	start, stop int
}

func (s stripDecoder) decode(toks []string) []string {
	for i, t := range toks {
		for k := 0; k < s.start; k++ {
			r, n := utf8.DecodeRuneInString(t)
			if n == 0 || r != s.content {
				break
			}
			t = t[n:]
		}
		for k := 0; k < s.stop; k++ {
			r, n := utf8.DecodeLastRuneInString(t)
			if n == 0 || r != s.content {
				break
			}
			t = t[:len(t)-n]
		}
		toks[i] = t
	}
	return toks
}

// metaspaceDecoder turns the replacement character back into spaces; in the first
// token, where the pre-tokenizer put one in front, the library drops every one of them.
type metaspaceDecoder struct {
	// repl stands for a space in the pieces.
	repl string
	// dropFirst is set unless prepend_scheme is "never".
	dropFirst bool
}

func (m metaspaceDecoder) decode(toks []string) []string {
	for i, t := range toks {
		if i == 0 && m.dropFirst {
			toks[i] = strings.ReplaceAll(t, m.repl, "")
		} else {
			toks[i] = strings.ReplaceAll(t, m.repl, " ")
		}
	}
	return toks
}

// StreamDecoder turns tokens into text one at a time. What it returns never ends inside
// a character, and the pieces joined are the text Decode gives for the whole sequence
// (for valid text; U+FFFD stands for bytes that never form a character). It decodes a
// short window each time — the tokens of the previous piece and the new ones — and
// returns what the new ones add, holding them back while that ends in U+FFFD (a
// character a later token may complete).
type StreamDecoder struct {
	// t decodes and knows the special tokens to skip.
	t *Tokenizer
	// skip leaves special tokens out.
	skip bool
	// ids are the window: ids[:read] were returned already, ids[read:] wait.
	ids  []int32
	read int
}

// NewStreamDecoder starts decoding a sequence, special tokens included (as Decode).
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder { return &StreamDecoder{t: t} }

// NewTextStreamDecoder starts decoding a sequence without its special tokens (as
// DecodeText).
func (t *Tokenizer) NewTextStreamDecoder() *StreamDecoder { return &StreamDecoder{t: t, skip: true} }

// Next adds a token and returns the text it completes, possibly "".
func (d *StreamDecoder) Next(id int32) string {
	d.ids = append(d.ids, id)
	return d.emit(false)
}

// Flush returns whatever is held back at the end of the sequence.
func (d *StreamDecoder) Flush() string { return d.emit(true) }

// emit returns the text the waiting tokens add to the window's first part.
func (d *StreamDecoder) emit(final bool) string {
	if d.read == len(d.ids) {
		return ""
	}
	prev := d.t.decode(d.ids[:d.read], d.skip)
	cur := d.t.decode(d.ids, d.skip)
	if !strings.HasPrefix(cur, prev) || (!final && (len(cur) == len(prev) || strings.HasSuffix(cur, "\uFFFD"))) {
		if final {
			d.ids, d.read = d.ids[:0], 0
		}
		return ""
	}
	out := cur[len(prev):]
	// The new tokens start the next window.
	d.ids = append(d.ids[:0], d.ids[d.read:]...)
	d.read = len(d.ids)
	if final {
		d.ids, d.read = d.ids[:0], 0
	}
	return out
}

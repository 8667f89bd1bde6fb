package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// Text from tokens. A token may end inside a character (byte-level BPE splits
// multi-byte characters), so decoded text is not always valid UTF-8. UTF8Stream and
// ValidUTF8 make it so the way Hugging Face's decode does (Rust's from_utf8_lossy): an
// incomplete character at the end of a stream waits for the bytes that complete it,
// and bytes that can never form a character become U+FFFD, one per maximal invalid
// sequence.

// utf8Tail is how a byte sequence starting at b[0] reads: size, the bytes of a valid
// character or of its maximal invalid subpart; complete, whether those size bytes are
// a whole character; truncated, whether b ends inside what could still become one.
func utf8Tail(b []byte) (size int, complete, truncated bool) {
	c := b[0]
	if c < 0x80 {
		return 1, true, false
	}
	n, lo, hi := 0, byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		n = 2
	case c == 0xE0:
		n, lo = 3, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		n = 3
	case c == 0xED:
		n, hi = 3, 0x9F
	case c == 0xF0:
		n, lo = 4, 0x90
	case c >= 0xF1 && c <= 0xF3:
		n = 4
	case c == 0xF4:
		n, hi = 4, 0x8F
	default:
		return 1, false, false
	}
	k := 1
	for ; k < n; k++ {
		if k >= len(b) {
			return k, false, true
		}
		if k == 1 && (b[1] < lo || b[1] > hi) || k > 1 && (b[k] < 0x80 || b[k] > 0xBF) {
			return k, false, false
		}
	}
	return n, true, false
}

// UTF8Stream makes a byte stream valid UTF-8 as it comes.
type UTF8Stream struct {
	// pending holds the bytes of a character not complete yet.
	pending []byte
}

// Push adds text and returns its valid part: complete characters, U+FFFD for what can
// never complete; an incomplete character at the end stays pending (all of it when
// final).
func (u *UTF8Stream) Push(s string, final bool) string {
	if len(u.pending) == 0 && utf8.ValidString(s) {
		return s
	}
	b := append(u.pending, s...)
	var sb strings.Builder
	i := 0
	for i < len(b) {
		size, complete, truncated := utf8Tail(b[i:])
		switch {
		case complete:
			sb.Write(b[i : i+size])
		case truncated && !final:
			u.pending = append(u.pending[:0:0], b[i:]...)
			return sb.String()
		default:
			sb.WriteRune(utf8.RuneError)
		}
		i += size
	}
	u.pending = u.pending[:0]
	return sb.String()
}

// ValidUTF8 is s with what can never be a character replaced by U+FFFD.
func ValidUTF8(s string) string {
	var u UTF8Stream
	return u.Push(s, true)
}

package main

import (
	"strings"
	"unicode/utf8"
)

// Text answers. text_output is always valid UTF-8: a token that ends inside a
// character leaves its bytes pending until a later token completes it (streaming),
// and bytes that can never form a character become U+FFFD, one per maximal invalid
// sequence (what Hugging Face's decode gives, Rust's from_utf8_lossy). Stop strings
// (the stop_words input) are matched on that text, wherever the tokens split them; the
// answer ends before the first one (it and what follows are not returned), and a
// streaming answer holds back text that may be the start of one until it is not.

// tokenStream detokenizes one sequence token by token (a *model.StreamDecoder).
type tokenStream interface {
	// Next adds a token and returns the text it completes.
	Next(id int32) string
	// Flush returns what is held back at the end.
	Flush() string
}

// detokenizer is what text answers need of the checkpoint's tokenizer.
type detokenizer interface {
	// Decode joins the tokens' text.
	Decode(ids []int32) string
	// NewStream starts a token-by-token decoder.
	NewStream() tokenStream
}

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

// utf8Stream makes a byte stream valid UTF-8 as it comes.
type utf8Stream struct {
	// pending holds the bytes of a character not complete yet.
	pending []byte
}

// push adds text and returns its valid part: complete characters, U+FFFD for what can
// never complete; an incomplete character at the end stays pending (all of it when
// final).
func (u *utf8Stream) push(s string, final bool) string {
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

// validUTF8 is s with what can never be a character replaced by U+FFFD.
func validUTF8(s string) string {
	var u utf8Stream
	return u.push(s, true)
}

// textOut turns one sequence's generated tokens into text_output as they come: valid
// UTF-8, cut before the first stop string.
type textOut struct {
	// dec detokenizes token by token.
	dec tokenStream
	// utf holds incomplete characters.
	utf utf8Stream
	// stops are the stop strings.
	stops []string
	// held is text withheld because a stop string may start there.
	held string
	// stopped says a stop string was found: nothing more is returned.
	stopped bool
}

// newTextOut starts a sequence's text.
func newTextOut(d detokenizer, stops []string) *textOut {
	return &textOut{dec: d.NewStream(), stops: stops}
}

// push adds tokens and returns the text that can go out now; final flushes.
func (t *textOut) push(ids []int32, final bool) string {
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteString(t.dec.Next(id))
	}
	if final {
		sb.WriteString(t.dec.Flush())
	}
	s := t.utf.push(sb.String(), final)
	if t.stopped {
		return ""
	}
	t.held += s
	// pend is where the earliest stop string that may still complete starts; a match
	// stands once none can start before it.
	pend := len(t.held)
	if !final {
		pend -= stopPrefix(t.held, t.stops)
	}
	if at := firstStop(t.held, t.stops); at >= 0 && at <= pend {
		out := t.held[:at]
		t.held, t.stopped = "", true
		return out
	}
	out := t.held[:pend]
	t.held = t.held[pend:]
	return out
}

// firstStop is where the first stop string starts in s, or -1.
func firstStop(s string, stops []string) int {
	at := -1
	for _, w := range stops {
		if i := strings.Index(s, w); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	return at
}

// stopPrefix is the length of the longest end of s that begins some stop string
// (shorter than it): text that must wait for what follows.
func stopPrefix(s string, stops []string) int {
	best := 0
	for _, w := range stops {
		for k := min(len(w)-1, len(s)); k > best; k-- {
			if strings.HasSuffix(s, w[:k]) {
				best = k
				break
			}
		}
	}
	return best
}

// wholeText is the text of a whole answer: ids decoded, valid UTF-8, cut at the first
// stop string that starts past the first prompt tokens (the prompt, when the answer
// includes it, is never searched).
func wholeText(d detokenizer, ids []int32, prompt int, stops []string) string {
	s := validUTF8(d.Decode(ids))
	if len(stops) == 0 {
		return s
	}
	from := 0
	if prompt > 0 {
		if p := validUTF8(d.Decode(ids[:min(prompt, len(ids))])); strings.HasPrefix(s, p) {
			from = len(p)
		}
	}
	if at := firstStop(s[from:], stops); at >= 0 {
		return s[:from+at]
	}
	return s
}

// textStopper is the batch manager's TextStopper for a request with stop strings: it
// follows each sequence's text and says when a stop string appears.
type textStopper struct {
	// d detokenizes.
	d detokenizer
	// stops are the stop strings.
	stops []string
	// seqs follow each sequence index: the tokens seen and their text.
	seqs map[int]*stopState
}

// stopState is one sequence's text so far.
type stopState struct {
	// ids are the generated tokens seen.
	ids []int32
	// out is their text.
	out *textOut
}

// Stopped implements batchmanager.TextStopper. A sequence that did not just grow by
// one token (a beam that changed) is decoded again from its start.
func (s *textStopper) Stopped(seq int, gen []int32) bool {
	st := s.seqs[seq]
	if st == nil || len(gen) != len(st.ids)+1 || !equalInt32(gen[:len(st.ids)], st.ids) {
		st = &stopState{out: newTextOut(s.d, s.stops)}
		if s.seqs == nil {
			s.seqs = map[int]*stopState{}
		}
		s.seqs[seq] = st
		st.out.push(gen[:len(gen)-1], false)
		st.ids = append(st.ids[:0], gen[:len(gen)-1]...)
	}
	st.out.push(gen[len(gen)-1:], false)
	st.ids = append(st.ids, gen[len(gen)-1])
	return st.out.stopped
}

// equalInt32 compares two token lists.
func equalInt32(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

package main

import (
	"gollm/tokenizer"
	"slices"
	"strings"
)

// Text answers. text_output is always valid UTF-8: a token that ends inside a
// character leaves its bytes pending until a later token completes it (streaming),
// and bytes that can never form a character become U+FFFD, one per maximal invalid
// sequence (what Hugging Face's decode gives, Rust's from_utf8_lossy). Stop strings
// (the stop_words input) are matched on that text, wherever the tokens split them; the
// answer ends before the first one (it and what follows are not returned), and a
// streaming answer holds back text that may be the start of one until it is not.

// tokenStream detokenizes one sequence token by token (a *tokenizer.StreamDecoder).
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

// textOut turns one sequence's generated tokens into text_output as they come: valid
// UTF-8, cut before the first stop string.
type textOut struct {
	// dec detokenizes token by token.
	dec tokenStream
	// utf holds incomplete characters.
	utf tokenizer.UTF8Stream
	// stops end the text before the first of them.
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
	s := t.utf.Push(sb.String(), final)
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
	s := tokenizer.ValidUTF8(d.Decode(ids))
	if len(stops) == 0 {
		return s
	}
	from := 0
	if prompt > 0 {
		if p := tokenizer.ValidUTF8(d.Decode(ids[:min(prompt, len(ids))])); strings.HasPrefix(s, p) {
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
	// stops end the sequence at the token that completes one.
	stops []string
	// seqs follow each sequence index: the tokens seen and their text.
	seqs map[int]*stopState
}

// stopState is one sequence's text so far.
type stopState struct {
	// ids tell whether the next call extends them by one token or starts over (a beam that changed).
	ids []int32
	// out is their text.
	out *textOut
}

// Stopped implements batchmanager.TextStopper. A sequence that did not just grow by
// one token (a beam that changed) is decoded again from its start.
func (s *textStopper) Stopped(seq int, gen []int32) bool {
	st := s.seqs[seq]
	if st == nil || len(gen) != len(st.ids)+1 || !slices.Equal(gen[:len(st.ids)], st.ids) {
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

package openai

import "strings"

// stopMatcher finds stop strings in streamed text. It holds back the text that could
// be the start of a stop string until the next text settles it, so that no part of a
// stop string is ever returned, even one split across tokens.
type stopMatcher struct {
	// stops are the stop strings.
	stops []string
	// held is text not yet returned.
	held string
	// emitted counts the bytes returned so far.
	emitted int
}

// newStopMatcher matches the non-empty strings of stops.
func newStopMatcher(stops []string) *stopMatcher {
	m := &stopMatcher{}
	for _, s := range stops {
		if s != "" {
			m.stops = append(m.stops, s)
		}
	}
	return m
}

// push adds text and returns what can be returned now. matched reports a stop string:
// out is then the text before it, and the rest is dropped.
func (m *stopMatcher) push(text string) (out string, matched bool) {
	if len(m.stops) == 0 {
		m.emitted += len(text)
		return text, false
	}
	s := m.held + text
	cut := -1
	for _, stop := range m.stops {
		if i := strings.Index(s, stop); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		m.held = ""
		m.emitted += cut
		return s[:cut], true
	}
	// Hold back the longest end of s that begins a stop string.
	hold := 0
	for _, stop := range m.stops {
		for k := min(len(stop)-1, len(s)); k > hold; k-- {
			if strings.HasSuffix(s, stop[:k]) {
				hold = k
				break
			}
		}
	}
	m.held = s[len(s)-hold:]
	m.emitted += len(s) - hold
	return s[:len(s)-hold], false
}

// flush returns the held text at the end of the stream.
func (m *stopMatcher) flush() string {
	out := m.held
	m.emitted += len(out)
	m.held = ""
	return out
}

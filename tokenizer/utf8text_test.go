package tokenizer

import "testing"

func TestValidUTF8ReplacesMaximalInvalidSequences(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain é 日本", "plain é 日本"},
		{"a\xffb", "a\uFFFDb"},
		// A truncated three-byte character is one maximal subpart: one U+FFFD.
		{"\xe2\x82a", "\uFFFDa"},
		{"\xe2\x82", "\uFFFD"},
		// Surrogates and overlong forms are invalid byte by byte.
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"},
		{"\xc0\xaf", "\uFFFD\uFFFD"},
		{"\xf0\x9f\x98\x80\xf0\x9f", "\U0001F600\uFFFD"},
	} {
		if got := ValidUTF8(tc.in); got != tc.want {
			t.Errorf("ValidUTF8(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestUTF8StreamHoldsIncompleteCharacters(t *testing.T) {
	var u UTF8Stream
	var got string
	for _, piece := range []string{"a\xf0", "\x9f", "\x98", "\x80b\xe2", "\x82"} {
		got += u.Push(piece, false)
	}
	if got != "a\U0001F600b" {
		t.Errorf("streamed %q before the end", got)
	}
	if rest := u.Push("", true); rest != "\uFFFD" {
		t.Errorf("the end flushed %q, want one U+FFFD for the truncated character", rest)
	}
}

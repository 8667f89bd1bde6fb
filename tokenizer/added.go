package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Added tokens (tokenizer.json's added_tokens: <s>, <|im_start|>, …) are matched in the
// text before the model sees it, as the Hugging Face library does: those with
// normalized false on the raw text, the others on the normalized text; leftmost first,
// the longest of those starting at one place; single_word ones only between non-word
// characters; lstrip and rstrip ones take the whitespace beside them.

// addedToken is one added token.
type addedToken struct {
	// content is the token's text; pattern what is matched (content, normalized where
	// the token is).
	content, pattern string
	// id is its token id.
	id int32
	// special tokens are skipped when decoding for display.
	special bool
	// singleWord, lstrip, rstrip and normalized are the file's flags.
	singleWord, lstrip, rstrip, normalized bool
}

// addedVocab holds the added tokens by how they match.
type addedVocab struct {
	// raw are matched on the text as given; norm on normalized text. Longest first.
	raw, norm []addedToken
	// byContent maps each added token's content to its id.
	byContent map[string]int32
}

// segment is a stretch of text between added tokens, or one added token (id ≥ 0).
type segment struct {
	// text is the stretch; empty for a token.
	text string
	// id is the added token's id, -1 for text.
	id int32
	// offset is where the stretch starts in the text given to Encode (0 means the text's
	// start, which Metaspace's prepend_scheme "first" looks at).
	offset int
}

// sortLongestFirst orders tokens so that of two starting at one place the longer wins.
func sortLongestFirst(toks []addedToken) {
	sort.SliceStable(toks, func(i, j int) bool { return len(toks[i].pattern) > len(toks[j].pattern) })
}

// split cuts text (which starts at offset base of the original) at the added tokens of
// one kind: the raw ones, or the normalized ones when normalized is set.
func (a *addedVocab) split(text string, base int, normalized bool) []segment {
	toks := a.raw
	if normalized {
		toks = a.norm
	}
	if len(toks) == 0 || text == "" {
		return []segment{{text: text, id: -1, offset: base}}
	}
	var out []segment
	emitted, from := 0, 0 // text[:emitted] is in out; the search resumes at from
	for from < len(text) {
		at, tok := nextAdded(toks, text, from)
		if tok == nil {
			break
		}
		start, stop := at, at+len(tok.pattern)
		if tok.singleWord && (endsWithWordChar(text[:start]) || startsWithWordChar(text[stop:])) {
			from = stop // the library's matcher resumes after a refused match
			continue
		}
		if tok.lstrip {
			start = max(emitted, len(strings.TrimRightFunc(text[:start], unicode.IsSpace)))
		}
		if tok.rstrip {
			stop = len(text) - len(strings.TrimLeftFunc(text[stop:], unicode.IsSpace))
		}
		if start > emitted {
			out = append(out, segment{text: text[emitted:start], id: -1, offset: base + emitted})
		}
		out = append(out, segment{id: tok.id, offset: base + start})
		emitted, from = stop, stop
	}
	if emitted < len(text) {
		out = append(out, segment{text: text[emitted:], id: -1, offset: base + emitted})
	}
	return out
}

// nextAdded finds the leftmost token in text at or after from (the longest, where
// several start there); nil when there is none.
func nextAdded(toks []addedToken, text string, from int) (int, *addedToken) {
	best, bestAt := -1, len(text)
	for i := range toks {
		limit := min(len(text), bestAt+len(toks[i].pattern))
		if limit-from < len(toks[i].pattern) {
			continue
		}
		if at := strings.Index(text[from:limit], toks[i].pattern); at >= 0 && from+at < bestAt {
			best, bestAt = i, from+at
		}
	}
	if best < 0 {
		return len(text), nil
	}
	return bestAt, &toks[best]
}

// isWordChar is what single_word tokens may not touch.
func isWordChar(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' }

// endsWithWordChar says whether s's last character is a word character.
func endsWithWordChar(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordChar(r)
}

// startsWithWordChar says whether s's first character is a word character.
func startsWithWordChar(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordChar(r)
}

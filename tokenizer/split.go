package tokenizer

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Normalizers and pre-tokenizers: what happens to text between the added tokens before
// BPE sees it.

// normalizer rewrites a stretch of text.
type normalizer interface{ normalize(s string) string }

// normalizers runs several in order (Sequence).
type normalizers []normalizer

func (ns normalizers) normalize(s string) string {
	for _, n := range ns {
		s = n.normalize(s)
	}
	return s
}

// prependNormalizer puts a string before non-empty text (SentencePiece's "▁").
type prependNormalizer struct{ prepend string }

func (p prependNormalizer) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.prepend + s
}

// replaceNormalizer replaces a string or a regular expression's matches.
type replaceNormalizer struct {
	// old is the string replaced when re is nil.
	old, content string
	// re is the pattern for a Regex replace.
	re *regexp.Regexp
}

func (r replaceNormalizer) normalize(s string) string {
	if r.re != nil {
		return r.re.ReplaceAllLiteralString(s, r.content)
	}
	return strings.ReplaceAll(s, r.old, r.content)
}

// unicodeNormalizer is NFC, NFD, NFKC or NFKD.
type unicodeNormalizer struct{ form norm.Form }

func (u unicodeNormalizer) normalize(s string) string { return u.form.String(s) }

// lowercaseNormalizer lowercases.
type lowercaseNormalizer struct{}

func (lowercaseNormalizer) normalize(s string) string { return strings.ToLower(s) }

// stripNormalizer trims whitespace at either end.
type stripNormalizer struct{ left, right bool }

func (st stripNormalizer) normalize(s string) string {
	if st.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if st.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

// piece is a pre-token in the making.
type piece struct {
	// text holds the piece's characters.
	text string
	// first says the piece starts the text given to Encode.
	first bool
}

// preTokenizer splits pieces further.
type preTokenizer interface{ preTokenize(in []piece) []piece }

// splitBehavior is how the delimiters a pre-tokenizer finds join the pieces.
type splitBehavior int

const (
	// isolated makes each delimiter a piece of its own.
	isolated splitBehavior = iota
	// removed drops the delimiters.
	removed
	// mergedWithPrevious joins each delimiter to the piece before it.
	mergedWithPrevious
	// mergedWithNext joins each delimiter to the piece after it.
	mergedWithNext
	// contiguous makes each run of adjacent delimiters one piece.
	contiguous
)

// parseBehavior reads a Split's behavior.
func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Isolated":
		return isolated, nil
	case "Removed":
		return removed, nil
	case "MergedWithPrevious":
		return mergedWithPrevious, nil
	case "MergedWithNext":
		return mergedWithNext, nil
	case "Contiguous":
		return contiguous, nil
	}
	return 0, fmt.Errorf("behavior %q is not supported", s)
}

// cut splits p at the delimiters spans ([start, end) pairs, in order, not overlapping)
// with behavior b, appending the pieces to out.
func cut(out []piece, p piece, spans [][2]int, b splitBehavior) []piece {
	if b == contiguous {
		// Adjacent delimiters are one, then isolated.
		var merged [][2]int
		for _, sp := range spans {
			if n := len(merged); n > 0 && merged[n-1][1] == sp[0] {
				merged[n-1][1] = sp[1]
			} else {
				merged = append(merged, sp)
			}
		}
		spans, b = merged, isolated
	}
	first := p.first
	add := func(s string) {
		if s != "" {
			out = append(out, piece{text: s, first: first})
			first = false
		}
	}
	prev := 0
	pending := -1 // mergedWithNext: where the delimiter waiting for the next piece starts
	for _, sp := range spans {
		switch b {
		case isolated:
			add(p.text[prev:sp[0]])
			add(p.text[sp[0]:sp[1]])
		case removed:
			add(p.text[prev:sp[0]])
		case mergedWithPrevious:
			add(p.text[prev:sp[1]])
		case mergedWithNext:
			if pending >= 0 {
				add(p.text[pending:sp[0]])
			} else {
				add(p.text[prev:sp[0]])
			}
			pending = sp[0]
		}
		prev = sp[1]
	}
	if pending >= 0 {
		add(p.text[pending:])
	} else {
		add(p.text[prev:])
	}
	return out
}

// preTokenizers runs several in order (Sequence).
type preTokenizers []preTokenizer

func (ps preTokenizers) preTokenize(in []piece) []piece {
	for _, p := range ps {
		in = p.preTokenize(in)
	}
	return in
}

// byteLevelPre is the ByteLevel pre-tokenizer: an optional leading space and GPT-2's
// split. Its byte-to-character mapping is BPE's starting point (bpeModel.encode).
type byteLevelPre struct{ addPrefixSpace, useRegex bool }

func (b byteLevelPre) preTokenize(in []piece) []piece {
	var out []piece
	for _, p := range in {
		if b.addPrefixSpace && !strings.HasPrefix(p.text, " ") {
			p.text = " " + p.text
		}
		if !b.useRegex {
			out = append(out, p)
			continue
		}
		var spans [][2]int
		for at := 0; at < len(p.text); {
			n := preTokenEnd(p.text[at:])
			spans = append(spans, [2]int{at, at + n})
			at += n
		}
		out = cut(out, p, spans, isolated)
	}
	return out
}

// metaspacePre is the Metaspace pre-tokenizer: spaces become the replacement character
// ("▁"), one is put in front as prepend_scheme says, and with split each one starts a
// piece.
type metaspacePre struct {
	// repl replaces spaces.
	repl string
	// scheme is "always", "first" or "never".
	scheme string
	// split cuts before each replacement.
	split bool
}

func (m metaspacePre) preTokenize(in []piece) []piece {
	var out []piece
	for _, p := range in {
		p.text = strings.ReplaceAll(p.text, " ", m.repl)
		if !strings.HasPrefix(p.text, m.repl) && (m.scheme == "always" || m.scheme == "first" && p.first) {
			p.text = m.repl + p.text
		}
		if !m.split {
			out = append(out, p)
			continue
		}
		var spans [][2]int
		for at := 0; ; {
			i := strings.Index(p.text[at:], m.repl)
			if i < 0 {
				break
			}
			spans = append(spans, [2]int{at + i, at + i + len(m.repl)})
			at += i + len(m.repl)
		}
		out = cut(out, p, spans, mergedWithNext)
	}
	return out
}

// digitsPre isolates numeric characters (Unicode's number categories, as Rust's
// char::is_numeric): each one, or each run of them.
type digitsPre struct{ individual bool }

func (d digitsPre) preTokenize(in []piece) []piece {
	var out []piece
	for _, p := range in {
		var spans [][2]int
		for i := 0; i < len(p.text); {
			r, n := utf8.DecodeRuneInString(p.text[i:])
			start, end := i, i+n
			i = end
			if !unicode.IsNumber(r) {
				continue
			}
			if !d.individual && len(spans) > 0 && spans[len(spans)-1][1] == start {
				spans[len(spans)-1][1] = end
			} else {
				spans = append(spans, [2]int{start, end})
			}
		}
		out = cut(out, p, spans, isolated)
	}
	return out
}

// splitPre is the Split pre-tokenizer with a string or a regular expression.
type splitPre struct {
	// literal is the delimiter when re is nil.
	literal string
	// re splits the text.
	re *splitRegex
	// behavior joins the delimiters to the pieces.
	behavior splitBehavior
}

func (s splitPre) preTokenize(in []piece) []piece {
	var out []piece
	for _, p := range in {
		var spans [][2]int
		if s.re != nil {
			spans = s.re.find(p.text)
		} else {
			for at := 0; s.literal != ""; {
				i := strings.Index(p.text[at:], s.literal)
				if i < 0 {
					break
				}
				spans = append(spans, [2]int{at + i, at + i + len(s.literal)})
				at += i + len(s.literal)
			}
		}
		out = cut(out, p, spans, s.behavior)
	}
	return out
}

// splitRegex runs a tokenizer.json Split pattern (Oniguruma syntax) on Go's regexp.
// Two differences are bridged: \s and \S mean Unicode whitespace there (ASCII in Go),
// and the lookahead of `\s+(?!\S)|\s+` — the only one these patterns use — is not
// supported by Go. That alternative is matched as a plain \s+ in a named group, and a
// match of it that is followed by a non-space gives back its last character, which is
// what the lookahead does.
type splitRegex struct {
	// re holds the pattern translated to Go's syntax.
	re *regexp.Regexp
	// ws is the lookahead group's index, -1 when the pattern has none.
	ws int
}

// lookaheadAlt is the one lookahead construct supported, with the alternative after it.
const lookaheadAlt = `\s+(?!\S)|\s+`

// unicodeSpace is Unicode's White_Space set, what Oniguruma's \s matches.
const unicodeSpace = `\t\n\v\f\r\x{85}\p{Z}`

// compileSplitRegex translates and compiles a Split pattern.
func compileSplitRegex(pattern string) (*splitRegex, error) {
	p := pattern
	hasWS := strings.Contains(p, lookaheadAlt)
	if hasWS {
		p = strings.Replace(p, lookaheadAlt, `(?P<gollmws>\s+)|\s+`, 1)
	}
	for _, look := range []string{"(?=", "(?!", "(?<=", "(?<!"} {
		if strings.Contains(p, look) {
			return nil, fmt.Errorf("pattern %q: lookaround %s…) is not supported (only %s)", pattern, look, lookaheadAlt)
		}
	}
	var sb strings.Builder
	inClass := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			next := p[i+1]
			i++
			switch {
			case next == 's' && inClass:
				sb.WriteString(unicodeSpace)
			case next == 's':
				sb.WriteString("[" + unicodeSpace + "]")
			case next == 'S' && inClass:
				return nil, fmt.Errorf("pattern %q: \\S inside a character class is not supported", pattern)
			case next == 'S':
				sb.WriteString("[^" + unicodeSpace + "]")
			default:
				sb.WriteByte('\\')
				sb.WriteByte(next)
			}
			continue
		case c == '[' && !inClass:
			inClass = true
			sb.WriteByte(c)
			// A ']' right after '[' or '[^' is a literal.
			if i+1 < len(p) && p[i+1] == '^' {
				sb.WriteByte('^')
				i++
			}
			if i+1 < len(p) && p[i+1] == ']' {
				sb.WriteByte(']')
				i++
			}
			continue
		case c == ']' && inClass:
			inClass = false
		}
		sb.WriteByte(c)
	}
	re, err := regexp.Compile(sb.String())
	if err != nil {
		return nil, fmt.Errorf("pattern %q: %w", pattern, err)
	}
	return &splitRegex{re: re, ws: re.SubexpIndex("gollmws")}, nil
}

// find returns the matches in s, in order, as the Oniguruma pattern would find them
// (empty matches skipped).
func (r *splitRegex) find(s string) [][2]int {
	var spans [][2]int
	for pos := 0; pos < len(s); {
		loc := r.re.FindStringSubmatchIndex(s[pos:])
		if loc == nil {
			break
		}
		start, end := pos+loc[0], pos+loc[1]
		if end == start {
			_, n := utf8.DecodeRuneInString(s[start:])
			pos = start + max(n, 1)
			continue
		}
		if r.ws >= 0 && loc[2*r.ws] >= 0 && end < len(s) {
			// \s+(?!\S) before a non-space: the run without its last character, unless
			// that leaves nothing (then the \s+ after it takes the one character).
			if _, n := utf8.DecodeLastRuneInString(s[start:end]); end-n > start {
				end -= n
			}
		}
		spans = append(spans, [2]int{start, end})
		pos = end
	}
	return spans
}

// preTokenEnd returns the length of the first pre-token of s under GPT-2's pattern
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// written out by hand (ByteLevel's split, on every GPT-2-style prompt, is hot).
// Alternatives are tried in order, as the backtracking engines the library uses do.
func preTokenEnd(s string) int {
	r, w := utf8.DecodeRuneInString(s)
	if r == '\'' {
		for _, c := range [...]string{"s", "t", "re", "ve", "m", "ll", "d"} {
			if strings.HasPrefix(s[1:], c) {
				return 1 + len(c)
			}
		}
	}
	start := 0
	if r == ' ' && len(s) > 1 {
		// " ?" joins one space to a following letter, number or symbol run.
		if r2, w2 := utf8.DecodeRuneInString(s[1:]); !unicode.IsSpace(r2) {
			start, r, w = 1, r2, w2
		}
	}
	if !unicode.IsSpace(r) {
		class := runeClass(r)
		end := start + w
		for end < len(s) {
			r2, w2 := utf8.DecodeRuneInString(s[end:])
			if runeClass(r2) != class {
				break
			}
			end += w2
		}
		return end
	}
	// A whitespace run. At the end of the text it is one token (\s+(?!\S)); before a
	// non-space, \s+(?!\S) backs off by one so the last whitespace character goes with
	// what follows, and a single one is a token of its own (\s+).
	end, last := 0, 0
	for end < len(s) {
		r2, w2 := utf8.DecodeRuneInString(s[end:])
		if !unicode.IsSpace(r2) {
			break
		}
		last = end
		end += w2
	}
	if end == len(s) || last == 0 {
		return end
	}
	return last
}

// runeClass sorts a non-space rune into the pattern's letter (\p{L}), number (\p{N}) and
// other classes.
func runeClass(r rune) int {
	switch {
	case unicode.IsLetter(r):
		return 1
	case unicode.IsNumber(r):
		return 2
	case unicode.IsSpace(r):
		return 3
	default:
		return 0
	}
}

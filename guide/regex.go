package guide

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Regular expressions: the syntax Python's re, ECMAScript and RE2 share — literals,
// ., classes with ranges and negation, \d \w \s and their negations, escapes (\n,
// \xHH, \uHHHH, \u{…}), groups (plain, (?:…), (?P<name>…), (?<name>…)), |, and the
// quantifiers * + ? {n} {n,} {n,m} (lazy forms match the same text). ^ and $ are
// allowed only at the ends. The whole text must match. What a deterministic automaton
// cannot express — backreferences, lookaround, word boundaries, inline flags — is
// refused by name.

// maxRegexBytes bounds a pattern's length.
const maxRegexBytes = 64 << 10

// maxRepeatCount bounds {n,m}'s numbers (larger ones fail the automaton limits anyway).
const maxRepeatCount = 100000

// reOp is a regex node's kind.
type reOp uint8

const (
	reEmpty reOp = iota
	reClass
	reConcat
	reAlt
	reRepeat
)

// reNode is a parsed regular expression.
type reNode struct {
	op reOp
	// ranges are a class's characters.
	ranges []runeRange
	// kids are the parts.
	kids []*reNode
	// min, max bound a repeat (max < 0: no limit).
	min, max int
}

// RegexError is a pattern's syntax error with its offset.
type RegexError struct {
	// Offset is the byte where the problem is.
	Offset int
	// Msg says what is wrong.
	Msg string
}

func (e *RegexError) Error() string { return fmt.Sprintf("regex: at byte %d: %s", e.Offset, e.Msg) }

// reParser reads a pattern.
type reParser struct {
	s     string
	i     int
	depth int
}

// parseRegex parses a whole pattern.
func parseRegex(s string) (*reNode, error) {
	if len(s) > maxRegexBytes {
		return nil, &RegexError{0, fmt.Sprintf("the pattern has %d bytes; the most is %d", len(s), maxRegexBytes)}
	}
	if !utf8.ValidString(s) {
		return nil, &RegexError{0, "the pattern is not valid UTF-8"}
	}
	p := &reParser{s: s}
	// ^ at the start and $ at the end are the full match anyway.
	p.s = strings.TrimPrefix(p.s, "^")
	off := len(s) - len(p.s)
	if strings.HasSuffix(p.s, "$") && !strings.HasSuffix(p.s, `\$`) {
		p.s = p.s[:len(p.s)-1]
	}
	n, err := p.alt()
	if err != nil {
		if re, ok := err.(*RegexError); ok {
			re.Offset += off
		}
		return nil, err
	}
	if p.i < len(p.s) {
		return nil, &RegexError{p.i + off, fmt.Sprintf("unexpected %q", p.s[p.i])}
	}
	return n, nil
}

func (p *reParser) fail(format string, args ...any) error {
	return &RegexError{p.i, fmt.Sprintf(format, args...)}
}

// maxRegexDepth bounds group nesting.
const maxRegexDepth = 200

// alt reads alternatives separated by |.
func (p *reParser) alt() (*reNode, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxRegexDepth {
		return nil, p.fail("groups nest deeper than %d", maxRegexDepth)
	}
	var kids []*reNode
	for {
		c, err := p.concat()
		if err != nil {
			return nil, err
		}
		kids = append(kids, c)
		if p.i < len(p.s) && p.s[p.i] == '|' {
			p.i++
			continue
		}
		break
	}
	if len(kids) == 1 {
		return kids[0], nil
	}
	return &reNode{op: reAlt, kids: kids}, nil
}

// concat reads quantified atoms up to | or ).
func (p *reParser) concat() (*reNode, error) {
	var kids []*reNode
	for p.i < len(p.s) && p.s[p.i] != '|' && p.s[p.i] != ')' {
		a, err := p.atom()
		if err != nil {
			return nil, err
		}
		if a, err = p.quantified(a); err != nil {
			return nil, err
		}
		kids = append(kids, a)
	}
	switch len(kids) {
	case 0:
		return &reNode{op: reEmpty}, nil
	case 1:
		return kids[0], nil
	}
	return &reNode{op: reConcat, kids: kids}, nil
}

// quantified reads the quantifiers after an atom.
func (p *reParser) quantified(a *reNode) (*reNode, error) {
	for p.i < len(p.s) {
		min, max := 0, 0
		switch p.s[p.i] {
		case '*':
			min, max = 0, -1
			p.i++
		case '+':
			min, max = 1, -1
			p.i++
		case '?':
			min, max = 0, 1
			p.i++
		case '{':
			lo, hi, ok, err := p.braces()
			if err != nil {
				return nil, err
			}
			if !ok {
				return a, nil // a literal {
			}
			min, max = lo, hi
		default:
			return a, nil
		}
		if p.i < len(p.s) {
			switch p.s[p.i] {
			case '?':
				p.i++ // lazy: the same text
			case '+':
				return nil, p.fail("possessive quantifiers are not supported")
			}
		}
		a = &reNode{op: reRepeat, kids: []*reNode{a}, min: min, max: max}
	}
	return a, nil
}

// braces reads {n}, {n,} or {n,m}; ok is false when the brace is not a quantifier.
func (p *reParser) braces() (int, int, bool, error) {
	j := strings.IndexByte(p.s[p.i:], '}')
	if j < 0 {
		return 0, 0, false, nil
	}
	body := p.s[p.i+1 : p.i+j]
	lo, hi, comma := body, "", false
	if k := strings.IndexByte(body, ','); k >= 0 {
		lo, hi, comma = body[:k], body[k+1:], true
	}
	num := func(s string) (int, bool) {
		if s == "" || len(s) > 9 {
			return 0, false
		}
		for _, c := range s {
			if c < '0' || c > '9' {
				return 0, false
			}
		}
		n, _ := strconv.Atoi(s)
		return n, true
	}
	n, ok := num(lo)
	if !ok {
		return 0, 0, false, nil
	}
	m := n
	if comma {
		if hi == "" {
			m = -1
		} else if m, ok = num(hi); !ok {
			return 0, 0, false, nil
		}
	}
	if n > maxRepeatCount || m > maxRepeatCount {
		return 0, 0, false, p.fail("repetition count over %d", maxRepeatCount)
	}
	if m >= 0 && m < n {
		return 0, 0, false, p.fail("repetition {%d,%d} has its maximum below its minimum", n, m)
	}
	p.i += j + 1
	return n, m, true, nil
}

// atom reads a character, class, group or escape.
func (p *reParser) atom() (*reNode, error) {
	c := p.s[p.i]
	switch c {
	case '(':
		p.i++
		if strings.HasPrefix(p.s[p.i:], "?") {
			switch {
			case strings.HasPrefix(p.s[p.i:], "?:"):
				p.i += 2
			case strings.HasPrefix(p.s[p.i:], "?P<"), strings.HasPrefix(p.s[p.i:], "?<") &&
				!strings.HasPrefix(p.s[p.i:], "?<=") && !strings.HasPrefix(p.s[p.i:], "?<!"):
				j := strings.IndexByte(p.s[p.i:], '>')
				if j < 0 {
					return nil, p.fail("unterminated group name")
				}
				p.i += j + 1
			case strings.HasPrefix(p.s[p.i:], "?="), strings.HasPrefix(p.s[p.i:], "?!"),
				strings.HasPrefix(p.s[p.i:], "?<="), strings.HasPrefix(p.s[p.i:], "?<!"):
				return nil, p.fail("lookaround is not supported")
			default:
				return nil, p.fail("group flags (?%c…) are not supported", p.s[min(p.i+1, len(p.s)-1)])
			}
		}
		n, err := p.alt()
		if err != nil {
			return nil, err
		}
		if p.i >= len(p.s) || p.s[p.i] != ')' {
			return nil, p.fail("missing )")
		}
		p.i++
		return n, nil
	case ')':
		return nil, p.fail("unmatched )")
	case '[':
		return p.class()
	case '.':
		p.i++
		return &reNode{op: reClass, ranges: negateRanges([]runeRange{{'\n', '\n'}})}, nil
	case '^', '$':
		return nil, p.fail("anchor %q is supported only at the pattern's ends", c)
	case '*', '+', '?':
		return nil, p.fail("quantifier %q with nothing before it", c)
	case '\\':
		rs, err := p.escape(false)
		if err != nil {
			return nil, err
		}
		return &reNode{op: reClass, ranges: rs}, nil
	}
	r, size := utf8.DecodeRuneInString(p.s[p.i:])
	p.i += size
	return &reNode{op: reClass, ranges: []runeRange{{r, r}}}, nil
}

// Perl classes.
var (
	digitRanges = []runeRange{{'0', '9'}}
	wordRanges  = []runeRange{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}
	spaceRanges = []runeRange{{'\t', '\r'}, {' ', ' '}}
)

// escape reads a backslash escape (p.i at the backslash) as characters.
func (p *reParser) escape(inClass bool) ([]runeRange, error) {
	if p.i+1 >= len(p.s) {
		return nil, p.fail("trailing backslash")
	}
	c := p.s[p.i+1]
	p.i += 2
	one := func(r rune) []runeRange { return []runeRange{{r, r}} }
	switch c {
	case 'd':
		return digitRanges, nil
	case 'D':
		return negateRanges(digitRanges), nil
	case 'w':
		return wordRanges, nil
	case 'W':
		return negateRanges(wordRanges), nil
	case 's':
		return spaceRanges, nil
	case 'S':
		return negateRanges(spaceRanges), nil
	case 'n':
		return one('\n'), nil
	case 't':
		return one('\t'), nil
	case 'r':
		return one('\r'), nil
	case 'f':
		return one('\f'), nil
	case 'v':
		return one('\v'), nil
	case '0':
		return one(0), nil
	case 'x':
		return p.hexEscape(2)
	case 'u':
		if p.i < len(p.s) && p.s[p.i] == '{' {
			j := strings.IndexByte(p.s[p.i:], '}')
			if j < 2 || j > 9 {
				return nil, p.fail("bad \\u{…} escape")
			}
			v, err := strconv.ParseUint(p.s[p.i+1:p.i+j], 16, 32)
			if err != nil || v > utf8.MaxRune {
				return nil, p.fail("bad \\u{…} escape")
			}
			p.i += j + 1
			return one(rune(v)), nil
		}
		return p.hexEscape(4)
	case 'b':
		if inClass {
			return one('\b'), nil
		}
		return nil, p.fail("word boundaries (\\b) are not supported")
	case 'B', 'A', 'z', 'Z', 'G':
		return nil, p.fail("the assertion \\%c is not supported", c)
	case 'p', 'P':
		return nil, p.fail("Unicode property classes (\\%c{…}) are not supported", c)
	case 'k':
		return nil, p.fail("backreferences are not supported")
	}
	if c >= '1' && c <= '9' {
		return nil, p.fail("backreferences are not supported")
	}
	if c >= 0x80 || c < 0x20 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') {
		return nil, p.fail("unknown escape \\%c", c)
	}
	return one(rune(c)), nil
}

// hexEscape reads n hex digits.
func (p *reParser) hexEscape(n int) ([]runeRange, error) {
	if p.i+n > len(p.s) {
		return nil, p.fail("short hex escape")
	}
	v, err := strconv.ParseUint(p.s[p.i:p.i+n], 16, 32)
	if err != nil {
		return nil, p.fail("bad hex escape %q", p.s[p.i:p.i+n])
	}
	p.i += n
	return []runeRange{{rune(v), rune(v)}}, nil
}

// class reads [...].
func (p *reParser) class() (*reNode, error) {
	start := p.i
	p.i++
	neg := false
	if p.i < len(p.s) && p.s[p.i] == '^' {
		neg = true
		p.i++
	}
	var rs []runeRange
	first := true
	for {
		if p.i >= len(p.s) {
			p.i = start
			return nil, p.fail("missing ]")
		}
		c := p.s[p.i]
		if c == ']' && !first {
			p.i++
			break
		}
		first = false
		if strings.HasPrefix(p.s[p.i:], "[:") {
			return nil, p.fail("POSIX classes ([:name:]) are not supported")
		}
		lo, set, err := p.classChar()
		if err != nil {
			return nil, err
		}
		if set != nil {
			rs = append(rs, set...)
			continue
		}
		hi := lo
		if p.i+1 < len(p.s) && p.s[p.i] == '-' && p.s[p.i+1] != ']' {
			p.i++
			var hs []runeRange
			hi, hs, err = p.classChar()
			if err != nil {
				return nil, err
			}
			if hs != nil {
				return nil, p.fail("a range cannot end in a class escape")
			}
			if hi < lo {
				return nil, p.fail("range %q-%q is backwards", lo, hi)
			}
		}
		rs = append(rs, runeRange{lo, hi})
	}
	if neg {
		rs = negateRanges(rs)
	}
	return &reNode{op: reClass, ranges: normRanges(rs)}, nil
}

// classChar reads one character of a class, or a class escape (set).
func (p *reParser) classChar() (rune, []runeRange, error) {
	if p.s[p.i] == '\\' {
		rs, err := p.escape(true)
		if err != nil {
			return 0, nil, err
		}
		if len(rs) == 1 && rs[0].lo == rs[0].hi {
			return rs[0].lo, nil, nil
		}
		return 0, rs, nil
	}
	r, size := utf8.DecodeRuneInString(p.s[p.i:])
	p.i += size
	return r, nil, nil
}

// lower turns a regex into an expression; chars builds a character class's
// expression (plain UTF-8, or a JSON string's escaped forms).
func (n *reNode) lower(chars func([]runeRange) *expr) *expr {
	switch n.op {
	case reEmpty:
		return emptyExpr
	case reClass:
		return chars(n.ranges)
	case reConcat:
		parts := make([]*expr, len(n.kids))
		for i, k := range n.kids {
			parts[i] = k.lower(chars)
		}
		return seq(parts...)
	case reAlt:
		parts := make([]*expr, len(n.kids))
		for i, k := range n.kids {
			parts[i] = k.lower(chars)
		}
		return alt(parts...)
	case reRepeat:
		return repeat(n.kids[0].lower(chars), n.min, n.max)
	}
	return noneExpr
}

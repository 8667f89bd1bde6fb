package guide

import (
	"sort"
	"unicode/utf8"
)

// Every constraint becomes a grammar: named rules whose bodies are expressions over
// bytes (characters are their UTF-8 byte sequences) and references to rules. The
// regular-expression, EBNF and JSON-schema front ends build these expressions; the
// compiler (compile.go) turns the grammar into automata.

// exprKind says what an expression matches.
type exprKind uint8

const (
	// exprEmpty matches the empty string.
	exprEmpty exprKind = iota
	// exprNone matches nothing.
	exprNone
	// exprByte matches one byte in [lo, hi].
	exprByte
	// exprSeq matches its parts one after the other.
	exprSeq
	// exprAlt matches any one of its parts.
	exprAlt
	// exprRepeat matches its part min to max times (max < 0: no limit).
	exprRepeat
	// exprRef matches the rule numbered rule.
	exprRef
)

// expr is a node of a rule's body. Expressions are never changed once built, so
// subtrees may be shared.
type expr struct {
	kind exprKind
	// lo and hi bound an exprByte.
	lo, hi byte
	// min and max bound an exprRepeat.
	min, max int
	// rule is an exprRef's rule.
	rule int
	// kids are the parts of exprSeq and exprAlt, the repeated part of exprRepeat.
	kids []*expr
}

var (
	emptyExpr = &expr{kind: exprEmpty}
	noneExpr  = &expr{kind: exprNone}
)

// byteRange matches one byte in [lo, hi].
func byteRange(lo, hi byte) *expr { return &expr{kind: exprByte, lo: lo, hi: hi} }

// seq matches the parts in order.
func seq(parts ...*expr) *expr {
	var out []*expr
	for _, p := range parts {
		switch p.kind {
		case exprEmpty:
			continue
		case exprNone:
			return noneExpr
		case exprSeq:
			out = append(out, p.kids...)
			continue
		}
		out = append(out, p)
	}
	switch len(out) {
	case 0:
		return emptyExpr
	case 1:
		return out[0]
	}
	return &expr{kind: exprSeq, kids: out}
}

// alt matches any one of the parts.
func alt(parts ...*expr) *expr {
	var out []*expr
	for _, p := range parts {
		switch p.kind {
		case exprNone:
			continue
		case exprAlt:
			out = append(out, p.kids...)
			continue
		}
		out = append(out, p)
	}
	switch len(out) {
	case 0:
		return noneExpr
	case 1:
		return out[0]
	}
	return &expr{kind: exprAlt, kids: out}
}

// repeat matches e min to max times (max < 0: any number).
func repeat(e *expr, min, max int) *expr {
	switch {
	case max >= 0 && max < min:
		return noneExpr
	case max == 0:
		return emptyExpr
	case min == 1 && max == 1:
		return e
	case e.kind == exprEmpty:
		return emptyExpr
	case e.kind == exprNone:
		if min == 0 {
			return emptyExpr
		}
		return noneExpr
	}
	return &expr{kind: exprRepeat, min: min, max: max, kids: []*expr{e}}
}

// opt matches e or nothing.
func opt(e *expr) *expr { return repeat(e, 0, 1) }

// ref matches rule i.
func ref(i int) *expr { return &expr{kind: exprRef, rule: i} }

// lit matches the bytes of s.
func lit(s string) *expr {
	parts := make([]*expr, len(s))
	for i := range len(s) {
		parts[i] = byteRange(s[i], s[i])
	}
	return seq(parts...)
}

// runeRange is a range of code points [lo, hi].
type runeRange struct{ lo, hi rune }

// anyChar is every Unicode scalar value.
var anyChar = []runeRange{{0, 0xD7FF}, {0xE000, utf8.MaxRune}}

// normRanges sorts and merges ranges, dropping the surrogates (not encodable in UTF-8).
func normRanges(rs []runeRange) []runeRange {
	var in []runeRange
	for _, r := range rs {
		if r.lo > r.hi || r.hi < 0 || r.lo > utf8.MaxRune {
			continue
		}
		r.lo, r.hi = max(r.lo, 0), min(r.hi, utf8.MaxRune)
		// Cut the surrogate block out.
		if r.lo <= 0xDFFF && r.hi >= 0xD800 {
			if r.lo < 0xD800 {
				in = append(in, runeRange{r.lo, 0xD7FF})
			}
			if r.hi > 0xDFFF {
				in = append(in, runeRange{0xE000, r.hi})
			}
			continue
		}
		in = append(in, r)
	}
	sort.Slice(in, func(i, j int) bool { return in[i].lo < in[j].lo })
	var out []runeRange
	for _, r := range in {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// negateRanges is the code points not in rs (rs normalized).
func negateRanges(rs []runeRange) []runeRange {
	var out []runeRange
	next := rune(0)
	for _, r := range normRanges(rs) {
		if r.lo > next {
			out = append(out, runeRange{next, r.lo - 1})
		}
		next = r.hi + 1
	}
	if next <= utf8.MaxRune {
		out = append(out, runeRange{next, utf8.MaxRune})
	}
	return normRanges(out)
}

// charClass matches one character in rs: the UTF-8 encodings of the ranges, as an
// alternation of byte-range sequences.
func charClass(rs []runeRange) *expr {
	var parts []*expr
	for _, r := range normRanges(rs) {
		parts = utf8Seqs(parts, r.lo, r.hi)
	}
	return alt(parts...)
}

// utf8Bounds are the largest code points of each UTF-8 length.
var utf8Bounds = [4]rune{0x7F, 0x7FF, 0xFFFF, utf8.MaxRune}

// utf8Seqs appends the byte-range sequences matching the UTF-8 encodings of [lo, hi]
// (no surrogates inside): the range is split by encoded length, then where its ends'
// continuation bytes do not span their whole range.
func utf8Seqs(out []*expr, lo, hi rune) []*expr {
	for n, bound := range utf8Bounds {
		start := rune(0)
		if n > 0 {
			start = utf8Bounds[n-1] + 1
		}
		if hi < start || lo > bound {
			continue
		}
		out = utf8SameLen(out, max(lo, start), min(hi, bound))
	}
	return out
}

// utf8SameLen handles a range whose ends encode to the same length.
func utf8SameLen(out []*expr, lo, hi rune) []*expr {
	var a, b [4]byte
	n := utf8.EncodeRune(a[:], lo)
	utf8.EncodeRune(b[:], hi)
	if n == 1 {
		return append(out, byteRange(a[0], b[0]))
	}
	// Split until, byte by byte, the encodings of the range form a product of byte
	// ranges: where lo and hi differ above a continuation byte, lo's lower bits must be
	// all zero and hi's all one.
	for i := 1; i < n; i++ {
		m := rune(1)<<(6*i) - 1
		if lo&^m != hi&^m {
			if lo&m != 0 {
				out = utf8SameLen(out, lo, lo|m)
				return utf8SameLen(out, (lo|m)+1, hi)
			}
			if hi&m != m {
				out = utf8SameLen(out, lo, (hi&^m)-1)
				return utf8SameLen(out, hi&^m, hi)
			}
		}
	}
	parts := make([]*expr, n)
	for i := range n {
		parts[i] = byteRange(a[i], b[i])
	}
	return append(out, seq(parts...))
}

package guide

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// EBNF grammars in the GBNF dialect llama.cpp and xgrammar read:
//
//	root   ::= "{" ws pair ("," ws pair)* "}"
//	pair   ::= name ":" ws [0-9]+ ws      # comments run to the end of the line
//	name   ::= "\"" [a-z_]+ "\""
//	ws     ::= [ \t\n]*
//
// A rule is `name ::= alternatives`; alternatives are separated by |, and are
// sequences of elements: "strings" (or 'strings') with \n \t \r \\ \" \' \xHH \uHHHH
// \UHHHHHHHH escapes, [classes] (ranges, ^ negation, the same escapes), . for any
// character, rule names, ( groups ), each followed by * + ? {m} {m,} or {m,n}. A rule
// ends where the next `name ::=` starts. The rule named root is the start; the text
// must match it whole. Recursion is allowed, left recursion is not. gollm adds one
// element: `%json {…}`, the JSON texts a JSON schema accepts (the schema written
// inline), so that a grammar can put JSON inside other text (tool calls).

// maxGrammarBytes bounds a grammar's text.
const maxGrammarBytes = 256 << 10

// maxGrammarRules bounds its rules.
const maxGrammarRules = 10000

// ebnfParser reads a grammar.
type ebnfParser struct {
	s string
	i int
	// rules maps names to indexes; def collects the bodies.
	rules map[string]int
	def   grammarDef
	// defined marks the rules given a body (a second definition is an error).
	defined []bool
	depth   int
}

// GrammarError is a grammar's syntax error with its position.
type GrammarError struct {
	// Line and Col are 1-based.
	Line, Col int
	// Msg says what is wrong.
	Msg string
}

func (e *GrammarError) Error() string {
	return fmt.Sprintf("grammar: line %d, column %d: %s", e.Line, e.Col, e.Msg)
}

func (p *ebnfParser) fail(format string, args ...any) error {
	line := 1 + strings.Count(p.s[:p.i], "\n")
	col := p.i - strings.LastIndex(p.s[:p.i], "\n")
	return &GrammarError{line, col, fmt.Sprintf(format, args...)}
}

// CompileEBNF compiles a grammar in the GBNF dialect (see above).
func CompileEBNF(src string) (*Grammar, error) {
	def, err := parseEBNF(src)
	if err != nil {
		return nil, err
	}
	g, err := newGrammar(def, "ebnf_grammar", src, DefaultLimits)
	if err != nil {
		return nil, fmt.Errorf("grammar: %w", err)
	}
	return g, nil
}

// parseEBNF reads a grammar's rules.
func parseEBNF(src string) (*grammarDef, error) {
	if len(src) > maxGrammarBytes {
		return nil, fmt.Errorf("grammar: %d bytes; the most is %d", len(src), maxGrammarBytes)
	}
	if !utf8.ValidString(src) {
		return nil, fmt.Errorf("grammar: not valid UTF-8")
	}
	p := &ebnfParser{s: src, rules: map[string]int{}}
	p.skip()
	if p.i == len(p.s) {
		return nil, p.fail("the grammar is empty")
	}
	for p.i < len(p.s) {
		name, ok := p.name()
		if !ok {
			return nil, p.fail("expected a rule name")
		}
		p.skip()
		if !strings.HasPrefix(p.s[p.i:], "::=") {
			return nil, p.fail("expected ::= after %q", name)
		}
		p.i += 3
		r := p.rule(name)
		if p.defined[r] {
			return nil, p.fail("rule %q is defined twice", name)
		}
		p.defined[r] = true
		body, err := p.alternatives()
		if err != nil {
			return nil, err
		}
		p.def.bodies[r] = body
		p.skip()
		if p.i < len(p.s) && p.s[p.i] == ')' {
			return nil, p.fail("unmatched )")
		}
	}
	root, ok := p.rules["root"]
	if !ok {
		return nil, fmt.Errorf("grammar: no rule named root (the start rule)")
	}
	for r, body := range p.def.bodies {
		if body == nil {
			return nil, fmt.Errorf("grammar: rule %q is used but not defined", p.def.names[r])
		}
	}
	p.def.root = root
	return &p.def, nil
}

// rule returns a name's index, adding it.
func (p *ebnfParser) rule(name string) int {
	if r, ok := p.rules[name]; ok {
		return r
	}
	r := len(p.def.names)
	p.rules[name] = r
	p.def.names = append(p.def.names, name)
	p.def.bodies = append(p.def.bodies, nil)
	p.defined = append(p.defined, false)
	return r
}

// skip passes spaces and comments.
func (p *ebnfParser) skip() {
	for p.i < len(p.s) {
		switch c := p.s[p.i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			p.i++
		case c == '#':
			for p.i < len(p.s) && p.s[p.i] != '\n' {
				p.i++
			}
		default:
			return
		}
	}
}

// isNameByte says c may be part of a rule name.
func isNameByte(c byte) bool {
	return c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// name reads a rule name.
func (p *ebnfParser) name() (string, bool) {
	j := p.i
	for j < len(p.s) && isNameByte(p.s[j]) {
		j++
	}
	if j == p.i {
		return "", false
	}
	n := p.s[p.i:j]
	p.i = j
	return n, true
}

// atRuleStart says a new rule (`name ::=`) starts at p.i.
func (p *ebnfParser) atRuleStart() bool {
	j := p.i
	for j < len(p.s) && isNameByte(p.s[j]) {
		j++
	}
	if j == p.i {
		return false
	}
	for j < len(p.s) && (p.s[j] == ' ' || p.s[j] == '\t' || p.s[j] == '\n' || p.s[j] == '\r') {
		j++
	}
	return strings.HasPrefix(p.s[j:], "::=")
}

// maxGrammarDepth bounds nested groups.
const maxGrammarDepth = 200

// alternatives reads sequences separated by |.
func (p *ebnfParser) alternatives() (*expr, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxGrammarDepth {
		return nil, p.fail("groups nest deeper than %d", maxGrammarDepth)
	}
	var alts []*expr
	for {
		s, err := p.sequence()
		if err != nil {
			return nil, err
		}
		alts = append(alts, s)
		p.skip()
		if p.i < len(p.s) && p.s[p.i] == '|' {
			p.i++
			continue
		}
		return alt(alts...), nil
	}
}

// sequence reads elements up to |, ), the next rule or the end.
func (p *ebnfParser) sequence() (*expr, error) {
	var parts []*expr
	for {
		p.skip()
		if p.i >= len(p.s) || p.s[p.i] == '|' || p.s[p.i] == ')' || p.atRuleStart() {
			return seq(parts...), nil
		}
		e, err := p.element()
		if err != nil {
			return nil, err
		}
		if e, err = p.postfix(e); err != nil {
			return nil, err
		}
		parts = append(parts, e)
	}
}

// postfix reads the repetition operators after an element.
func (p *ebnfParser) postfix(e *expr) (*expr, error) {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case '*':
			p.i++
			e = repeat(e, 0, -1)
		case '+':
			p.i++
			e = repeat(e, 1, -1)
		case '?':
			p.i++
			e = opt(e)
		case '{':
			j := strings.IndexByte(p.s[p.i:], '}')
			if j < 0 {
				return nil, p.fail("missing } in a repetition")
			}
			body := strings.ReplaceAll(p.s[p.i+1:p.i+j], " ", "")
			lo, hi, comma := body, "", false
			if k := strings.IndexByte(body, ','); k >= 0 {
				lo, hi, comma = body[:k], body[k+1:], true
			}
			n, err := strconv.Atoi(lo)
			if err != nil || n < 0 || n > maxRepeatCount {
				return nil, p.fail("bad repetition {%s}", body)
			}
			m := n
			if comma {
				m = -1
				if hi != "" {
					if m, err = strconv.Atoi(hi); err != nil || m < n || m > maxRepeatCount {
						return nil, p.fail("bad repetition {%s}", body)
					}
				}
			}
			p.i += j + 1
			e = repeat(e, n, m)
		default:
			return e, nil
		}
	}
	return e, nil
}

// element reads a string, class, ., group or rule name.
func (p *ebnfParser) element() (*expr, error) {
	switch c := p.s[p.i]; {
	case c == '"' || c == '\'':
		return p.str(c)
	case c == '[':
		rs, err := p.class()
		if err != nil {
			return nil, err
		}
		return charClass(rs), nil
	case c == '.':
		p.i++
		return charClass(anyChar), nil
	case c == '(':
		p.i++
		e, err := p.alternatives()
		if err != nil {
			return nil, err
		}
		p.skip()
		if p.i >= len(p.s) || p.s[p.i] != ')' {
			return nil, p.fail("missing )")
		}
		p.i++
		return e, nil
	case c == '%' && strings.HasPrefix(p.s[p.i:], "%json"):
		return p.jsonSchema()
	case isNameByte(c):
		name, _ := p.name()
		if len(p.def.names) >= maxGrammarRules {
			return nil, p.fail("more than %d rules", maxGrammarRules)
		}
		return ref(p.rule(name)), nil
	}
	return nil, p.fail("unexpected %q", p.s[p.i])
}

// jsonSchema reads gollm's extension `%json SCHEMA`: the JSON texts a JSON schema (a
// JSON object written in the grammar) accepts, compiled into the grammar's own rules.
func (p *ebnfParser) jsonSchema() (*expr, error) {
	p.i += len("%json")
	p.skip()
	dec := json.NewDecoder(strings.NewReader(p.s[p.i:]))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, p.fail("%%json needs a JSON schema after it: %v", err)
	}
	text := string(raw)
	p.i += int(dec.InputOffset())
	b := newJSBuilder(DefaultJSONOptions)
	b.def = &p.def
	doc, err := b.decodeSchema(text)
	if err != nil {
		return nil, err
	}
	b.doc = doc
	e, err := b.value(doc, "", 0)
	if err != nil {
		return nil, err
	}
	for len(p.defined) < len(p.def.names) {
		p.defined = append(p.defined, true) // the schema's rules are defined
	}
	return e, nil
}

// escaped reads an escape after a backslash (p.i past it).
func (p *ebnfParser) escaped() (rune, error) {
	if p.i >= len(p.s) {
		return 0, p.fail("trailing backslash")
	}
	c := p.s[p.i]
	p.i++
	hex := func(n int) (rune, error) {
		if p.i+n > len(p.s) {
			return 0, p.fail("short \\%c escape", c)
		}
		v, err := strconv.ParseUint(p.s[p.i:p.i+n], 16, 32)
		if err != nil || v > utf8.MaxRune {
			return 0, p.fail("bad \\%c escape", c)
		}
		p.i += n
		return rune(v), nil
	}
	switch c {
	case 'n':
		return '\n', nil
	case 't':
		return '\t', nil
	case 'r':
		return '\r', nil
	case '0':
		return 0, nil
	case 'x':
		return hex(2)
	case 'u':
		return hex(4)
	case 'U':
		return hex(8)
	case '\\', '"', '\'', '[', ']', '-', '^', '/':
		return rune(c), nil
	}
	return 0, p.fail("unknown escape \\%c", c)
}

// str reads a quoted string.
func (p *ebnfParser) str(q byte) (*expr, error) {
	start := p.i
	p.i++
	var sb strings.Builder
	for {
		if p.i >= len(p.s) {
			p.i = start
			return nil, p.fail("unterminated string")
		}
		c := p.s[p.i]
		switch {
		case c == q:
			p.i++
			return lit(sb.String()), nil
		case c == '\\':
			p.i++
			r, err := p.escaped()
			if err != nil {
				return nil, err
			}
			sb.WriteRune(r)
		default:
			r, size := utf8.DecodeRuneInString(p.s[p.i:])
			p.i += size
			sb.WriteRune(r)
		}
	}
}

// class reads [...] as character ranges.
func (p *ebnfParser) class() ([]runeRange, error) {
	start := p.i
	p.i++
	neg := false
	if p.i < len(p.s) && p.s[p.i] == '^' {
		neg = true
		p.i++
	}
	var rs []runeRange
	read := func() (rune, error) {
		if p.s[p.i] == '\\' {
			p.i++
			return p.escaped()
		}
		r, size := utf8.DecodeRuneInString(p.s[p.i:])
		p.i += size
		return r, nil
	}
	for {
		if p.i >= len(p.s) {
			p.i = start
			return nil, p.fail("missing ]")
		}
		if p.s[p.i] == ']' {
			p.i++
			break
		}
		lo, err := read()
		if err != nil {
			return nil, err
		}
		hi := lo
		if p.i+1 < len(p.s) && p.s[p.i] == '-' && p.s[p.i+1] != ']' {
			p.i++
			if hi, err = read(); err != nil {
				return nil, err
			}
			if hi < lo {
				return nil, p.fail("range %q-%q is backwards", lo, hi)
			}
		}
		rs = append(rs, runeRange{lo, hi})
	}
	if neg {
		return negateRanges(rs), nil
	}
	return normRanges(rs), nil
}

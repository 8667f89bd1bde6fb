package guide

import (
	"errors"
	"fmt"
	"sync"
)

// Grammar is a constraint compiled into automata over bytes, for any vocabulary.
type Grammar struct {
	// def is the grammar before compilation (kept to compile the first-token variant).
	def *grammarDef
	// lim are the limits it was compiled under.
	lim Limits
	// kind and source describe it.
	kind, source string
	// plain is the program; spaced is the one whose text may start with a space a
	// first token's decoding drops (compiled when a vocabulary needs it).
	plain      *program
	spacedOnce sync.Once
	spaced     *program
	spacedErr  error
	// mu guards guides, the guides by vocabulary.
	mu     sync.Mutex
	guides map[uint64]*Guide
}

// Kind names the constraint's kind ("json_schema", "regex", …).
func (gr *Grammar) Kind() string { return gr.kind }

// States is the number of automaton states.
func (gr *Grammar) States() int { return len(gr.plain.accept) }

// Regular says the grammar has no recursion left: one automaton, masks are table
// lookups.
func (gr *Grammar) Regular() bool { return !gr.plain.hasCalls }

// newGrammar compiles def.
func newGrammar(def *grammarDef, kind, source string, lim Limits) (*Grammar, error) {
	p, err := compile(def, lim)
	if err != nil {
		return nil, err
	}
	return &Grammar{def: def, lim: lim, kind: kind, source: source, plain: p, guides: map[uint64]*Guide{}}, nil
}

// Bind returns the guide of the grammar over v (made once per vocabulary).
func (gr *Grammar) Bind(v *Vocab) (*Guide, error) {
	gr.mu.Lock()
	g := gr.guides[v.id]
	gr.mu.Unlock()
	if g != nil {
		return g, nil
	}
	p := gr.plain
	if v.firstDropsSpace {
		gr.spacedOnce.Do(func() {
			// root' ::= " "? root: the space a first token's decoding drops.
			d := *gr.def
			d.names = append(append([]string{}, d.names...), "(first token's space)")
			d.bodies = append(append([]*expr{}, d.bodies...), seq(opt(lit(" ")), ref(d.root)))
			d.root = len(d.bodies) - 1
			gr.spaced, gr.spacedErr = compile(&d, gr.lim)
		})
		if gr.spacedErr != nil {
			return nil, gr.spacedErr
		}
		p = gr.spaced
	}
	g = newGuide(p, v, gr.source)
	gr.mu.Lock()
	defer gr.mu.Unlock()
	if old := gr.guides[v.id]; old != nil {
		return old, nil
	}
	gr.guides[v.id] = g
	return g, nil
}

// CompileRegex compiles a regular expression the whole text must match.
func CompileRegex(pattern string) (*Grammar, error) {
	return compileRegex(pattern, DefaultLimits)
}

func compileRegex(pattern string, lim Limits) (*Grammar, error) {
	n, err := parseRegex(pattern)
	if err != nil {
		return nil, err
	}
	def := &grammarDef{names: []string{"regex"}, bodies: []*expr{n.lower(charClass)}}
	g, err := newGrammar(def, "regex", pattern, lim)
	if err != nil {
		return nil, fmt.Errorf("regex: %w", err)
	}
	return g, nil
}

// maxChoices bounds a choice list.
const maxChoices = 10000

// CompileChoice compiles a list of strings, one of which the whole text must be.
func CompileChoice(choices []string) (*Grammar, error) {
	if len(choices) == 0 {
		return nil, errors.New("choice: the list is empty")
	}
	if len(choices) > maxChoices {
		return nil, fmt.Errorf("choice: %d choices; the most is %d", len(choices), maxChoices)
	}
	parts := make([]*expr, len(choices))
	total := 0
	for i, c := range choices {
		total += len(c)
		if total > maxRegexBytes*4 {
			return nil, fmt.Errorf("choice: the choices hold more than %d bytes", maxRegexBytes*4)
		}
		parts[i] = lit(c)
	}
	def := &grammarDef{names: []string{"choice"}, bodies: []*expr{alt(parts...)}}
	g, err := newGrammar(def, "choice", fmt.Sprintf("%q", choices), DefaultLimits)
	if err != nil {
		return nil, fmt.Errorf("choice: %w", err)
	}
	return g, nil
}

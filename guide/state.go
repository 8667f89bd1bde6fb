package guide

import (
	"fmt"
	"math/bits"
	"slices"
)

// The run time: a sequence's place in its constraint is a set of stacks (one, unless
// the grammar is ambiguous there), each a chain of frames — an automaton state over the
// return states of the calls that led to it. States are values that are never changed:
// advancing makes a new one, so beams and sampled sequences share what they have in
// common.

// frame is one level of a stack.
type frame struct {
	// state is the automaton state.
	state int32
	// up is the frame beneath (nil at the root); its state is the return state.
	up *frame
	// rest is the fewest bytes that finish this frame and every one beneath.
	rest int32
	// depth counts the frames beneath.
	depth int32
	// hash identifies the chain.
	hash uint64
}

// newFrame stacks state over up.
func (p *program) newFrame(state int32, up *frame) *frame {
	f := &frame{state: state, up: up, rest: p.rest[state], hash: uint64(uint32(state))*0x9e3779b97f4a7c15 + 1}
	if up != nil {
		f.rest += up.rest
		f.depth = up.depth + 1
		f.hash ^= up.hash*1099511628211 + 0x632be59bd9b4e019
	}
	return f
}

// sameFrames says two chains hold the same states.
func sameFrames(a, b *frame) bool {
	for a != b {
		if a == nil || b == nil || a.state != b.state || a.hash != b.hash || a.depth != b.depth {
			return false
		}
		a, b = a.up, b.up
	}
	return true
}

// State is a sequence's place in its constraint.
type State struct {
	// g is the guide.
	g *Guide
	// tops are the live stacks (each can read a byte or return).
	tops []*frame
	// accept says the text may end here.
	accept bool
	// first says no token has been read (the vocabulary's first-token rules apply).
	first bool
}

// closer closes a set of stacks over the calls and returns that read no byte.
type closer struct {
	p      *program
	seen   []*frame
	out    []*frame
	accept bool
	err    error
}

// visit adds f and what it reaches without a byte.
func (c *closer) visit(f *frame) {
	if c.err != nil {
		return
	}
	for _, s := range c.seen {
		if sameFrames(s, f) {
			return
		}
	}
	switch {
	case len(c.seen) >= maxConfigs:
		c.err = errAmbiguous
		return
	case f.depth > maxDepth:
		c.err = errTooDeep
		return
	}
	c.seen = append(c.seen, f)
	p := c.p
	q := f.state
	if p.hasBytes[q] || p.accept[q] {
		c.out = append(c.out, f)
	}
	for _, ce := range p.calls[q] {
		c.visit(p.newFrame(p.start[ce.rule], p.newFrame(ce.ret, f.up)))
	}
	if p.accept[q] {
		if f.up == nil {
			c.accept = true
		} else {
			c.visit(f.up)
		}
	}
}

// Start is the state before any token.
func (g *Guide) Start() (State, error) {
	c := closer{p: g.p}
	c.visit(g.p.newFrame(g.p.root, nil))
	if c.err != nil {
		return State{}, c.err
	}
	return State{g: g, tops: c.out, accept: c.accept, first: true}, nil
}

// Accepting says the constrained text may end here (an end token is allowed).
func (s State) Accepting() bool { return s.accept }

// Done says the constrained text is complete: nothing may follow it.
func (s State) Done() bool {
	for _, f := range s.tops {
		if s.g.p.hasBytes[f.state] {
			return false
		}
	}
	return true
}

// Valid says s is a state of a guide (not the zero State).
func (s State) Valid() bool { return s.g != nil }

// Advance is the state after token tok; an error when the constraint does not allow it.
func (s State) Advance(tok int32) (State, error) {
	g := s.g
	if tok < 0 || int(tok) >= g.v.size || g.v.bytes[tok] == nil {
		return State{}, fmt.Errorf("token %d has no text the constraint can read", tok)
	}
	if s.first {
		if _, found := slices.BinarySearch(g.v.firstDiffers, tok); found {
			return State{}, fmt.Errorf("token %d may not start the text", tok)
		}
	}
	p := g.p
	b := g.v.bytes[tok]
	if !p.hasCalls && len(s.tops) == 1 {
		q := s.tops[0].state
		for _, c := range b {
			if q = p.step(q, c); q < 0 {
				return State{}, fmt.Errorf("token %d (%q) is not allowed here", tok, b)
			}
		}
		return State{g: g, tops: []*frame{p.newFrame(q, nil)}, accept: p.accept[q]}, nil
	}
	cur := s.tops
	accept := false
	for i, c := range b {
		cl := closer{p: p}
		for _, f := range cur {
			if !p.hasBytes[f.state] {
				continue
			}
			if t := p.step(f.state, c); t >= 0 {
				cl.visit(p.newFrame(t, f.up))
			}
		}
		if cl.err != nil {
			return State{}, cl.err
		}
		if len(cl.out) == 0 {
			return State{}, fmt.Errorf("token %d (%q) is not allowed here (byte %d)", tok, b, i)
		}
		cur, accept = cl.out, cl.accept
	}
	return State{g: g, tops: cur, accept: accept}, nil
}

// Mask sets in dst (v.MaskWords() words, cleared first) the tokens the constraint
// allows next, and returns how many. budget, when not negative, is the number of
// tokens the sequence may still generate, this one included: a token is then allowed
// only if what it leaves unfinished takes at most budget-1 more bytes, so that, one
// byte a token at worst, the text can always be completed in time. End tokens are the
// caller's (allowed when Accepting).
func (s State) Mask(dst []uint64, budget int) (int, error) {
	g := s.g
	clear(dst)
	p := g.p
	var w *walker
	defer func() {
		if w != nil {
			w.out = nil
			g.walkers.Put(w)
		}
	}()
	if budget >= 0 && !s.accept {
		if n, ok, err := s.tooTight(dst, budget); err != nil || ok {
			return n, err
		}
	}
	for _, f := range s.tops {
		if !p.hasBytes[f.state] {
			continue
		}
		t, err := g.table(f.state)
		if err != nil {
			return 0, err
		}
		upRest := int32(0)
		if f.up != nil {
			upRest = f.up.rest
		}
		// limit is the most bytes a token may leave f's frame to finish.
		limit := int64(budget) - 1 - int64(upRest)
		binding := budget >= 0 && int64(t.maxDelta) > limit
		switch {
		case !binding:
			t.orInto(dst)
		case t.exact:
			// The budget from the table: in its own mask when other stacks add tokens
			// too (a cleared bit must not clear theirs).
			m := dst
			if len(s.tops) > 1 {
				m = make([]uint64, len(dst))
			}
			t.applyBudget(m, limit)
			if len(s.tops) > 1 {
				for i, x := range m {
					dst[i] |= x
				}
			}
		}
		if !binding || t.exact {
			if len(t.unc) == 0 || f.up == nil {
				// Nothing returns, or a return ends the text: nothing may follow.
				continue
			}
			binding = false
		}
		if w == nil {
			w = g.walkers.Get().(*walker)
		}
		w.runtime, w.err, w.out = true, nil, dst
		w.budget = -1
		if budget >= 0 {
			w.budget = int32(min(int64(budget)-1, int64(inf)))
		}
		w.st = w.st[:0]
		if binding {
			// Every token from f, each checked against the budget.
			w.start([]int32{f.state}, f.up)
			w.dfs(0, 0)
		} else {
			// The tokens that return from f's rule at node c go on from the caller's
			// frames: start there and walk below each such node.
			lv := w.level(0)
			w.close(lv, []int32{f.up.state}, f.up.up)
			for _, c := range t.unc {
				w.dfs(c, 0)
			}
		}
		if w.err != nil {
			return 0, w.err
		}
	}
	if budget >= 0 && !s.accept && !anyBit(dst) {
		// No token finishes in time (a token budget below what the text needs, at one
		// byte a token): allow those that leave the least to finish. (Where the text may
		// end, the end token is what finishes it.)
		least, err := s.least()
		if err != nil {
			return 0, err
		}
		if least < inf {
			return s.Mask(dst, int(least)+1)
		}
	}
	if s.first {
		for _, id := range g.v.firstDiffers {
			dst[id>>6] &^= 1 << (uint(id) & 63)
		}
	}
	n := 0
	for _, x := range dst {
		n += bits.OnesCount64(x)
	}
	return n, nil
}

// Rest is the fewest bytes that complete the text from s.
func (s State) Rest() int {
	best := inf
	for _, f := range s.tops {
		best = min(best, f.rest)
	}
	if s.accept {
		return 0
	}
	return int(best)
}

// anyBit says a mask allows something.
func anyBit(m []uint64) bool {
	for _, x := range m {
		if x != 0 {
			return true
		}
	}
	return false
}

// least is the fewest bytes a next token can leave to finish the text.
func (s State) least() (int32, error) {
	g := s.g
	w := g.walkers.Get().(*walker)
	defer g.walkers.Put(w)
	scratch := make([]uint64, g.v.words)
	w.runtime, w.err, w.out, w.budget = true, nil, scratch, -1
	w.tracking, w.least = true, inf
	defer func() { w.tracking, w.out = false, nil }()
	for _, f := range s.tops {
		if !g.p.hasBytes[f.state] {
			continue
		}
		w.st = w.st[:0]
		w.start([]int32{f.state}, f.up)
		w.dfs(0, 0)
		if w.err != nil {
			return 0, w.err
		}
	}
	return w.least, nil
}

// tooTight handles, from the tables alone, a budget under which no token fits (each
// leaves more than the tokens left can write, at one byte a token): the tokens that
// leave the least are allowed. ok is false when some token may fit, or when the tables
// cannot tell (a recursive rule's returns, a table without exact deltas): Mask then
// walks.
func (s State) tooTight(dst []uint64, budget int) (int, bool, error) {
	g := s.g
	least := int64(inf)
	ready := 0
	for _, f := range s.tops {
		if !g.p.hasBytes[f.state] {
			continue
		}
		t, err := g.table(f.state)
		if err != nil {
			return 0, false, err
		}
		up := int64(0)
		if f.up != nil {
			up = int64(f.up.rest)
		}
		if len(t.unc) > 0 || !t.exact || int64(t.minDelta) <= int64(budget)-1-up {
			return 0, false, nil
		}
		least = min(least, int64(t.minDelta)+up)
		ready++
	}
	if ready == 0 {
		return 0, false, nil
	}
	for _, f := range s.tops {
		if !g.p.hasBytes[f.state] {
			continue
		}
		t, _ := g.table(f.state)
		up := int64(0)
		if f.up != nil {
			up = int64(f.up.rest)
		}
		if int64(t.minDelta)+up != least {
			continue
		}
		m := dst
		if ready > 1 {
			m = make([]uint64, len(dst))
		}
		t.applyBudget(m, least-up)
		if ready > 1 {
			for i, x := range m {
				dst[i] |= x
			}
		}
	}
	if s.first {
		for _, id := range g.v.firstDiffers {
			dst[id>>6] &^= 1 << (uint(id) & 63)
		}
	}
	n := 0
	for _, x := range dst {
		n += bits.OnesCount64(x)
	}
	return n, n > 0, nil
}

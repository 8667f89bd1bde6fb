package guide

import (
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
)

// Compiling a grammar. Rules that are not recursive are expanded where they are used
// (unless they are large), so a grammar without recursion — every JSON schema without
// a recursive $ref, every regular expression and choice list — becomes one
// deterministic automaton over bytes. A recursive rule keeps its own automaton, entered
// by a call edge and left, when it accepts, back to the caller's return state: the
// grammar becomes a recursive transition network, which the runtime (state.go) runs
// with a stack. Every state is trimmed to those from which its rule can still accept,
// and each knows the fewest bytes that finish its rule, so that a live stack can
// always be completed and the bytes it needs are known (the token budget).

// ErrTooComplex says a constraint's automata would pass the compiler's limits.
var ErrTooComplex = errors.New("constraint too complex")

// ErrMatchesNothing says a constraint admits no text at all.
var ErrMatchesNothing = errors.New("the constraint matches no text")

// Limits bound what compiling one constraint may take.
type Limits struct {
	// NFAStates bounds the states of the expanded rules' automata before they are
	// made deterministic.
	NFAStates int
	// DFAStates bounds the deterministic automata's states, all rules together.
	DFAStates int
	// Work bounds the subset construction's work (NFA states visited).
	Work int
	// InlineSize is the largest rule (in automaton states) expanded where it is used;
	// a larger one that is referenced keeps an automaton of its own.
	InlineSize int
}

// DefaultLimits are the limits every front end uses unless told otherwise: a
// 20-field schema takes a few thousand states; these allow a hundred times that and
// keep a hostile constraint's compile under a second and its tables bounded.
var DefaultLimits = Limits{NFAStates: 1 << 18, DFAStates: 1 << 16, Work: 1 << 25, InlineSize: 4096}

// grammarDef is a grammar before compilation: rule bodies by index.
type grammarDef struct {
	// names name the rules (for errors).
	names []string
	// bodies are the rules' expressions; a nil body is a rule used but never defined.
	bodies []*expr
	// root is the start rule.
	root int
}

// callEdge leaves a state into a rule's automaton; the rule's acceptance returns to ret.
type callEdge struct {
	// rule is the called rule (an index of program.start).
	rule int32
	// ret is the caller's state after the call.
	ret int32
}

// program is a compiled grammar: every called rule's deterministic automaton, with
// one numbering of states.
type program struct {
	// cls maps a byte to its class; bytes of one class behave alike everywhere.
	cls [256]uint8
	// ncls is the number of classes.
	ncls int
	// next is the byte transitions, [state*ncls+class] → state, -1 for none.
	next []int32
	// calls are each state's call edges (nil for none).
	calls [][]callEdge
	// accept says a state accepts its rule.
	accept []bool
	// hasBytes says a state has a byte transition.
	hasBytes []bool
	// rest is the fewest bytes that take a state to its rule's acceptance.
	rest []int32
	// start is each called rule's start state.
	start []int32
	// ruleNames name the called rules.
	ruleNames []string
	// root is the start state of the whole grammar.
	root int32
	// hasCalls says some state has a call edge (the grammar is not regular).
	hasCalls bool
	// maxRest is the largest rest of any state.
	maxRest int32
}

// step is the byte transition of q on b, -1 for none.
func (p *program) step(q int32, b byte) int32 { return p.next[int(q)*p.ncls+int(p.cls[b])] }

// compile turns a grammar definition into a program.
func compile(def *grammarDef, lim Limits) (*program, error) {
	for i, b := range def.bodies {
		if b == nil {
			return nil, fmt.Errorf("rule %q is used but not defined", def.names[i])
		}
	}
	def, called, err := plan(def, lim)
	if err != nil {
		return nil, err
	}
	n := &nfa{lim: lim.NFAStates}
	calledIdx := map[int]int{}
	var order []int
	for r := range def.bodies {
		if called[r] {
			calledIdx[r] = len(order)
			order = append(order, r)
		}
	}
	starts := make([]int32, len(order))
	accepts := make([]int32, len(order))
	for i, r := range order {
		s, a := n.newState(), n.newState()
		starts[i], accepts[i] = s, a
		if err := n.build(def, calledIdx, def.bodies[r], s, a, 0); err != nil {
			return nil, fmt.Errorf("rule %q: %w", def.names[r], err)
		}
	}
	p := &program{}
	p.classes(n)
	d := &determinizer{n: n, p: p, lim: lim, ids: map[string]int32{}}
	p.start = make([]int32, len(order))
	for i, r := range order {
		p.ruleNames = append(p.ruleNames, def.names[r])
		s, err := d.determinize(starts[i], accepts[i])
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", def.names[r], err)
		}
		p.start[i] = s
	}
	p.root = p.start[calledIdx[def.root]]
	if err := p.trim(); err != nil {
		return nil, err
	}
	if err := p.checkLeftRecursion(); err != nil {
		return nil, err
	}
	return p, nil
}

// plan decides which rules keep an automaton of their own — the root, a set of
// recursive rules that breaks every cycle, and large rules used more than once — and
// rewrites the grammar so that as little as possible crosses a call: a recursive
// rule's alternatives that do not recurse (a JSON value's strings, numbers and
// literals) are expanded where the rule is used, and only the others (objects,
// arrays) are called. Each call's end is where a token's bytes may run into the
// caller, which the tables leave to run time (tables.go), so fewer calls make
// cheaper masks.
func plan(def *grammarDef, lim Limits) (*grammarDef, []bool, error) {
	d := &grammarDef{names: slices.Clone(def.names), bodies: slices.Clone(def.bodies), root: def.root}
	R := len(d.bodies)
	refs := refLists(d)
	comp, recursive := components(refs)
	called := make([]bool, R)
	called[d.root] = true
	breakers := cycleBreakers(d, refs, comp, recursive)
	for _, r := range breakers {
		called[r] = true
	}
	// Split the breakers' alternations: the alternatives that stay within the rule's
	// component are called, the others expanded at every use.
	redirect := map[int]*expr{}
	for _, r := range breakers {
		body := d.bodies[r]
		if body.kind != exprAlt {
			continue
		}
		var rec, flat []*expr
		for _, k := range body.kids {
			inComp := false
			walkRefs(k, func(t int) { inComp = inComp || comp[t] == comp[r] })
			if inComp {
				rec = append(rec, k)
			} else {
				flat = append(flat, k)
			}
		}
		if len(rec) == 0 || len(flat) == 0 {
			continue
		}
		nr := len(d.bodies)
		d.names = append(d.names, d.names[r]+" (recursive part)")
		d.bodies = append(d.bodies, alt(rec...))
		called = append(called, true)
		comp = append(comp, comp[r])
		redirect[r] = alt(append(slices.Clone(flat), ref(nr))...)
		if r != d.root {
			called[r] = false
		}
	}
	if len(redirect) > 0 {
		for i, b := range d.bodies {
			d.bodies[i] = rewriteRefs(b, redirect)
		}
	}
	// Large rules used where they are not called keep their own automaton.
	R = len(d.bodies)
	refs = refLists(d)
	size := make([]int, R)
	state := make([]uint8, R) // 0 new, 1 visiting, 2 done
	var visit func(r int)
	visit = func(r int) {
		if state[r] != 0 {
			return
		}
		state[r] = 1
		for _, t := range refs[r] {
			if !called[t] {
				visit(t)
			}
		}
		size[r] = exprSize(d.bodies[r], func(t int) int {
			if called[t] {
				return 1
			}
			return size[t]
		})
		state[r] = 2
		if !called[r] && size[r] > lim.InlineSize {
			called[r] = true
		}
	}
	for r := range R {
		visit(r)
	}
	return d, called, nil
}

// refLists lists each rule's references (each once).
func refLists(d *grammarDef) [][]int {
	refs := make([][]int, len(d.bodies))
	for r, b := range d.bodies {
		seen := map[int]bool{}
		walkRefs(b, func(t int) {
			if !seen[t] {
				seen[t] = true
				refs[r] = append(refs[r], t)
			}
		})
	}
	return refs
}

// rewriteRefs replaces the references to the rules of m by their expressions.
func rewriteRefs(e *expr, m map[int]*expr) *expr {
	if e.kind == exprRef {
		if x, ok := m[e.rule]; ok {
			return x
		}
		return e
	}
	if len(e.kids) == 0 {
		return e
	}
	var kids []*expr
	for i, k := range e.kids {
		nk := rewriteRefs(k, m)
		if nk != k && kids == nil {
			kids = slices.Clone(e.kids[:i])
		}
		if kids != nil {
			kids = append(kids, nk)
		}
	}
	if kids == nil {
		return e
	}
	c := *e
	c.kids = kids
	return &c
}

// cycleBreakers picks, in each recursive component, rules whose calls break every
// cycle: the targets of the back edges of a depth-first walk from the component's
// entries (the root, or the rules referenced from outside it).
func cycleBreakers(d *grammarDef, refs [][]int, comp []int, recursive []bool) []int {
	R := len(refs)
	entry := make([]bool, R)
	entry[d.root] = true
	for r := range R {
		for _, t := range refs[r] {
			if comp[t] != comp[r] {
				entry[t] = true
			}
		}
	}
	state := make([]uint8, R) // 0 new, 1 on the walk's path, 2 done
	isBreaker := make([]bool, R)
	var walk func(r int)
	walk = func(r int) {
		state[r] = 1
		for _, t := range refs[r] {
			if comp[t] != comp[r] {
				continue
			}
			switch state[t] {
			case 0:
				walk(t)
			case 1:
				isBreaker[t] = true
			}
		}
		state[r] = 2
	}
	for pass := range 2 {
		for r := range R {
			if state[r] == 0 && recursive[comp[r]] && (pass == 1 || entry[r]) {
				walk(r)
			}
		}
	}
	var out []int
	for r, b := range isBreaker {
		if b {
			out = append(out, r)
		}
	}
	return out
}

// walkRefs calls f with every rule e references.
func walkRefs(e *expr, f func(int)) {
	if e.kind == exprRef {
		f(e.rule)
	}
	for _, k := range e.kids {
		walkRefs(k, f)
	}
}

// sizeCap saturates size estimates.
const sizeCap = 1 << 40

// exprSize estimates the automaton states e expands to; refSize gives a reference's.
func exprSize(e *expr, refSize func(int) int) int {
	switch e.kind {
	case exprEmpty, exprNone:
		return 1
	case exprByte:
		return 2
	case exprRef:
		return refSize(e.rule)
	case exprSeq, exprAlt:
		s := 2
		for _, k := range e.kids {
			s = min(sizeCap, s+exprSize(k, refSize))
		}
		return s
	case exprRepeat:
		n := e.max
		if n < 0 {
			n = e.min + 1
		}
		return min(sizeCap, 2+min(sizeCap/int(max(1, n)), exprSize(e.kids[0], refSize))*max(1, n))
	}
	return 1
}

// components numbers the strongly connected components of the reference graph
// (Tarjan's) and says which are recursive (more than one rule, or a rule that
// references itself).
func components(refs [][]int) ([]int, []bool) {
	R := len(refs)
	index := make([]int, R)
	low := make([]int, R)
	onStack := make([]bool, R)
	comp := make([]int, R)
	for i := range index {
		index[i] = -1
	}
	var stack []int
	var recursive []bool
	next := 0
	var strong func(v int)
	strong = func(v int) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		self := false
		for _, w := range refs[v] {
			if index[w] < 0 {
				strong(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
			self = self || w == v
		}
		if low[v] == index[v] {
			c := len(recursive)
			n := 0
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[w] = false
				comp[w] = c
				n++
				if w == v {
					break
				}
			}
			recursive = append(recursive, n > 1 || self)
		}
	}
	for v := range R {
		if index[v] < 0 {
			strong(v)
		}
	}
	return comp, recursive
}

// nfa is a nondeterministic automaton under construction (Thompson's).
type nfa struct {
	// eps, edges and calls are each state's ε, byte-range and call transitions.
	eps   [][]int32
	edges [][]nfaEdge
	calls [][]nfaCall
	// lim bounds the states.
	lim int
}

// nfaEdge moves on a byte in [lo, hi].
type nfaEdge struct {
	lo, hi byte
	to     int32
}

// nfaCall enters a called rule and goes on at to.
type nfaCall struct {
	rule int32
	to   int32
}

// newState adds a state.
func (n *nfa) newState() int32 {
	n.eps = append(n.eps, nil)
	n.edges = append(n.edges, nil)
	n.calls = append(n.calls, nil)
	return int32(len(n.eps) - 1)
}

// maxInlineDepth bounds nested expansion (references within references).
const maxInlineDepth = 1000

// build adds states that take from to to over e; references to called rules become
// call edges, others are expanded.
func (n *nfa) build(def *grammarDef, called map[int]int, e *expr, from, to int32, depth int) error {
	if len(n.eps) > n.lim {
		return fmt.Errorf("%w: more than %d automaton states", ErrTooComplex, n.lim)
	}
	if depth > maxInlineDepth {
		return fmt.Errorf("%w: references nest deeper than %d", ErrTooComplex, maxInlineDepth)
	}
	switch e.kind {
	case exprEmpty:
		n.eps[from] = append(n.eps[from], to)
	case exprNone:
	case exprByte:
		n.edges[from] = append(n.edges[from], nfaEdge{e.lo, e.hi, to})
	case exprSeq:
		cur := from
		for i, k := range e.kids {
			nxt := to
			if i < len(e.kids)-1 {
				nxt = n.newState()
			}
			if err := n.build(def, called, k, cur, nxt, depth+1); err != nil {
				return err
			}
			cur = nxt
		}
	case exprAlt:
		for _, k := range e.kids {
			if err := n.build(def, called, k, from, to, depth+1); err != nil {
				return err
			}
		}
	case exprRepeat:
		k := e.kids[0]
		// Estimate first: a{1000000} must fail before it is built.
		if est := exprSize(e, func(int) int { return 1 }); est > n.lim {
			return fmt.Errorf("%w: a repetition {%d,%d} expands to more than %d automaton states", ErrTooComplex, e.min, e.max, n.lim)
		}
		cur := from
		for range e.min {
			nxt := n.newState()
			if err := n.build(def, called, k, cur, nxt, depth+1); err != nil {
				return err
			}
			cur = nxt
		}
		if e.max < 0 {
			// A loop: cur -k-> loop back to cur; exit by ε.
			loop := n.newState()
			n.eps[cur] = append(n.eps[cur], loop)
			body := n.newState()
			if err := n.build(def, called, k, loop, body, depth+1); err != nil {
				return err
			}
			n.eps[body] = append(n.eps[body], loop)
			n.eps[loop] = append(n.eps[loop], to)
			return nil
		}
		for range e.max - e.min {
			n.eps[cur] = append(n.eps[cur], to)
			nxt := n.newState()
			if err := n.build(def, called, k, cur, nxt, depth+1); err != nil {
				return err
			}
			cur = nxt
		}
		n.eps[cur] = append(n.eps[cur], to)
	case exprRef:
		if c, ok := called[e.rule]; ok {
			n.calls[from] = append(n.calls[from], nfaCall{int32(c), to})
			return nil
		}
		return n.build(def, called, def.bodies[e.rule], from, to, depth+1)
	}
	if len(n.eps) > n.lim {
		return fmt.Errorf("%w: more than %d automaton states", ErrTooComplex, n.lim)
	}
	return nil
}

// classes splits the bytes into classes at every range boundary of n's edges.
func (p *program) classes(n *nfa) {
	var cut [257]bool
	cut[0] = true
	for _, es := range n.edges {
		for _, e := range es {
			cut[e.lo], cut[int(e.hi)+1] = true, true
		}
	}
	c := -1
	for b := range 256 {
		if cut[b] {
			c++
		}
		p.cls[b] = uint8(c)
	}
	p.ncls = c + 1
}

// determinizer runs the subset construction, state sets interned across rules.
type determinizer struct {
	n   *nfa
	p   *program
	lim Limits
	// ids interns state sets (their int32s as bytes) to DFA states.
	ids map[string]int32
	// sets are the DFA states' NFA sets, to expand; accepts marks the rule's accept.
	sets [][]int32
	// work counts the NFA states expanded.
	work int
	// mark, stack: closure scratch.
	mark  []uint32
	epoch uint32
	stack []int32
}

// closure returns the ε-closure of seeds, sorted.
func (d *determinizer) closure(seeds []int32) []int32 {
	if len(d.mark) < len(d.n.eps) {
		d.mark = make([]uint32, len(d.n.eps))
	}
	d.epoch++
	out := []int32{}
	d.stack = append(d.stack[:0], seeds...)
	for len(d.stack) > 0 {
		s := d.stack[len(d.stack)-1]
		d.stack = d.stack[:len(d.stack)-1]
		if d.mark[s] == d.epoch {
			continue
		}
		d.mark[s] = d.epoch
		out = append(out, s)
		d.stack = append(d.stack, d.n.eps[s]...)
	}
	slices.Sort(out)
	return out
}

// setKey is a state set's map key.
func setKey(set []int32, accept int32) string {
	b := make([]byte, 0, 4*len(set)+4)
	b = binary.LittleEndian.AppendUint32(b, uint32(accept))
	for _, s := range set {
		b = binary.LittleEndian.AppendUint32(b, uint32(s))
	}
	return string(b)
}

// intern returns the DFA state of a set, adding it.
func (d *determinizer) intern(set []int32, accept int32) (int32, bool, error) {
	k := setKey(set, accept)
	if id, ok := d.ids[k]; ok {
		return id, false, nil
	}
	if len(d.p.accept) >= d.lim.DFAStates {
		return 0, false, fmt.Errorf("%w: more than %d automaton states after determinization", ErrTooComplex, d.lim.DFAStates)
	}
	if (len(d.p.accept)+1)*d.p.ncls > 1<<22 {
		return 0, false, fmt.Errorf("%w: transition table over %d entries", ErrTooComplex, 1<<22)
	}
	id := int32(len(d.p.accept))
	d.ids[k] = id
	d.sets = append(d.sets, set)
	d.p.accept = append(d.p.accept, slices.Contains(set, accept))
	d.p.calls = append(d.p.calls, nil)
	for range d.p.ncls {
		d.p.next = append(d.p.next, -1)
	}
	return id, true, nil
}

// determinize builds the DFA of the rule whose NFA runs from start to accept and
// returns its start state.
func (d *determinizer) determinize(start, accept int32) (int32, error) {
	s0, _, err := d.intern(d.closure([]int32{start}), accept)
	if err != nil {
		return 0, err
	}
	queue := []int32{s0}
	buckets := make([][]int32, d.p.ncls)
	for len(queue) > 0 {
		q := queue[0]
		queue = queue[1:]
		set := d.sets[q]
		d.work += len(set)
		if d.work > d.lim.Work {
			return 0, fmt.Errorf("%w: determinization took more than %d steps", ErrTooComplex, d.lim.Work)
		}
		for c := range buckets {
			buckets[c] = buckets[c][:0]
		}
		callT := map[int32][]int32{}
		var callOrder []int32
		for _, s := range set {
			for _, e := range d.n.edges[s] {
				for c := d.p.cls[e.lo]; ; c++ {
					buckets[c] = append(buckets[c], e.to)
					if c == d.p.cls[e.hi] {
						break
					}
				}
			}
			for _, c := range d.n.calls[s] {
				if _, ok := callT[c.rule]; !ok {
					callOrder = append(callOrder, c.rule)
				}
				callT[c.rule] = append(callT[c.rule], c.to)
			}
		}
		memo := map[string]int32{}
		for c, b := range buckets {
			if len(b) == 0 {
				continue
			}
			slices.Sort(b)
			b = slices.Compact(b)
			k := setKey(b, -1)
			t, ok := memo[k]
			if !ok {
				var added bool
				t, added, err = d.intern(d.closure(b), accept)
				if err != nil {
					return 0, err
				}
				if added {
					queue = append(queue, t)
				}
				memo[k] = t
			}
			d.p.next[int(q)*d.p.ncls+c] = t
		}
		for _, r := range callOrder {
			t, added, err := d.intern(d.closure(callT[r]), accept)
			if err != nil {
				return 0, err
			}
			if added {
				queue = append(queue, t)
			}
			d.p.calls[q] = append(d.p.calls[q], callEdge{rule: r, ret: t})
		}
	}
	return s0, nil
}

// inf is an unreachable distance.
const inf = int32(1 << 30)

// trim computes each state's rest (the fewest bytes to its rule's acceptance, calls
// costing their rule's shortest text), removes the transitions into states that
// cannot finish, and fails when the root cannot.
func (p *program) trim() error {
	S := len(p.accept)
	// Predecessors by byte and by call return.
	type pred struct {
		from int32
		call int32 // -1: a byte edge; else the called rule
	}
	preds := make([][]pred, S)
	for q := range S {
		row := p.next[q*p.ncls : (q+1)*p.ncls]
		last := int32(-1)
		for _, t := range row {
			if t >= 0 && t != last { // consecutive duplicates are common
				preds[t] = append(preds[t], pred{int32(q), -1})
				last = t
			}
		}
		for _, c := range p.calls[q] {
			preds[c.ret] = append(preds[c.ret], pred{int32(q), c.rule})
		}
	}
	minLen := make([]int32, len(p.start))
	for i := range minLen {
		minLen[i] = inf
	}
	rest := make([]int32, S)
	// Rules' shortest texts depend on each other: repeat until they settle (each round
	// is a Dijkstra over every state; a round that changes nothing ends it).
	for round := 0; ; round++ {
		for i := range rest {
			rest[i] = inf
		}
		h := &distHeap{}
		for q := range S {
			if p.accept[q] {
				rest[q] = 0
				heap.Push(h, distItem{int32(q), 0})
			}
		}
		for h.Len() > 0 {
			it := heap.Pop(h).(distItem)
			if it.d != rest[it.q] {
				continue
			}
			for _, pr := range preds[it.q] {
				w := int32(1)
				if pr.call >= 0 {
					w = minLen[pr.call]
					if w >= inf {
						continue
					}
				}
				if d := it.d + w; d < rest[pr.from] {
					rest[pr.from] = d
					heap.Push(h, distItem{pr.from, d})
				}
			}
		}
		changed := false
		for r, s := range p.start {
			if rest[s] != minLen[r] {
				minLen[r], changed = rest[s], true
			}
		}
		if !changed {
			break
		}
		if round > len(p.start)+2 {
			return fmt.Errorf("%w: the rules' shortest texts did not settle", ErrTooComplex)
		}
	}
	if rest[p.root] >= inf {
		return ErrMatchesNothing
	}
	p.rest = rest
	p.hasBytes = make([]bool, S)
	for q := range S {
		row := p.next[q*p.ncls : (q+1)*p.ncls]
		for c, t := range row {
			if t >= 0 && rest[t] >= inf {
				row[c] = -1
			} else if t >= 0 {
				p.hasBytes[q] = true
			}
		}
		calls := p.calls[q][:0]
		for _, c := range p.calls[q] {
			if rest[c.ret] < inf && minLen[c.rule] < inf {
				calls = append(calls, c)
			}
		}
		p.calls[q] = calls
		if len(calls) > 0 {
			p.hasCalls = true
		}
		if rest[q] < inf {
			p.maxRest = max(p.maxRest, rest[q])
		}
	}
	return nil
}

// distItem and distHeap are Dijkstra's queue.
type distItem struct {
	q, d int32
}

type distHeap []distItem

func (h distHeap) Len() int           { return len(h) }
func (h distHeap) Less(i, j int) bool { return h[i].d < h[j].d }
func (h distHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *distHeap) Push(x any)        { *h = append(*h, x.(distItem)) }
func (h *distHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// checkLeftRecursion refuses a grammar where a rule can call itself again before a
// byte is read (left recursion, which the runtime's stack could follow forever).
func (p *program) checkLeftRecursion() error {
	R := len(p.start)
	first := make([][]int32, R)
	for r, s := range p.start {
		seen := map[int32]bool{}
		stack := []int32{s}
		calls := map[int32]bool{}
		for len(stack) > 0 {
			q := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[q] {
				continue
			}
			seen[q] = true
			for _, c := range p.calls[q] {
				if !calls[c.rule] {
					calls[c.rule] = true
					first[r] = append(first[r], c.rule)
				}
				if p.rest[p.start[c.rule]] == 0 { // the callee may read nothing
					stack = append(stack, c.ret)
				}
			}
		}
		sort.Slice(first[r], func(i, j int) bool { return first[r][i] < first[r][j] })
	}
	// A cycle in "calls first" is left recursion.
	state := make([]uint8, R)
	var path []int32
	var cyc []int32
	var visit func(r int32) bool
	visit = func(r int32) bool {
		state[r] = 1
		path = append(path, r)
		for _, t := range first[r] {
			if state[t] == 1 {
				i := slices.Index(path, t)
				cyc = append([]int32{}, path[i:]...)
				return true
			}
			if state[t] == 0 && visit(t) {
				return true
			}
		}
		path = path[:len(path)-1]
		state[r] = 2
		return false
	}
	for r := range R {
		if state[r] == 0 && visit(int32(r)) {
			names := ""
			for i, c := range cyc {
				if i > 0 {
					names += " → "
				}
				names += p.ruleNames[c]
			}
			return fmt.Errorf("left recursion: %s → %s can be entered again before any text is read; rewrite it right-recursively (x ::= y x?)", names, p.ruleNames[cyc[0]])
		}
	}
	return nil
}

package guide

import (
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
)

// Token tables. For each automaton state q, the tokens are sorted once into three
// kinds by walking the vocabulary's trie from q with nothing beneath q's frame: those
// whose bytes q's rule (and the rules it calls) consume without returning — allowed
// whatever the stack below holds; those that cannot be consumed — never allowed; and
// those whose bytes run past the end of q's rule — it depends on the caller. The third
// kind is kept as trie nodes whose subtrees are walked again at run time with the real
// stack. In a grammar without recursion there is no caller, so a mask is a table
// lookup; in a recursive one the walks are short (the bytes after a value's end).

// table is one state's token classification.
type table struct {
	// ids (sorted) or words (a mask) hold the tokens allowed whatever the stack.
	ids   []int32
	words []uint64
	// unc are trie nodes (pre-order) where a parse returns from q's rule: the bytes
	// of their subtrees past them are for the caller to read.
	unc []int32
	// maxDelta is the largest, over the allowed tokens, of the fewest bytes that
	// finish q's frame after the token (the token budget's bound). Most tokens of a
	// state leave the same (mode); exc lists the others with theirs, by delta, when
	// there are at most maxExceptions (exact), so that a budget is applied to a mask
	// from the table alone.
	maxDelta, mode int32
	exc            []tokDelta
	exact          bool
	// minDelta is the least any allowed token leaves: a budget too tight for every
	// token allows those that leave it.
	minDelta int32
}

// tokDelta is a token and the fewest bytes it leaves q's frame to finish.
type tokDelta struct {
	tok, delta int32
}

// maxExceptions bounds a table's exc list.
const maxExceptions = 4096

// splitDeltas sets t's delta fields from every allowed token's delta.
func (t *table) splitDeltas(ds []tokDelta) {
	t.exact = true
	if len(ds) == 0 {
		return
	}
	slices.SortFunc(ds, func(a, b tokDelta) int { return int(a.delta - b.delta) })
	// The mode: the longest run of one delta.
	best, bestLen := ds[0].delta, 0
	for i := 0; i < len(ds); {
		j := i
		for j < len(ds) && ds[j].delta == ds[i].delta {
			j++
		}
		if j-i > bestLen {
			best, bestLen = ds[i].delta, j-i
		}
		i = j
	}
	t.mode = best
	if len(ds)-bestLen <= maxExceptions {
		for _, d := range ds {
			if d.delta != best {
				t.exc = append(t.exc, d)
			}
		}
	} else {
		t.exact = false
	}
	t.minDelta = ds[0].delta
}

// applyBudget sets in m (cleared or not: the caller's) the tokens of t that leave at
// most limit bytes; t must be exact.
func (t *table) applyBudget(m []uint64, limit int64) {
	if int64(t.mode) <= limit {
		t.orInto(m)
		for i := len(t.exc) - 1; i >= 0 && int64(t.exc[i].delta) > limit; i-- {
			id := t.exc[i].tok
			m[id>>6] &^= 1 << (uint(id) & 63)
		}
		return
	}
	for _, e := range t.exc {
		if int64(e.delta) > limit {
			break
		}
		m[e.tok>>6] |= 1 << (uint(e.tok) & 63)
	}
}

// bytes is the table's memory.
func (t *table) bytes() int64 {
	return int64(4*len(t.ids) + 8*len(t.words) + 4*len(t.unc) + 8*len(t.exc) + 64)
}

// orInto sets the table's allowed tokens in dst.
func (t *table) orInto(dst []uint64) {
	if t.words != nil {
		for i, w := range t.words {
			dst[i] |= w
		}
		return
	}
	for _, id := range t.ids {
		dst[id>>6] |= 1 << (uint(id) & 63)
	}
}

// newTable keeps acc (n tokens set) as a list when that is smaller than the mask.
func newTable(acc []uint64, n int, unc []int32, maxDelta int32, ds []tokDelta) *table {
	t := &table{unc: unc, maxDelta: maxDelta}
	t.splitDeltas(ds)
	if n*4 >= len(acc)*8 {
		t.words = acc
		return t
	}
	t.ids = make([]int32, 0, n)
	for i, w := range acc {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			t.ids = append(t.ids, int32(i*64+b))
			w &= w - 1
		}
	}
	return t
}

// Guide is a compiled constraint bound to a vocabulary: the per-state token tables,
// made as states are first reached and shared by every request with the constraint.
// It is safe for concurrent use.
type Guide struct {
	// p is the grammar's program (for this vocabulary's first-token rule).
	p *program
	// v is the vocabulary.
	v *Vocab
	// tables hold each state's table once made.
	tables []atomic.Pointer[table]
	// mem counts the tables' bytes; past memLimit tables are made but not kept.
	mem      atomic.Int64
	memLimit int64
	// walkers are reusable walk scratch.
	walkers sync.Pool
	// source describes the constraint for errors.
	source string
}

// DefaultTableMemory bounds one guide's cached tables.
const DefaultTableMemory = 256 << 20

// newGuide binds p to v.
func newGuide(p *program, v *Vocab, source string) *Guide {
	g := &Guide{p: p, v: v, tables: make([]atomic.Pointer[table], len(p.accept)), memLimit: DefaultTableMemory, source: source}
	g.walkers.New = func() any { return &walker{p: p, v: v} }
	return g
}

// Vocab returns the vocabulary the guide masks.
func (g *Guide) Vocab() *Vocab { return g.v }

// States is the number of automaton states.
func (g *Guide) States() int { return len(g.p.accept) }

// TableBytes is the memory of the tables made so far.
func (g *Guide) TableBytes() int64 { return g.mem.Load() }

// table returns q's table, making it on first use.
func (g *Guide) table(q int32) (*table, error) {
	if t := g.tables[q].Load(); t != nil {
		return t, nil
	}
	var t *table
	if !g.p.hasCalls {
		t = g.dfaTable(q)
	} else {
		w := g.walkers.Get().(*walker)
		var err error
		t, err = w.precompute(q)
		g.walkers.Put(w)
		if err != nil {
			return nil, err
		}
	}
	sz := t.bytes()
	if g.mem.Add(sz) > g.memLimit {
		g.mem.Add(-sz)
		return t, nil
	}
	if !g.tables[q].CompareAndSwap(nil, t) {
		g.mem.Add(-sz)
		return g.tables[q].Load(), nil
	}
	return t, nil
}

// Precompute makes every state's table now (benchmarks, and callers that want the
// first request not to pay for them).
func (g *Guide) Precompute() error {
	for q := range g.tables {
		if !g.p.hasBytes[q] {
			continue
		}
		if _, err := g.table(int32(q)); err != nil {
			return err
		}
	}
	return nil
}

// dfaTable walks the trie from q in a grammar without calls: every token is decided
// here (nothing follows the root's end).
func (g *Guide) dfaTable(q int32) *table {
	p, v := g.p, g.v
	acc := make([]uint64, v.words)
	n := 0
	maxDelta := int32(0)
	var ds []tokDelta
	var walk func(node, s int32)
	walk = func(node, s int32) {
		row := p.next[int(s)*p.ncls : (int(s)+1)*p.ncls]
		for c := node + 1; c < v.end[node]; c = v.end[c] {
			t := row[p.cls[v.nodeByte[c]]]
			if t < 0 {
				continue
			}
			if lo, hi := v.tokAt[c], v.tokAt[c+1]; lo != hi {
				for _, id := range v.toks[lo:hi] {
					acc[id>>6] |= 1 << (uint(id) & 63)
				}
				n += int(hi - lo)
				maxDelta = max(maxDelta, p.rest[t])
				for _, id := range v.toks[lo:hi] {
					ds = append(ds, tokDelta{id, p.rest[t]})
				}
			}
			if p.hasBytes[t] && v.end[c] > c+1 {
				walk(c, t)
			}
		}
	}
	walk(0, q)
	return newTable(acc, n, nil, maxDelta, ds)
}

// maxConfigs bounds the stacks a walk or a state follows at once: an ambiguous
// grammar may fork them at every byte.
const maxConfigs = 256

// maxDepth bounds a stack's frames.
const maxDepth = 1 << 16

var (
	errAmbiguous = fmt.Errorf("%w: the grammar follows more than %d parses at once; make it less ambiguous", ErrTooComplex, maxConfigs)
	errTooDeep   = fmt.Errorf("%w: the text nests more than %d rules deep", ErrTooComplex, maxDepth)
)

// walker walks the trie from one stack, following every parse the grammar allows
// (recursive grammars). In precompute mode the stack is one frame and nothing is
// beneath it; at run time (mask) the frames beneath are real, and the walk covers the
// subtrees the table left to the caller, from the caller's frames, or the whole trie
// under a binding token budget.
type walker struct {
	p *program
	v *Vocab
	// lv holds each trie depth's configurations.
	lv []wlevel
	// st is scratch for stacks being built.
	st []int32
	// err is set when a walk passes a limit.
	err error
	// runtime selects run-time mode: pops go into base frames; bits go into out.
	runtime bool
	// budget, at run time, is the most bytes a token may leave to finish (-1: any).
	budget int32
	// out receives a run-time walk's allowed tokens.
	out []uint64
	// least, when tracking, is the fewest bytes any token leaves to finish.
	tracking bool
	least    int32
	// acc, n, maxDelta, deltas and uncOut are a precompute's results.
	acc      []uint64
	n        int
	maxDelta int32
	deltas   []tokDelta
	uncOut   []int32
}

// wlevel is the configurations at one trie depth.
type wlevel struct {
	// buf holds the configurations' local stacks, bottom first.
	buf []int32
	// cfgs are the configurations.
	cfgs []wcfg
	// popped says a precompute parse ran past the end of the walk's base frame.
	popped bool
}

// wcfg is one parse: a local stack (in its level's buf) over base frames.
type wcfg struct {
	off, n int32
	base   *frame
	hash   uint64
	// alive says it can go on (bytes or a pop); ready says it can read a byte.
	alive, ready bool
	// rest is the fewest bytes to finish it (its base's included at run time).
	rest int32
}

// level returns depth d's level, emptied.
func (w *walker) level(d int) *wlevel {
	for len(w.lv) <= d {
		w.lv = append(w.lv, wlevel{})
	}
	l := &w.lv[d]
	l.buf, l.cfgs, l.popped = l.buf[:0], l.cfgs[:0], false
	return l
}

// stackHash hashes a local stack over a base.
func stackHash(st []int32, base *frame) uint64 {
	h := uint64(14695981039346656037)
	for _, s := range st {
		h = (h ^ uint64(uint32(s))) * 1099511628211
	}
	if base != nil {
		h = (h ^ base.hash) * 1099511628211
	}
	return h
}

// close adds to lv the configurations reachable from st over base without reading a
// byte: st itself, the calls its top may make, the returns its top's acceptance makes.
func (w *walker) close(lv *wlevel, st []int32, base *frame) {
	if w.err != nil {
		return
	}
	p := w.p
	q := st[len(st)-1]
	h := stackHash(st, base)
	for i := range lv.cfgs {
		c := &lv.cfgs[i]
		if c.hash == h && c.base == base && int(c.n) == len(st) && equalInts(lv.buf[c.off:c.off+c.n], st) {
			return
		}
	}
	if len(lv.cfgs) >= maxConfigs {
		w.err = errAmbiguous
		return
	}
	if len(st) > maxDepth {
		w.err = errTooDeep
		return
	}
	c := wcfg{off: int32(len(lv.buf)), n: int32(len(st)), base: base, hash: h,
		alive: p.hasBytes[q] || p.accept[q], ready: p.hasBytes[q]}
	for _, s := range st {
		c.rest += p.rest[s]
	}
	if base != nil {
		c.rest += base.rest
	}
	lv.buf = append(lv.buf, st...)
	lv.cfgs = append(lv.cfgs, c)
	mark := len(w.st)
	for _, ce := range p.calls[q] {
		w.st = append(append(w.st[:mark], st[:len(st)-1]...), ce.ret, p.start[ce.rule])
		w.close(lv, w.st[mark:], base)
	}
	if p.accept[q] {
		switch {
		case len(st) > 1:
			w.st = append(w.st[:mark], st[:len(st)-1]...)
			w.close(lv, w.st[mark:], base)
		case base != nil && w.runtime:
			w.st = append(w.st[:mark], base.state)
			w.close(lv, w.st[mark:], base.up)
		case !w.runtime:
			lv.popped = true
		}
	}
	w.st = w.st[:mark]
}

// equalInts compares two stacks.
func equalInts(a, b []int32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// start sets depth 0 to the one configuration st over base (not closed: the calls and
// returns it could make first are other frames of the state, with tables of their own).
func (w *walker) start(st []int32, base *frame) {
	lv := w.level(0)
	p := w.p
	q := st[len(st)-1]
	c := wcfg{off: 0, n: int32(len(st)), base: base, alive: true, ready: p.hasBytes[q]}
	lv.buf = append(lv.buf, st...)
	lv.cfgs = append(lv.cfgs, c)
}

// precompute makes q's table.
func (w *walker) precompute(q int32) (*table, error) {
	w.runtime, w.err = false, nil
	w.acc = make([]uint64, w.v.words)
	w.n, w.maxDelta, w.uncOut, w.deltas = 0, 0, nil, w.deltas[:0]
	w.st = w.st[:0]
	w.start([]int32{q}, nil)
	w.dfs(0, 0)
	if w.err != nil {
		return nil, w.err
	}
	return newTable(w.acc, w.n, w.uncOut, w.maxDelta, w.deltas), nil
}

// dfs walks node's children, the configurations at node being level d's.
func (w *walker) dfs(node int32, d int) {
	v, p := w.v, w.p
	for c := node + 1; c < v.end[node]; c = v.end[c] {
		nx := w.level(d + 1)
		cur := &w.lv[d] // level may have grown w.lv
		b := v.nodeByte[c]
		for i := range cur.cfgs {
			cf := cur.cfgs[i]
			if !cf.ready {
				continue
			}
			st := cur.buf[cf.off : cf.off+cf.n]
			t := p.step(st[len(st)-1], b)
			if t < 0 {
				continue
			}
			w.st = append(append(w.st[:0], st[:len(st)-1]...), t)
			w.close(nx, w.st, cf.base)
		}
		if w.err != nil {
			return
		}
		alive, ready := false, false
		best := inf
		for i := range nx.cfgs {
			cf := &nx.cfgs[i]
			if cf.alive {
				alive = true
				best = min(best, cf.rest)
			}
			ready = ready || cf.ready
		}
		toks := v.tokensAt(c)
		if w.runtime {
			if w.tracking && alive && len(toks) > 0 {
				w.least = min(w.least, best)
			}
			if alive && (w.budget < 0 || best <= w.budget) {
				for _, id := range toks {
					w.out[id>>6] |= 1 << (uint(id) & 63)
				}
			}
		} else {
			if alive && len(toks) > 0 {
				for _, id := range toks {
					w.acc[id>>6] |= 1 << (uint(id) & 63)
				}
				w.n += len(toks)
				w.maxDelta = max(w.maxDelta, best)
				for _, id := range toks {
					w.deltas = append(w.deltas, tokDelta{id, best})
				}
			}
			if nx.popped {
				// A parse returned past the base here: the bytes below c are the
				// caller's to read.
				w.uncOut = append(w.uncOut, c)
			}
		}
		if ready {
			w.dfs(c, d+1)
		}
	}
}

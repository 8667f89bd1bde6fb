package cpu

import (
	"fmt"
	"math"

	"gollm/model"
)

// moeW is a sparse layer's mixture of experts, matrices [out][in]; the shared expert's
// are nil without one.
type moeW struct {
	// router scores the experts [experts][hidden].
	router []float32
	// up is every expert's gate and up rows [experts][2·moe_inner][hidden]; down every
	// expert's down projection [experts][hidden][moe_inner].
	up, down []float32
	// sharedUp [2·shared_inner][hidden], sharedDown [hidden][shared_inner] and sharedGate
	// [hidden]: the shared expert and the gate of its output.
	sharedUp, sharedDown, sharedGate []float32
}

// moeScratch holds a mixture-of-experts stage's buffers, regrown to the largest step.
type moeScratch struct {
	// logits are the router's [N][experts], turned into probabilities in place.
	logits buf
	// routes are each row's experts and weights, TopK a row.
	routes []route
	// rows lists, expert by expert, the rows routed to it (their normed inputs) and
	// where their routes are; first[e] is expert e's first entry, first[experts] the end.
	rows  [][]float32
	which []int
	first []int
	// next is each expert's next free entry while the rows are placed.
	next []int
	// up [n][2·inner], act [n][inner] and out [n][hidden] are one expert's projections
	// of its rows (the shared expert's of every row).
	up, act, out buf
}

// route is one of a row's experts with its weight.
type route struct {
	expert int
	weight float32
}

// moe runs a sparse layer's MLP on the normed residual stream into s.tmp: each row's
// router probabilities (a float32 softmax over every expert), its TopK experts (the lower
// index first among equal probabilities) weighted by their probabilities, renormalised
// over the TopK when the stage says; then expert by expert (the experts the weights hold:
// a rank's under expert parallelism) its rows' gated MLP, each output added to its row's
// branch times the row's weight, in expert order; then, with a shared expert, its output
// times sigmoid(shared_gate · x).
func (e *Engine) moe(st *model.Stage) {
	w := e.w
	cfg := &w.cfg
	s := &e.s
	ms := &s.moe
	l := &w.layers[st.Layer].moe
	n, H, E, K, I := len(s.rows), cfg.Hidden, st.Experts, st.TopK, cfg.MoE.Inner
	e.normRows(s.xn.rows, s.h.rows)
	ms.logits.resize(n, E)
	matmul(ms.logits.rows, s.xn.rows, l.router, H, E, nil)
	if cap(ms.routes) < n*K {
		ms.routes = make([]route, n*K)
	}
	ms.routes = ms.routes[:n*K]
	for r := range n {
		routeRow(ms.logits.rows[r], ms.routes[r*K:(r+1)*K], st.NormTopK)
	}
	// A counting sort of the routes by expert: rows of an expert in row order.
	if cap(ms.first) < E+1 {
		ms.first = make([]int, E+1)
	}
	ms.first = ms.first[:E+1]
	clear(ms.first)
	for _, rt := range ms.routes {
		ms.first[rt.expert+1]++
	}
	for i := range E {
		ms.first[i+1] += ms.first[i]
	}
	if cap(ms.rows) < n*K {
		ms.rows, ms.which = make([][]float32, n*K), make([]int, n*K)
	}
	ms.rows, ms.which = ms.rows[:n*K], ms.which[:n*K]
	if cap(ms.next) < E {
		ms.next = make([]int, E)
	}
	next := ms.next[:E]
	copy(next, ms.first)
	for i, rt := range ms.routes {
		j := next[rt.expert]
		ms.rows[j], ms.which[j] = s.xn.rows[i/K], i
		next[rt.expert]++
	}
	for _, row := range s.tmp.rows {
		clear(row)
	}
	fn := activationOf(st.Act)
	// A rank of expert parallelism holds experts [x0, x0+held) alone: the pairs of the
	// others are its peers' (their sum is the all-reduce's).
	x0, held := cfg.MoE.Held()
	for x := x0; x < x0+held; x++ {
		lo, hi := ms.first[x], ms.first[x+1]
		if lo == hi {
			continue
		}
		up := l.up[(x-x0)*2*I*H : (x-x0+1)*2*I*H]
		down := l.down[(x-x0)*H*I : (x-x0+1)*H*I]
		e.expert(fn, ms.rows[lo:hi], up, down, I)
		for j, i := range ms.which[lo:hi] {
			axpy(s.tmp.rows[i/K], ms.routes[i].weight, ms.out.rows[j])
		}
	}
	if st.SharedExpert {
		S := len(l.sharedDown) / H
		e.expert(fn, s.xn.rows, l.sharedUp, l.sharedDown, S)
		for r := range n {
			g := 1 / (1 + math.Exp(-float64(dot(s.xn.rows[r], l.sharedGate))))
			axpy(s.tmp.rows[r], float32(g), ms.out.rows[r])
		}
	}
}

// expert runs one gated MLP of inner units on xs into s.moe.out: act(gate) · up, then the
// down projection.
func (e *Engine) expert(fn activation, xs [][]float32, up, down []float32, inner int) {
	ms := &e.s.moe
	H, n := e.w.cfg.Hidden, len(xs)
	ms.up.resize(n, 2*inner)
	ms.act.resize(n, inner)
	ms.out.resize(n, H)
	matmul(ms.up.rows, xs, up, H, 2*inner, nil)
	for r := range n {
		gatedApply(fn, ms.act.rows[r], ms.up.rows[r][:inner], ms.up.rows[r][inner:])
	}
	matmul(ms.out.rows, ms.act.rows, down, inner, H, nil)
}

// routeRow turns a row's router logits into probabilities (in place: a softmax in
// float32, as transformers computes it) and fills out with its len(out) most probable
// experts, the lower index first among equals, their weights renormalised to sum to 1
// when norm.
func routeRow(logits []float32, out []route, norm bool) {
	best := float32(math.Inf(-1))
	for _, v := range logits {
		best = max(best, v)
	}
	var sum float32
	for i, v := range logits {
		p := float32(math.Exp(float64(v - best)))
		logits[i] = p
		sum += p
	}
	for i := range logits {
		logits[i] /= sum
	}
	var total float32
	for k := range out {
		pick := -1
		for i, p := range logits {
			if (pick < 0 || p > logits[pick]) && !chosen(out[:k], i) {
				pick = i
			}
		}
		out[k] = route{expert: pick, weight: logits[pick]}
		total += logits[pick]
	}
	if norm {
		for k := range out {
			out[k].weight /= total
		}
	}
}

// chosen says whether expert i is among the routes picked already.
func chosen(picked []route, i int) bool {
	for _, r := range picked {
		if r.expert == i {
			return true
		}
	}
	return false
}

// checkMoEStage refuses a mixture-of-experts stage the weights do not hold.
func checkMoEStage(s model.Stage, cfg *model.Config) error {
	m := cfg.MoE
	switch {
	case !cfg.Sparse(s.Layer):
		return fmt.Errorf("layer %d: a mixture of experts where the weights are a dense MLP", s.Layer)
	case s.Experts != m.Experts || s.TopK < 1 || s.TopK > s.Experts:
		return fmt.Errorf("layer %d: top %d of %d experts, the weights hold %d", s.Layer, s.TopK, s.Experts, m.Experts)
	case !s.Gated || s.SharedExpert != (m.SharedInner > 0):
		return fmt.Errorf("layer %d: gated experts %v and a shared expert %v, the weights say true and %v", s.Layer,
			s.Gated, s.SharedExpert, m.SharedInner > 0)
	}
	return nil
}

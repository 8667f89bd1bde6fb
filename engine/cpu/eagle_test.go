package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gollm/engine"
	"gollm/model"
)

// loadEagleFixture loads the EAGLE-3 head fixture and its target's embedding.
func loadEagleFixture(t *testing.T) (*model.Eagle3, *model.Float32) {
	t.Helper()
	h, err := model.LoadEagle3("../../testdata/eagle3-tiny")
	if err != nil {
		t.Fatal(err)
	}
	target, err := model.LoadFloat32("../../testdata/llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	return h, target
}

// refHead computes the head's output at the last of rows from scratch: every position's
// keys and values recomputed, plain loops, no paging.
func refHead(h *model.Eagle3, embed []float32, rows []engine.HeadRow, owns [][]float32) []float32 {
	c := &h.Config
	H, D := c.Hidden, c.HeadDim
	mv := func(w []float32, x []float32, out int) []float32 {
		y := make([]float32, out)
		for o := range y {
			var s float64
			for i, v := range x {
				s += float64(w[o*len(x)+i]) * float64(v)
			}
			y[o] = float32(s)
		}
		return y
	}
	norm := func(x, w []float32) []float32 {
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		s := 1 / math.Sqrt(ss/float64(len(x))+float64(c.NormEps))
		y := make([]float32, len(x))
		for i, v := range x {
			y[i] = w[i] * float32(float64(v)*s)
		}
		return y
	}
	inv := c.Rope.InvFreq()
	rot := func(x []float32, heads, pos int) {
		half := len(inv)
		for hd := range heads {
			y := x[hd*D : hd*D+2*half]
			for i, f := range inv {
				a := float64(f * float32(pos))
				cs, sn := math.Cos(a), math.Sin(a)
				p, q := float64(y[i]), float64(y[i+half])
				y[i], y[i+half] = float32(p*cs-q*sn), float32(q*cs+p*sn)
			}
		}
	}
	var keys, vals, xs [][]float32
	var q []float32
	for i, r := range rows {
		x := owns[i]
		if r.Feature != nil {
			x = mv(h.FC, r.Feature, H)
		}
		a := append(norm(embed[int(r.Token)*H:(int(r.Token)+1)*H], h.InputNorm), norm(x, h.HiddenNorm)...)
		q = mv(h.Q, a, c.Heads*D)
		k := mv(h.K, a, c.KVHeads*D)
		rot(q, c.Heads, r.Pos)
		rot(k, c.KVHeads, r.Pos)
		keys, vals, xs = append(keys, k), append(vals, mv(h.V, a, c.KVHeads*D)), append(xs, x)
	}
	att := make([]float32, c.Heads*D)
	for hd := range c.Heads {
		kvh := hd / (c.Heads / c.KVHeads)
		var sc []float64
		best := math.Inf(-1)
		for t := range keys {
			var s float64
			for d := range D {
				s += float64(q[hd*D+d]) * float64(keys[t][kvh*D+d])
			}
			s /= math.Sqrt(float64(D))
			sc = append(sc, s)
			best = math.Max(best, s)
		}
		var z float64
		for t := range sc {
			sc[t] = math.Exp(sc[t] - best)
			z += sc[t]
		}
		for d := range D {
			var s float64
			for t := range sc {
				s += sc[t] / z * float64(vals[t][kvh*D+d])
			}
			att[hd*D+d] = float32(s)
		}
	}
	h1 := mv(h.O, att, H)
	x := xs[len(xs)-1]
	for i := range h1 {
		h1[i] += x[i]
	}
	n := norm(h1, h.PostNorm)
	g, u := mv(h.Gate, n, c.Inner), mv(h.Up, n, c.Inner)
	for i := range g {
		g[i] = float32(float64(g[i]) / (1 + math.Exp(-float64(g[i]))) * float64(u[i]))
	}
	out := mv(h.Down, g, H)
	for i := range out {
		out[i] += h1[i]
	}
	return out
}

// TestEagle3HeadMatchesAPlainComputation: over a sequence of rows — target features
// first, then the head's own outputs fed back — run in one call or one by one over the
// paged pool, every row's output is what a plain recomputation from scratch gives, and
// the logits are the LM head of its norm.
func TestEagle3HeadMatchesAPlainComputation(t *testing.T) {
	h, target := loadEagleFixture(t)
	embed := target.Model[model.RoleEmbed]
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 9
	var rows []engine.HeadRow
	for i := range n {
		r := engine.HeadRow{Pos: i, Token: int32(rng.IntN(1000)), Blocks: []int32{3, 0, 2}, Out: make([]float32, 64),
			Logits: make([]float32, 256)}
		if i < 6 {
			r.Feature = make([]float32, 192)
			for j := range r.Feature {
				r.Feature[j] = float32(rng.NormFloat64())
			}
		}
		rows = append(rows, r)
	}
	// oneByOne runs the rows one per call on a fresh head.
	oneByOne := func() [][]float32 {
		e, err := NewEagle3(h, 2, embed, engine.KVConfig{NumBlocks: 4, TokensPerBlock: 4})
		if err != nil {
			t.Fatal(err)
		}
		var outs [][]float32
		for i := range rows {
			rows[i].Out = make([]float32, 64)
			if rows[i].Feature == nil {
				rows[i].Own = outs[i-1]
			}
			if err := e.Forward(rows[i : i+1]); err != nil {
				t.Fatal(err)
			}
			outs = append(outs, rows[i].Out)
		}
		return outs
	}()
	// One call for the feature rows, then one per fed-back row (each needs the one before).
	e, err := NewEagle3(h, 2, embed, engine.KVConfig{NumBlocks: 4, TokensPerBlock: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		rows[i].Out = make([]float32, 64)
	}
	if err := e.Forward(rows[:6]); err != nil {
		t.Fatal(err)
	}
	together := [][]float32{}
	for i := range 6 {
		together = append(together, rows[i].Out)
	}
	for i := 6; i < n; i++ {
		rows[i].Own = together[i-1]
		if err := e.Forward(rows[i : i+1]); err != nil {
			t.Fatal(err)
		}
		together = append(together, rows[i].Out)
	}
	owns := make([][]float32, n)
	for i := 1; i < n; i++ {
		owns[i] = together[i-1]
	}
	for i := range n {
		want := refHead(h, embed, rows[:i+1], owns[:i+1])
		if d := relL2(together[i], want); d > 1e-5 {
			t.Fatalf("row %d: output differs from the plain computation (rel L2 %g)", i, d)
		}
		if d := relL2(oneByOne[i], together[i]); d > 1e-6 {
			t.Fatalf("row %d: one row per call differs from several (rel L2 %g)", i, d)
		}
	}
	// The logits of the last row: the LM head of its final norm.
	last := rows[n-1]
	normed := make([]float32, 64)
	rmsNorm(normed, last.Out, h.FinalNorm, h.Config.NormEps)
	want := make([]float32, 256)
	matmul([][]float32{want}, [][]float32{normed}, h.LMHead, 64, 256, nil)
	if !slices.Equal(want, last.Logits) {
		t.Fatal("the last row's logits are not the LM head of its norm")
	}
	bad := rows[0]
	bad.Token = 1000
	if err := e.Forward([]engine.HeadRow{bad}); err == nil {
		t.Fatal("a token outside the vocabulary was accepted")
	}
}

package cpu

import (
	"math"

	"gollm/model"
)

// The stages and stage values Qwen3, Gemma 2 and 3 and Phi-3's longrope add to the
// LLaMA layer: the per-head query and key norms, the post-norms of the branches, the
// embedding scale, soft-capping, and longrope's frequencies of long sequences.

// longRopeFreqs computes longrope's long-sequence frequencies of each longrope rope the
// recipe's rotary stages use.
func longRopeFreqs(r model.Recipe) map[model.Rope][]float32 {
	freqs := map[model.Rope][]float32{}
	for _, s := range r {
		if s.Kind == model.StageRotary && s.Rope.Kind == model.RopeLongRope {
			if _, ok := freqs[s.Rope]; !ok {
				freqs[s.Rope] = s.Rope.LongInvFreq()
			}
		}
	}
	return freqs
}

// scaleEmbeddings multiplies the residual stream — the step's embeddings — by the
// embedding stage's scale, in float32 (the engine's activations), where it has one.
func (e *Engine) scaleEmbeddings(st *model.Stage) {
	if st.Scale <= 0 {
		return
	}
	for _, h := range e.s.h.rows {
		for j := range h {
			h[j] *= st.Scale
		}
	}
}

// qkNorm normalises each query head of every row by the stage's weight (RoleQNorm) and
// each key head by the keys' (RoleKNorm), over head_dim, in place.
func (e *Engine) qkNorm(st *model.Stage) {
	cfg := &e.w.cfg
	l := &e.w.layers[st.Layer]
	D := cfg.HeadDim
	for _, row := range e.s.qkv.rows[:len(e.s.rows)] {
		for h := range cfg.Heads + cfg.KVHeads {
			g := l.qNorm
			if h >= cfg.Heads {
				g = l.kNorm
			}
			x := row[h*D : (h+1)*D]
			rmsNorm(x, x, g, st.Eps)
		}
	}
}

// postNorm normalises the branch (s.tmp) of every row in place before the residual stage
// adds it.
func (e *Engine) postNorm(st *model.Stage) {
	g, _ := e.normWeights(st)
	for _, x := range e.s.tmp.rows[:len(e.s.rows)] {
		rmsNorm(x, x, g, st.Eps)
	}
}

// softcap is c·tanh(x/c) as transformers computes it in float32: a division, tanh, then
// a product.
func softcap(x, c float32) float32 {
	return float32(math.Tanh(float64(x/c))) * c
}

// softcapRows soft-caps every value of rows at ±c; c 0 leaves them.
func softcapRows(rows [][]float32, c float32) {
	if c <= 0 {
		return
	}
	parallelFor(len(rows), 1, 1, func(_, lo, hi int) {
		for _, row := range rows[lo:hi] {
			for j, v := range row {
				row[j] = softcap(v, c)
			}
		}
	})
}

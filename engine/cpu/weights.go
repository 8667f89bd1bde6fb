package cpu

import (
	"errors"
	"fmt"
	"math"

	"gollm/model"
)

// Weights are a model prepared for the CPU engine, built once by NewWeights and shared
// by every engine New makes on them: several instances of one model then hold one copy
// of the weights, not one each.
//
// They are never written after NewWeights returns (Step only reads them), so any number
// of engines may use them concurrently from different goroutines. They reference the
// model.Float32's slices without copying (its matrices are already [out][in], each
// output a dot product of two contiguous vectors): the caller must not modify them.
type Weights struct {
	// cfg says how the weights are used.
	cfg model.Config
	// embed holds the token embedding, [vocab][hidden].
	embed []float32
	// pos is the learned position embedding [positions][hidden]; nil under rotary
	// positions.
	pos []float32
	// finalNorm and finalNormB are the final norm's weight and bias (nil for RMSNorm).
	finalNorm, finalNormB []float32
	// lmHead is the LM head [vocab][hidden]; embed when tied.
	lmHead []float32
	// layers hold the transformer blocks.
	layers []layerW
}

// layerW is one transformer block's weights, matrices [out][in]; absent biases are nil.
type layerW struct {
	// attnNorm, attnNormB: the norm before attention [hidden].
	attnNorm, attnNormB []float32
	// qkv [QKVWidth][hidden] and qkvB [QKVWidth]: the fused Q, K, V projection.
	qkv, qkvB []float32
	// out [hidden][heads·head_dim] and outB [hidden]: the attention output projection.
	out, outB []float32
	// mlpNorm, mlpNormB: the norm before the MLP [hidden].
	mlpNorm, mlpNormB []float32
	// up [inner or 2·inner][hidden] and upB: the MLP's first projection (gate rows first
	// when gated).
	up, upB []float32
	// down [hidden][inner] and downB [hidden]: the MLP's second projection.
	down, downB []float32
	// qNorm and kNorm [head_dim]: the per-head norms of queries and keys (nil without).
	qNorm, kNorm []float32
	// postAttn and postMLP [hidden]: the norms of attention's and the MLP's outputs
	// before the residual add (nil without).
	postAttn, postMLP []float32
	// moe holds a sparse layer's experts (moe.go); zero in a dense layer.
	moe moeW
}

// NewWeights checks m against its descriptor (every role present with the length its
// shape implies, naming the one that does not fit) and prepares it for the CPU engine.
func NewWeights(m *model.Float32) (*Weights, error) {
	if m == nil {
		return nil, errors.New("cpu: NewWeights: nil model")
	}
	cfg := m.Config
	if err := checkConfig(&cfg); err != nil {
		return nil, fmt.Errorf("cpu: NewWeights: %w", err)
	}
	if len(m.Layers) != cfg.Layers {
		return nil, fmt.Errorf("cpu: NewWeights: model has %d layers, its config %d", len(m.Layers), cfg.Layers)
	}
	get := func(r model.Role, l int) ([]float32, error) {
		v := m.Model[r]
		where := r.String()
		if l >= 0 {
			v = m.Layers[l][r]
			where = fmt.Sprintf("layer %d %s", l, r)
		}
		rows, cols, present := cfg.Shape(r)
		if l >= 0 {
			rows, cols, present = cfg.LayerShape(r, l)
		}
		switch {
		case !present && v != nil:
			return nil, fmt.Errorf("cpu: NewWeights: %s is set, but the architecture has none", where)
		case present && len(v) != rows*cols:
			return nil, fmt.Errorf("cpu: NewWeights: %s has %d values, want %d×%d for the config", where, len(v), rows, cols)
		}
		return v, nil
	}
	w := &Weights{cfg: cfg, layers: make([]layerW, cfg.Layers)}
	var err error
	set := func(dst *[]float32, r model.Role, l int) {
		if err == nil {
			*dst, err = get(r, l)
		}
	}
	set(&w.embed, model.RoleEmbed, -1)
	set(&w.pos, model.RolePosEmbed, -1)
	set(&w.finalNorm, model.RoleFinalNorm, -1)
	set(&w.finalNormB, model.RoleFinalNormBias, -1)
	set(&w.lmHead, model.RoleLMHead, -1)
	for i := range w.layers {
		l := &w.layers[i]
		set(&l.attnNorm, model.RoleAttnNorm, i)
		set(&l.attnNormB, model.RoleAttnNormBias, i)
		set(&l.qkv, model.RoleQKV, i)
		set(&l.qkvB, model.RoleQKVBias, i)
		set(&l.out, model.RoleOut, i)
		set(&l.outB, model.RoleOutBias, i)
		set(&l.mlpNorm, model.RoleMLPNorm, i)
		set(&l.mlpNormB, model.RoleMLPNormBias, i)
		set(&l.up, model.RoleUp, i)
		set(&l.upB, model.RoleUpBias, i)
		set(&l.down, model.RoleDown, i)
		set(&l.downB, model.RoleDownBias, i)
		set(&l.qNorm, model.RoleQNorm, i)
		set(&l.kNorm, model.RoleKNorm, i)
		set(&l.postAttn, model.RolePostAttnNorm, i)
		set(&l.postMLP, model.RolePostMLPNorm, i)
		set(&l.moe.router, model.RoleRouter, i)
		set(&l.moe.up, model.RoleExpertUp, i)
		set(&l.moe.down, model.RoleExpertDown, i)
		set(&l.moe.sharedUp, model.RoleSharedUp, i)
		set(&l.moe.sharedDown, model.RoleSharedDown, i)
		set(&l.moe.sharedGate, model.RoleSharedGate, i)
	}
	if err != nil {
		return nil, err
	}
	if cfg.TiedHead {
		w.lmHead = w.embed
	}
	return w, nil
}

// Config is the descriptor of the model the weights hold.
func (w *Weights) Config() model.Config { return w.cfg }

// checkConfig rejects descriptors the engine cannot run (model.Open never makes one;
// a hand-built model.Float32 may).
func checkConfig(c *model.Config) error {
	switch {
	case c.VocabSize < 1 || c.MaxPositions < 1 || c.Hidden < 1 || c.Layers < 1 || c.Heads < 1 || c.Inner < 1:
		return fmt.Errorf("vocab %d, positions %d, hidden %d, layers %d, heads %d and inner %d must all be at least 1",
			c.VocabSize, c.MaxPositions, c.Hidden, c.Layers, c.Heads, c.Inner)
	case c.KVHeads < 1 || c.Heads%c.KVHeads != 0:
		return fmt.Errorf("kv_heads %d must divide heads %d", c.KVHeads, c.Heads)
	case c.HeadDim < 1:
		return fmt.Errorf("head_dim %d must be at least 1", c.HeadDim)
	case !(c.NormEps > 0) || math.IsInf(float64(c.NormEps), 0):
		return fmt.Errorf("norm epsilon %g must be positive and finite", c.NormEps)
	case c.Positions == model.RotaryPositions && (c.Rope.Dim < 2 || c.Rope.Dim%2 != 0 || c.Rope.Dim > c.HeadDim):
		return fmt.Errorf("rotary dimensions %d must be even, at least 2 and at most head_dim %d", c.Rope.Dim, c.HeadDim)
	case c.MoE != nil && (c.MoE.Experts < 1 || c.MoE.TopK < 1 || c.MoE.TopK > c.MoE.Experts || c.MoE.Inner < 1 ||
		c.MoE.SharedInner < 0 || len(c.MoE.Sparse) != c.Layers):
		return fmt.Errorf("experts %d, top-k %d, inner %d, shared inner %d and %d sparse-layer marks for %d layers do not fit",
			c.MoE.Experts, c.MoE.TopK, c.MoE.Inner, c.MoE.SharedInner, len(c.MoE.Sparse), c.Layers)
	}
	return nil
}

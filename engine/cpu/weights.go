package cpu

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"gollm/model"
)

// Weights are a model prepared for the CPU engine, built once by NewWeights or
// LoadWeights and shared by every engine New makes on them: several instances of one
// model then hold one copy of the weights, not one each.
//
// They are never written after they are built (Step only reads them), so any number of
// engines may use them concurrently from different goroutines. The weight matrices keep
// the format they are given in — float32, float16, bfloat16 or block-quantized — and,
// loaded from a checkpoint, point into its memory mapping wherever its layout is the
// engine's, so that the model takes in memory about what it takes on disk. They count
// their users: the builder's reference (Release) and each engine's (until Close); the
// last to go unmaps the checkpoint.
type Weights struct {
	// cfg says how the weights are used.
	cfg model.Config
	// embed holds the token embedding, [vocab][hidden].
	embed *matrix
	// pos is the learned position embedding [positions][hidden]; nil under rotary
	// positions.
	pos []float32
	// finalNorm and finalNormB are the final norm's weight and bias (nil for RMSNorm).
	finalNorm, finalNormB []float32
	// lmHead is the LM head [vocab][hidden]; embed when tied.
	lmHead *matrix
	// layers hold the transformer blocks.
	layers []layerW
	// mu guards refs and ckpt.
	mu sync.Mutex
	// refs counts the builder's reference and the engines'; at 0 the weights are
	// released.
	refs int
	// ckpt is the checkpoint whose mapping the matrices point into; nil when they own
	// their memory.
	ckpt *model.Checkpoint
	// bufs hold the matrices LoadWeights converted, quantized or repacked; nil for
	// weights made by NewWeights.
	bufs *buffers
}

// layerW is one transformer block's weights, matrices [out][in]; absent biases are nil.
type layerW struct {
	// attnNorm, attnNormB: the norm before attention [hidden].
	attnNorm, attnNormB []float32
	// qkv [QKVWidth][hidden] and qkvB [QKVWidth]: the fused Q, K, V projection.
	qkv  *matrix
	qkvB []float32
	// out [hidden][heads·head_dim] and outB [hidden]: the attention output projection.
	out  *matrix
	outB []float32
	// mlpNorm, mlpNormB: the norm before the MLP [hidden].
	mlpNorm, mlpNormB []float32
	// up [inner or 2·inner][hidden] and upB: the MLP's first projection (gate rows first
	// when gated).
	up  *matrix
	upB []float32
	// down [hidden][inner] and downB [hidden]: the MLP's second projection.
	down  *matrix
	downB []float32
	// qNorm and kNorm [head_dim]: the per-head norms of queries and keys (nil without).
	qNorm, kNorm []float32
	// postAttn and postMLP [hidden]: the norms of attention's and the MLP's outputs
	// before the residual add (nil without).
	postAttn, postMLP []float32
	// moe holds a sparse layer's experts (moe.go); zero in a dense layer.
	moe moeW
}

// matrixRoles are the roles held as matrices; the rest are float32 vectors.
func matrixRole(r model.Role) bool {
	switch r {
	case model.RoleEmbed, model.RoleLMHead, model.RoleQKV, model.RoleOut, model.RoleUp, model.RoleDown:
		return true
	}
	return false
}

// NewWeights checks m against its descriptor (every role present with the length its
// shape implies, naming the one that does not fit) and prepares it for the CPU engine.
// The weights reference m's slices without copying (its matrices are already [out][in],
// each output a dot product of two contiguous vectors): the caller must not modify them.
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
	w := newWeights(cfg)
	for r := range model.NumRoles {
		for l := -1; l < cfg.Layers; l++ {
			if r.PerLayer() != (l >= 0) {
				continue
			}
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
			case !present:
				continue
			}
			if matrixRole(r) {
				*w.matrixOf(r, l) = f32Matrix(v, rows, cols)
			} else {
				*w.vectorOf(r, l) = v
			}
		}
	}
	w.finish()
	return w, nil
}

// newWeights makes the weights of cfg, empty, with the builder's reference.
func newWeights(cfg model.Config) *Weights {
	return &Weights{cfg: cfg, layers: make([]layerW, cfg.Layers), refs: 1}
}

// finish ties the head.
func (w *Weights) finish() {
	if w.cfg.TiedHead {
		w.lmHead = w.embed
	}
}

// matrixOf is where role r of layer l (-1: the model's) is kept, for the matrix roles.
func (w *Weights) matrixOf(r model.Role, l int) **matrix {
	switch r {
	case model.RoleEmbed:
		return &w.embed
	case model.RoleLMHead:
		return &w.lmHead
	case model.RoleQKV:
		return &w.layers[l].qkv
	case model.RoleOut:
		return &w.layers[l].out
	case model.RoleUp:
		return &w.layers[l].up
	}
	return &w.layers[l].down
}

// vectorOf is where role r of layer l (-1: the model's) is kept, for the other roles.
func (w *Weights) vectorOf(r model.Role, l int) *[]float32 {
	if l < 0 {
		switch r {
		case model.RolePosEmbed:
			return &w.pos
		case model.RoleFinalNorm:
			return &w.finalNorm
		}
		return &w.finalNormB
	}
	ly := &w.layers[l]
	switch r {
	case model.RoleAttnNorm:
		return &ly.attnNorm
	case model.RoleAttnNormBias:
		return &ly.attnNormB
	case model.RoleQKVBias:
		return &ly.qkvB
	case model.RoleOutBias:
		return &ly.outB
	case model.RoleMLPNorm:
		return &ly.mlpNorm
	case model.RoleMLPNormBias:
		return &ly.mlpNormB
	case model.RoleUpBias:
		return &ly.upB
	case model.RoleQNorm:
		return &ly.qNorm
	case model.RoleKNorm:
		return &ly.kNorm
	case model.RolePostAttnNorm:
		return &ly.postAttn
	case model.RolePostMLPNorm:
		return &ly.postMLP
	case model.RoleRouter:
		return &ly.moe.router
	case model.RoleExpertUp:
		return &ly.moe.up
	case model.RoleExpertDown:
		return &ly.moe.down
	case model.RoleSharedUp:
		return &ly.moe.sharedUp
	case model.RoleSharedDown:
		return &ly.moe.sharedDown
	case model.RoleSharedGate:
		return &ly.moe.sharedGate
	}
	return &ly.downB
}

// Config is the descriptor of the model the weights hold.
func (w *Weights) Config() model.Config { return w.cfg }

// Bytes is the memory the weights take (mapped or owned).
func (w *Weights) Bytes() int64 {
	var n int64
	seen := map[*matrix]bool{}
	for _, m := range w.matrices() {
		if m != nil && !seen[m] {
			seen[m] = true
			n += m.bytes()
		}
	}
	vec := len(w.pos) + len(w.finalNorm) + len(w.finalNormB)
	for i := range w.layers {
		l := &w.layers[i]
		vec += len(l.attnNorm) + len(l.attnNormB) + len(l.qkvB) + len(l.outB) + len(l.mlpNorm) + len(l.mlpNormB) + len(l.upB) + len(l.downB) +
			len(l.qNorm) + len(l.kNorm) + len(l.postAttn) + len(l.postMLP)
	}
	return n + 4*int64(vec)
}

// Formats counts the weight matrices' rows by storage format ("Q4_K": 123…), for logs.
func (w *Weights) Formats() map[string]int {
	out := map[string]int{}
	seen := map[*matrix]bool{}
	for _, m := range w.matrices() {
		if m == nil || seen[m] {
			continue
		}
		seen[m] = true
		for i := range m.parts {
			out[m.parts[i].f.String()] += m.parts[i].rows
		}
	}
	return out
}

// matrices lists every matrix of the weights.
func (w *Weights) matrices() []*matrix {
	ms := []*matrix{w.embed, w.lmHead}
	for i := range w.layers {
		l := &w.layers[i]
		ms = append(ms, l.qkv, l.out, l.up, l.down)
	}
	return ms
}

// acquire takes a reference for an engine; false once the weights are released.
func (w *Weights) acquire() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.refs <= 0 {
		return false
	}
	w.refs++
	return true
}

// release drops a reference; the last unmaps the checkpoint and the buffers.
func (w *Weights) release() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.refs <= 0 {
		return nil
	}
	w.refs--
	if w.refs > 0 || (w.ckpt == nil && w.bufs == nil) {
		return nil
	}
	c, b := w.ckpt, w.bufs
	w.ckpt, w.bufs = nil, nil
	w.embed, w.lmHead, w.layers = nil, nil, nil
	err := b.free()
	if c != nil {
		err = errors.Join(err, c.Close())
	}
	return err
}

// Release drops the builder's reference: the weights stay until the engines made on
// them are closed too, and then a checkpoint they point into and the memory
// LoadWeights took are unmapped.
func (w *Weights) Release() error { return w.release() }

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

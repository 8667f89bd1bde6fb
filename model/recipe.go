package model

import (
	"fmt"
	"math"
)

// StageKind is one kind of step of the forward pass.
type StageKind uint8

const (
	// StageEmbed starts the residual stream h at the tokens' embeddings (times Scale
	// where it is positive), plus the position embedding under learned positions.
	StageEmbed StageKind = iota
	// StageNorm makes the input x of the stage that reads it (QKV, MLP, the LM head):
	// x = norm(h) with the stage's Norm, Eps and weight role (LayerNorm's bias is the role
	// after it).
	StageNorm
	// StageQKV projects x into queries, keys and values (RoleQKV, RoleQKVBias).
	StageQKV
	// StageRotary rotates the queries and keys by their position (Rope: base, scaling and
	// the rotated dimensions of each head).
	StageRotary
	// StageKVWrite stores the keys and values in the paged KV cache.
	StageKVWrite
	// StageAttention is causal attention over the cache: the query·key products times
	// Scale, soft-capped where SoftCap is positive, within the layer's Window.
	StageAttention
	// StageOut projects the attention output into the residual width (RoleOut,
	// RoleOutBias): the branch the next StageResidual adds.
	StageOut
	// StageMLP is the MLP on x — act(up(x)), or act(gate(x)) · up(x) when Gated —, then the
	// down projection (RoleUp, RoleUpBias, RoleDown, RoleDownBias): the branch the next
	// StageResidual adds.
	StageMLP
	// StageResidual adds the branch to the residual stream: h += branch.
	StageResidual
	// StageLMHead computes the logits of the rows whose logits are read, from x (RoleLMHead,
	// or RoleEmbed when tied), soft-capped where SoftCap is positive.
	StageLMHead
	// StageQKNorm normalises each query head and each key head of the QKV projection's
	// output over head_dim (Weight RoleQNorm, the keys' RoleKNorm; Norm, Eps), between
	// the projection and the rotary.
	StageQKNorm
	// StagePostNorm normalises the branch before the residual adds it: branch =
	// norm(branch) (Weight RolePostAttnNorm or RolePostMLPNorm; Norm, Eps).
	StagePostNorm
	// StageMoE is a sparse layer's MLP on x, a mixture of experts: the router's logits
	// (RoleRouter), a softmax over all Experts in float32, the TopK most probable experts
	// (renormalised to sum to 1 when NormTopK), each a gated MLP (RoleExpertUp,
	// RoleExpertDown) weighted by its probability, summed; plus, with SharedExpert,
	// sigmoid(shared_gate · x) times the shared expert (RoleSharedGate, RoleSharedUp,
	// RoleSharedDown): the branch the next StageResidual adds.
	StageMoE

	// NumStageKinds counts the kinds.
	NumStageKinds
)

// stageNames are the kinds' names in messages.
var stageNames = [NumStageKinds]string{"embed", "norm", "qkv", "rotary", "kv_write", "attention",
	"out", "mlp", "residual", "lm_head", "qk_norm", "post_norm", "moe"}

// String names the kind.
func (k StageKind) String() string {
	if k < NumStageKinds {
		return stageNames[k]
	}
	return fmt.Sprintf("stage(%d)", k)
}

// Stage is one step of the forward pass with the values it takes in its layer. The fields
// a kind does not read are zero.
type Stage struct {
	// Kind is what the stage does.
	Kind StageKind
	// Layer is the transformer block the stage belongs to; -1 for the model's own stages
	// (the embedding, the final norm, the LM head).
	Layer int
	// Weight is a norm's weight role: a StageNorm's RoleAttnNorm, RoleMLPNorm or
	// RoleFinalNorm; a StageQKNorm's RoleQNorm; a StagePostNorm's RolePostAttnNorm or
	// RolePostMLPNorm.
	Weight Role
	// Norm and Eps are a norm stage's normalisation and epsilon.
	Norm NormKind
	Eps  float32
	// Rope is a StageRotary's rotary embedding; Rope.Dim dimensions of each query and key
	// head rotate (fewer than head_dim under a partial rotary factor), the rest pass.
	Rope Rope
	// Window, when positive, limits a StageAttention query to the last Window positions,
	// its own included.
	Window int
	// Scale multiplies a StageAttention's query·key products (Config.AttnScale), or, when
	// positive, a StageEmbed's embeddings (Config.EmbedScale).
	Scale float32
	// SoftCap, when positive, caps a StageAttention's scaled products, or a StageLMHead's
	// logits, at ±SoftCap by SoftCap·tanh(x/SoftCap) (Gemma 2).
	SoftCap float32
	// Gated and Act are a StageMLP's kind: act(gate(x)) · up(x) when Gated, else act(up(x));
	// a StageMoE's experts are gated MLPs with Act.
	Gated bool
	Act   Activation
	// Experts, TopK and NormTopK are a StageMoE's routing; SharedExpert adds its shared
	// expert. The experts' widths are the descriptor's (Config.MoE).
	Experts, TopK          int
	NormTopK, SharedExpert bool
}

// Recipe is the forward pass as an ordered list of stages — the embedding, each layer's
// stages in layer order, then the final norm and the LM head — with the values each takes
// in its layer. Both engines walk it: a layer feature is a stage, or a value of one,
// derived here once from the descriptor and implemented once per engine.
type Recipe []Stage

// AttentionScale is the query·key scale of heads of width d, 1/√d computed in float32 as
// the CUDA kernels compute it (1.f / sqrtf(d)), so that both engines use one value.
func AttentionScale(d int) float32 {
	return 1 / float32(math.Sqrt(float64(float32(d))))
}

// Recipe derives the forward pass the descriptor describes: a pre-norm decoder, each
// layer norm → QKV → [q/k norm] → rotary (under rotary positions) → KV write → attention
// → output projection → [post-norm] → residual → norm → MLP (or mixture of experts) →
// [post-norm] → residual.
func (c *Config) Recipe() Recipe {
	r := make(Recipe, 0, 3+13*c.Layers)
	norm := func(k StageKind, w Role, l int) Stage {
		return Stage{Kind: k, Layer: l, Weight: w, Norm: c.Norm, Eps: c.NormEps}
	}
	r = append(r, Stage{Kind: StageEmbed, Layer: -1, Scale: float32(c.EmbedScale)})
	for l := range c.Layers {
		r = append(r, norm(StageNorm, RoleAttnNorm, l), Stage{Kind: StageQKV, Layer: l})
		if c.QKNorm {
			r = append(r, norm(StageQKNorm, RoleQNorm, l))
		}
		if c.Positions == RotaryPositions {
			r = append(r, Stage{Kind: StageRotary, Layer: l, Rope: c.LayerRope(l)})
		}
		r = append(r,
			Stage{Kind: StageKVWrite, Layer: l},
			Stage{Kind: StageAttention, Layer: l, Window: c.LayerWindow(l), Scale: c.AttnScale(),
				SoftCap: float32(c.AttnSoftcap)},
			Stage{Kind: StageOut, Layer: l})
		if c.PostNorms {
			r = append(r, norm(StagePostNorm, RolePostAttnNorm, l))
		}
		r = append(r,
			Stage{Kind: StageResidual, Layer: l},
			norm(StageNorm, RoleMLPNorm, l),
			c.mlpStage(l))
		if c.PostNorms {
			r = append(r, norm(StagePostNorm, RolePostMLPNorm, l))
		}
		r = append(r, Stage{Kind: StageResidual, Layer: l})
	}
	return append(r, norm(StageNorm, RoleFinalNorm, -1),
		Stage{Kind: StageLMHead, Layer: -1, SoftCap: float32(c.FinalSoftcap)})
}

// mlpStage is layer l's MLP: the mixture of experts in a sparse layer, else the dense MLP.
func (c *Config) mlpStage(l int) Stage {
	if m := c.MoE; c.Sparse(l) {
		return Stage{Kind: StageMoE, Layer: l, Gated: true, Act: c.Act, Experts: m.Experts, TopK: m.TopK,
			NormTopK: m.NormTopK, SharedExpert: m.SharedInner > 0}
	}
	return Stage{Kind: StageMLP, Layer: l, Gated: c.GatedMLP, Act: c.Act}
}

// Layer returns layer l's stages (l = -1: the model's own, in order).
func (r Recipe) Layer(l int) []Stage {
	var out []Stage
	for _, s := range r {
		if s.Layer == l {
			out = append(out, s)
		}
	}
	return out
}

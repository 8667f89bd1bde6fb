package model

import "fmt"

// Role is the canonical part a weight plays, the same for every architecture. Matrices
// are [out][in] row-major (torch's Linear layout) whatever the checkpoint stores;
// vectors are [n]. A role an architecture lacks (a LayerNorm bias under RMSNorm, the
// position embedding under rotary positions, a separate LM head when it is tied) is
// absent, not zero.
type Role uint8

const (
	// RoleEmbed is the token embedding [vocab][hidden].
	RoleEmbed Role = iota
	// RolePosEmbed is the learned position embedding [positions][hidden].
	RolePosEmbed
	// RoleFinalNorm and RoleFinalNormBias are the norm before the LM head [hidden].
	RoleFinalNorm
	RoleFinalNormBias
	// RoleLMHead is the output projection [vocab][hidden] when not tied to RoleEmbed.
	RoleLMHead

	// RoleAttnNorm and RoleAttnNormBias are the norm before attention [hidden].
	RoleAttnNorm
	RoleAttnNormBias
	// RoleQKV is the fused query, key and value projection [(heads+2·kv_heads)·head_dim]
	// [hidden]: the query rows, then the key rows, then the value rows, each head's
	// head_dim rows together; RoleQKVBias is its bias.
	RoleQKV
	RoleQKVBias
	// RoleOut is the attention output projection [hidden][heads·head_dim]; RoleOutBias its bias.
	RoleOut
	RoleOutBias
	// RoleMLPNorm and RoleMLPNormBias are the norm before the MLP [hidden].
	RoleMLPNorm
	RoleMLPNormBias
	// RoleUp is the MLP's first projection: [inner][hidden], or for a gated MLP
	// [2·inner][hidden] with the gate's rows first, then the up-projection's; RoleUpBias
	// is its bias.
	RoleUp
	RoleUpBias
	// RoleDown is the MLP's second projection [hidden][inner]; RoleDownBias its bias.
	RoleDown
	RoleDownBias
	// RoleQNorm and RoleKNorm are the per-head norms of the queries and keys [head_dim]
	// (Config.QKNorm).
	RoleQNorm
	RoleKNorm
	// RolePostAttnNorm and RolePostMLPNorm normalise attention's and the MLP's outputs
	// before the residual add [hidden] (Config.PostNorms).
	RolePostAttnNorm
	RolePostMLPNorm
	// RoleRouter scores a mixture-of-experts layer's experts [experts][hidden]. The
	// roles up to RoleSharedGate are those layers' alone, where RoleUp and RoleDown are
	// absent (Config.LayerShape).
	RoleRouter
	// RoleExpertUp is every expert's gate and up projections [experts·2·moe_inner][hidden]:
	// expert 0's gate rows, then its up rows, then expert 1's, …
	RoleExpertUp
	// RoleExpertDown is every expert's down projection [experts·hidden][moe_inner], expert
	// by expert.
	RoleExpertDown
	// RoleSharedUp and RoleSharedDown are the shared expert's projections
	// [2·shared_inner][hidden] (gate rows first) and [hidden][shared_inner].
	RoleSharedUp
	RoleSharedDown
	// RoleSharedGate scales the shared expert's output by sigmoid(shared_gate · x)
	// [1][hidden].
	RoleSharedGate

	// NumRoles counts the roles.
	NumRoles
)

// FirstLayerRole is the first per-layer role; the ones before it are the model's.
const FirstLayerRole = RoleAttnNorm

// roleNames are the roles' names in messages and in the C ABI's documentation.
var roleNames = [NumRoles]string{
	"embed", "pos_embed", "final_norm", "final_norm_bias", "lm_head",
	"attn_norm", "attn_norm_bias", "qkv", "qkv_bias", "out", "out_bias",
	"mlp_norm", "mlp_norm_bias", "up", "up_bias", "down", "down_bias",
	"q_norm", "k_norm", "post_attn_norm", "post_mlp_norm",
	"router", "expert_up", "expert_down", "shared_up", "shared_down", "shared_gate",
}

// String names the role.
func (r Role) String() string {
	if r < NumRoles {
		return roleNames[r]
	}
	return fmt.Sprintf("role(%d)", r)
}

// PerLayer says whether the role has one weight per layer.
func (r Role) PerLayer() bool { return r >= FirstLayerRole && r < NumRoles }

// Shape is the role's canonical shape under c — [rows, cols] for a matrix, [n, 1] for
// a vector — and whether the architecture has it at all.
func (c *Config) Shape(r Role) (rows, cols int, present bool) {
	H, V := c.Hidden, c.VocabSize
	up := c.Inner
	if c.GatedMLP {
		up = 2 * c.Inner
	}
	normBias := c.Norm.HasBias()
	switch r {
	case RoleEmbed:
		return V, H, true
	case RolePosEmbed:
		return c.MaxPositions, H, c.Positions == LearnedPositions
	case RoleFinalNorm, RoleAttnNorm, RoleMLPNorm:
		return H, 1, true
	case RoleFinalNormBias, RoleAttnNormBias, RoleMLPNormBias:
		return H, 1, normBias
	case RoleLMHead:
		return V, H, !c.TiedHead
	case RoleQKV:
		return c.QKVWidth(), H, true
	case RoleQKVBias:
		return c.QKVWidth(), 1, c.QKVBias
	case RoleOut:
		return H, c.AttnWidth(), true
	case RoleOutBias:
		return H, 1, c.OutBias
	case RoleUp:
		return up, H, true
	case RoleUpBias:
		return up, 1, c.MLPBias
	case RoleDown:
		return H, c.Inner, true
	case RoleDownBias:
		return H, 1, c.MLPBias
	case RoleQNorm, RoleKNorm:
		return c.HeadDim, 1, c.QKNorm
	case RolePostAttnNorm, RolePostMLPNorm:
		return H, 1, c.PostNorms
	}
	return c.moeShape(r)
}

// LayerShape is role r's shape in layer l: Shape, less the dense MLP's roles in a layer
// whose MLP is the mixture of experts and the experts' in the others.
func (c *Config) LayerShape(r Role, l int) (rows, cols int, present bool) {
	switch r {
	case RoleUp, RoleUpBias, RoleDown, RoleDownBias:
		if c.Sparse(l) {
			return 0, 0, false
		}
	case RoleRouter, RoleExpertUp, RoleExpertDown, RoleSharedUp, RoleSharedDown, RoleSharedGate:
		if !c.Sparse(l) {
			return 0, 0, false
		}
	}
	return c.Shape(r)
}

// IsVector says whether the role is a vector (a norm weight or a bias).
func (r Role) IsVector() bool {
	switch r {
	case RoleEmbed, RolePosEmbed, RoleLMHead, RoleQKV, RoleOut, RoleUp, RoleDown, RoleRouter, RoleExpertUp,
		RoleExpertDown, RoleSharedUp, RoleSharedDown, RoleSharedGate:
		return false
	}
	return true
}

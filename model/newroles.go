package model

import "fmt"

// newRole is a weight role the families of issue 37 add to Role's; the per-layer recipe
// is to take them in. Like Role's, matrices are [out][in] row-major and vectors [n]. (The
// mixture of experts' roles are Role's already: RoleRouter … RoleSharedGate.)
type newRole uint8

const (
	// roleQNorm and roleKNorm are the per-head norms of queries and keys [head_dim].
	roleQNorm newRole = iota
	roleKNorm
	// rolePostAttnNorm and rolePostMLPNorm normalise attention's and the MLP's outputs
	// before the residual [hidden] (Gemma).
	rolePostAttnNorm
	rolePostMLPNorm

	// numNewRoles counts the new roles.
	numNewRoles
)

// newRoleNames are the new roles' names in messages.
var newRoleNames = [numNewRoles]string{"q_norm", "k_norm", "post_attn_norm", "post_mlp_norm"}

// String names the role.
func (r newRole) String() string {
	if r < numNewRoles {
		return newRoleNames[r]
	}
	return fmt.Sprintf("new_role(%d)", r)
}

// extraShape is a new role's canonical shape in layer l — [rows, cols], [n, 1] for a
// vector — and whether layer l has it.
func (x *Features) extraShape(c *Config, r newRole, _ int) (rows, cols int, present bool) {
	switch r {
	case roleQNorm, roleKNorm:
		return c.HeadDim, 1, x.QKNorm
	case rolePostAttnNorm, rolePostMLPNorm:
		return c.Hidden, 1, x.PostNorms
	}
	return 0, 0, false
}

// layerShape is Role r's shape in layer l under the features: Config.LayerShape.
func (x *Features) layerShape(c *Config, r Role, l int) (rows, cols int, present bool) {
	if r.PerLayer() {
		return c.LayerShape(r, l)
	}
	return c.Shape(r)
}

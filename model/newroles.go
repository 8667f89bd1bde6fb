package model

import "fmt"

// newRole is a weight role the MoE families of issue 37 add to Role's; the per-layer
// recipe is to take them in. Like Role's, matrices are [out][in] row-major and vectors [n].
type newRole uint8

const (
	// roleRouter scores the experts [experts][hidden].
	roleRouter newRole = iota
	// roleExpertUp is every expert's gate and up projections [experts·2·moe_inner][hidden]:
	// expert 0's gate rows, then its up rows, then expert 1's, …
	roleExpertUp
	// roleExpertDown is every expert's down projection [experts·hidden][moe_inner], expert
	// by expert.
	roleExpertDown
	// roleSharedUp and roleSharedDown are the shared expert's projections
	// [2·shared_inner][hidden] (gate rows first) and [hidden][shared_inner].
	roleSharedUp
	roleSharedDown
	// roleSharedGate scales the shared expert's output by sigmoid(shared_gate · x) [1][hidden].
	roleSharedGate

	// numNewRoles counts the new roles.
	numNewRoles
)

// newRoleNames are the new roles' names in messages.
var newRoleNames = [numNewRoles]string{
	"router", "expert_up", "expert_down",
	"shared_up", "shared_down", "shared_gate",
}

// String names the role.
func (r newRole) String() string {
	if r < numNewRoles {
		return newRoleNames[r]
	}
	return fmt.Sprintf("new_role(%d)", r)
}

// sparse says whether layer l's MLP is the mixture of experts.
func (x *Features) sparse(l int) bool { return x.MoE != nil && x.MoE.Sparse[l] }

// extraShape is a new role's canonical shape in layer l — [rows, cols], [n, 1] for a
// vector — and whether layer l has it.
func (x *Features) extraShape(c *Config, r newRole, l int) (rows, cols int, present bool) {
	H := c.Hidden
	if !x.sparse(l) {
		return 0, 0, false
	}
	m := x.MoE
	switch r {
	case roleRouter:
		return m.Experts, H, true
	case roleExpertUp:
		return m.Experts * 2 * m.Inner, H, true
	case roleExpertDown:
		return m.Experts * H, m.Inner, true
	case roleSharedUp:
		return 2 * m.SharedInner, H, m.SharedInner > 0
	case roleSharedDown:
		return H, m.SharedInner, m.SharedInner > 0
	case roleSharedGate:
		return 1, H, m.SharedInner > 0
	}
	return 0, 0, false
}

// layerShape is Role r's shape in layer l under the features: Config.Shape, less the
// dense MLP in the layers whose MLP is the mixture.
func (x *Features) layerShape(c *Config, r Role, l int) (rows, cols int, present bool) {
	if r.PerLayer() && x.sparse(l) {
		switch r {
		case RoleUp, RoleUpBias, RoleDown, RoleDownBias:
			return 0, 0, false
		}
	}
	return c.Shape(r)
}

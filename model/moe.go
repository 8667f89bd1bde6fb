package model

import "fmt"

// The mixture-of-experts families: Mixtral (8 experts, top 2, always renormalised),
// Qwen2-MoE (many small experts, norm_topk_prob, a shared expert with a sigmoid gate)
// and Qwen3-MoE (Qwen3's attention, norm_topk_prob, no shared expert). Each expert is a
// gated MLP with the model's activation; the router is a bias-free linear layer over the
// experts. The recipe gives a sparse layer a StageMoE in place of StageMLP.

// MoE describes the sparse MLPs: a router scores Experts experts per token (softmax over
// all of them, in float32), the TopK best run, each weighted by its probability —
// renormalised over the TopK when NormTopK — and their sum, plus the shared expert's
// output where there is one, is the MLP's output.
type MoE struct {
	// Experts is the number of experts, TopK how many each token goes to.
	Experts, TopK int
	// Inner is one expert's inner width (its gate's and up-projection's each).
	Inner int
	// NormTopK renormalises the TopK probabilities to sum to 1 (Mixtral always; Qwen's
	// norm_topk_prob).
	NormTopK bool
	// SharedInner, when positive, adds a shared expert of that inner width that every
	// token goes through, scaled by sigmoid(shared_gate · x) (Qwen2-MoE).
	SharedInner int
	// Sparse marks the layers whose MLP is the mixture; the others keep the dense MLP of
	// Config.Inner (Qwen's decoder_sparse_step and mlp_only_layers).
	Sparse []bool
	// FirstLocal and Local are the experts whose weights a rank's share holds under
	// expert parallelism (RankConfig): [FirstLocal, FirstLocal+Local) of Experts. Local 0
	// means every expert (a whole model, or experts split along their units). The router
	// still scores every expert.
	FirstLocal, Local int
}

// Held is the first expert whose weights the config's share holds and how many.
func (m *MoE) Held() (first, n int) {
	if m.Local == 0 {
		return 0, m.Experts
	}
	return m.FirstLocal, m.Local
}

// maxExperts bounds the experts before anything is sized by them.
const maxExperts = 1 << 12

// Sparse says whether layer l's MLP is the mixture of experts.
func (c *Config) Sparse(l int) bool {
	return c.MoE != nil && l >= 0 && l < len(c.MoE.Sparse) && c.MoE.Sparse[l]
}

// moeShape is the shape of a mixture-of-experts role under c (Shape's), present in a
// model with experts; LayerShape keeps it to the sparse layers.
func (c *Config) moeShape(r Role) (rows, cols int, present bool) {
	m := c.MoE
	if m == nil {
		return 0, 0, false
	}
	H := c.Hidden
	switch r {
	case RoleRouter:
		return m.Experts, H, true
	case RoleExpertUp:
		_, n := m.Held()
		return n * 2 * m.Inner, H, true
	case RoleExpertDown:
		_, n := m.Held()
		return n * H, m.Inner, true
	case RoleSharedUp:
		return 2 * m.SharedInner, H, m.SharedInner > 0
	case RoleSharedDown:
		return H, m.SharedInner, m.SharedInner > 0
	case RoleSharedGate:
		return 1, H, m.SharedInner > 0
	}
	return 0, 0, false
}

// checkMoE verifies the experts against the descriptor; field names a descriptor field's
// config.json field.
func (c *Config) checkMoE(field func(string) string) error {
	m := c.MoE
	if m == nil {
		return nil
	}
	switch {
	case m.Experts < 1 || m.Experts > maxExperts:
		return fmt.Errorf("field %s: %d is outside [1, %d]", field("experts"), m.Experts, maxExperts)
	case m.TopK < 1 || m.TopK > m.Experts:
		return fmt.Errorf("field num_experts_per_tok: %d is outside [1, %s %d]", m.TopK, field("experts"), m.Experts)
	case m.Inner < 1 || m.Inner > maxInner:
		return fmt.Errorf("field %s: %d is outside [1, %d]", field("moe_inner"), m.Inner, maxInner)
	case m.FirstLocal < 0 || m.Local < 0 || m.FirstLocal+m.Local > m.Experts || m.Local == 0 && m.FirstLocal != 0:
		return fmt.Errorf("field %s: a share's experts [%d, %d) outside the %d", field("experts"), m.FirstLocal, m.FirstLocal+m.Local, m.Experts)
	case m.SharedInner < 0 || m.SharedInner > maxInner:
		return fmt.Errorf("field shared_expert_intermediate_size: %d is outside [0, %d]", m.SharedInner, maxInner)
	case len(m.Sparse) != c.Layers:
		return fmt.Errorf("field %s: %d sparse-layer marks for %d layers", field("layers"), len(m.Sparse), c.Layers)
	case c.Positions != RotaryPositions || c.Norm != RMSNorm || !c.GatedMLP:
		return fmt.Errorf("field %s: experts in a model that is not LLaMA-shaped", field("experts"))
	}
	return nil
}

var mixtralFamily = &family{
	name:          "mixtral",
	modelTypes:    []string{"mixtral"},
	architectures: []string{"MixtralForCausalLM"},
	prefix:        "model.",
	layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
	parse:         parseMixtral,
	names:         mixtralNames,
}

var qwen2MoEFamily = &family{
	name:          "qwen2_moe",
	modelTypes:    []string{"qwen2_moe"},
	architectures: []string{"Qwen2MoeForCausalLM"},
	prefix:        "model.",
	layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
	parse:         func(p *configParser, c *Config) { parseQwenMoE(p, c, 2) },
	names:         qwenMoENames,
}

var qwen3MoEFamily = &family{
	name:          "qwen3_moe",
	modelTypes:    []string{"qwen3_moe"},
	architectures: []string{"Qwen3MoeForCausalLM"},
	prefix:        "model.",
	layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
	parse:         func(p *configParser, c *Config) { parseQwenMoE(p, c, 3) },
	names:         qwenMoENames,
}

// expertCount reads the number of experts from whichever of its names the config uses
// (transformers 5 writes num_local_experts for Mixtral and Qwen3-MoE, whose published
// configs say num_experts); both present must agree.
func expertCount(p *configParser, def int) int {
	n, local := p.has("num_experts"), p.has("num_local_experts")
	switch {
	case n && local:
		a, b := p.positive("num_experts", def), p.positive("num_local_experts", def)
		if a != b && p.err == nil {
			p.fail("num_local_experts", fmt.Errorf("%d differs from num_experts %d", b, a))
		}
		p.from("experts", "num_experts")
		return a
	case local:
		p.from("experts", "num_local_experts")
		return p.positive("num_local_experts", def)
	}
	p.from("experts", "num_experts")
	return p.positive("num_experts", def)
}

// parseMixtral reads MixtralConfig: every layer's MLP is the mixture of
// intermediate_size experts.
func parseMixtral(p *configParser, c *Config) {
	readDecoder(p, c, decoderDefaults{positions: 131072, eps: 1e-5, act: "silu", actField: "hidden_act"})
	m := &MoE{Experts: expertCount(p, 8), TopK: p.positive("num_experts_per_tok", 2), Inner: c.Inner, NormTopK: true}
	p.from("moe_inner", "intermediate_size")
	if p.err != nil {
		return
	}
	m.Sparse = make([]bool, c.Layers)
	for l := range m.Sparse {
		m.Sparse[l] = true
	}
	c.MoE = m
	// Mixtral's window covers every layer; a null one (the published configs') is none.
	if p.has("sliding_window") {
		c.SlidingWindow = p.positive("sliding_window", 0)
		if c.SlidingWindow >= c.MaxPositions {
			c.SlidingWindow = 0
		}
	}
	c.Rope = parseRope(p, c.HeadDim, c.MaxPositions)
}

// parseQwenMoE reads Qwen2MoeConfig (version 2) or Qwen3MoeConfig (3): layer l's MLP is
// the mixture when l is not in mlp_only_layers and l+1 is a multiple of
// decoder_sparse_step; the other layers keep a dense MLP of intermediate_size. Their
// window is Qwen2's.
func parseQwenMoE(p *configParser, c *Config, version int) {
	readDecoder(p, c, decoderDefaults{positions: 32768, eps: 1e-6, act: "silu", actField: "hidden_act"})
	def := moeDefaults[version]
	m := &MoE{Experts: expertCount(p, def.experts), TopK: p.positive("num_experts_per_tok", def.topK),
		Inner: p.positive("moe_intermediate_size", def.inner), NormTopK: p.boolean("norm_topk_prob", false)}
	p.from("moe_inner", "moe_intermediate_size")
	if version == 2 {
		// Qwen2-MoE's q, k and v carry biases (transformers 5 names it qkv_bias).
		c.QKVBias = p.boolean("qkv_bias", true)
		m.SharedInner = p.nonNegative("shared_expert_intermediate_size", def.shared)
	} else {
		bias := p.boolean("attention_bias", false)
		c.QKVBias, c.OutBias = bias, bias
		c.QKNorm = true
	}
	step := p.positive("decoder_sparse_step", 1)
	dense := p.layerList("mlp_only_layers", c.Layers)
	if p.err != nil {
		return
	}
	m.Sparse = make([]bool, c.Layers)
	for l := range m.Sparse {
		m.Sparse[l] = (l+1)%step == 0
	}
	for _, l := range dense {
		m.Sparse[l] = false
	}
	c.MoE = m
	qwenSliding(p, c)
	c.Rope = parseRope(p, c.HeadDim, c.MaxPositions)
	if c.SlidingWindow >= c.MaxPositions {
		c.SlidingWindow = 0 // a window as long as the context changes nothing
	}
}

// moeDefaults are the Qwen MoE config classes' defaults, by version.
var moeDefaults = map[int]struct{ experts, topK, inner, shared int }{
	2: {60, 4, 1408, 5632},
	3: {128, 8, 768, 0},
}

// expertNames lists, expert by expert, the tensors lp + "experts.E." + suffix of each
// suffix: an expert's projections joined along the rows.
func expertNames(lp string, experts int, suffixes ...string) []partName {
	parts := make([]partName, 0, experts*len(suffixes))
	for e := range experts {
		for _, s := range suffixes {
			parts = append(parts, partName{name: fmt.Sprintf("%sexperts.%d.%s", lp, e, s)})
		}
	}
	return parts
}

// mixtralNames maps the roles onto Mixtral's names: the LLaMA family's attention, and
// block_sparse_moe's router and experts — w1 an expert's gate, w3 its up projection, w2
// its down projection.
func mixtralNames(c *Config, r Role, l int) []partName {
	lp := fmt.Sprintf("layers.%d.block_sparse_moe.", l)
	switch r {
	case RoleRouter:
		return []partName{{name: lp + "gate.weight"}}
	case RoleExpertUp:
		return expertNames(lp, c.MoE.Experts, "w1.weight", "w3.weight")
	case RoleExpertDown:
		return expertNames(lp, c.MoE.Experts, "w2.weight")
	}
	return llamaNames(c, r, l)
}

// qwenMoENames maps the roles onto Qwen's: the LLaMA family's, mlp.gate (the router),
// mlp.experts.E.{gate,up,down}_proj, mlp.shared_expert.* and mlp.shared_expert_gate. A
// dense layer's MLP is the LLaMA family's mlp.*_proj.
func qwenMoENames(c *Config, r Role, l int) []partName {
	lp := fmt.Sprintf("layers.%d.mlp.", l)
	switch r {
	case RoleRouter:
		return []partName{{name: lp + "gate.weight"}}
	case RoleExpertUp:
		return expertNames(lp, c.MoE.Experts, "gate_proj.weight", "up_proj.weight")
	case RoleExpertDown:
		return expertNames(lp, c.MoE.Experts, "down_proj.weight")
	case RoleSharedUp:
		return []partName{{name: lp + "shared_expert.gate_proj.weight"}, {name: lp + "shared_expert.up_proj.weight"}}
	case RoleSharedDown:
		return []partName{{name: lp + "shared_expert.down_proj.weight"}}
	case RoleSharedGate:
		return []partName{{name: lp + "shared_expert_gate.weight"}}
	}
	return llamaNames(c, r, l)
}

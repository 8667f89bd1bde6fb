package model

import "fmt"

// The mixture-of-experts families: Mixtral (8 experts, top 2, always renormalised),
// Qwen2-MoE (many small experts, norm_topk_prob, a shared expert with a sigmoid gate)
// and Qwen3-MoE (Qwen3's attention, norm_topk_prob, no shared expert). Each expert is a
// gated SiLU MLP; the router is a bias-free linear layer over the experts.

var mixtralFamily = &pendingFamily{
	family: family{
		name:          "mixtral",
		modelTypes:    []string{"mixtral"},
		architectures: []string{"MixtralForCausalLM"},
		prefix:        "model.",
		layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
		names:         llamaNames,
	},
	parseFeatures: parseMixtral,
	extraNames:    mixtralNames,
}

var qwen2MoEFamily = &pendingFamily{
	family: family{
		name:          "qwen2_moe",
		modelTypes:    []string{"qwen2_moe"},
		architectures: []string{"Qwen2MoeForCausalLM"},
		prefix:        "model.",
		layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
		names:         llamaNames,
	},
	parseFeatures: func(p *configParser, c *Config, x *Features) { parseQwenMoE(p, c, x, 2) },
	extraNames:    qwenMoENames,
}

var qwen3MoEFamily = &pendingFamily{
	family: family{
		name:          "qwen3_moe",
		modelTypes:    []string{"qwen3_moe"},
		architectures: []string{"Qwen3MoeForCausalLM"},
		prefix:        "model.",
		layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
		names:         llamaNames,
	},
	parseFeatures: func(p *configParser, c *Config, x *Features) { parseQwenMoE(p, c, x, 3) },
	extraNames:    qwenMoENames,
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
		return a
	case local:
		return p.positive("num_local_experts", def)
	}
	return p.positive("num_experts", def)
}

// parseMixtral reads MixtralConfig: every layer's MLP is the mixture of
// intermediate_size experts.
func parseMixtral(p *configParser, c *Config, x *Features) {
	readDecoder(p, c, decoderDefaults{positions: 131072, eps: 1e-5, act: "silu", actField: "hidden_act"})
	m := &MoE{Experts: expertCount(p, 8), TopK: p.positive("num_experts_per_tok", 2), Inner: c.Inner, NormTopK: true}
	if p.err != nil {
		return
	}
	m.Sparse = make([]bool, c.Layers)
	for l := range m.Sparse {
		m.Sparse[l] = true
	}
	x.MoE = m
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
// decoder_sparse_step; the other layers keep a dense MLP of intermediate_size.
func parseQwenMoE(p *configParser, c *Config, x *Features, version int) {
	readDecoder(p, c, decoderDefaults{positions: 32768, eps: 1e-6, act: "silu", actField: "hidden_act"})
	def := moeDefaults[version]
	m := &MoE{Experts: expertCount(p, def.experts), TopK: p.positive("num_experts_per_tok", def.topK),
		Inner: p.positive("moe_intermediate_size", def.inner), NormTopK: p.boolean("norm_topk_prob", false)}
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
	x.MoE = m
	qwenSliding(p, c)
	c.Rope = parseRope(p, c.HeadDim, c.MaxPositions)
}

// moeDefaults are the Qwen MoE config classes' defaults, by version.
var moeDefaults = map[int]struct{ experts, topK, inner, shared int }{
	2: {60, 4, 1408, 5632},
	3: {128, 8, 768, 0},
}

// mixtralNames maps the router and the experts onto block_sparse_moe's names: w1 is an
// expert's gate, w3 its up projection, w2 its down projection.
func mixtralNames(_ *Config, x *Features, r newRole, l int) []partName {
	if !x.sparse(l) {
		return nil
	}
	lp := fmt.Sprintf("layers.%d.block_sparse_moe.", l)
	switch r {
	case roleRouter:
		return []partName{{name: lp + "gate.weight"}}
	case roleExpertUp, roleExpertDown:
		var parts []partName
		for e := range x.MoE.Experts {
			ep := fmt.Sprintf("%sexperts.%d.", lp, e)
			if r == roleExpertUp {
				parts = append(parts, partName{name: ep + "w1.weight"}, partName{name: ep + "w3.weight"})
			} else {
				parts = append(parts, partName{name: ep + "w2.weight"})
			}
		}
		return parts
	}
	return nil
}

// qwenMoENames maps the router, the experts and the shared expert onto Qwen's mlp.gate,
// mlp.experts.E.{gate,up,down}_proj, mlp.shared_expert.* and mlp.shared_expert_gate.
func qwenMoENames(_ *Config, x *Features, r newRole, l int) []partName {
	if !x.sparse(l) {
		return nil
	}
	lp := fmt.Sprintf("layers.%d.mlp.", l)
	switch r {
	case roleRouter:
		return []partName{{name: lp + "gate.weight"}}
	case roleExpertUp, roleExpertDown:
		var parts []partName
		for e := range x.MoE.Experts {
			ep := fmt.Sprintf("%sexperts.%d.", lp, e)
			if r == roleExpertUp {
				parts = append(parts, partName{name: ep + "gate_proj.weight"}, partName{name: ep + "up_proj.weight"})
			} else {
				parts = append(parts, partName{name: ep + "down_proj.weight"})
			}
		}
		return parts
	case roleSharedUp:
		return []partName{{name: lp + "shared_expert.gate_proj.weight"}, {name: lp + "shared_expert.up_proj.weight"}}
	case roleSharedDown:
		return []partName{{name: lp + "shared_expert.down_proj.weight"}}
	case roleSharedGate:
		return []partName{{name: lp + "shared_expert_gate.weight"}}
	}
	return nil
}

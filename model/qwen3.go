package model

import "fmt"

// qwen3Family loads Qwen3's dense models (model_type qwen3): the Qwen2 shape without
// q/k/v biases (attention_bias), with queries and keys RMS-normalised per head before
// rotary (self_attn.q_norm, self_attn.k_norm), and head_dim 128 unless the config says.
var qwen3Family = &pendingFamily{
	family: family{
		name:          "qwen3",
		modelTypes:    []string{"qwen3"},
		architectures: []string{"Qwen3ForCausalLM"},
		prefix:        "model.",
		layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
		names:         llamaNames,
	},
	parseFeatures: parseQwen3,
	extraNames:    qkNormNames,
}

// parseQwen3 reads Qwen3Config with the defaults transformers gives its absent fields.
func parseQwen3(p *configParser, c *Config, x *Features) {
	readDecoder(p, c, decoderDefaults{positions: 32768, eps: 1e-6, act: "silu", actField: "hidden_act", headDim: 128})
	bias := p.boolean("attention_bias", false)
	c.QKVBias, c.OutBias = bias, bias
	x.QKNorm = true
	if p.err != nil {
		return
	}
	qwenSliding(p, c, x)
	c.Rope = parseRope(p, c.HeadDim, c.MaxPositions)
}

// qkNormNames maps q_norm and k_norm onto self_attn.q_norm and self_attn.k_norm (Qwen3,
// Qwen3-MoE, Gemma 3).
func qkNormNames(_ *Config, _ *Features, r newRole, l int) []partName {
	lp := fmt.Sprintf("layers.%d.self_attn.", l)
	switch r {
	case roleQNorm:
		return []partName{{name: lp + "q_norm.weight"}}
	case roleKNorm:
		return []partName{{name: lp + "k_norm.weight"}}
	}
	return nil
}

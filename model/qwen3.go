package model

import "fmt"

// qwen3Family loads Qwen3's dense models (model_type qwen3): the Qwen2 shape without
// q/k/v biases (attention_bias), with queries and keys RMS-normalised per head before
// rotary (self_attn.q_norm, self_attn.k_norm), and head_dim 128 unless the config says.
var qwen3Family = &family{
	name:          "qwen3",
	modelTypes:    []string{"qwen3"},
	architectures: []string{"Qwen3ForCausalLM"},
	prefix:        "model.",
	layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
	parse:         parseQwen3,
	names:         llamaNames,
}

// parseQwen3 reads Qwen3Config with the defaults transformers gives its absent fields.
func parseQwen3(p *configParser, c *Config) {
	readDecoder(p, c, decoderDefaults{positions: 32768, eps: 1e-6, act: "silu", actField: "hidden_act", headDim: 128})
	bias := p.boolean("attention_bias", false)
	c.QKVBias, c.OutBias = bias, bias
	c.QKNorm = true
	if p.err != nil {
		return
	}
	qwenSliding(p, c)
	c.Rope = parseRope(p, c.HeadDim, c.MaxPositions)
}

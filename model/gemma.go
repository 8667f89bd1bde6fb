package model

import (
	"encoding/json"
	"fmt"
	"math"
)

// gemma2Family loads Gemma 2 (model_type gemma2): embeddings scaled by √hidden,
// RMSNorm with (1 + w), pre- and post-norms around attention and the MLP, GeGLU with the
// tanh GELU, queries scaled by query_pre_attn_scalar^-½, attention-logit and final-logit
// soft-capping, and sliding-window layers alternating with global ones. Its MLP's input
// norm is pre_feedforward_layernorm; post_attention_layernorm normalises attention's
// output, as post_feedforward_layernorm does the MLP's. Every norm's weight is read as
// 1 + w in float32 (gemmaNames), so that the engines run a plain RMSNorm.
var gemma2Family = &family{
	name:          "gemma2",
	modelTypes:    []string{"gemma2"},
	architectures: []string{"Gemma2ForCausalLM"},
	prefix:        "model.",
	layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
	parse:         func(p *configParser, c *Config) { parseGemma(p, c, 2) },
	names:         gemmaNames,
}

// gemma3Family loads Gemma 3's text models (model_type gemma3_text, Gemma3ForCausalLM:
// the 270M and 1B checkpoints): Gemma 2's layer without soft-capping by default, with
// q_norm and k_norm, a sliding/global layer pattern (sliding_window_pattern or
// layer_types), and a rope per layer kind — rope_local_base_freq for the sliding layers,
// rope_theta with any rope_scaling for the global ones (transformers 5 writes both as
// rope_parameters keyed by layer type).
var gemma3Family = &family{
	name:          "gemma3",
	modelTypes:    []string{"gemma3_text"},
	architectures: []string{"Gemma3ForCausalLM"},
	prefix:        "model.",
	layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
	parse:         func(p *configParser, c *Config) { parseGemma(p, c, 3) },
	names:         gemmaNames,
}

// gemma3VLFamily reads the text half of Gemma 3's image-text checkpoints (model_type
// gemma3, Gemma3ForConditionalGeneration: 4B, 12B, 27B) from text_config. Their text
// tensors sit under language_model.model. (as transformers 4 saved them; transformers 5
// names them model.language_model.), beside the vision tower's, which gollm leaves.
var gemma3VLFamily = &family{
	name:          "gemma3",
	modelTypes:    []string{"gemma3"},
	architectures: []string{"Gemma3ForConditionalGeneration"},
	prefix:        "language_model.model.",
	morePrefixes:  []string{"model.language_model."},
	layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
	parse:         parseGemma3VL,
	names:         gemmaNames,
}

// parseGemma reads Gemma2Config (version 2) or Gemma3TextConfig (3) with the defaults
// transformers gives their absent fields.
func parseGemma(p *configParser, c *Config, version int) {
	// Gemma2Config's and Gemma3TextConfig's defaults: Gemma 2 2B's and Gemma 3 4B's sizes.
	d := decoderDefaults{positions: 8192, eps: 1e-6, act: "gelu_pytorch_tanh", actField: "hidden_activation", headDim: 256,
		tied: true, sizes: &[6]int{256000, 2304, 9216, 26, 8, 4}, bos: 2, eos: 1}
	if version == 3 {
		d.positions = 131072
		d.sizes[0] = 262208
	}
	readDecoder(p, c, d)
	bias := p.boolean("attention_bias", false)
	c.QKVBias, c.OutBias = bias, bias
	// Bidirectional attention (EmbeddingGemma) is not a decoder's.
	p.require("use_bidirectional_attention", false)
	c.PostNorms = true
	c.QKNorm = version == 3
	c.QueryScale = 1 / math.Sqrt(p.finitePositive("query_pre_attn_scalar", 256))
	capDefault, finalDefault := 0.0, 0.0
	if version == 2 {
		capDefault, finalDefault = 50, 30
	}
	c.AttnSoftcap = p.finitePositive("attn_logit_softcapping", capDefault)
	if _, present := p.m["attn_logit_softcapping"]; present && !p.has("attn_logit_softcapping") {
		c.AttnSoftcap = 0 // null: none
	}
	c.FinalSoftcap = p.finitePositive("final_logit_softcapping", finalDefault)
	if _, present := p.m["final_logit_softcapping"]; present && !p.has("final_logit_softcapping") {
		c.FinalSoftcap = 0
	}
	if p.err != nil {
		return
	}
	// The embedding scale: transformers multiplies by √hidden cast to the weights' type
	// (in bfloat16 √640 is 25.25); an engine rounds it to its activations' type alike.
	c.EmbedScale = math.Sqrt(float64(c.Hidden))

	// A null sliding_window is none; absent, the config class's 4096. The layer kinds
	// stand either way: Gemma 3's sliding layers keep their rope.
	if _, present := p.m["sliding_window"]; present {
		c.SlidingWindow = p.nonNegative("sliding_window", 0)
	} else {
		c.SlidingWindow = 4096
	}
	c.SlidingLayers = layerTypes(p, c.Layers)
	if c.SlidingLayers == nil && p.err == nil {
		// Gemma 2 alternates from a sliding layer 0; Gemma 3 makes every pattern-th layer
		// global (sliding_window_pattern, 6 by default).
		pattern := 2
		if version == 3 {
			pattern = p.positive("sliding_window_pattern", 6)
		}
		c.SlidingLayers = make([]bool, c.Layers)
		for l := range c.SlidingLayers {
			c.SlidingLayers[l] = (l+1)%pattern != 0
		}
	}
	if p.err != nil {
		return
	}
	if version == 2 {
		c.Rope = parseRope(p, c.HeadDim, c.MaxPositions)
		return
	}
	c.Rope, c.LocalRope = parseGemma3Rope(p, c.HeadDim, c.MaxPositions)
}

// parseGemma3Rope reads Gemma 3's two rotary embeddings: transformers 5's
// rope_parameters keyed by layer type, or rope_theta (global, 1,000,000 by default)
// with rope_scaling and rope_local_base_freq (sliding, 10,000) as the checkpoints
// published with transformers 4 have them.
func parseGemma3Rope(p *configParser, headDim, maxPositions int) (global, local Rope) {
	params := p.object("rope_parameters")
	_, keyed := params["full_attention"]
	if _, ok := params["sliding_attention"]; ok {
		keyed = true
	}
	if params != nil && keyed {
		read := func(kind string, theta float64) Rope {
			sub := params[kind]
			if len(sub) == 0 || string(sub) == "null" {
				sub = json.RawMessage(fmt.Sprintf(`{"rope_type": "default", "rope_theta": %g}`, theta))
			}
			sp := &configParser{m: map[string]json.RawMessage{"rope_parameters": sub}}
			r := parseRope(sp, headDim, maxPositions)
			if sp.err != nil {
				p.fail("rope_parameters."+kind, sp.err)
			}
			if !(r.Theta > 0) || math.IsInf(r.Theta, 0) {
				p.fail("rope_parameters."+kind+".rope_theta", fmt.Errorf("must be positive, got %g", r.Theta))
			}
			return r
		}
		global = read("full_attention", 1e6)
		local = read("sliding_attention", 1e4)
		p.from("rope_theta", "rope_parameters.full_attention.rope_theta")
		p.from("rope_factor", "rope_parameters.full_attention.factor")
		p.from("rope_local_base_freq", "rope_parameters.sliding_attention.rope_theta")
		return global, local
	}
	global = parseRope(p, headDim, maxPositions)
	if _, given := params["rope_theta"]; !given && !p.has("rope_theta") {
		global.Theta = 1e6 // the config class's global base, not LLaMA's
	}
	return global, Rope{Theta: p.finitePositive("rope_local_base_freq", 10000), Dim: headDim, Factor: 1}
}

// parseGemma3VL reads the text_config of Gemma 3's image-text config as a gemma3_text
// config; errors name the field under text_config.
func parseGemma3VL(p *configParser, c *Config) {
	text := p.object("text_config")
	if p.err != nil {
		return
	}
	if text == nil {
		p.fail("text_config", fmt.Errorf("missing: Gemma 3's image-text config keeps the language model's fields there"))
		return
	}
	sp := &configParser{m: text}
	parseGemma(sp, c, 3)
	if sp.err != nil {
		p.fail("text_config", sp.err)
	}
	for k, v := range sp.names {
		p.from(k, "text_config."+v)
	}
	// The token ids live at the top level of the image-text config.
	if c.BOSID < 0 {
		c.BOSID = p.tokenID("bos_token_id")
	}
	if len(c.EOSIDs) == 0 {
		c.EOSIDs = p.tokenIDs("eos_token_id")
	}
}

// gemmaNames maps the roles onto Gemma's names: the LLaMA family's, but the MLP's input
// norm is pre_feedforward_layernorm, post_attention_layernorm and
// post_feedforward_layernorm are the post-norms, and every norm weight (the q/k norms
// too) is read as 1 + w.
func gemmaNames(c *Config, r Role, l int) []partName {
	var names []partName
	switch r {
	case RoleMLPNorm:
		names = []partName{{name: fmt.Sprintf("layers.%d.pre_feedforward_layernorm.weight", l)}}
	case RolePostAttnNorm:
		names = []partName{{name: fmt.Sprintf("layers.%d.post_attention_layernorm.weight", l)}}
	case RolePostMLPNorm:
		names = []partName{{name: fmt.Sprintf("layers.%d.post_feedforward_layernorm.weight", l)}}
	default:
		names = llamaNames(c, r, l)
	}
	switch r {
	case RoleFinalNorm, RoleAttnNorm, RoleMLPNorm, RolePostAttnNorm, RolePostMLPNorm, RoleQNorm, RoleKNorm:
		for i := range names {
			names[i].plusOne = true
		}
	}
	return names
}

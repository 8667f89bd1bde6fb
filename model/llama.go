package model

import (
	"encoding/json"
	"fmt"
)

// llamaFamily loads the LLaMA-shaped decoders — Llama 2 and 3, TinyLlama, SmolLM
// (model_type llama), Mistral, Qwen2: RMSNorm, rotary positions, grouped-query
// attention with separate q/k/v projections (fused here into RoleQKV), a gated SiLU MLP
// (gate and up fused into RoleUp), and an LM head that is tied or not.
var llamaFamily = &family{
	name:          "llama",
	modelTypes:    []string{"llama", "mistral", "qwen2"},
	architectures: []string{"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"},
	prefix:        "model.",
	layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
	parse:         parseLlama,
	names:         llamaNames,
}

// parseLlama reads LlamaConfig, MistralConfig and Qwen2Config, with the defaults
// transformers gives their absent fields.
func parseLlama(p *configParser, c *Config) {
	mt := p.str("model_type", "llama")
	c.VocabSize = p.positive("vocab_size", 0)
	c.Hidden = p.positive("hidden_size", 0)
	c.Inner = p.positive("intermediate_size", 0)
	c.Layers = p.positive("num_hidden_layers", 0)
	c.Heads = p.positive("num_attention_heads", 0)
	c.KVHeads = p.positive("num_key_value_heads", c.Heads)
	defPositions, defEps := 32768, 1e-6
	if mt == "llama" {
		defPositions = 2048
	}
	c.MaxPositions = p.positive("max_position_embeddings", defPositions)
	c.Norm = RMSNorm
	c.NormEps = float32(p.number("rms_norm_eps", defEps))
	c.Positions = RotaryPositions
	c.GatedMLP = true
	c.Act = p.activation("hidden_act", "silu")
	c.TiedHead = p.boolean("tie_word_embeddings", false)
	c.BOSID = p.tokenID("bos_token_id")
	c.EOSIDs = p.tokenIDs("eos_token_id")
	p.fromAll("vocab", "vocab_size", "positions", "max_position_embeddings", "hidden", "hidden_size",
		"layers", "num_hidden_layers", "heads", "num_attention_heads", "kv_heads", "num_key_value_heads",
		"head_dim", "head_dim", "inner", "intermediate_size", "eps", "rms_norm_eps")
	switch mt {
	case "qwen2":
		// Qwen2's q, k and v projections always carry biases; o_proj and the MLP never.
		c.QKVBias = true
		// Qwen2Config keeps the window only with use_sliding_window, and a null one is
		// none; the layers it applies to are those from max_window_layers on, or the ones
		// layer_types marks sliding_attention where the config lists them.
		if p.boolean("use_sliding_window", false) {
			if _, present := p.m["sliding_window"]; present {
				c.SlidingWindow = p.nonNegative("sliding_window", 0)
			} else {
				c.SlidingWindow = 4096
			}
			c.WindowFromLayer = p.nonNegative("max_window_layers", 28)
			if p.has("layer_types") && p.err == nil {
				c.WindowFromLayer = slidingLayersFrom(p, c.Layers)
			}
		}
	default:
		bias := p.boolean("attention_bias", false)
		c.QKVBias, c.OutBias = bias, bias
		c.MLPBias = p.boolean("mlp_bias", false)
		if mt == "mistral" {
			// MistralConfig's default window is 4096; a null one means none.
			if _, present := p.m["sliding_window"]; present {
				c.SlidingWindow = p.nonNegative("sliding_window", 0)
			} else {
				c.SlidingWindow = 4096
			}
		}
	}
	if p.err != nil {
		return
	}
	if p.has("head_dim") {
		c.HeadDim = p.positive("head_dim", 0)
	} else if c.Hidden%c.Heads != 0 {
		p.fail("hidden_size", fmt.Errorf("%d is not a multiple of num_attention_heads %d (and no head_dim is given)", c.Hidden, c.Heads))
		return
	} else {
		c.HeadDim = c.Hidden / c.Heads
	}
	c.Rope = parseRope(p, c.HeadDim, c.MaxPositions)
	if c.SlidingWindow >= c.MaxPositions {
		c.SlidingWindow = 0 // a window as long as the context changes nothing
	}
}

// slidingLayersFrom reads Qwen2's layer_types, one "full_attention" or
// "sliding_attention" a layer, and returns the first sliding layer (layers when there is
// none). The engines window a suffix of the layers; any other pattern fails the load
// rather than being served with the wrong attention.
func slidingLayersFrom(p *configParser, layers int) int {
	var types []string
	if err := json.Unmarshal(p.get("layer_types"), &types); err != nil {
		p.fail("layer_types", fmt.Errorf("must be a list of strings, got %s", p.get("layer_types")))
		return layers
	}
	if len(types) != layers {
		p.fail("layer_types", fmt.Errorf("%d entries for num_hidden_layers %d", len(types), layers))
		return layers
	}
	first := layers
	for l, typ := range types {
		switch typ {
		case "full_attention":
			if first < layers {
				p.fail("layer_types", fmt.Errorf("layer %d is full_attention after sliding_attention in layer %d: only the last layers may slide", l, first))
				return layers
			}
		case "sliding_attention":
			first = min(first, l)
		default:
			p.fail("layer_types", fmt.Errorf("layer %d: %q is not supported (supported: full_attention, sliding_attention)", l, typ))
			return layers
		}
	}
	return first
}

// parseRope reads the rotary embedding: transformers 5's rope_parameters, or the older
// rope_theta with rope_scaling. A scaling type the engines do not implement fails the
// load naming it.
func parseRope(p *configParser, headDim, maxPositions int) Rope {
	r := Rope{Theta: 10000, Dim: rotaryDims(p, headDim), Factor: 1}
	params, field := p.object("rope_parameters"), "rope_parameters"
	if params == nil {
		r.Theta = p.number("rope_theta", 10000)
		params, field = p.object("rope_scaling"), "rope_scaling"
	}
	if params == nil {
		return r
	}
	sub := &configParser{m: params}
	if sub.has("rope_theta") {
		r.Theta = sub.number("rope_theta", r.Theta)
		p.from("rope_theta", field+".rope_theta")
	}
	// check names the factor where this config holds it.
	p.from("rope_factor", field+".factor")
	kind := sub.str("rope_type", sub.str("type", "default"))
	switch kind {
	case "default", "":
		r.Kind = RopeDefault
	case "linear":
		r.Kind = RopeLinear
		r.Factor = sub.number("factor", 0)
	case "dynamic":
		// Dynamic NTK scaling changes the frequencies only for sequences longer than the
		// original context, which gollm serves at most: within it, it is the identity.
		r.Kind = RopeDefault
	case "llama3":
		r.Kind = RopeLlama3
		r.Factor = sub.number("factor", 0)
		r.LowFreqFactor = sub.number("low_freq_factor", 1)
		r.HighFreqFactor = sub.number("high_freq_factor", 4)
		r.OriginalMaxPositions = sub.positive("original_max_position_embeddings", 8192)
		if !(r.HighFreqFactor > r.LowFreqFactor) && sub.err == nil {
			sub.fail("high_freq_factor", fmt.Errorf("%g must exceed low_freq_factor %g", r.HighFreqFactor, r.LowFreqFactor))
		}
	default:
		p.fail(field, fmt.Errorf("rope type %q is not supported (supported: default, linear, dynamic, llama3)", kind))
		return r
	}
	if sub.err != nil {
		p.fail(field, sub.err)
	}
	return r
}

// rotaryDims reads partial_rotary_factor — beside the rope settings, or inside
// rope_parameters (or rope_scaling) where transformers 5 keeps it — and returns how many
// dimensions of each head rotate: int(head_dim · factor), as transformers computes it,
// which must be even and at least 2.
func rotaryDims(p *configParser, headDim int) int {
	factor, field := p.number("partial_rotary_factor", 1), "partial_rotary_factor"
	for _, name := range []string{"rope_parameters", "rope_scaling"} {
		if params := p.object(name); params != nil && params["partial_rotary_factor"] != nil {
			sub := &configParser{m: params}
			factor, field = sub.number("partial_rotary_factor", factor), name+".partial_rotary_factor"
			if sub.err != nil {
				p.fail(name, sub.err)
			}
			break
		}
	}
	if p.err != nil {
		return headDim
	}
	dim := int(float64(headDim) * factor)
	if !(factor > 0 && factor <= 1) || dim < 2 || dim%2 != 0 {
		p.fail(field, fmt.Errorf("%g rotates %d of head_dim %d dimensions: the factor must be in (0, 1] and rotate an even number, at least 2", factor, dim, headDim))
		return headDim
	}
	return dim
}

// llamaNames maps the roles onto the LLaMA family's tensor names (torch Linear layout,
// [out][in]); q/k/v and gate/up are joined along their output rows.
func llamaNames(c *Config, r Role, l int) []partName {
	one := func(name string) []partName { return []partName{{name: name}} }
	if !r.PerLayer() {
		switch r {
		case RoleEmbed:
			return one("embed_tokens.weight")
		case RoleFinalNorm:
			return one("norm.weight")
		case RoleLMHead:
			return one("lm_head.weight")
		}
		return nil
	}
	lp := fmt.Sprintf("layers.%d.", l)
	qkv := func(suffix string) []partName {
		return []partName{{name: lp + "self_attn.q_proj." + suffix}, {name: lp + "self_attn.k_proj." + suffix},
			{name: lp + "self_attn.v_proj." + suffix}}
	}
	gateUp := func(suffix string) []partName {
		return []partName{{name: lp + "mlp.gate_proj." + suffix}, {name: lp + "mlp.up_proj." + suffix}}
	}
	switch r {
	case RoleAttnNorm:
		return one(lp + "input_layernorm.weight")
	case RoleQKV:
		return qkv("weight")
	case RoleQKVBias:
		return qkv("bias")
	case RoleOut:
		return one(lp + "self_attn.o_proj.weight")
	case RoleOutBias:
		return one(lp + "self_attn.o_proj.bias")
	case RoleMLPNorm:
		return one(lp + "post_attention_layernorm.weight")
	case RoleUp:
		return gateUp("weight")
	case RoleUpBias:
		return gateUp("bias")
	case RoleDown:
		return one(lp + "mlp.down_proj.weight")
	case RoleDownBias:
		return one(lp + "mlp.down_proj.bias")
	case RoleQNorm:
		return one(lp + "self_attn.q_norm.weight")
	case RoleKNorm:
		return one(lp + "self_attn.k_norm.weight")
	}
	return nil
}

package model

import (
	"encoding/json"
	"fmt"
	"math"
)

// phi3Family loads Phi-3, Phi-3.5, Phi-4 and Phi-4-mini (model_type phi3): the LLaMA
// layer with q, k and v stored as one fused qkv_proj and gate and up as one gate_up_proj
// (the rows of RoleQKV and RoleUp as they are), a partial rotary factor (Phi-4-mini
// rotates 3/4 of each head), longrope scaling (short and long factors per rotated pair,
// with an attention factor: the 128k checkpoints, Phi-3.5, Phi-4-mini), and one sliding
// window over every layer when the config gives one.
var phi3Family = &family{
	name:          "phi3",
	modelTypes:    []string{"phi3"},
	architectures: []string{"Phi3ForCausalLM"},
	prefix:        "model.",
	layerPrefix:   func(l int) string { return fmt.Sprintf("layers.%d.", l) },
	parse:         parsePhi3,
	names:         phi3Names,
}

// parsePhi3 reads Phi3Config with the defaults transformers gives its absent fields.
func parsePhi3(p *configParser, c *Config) {
	readDecoder(p, c, decoderDefaults{positions: 4096, eps: 1e-5, act: "silu", actField: "hidden_act"})
	if p.err != nil {
		return
	}
	// Phi3Config's window (none by default, null: none) applies to every layer; one as
	// long as the context changes nothing.
	c.SlidingWindow = p.nonNegative("sliding_window", 0)
	if c.SlidingWindow >= c.MaxPositions {
		c.SlidingWindow = 0
	}
	// transformers 5 writes rope_parameters; the published checkpoints rope_theta and
	// rope_scaling beside partial_rotary_factor and original_max_position_embeddings.
	params, field := p.object("rope_parameters"), "rope_parameters"
	if params == nil {
		params, field = p.object("rope_scaling"), "rope_scaling"
	}
	sub := &configParser{m: params}
	if sub.m == nil {
		sub.m = map[string]json.RawMessage{}
	}
	theta := p.number("rope_theta", 10000)
	if sub.has("rope_theta") {
		theta = sub.number("rope_theta", theta)
		p.from("rope_theta", field+".rope_theta")
	}
	partial := p.number("partial_rotary_factor", 1)
	if sub.has("partial_rotary_factor") {
		partial = sub.number("partial_rotary_factor", partial)
	}
	dim := int(float64(c.HeadDim) * partial) // transformers truncates likewise
	if !(partial > 0 && partial <= 1) || dim < 2 || dim%2 != 0 {
		p.fail("partial_rotary_factor", fmt.Errorf("%g of head_dim %d rotates %d dimensions: must be in (0, 1] and rotate an even number ≥ 2", partial, c.HeadDim, dim))
		return
	}
	c.Rope = Rope{Theta: theta, Dim: dim, Factor: 1}
	p.from("rope_scaling", field)
	kind := sub.str("rope_type", sub.str("type", "default"))
	switch kind {
	case "default", "":
	case "longrope", "su": // "su" is longrope's first name
		c.Rope.Kind = RopeLongRope
		c.Rope.LongRope, c.Rope.OriginalMaxPositions = parseLongRope(p, sub, field, c, dim)
	default:
		p.fail(field, fmt.Errorf("rope type %q is not supported (supported: default, longrope, su)", kind))
	}
	if sub.err != nil {
		p.fail(field, sub.err)
	}
}

// parseLongRope reads longrope's factors, one per rotated pair, the attention factor and
// the original context.
func parseLongRope(p, sub *configParser, field string, c *Config, dim int) (*LongRope, int) {
	l := &LongRope{}
	factors := func(name string) []float64 {
		var f []float64
		if err := json.Unmarshal(sub.get(name), &f); err != nil || len(f) != dim/2 {
			p.fail(field+"."+name, fmt.Errorf("must be a list of %d numbers (one per rotated pair), got %s", dim/2, sub.get(name)))
			return nil
		}
		for i, v := range f {
			if !(v > 0) || math.IsInf(v, 0) || float32(v) == 0 || math.IsInf(float64(float32(v)), 0) {
				p.fail(field+"."+name, fmt.Errorf("[%d] = %g: must be positive and finite in float32", i, v))
				return nil
			}
		}
		return f
	}
	l.Short, l.Long = factors("short_factor"), factors("long_factor")
	orig := p.positive("original_max_position_embeddings", c.MaxPositions)
	if sub.has("original_max_position_embeddings") {
		orig = sub.positive("original_max_position_embeddings", orig)
	}
	// The attention factor: given, or √(1 + ln s / ln original) with s the context's
	// growth (factor, else max_position_embeddings / original).
	scale := float64(c.MaxPositions) / float64(orig)
	if sub.has("factor") {
		scale = sub.finitePositive("factor", scale)
	}
	l.AttnFactor = 1
	if scale > 1 {
		l.AttnFactor = math.Sqrt(1 + math.Log(scale)/math.Log(float64(orig)))
	}
	if sub.has("attention_factor") {
		l.AttnFactor = sub.finitePositive("attention_factor", l.AttnFactor)
	}
	if p.err != nil || sub.err != nil {
		return nil, 0
	}
	return l, orig
}

// phi3Names maps the roles onto Phi-3's tensor names: the LLaMA family's, except the
// fused QKV and gate/up projections (query rows, key rows, value rows; gate rows, then
// up rows).
func phi3Names(c *Config, r Role, l int) []partName {
	lp := fmt.Sprintf("layers.%d.", l)
	switch r {
	case RoleQKV:
		return []partName{{name: lp + "self_attn.qkv_proj.weight"}}
	case RoleQKVBias, RoleOutBias, RoleUpBias, RoleDownBias:
		return nil // Phi3Config has no biases
	case RoleUp:
		return []partName{{name: lp + "mlp.gate_up_proj.weight"}}
	}
	return llamaNames(c, r, l)
}

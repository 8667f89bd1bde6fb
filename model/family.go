package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
)

// family is one architecture's loader: how its config.json reads and where its tensors
// are.
type family struct {
	// name goes into Config.Family, for logs.
	name string
	// modelTypes are the config.json model_type values it loads.
	modelTypes []string
	// architectures are the config.json architectures entries it loads when model_type
	// is absent.
	architectures []string
	// parse fills the descriptor from config.json; p keeps the first error.
	parse func(p *configParser, c *Config)
	// names gives the checkpoint tensors of a role in layer l (-1 for the model's),
	// concatenated along the rows in order; nil when the family has no such role.
	names func(c *Config, r Role, l int) []partName
	// prefix is the base model's prefix that some checkpoints put on tensor names
	// ("transformer." for GPT2LMHeadModel, "model." for LlamaForCausalLM) and others
	// omit; Checkpoint.Tensor finds a name either way.
	prefix string
	// morePrefixes are other base prefixes the family's checkpoints use, found as prefix
	// is (Gemma 3's image-text checkpoints: language_model.model. as transformers 4
	// saved them, model.language_model. as transformers 5 does).
	morePrefixes []string
	// layerPrefix formats layer l's tensor prefix without the base prefix ("h.3.").
	layerPrefix func(l int) string
}

// prefixes lists the family's base prefixes, prefix first.
func (f *family) prefixes() []string {
	if f.prefix == "" {
		return f.morePrefixes
	}
	return append([]string{f.prefix}, f.morePrefixes...)
}

// partName is one checkpoint tensor of a role.
type partName struct {
	// name is the tensor's name without the family's base prefix.
	name string
	// transposed says the tensor is stored [in][out] (GPT-2's Conv1D).
	transposed bool
	// ropeHeads, when positive, says the tensor's rows are ropeHeads heads stored in
	// llama.cpp's rotary order (ropePerm).
	ropeHeads int
	// plusOne says the weight is 1 + the stored vector, in float32 (Gemma's RMSNorm
	// scales by 1 + w): the engines then run a plain RMSNorm.
	plusOne bool
}

// families are the supported architectures.
var families = []*family{gpt2Family, llamaFamily, phi3Family, qwen3Family, gemma2Family, gemma3Family,
	gemma3VLFamily, mixtralFamily, qwen2MoEFamily, qwen3MoEFamily}

// Limits bound config.json's sizes before anything proportional to them is allocated:
// far beyond any released model, and far below what would let a corrupt config ask for
// an absurd allocation (each size is checked against the tensors present as well).
const (
	maxVocab     = 1 << 22 // 4M tokens
	maxHidden    = 1 << 16
	maxLayers    = 1 << 10
	maxHeads     = 1 << 10
	maxHeadDim   = 1 << 10
	maxInner     = 1 << 18
	maxPositions = 1 << 21 // 2M positions
)

// supportedModelTypes lists every model_type any family loads, sorted, for messages.
func supportedModelTypes() string {
	var all []string
	for _, f := range families {
		all = append(all, f.modelTypes...)
	}
	sort.Strings(all)
	return strings.Join(all, ", ")
}

// familyOf picks the loader from config.json's model_type, or its architectures when
// model_type is absent.
func familyOf(p *configParser) *family {
	mt := p.str("model_type", "")
	if mt != "" {
		for _, f := range families {
			for _, t := range f.modelTypes {
				if t == mt {
					return f
				}
			}
		}
		p.fail("model_type", fmt.Errorf("%q is not supported (supported: %s)", mt, supportedModelTypes()))
		return nil
	}
	var archs []string
	if v := p.get("architectures"); v != nil {
		if err := json.Unmarshal(v, &archs); err != nil {
			p.fail("architectures", fmt.Errorf("must be a list of strings, got %s", v))
			return nil
		}
	}
	for _, a := range archs {
		for _, f := range families {
			for _, fa := range f.architectures {
				if a == fa {
					return f
				}
			}
		}
	}
	if len(archs) == 0 {
		p.fail("model_type", fmt.Errorf("missing, and no architectures entry names a supported model (supported model_type: %s)", supportedModelTypes()))
	} else {
		p.fail("architectures", fmt.Errorf("%q: none is supported (supported model_type: %s)", archs, supportedModelTypes()))
	}
	return nil
}

// parseConfig reads config.json into a descriptor through the family its model_type
// names, then checks what every architecture must satisfy. Every error names the field.
func parseConfig(raw []byte) (Config, *family, map[string]string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return Config{}, nil, nil, fmt.Errorf("invalid JSON: %w", err)
	}
	p := &configParser{m: m}
	f := familyOf(p)
	if f == nil {
		return Config{}, nil, nil, p.err
	}
	c := Config{Family: f.name, ModelType: p.str("model_type", f.modelTypes[0]), BOSID: -1}
	f.parse(p, &c)
	if _, ok := m["torch_dtype"]; ok {
		c.DType = p.str("torch_dtype", "")
	} else {
		c.DType = p.str("dtype", "")
	}
	if p.err != nil {
		return Config{}, nil, nil, p.err
	}
	if err := c.check(p.names); err != nil {
		return Config{}, nil, nil, err
	}
	return c, f, p.names, nil
}

// check verifies the descriptor's sizes against each other and against the limits;
// names maps a descriptor field to the config.json field it came from.
func (c *Config) check(names map[string]string) error {
	field := func(k string) string {
		if n, ok := names[k]; ok {
			return n
		}
		return k
	}
	bounds := []struct {
		key string
		v   int
		max int
	}{
		{"vocab", c.VocabSize, maxVocab}, {"positions", c.MaxPositions, maxPositions},
		{"hidden", c.Hidden, maxHidden}, {"layers", c.Layers, maxLayers},
		{"heads", c.Heads, maxHeads}, {"kv_heads", c.KVHeads, maxHeads},
		{"head_dim", c.HeadDim, maxHeadDim}, {"inner", c.Inner, maxInner},
	}
	for _, b := range bounds {
		if b.v < 1 || b.v > b.max {
			return fmt.Errorf("field %s: %d is outside [1, %d]", field(b.key), b.v, b.max)
		}
	}
	switch {
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("field %s: %d does not divide %s %d", field("kv_heads"), c.KVHeads, field("heads"), c.Heads)
	case !(c.NormEps > 0) || math.IsInf(float64(c.NormEps), 0):
		return fmt.Errorf("field %s: must be positive and finite in float32, got %g", field("eps"), c.NormEps)
	case c.BOSID >= int32(c.VocabSize):
		return fmt.Errorf("field bos_token_id: %d is not below %s %d", c.BOSID, field("vocab"), c.VocabSize)
	case c.DType == "auto":
		c.DType = "" // no stored type named; Open takes the weights'
	case c.DType != "" && c.DType != "float32" && c.DType != "float16" && c.DType != "bfloat16":
		return fmt.Errorf("field torch_dtype: %q is not float32, float16 or bfloat16", c.DType)
	}
	for _, id := range c.EOSIDs {
		if id >= int32(c.VocabSize) {
			return fmt.Errorf("field eos_token_id: %d is not below %s %d", id, field("vocab"), c.VocabSize)
		}
	}
	if c.Positions == RotaryPositions {
		r := c.Rope
		switch {
		case !(r.Theta > 0):
			return fmt.Errorf("field %s: must be positive, got %g", field("rope_theta"), r.Theta)
		case r.Dim < 2 || r.Dim%2 != 0 || r.Dim > c.HeadDim:
			return fmt.Errorf("field %s: rotary dimensions %d must be even and at most head_dim %d", field("head_dim"), r.Dim, c.HeadDim)
		case r.Kind != RopeDefault && !(r.Factor >= 1):
			return fmt.Errorf("field %s: %g must be at least 1", field("rope_factor"), r.Factor)
		}
	}
	if c.SlidingWindow < 0 {
		return fmt.Errorf("field sliding_window: %d is negative", c.SlidingWindow)
	}
	if err := c.checkMoE(field); err != nil {
		return err
	}
	return c.checkLayerFeatures(field)
}

// checkLayerFeatures verifies the fields Qwen3, Gemma and Phi-3 add against the rest of
// the descriptor.
func (c *Config) checkLayerFeatures(field func(string) string) error {
	for _, v := range []struct {
		name string
		v    float64
	}{{"query_pre_attn_scalar", c.QueryScale}, {"attn_logit_softcapping", c.AttnSoftcap},
		{"final_logit_softcapping", c.FinalSoftcap}, {"hidden_size (the embedding scale)", c.EmbedScale}} {
		if v.v < 0 || math.IsNaN(v.v) || math.IsInf(v.v, 0) || float32(v.v) == 0 && v.v != 0 {
			return fmt.Errorf("field %s: must be positive and finite, got %g", v.name, v.v)
		}
	}
	if c.SlidingLayers != nil && len(c.SlidingLayers) != c.Layers {
		return fmt.Errorf("field layer_types: %d entries for %s %d", len(c.SlidingLayers), field("layers"), c.Layers)
	}
	if r := c.LocalRope; r.Dim > 0 {
		if !(r.Theta > 0) || math.IsInf(r.Theta, 0) {
			return fmt.Errorf("field %s: must be positive, got %g", field("rope_local_base_freq"), r.Theta)
		}
		if r.Dim%2 != 0 || r.Dim > c.HeadDim {
			return fmt.Errorf("field head_dim: the local rope's %d dimensions must be even and at most %d", r.Dim, c.HeadDim)
		}
	}
	for _, r := range []Rope{c.Rope, c.LocalRope} {
		if r.Kind != RopeLongRope {
			continue
		}
		l := r.LongRope
		if l == nil || len(l.Short) != r.Dim/2 || len(l.Long) != r.Dim/2 {
			return fmt.Errorf("field %s: longrope needs %d short and long factors", field("rope_scaling"), r.Dim/2)
		}
		if !(l.AttnFactor > 0) || math.IsInf(l.AttnFactor, 0) || r.OriginalMaxPositions < 1 {
			return fmt.Errorf("field %s: longrope's attention factor %g and original context %d must be positive",
				field("rope_scaling"), l.AttnFactor, r.OriginalMaxPositions)
		}
	}
	return nil
}

// configParser reads typed fields from config.json, keeping the first error, which names
// the field.
type configParser struct {
	// m holds config.json's top-level fields, not yet typed.
	m map[string]json.RawMessage
	// err keeps the first error, which names the field.
	err error
	// names maps descriptor fields to the config.json fields a family read them from,
	// for check's messages.
	names map[string]string
}

// from records that descriptor field key came from config.json's field name.
func (p *configParser) from(key, name string) {
	if p.names == nil {
		p.names = map[string]string{}
	}
	p.names[key] = name
}

// fromAll records from(key, name) for each pair of kv (key, name, key, name, …).
func (p *configParser) fromAll(kv ...string) {
	for i := 0; i+1 < len(kv); i += 2 {
		p.from(kv[i], kv[i+1])
	}
}

// require fails when the boolean field is present with a value other than want: an
// option that changes the computation in a way the engines do not implement.
func (p *configParser) require(name string, want bool) {
	if p.boolean(name, want) != want {
		p.fail(name, fmt.Errorf("%v is not supported (only %v)", !want, want))
	}
}

// fail records err for field name unless an error is already recorded.
func (p *configParser) fail(name string, err error) {
	if p.err == nil {
		p.err = fmt.Errorf("field %s: %w", name, err)
	}
}

// get returns the field's raw value, or nil when it is absent or null.
func (p *configParser) get(name string) json.RawMessage {
	v, ok := p.m[name]
	if !ok || string(v) == "null" {
		return nil
	}
	return v
}

// has says whether the field is present and not null.
func (p *configParser) has(name string) bool { return p.get(name) != nil }

// positive reads a positive integer; def is used when the field is absent or null, and
// def 0 makes it required.
func (p *configParser) positive(name string, def int) int {
	v := p.get(name)
	if v == nil {
		if def == 0 {
			p.fail(name, errors.New("missing (a positive integer is required)"))
		}
		return def
	}
	var n int
	if err := json.Unmarshal(v, &n); err != nil || n <= 0 {
		p.fail(name, fmt.Errorf("must be a positive integer, got %s", v))
		return def
	}
	return n
}

// nonNegative reads an integer ≥ 0, def when absent or null.
func (p *configParser) nonNegative(name string, def int) int {
	v := p.get(name)
	if v == nil {
		return def
	}
	var n int
	if err := json.Unmarshal(v, &n); err != nil || n < 0 {
		p.fail(name, fmt.Errorf("must be a non-negative integer, got %s", v))
		return def
	}
	return n
}

// number reads a float, def when absent.
func (p *configParser) number(name string, def float64) float64 {
	v := p.get(name)
	if v == nil {
		return def
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil {
		p.fail(name, fmt.Errorf("must be a number, got %s", v))
		return def
	}
	return f
}

// boolean reads a bool, def when absent.
func (p *configParser) boolean(name string, def bool) bool {
	v := p.get(name)
	if v == nil {
		return def
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		p.fail(name, fmt.Errorf("must be true or false, got %s", v))
		return def
	}
	return b
}

// str reads a string, def when absent.
func (p *configParser) str(name, def string) string {
	v := p.get(name)
	if v == nil {
		return def
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		p.fail(name, fmt.Errorf("must be a string, got %s", v))
		return def
	}
	return s
}

// tokenID reads an optional non-negative token id; -1 when absent or null.
func (p *configParser) tokenID(name string) int32 {
	v := p.get(name)
	if v == nil {
		return -1
	}
	var n int32
	if err := json.Unmarshal(v, &n); err != nil || n < 0 {
		p.fail(name, fmt.Errorf("must be a non-negative integer or null, got %s", v))
		return -1
	}
	return n
}

// tokenIDs reads a token id or a list of them (eos_token_id may be either); empty when
// absent or null.
func (p *configParser) tokenIDs(name string) []int32 {
	v := p.get(name)
	if v == nil {
		return nil
	}
	return parseTokenIDs(v, func(err error) { p.fail(name, err) })
}

// parseTokenIDs reads a non-negative id or a list of them; fail receives a bad value.
func parseTokenIDs(v json.RawMessage, fail func(error)) []int32 {
	var one int32
	if err := json.Unmarshal(v, &one); err == nil {
		if one < 0 {
			fail(fmt.Errorf("must be a non-negative integer or a list of them, got %s", v))
			return nil
		}
		return []int32{one}
	}
	var many []int32
	if err := json.Unmarshal(v, &many); err != nil || len(many) > 1024 {
		fail(fmt.Errorf("must be a non-negative integer or a list of them, got %s", v))
		return nil
	}
	for _, id := range many {
		if id < 0 {
			fail(fmt.Errorf("must be a non-negative integer or a list of them, got %s", v))
			return nil
		}
	}
	return many
}

// activation reads an activation name.
func (p *configParser) activation(name, def string) Activation {
	s := p.str(name, def)
	a, ok := activations[s]
	if !ok {
		var names []string
		for n := range activations {
			names = append(names, n)
		}
		sort.Strings(names)
		p.fail(name, fmt.Errorf("%q is not supported (supported: %s)", s, strings.Join(names, ", ")))
	}
	return a
}

// object reads a JSON object field into a map; nil when absent or null.
func (p *configParser) object(name string) map[string]json.RawMessage {
	v := p.get(name)
	if v == nil {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil {
		p.fail(name, fmt.Errorf("must be an object, got %s", v))
		return nil
	}
	return m
}

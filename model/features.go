package model

import (
	"encoding/json"
	"fmt"
	"math"
)

// The config readers the families of issue 37 share (Qwen3, Gemma 2 and 3, Phi-3, the
// mixtures of experts): per-layer marks, bounded lists and numbers, the fields every
// LLaMA-shaped decoder has, Qwen's sliding window.

// layerTypes reads transformers' layer_types, one "full_attention" or
// "sliding_attention" a layer, into sliding-layer marks; nil when the field is absent.
func layerTypes(p *configParser, layers int) []bool {
	v := p.get("layer_types")
	if v == nil {
		return nil
	}
	var types []string
	if err := json.Unmarshal(v, &types); err != nil {
		p.fail("layer_types", fmt.Errorf("must be a list of strings, got %s", v))
		return nil
	}
	if len(types) != layers {
		p.fail("layer_types", fmt.Errorf("%d entries for num_hidden_layers %d", len(types), layers))
		return nil
	}
	sliding := make([]bool, layers)
	for l, typ := range types {
		switch typ {
		case "full_attention":
		case "sliding_attention":
			sliding[l] = true
		default:
			p.fail("layer_types", fmt.Errorf("layer %d: %q is not supported (supported: full_attention, sliding_attention)", l, typ))
			return nil
		}
	}
	return sliding
}

// finitePositive reads an optional number that must be positive and finite when
// present and not null; def when absent or null.
func (p *configParser) finitePositive(name string, def float64) float64 {
	if !p.has(name) {
		return def
	}
	v := p.number(name, def)
	if !(v > 0) || math.IsInf(v, 0) {
		p.fail(name, fmt.Errorf("must be positive and finite, got %s", p.get(name)))
		return def
	}
	return v
}

// layerList reads a list of distinct layer indices below layers (mlp_only_layers).
func (p *configParser) layerList(name string, layers int) []int {
	v := p.get(name)
	if v == nil {
		return nil
	}
	var list []int
	if err := json.Unmarshal(v, &list); err != nil || len(list) > layers {
		p.fail(name, fmt.Errorf("must be a list of at most num_hidden_layers layer indices, got %s", v))
		return nil
	}
	seen := make(map[int]bool, len(list))
	for _, l := range list {
		if l < 0 || l >= layers || seen[l] {
			p.fail(name, fmt.Errorf("%d is not a distinct layer index below num_hidden_layers %d", l, layers))
			return nil
		}
		seen[l] = true
	}
	return list
}

// decoderDefaults are the defaults a family's config class gives absent fields.
type decoderDefaults struct {
	// positions is max_position_embeddings', eps rms_norm_eps', act the activation's.
	positions int
	eps       float64
	act       string
	// actField is the activation's field (hidden_act, or Gemma's hidden_activation).
	actField string
	// headDim is head_dim's when absent; 0: hidden_size / num_attention_heads.
	headDim int
	// tied is tie_word_embeddings'.
	tied bool
	// sizes, when set, are the config class's defaults for vocab_size, hidden_size,
	// intermediate_size, num_hidden_layers, num_attention_heads and num_key_value_heads
	// (Gemma 3's image-text text_config leaves out those that equal them); otherwise
	// those fields are required, and the KV heads default to the heads.
	sizes *[6]int
	// bos and eos are the token ids' defaults; -1: none.
	bos, eos int32
}

// readDecoder reads the fields every LLaMA-shaped decoder shares: sizes, RMSNorm,
// rotary positions, a gated MLP, the tokens. The rope and what a family adds are left
// to its parser.
func readDecoder(p *configParser, c *Config, d decoderDefaults) {
	var sizes [6]int
	if d.sizes != nil {
		sizes = *d.sizes
	}
	c.VocabSize = p.positive("vocab_size", sizes[0])
	c.Hidden = p.positive("hidden_size", sizes[1])
	c.Inner = p.positive("intermediate_size", sizes[2])
	c.Layers = p.positive("num_hidden_layers", sizes[3])
	c.Heads = p.positive("num_attention_heads", sizes[4])
	if d.sizes == nil {
		sizes[5] = c.Heads
	}
	c.KVHeads = p.positive("num_key_value_heads", sizes[5])
	c.MaxPositions = p.positive("max_position_embeddings", d.positions)
	c.Norm = RMSNorm
	c.NormEps = float32(p.number("rms_norm_eps", d.eps))
	c.Positions = RotaryPositions
	c.GatedMLP = true
	c.Act = p.activation(d.actField, d.act)
	c.TiedHead = p.boolean("tie_word_embeddings", d.tied)
	c.BOSID = p.tokenID("bos_token_id")
	if _, present := p.m["bos_token_id"]; !present && d.bos > 0 {
		c.BOSID = d.bos
	}
	c.EOSIDs = p.tokenIDs("eos_token_id")
	if _, present := p.m["eos_token_id"]; !present && d.eos > 0 {
		c.EOSIDs = []int32{d.eos}
	}
	p.fromAll("vocab", "vocab_size", "positions", "max_position_embeddings", "hidden", "hidden_size",
		"layers", "num_hidden_layers", "heads", "num_attention_heads", "kv_heads", "num_key_value_heads",
		"head_dim", "head_dim", "inner", "intermediate_size", "eps", "rms_norm_eps")
	if p.err != nil {
		return
	}
	// The parsers size per-layer marks by the layer count: bound it first.
	if c.Layers > maxLayers {
		p.fail("num_hidden_layers", fmt.Errorf("%d is outside [1, %d]", c.Layers, maxLayers))
		return
	}
	switch {
	case p.has("head_dim"):
		c.HeadDim = p.positive("head_dim", 0)
	case d.headDim > 0:
		c.HeadDim = d.headDim
	case c.Hidden%c.Heads != 0:
		p.fail("hidden_size", fmt.Errorf("%d is not a multiple of num_attention_heads %d (and no head_dim is given)", c.Hidden, c.Heads))
	default:
		c.HeadDim = c.Hidden / c.Heads
	}
}

// qwenSliding reads Qwen's window: only with use_sliding_window (a null sliding_window
// is none), over the layers layer_types marks sliding_attention or, without it, those
// from max_window_layers on.
func qwenSliding(p *configParser, c *Config) {
	if !p.boolean("use_sliding_window", false) {
		return
	}
	window := 4096
	if _, present := p.m["sliding_window"]; present {
		window = p.nonNegative("sliding_window", 0)
	}
	if window == 0 || p.err != nil {
		return
	}
	c.SlidingWindow = window
	if c.SlidingLayers = layerTypes(p, c.Layers); c.SlidingLayers == nil && p.err == nil {
		c.WindowFromLayer = p.nonNegative("max_window_layers", 28)
	}
}

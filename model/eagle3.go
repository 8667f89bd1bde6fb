package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// EAGLE-3 draft heads (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of
// Large Language Models via Training-Time Test") in their published checkpoint format —
// the config and tensor names of the releases for Llama 3.1 8B
// (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, and the "official format" NVIDIA's Model
// Optimizer exports): config.json with "architectures": ["LlamaForCausalLMEagle3"] (or a
// draft_vocab_size) and one LLaMA decoder layer, and these tensors, matrices [out][in]:
//
//	fc.weight                                   [hidden][3·target hidden]
//	midlayer.input_layernorm.weight             [hidden]  (the token embedding's norm)
//	midlayer.hidden_norm.weight                 [hidden]  (the fused feature's norm)
//	midlayer.self_attn.{q,k,v}_proj.weight      [heads·head_dim or kv heads·head_dim][2·hidden]
//	midlayer.self_attn.o_proj.weight            [hidden][heads·head_dim]
//	midlayer.post_attention_layernorm.weight    [hidden]
//	midlayer.mlp.{gate,up}_proj.weight          [inner][hidden]
//	midlayer.mlp.down_proj.weight               [hidden][inner]
//	norm.weight                                 [hidden]
//	lm_head.weight                              [draft vocab][hidden]
//	d2t                                         [draft vocab] integers: target id = d + d2t[d]
//	t2d                                         [vocab] (not read)
//	embed_tokens.weight                         [vocab][hidden] (optional: the target's)
//
// The head reads the target's hidden states after three of its layers (low, middle,
// high): eagle_config.eagle_aux_hidden_state_layer_ids where the config names them, else
// layers 1, L/2-1 and L-4 of an L-layer target — the inputs of layers 2, L/2 and L-3,
// where the EAGLE-3 release takes them. At position j, fc fuses the three into one
// feature f_j; the decoder layer reads the norms of the embedding of token j+1 and of
// f_j side by side ([2·hidden]: embedding first) and predicts token j+2 over the draft
// vocabulary, which d2t maps to the target's. Each further proposal feeds back the
// layer's own output (before the final norm) in place of f.

// Eagle3Config describes an EAGLE-3 head.
type Eagle3Config struct {
	// Hidden, Heads, KVHeads, HeadDim and Inner are the decoder layer's sizes.
	Hidden, Heads, KVHeads, HeadDim, Inner int
	// TargetHidden is the target's hidden size (fc reads three of its states).
	TargetHidden int
	// VocabSize is the target's vocabulary; DraftVocab the head's.
	VocabSize, DraftVocab int
	// MaxPositions is the longest sequence the head was built for.
	MaxPositions int
	// NormEps is the RMSNorms' epsilon.
	NormEps float32
	// Rope is the rotary embedding of the head's attention.
	Rope Rope
	// AuxLayers are the target layers whose outputs the head reads, in fc's order; nil
	// means the default for the target's depth (Eagle3.AuxLayersFor).
	AuxLayers []int
}

// Eagle3 is a loaded EAGLE-3 head, in float32.
type Eagle3 struct {
	// Config describes it.
	Config Eagle3Config
	// FC fuses the target's three states [Hidden][3·TargetHidden].
	FC []float32
	// InputNorm, HiddenNorm, PostNorm and FinalNorm are the RMSNorm weights [Hidden].
	InputNorm, HiddenNorm, PostNorm, FinalNorm []float32
	// Q, K, V read [2·Hidden]: [Heads·HeadDim or KVHeads·HeadDim][2·Hidden]; O
	// [Hidden][Heads·HeadDim].
	Q, K, V, O []float32
	// Gate, Up [Inner][Hidden] and Down [Hidden][Inner] are the gated SiLU MLP.
	Gate, Up, Down []float32
	// LMHead is [DraftVocab][Hidden].
	LMHead []float32
	// D2T maps a draft token d to the target's d + D2T[d] [DraftVocab].
	D2T []int32
	// Embed is the head's own embedding [VocabSize][Hidden]; nil when it uses the
	// target's.
	Embed []float32
}

// eagle3Arch is the architecture name of the EAGLE-3 releases.
const eagle3Arch = "LlamaForCausalLMEagle3"

// IsEagle3 says whether dir/config.json describes an EAGLE-3 head.
func IsEagle3(dir string) (bool, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return false, err
	}
	var m struct {
		Architectures  []string        `json:"architectures"`
		DraftVocabSize json.RawMessage `json:"draft_vocab_size"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return false, fmt.Errorf("%s/config.json: %w", dir, err)
	}
	return slices.Contains(m.Architectures, eagle3Arch) || len(m.DraftVocabSize) > 0 && string(m.DraftVocabSize) != "null", nil
}

// AuxLayersFor returns the target layers the head reads, for a target of layers layers:
// the config's, or 1, L/2-1 and L-4 (a layer may repeat on a shallow target). An error
// names a layer outside the target.
func (e *Eagle3) AuxLayersFor(layers int) ([]int, error) {
	ids := e.Config.AuxLayers
	if ids == nil {
		ids = []int{1, max(0, layers/2-1), layers - 4}
	}
	if len(ids) != 3 {
		return nil, fmt.Errorf("EAGLE-3 head: %d hidden-state layers, want 3 (eagle_config.eagle_aux_hidden_state_layer_ids)", len(ids))
	}
	for _, l := range ids {
		if l < 0 || l >= layers {
			return nil, fmt.Errorf("EAGLE-3 head: hidden-state layer %d is outside the target's %d layers (the default 1, L/2-1, L-4 needs at least 4; eagle_config.eagle_aux_hidden_state_layer_ids names others)", l, layers)
		}
	}
	return ids, nil
}

// LoadEagle3 reads an EAGLE-3 head from dir (config.json and model.safetensors or its
// shards), checking every tensor's presence and shape; an error names the field or
// tensor at fault.
func LoadEagle3(dir string) (*Eagle3, error) {
	cfgPath := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return nil, fmt.Errorf("open EAGLE-3 head: %w", err)
	}
	cfg, err := parseEagle3Config(raw)
	if err != nil {
		return nil, fmt.Errorf("open EAGLE-3 head: %s: %w", cfgPath, err)
	}
	files, err := weightFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("open EAGLE-3 head: %w", err)
	}
	tensors := map[string]*Tensor{}
	var opened []*stFile
	defer func() {
		for _, st := range opened {
			_ = st.close()
		}
	}()
	for _, name := range files {
		st, err := openSafetensors(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("open EAGLE-3 head: %w", err)
		}
		opened = append(opened, st)
		for n, t := range st.tensors {
			tensors[n] = t
		}
	}
	c := &cfg
	H, D := c.Hidden, c.HeadDim
	e := &Eagle3{Config: cfg}
	load := func(name string, rows, cols int, optional bool) ([]float32, error) {
		t, ok := tensors[name]
		if !ok {
			if optional {
				return nil, nil
			}
			return nil, fmt.Errorf("EAGLE-3 head %s: tensor %s is missing", dir, name)
		}
		want := []int{rows, cols}
		if cols == 0 {
			want = want[:1]
		}
		if !slices.Equal(t.Shape, want) {
			return nil, fmt.Errorf("EAGLE-3 head %s: tensor %s has shape %v, want %v", dir, name, t.Shape, want)
		}
		v, err := t.Float32()
		if err != nil {
			return nil, fmt.Errorf("EAGLE-3 head %s: %w", dir, err)
		}
		return v, nil
	}
	for _, w := range []struct {
		dst        *[]float32
		name       string
		rows, cols int
	}{
		{&e.FC, "fc.weight", H, 3 * c.TargetHidden},
		{&e.InputNorm, "midlayer.input_layernorm.weight", H, 0},
		{&e.HiddenNorm, "midlayer.hidden_norm.weight", H, 0},
		{&e.PostNorm, "midlayer.post_attention_layernorm.weight", H, 0},
		{&e.FinalNorm, "norm.weight", H, 0},
		{&e.Q, "midlayer.self_attn.q_proj.weight", c.Heads * D, 2 * H},
		{&e.K, "midlayer.self_attn.k_proj.weight", c.KVHeads * D, 2 * H},
		{&e.V, "midlayer.self_attn.v_proj.weight", c.KVHeads * D, 2 * H},
		{&e.O, "midlayer.self_attn.o_proj.weight", H, c.Heads * D},
		{&e.Gate, "midlayer.mlp.gate_proj.weight", c.Inner, H},
		{&e.Up, "midlayer.mlp.up_proj.weight", c.Inner, H},
		{&e.Down, "midlayer.mlp.down_proj.weight", H, c.Inner},
		{&e.LMHead, "lm_head.weight", c.DraftVocab, H},
	} {
		if *w.dst, err = load(w.name, w.rows, w.cols, false); err != nil {
			return nil, err
		}
	}
	if e.Embed, err = load("embed_tokens.weight", c.VocabSize, H, true); err != nil {
		return nil, err
	}
	if t, ok := tensors["d2t"]; ok {
		if !slices.Equal(t.Shape, []int{c.DraftVocab}) {
			return nil, fmt.Errorf("EAGLE-3 head %s: tensor d2t has shape %v, want [%d]", dir, t.Shape, c.DraftVocab)
		}
		if e.D2T, err = t.Int32(); err != nil {
			return nil, fmt.Errorf("EAGLE-3 head %s: %w", dir, err)
		}
	} else if c.DraftVocab == c.VocabSize {
		e.D2T = make([]int32, c.DraftVocab)
	} else {
		return nil, fmt.Errorf("EAGLE-3 head %s: tensor d2t is missing, and the draft vocabulary (%d) is not the target's (%d)", dir, c.DraftVocab, c.VocabSize)
	}
	for d, off := range e.D2T {
		if t := d + int(off); t < 0 || t >= c.VocabSize {
			return nil, fmt.Errorf("EAGLE-3 head %s: d2t maps draft token %d to %d, outside the vocabulary [0, %d)", dir, d, t, c.VocabSize)
		}
	}
	return e, nil
}

// parseEagle3Config reads an EAGLE-3 head's config.json.
func parseEagle3Config(raw []byte) (Eagle3Config, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return Eagle3Config{}, fmt.Errorf("invalid JSON: %w", err)
	}
	p := &configParser{m: m}
	var c Eagle3Config
	c.Hidden = p.positive("hidden_size", 0)
	c.Heads = p.positive("num_attention_heads", 0)
	c.KVHeads = p.positive("num_key_value_heads", c.Heads)
	c.Inner = p.positive("intermediate_size", 0)
	c.VocabSize = p.positive("vocab_size", 0)
	c.DraftVocab = p.positive("draft_vocab_size", c.VocabSize)
	c.TargetHidden = p.positive("target_hidden_size", c.Hidden)
	c.MaxPositions = p.positive("max_position_embeddings", 2048)
	c.NormEps = float32(p.number("rms_norm_eps", 1e-6))
	if layers := p.positive("num_hidden_layers", 1); layers != 1 {
		p.fail("num_hidden_layers", fmt.Errorf("%d: gollm runs EAGLE-3 heads of one decoder layer", layers))
	}
	if c.Heads > 0 {
		c.HeadDim = p.positive("head_dim", c.Hidden/c.Heads)
	}
	if act := p.str("hidden_act", "silu"); act != "silu" {
		p.fail("hidden_act", fmt.Errorf("%q: EAGLE-3 heads use silu", act))
	}
	if ec := p.object("eagle_config"); ec != nil {
		if ids, ok := ec["eagle_aux_hidden_state_layer_ids"]; ok && string(ids) != "null" {
			if err := json.Unmarshal(ids, &c.AuxLayers); err != nil {
				p.fail("eagle_config.eagle_aux_hidden_state_layer_ids", fmt.Errorf("want a list of layer numbers: %w", err))
			}
		}
	}
	c.Rope = parseRope(p, c.HeadDim, c.MaxPositions)
	if p.err != nil {
		return c, p.err
	}
	switch {
	case c.Heads%c.KVHeads != 0:
		return c, fmt.Errorf("field num_key_value_heads: %d does not divide num_attention_heads %d", c.KVHeads, c.Heads)
	case c.HeadDim%2 != 0:
		return c, fmt.Errorf("field head_dim: %d must be even (rotary positions)", c.HeadDim)
	case c.DraftVocab > c.VocabSize:
		return c, fmt.Errorf("field draft_vocab_size: %d exceeds vocab_size %d", c.DraftVocab, c.VocabSize)
	case int64(c.Hidden)*int64(c.TargetHidden) > 1<<34 || int64(c.DraftVocab)*int64(c.Hidden) > 1<<34 || int64(c.Inner)*int64(c.Hidden) > 1<<34:
		return c, errors.New("the head's sizes exceed 2^34 weights a matrix")
	}
	return c, nil
}

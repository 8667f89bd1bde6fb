package model

import (
	"errors"
	"fmt"
)

// gpt2Family loads GPT-2 checkpoints (GPT2LMHeadModel, or OpenAI's bare GPT2Model):
// LayerNorm with biases, learned positions, a fused QKV projection and an MLP with
// biases, all stored as Conv1D ([in][out]), and the LM head tied to the embedding unless
// tie_word_embeddings says otherwise.
var gpt2Family = &family{
	name:          "gpt2",
	modelTypes:    []string{"gpt2"},
	architectures: []string{"GPT2LMHeadModel", "GPT2Model"},
	prefix:        "transformer.",
	layerPrefix:   func(l int) string { return fmt.Sprintf("h.%d.", l) },
	parse:         parseGPT2,
	names:         gpt2Names,
}

// parseGPT2 reads GPT2Config's fields. Those it gives defaults to (n_inner,
// layer_norm_epsilon, activation_function, the token ids, the dtype) may be absent; the
// shape fields may not. Options that change the computation and that the engines do not
// implement are refused by name.
func parseGPT2(p *configParser, c *Config) {
	c.VocabSize = p.positive("vocab_size", 0)
	c.MaxPositions = p.positive("n_positions", 0)
	c.Hidden = p.positive("n_embd", 0)
	c.Layers = p.positive("n_layer", 0)
	c.Heads = p.positive("n_head", 0)
	c.KVHeads = c.Heads
	c.Inner = p.positive("n_inner", 4*c.Hidden)
	c.Norm = LayerNorm
	c.NormEps = float32(p.number("layer_norm_epsilon", 1e-5))
	c.Positions = LearnedPositions
	c.QKVBias, c.OutBias, c.MLPBias = true, true, true
	c.Act = p.activation("activation_function", "gelu_new")
	c.TiedHead = p.boolean("tie_word_embeddings", true)
	c.BOSID = p.tokenID("bos_token_id")
	c.EOSIDs = p.tokenIDs("eos_token_id")
	p.fromAll("vocab", "vocab_size", "positions", "n_positions", "hidden", "n_embd", "layers", "n_layer",
		"heads", "n_head", "kv_heads", "n_head", "head_dim", "n_embd", "inner", "n_inner", "eps", "layer_norm_epsilon")
	// Options of GPT2Config that change the computation, with the value gollm computes.
	p.require("scale_attn_weights", true)
	p.require("scale_attn_by_inverse_layer_idx", false)
	p.require("reorder_and_upcast_attn", false)
	p.require("add_cross_attention", false)
	if p.err == nil && c.Hidden%c.Heads != 0 {
		p.fail("n_embd", fmt.Errorf("%d is not a multiple of n_head %d", c.Hidden, c.Heads))
	}
	if p.err == nil {
		c.HeadDim = c.Hidden / c.Heads
	}
	if p.err == nil && c.HeadDim == 0 {
		p.fail("n_embd", errors.New("gives heads of width 0"))
	}
}

// gpt2Names maps the roles onto GPT-2's tensor names; its matrices are Conv1D weights.
func gpt2Names(c *Config, r Role, l int) []partName {
	one := func(name string, transposed bool) []partName { return []partName{{name: name, transposed: transposed}} }
	if !r.PerLayer() {
		switch r {
		case RoleEmbed:
			return one("wte.weight", false)
		case RolePosEmbed:
			return one("wpe.weight", false)
		case RoleFinalNorm:
			return one("ln_f.weight", false)
		case RoleFinalNormBias:
			return one("ln_f.bias", false)
		case RoleLMHead:
			return one("lm_head.weight", false)
		}
		return nil
	}
	lp := fmt.Sprintf("h.%d.", l)
	switch r {
	case RoleAttnNorm:
		return one(lp+"ln_1.weight", false)
	case RoleAttnNormBias:
		return one(lp+"ln_1.bias", false)
	case RoleQKV:
		return one(lp+"attn.c_attn.weight", true)
	case RoleQKVBias:
		return one(lp+"attn.c_attn.bias", false)
	case RoleOut:
		return one(lp+"attn.c_proj.weight", true)
	case RoleOutBias:
		return one(lp+"attn.c_proj.bias", false)
	case RoleMLPNorm:
		return one(lp+"ln_2.weight", false)
	case RoleMLPNormBias:
		return one(lp+"ln_2.bias", false)
	case RoleUp:
		return one(lp+"mlp.c_fc.weight", true)
	case RoleUpBias:
		return one(lp+"mlp.c_fc.bias", false)
	case RoleDown:
		return one(lp+"mlp.c_proj.weight", true)
	case RoleDownBias:
		return one(lp+"mlp.c_proj.bias", false)
	}
	return nil
}

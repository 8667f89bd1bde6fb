package demo

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"gollm/model"
)

// VocabSize is GPT-2's vocabulary: 50256 BPE tokens and <|endoftext|>.
const VocabSize = 50257

// EndOfTextID is <|endoftext|>, GPT-2's BOS and EOS token.
const EndOfTextID = 50256

// Options shapes the demo checkpoint. Zero fields take the defaults of DefaultOptions.
type Options struct {
	// Layers is the number of transformer blocks (n_layer).
	Layers int
	// Hidden is the model width (n_embd).
	Hidden int
	// Heads is the number of attention heads (n_head); it must divide Hidden.
	Heads int
	// Positions is the longest sequence (n_positions).
	Positions int
	// DType is the stored weight type: "float16", "float32" or "bfloat16".
	DType string
	// Seed seeds the random weights; a given seed and shape always give the same file.
	Seed uint64
	// Progress, if set, is called after each tensor with the parameters written so far
	// and the total.
	Progress func(done, total int)
}

// DefaultOptions is the shipped demo: small enough that the pure-Go CPU engine answers
// at interactive speed, shaped like GPT-2 otherwise.
func DefaultOptions() Options {
	return Options{Layers: 4, Hidden: 256, Heads: 4, Positions: 1024, DType: "float16", Seed: 1}
}

// WithDefaults fills zero fields from DefaultOptions and checks the result.
func (o Options) WithDefaults() (Options, error) {
	d := DefaultOptions()
	if o.Layers == 0 {
		o.Layers = d.Layers
	}
	if o.Hidden == 0 {
		o.Hidden = d.Hidden
	}
	if o.Heads == 0 {
		o.Heads = d.Heads
	}
	if o.Positions == 0 {
		o.Positions = d.Positions
	}
	if o.DType == "" {
		o.DType = d.DType
	}
	switch {
	case o.Layers < 0 || o.Hidden < 0 || o.Heads < 0 || o.Positions < 0:
		return o, fmt.Errorf("layers %d, hidden %d, heads %d and positions %d must be positive", o.Layers, o.Hidden, o.Heads, o.Positions)
	case o.Hidden%o.Heads != 0:
		return o, fmt.Errorf("hidden %d is not a multiple of heads %d", o.Hidden, o.Heads)
	case stDTypes[o.DType] == "":
		return o, fmt.Errorf("dtype %q is not float16, float32 or bfloat16", o.DType)
	}
	return o, nil
}

// stDTypes maps config.json's dtype names to safetensors'.
var stDTypes = map[string]string{"float32": "F32", "float16": "F16", "bfloat16": "BF16"}

// weightSpec describes one tensor of the checkpoint and how to draw it.
type weightSpec struct {
	// name spells the tensor as Hugging Face's model.safetensors does.
	name string
	// shape is the tensor's shape (Conv1D matrices are [in][out]).
	shape []int
	// mean and std are the normal distribution the values come from.
	mean, std float64
}

// weightSpecs lists GPT2LMHeadModel's tensors in HF's names. The spreads follow
// testdata/make_fixture.py: matrices N(0, 0.3²) rather than GPT-2's 0.02 so that the
// logits are peaked and greedy choices are clear-cut; LayerNorm scales near 1.
func weightSpecs(o Options) []weightSpec {
	h, inner := o.Hidden, 4*o.Hidden
	specs := []weightSpec{
		{"transformer.wte.weight", []int{VocabSize, h}, 0, 0.3},
		{"transformer.wpe.weight", []int{o.Positions, h}, 0, 0.3},
	}
	for i := range o.Layers {
		p := "transformer.h." + strconv.Itoa(i) + "."
		specs = append(specs,
			weightSpec{p + "ln_1.weight", []int{h}, 1, 0.1},
			weightSpec{p + "ln_1.bias", []int{h}, 0, 0.1},
			weightSpec{p + "attn.c_attn.weight", []int{h, 3 * h}, 0, 0.3},
			weightSpec{p + "attn.c_attn.bias", []int{3 * h}, 0, 0.1},
			weightSpec{p + "attn.c_proj.weight", []int{h, h}, 0, 0.3},
			weightSpec{p + "attn.c_proj.bias", []int{h}, 0, 0.1},
			weightSpec{p + "ln_2.weight", []int{h}, 1, 0.1},
			weightSpec{p + "ln_2.bias", []int{h}, 0, 0.1},
			weightSpec{p + "mlp.c_fc.weight", []int{h, inner}, 0, 0.3},
			weightSpec{p + "mlp.c_fc.bias", []int{inner}, 0, 0.1},
			weightSpec{p + "mlp.c_proj.weight", []int{inner, h}, 0, 0.3},
			weightSpec{p + "mlp.c_proj.bias", []int{h}, 0, 0.1},
		)
	}
	return append(specs,
		weightSpec{"transformer.ln_f.weight", []int{h}, 1, 0.1},
		weightSpec{"transformer.ln_f.bias", []int{h}, 0, 0.1},
	)
}

// NumParameters is the parameter count of the checkpoint o describes (after
// WithDefaults).
func (o Options) NumParameters() int {
	n := 0
	for _, s := range weightSpecs(o) {
		n += product(s.shape)
	}
	return n
}

// product multiplies a shape out.
func product(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// WriteGPT2Checkpoint writes a random-weight GPT-2 in Hugging Face's format into dir:
// config.json, tokenizer.json (GPT-2's real vocabulary), tokenizer_config.json (with a
// chat template, ChatTemplate) and model.safetensors (tied LM head, so no
// lm_head.weight, as save_pretrained writes it). model.safetensors is written last, so
// its presence means the folder is complete.
func WriteGPT2Checkpoint(dir string, o Options) error {
	o, err := o.WithDefaults()
	if err != nil {
		return fmt.Errorf("write demo checkpoint: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write demo checkpoint: %w", err)
	}
	cfg, err := json.MarshalIndent(configJSON(o), "", "  ")
	if err != nil {
		return fmt.Errorf("write demo checkpoint: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, "config.json"), append(cfg, '\n')); err != nil {
		return fmt.Errorf("write demo checkpoint: %w", err)
	}
	if err := WriteGPT2Tokenizer(filepath.Join(dir, "tokenizer.json")); err != nil {
		return fmt.Errorf("write demo checkpoint: %w", err)
	}
	if err := WriteTokenizerConfig(filepath.Join(dir, "tokenizer_config.json")); err != nil {
		return fmt.Errorf("write demo checkpoint: %w", err)
	}
	tensors, err := drawWeights(weightSpecs(o), o.Seed, o.DType, o.Progress)
	if err != nil {
		return fmt.Errorf("write demo checkpoint: %w", err)
	}
	meta := map[string]string{
		"format": "pt", // transformers refuses safetensors files without it
		"gollm":  fmt.Sprintf("random weights, seed %d; not a trained model", o.Seed),
	}
	if err := model.WriteSafetensors(filepath.Join(dir, "model.safetensors"), tensors, meta); err != nil {
		return fmt.Errorf("write demo checkpoint: %w", err)
	}
	return nil
}

// drawWeights draws every tensor of specs from its distribution with one generator
// seeded by seed, in order, so that the result depends on the specs and seed alone; it
// stores them as dtype (config.json's name) and reports progress as it goes.
func drawWeights(specs []weightSpec, seed uint64, dtype string, progress func(done, total int)) ([]*model.Tensor, error) {
	rng := rand.New(rand.NewPCG(seed, 0x676f6c6c6d)) // second word: "gollm"
	total, done := 0, 0
	for _, s := range specs {
		total += product(s.shape)
	}
	var tensors []*model.Tensor
	for _, s := range specs {
		values := make([]float32, product(s.shape))
		for i := range values {
			values[i] = float32(s.mean + s.std*rng.NormFloat64())
		}
		t, err := model.NewFloatTensor(s.name, stDTypes[dtype], s.shape, values)
		if err != nil {
			return nil, err
		}
		tensors = append(tensors, t)
		done += len(values)
		if progress != nil {
			progress(done, total)
		}
	}
	return tensors, nil
}

// configJSON is config.json as transformers' GPT2Config writes it.
func configJSON(o Options) map[string]any {
	return map[string]any{
		"activation_function":             "gelu_new",
		"architectures":                   []string{"GPT2LMHeadModel"},
		"attn_pdrop":                      0.1,
		"bos_token_id":                    EndOfTextID,
		"embd_pdrop":                      0.1,
		"eos_token_id":                    EndOfTextID,
		"initializer_range":               0.02,
		"layer_norm_epsilon":              1e-05,
		"model_type":                      "gpt2",
		"n_embd":                          o.Hidden,
		"n_head":                          o.Heads,
		"n_inner":                         nil,
		"n_layer":                         o.Layers,
		"n_positions":                     o.Positions,
		"reorder_and_upcast_attn":         false,
		"resid_pdrop":                     0.1,
		"scale_attn_by_inverse_layer_idx": false,
		"scale_attn_weights":              true,
		"summary_activation":              nil,
		"summary_first_dropout":           0.1,
		"summary_proj_to_labels":          true,
		"summary_type":                    "cls_index",
		"summary_use_proj":                true,
		"tie_word_embeddings":             true,
		"torch_dtype":                     o.DType,
		"use_cache":                       true,
		"vocab_size":                      VocabSize,
	}
}

// ChatTemplate is the demo's chat template: ChatML, as SmolLM-Instruct publishes it.
// GPT-2 has none (it is not a chat model); the demo carries one so that the OpenAI
// server's /v1/chat/completions can be tried on it.
const ChatTemplate = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

// WriteTokenizerConfig writes the demo's tokenizer_config.json: GPT-2's special token
// as bos and eos, and ChatTemplate.
func WriteTokenizerConfig(path string) error {
	cfg := map[string]any{
		"tokenizer_class":  "GPT2Tokenizer",
		"bos_token":        "<|endoftext|>",
		"eos_token":        "<|endoftext|>",
		"unk_token":        "<|endoftext|>",
		"model_max_length": 1024,
		"chat_template":    ChatTemplate,
	}
	raw, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("tokenizer config: %w", err)
	}
	return writeFileAtomic(path, append(raw, '\n'))
}

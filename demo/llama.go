package demo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"gollm/model"
	"gollm/tokenizer"
)

// The LLaMA-shaped demo: a random-weight LlamaForCausalLM with grouped-query attention
// and a real 32,000-token SentencePiece tokenizer — Mistral 7B v0.1's, which
// mistral-common publishes under Apache-2.0, laid out in tokenizer.json as Llama 2's and
// TinyLlama's are (demo/real_tokenizers.py converts it; its licence is not gollm's, so
// it is converted where the demo is written and never committed).

// LlamaOptions shapes the LLaMA demo checkpoint. Zero fields take the defaults of
// DefaultLlamaOptions.
type LlamaOptions struct {
	// Layers, Hidden, Heads, KVHeads and Inner are num_hidden_layers, hidden_size,
	// num_attention_heads, num_key_value_heads and intermediate_size.
	Layers, Hidden, Heads, KVHeads, Inner int
	// Positions is max_position_embeddings.
	Positions int
	// DType is the stored weight type: "float16", "float32" or "bfloat16".
	DType string
	// Seed seeds the random weights; a given seed and shape always give the same file.
	Seed uint64
	// Root is the gollm checkout whose demo/real_tokenizers.py and .deps/realtok make
	// the tokenizer; empty means the working directory.
	Root string
	// Progress, if set, is called after each tensor with the parameters written so far
	// and the total.
	Progress func(done, total int)
}

// DefaultLlamaOptions is the shipped LLaMA demo: 4 layers of width 256, 8 query heads
// sharing 2 KV heads (grouped-query attention, as Llama 2 70B, Llama 3 and Mistral have
// it), bfloat16 as those checkpoints are stored — about 19M parameters, most of them
// the 32,000-token embedding and LM head, quick on the CPU engine.
func DefaultLlamaOptions() LlamaOptions {
	return LlamaOptions{Layers: 4, Hidden: 256, Heads: 8, KVHeads: 2, Inner: 704, Positions: 2048, DType: "bfloat16", Seed: 1}
}

// LlamaVocabSize is the real tokenizer's vocabulary: 32,000 SentencePiece pieces.
const LlamaVocabSize = 32000

// WithDefaults fills zero fields from DefaultLlamaOptions and checks the result.
func (o LlamaOptions) WithDefaults() (LlamaOptions, error) {
	d := DefaultLlamaOptions()
	for _, f := range []struct{ v, d *int }{
		{&o.Layers, &d.Layers}, {&o.Hidden, &d.Hidden}, {&o.Heads, &d.Heads}, {&o.KVHeads, &d.KVHeads},
		{&o.Inner, &d.Inner}, {&o.Positions, &d.Positions},
	} {
		if *f.v == 0 {
			*f.v = *f.d
		}
	}
	if o.DType == "" {
		o.DType = d.DType
	}
	if o.Root == "" {
		o.Root = "."
	}
	switch {
	case o.Layers < 0 || o.Hidden < 0 || o.Heads < 0 || o.KVHeads < 0 || o.Inner < 0 || o.Positions < 0:
		return o, fmt.Errorf("layers %d, hidden %d, heads %d, kv heads %d, inner %d and positions %d must be positive",
			o.Layers, o.Hidden, o.Heads, o.KVHeads, o.Inner, o.Positions)
	case o.Hidden%o.Heads != 0:
		return o, fmt.Errorf("hidden %d is not a multiple of heads %d", o.Hidden, o.Heads)
	case o.Heads%o.KVHeads != 0:
		return o, fmt.Errorf("heads %d is not a multiple of kv heads %d", o.Heads, o.KVHeads)
	case (o.Hidden/o.Heads)%2 != 0:
		return o, fmt.Errorf("the head size %d is odd; rotary embeddings need it even", o.Hidden/o.Heads)
	case stDTypes[o.DType] == "":
		return o, fmt.Errorf("dtype %q is not float16, float32 or bfloat16", o.DType)
	}
	return o, nil
}

// llamaWeightSpecs lists LlamaForCausalLM's tensors in HF's names ([out][in] matrices).
// The projections are drawn with variance 1/fan-in, so that activations keep their
// scale through the layers; the LM head with 0.3², as GPT-2's demo does, so that the
// logits are peaked and greedy choices clear-cut; RMSNorm scales near 1.
func llamaWeightSpecs(o LlamaOptions) []weightSpec {
	h, kv := o.Hidden, o.KVHeads*(o.Hidden/o.Heads)
	proj := func(name string, out, in int) weightSpec {
		return weightSpec{name, []int{out, in}, 0, 1 / math.Sqrt(float64(in))}
	}
	specs := []weightSpec{{"model.embed_tokens.weight", []int{LlamaVocabSize, h}, 0, 1}}
	for i := range o.Layers {
		p := "model.layers." + strconv.Itoa(i) + "."
		specs = append(specs,
			weightSpec{p + "input_layernorm.weight", []int{h}, 1, 0.1},
			proj(p+"self_attn.q_proj.weight", h, h),
			proj(p+"self_attn.k_proj.weight", kv, h),
			proj(p+"self_attn.v_proj.weight", kv, h),
			proj(p+"self_attn.o_proj.weight", h, h),
			weightSpec{p + "post_attention_layernorm.weight", []int{h}, 1, 0.1},
			proj(p+"mlp.gate_proj.weight", o.Inner, h),
			proj(p+"mlp.up_proj.weight", o.Inner, h),
			proj(p+"mlp.down_proj.weight", h, o.Inner),
		)
	}
	return append(specs,
		weightSpec{"model.norm.weight", []int{h}, 1, 0.1},
		weightSpec{"lm_head.weight", []int{LlamaVocabSize, h}, 0, 0.3},
	)
}

// NumParameters is the parameter count of the checkpoint o describes (after
// WithDefaults).
func (o LlamaOptions) NumParameters() int {
	n := 0
	for _, s := range llamaWeightSpecs(o) {
		n += product(s.shape)
	}
	return n
}

// RealTokenizersPythonPath is the PYTHONPATH demo/real_tokenizers.py runs with in the
// checkout root: .deps/realtok/py first (its protobuf is newer than .deps/py's, and
// sentencepiece needs it), then .deps/py (Hugging Face tokenizers).
func RealTokenizersPythonPath(root string) string {
	return filepath.Join(root, ".deps", "realtok", "py") + string(os.PathListSeparator) + filepath.Join(root, ".deps", "py")
}

// WriteLlamaTokenizer writes dir/tokenizer.json and dir/tokenizer_config.json: Mistral 7B
// v0.1's SentencePiece model in Llama 2's layout, converted by demo/real_tokenizers.py
// from the file scripts/deps.sh put in root/.deps/realtok.
func WriteLlamaTokenizer(root, dir string) error {
	cmd := exec.Command("python3", filepath.Join(root, "demo", "real_tokenizers.py"), "convert", "llama2", dir)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+RealTokenizersPythonPath(root))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("convert the llama tokenizer (python3 demo/real_tokenizers.py; scripts/deps.sh installs what it reads): %w\n%s",
			err, strings.TrimSpace(string(out)))
	}
	return nil
}

// LlamaChatTemplate is the LLaMA demo's chat template: Llama 2's and Mistral's [INST]
// turns (a system message goes before the turn it precedes), so that the OpenAI server's
// /v1/chat/completions can be tried on it; the weights are random, and so are the answers.
const LlamaChatTemplate = "{{ bos_token }}{% for message in messages %}" +
	"{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}" +
	"{% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}" +
	"{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"

// WriteLlamaCheckpoint writes the LLaMA demo into dir: the real tokenizer
// (WriteLlamaTokenizer, with LlamaChatTemplate added to tokenizer_config.json),
// config.json, generation_config.json and model.safetensors with random weights.
// model.safetensors is written last, so its presence means the folder is complete.
func WriteLlamaCheckpoint(dir string, o LlamaOptions) error {
	o, err := o.WithDefaults()
	if err != nil {
		return fmt.Errorf("write llama demo checkpoint: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write llama demo checkpoint: %w", err)
	}
	if err := WriteLlamaTokenizer(o.Root, dir); err != nil {
		return fmt.Errorf("write llama demo checkpoint: %w", err)
	}
	tk, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return fmt.Errorf("write llama demo checkpoint: %w", err)
	}
	bos, okB := tk.TokenID("<s>")
	eos, okE := tk.TokenID("</s>")
	if tk.VocabSize() != LlamaVocabSize || !okB || !okE {
		return fmt.Errorf("write llama demo checkpoint: the converted tokenizer has %d tokens (want %d) and <s>, </s> %v %v",
			tk.VocabSize(), LlamaVocabSize, okB, okE)
	}
	if err := addChatTemplate(filepath.Join(dir, "tokenizer_config.json"), LlamaChatTemplate); err != nil {
		return fmt.Errorf("write llama demo checkpoint: %w", err)
	}
	files := []struct {
		name string
		v    any
	}{
		{"config.json", llamaConfigJSON(o, bos, eos)},
		{"generation_config.json", map[string]any{"_from_model_config": true, "bos_token_id": bos, "eos_token_id": eos}},
	}
	for _, f := range files {
		raw, err := indentJSON(f.v)
		if err == nil {
			err = writeFileAtomic(filepath.Join(dir, f.name), raw)
		}
		if err != nil {
			return fmt.Errorf("write llama demo checkpoint: %s: %w", f.name, err)
		}
	}
	tensors, err := drawWeights(llamaWeightSpecs(o), o.Seed, o.DType, o.Progress)
	if err != nil {
		return fmt.Errorf("write llama demo checkpoint: %w", err)
	}
	meta := map[string]string{
		"format": "pt",
		"gollm":  fmt.Sprintf("random weights, seed %d; not a trained model", o.Seed),
	}
	if err := model.WriteSafetensors(filepath.Join(dir, "model.safetensors"), tensors, meta); err != nil {
		return fmt.Errorf("write llama demo checkpoint: %w", err)
	}
	return nil
}

// addChatTemplate sets chat_template in a tokenizer_config.json.
func addChatTemplate(path, template string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("add the chat template: %w", err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("add the chat template to %s: %w", path, err)
	}
	cfg["chat_template"] = template
	if raw, err = indentJSON(cfg); err != nil {
		return fmt.Errorf("add the chat template to %s: %w", path, err)
	}
	return writeFileAtomic(path, raw)
}

// indentJSON is v as indented JSON with a final newline, leaving < > & as they are
// ("<s>", not "\u003cs\u003e"), as Python's json writes them.
func indentJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// llamaConfigJSON is config.json as transformers' LlamaConfig writes it (4.x field names,
// as most published Llama checkpoints have them).
func llamaConfigJSON(o LlamaOptions, bos, eos int32) map[string]any {
	return map[string]any{
		"architectures":           []string{"LlamaForCausalLM"},
		"attention_bias":          false,
		"attention_dropout":       0.0,
		"bos_token_id":            bos,
		"eos_token_id":            eos,
		"hidden_act":              "silu",
		"hidden_size":             o.Hidden,
		"initializer_range":       0.02,
		"intermediate_size":       o.Inner,
		"max_position_embeddings": o.Positions,
		"mlp_bias":                false,
		"model_type":              "llama",
		"num_attention_heads":     o.Heads,
		"num_hidden_layers":       o.Layers,
		"num_key_value_heads":     o.KVHeads,
		"pretraining_tp":          1,
		"rms_norm_eps":            1e-05,
		"rope_scaling":            nil,
		"rope_theta":              10000.0,
		"tie_word_embeddings":     false,
		"torch_dtype":             o.DType,
		"use_cache":               true,
		"vocab_size":              LlamaVocabSize,
	}
}

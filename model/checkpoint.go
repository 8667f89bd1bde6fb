package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// hfPrefix is the prefix transformers' GPT2LMHeadModel puts on the base model's tensor
// names; checkpoints saved from the bare GPT2Model (OpenAI's original gpt2) lack it.
const hfPrefix = "transformer."

// Checkpoint is an open Hugging Face checkpoint folder: its config and its memory-mapped
// safetensors weights.
type Checkpoint struct {
	// Dir is the checkpoint folder; tokenizer.json is read from it.
	Dir string
	// Config holds the hyperparameters from config.json.
	Config Config
	// files are the mapped weight files (one, or one per shard).
	files []*stFile
	// tensors indexes every tensor of every file by its stored name.
	tensors map[string]*Tensor
}

// Open reads dir/config.json and maps the weights: dir/model.safetensors, or the shards
// that dir/model.safetensors.index.json names. Close the checkpoint to unmap them.
func Open(dir string) (_ *Checkpoint, err error) {
	cfgPath := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %w", err)
	}
	cfg, err := parseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %s: %w", cfgPath, err)
	}
	c := &Checkpoint{Dir: dir, Config: cfg, tensors: map[string]*Tensor{}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	files, err := weightFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %w", err)
	}
	for _, name := range files {
		st, err := openSafetensors(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("open checkpoint: %w", err)
		}
		c.files = append(c.files, st)
		for tname, t := range st.tensors {
			if _, dup := c.tensors[tname]; dup {
				return nil, fmt.Errorf("open checkpoint: tensor %s is in more than one shard (again in %s)", tname, name)
			}
			c.tensors[tname] = t
		}
	}
	if err := c.checkIndex(); err != nil {
		return nil, fmt.Errorf("open checkpoint: %w", err)
	}
	if c.Config.DType == "" {
		// Older configs (OpenAI's gpt2) name no dtype: take the embedding's.
		if t, err := c.Tensor("wte.weight"); err == nil {
			c.Config.DType = torchDTypes[t.DType]
		}
	}
	return c, nil
}

// weightFiles lists the safetensors files of dir: model.safetensors if present, else the
// distinct shards of the index's weight_map, in name order.
func weightFiles(dir string) ([]string, error) {
	single := filepath.Join(dir, "model.safetensors")
	if _, err := os.Stat(single); err == nil {
		return []string{"model.safetensors"}, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	index, err := readIndex(dir)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var files []string
	for _, f := range index {
		if !seen[f] {
			seen[f] = true
			files = append(files, f)
		}
	}
	sort.Strings(files)
	return files, nil
}

// readIndex reads model.safetensors.index.json's weight_map (tensor name → shard file).
// A missing index means the folder holds no weights at all.
func readIndex(dir string) (map[string]string, error) {
	path := filepath.Join(dir, "model.safetensors.index.json")
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s holds neither model.safetensors nor model.safetensors.index.json", dir)
	}
	if err != nil {
		return nil, err
	}
	var index struct {
		// WeightMap maps each tensor to the shard that holds it.
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(raw, &index); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", path, err)
	}
	if len(index.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: weight_map is missing or empty", path)
	}
	for name, f := range index.WeightMap {
		// Shards are plain file names beside the index; anything else could reach
		// outside the checkpoint folder.
		if f == "" || f != filepath.Base(f) || f == "." || f == ".." {
			return nil, fmt.Errorf("%s: weight_map[%s] = %q is not a file name in the folder", path, name, f)
		}
	}
	return index.WeightMap, nil
}

// checkIndex verifies, for a sharded checkpoint, that every tensor of the weight_map is
// in the shard the index names.
func (c *Checkpoint) checkIndex() error {
	if len(c.files) == 1 && filepath.Base(c.files[0].path) == "model.safetensors" {
		return nil
	}
	index, err := readIndex(c.Dir)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(index))
	for name := range index {
		names = append(names, name)
	}
	sort.Strings(names) // the first problem in name order, the same every run
	for _, name := range names {
		f := index[name]
		t, ok := c.tensors[name]
		if !ok {
			return fmt.Errorf("tensor %s: model.safetensors.index.json puts it in %s, which does not hold it", name, f)
		}
		for _, st := range c.files {
			if filepath.Base(st.path) == f && st.tensors[name] != t {
				return fmt.Errorf("tensor %s: model.safetensors.index.json puts it in %s, which does not hold it", name, f)
			}
		}
	}
	return nil
}

// Tensor returns the named tensor. HF's "transformer." prefix is optional: "wte.weight"
// and "transformer.wte.weight" find the same tensor whichever way the file names it.
// The tensor's Data is valid until Close.
func (c *Checkpoint) Tensor(name string) (*Tensor, error) {
	if t, ok := c.tensors[name]; ok {
		return t, nil
	}
	alt := hfPrefix + name
	if rest, ok := strings.CutPrefix(name, hfPrefix); ok {
		alt = rest
	}
	if t, ok := c.tensors[alt]; ok {
		return t, nil
	}
	return nil, fmt.Errorf("tensor %s: %w in %s", name, ErrTensorNotFound, c.Dir)
}

// Names lists the stored tensor names, sorted.
func (c *Checkpoint) Names() []string {
	names := make([]string, 0, len(c.tensors))
	for n := range c.tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Close unmaps the weight files; tensors obtained from the checkpoint become invalid.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, st := range c.files {
		errs = append(errs, st.close())
	}
	c.files = nil
	c.tensors = nil
	return errors.Join(errs...)
}

// torchDTypes maps safetensors dtypes to the torch names config.json uses.
var torchDTypes = map[string]string{"F32": "float32", "F16": "float16", "BF16": "bfloat16"}

// supportedArchs are the model_type values gollm loads.
var supportedArchs = map[string]bool{"gpt2": true}

// supportedActivations are the activation_function values of GPT-2 checkpoints that
// gollm's engines implement: the tanh approximation of GELU (under two names) and the
// exact erf form.
var supportedActivations = map[string]bool{"gelu_new": true, "gelu_pytorch_tanh": true, "gelu": true}

// parseConfig reads a GPT-2 style config.json. Fields HF's GPT2Config gives defaults to
// (n_inner, layer_norm_epsilon, activation_function, the token ids, the dtype) may be
// absent; the shape fields may not.
func parseConfig(raw []byte) (Config, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return Config{}, fmt.Errorf("invalid JSON: %w", err)
	}
	p := configParser{m: m}
	var c Config
	c.Arch = p.str("model_type", "")
	if c.Arch == "" {
		p.fail("model_type", errors.New("missing (a string like \"gpt2\" is required)"))
	} else if !supportedArchs[c.Arch] {
		p.fail("model_type", fmt.Errorf("%q is not supported (supported: gpt2)", c.Arch))
	}
	c.VocabSize = p.positive("vocab_size", 0)
	c.MaxPositions = p.positive("n_positions", 0)
	c.Hidden = p.positive("n_embd", 0)
	c.Layers = p.positive("n_layer", 0)
	c.Heads = p.positive("n_head", 0)
	c.Inner = p.positive("n_inner", 4*c.Hidden)
	c.LayerNormEps = float32(p.number("layer_norm_epsilon", 1e-5))
	c.Activation = p.str("activation_function", "gelu_new")
	c.BOSID = p.tokenID("bos_token_id")
	c.EOSID = p.tokenID("eos_token_id")
	if _, ok := m["torch_dtype"]; ok {
		c.DType = p.str("torch_dtype", "")
	} else {
		c.DType = p.str("dtype", "")
	}
	if p.err != nil {
		return Config{}, p.err
	}
	switch {
	case !supportedActivations[c.Activation]:
		return Config{}, fmt.Errorf("field activation_function: %q is not supported (supported: gelu_new, gelu_pytorch_tanh, gelu)", c.Activation)
	case c.EOSID >= int32(c.VocabSize):
		return Config{}, fmt.Errorf("field eos_token_id: %d is not below vocab_size %d", c.EOSID, c.VocabSize)
	case c.BOSID >= int32(c.VocabSize):
		return Config{}, fmt.Errorf("field bos_token_id: %d is not below vocab_size %d", c.BOSID, c.VocabSize)
	case c.Hidden%c.Heads != 0:
		return Config{}, fmt.Errorf("field n_embd: %d is not a multiple of n_head %d", c.Hidden, c.Heads)
	case !(c.LayerNormEps > 0):
		return Config{}, fmt.Errorf("field layer_norm_epsilon: must be positive, got %g", c.LayerNormEps)
	case c.DType == "auto":
		c.DType = "" // no stored type named; Open takes the weights'
	case c.DType != "" && c.DType != "float32" && c.DType != "float16" && c.DType != "bfloat16":
		return Config{}, fmt.Errorf("field torch_dtype: %q is not float32, float16 or bfloat16", c.DType)
	}
	c.KVHeads = c.Heads
	c.HeadDim = c.Hidden / c.Heads
	return c, nil
}

// configParser reads typed fields from config.json, keeping the first error, which names
// the field.
type configParser struct {
	// m is the decoded top-level object.
	m map[string]json.RawMessage
	// err is the first error met.
	err error
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

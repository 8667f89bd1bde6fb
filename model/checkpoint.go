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

// Checkpoint is an open Hugging Face checkpoint folder: its config and its memory-mapped
// safetensors weights.
type Checkpoint struct {
	// Dir is the checkpoint folder; tokenizer.json is read from it. For a GGUF
	// checkpoint it is the path it was opened from (the file, or its folder).
	Dir string
	// GGUF is the GGUF file of a GGUF checkpoint; "" for a Hugging Face folder.
	GGUF string
	// Config is the architecture descriptor read from config.json.
	Config Config
	// fam is the loader of the checkpoint's architecture.
	fam *family
	// fields maps descriptor fields to the config.json fields they came from, for
	// messages.
	fields map[string]string
	// files are the mapped weight files (one, or one per shard).
	files []*stFile
	// tensors indexes every tensor of every file by its stored name.
	tensors map[string]*Tensor
	// quant is the FP8 scheme of quantization_config; nil for a float checkpoint.
	quant *Quant
	// gguf is a GGUF checkpoint's mapped file.
	gguf *ggufFile
}

// Open reads dir/config.json and maps the weights: dir/model.safetensors, or the shards
// that dir/model.safetensors.index.json names. dir may instead be a GGUF file, or a
// folder holding one and no config.json (GGUFPath), whose metadata gives the config.
// Close the checkpoint to unmap the weights.
func Open(dir string) (_ *Checkpoint, err error) {
	if g, err := GGUFPath(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("open checkpoint: %w", err)
	} else if g != "" {
		return openGGUFCheckpoint(dir, g)
	}
	cfgPath := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %w", err)
	}
	cfg, fam, fields, err := parseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %s: %w", cfgPath, err)
	}
	var qc struct {
		// Quant is the checkpoint's quantization, if any.
		Quant json.RawMessage `json:"quantization_config"`
	}
	if err := json.Unmarshal(raw, &qc); err != nil {
		return nil, fmt.Errorf("open checkpoint: %s: %w", cfgPath, err)
	}
	quant, err := parseQuant(qc.Quant)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %s: %w", cfgPath, err)
	}
	c := &Checkpoint{Dir: dir, Config: cfg, fam: fam, fields: fields, tensors: map[string]*Tensor{}, quant: quant}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	files, err := weightFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %w", err)
	}
	budget := newHeaderBudget()
	for _, name := range files {
		st, err := openSafetensorsWithin(filepath.Join(dir, name), budget)
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
		if t, err := c.Tensor(fam.names(&c.Config, RoleEmbed, -1)[0].name); err == nil {
			c.Config.DType = torchDTypes[t.DType]
		}
	}
	return c, nil
}

// Quant is the checkpoint's FP8 scheme; nil for a float checkpoint.
func (c *Checkpoint) Quant() *Quant { return c.quant }

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
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s holds neither model.safetensors nor model.safetensors.index.json", dir)
	}
	if err != nil {
		return nil, err
	}
	// An index names each tensor once, as a header does: the same bound.
	if fi.Size() > maxHeaderBytes {
		return nil, fmt.Errorf("%s: %d bytes is over the bound of %d bytes (100 MiB) on a shard index", path, fi.Size(), maxHeaderBytes)
	}
	raw, err := os.ReadFile(path)
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
	if len(index.WeightMap) > maxTensors {
		return nil, fmt.Errorf("%s: weight_map names %d tensors, over the bound of %d on a checkpoint's tensors", path, len(index.WeightMap), maxTensors)
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

// Tensor returns the named tensor. The architecture's base-model prefix is optional:
// "wte.weight" and "transformer.wte.weight" find the same tensor of a GPT-2 checkpoint
// whichever way the file names it. The tensor's Data is valid until Close.
func (c *Checkpoint) Tensor(name string) (*Tensor, error) {
	if t, ok := c.tensors[name]; ok {
		return t, nil
	}
	if c.fam != nil {
		for _, prefix := range c.fam.prefixes() {
			alt := prefix + name
			if rest, ok := strings.CutPrefix(name, prefix); ok {
				alt = rest
			}
			if t, ok := c.tensors[alt]; ok {
				return t, nil
			}
		}
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
	if c.gguf != nil {
		errs = append(errs, c.gguf.close())
		c.gguf = nil
	}
	c.files = nil
	c.tensors = nil
	return errors.Join(errs...)
}

// torchDTypes maps safetensors dtypes to the torch names config.json uses.
var torchDTypes = map[string]string{"F32": "float32", "F16": "float16", "BF16": "bfloat16"}

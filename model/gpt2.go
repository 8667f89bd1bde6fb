package model

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// GPT2 holds a GPT-2 checkpoint's weights in float32, as the CPU engine uses them.
// Matrices keep the checkpoint's Conv1D layout, [in][out] row-major, so x·W is a
// plain row-vector product.
//
// LoadGPT2 fills the fields by their tags: `tensor` is the checkpoint name (a slice of
// structs is a list of layers named "<tag>.<i>."), `shape` the expected shape in the
// dimension names of shapeDims.
type GPT2 struct {
	// Config holds the hyperparameters.
	Config Config
	// WTE is the token embedding, [vocab][hidden]; the LM head is its transpose (tied).
	WTE []float32 `tensor:"wte.weight" shape:"vocab,hidden"`
	// WPE is the position embedding, [max_positions][hidden].
	WPE []float32 `tensor:"wpe.weight" shape:"positions,hidden"`
	// Layers are the transformer blocks, in order.
	Layers []GPT2Layer `tensor:"h"`
	// LNFW and LNFB are the final LayerNorm's scale and shift, [hidden].
	LNFW []float32 `tensor:"ln_f.weight" shape:"hidden"`
	LNFB []float32 `tensor:"ln_f.bias" shape:"hidden"`
}

// GPT2Layer is one transformer block; tensor names are relative to "h.<i>.".
type GPT2Layer struct {
	// LN1W, LN1B: LayerNorm before attention, [hidden].
	LN1W []float32 `tensor:"ln_1.weight" shape:"hidden"`
	LN1B []float32 `tensor:"ln_1.bias" shape:"hidden"`
	// AttnW [hidden][3*hidden] and AttnB [3*hidden]: the fused Q, K, V projection.
	AttnW []float32 `tensor:"attn.c_attn.weight" shape:"hidden,qkv"`
	AttnB []float32 `tensor:"attn.c_attn.bias" shape:"qkv"`
	// ProjW [hidden][hidden] and ProjB [hidden]: the attention output projection.
	ProjW []float32 `tensor:"attn.c_proj.weight" shape:"hidden,hidden"`
	ProjB []float32 `tensor:"attn.c_proj.bias" shape:"hidden"`
	// LN2W, LN2B: LayerNorm before the MLP, [hidden].
	LN2W []float32 `tensor:"ln_2.weight" shape:"hidden"`
	LN2B []float32 `tensor:"ln_2.bias" shape:"hidden"`
	// FCW [hidden][inner] and FCB [inner]: the MLP's first projection.
	FCW []float32 `tensor:"mlp.c_fc.weight" shape:"hidden,inner"`
	FCB []float32 `tensor:"mlp.c_fc.bias" shape:"inner"`
	// MLPProjW [inner][hidden] and MLPProjB [hidden]: the MLP's second projection.
	MLPProjW []float32 `tensor:"mlp.c_proj.weight" shape:"inner,hidden"`
	MLPProjB []float32 `tensor:"mlp.c_proj.bias" shape:"hidden"`
}

// shapeDims gives the sizes that `shape` tags name, from a config.
func shapeDims(c Config) map[string]int {
	return map[string]int{
		"vocab":     c.VocabSize,
		"positions": c.MaxPositions,
		"hidden":    c.Hidden,
		"qkv":       3 * c.Hidden,
		"inner":     c.Inner,
	}
}

// LoadGPT2 converts a GPT-2 checkpoint's weights to float32. Every tensor must be
// present with the shape the config implies and a float dtype (F32, F16 or BF16). A
// stored lm_head.weight must equal wte.weight: GPT-2 ties the LM head to the embedding,
// and an untied head is refused rather than silently ignored. The result owns its
// memory; the checkpoint may be closed afterwards.
func LoadGPT2(c *Checkpoint) (*GPT2, error) {
	if c.Config.Arch != "gpt2" {
		return nil, fmt.Errorf("load gpt2 %s: model_type is %q, not gpt2", c.Dir, c.Config.Arch)
	}
	m := &GPT2{Config: c.Config, Layers: make([]GPT2Layer, c.Config.Layers)}
	if err := fillTensors(c, reflect.ValueOf(m).Elem(), "", shapeDims(c.Config)); err != nil {
		return nil, fmt.Errorf("load gpt2 %s: %w", c.Dir, err)
	}
	head, err := c.Tensor("lm_head.weight")
	if err == nil {
		w, err := floatTensor(head, []int{c.Config.VocabSize, c.Config.Hidden})
		if err != nil {
			return nil, fmt.Errorf("load gpt2 %s: %w", c.Dir, err)
		}
		if !slices.Equal(w, m.WTE) {
			return nil, fmt.Errorf("load gpt2 %s: tensor lm_head.weight differs from wte.weight; only a tied LM head is supported", c.Dir)
		}
	} else if !errors.Is(err, ErrTensorNotFound) {
		return nil, fmt.Errorf("load gpt2 %s: %w", c.Dir, err)
	}
	return m, nil
}

// LoadGPT2Dir opens the checkpoint folder dir, loads its GPT-2 weights and closes it:
// for callers that need only the weights (and their Config), not the open checkpoint.
// Every error names dir once: Open's are wrapped here, LoadGPT2's already name it.
func LoadGPT2Dir(dir string) (*GPT2, error) {
	c, err := Open(dir)
	if err != nil {
		return nil, fmt.Errorf("load gpt2 %s: %w", dir, err)
	}
	m, err := LoadGPT2(c)
	// The weights are copies, so a failed unmap does not spoil them; it is still an
	// error, since the mapping may be left behind.
	if cerr := c.Close(); err == nil && cerr != nil {
		return nil, fmt.Errorf("load gpt2 %s: close: %w", dir, cerr)
	}
	return m, err
}

// fillTensors sets every tagged field of the struct v from the checkpoint, names
// prefixed by prefix.
func fillTensors(c *Checkpoint, v reflect.Value, prefix string, dims map[string]int) error {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, ok := f.Tag.Lookup("tensor")
		if !ok {
			continue
		}
		fv := v.Field(i)
		switch {
		case f.Type == reflect.TypeFor[[]float32]():
			shape, err := parseShape(f.Tag.Get("shape"), dims)
			if err != nil {
				return fmt.Errorf("field %s: %w", f.Name, err)
			}
			tensor, err := c.Tensor(prefix + name)
			if err != nil {
				return err
			}
			data, err := floatTensor(tensor, shape)
			if err != nil {
				return err
			}
			fv.Set(reflect.ValueOf(data))
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			for j := range fv.Len() {
				if err := fillTensors(c, fv.Index(j), fmt.Sprintf("%s%s.%d.", prefix, name, j), dims); err != nil {
					return err
				}
			}
		default:
			return fmt.Errorf("field %s: a tensor tag on type %s (want []float32 or a slice of structs)", f.Name, f.Type)
		}
	}
	return nil
}

// parseShape turns a `shape` tag ("hidden,qkv") into sizes.
func parseShape(tag string, dims map[string]int) ([]int, error) {
	if tag == "" {
		return nil, errors.New("no shape tag")
	}
	var shape []int
	for _, d := range strings.Split(tag, ",") {
		n, ok := dims[d]
		if !ok {
			return nil, fmt.Errorf("shape tag %q: unknown dimension %q", tag, d)
		}
		shape = append(shape, n)
	}
	return shape, nil
}

// floatTensor checks t's dtype and shape and converts it to float32.
func floatTensor(t *Tensor, shape []int) ([]float32, error) {
	if t.DType != "F32" && t.DType != "F16" && t.DType != "BF16" {
		return nil, fmt.Errorf("tensor %s: dtype %s, expected F32, F16 or BF16", t.Name, t.DType)
	}
	if !slices.Equal(t.Shape, shape) {
		return nil, fmt.Errorf("tensor %s: shape %v, expected %v", t.Name, t.Shape, shape)
	}
	return t.Float32()
}

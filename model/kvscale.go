package model

import (
	"errors"
	"fmt"
	"math"
)

// kvScaleNames are where FP8 checkpoints keep a layer's KV cache scales, under the layer's
// attention module (self_attn, or GPT-2's attn): llm-compressor's kv_cache_scheme
// (compressed-tensors) saves k_scale and v_scale on the module; ModelOpt and AutoFP8 on
// the projections (k_proj.k_scale, v_proj.v_scale); older exports one kv_scale for both.
var kvScaleNames = [][3]string{
	{"k_scale", "v_scale", ""},
	{"k_proj.k_scale", "v_proj.v_scale", ""},
	{"", "", "kv_scale"},
}

// KVScales reads the checkpoint's FP8 KV cache scales: per layer, the key and value
// dequantization scales (the cached value times its scale is the real one). Both are nil
// when the checkpoint has none (engines then take 1). A scale must be one finite positive
// number; per-head scales, a layer without scales beside one with them, and a key scale
// without its value scale are refused, naming the tensor.
func (c *Checkpoint) KVScales() (k, v []float32, err error) {
	if c.fam == nil || c.fam.layerPrefix == nil || c.gguf != nil {
		return nil, nil, nil
	}
	layers := c.Config.Layers
	found := 0
	for l := range layers {
		lk, lv, where, err := c.layerKVScales(l)
		if err != nil {
			return nil, nil, err
		}
		if where == "" {
			if found > 0 {
				return nil, nil, fmt.Errorf("KV cache scales: layer %d has none, where layers before it have them", l)
			}
			continue
		}
		if found < l {
			return nil, nil, fmt.Errorf("KV cache scales: layer %d has them (%s), layers before it none", l, where)
		}
		if k == nil {
			k, v = make([]float32, layers), make([]float32, layers)
		}
		k[l], v[l] = lk, lv
		found++
	}
	return k, v, nil
}

// layerKVScales finds layer l's KV scales under its attention module; where names the
// tensors found, "" when there are none.
func (c *Checkpoint) layerKVScales(l int) (k, v float32, where string, err error) {
	for _, module := range []string{"self_attn.", "attn."} {
		prefix := c.fam.layerPrefix(l) + module
		for _, n := range kvScaleNames {
			if n[2] != "" {
				t, err := c.Tensor(prefix + n[2])
				if errors.Is(err, ErrTensorNotFound) {
					continue
				}
				s, err := kvScale(t, err)
				return s, s, t.Name, err
			}
			kt, kerr := c.Tensor(prefix + n[0])
			vt, verr := c.Tensor(prefix + n[1])
			switch {
			case errors.Is(kerr, ErrTensorNotFound) && errors.Is(verr, ErrTensorNotFound):
				continue
			case errors.Is(kerr, ErrTensorNotFound):
				return 0, 0, "", fmt.Errorf("tensor %s: a value scale without its key scale %s", vt.Name, prefix+n[0])
			case errors.Is(verr, ErrTensorNotFound):
				return 0, 0, "", fmt.Errorf("tensor %s: a key scale without its value scale %s", kt.Name, prefix+n[1])
			}
			if k, err = kvScale(kt, kerr); err == nil {
				v, err = kvScale(vt, verr)
			}
			return k, v, kt.Name + ", " + vt.Name, err
		}
	}
	return 0, 0, "", nil
}

// kvScale reads a scale tensor: one finite positive float.
func kvScale(t *Tensor, err error) (float32, error) {
	if err != nil {
		return 0, err
	}
	if t.NumElements() != 1 || len(t.Shape) > 1 {
		return 0, fmt.Errorf("tensor %s: shape %v: gollm reads one KV cache scale a layer (per-tensor), not per head", t.Name, t.Shape)
	}
	vals, err := t.Float32()
	if err != nil {
		return 0, fmt.Errorf("tensor %s: %w", t.Name, err)
	}
	if s := vals[0]; !(s > 0) || math.IsInf(float64(s), 0) {
		return 0, fmt.Errorf("tensor %s: KV cache scale %g is not a finite positive number", t.Name, s)
	}
	return vals[0], nil
}

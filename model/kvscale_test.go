package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"
)

// fp8kvDir is compressed-tensors' FP8 fixture with a KV cache scheme: k_scale and
// v_scale on each layer's self_attn.
const fp8kvDir = "../testdata/llama-fp8kv-tiny"

// scalarF32 is a float32 tensor of the given shape holding v (one element).
func scalarF32(name string, shape []int, v float32) *Tensor {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, math.Float32bits(v))
	return &Tensor{Name: name, DType: "F32", Shape: shape, Data: b}
}

func TestKVScalesReadTheCheckpoints(t *testing.T) {
	ck, err := Open(fp8kvDir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	k, v, err := ck.KVScales()
	if err != nil {
		t.Fatal(err)
	}
	if len(k) != ck.Config.Layers || len(v) != ck.Config.Layers {
		t.Fatalf("KVScales: %d and %d scales for %d layers", len(k), len(v), ck.Config.Layers)
	}
	for l := range ck.Config.Layers {
		for _, c := range []struct {
			name string
			got  float32
		}{{"k_scale", k[l]}, {"v_scale", v[l]}} {
			tn, err := ck.Tensor(fmt.Sprintf("layers.%d.self_attn.%s", l, c.name))
			if err != nil {
				t.Fatal(err)
			}
			want, err := tn.Float32()
			if err != nil {
				t.Fatal(err)
			}
			if c.got != want[0] || !(c.got > 0) {
				t.Errorf("layer %d %s = %g, the file holds %g", l, c.name, c.got, want[0])
			}
		}
	}
	// A checkpoint without scales gives none.
	for _, dir := range []string{fp8ctDir, tinyDir, "../testdata/gpt2-tiny"} {
		c, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		k, v, err := c.KVScales()
		c.Close()
		if err != nil || k != nil || v != nil {
			t.Errorf("%s: KVScales = %v, %v, %v; want none", dir, k, v, err)
		}
	}
}

func TestKVScalesOtherNamesAndRefusals(t *testing.T) {
	const llamaDir = "../testdata/llama-tiny"
	base := func() []*Tensor { return fixtureTensors(t, llamaDir) }
	cfg := fixtureConfig(t, llamaDir)
	layers := int(cfg["num_hidden_layers"].(float64))
	every := func(f func(l int) []*Tensor) []*Tensor {
		ts := base()
		for l := range layers {
			ts = append(ts, f(l)...)
		}
		return ts
	}
	name := func(l int, rest string) string { return fmt.Sprintf("model.layers.%d.self_attn.%s", l, rest) }
	for _, c := range []struct {
		desc    string
		tensors []*Tensor
		k, v    float32
		refuse  string
	}{
		{"ModelOpt's names on the projections", every(func(l int) []*Tensor {
			return []*Tensor{scalarF32(name(l, "k_proj.k_scale"), nil, 0.5), scalarF32(name(l, "v_proj.v_scale"), []int{1}, 0.25)}
		}), 0.5, 0.25, ""},
		{"one kv_scale for both", every(func(l int) []*Tensor {
			return []*Tensor{scalarF32(name(l, "kv_scale"), []int{}, 2)}
		}), 2, 2, ""},
		{"per-head scales", every(func(l int) []*Tensor {
			return []*Tensor{{Name: name(l, "k_scale"), DType: "F32", Shape: []int{2}, Data: make([]byte, 8)},
				scalarF32(name(l, "v_scale"), nil, 1)}
		}), 0, 0, "not per head"},
		{"a key scale alone", every(func(l int) []*Tensor {
			return []*Tensor{scalarF32(name(l, "k_scale"), nil, 1)}
		}), 0, 0, "without its value scale"},
		{"a zero scale", every(func(l int) []*Tensor {
			return []*Tensor{scalarF32(name(l, "k_scale"), nil, 0), scalarF32(name(l, "v_scale"), nil, 1)}
		}), 0, 0, "not a finite positive number"},
		{"a NaN scale", every(func(l int) []*Tensor {
			return []*Tensor{scalarF32(name(l, "k_scale"), nil, 1), scalarF32(name(l, "v_scale"), nil, float32(math.NaN()))}
		}), 0, 0, "not a finite positive number"},
		{"the last layer without", append(base(), scalarF32(name(0, "k_scale"), nil, 1), scalarF32(name(0, "v_scale"), nil, 1)), 0, 0,
			"has none, where layers before it have them"},
		{"the first layer without", append(base(), scalarF32(name(layers-1, "k_scale"), nil, 1), scalarF32(name(layers-1, "v_scale"), nil, 1)), 0, 0,
			"layers before it none"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			ck, err := Open(writeCheckpoint(t, cfg, c.tensors))
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			k, v, err := ck.KVScales()
			if c.refuse != "" {
				if err == nil || !strings.Contains(err.Error(), c.refuse) {
					t.Fatalf("KVScales: %v; want an error saying %q", err, c.refuse)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for l := range layers {
				if k[l] != c.k || v[l] != c.v {
					t.Errorf("layer %d: scales %g, %g; want %g, %g", l, k[l], v[l], c.k, c.v)
				}
			}
		})
	}
}

package model

import (
	"math"
	"slices"
	"strings"
	"testing"
)

const (
	// fp8Dir is transformers' fine-grained FP8 fixture (128×128 blocks).
	fp8Dir = "../testdata/llama-fp8-tiny"
	// fp8ctDir is compressed-tensors' per-channel FP8 fixture.
	fp8ctDir = "../testdata/llama-fp8ct-tiny"
)

func TestE4M3Codec(t *testing.T) {
	for _, c := range []struct {
		b uint8
		v float32
	}{{0x00, 0}, {0x38, 1}, {0x7e, 448}, {0xfe, -448}, {0x01, 1.0 / 512}, {0x08, 1.0 / 64}, {0x3c, 1.5}, {0xc0, -2}} {
		if got := E4M3ToFloat32(c.b); got != c.v {
			t.Errorf("E4M3ToFloat32(%#x) = %g, want %g", c.b, got, c.v)
		}
	}
	if !math.IsNaN(float64(E4M3ToFloat32(0x7f))) || !math.IsNaN(float64(E4M3ToFloat32(0xff))) {
		t.Error("0x7f and 0xff must decode as NaN")
	}
	// Every finite code round-trips; halfway values go to the even code; out of range
	// saturates.
	for b := range 256 {
		if b&0x7f == 0x7f || b == 0x80 {
			continue
		}
		if got := Float32ToE4M3(E4M3ToFloat32(uint8(b))); got != uint8(b) {
			t.Errorf("Float32ToE4M3(%g) = %#x, want %#x", E4M3ToFloat32(uint8(b)), got, b)
		}
	}
	for _, c := range []struct {
		v float32
		b uint8
	}{{1.0625, 0x38}, {1.1875, 0x3a}, {1000, 0x7e}, {-1e9, 0xfe}, {1e-9, 0x00}} {
		if got := Float32ToE4M3(c.v); got != c.b {
			t.Errorf("Float32ToE4M3(%g) = %#x, want %#x", c.v, got, c.b)
		}
	}
}

// TestFP8CheckpointsLoad opens both fixture formats: each projection comes as F8_E4M3
// with its scales in the canonical shape, the rest as stored, and Float32 gives the
// stored value times its block's scale, checked element by element against the files.
func TestFP8CheckpointsLoad(t *testing.T) {
	for _, c := range []struct {
		dir, scale, desc string
		// block is the rows and columns one scale covers in this fixture.
		br, bc int
	}{
		{fp8Dir, "weight_scale_inv", "fp8 float8_e4m3fn weights, 128×128 block scales, dynamic activations", 128, 128},
		{fp8ctDir, "weight_scale", "compressed-tensors float8_e4m3fn weights, per-channel scales, dynamic activations", 1, 1 << 20},
	} {
		ck, err := Open(c.dir)
		if err != nil {
			t.Fatal(err)
		}
		if q := ck.Quant(); q == nil || q.String() != c.desc {
			t.Fatalf("%s: Quant() = %v, want %s", c.dir, q, c.desc)
		}
		ws, err := ck.Weights()
		if err != nil {
			t.Fatal(err)
		}
		nfp8 := 0
		for i := range ws {
			w := &ws[i]
			want := w.Role == RoleQKV || w.Role == RoleOut || w.Role == RoleUp || w.Role == RoleDown
			if w.FP8() != want {
				t.Fatalf("%s: %s FP8 %v, want %v", c.dir, w, w.FP8(), want)
			}
			if !want {
				continue
			}
			nfp8++
			got, err := w.Float32()
			if err != nil {
				t.Fatal(err)
			}
			row := 0
			for _, p := range w.Parts {
				st, err := ck.Tensor(strings.TrimSuffix(p.Tensor.Name, "weight") + c.scale)
				if err != nil {
					t.Fatal(err)
				}
				sv, err := st.Float32()
				if err != nil {
					t.Fatal(err)
				}
				sc := (w.Cols + c.bc - 1) / c.bc
				for r := range p.Rows {
					for col := range w.Cols {
						s := sv[(r/c.br)*sc+col/c.bc]
						want := E4M3ToFloat32(p.Tensor.Data[r*w.Cols+col]) * s
						if g := got[(row+r)*w.Cols+col]; g != want {
							t.Fatalf("%s: %s [%d][%d] = %g, want %g", c.dir, w, row+r, col, g, want)
						}
					}
				}
				row += p.Rows
			}
		}
		if nfp8 != 8 {
			t.Errorf("%s: %d FP8 weights, want 8", c.dir, nfp8)
		}
		ck.Close()
	}
}

// TestFP8Refusals: other quantization methods, bad FP8 configs and bad FP8 files are
// refused at load with a message naming what is wrong.
func TestFP8Refusals(t *testing.T) {
	edit := func(dir string, cfg func(map[string]any), tensors func([]*Tensor) []*Tensor) string {
		m := fixtureConfig(t, dir)
		if cfg != nil {
			cfg(m)
		}
		ts := fixtureTensors(t, dir)
		if tensors != nil {
			ts = tensors(ts)
		}
		return writeCheckpoint(t, m, ts)
	}
	setQ := func(k string, v any) func(map[string]any) {
		return func(m map[string]any) { m["quantization_config"].(map[string]any)[k] = v }
	}
	drop := func(name string) func([]*Tensor) []*Tensor {
		return func(ts []*Tensor) []*Tensor {
			return slices.DeleteFunc(ts, func(x *Tensor) bool { return x.Name == name })
		}
	}
	reshape := func(name string, shape []int) func([]*Tensor) []*Tensor {
		return func(ts []*Tensor) []*Tensor {
			for _, x := range ts {
				if x.Name == name {
					x.Shape = shape
				}
			}
			return ts
		}
	}
	ctGroup := func(f func(g map[string]any)) func(map[string]any) {
		return func(m map[string]any) {
			f(m["quantization_config"].(map[string]any)["config_groups"].(map[string]any)["group_0"].(map[string]any))
		}
	}
	cases := []struct {
		name string
		dir  string
		want string
	}{
		{"gptq", edit(fp8Dir, setQ("quant_method", "gptq"), nil), `quant_method: "gptq" is not supported`},
		{"awq", edit(fp8Dir, setQ("quant_method", "awq"), nil), `quant_method: "awq" is not supported`},
		{"bitsandbytes", edit(fp8Dir, setQ("quant_method", "bitsandbytes"), nil), `quant_method: "bitsandbytes" is not supported`},
		{"no method", edit(fp8Dir, func(m map[string]any) { delete(m["quantization_config"].(map[string]any), "quant_method") }, nil), "quant_method: missing"},
		{"block size", edit(fp8Dir, setQ("weight_block_size", []int{128}), nil), "weight_block_size: [128] is not two sizes"},
		{"activation scheme", edit(fp8Dir, setQ("activation_scheme", "smooth"), nil), `activation_scheme: "smooth"`},
		{"e5m2", edit(fp8Dir, setQ("fmt", "e5m2"), nil), `fmt: "e5m2" is not supported`},
		{"missing scale", edit(fp8Dir, nil, drop("model.layers.1.mlp.down_proj.weight_scale_inv")),
			"tensor model.layers.1.mlp.down_proj.weight: dtype F8_E4M3 without its scales: tensor model.layers.1.mlp.down_proj.weight_scale_inv"},
		{"scale shape", edit(fp8Dir, nil, reshape("model.layers.0.self_attn.k_proj.weight_scale_inv", []int{2, 1})),
			"tensor model.layers.0.self_attn.k_proj.weight_scale_inv: shape [2 1] does not hold the scales of model.layers.0.self_attn.k_proj.weight [128 256]"},
		{"block changed", edit(fp8Dir, setQ("weight_block_size", []int{64, 64}), nil),
			"weight_scale_inv: shape [2 2] does not hold the scales"},
		{"no quantization_config", edit(fp8Dir, func(m map[string]any) { delete(m, "quantization_config") }, nil),
			"dtype F8_E4M3, but config.json has no quantization_config"},
		{"ct pack-quantized", edit(fp8ctDir, setQ("format", "pack-quantized"), nil), `format: "pack-quantized" is not supported`},
		{"ct int8", edit(fp8ctDir, ctGroup(func(g map[string]any) { g["weights"].(map[string]any)["type"] = "int" }), nil),
			"config_groups.group_0.weights: 8-bit int is not supported"},
		{"ct group strategy", edit(fp8ctDir, ctGroup(func(g map[string]any) { g["weights"].(map[string]any)["strategy"] = "group" }), nil),
			`weights.strategy: "group" is not supported`},
		{"ct channel scale", edit(fp8ctDir, nil, reshape("model.layers.0.mlp.up_proj.weight_scale", []int{1, 384})),
			"tensor model.layers.0.mlp.up_proj.weight_scale: shape [1 384] does not hold the scales"},
		{"ct missing scale", edit(fp8ctDir, nil, drop("model.layers.0.self_attn.o_proj.weight_scale")),
			"model.layers.0.self_attn.o_proj.weight_scale"},
		{"e5m2 tensor", edit(fp8Dir, nil, func(ts []*Tensor) []*Tensor {
			for _, x := range ts {
				if x.Name == "model.layers.0.self_attn.q_proj.weight" {
					x.DType = "F8_E5M2"
				}
			}
			return ts
		}), "tensor model.layers.0.self_attn.q_proj.weight: dtype F8_E5M2, expected F32, F16 or BF16 (or F8_E4M3 with its scales)"},
		{"zero scale", edit(fp8Dir, nil, func(ts []*Tensor) []*Tensor {
			for _, x := range ts {
				if x.Name == "model.layers.0.self_attn.q_proj.weight_scale_inv" {
					x.Data = make([]byte, len(x.Data))
				}
			}
			return ts
		}), "q_proj.weight_scale_inv: scale 0 is 0, not positive and finite"},
	}
	for _, c := range cases {
		_, err := LoadFloat32(c.dir)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// TestCompressedTensorsPerTensorScales: a per-tensor scheme (a [1] scale, as RedHatAI's
// FP8-dynamic releases of older compressed-tensors wrote) dequantizes with the one scale.
func TestCompressedTensorsPerTensorScales(t *testing.T) {
	m := fixtureConfig(t, fp8ctDir)
	g := m["quantization_config"].(map[string]any)["config_groups"].(map[string]any)["group_0"].(map[string]any)
	g["weights"].(map[string]any)["strategy"] = "tensor"
	ts := fixtureTensors(t, fp8ctDir)
	for i, x := range ts {
		if strings.HasSuffix(x.Name, "weight_scale") {
			st, err := NewFloatTensor(x.Name, "BF16", []int{1}, []float32{0.5})
			if err != nil {
				t.Fatal(err)
			}
			ts[i] = st
		}
	}
	f, err := LoadFloat32(writeCheckpoint(t, m, ts))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := Open(fp8ctDir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	q, err := ck.Tensor("model.layers.1.self_attn.o_proj.weight")
	if err != nil {
		t.Fatal(err)
	}
	got := f.Layers[1][RoleOut]
	for i, b := range q.Data {
		if want := E4M3ToFloat32(b) * 0.5; got[i] != want {
			t.Fatalf("o_proj [%d] = %g, want %g", i, got[i], want)
		}
	}
}

// TestQuantizeFP8 quantizes a float checkpoint's projections with a scale a row: each
// weight within half an e4m3 step (2^-4 relative, and the row's smallest step) of the
// original, the embeddings and the LM head untouched.
func TestQuantizeFP8(t *testing.T) {
	ck, err := Open(fp8Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	orig, err := ck.Float32Weights()
	if err != nil {
		t.Fatal(err)
	}
	// Float weights first: the fixture's, dequantized, as a float checkpoint would hold.
	ws, err := ck.Weights()
	if err != nil {
		t.Fatal(err)
	}
	for i := range ws {
		v, err := ws[i].Float32()
		if err != nil {
			t.Fatal(err)
		}
		ft, err := NewFloatTensor(ws[i].String(), "F32", []int{ws[i].Rows, ws[i].Cols}, v)
		if err != nil {
			t.Fatal(err)
		}
		ws[i].Parts = []Part{{Tensor: ft, Rows: ws[i].Rows}}
	}
	qs, err := QuantizeFP8(ws)
	if err != nil {
		t.Fatal(err)
	}
	q, err := NewFloat32(ck.Config, qs)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range qs {
		if w.FP8() != fp8Role(w.Role) {
			t.Fatalf("%s: FP8 %v", &w, w.FP8())
		}
		if !w.FP8() {
			continue
		}
		p := w.Parts[0]
		if !slices.Equal(p.Scale.Shape, []int{w.Rows, 1}) || p.BlockRows != 1 || p.BlockCols != w.Cols {
			t.Fatalf("%s: scales %v", &w, p.Scale.Shape)
		}
		a, b := orig.Layers[w.Layer][w.Role], q.Layers[w.Layer][w.Role]
		sv, _ := p.Scale.Float32()
		for k := range a {
			s := sv[k/w.Cols]
			if d := math.Abs(float64(a[k] - b[k])); d > math.Max(math.Abs(float64(a[k]))/16, float64(s)/512)*1.0001 {
				t.Fatalf("%s (weight %d) [%d]: %g quantized to %g", &w, i, k, a[k], b[k])
			}
		}
	}
	if !slices.Equal(orig.Model[RoleEmbed], q.Model[RoleEmbed]) || !slices.Equal(orig.Model[RoleLMHead], q.Model[RoleLMHead]) {
		t.Error("embeddings or LM head changed")
	}
}

// TestDequantizeFP8 gives float parts with the values Float32 computes from the FP8 ones.
func TestDequantizeFP8(t *testing.T) {
	ck, err := Open(fp8ctDir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ws, err := ck.Weights()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := DequantizeFP8(ws)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ds {
		if ds[i].FP8() || ws[i].FP8() != (ws[i].Role == RoleQKV || ws[i].Role == RoleOut || ws[i].Role == RoleUp || ws[i].Role == RoleDown) {
			t.Fatalf("%s: FP8 left", &ds[i])
		}
		a, err := ws[i].Float32()
		if err != nil {
			t.Fatal(err)
		}
		b, err := ds[i].Float32()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) {
			t.Fatalf("%s: dequantized values differ", &ds[i])
		}
	}
}

// TestLoadFloat32FP8 loads a float checkpoint as `quantization: fp8` serves it: the
// projections on the FP8 grid of their blocks, the rest as stored.
func TestLoadFloat32FP8(t *testing.T) {
	a, err := LoadFloat32("../testdata/llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadFloat32FP8("../testdata/llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	for l := range a.Layers {
		for r := range NumRoles {
			x, y := a.Layers[l][r], b.Layers[l][r]
			if fp8Role(r) && x != nil {
				if slices.Equal(x, y) {
					t.Errorf("layer %d %s: not quantized", l, r)
				}
				for k := range x {
					if d := math.Abs(float64(x[k] - y[k])); d > math.Abs(float64(x[k]))/16+1e-3 {
						t.Fatalf("layer %d %s [%d]: %g became %g", l, r, k, x[k], y[k])
					}
				}
			} else if !slices.Equal(x, y) {
				t.Errorf("layer %d %s changed", l, r)
			}
		}
	}
}

// TestFloat32ToE4M3Nearest compares the encoder with a search of every code for the
// nearest (ties to the even code) over random magnitudes of every binade and the
// midpoints between neighbouring codes.
func TestFloat32ToE4M3Nearest(t *testing.T) {
	nearest := func(f float32) uint8 {
		best := uint8(0)
		for b := uint8(1); b <= 0x7e; b++ {
			d, e := math.Abs(float64(E4M3ToFloat32(b)-f)), math.Abs(float64(E4M3ToFloat32(best)-f))
			if d < e || (d == e && b&1 == 0) {
				best = b
			}
		}
		return best
	}
	var vals []float32
	for b := uint8(0); b < 0x7e; b++ {
		lo, hi := E4M3ToFloat32(b), E4M3ToFloat32(b+1)
		vals = append(vals, (lo+hi)/2, lo+(hi-lo)*0.49, lo+(hi-lo)*0.51)
	}
	x := uint32(12345)
	for range 20000 {
		x = x*1664525 + 1013904223
		vals = append(vals, float32(math.Ldexp(float64(x>>8)/(1<<24), int(x%20)-12)))
	}
	for _, v := range vals {
		if v >= 448 {
			continue
		}
		if got, want := Float32ToE4M3(v), nearest(v); got != want {
			t.Fatalf("Float32ToE4M3(%g) = %#x (%g), nearest %#x (%g)", v, got, E4M3ToFloat32(got), want, E4M3ToFloat32(want))
		}
		if got := Float32ToE4M3(-v); v != 0 && got != nearest(v)|0x80 {
			t.Fatalf("Float32ToE4M3(%g) = %#x", -v, got)
		}
	}
}

package model

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

const (
	tinyDir    = "../testdata/gpt2-tiny"
	shardedDir = "../testdata/gpt2-tiny-sharded"
)

// tinyTensors returns copies of the tiny checkpoint's tensors, in name order.
func tinyTensors(t *testing.T) []*Tensor {
	t.Helper()
	return fixtureTensors(t, tinyDir)
}

// fixtureTensors returns copies of a checkpoint folder's tensors, in name order.
func fixtureTensors(t *testing.T, dir string) []*Tensor {
	t.Helper()
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out []*Tensor
	for _, name := range c.Names() {
		src, _ := c.Tensor(name)
		out = append(out, &Tensor{Name: src.Name, DType: src.DType, Shape: slices.Clone(src.Shape), Data: slices.Clone(src.Data)})
	}
	return out
}

// tinyConfig returns the tiny checkpoint's config.json as a map to edit.
func tinyConfig(t *testing.T) map[string]any {
	t.Helper()
	return fixtureConfig(t, tinyDir)
}

// fixtureConfig returns a checkpoint folder's config.json as a map to edit.
func fixtureConfig(t *testing.T, dir string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// writeCheckpoint writes config and tensors as a checkpoint folder under t.TempDir().
func writeCheckpoint(t *testing.T, config map[string]any, tensors []*Tensor) string {
	t.Helper()
	dir := t.TempDir()
	raw, err := json.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteSafetensors(filepath.Join(dir, "model.safetensors"), tensors, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// convert re-encodes every float tensor as dtype.
func convert(t *testing.T, tensors []*Tensor, dtype string) []*Tensor {
	t.Helper()
	var out []*Tensor
	for _, src := range tensors {
		v, err := src.Float32()
		if err != nil {
			t.Fatal(err)
		}
		dst, err := NewFloatTensor(src.Name, dtype, src.Shape, v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, dst)
	}
	return out
}

func TestOpenReadsTheConfig(t *testing.T) {
	c, err := Open(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := Config{Family: "gpt2", ModelType: "gpt2", VocabSize: 1000, MaxPositions: 128, Hidden: 64, Layers: 2,
		Heads: 4, KVHeads: 4, HeadDim: 16, Inner: 256, Norm: LayerNorm, NormEps: 1e-5, Positions: LearnedPositions,
		QKVBias: true, OutBias: true, MLPBias: true, Act: ActGeluTanh, TiedHead: true,
		BOSID: 0, EOSIDs: []int32{999}, DType: "float32"}
	if !reflect.DeepEqual(c.Config, want) {
		t.Errorf("config\n got %+v\nwant %+v", c.Config, want)
	}
}

func TestTensorNames(t *testing.T) {
	c, err := Open(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	names := c.Names()
	if len(names) != 4+2*12 || !slices.IsSorted(names) {
		t.Fatalf("Names() = %v, want 28 sorted names", names)
	}
	for _, tc := range []struct{ name, query, want string }{
		{"a name with HF's prefix is found", "transformer.wte.weight", "transformer.wte.weight"},
		{"a name without the prefix is found", "h.1.mlp.c_fc.bias", "transformer.h.1.mlp.c_fc.bias"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tensor, err := c.Tensor(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			if tensor.Name != tc.want {
				t.Errorf("Tensor(%q).Name = %q, want %q", tc.query, tensor.Name, tc.want)
			}
		})
	}
	t.Run("an unknown name fails with ErrTensorNotFound", func(t *testing.T) {
		_, err := c.Tensor("h.7.ln_1.weight")
		if err == nil || !strings.Contains(err.Error(), "h.7.ln_1.weight") {
			t.Fatalf("err = %v, want one naming h.7.ln_1.weight", err)
		}
	})
}

func TestShardedAndSingleFileHoldTheSameWeights(t *testing.T) {
	single, err := LoadFloat32(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	sharded, err := LoadFloat32(shardedDir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(single, sharded) {
		t.Fatal("the sharded checkpoint's weights differ from the single file's")
	}
	// Spot-check that real data arrived: the fixture's LayerNorm scales are 1 ± 0.1·N(0,1).
	var sum float64
	ln2 := single.Layers[1][RoleMLPNorm]
	for _, v := range ln2 {
		sum += float64(v)
	}
	if mean := sum / float64(len(ln2)); math.Abs(mean-1) > 0.1 {
		t.Errorf("mean of h.1.ln_2.weight = %g, want about 1", mean)
	}
	if len(single.Model[RoleEmbed]) != 1000*64 || len(single.Layers[0][RoleUp]) != 64*256 {
		t.Errorf("sizes: wte %d, h.0.mlp.c_fc.weight %d", len(single.Model[RoleEmbed]), len(single.Layers[0][RoleUp]))
	}
}

func TestHalfPrecisionCheckpointsLoad(t *testing.T) {
	want, err := LoadFloat32(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dtype, configDType string
		// relTol is the format's unit roundoff: 2^-11 for float16, 2^-8 for bfloat16.
		relTol float64
	}{
		{"a float16 copy loads within float16 rounding", "F16", "float16", 1.0 / 2048},
		{"a bfloat16 copy loads within bfloat16 rounding", "BF16", "bfloat16", 1.0 / 256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tinyConfig(t)
			cfg["dtype"] = tc.configDType
			dir := writeCheckpoint(t, cfg, convert(t, tinyTensors(t), tc.dtype))
			c, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.Config.DType != tc.configDType {
				t.Errorf("Config.DType = %q, want %q", c.Config.DType, tc.configDType)
			}
			got, err := c.Float32Weights()
			if err != nil {
				t.Fatal(err)
			}
			check := func(name string, got, want []float32) {
				if len(got) != len(want) {
					t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
				}
				inexact := 0
				for i := range got {
					// 2^-25 covers float16's subnormal spacing near zero.
					diff := math.Abs(float64(got[i]) - float64(want[i]))
					if diff > tc.relTol*math.Abs(float64(want[i]))+math.Ldexp(1, -25) {
						t.Fatalf("%s[%d] = %g, want %g within %g relative", name, i, got[i], want[i], tc.relTol)
					}
					if diff != 0 {
						inexact++
					}
				}
				if inexact == 0 {
					t.Errorf("%s: no value was rounded; the conversion did not happen", name)
				}
			}
			check("wte.weight", got.Model[RoleEmbed], want.Model[RoleEmbed])
			check("h.1.attn.c_attn.weight", got.Layers[1][RoleQKV], want.Layers[1][RoleQKV])
			check("ln_f.bias", got.Model[RoleFinalNormBias], want.Model[RoleFinalNormBias])
		})
	}
}

func TestBrokenCheckpointsFail(t *testing.T) {
	// without drops the named tensor.
	without := func(name string) func([]*Tensor) []*Tensor {
		return func(ts []*Tensor) []*Tensor {
			return slices.DeleteFunc(ts, func(x *Tensor) bool { return x.Name == name })
		}
	}
	// replace swaps the named tensor for a zero tensor of another dtype or shape.
	replace := func(name, dtype string, shape []int) func([]*Tensor) []*Tensor {
		return func(ts []*Tensor) []*Tensor {
			for i, x := range ts {
				if x.Name == name {
					n := 1
					for _, d := range shape {
						n *= d
					}
					ts[i] = &Tensor{Name: name, DType: dtype, Shape: shape, Data: make([]byte, n*dtypeSizes[dtype])}
				}
			}
			return ts
		}
	}
	// setConfig sets (or with nil, deletes) a config field.
	setConfig := func(field string, v any) func(map[string]any) {
		return func(m map[string]any) {
			if v == nil {
				delete(m, field)
			} else {
				m[field] = v
			}
		}
	}
	// rewriteFile changes model.safetensors after it is written.
	rewriteFile := func(f func([]byte) []byte) func(string) {
		return func(dir string) {
			path := filepath.Join(dir, "model.safetensors")
			raw, err := os.ReadFile(path)
			if err != nil {
				panic(err)
			}
			if err := os.WriteFile(path, f(raw), 0o644); err != nil {
				panic(err)
			}
		}
	}
	// withHeader replaces the file's header by h, keeping the data.
	withHeader := func(h string) func([]byte) []byte {
		return func(raw []byte) []byte {
			n := binary.LittleEndian.Uint64(raw)
			out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
			return append(append(out, h...), raw[8+n:]...)
		}
	}
	for _, tc := range []struct {
		name    string
		tensors func([]*Tensor) []*Tensor
		config  func(map[string]any)
		file    func(dir string)
		want    []string
	}{
		{name: "a missing tensor is named",
			tensors: without("transformer.h.1.mlp.c_fc.bias"),
			want:    []string{"h.1.mlp.c_fc.bias", "not found"}},
		{name: "a wrong shape names the tensor, the expected and the actual shape",
			tensors: replace("transformer.h.0.attn.c_attn.weight", "F32", []int{64, 128}),
			want:    []string{"transformer.h.0.attn.c_attn.weight", "[64 128]", "expected [64 192]"}},
		{name: "a transposed matrix is a wrong shape",
			tensors: replace("transformer.h.1.mlp.c_proj.weight", "F32", []int{64, 256}),
			want:    []string{"transformer.h.1.mlp.c_proj.weight", "[64 256]", "expected [256 64]"}},
		{name: "a non-float dtype names the tensor and the accepted dtypes",
			tensors: replace("transformer.ln_f.weight", "I32", []int{64}),
			want:    []string{"transformer.ln_f.weight", "dtype I32", "expected F32, F16 or BF16"}},
		{name: "an untied head without lm_head.weight names it",
			config: setConfig("tie_word_embeddings", false),
			want:   []string{"lm_head.weight", "not found"}},
		{name: "more layers in the config than in the files name the field and the layers present",
			config: setConfig("n_layer", 1000),
			want:   []string{"field n_layer", "1000", "h.0 … h.1 (2 layers)"}},
		{name: "a layer count beyond any model is refused before any allocation",
			config: setConfig("n_layer", 100000000),
			want:   []string{"field n_layer", "100000000 is outside [1, 1024]"}},
		{name: "fewer layers in the config than in the files are refused",
			config: setConfig("n_layer", 1),
			want:   []string{"field n_layer", "1,", "(2 layers)"}},
		{name: "an absurd vocabulary is refused before any allocation",
			config: setConfig("vocab_size", 1<<40),
			want:   []string{"field vocab_size", "outside [1, 4194304]"}},
		{name: "an unsupported GPT-2 option is named",
			config: setConfig("scale_attn_by_inverse_layer_idx", true),
			want:   []string{"field scale_attn_by_inverse_layer_idx", "not supported"}},
		{name: "a truncated file is caught by the header check",
			file: rewriteFile(func(raw []byte) []byte { return raw[:len(raw)-100] }),
			want: []string{"model.safetensors", "outside the", "truncated"}},
		{name: "a file shorter than its header length is caught",
			file: rewriteFile(func(raw []byte) []byte { return raw[:40] }),
			want: []string{"model.safetensors", "header length"}},
		{name: "an empty file is caught",
			file: rewriteFile(func(raw []byte) []byte { return nil }),
			want: []string{"model.safetensors", "too short"}},
		{name: "a header that is not JSON is caught",
			file: rewriteFile(withHeader(`{"wte.weight": {"dtype": "F32",`)),
			want: []string{"model.safetensors", "not valid JSON"}},
		{name: "a size that disagrees with the shape is caught",
			file: rewriteFile(withHeader(`{"wte.weight": {"dtype": "F32", "shape": [10, 10], "data_offsets": [0, 399]}}`)),
			want: []string{"wte.weight", "span 399 bytes", "needs 400"}},
		{name: "an unknown dtype is caught",
			file: rewriteFile(withHeader(`{"wte.weight": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}`)),
			want: []string{"wte.weight", `unknown dtype "F33"`}},
		{name: "overlapping tensors are caught",
			file: rewriteFile(withHeader(`{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}`)),
			want: []string{"overlap"}},
		{name: "a missing config field is named",
			config: setConfig("n_embd", nil),
			want:   []string{"config.json", "field n_embd", "missing"}},
		{name: "a config field of the wrong type is named",
			config: setConfig("n_head", "four"),
			want:   []string{"field n_head", "positive integer"}},
		{name: "an unsupported model_type is named",
			config: setConfig("model_type", "bert"),
			want:   []string{"field model_type", `"bert" is not supported`, "gpt2, llama, mistral, mixtral, phi3, qwen2, qwen2_moe"}},
		{name: "a missing model_type with an unknown architecture is named",
			config: func(m map[string]any) { delete(m, "model_type"); m["architectures"] = []string{"BertModel"} },
			want:   []string{"field architectures", "BertModel"}},
		{name: "an unsupported activation is named",
			config: setConfig("activation_function", "tanh"),
			want:   []string{"field activation_function", "tanh"}},
		{name: "heads that do not divide the width are named",
			config: setConfig("n_head", 5),
			want:   []string{"field n_embd", "multiple of n_head"}},
		{name: "an end token outside the vocabulary is named",
			config: setConfig("eos_token_id", 1000),
			want:   []string{"field eos_token_id", "vocab_size"}},
		{name: "an unknown dtype in the config is named",
			config: setConfig("dtype", "int8"),
			want:   []string{"field torch_dtype", "int8"}},
		{name: "a config that disagrees with the weights names the tensor",
			config: setConfig("n_positions", 256),
			want:   []string{"transformer.wpe.weight", "[128 64]", "expected [256 64]"}},
		{name: "a folder without weights is named",
			file: func(dir string) { os.Remove(filepath.Join(dir, "model.safetensors")) },
			want: []string{"neither model.safetensors nor model.safetensors.index.json"}},
		{name: "a folder without config.json fails",
			file: func(dir string) { os.Remove(filepath.Join(dir, "config.json")) },
			want: []string{"config.json", "no such file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tensors := tinyTensors(t)
			if tc.tensors != nil {
				tensors = tc.tensors(tensors)
			}
			cfg := tinyConfig(t)
			if tc.config != nil {
				tc.config(cfg)
			}
			dir := writeCheckpoint(t, cfg, tensors)
			if tc.file != nil {
				tc.file(dir)
			}
			_, err := LoadFloat32(dir)
			if err == nil {
				t.Fatal("loaded without error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestBrokenShardIndexesFail(t *testing.T) {
	for _, tc := range []struct {
		name  string
		index string
		want  []string
	}{
		{"a shard outside the folder is refused",
			`{"weight_map": {"transformer.wte.weight": "../gpt2-tiny/model.safetensors"}}`,
			[]string{"weight_map[transformer.wte.weight]", "not a file name"}},
		{"a tensor in the wrong shard is named",
			`{"weight_map": {"transformer.wte.weight": "model-00002-of-00004.safetensors", "transformer.h.0.ln_1.weight": "model-00002-of-00004.safetensors"}}`,
			[]string{"tensor transformer.wte.weight", "model-00002-of-00004.safetensors"}},
		{"an index without weight_map is refused",
			`{"metadata": {}}`,
			[]string{"weight_map is missing"}},
		{"an index that is not JSON is refused",
			`{"weight_map": `,
			[]string{"model.safetensors.index.json", "invalid JSON"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			entries, err := os.ReadDir(shardedDir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				raw, err := os.ReadFile(filepath.Join(shardedDir, e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				if e.Name() == "model.safetensors.index.json" {
					raw = []byte(tc.index)
				}
				if err := os.WriteFile(filepath.Join(dir, e.Name()), raw, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err = LoadFloat32(dir)
			if err == nil {
				t.Fatal("loaded without error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLMHead(t *testing.T) {
	// withHead adds an lm_head.weight holding scale × the embedding.
	withHead := func(scale float32) []*Tensor {
		tensors := tinyTensors(t)
		for _, x := range tensors {
			if x.Name == "transformer.wte.weight" {
				v, err := x.Float32()
				if err != nil {
					t.Fatal(err)
				}
				for i := range v {
					v[i] *= scale
				}
				head, err := NewFloatTensor("lm_head.weight", x.DType, x.Shape, v)
				if err != nil {
					t.Fatal(err)
				}
				return append(tensors, head)
			}
		}
		t.Fatal("no embedding")
		return nil
	}
	t.Run("a tied head is the embedding, whatever lm_head.weight holds", func(t *testing.T) {
		m, err := LoadFloat32(writeCheckpoint(t, tinyConfig(t), withHead(2)))
		if err != nil {
			t.Fatal(err)
		}
		if m.Model[RoleLMHead] != nil || &m.LMHead()[0] != &m.Model[RoleEmbed][0] {
			t.Error("a tied model loaded a separate head")
		}
	})
	t.Run("an untied head is read from lm_head.weight", func(t *testing.T) {
		cfg := tinyConfig(t)
		cfg["tie_word_embeddings"] = false
		m, err := LoadFloat32(writeCheckpoint(t, cfg, withHead(2)))
		if err != nil {
			t.Fatal(err)
		}
		head, embed := m.LMHead(), m.Model[RoleEmbed]
		if len(head) != len(embed) || head[5] != 2*embed[5] || head[len(head)-1] != 2*embed[len(embed)-1] {
			t.Error("the untied head is not lm_head.weight")
		}
	})
}

func TestGoldenIntegersRead(t *testing.T) {
	st, err := openSafetensors("../testdata/gpt2-tiny-golden.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	ids, err := st.tensors["prompt_ids"].Int32()
	if err != nil {
		t.Fatal(err)
	}
	if want := []int32{17, 401, 3, 998, 250, 250, 12, 77, 640, 5, 31, 900}; !slices.Equal(ids, want) {
		t.Errorf("prompt_ids = %v, want %v", ids, want)
	}
	if _, err := st.tensors["prompt_logits"].Int32(); err == nil || !strings.Contains(err.Error(), "prompt_logits") {
		t.Errorf("Int32 of a float tensor: err = %v, want one naming prompt_logits", err)
	}
	wide := &Tensor{Name: "ids64", DType: "I64", Shape: []int{2}, Data: binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 7), 1<<40)}
	if _, err := wide.Int32(); err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Errorf("Int32 of an I64 beyond int32: err = %v", err)
	}
}

func TestHalfConversions(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   float32
		want uint16
	}{
		{"one is exact", 1, 0x3c00},
		{"negative two is exact", -2, 0xc000},
		{"the largest half is exact", 65504, 0x7bff},
		{"beyond the range becomes infinity", 65520, 0x7c00},
		{"the smallest subnormal is exact", float32(math.Ldexp(1, -24)), 0x0001},
		{"half the smallest subnormal rounds to even zero", float32(math.Ldexp(1, -25)), 0x0000},
		{"one and a half subnormal steps round to even two", float32(math.Ldexp(3, -25)), 0x0002},
		{"a tie between normals rounds to even", 1 + float32(math.Ldexp(1, -11)), 0x3c00},
		{"a tie above an odd mantissa rounds up to even", 1 + float32(math.Ldexp(3, -11)), 0x3c02},
		{"just above a tie rounds up", 1 + float32(math.Ldexp(1, -11)+math.Ldexp(1, -20)), 0x3c01},
		{"NaN stays NaN", float32(math.NaN()), 0x7e00},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Float32ToF16(tc.in); got != tc.want {
				t.Errorf("Float32ToF16(%g) = %#04x, want %#04x", tc.in, got, tc.want)
			}
		})
	}
	t.Run("every half value survives a round trip through float32", func(t *testing.T) {
		for h := range 1 << 16 {
			f := F16ToFloat32(uint16(h))
			if f != f {
				continue // NaN payloads are not kept
			}
			if back := Float32ToF16(f); back != uint16(h) {
				t.Fatalf("%#04x → %g → %#04x", h, f, back)
			}
		}
	})
	t.Run("bfloat16 rounds to nearest even", func(t *testing.T) {
		for _, tc := range []struct {
			in   float32
			want uint16
		}{{1, 0x3f80}, {1 + float32(math.Ldexp(1, -8)), 0x3f80}, {1 + float32(math.Ldexp(3, -8)), 0x3f82}, {-0.5, 0xbf00}} {
			if got := Float32ToBF16(tc.in); got != tc.want {
				t.Errorf("Float32ToBF16(%g) = %#04x, want %#04x", tc.in, got, tc.want)
			}
		}
	})
}

func TestWriteSafetensorsRefusesBadTensors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.safetensors")
	for _, tc := range []struct {
		name    string
		tensors []*Tensor
		want    string
	}{
		{"data that disagrees with the shape is refused", []*Tensor{{Name: "a", DType: "F32", Shape: []int{3}, Data: make([]byte, 8)}}, "tensor a: 8 bytes"},
		{"an unknown dtype is refused", []*Tensor{{Name: "a", DType: "F12", Shape: []int{1}, Data: make([]byte, 2)}}, `unknown dtype "F12"`},
		{"a repeated name is refused", []*Tensor{{Name: "a", DType: "U8", Data: []byte{1}}, {Name: "a", DType: "U8", Data: []byte{1}}}, "tensor a appears twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := WriteSafetensors(path, tc.tensors, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if _, err := os.Stat(path); err == nil {
				t.Error("a file was left behind")
			}
		})
	}
	t.Run("a written file reads back with its metadata", func(t *testing.T) {
		in := []*Tensor{{Name: "s", DType: "I32", Data: []byte{1, 0, 0, 0}}, {Name: "v", DType: "U8", Shape: []int{3}, Data: []byte{1, 2, 3}}}
		if err := WriteSafetensors(path, in, map[string]string{"k": "v"}); err != nil {
			t.Fatal(err)
		}
		st, err := openSafetensors(path)
		if err != nil {
			t.Fatal(err)
		}
		defer st.close()
		if st.metadata["k"] != "v" || len(st.tensors) != 2 || !slices.Equal(st.tensors["v"].Data, []byte{1, 2, 3}) || len(st.tensors["s"].Shape) != 0 {
			t.Errorf("read back %+v, %+v", st.metadata, st.tensors)
		}
	})
}

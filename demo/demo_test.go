package demo

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gollm/model"
	"gollm/tokenizer"
)

func TestTokenizerIsGPT2s(t *testing.T) {
	raw, err := GPT2TokenizerJSON()
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Model struct {
			Vocab  map[string]int `json:"vocab"`
			Merges []string       `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Model.Vocab) != VocabSize || len(f.Model.Merges) != 50000 {
		t.Fatalf("%d tokens and %d merges, want 50257 and 50000", len(f.Model.Vocab), len(f.Model.Merges))
	}
	for _, tc := range []struct {
		token string
		id    int
	}{{"!", 0}, {"Ġthe", 262}, {"Hello", 15496}, {"Ġworld", 995}, {",", 11}, {"<|endoftext|>", 50256}} {
		if got, ok := f.Model.Vocab[tc.token]; !ok || got != tc.id {
			t.Errorf("vocab[%q] = %d, %v; want %d", tc.token, got, ok, tc.id)
		}
	}
	// The opening of GPT-2's published merges.txt.
	if want := []string{"Ġ t", "Ġ a", "h e", "i n", "r e", "o n", "Ġt he", "e r"}; !slices.Equal(f.Model.Merges[:8], want) {
		t.Errorf("merges start %q, want %q", f.Model.Merges[:8], want)
	}

	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := WriteGPT2Tokenizer(path); err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, text string
		want       []int32
	}{
		{"a greeting encodes to GPT-2's ids", "Hello, world!", []int32{15496, 11, 995, 0}},
		{"the end-of-text token is recognised", "Hi<|endoftext|>", []int32{17250, 50256}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tk.Encode(tc.text); !slices.Equal(got, tc.want) {
				t.Errorf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
			}
		})
	}
	if tk.VocabSize() != VocabSize {
		t.Errorf("VocabSize() = %d", tk.VocabSize())
	}
}

func TestWriteGPT2Checkpoint(t *testing.T) {
	small := Options{Layers: 2, Hidden: 64, Heads: 4, Positions: 64, Seed: 7}
	for _, tc := range []struct {
		name, dtype, stDType string
	}{
		{"a float16 checkpoint loads", "", "F16"},
		{"a float32 checkpoint loads", "float32", "F32"},
		{"a bfloat16 checkpoint loads", "bfloat16", "BF16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := small
			o.DType = tc.dtype
			dir := t.TempDir()
			if err := WriteGPT2Checkpoint(dir, o); err != nil {
				t.Fatal(err)
			}
			c, err := model.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			wantDType := map[string]string{"F16": "float16", "F32": "float32", "BF16": "bfloat16"}[tc.stDType]
			want := model.Config{Family: "gpt2", ModelType: "gpt2", VocabSize: 50257, MaxPositions: 64, Hidden: 64,
				Layers: 2, Heads: 4, KVHeads: 4, HeadDim: 16, Inner: 256, Norm: model.LayerNorm, NormEps: 1e-5,
				Positions: model.LearnedPositions, QKVBias: true, OutBias: true, MLPBias: true, Act: model.ActGeluTanh,
				TiedHead: true, BOSID: 50256, EOSIDs: []int32{50256}, DType: wantDType}
			if !reflect.DeepEqual(c.Config, want) {
				t.Errorf("config\n got %+v\nwant %+v", c.Config, want)
			}
			for _, name := range c.Names() {
				if tensor, _ := c.Tensor(name); tensor.DType != tc.stDType {
					t.Errorf("%s is %s, want %s", name, tensor.DType, tc.stDType)
				}
			}
			m, err := c.Float32Weights()
			if err != nil {
				t.Fatal(err)
			}
			checkSpread := func(name string, v []float32, mean, std float64) {
				var s, s2 float64
				for _, x := range v {
					s += float64(x)
					s2 += float64(x) * float64(x)
				}
				n := float64(len(v))
				gotMean := s / n
				gotStd := math.Sqrt(s2/n - gotMean*gotMean)
				if math.Abs(gotMean-mean) > 0.02+std*5/math.Sqrt(n) || math.Abs(gotStd-std) > 0.1*std {
					t.Errorf("%s: mean %.3f std %.3f, want about %.3f and %.3f", name, gotMean, gotStd, mean, std)
				}
			}
			checkSpread("wte", m.Model[model.RoleEmbed], 0, 0.3)
			checkSpread("h.1.mlp.c_fc.weight", m.Layers[1][model.RoleUp], 0, 0.3)
			checkSpread("h.0.ln_1.weight", m.Layers[0][model.RoleAttnNorm], 1, 0.1)
			checkSpread("ln_f.bias", m.Model[model.RoleFinalNormBias], 0, 0.1)
			if _, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json")); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, "tokenizer_config.json")); err != nil {
				t.Errorf("no tokenizer_config.json: %v", err)
			}
		})
	}
	t.Run("the same seed writes the same file and another seed a different one", func(t *testing.T) {
		read := func(o Options) []byte {
			dir := t.TempDir()
			if err := WriteGPT2Checkpoint(dir, o); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			return raw
		}
		a, b := read(small), read(small)
		other := small
		other.Seed++
		c := read(other)
		if !bytes.Equal(a, b) {
			t.Error("two runs with one seed differ")
		}
		if bytes.Equal(a, c) {
			t.Error("two seeds wrote the same weights")
		}
	})
	t.Run("progress reaches the parameter count", func(t *testing.T) {
		o := small
		var last, total int
		o.Progress = func(d, n int) { last, total = d, n }
		if err := WriteGPT2Checkpoint(t.TempDir(), o); err != nil {
			t.Fatal(err)
		}
		o, _ = o.WithDefaults()
		// wte + wpe + 2 blocks of 12·h² + 13·h + ln_f.
		want := 50257*64 + 64*64 + 2*(12*64*64+13*64) + 2*64
		if last != want || total != want || o.NumParameters() != want {
			t.Errorf("progress %d of %d, NumParameters %d, want %d", last, total, o.NumParameters(), want)
		}
	})
}

func TestBadOptionsFail(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"heads that do not divide the width are refused", Options{Hidden: 100, Heads: 3}, "not a multiple of heads 3"},
		{"an unknown dtype is refused", Options{DType: "int8"}, `dtype "int8"`},
		{"a negative size is refused", Options{Layers: -1}, "must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkRefused(t, func(dir string) error { return WriteGPT2Checkpoint(dir, tc.o) }, tc.want)
		})
	}
}

// checkRefused calls write on a folder not yet made: it must fail with an error
// containing want, and leave no folder behind.
func checkRefused(t *testing.T, write func(dir string) error, want string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "out")
	err := write(dir)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want one containing %q", err, want)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("the folder was created anyway")
	}
}

func TestDefaultsAreTheDocumentedShape(t *testing.T) {
	o, err := Options{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if want := (Options{Layers: 4, Hidden: 256, Heads: 4, Positions: 1024, DType: "float16", Seed: 0}); o.Layers != want.Layers ||
		o.Hidden != want.Hidden || o.Heads != want.Heads || o.Positions != want.Positions || o.DType != want.DType {
		t.Errorf("defaults %+v, want %+v", o, want)
	}
}

// TestTokenizerConfigHasChatTemplate checks the demo's tokenizer_config.json: GPT-2's
// special token as eos, and the ChatML template rendering a conversation.
func TestTokenizerConfigHasChatTemplate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokenizer_config.json")
	if err := WriteTokenizerConfig(path); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg["eos_token"] != "<|endoftext|>" || cfg["chat_template"] != ChatTemplate {
		t.Errorf("tokenizer_config.json = %s", raw)
	}
	if !strings.Contains(ChatTemplate, "'\n'") {
		t.Errorf("the template's newlines should be real newlines inside Jinja strings, as the published JSON decodes: %q", ChatTemplate)
	}
}

package demo

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"gollm/model"
	"gollm/openai"
	"gollm/tokenizer"
)

func TestWriteLlamaCheckpoint(t *testing.T) {
	o := LlamaOptions{Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, Inner: 128, Positions: 64, Seed: 7, Root: repoRoot(t)}
	dir := t.TempDir()
	if err := WriteLlamaCheckpoint(dir, o); err != nil {
		t.Fatal(err)
	}
	c, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := model.Config{Family: "llama", ModelType: "llama", VocabSize: 32000, MaxPositions: 64, Hidden: 64,
		Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Inner: 128, Norm: model.RMSNorm, NormEps: 1e-5,
		Positions: model.RotaryPositions, GatedMLP: true, Act: model.ActSiLU, BOSID: 1, EOSIDs: []int32{2}, DType: "bfloat16"}
	got := c.Config
	got.Rope = model.Rope{} // the loader's own business, tested in model/
	if !reflect.DeepEqual(got, want) {
		t.Errorf("config\n got %+v\nwant %+v", got, want)
	}
	for _, name := range c.Names() {
		if tensor, _ := c.Tensor(name); tensor.DType != "BF16" {
			t.Errorf("%s is %s, want BF16", name, tensor.DType)
		}
	}
	if _, err := c.Float32Weights(); err != nil {
		t.Fatal(err)
	}

	t.Run("the tokenizer is the real one, with BOS on prompts", func(t *testing.T) {
		tk, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
		if err != nil {
			t.Fatal(err)
		}
		// Mistral 7B v0.1's ids, as sentencepiece gives them on its model.
		for text, ids := range map[string][]int32{
			"Hello world": {1, 22557, 1526},
			"🦙":           {1, 28705, 243, 162, 169, 156}, // no piece: "▁" and the emoji's four bytes
			"2026":        {1, 28705, 28750, 28734, 28750, 28784},
		} {
			if got := tk.EncodePrompt(text); !slices.Equal(got, ids) {
				t.Errorf("EncodePrompt(%q) = %v, want %v", text, got, ids)
			}
		}
	})
	t.Run("the chat template renders [INST] turns", func(t *testing.T) {
		raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(raw, []byte(`\u003c`)) {
			t.Errorf("tokenizer_config.json escapes < as \\u003c:\n%s", raw)
		}
		ct, err := openai.ParseChatTemplate(raw)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ct.Render([]openai.TemplateMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"},
			{Role: "assistant", Content: "Hello."}, {Role: "user", Content: "Bye"}}, true)
		if want := "<s>Be brief.\n\n[INST] Hi [/INST]Hello.</s>[INST] Bye [/INST]"; err != nil || got != want {
			t.Errorf("rendered %q, %v; want %q", got, err, want)
		}
	})
	t.Run("the same seed draws the same weights and another seed others", func(t *testing.T) {
		o, _ := o.WithDefaults()
		draw := func(seed uint64) [][]byte {
			tensors, err := drawWeights(llamaWeightSpecs(o), seed, o.DType, nil)
			if err != nil {
				t.Fatal(err)
			}
			var out [][]byte
			for _, tensor := range tensors {
				out = append(out, tensor.Data)
			}
			return out
		}
		a, b, other := draw(7), draw(7), draw(8)
		if !reflect.DeepEqual(a, b) {
			t.Error("two draws with one seed differ")
		}
		if reflect.DeepEqual(a, other) {
			t.Error("two seeds drew the same weights")
		}
	})
}

func TestLlamaDefaultsAreTheDocumentedShape(t *testing.T) {
	o, err := LlamaOptions{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.Layers != 4 || o.Hidden != 256 || o.Heads != 8 || o.KVHeads != 2 || o.Inner != 704 || o.Positions != 2048 || o.DType != "bfloat16" {
		t.Errorf("defaults %+v", o)
	}
	// Embedding and LM head, then per layer: q and o (h²), k and v (h·kv), the gated MLP
	// (3·h·inner) and two norms; the final norm.
	h, kv := 256, 2*32
	want := 2*32000*h + 4*(2*h*h+2*h*kv+3*h*704+2*h) + h
	if got := o.NumParameters(); got != want {
		t.Errorf("NumParameters() = %d, want %d", got, want)
	}
}

func TestBadLlamaOptionsFail(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    LlamaOptions
		want string
	}{
		{"query heads that KV heads do not divide are refused", LlamaOptions{Heads: 8, KVHeads: 3}, "not a multiple of kv heads 3"},
		{"an odd head size is refused", LlamaOptions{Hidden: 72, Heads: 8}, "odd"},
		{"an unknown dtype is refused", LlamaOptions{DType: "int8"}, `dtype "int8"`},
		{"a negative size is refused", LlamaOptions{Inner: -1}, "must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkRefused(t, func(dir string) error { return WriteLlamaCheckpoint(dir, tc.o) }, tc.want)
		})
	}
}

package cpu

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"gollm/engine/enginetest"
	"gollm/model"
	"gollm/tokenizer"
)

// austenDir is the demo checkpoint the GGUF fixtures are written from: LLaMA-shaped,
// float16, its widths whole k-quant super-blocks, a byte-level BPE with a chat template.
const austenDir = "../../model_repository/austen/1"

// ggufKinds are the file types the fixtures are written in.
var ggufKinds = []string{"F32", "F16", "BF16", "Q8_0", "Q4_K_M"}

var (
	ggufOnce sync.Once
	ggufDir  string
	ggufErr  error
)

// TestMain removes the GGUF fixtures' folder: it lives outside any test's TempDir, being
// shared by the tests of one binary, and each run would otherwise leave 120 MB in /tmp.
func TestMain(m *testing.M) {
	code := m.Run()
	if ggufDir != "" {
		os.RemoveAll(ggufDir)
	}
	os.Exit(code)
}

// ggufFixtures writes (once per test binary) the austen checkpoint as GGUF files of
// every kind with testdata/make_gguf.py, each with its weights in safetensors form
// beside it (KIND-ref/), and returns their folder.
func ggufFixtures(t testing.TB) string {
	t.Helper()
	ggufOnce.Do(func() {
		root, err := filepath.Abs("../..")
		if err != nil {
			ggufErr = err
			return
		}
		if ggufDir, ggufErr = os.MkdirTemp("", "gollm-gguf-"); ggufErr != nil {
			return
		}
		ggufErr = enginetest.MakeGGUF(root, append([]string{"model", filepath.Join(root, "model_repository", "austen", "1"), ggufDir}, ggufKinds...)...)
	})
	if ggufErr != nil {
		t.Fatal(ggufErr)
	}
	return ggufDir
}

// heldOut is the austen demo's held-out text, tokenized, the first n tokens.
func heldOut(t testing.TB, tk *tokenizer.Tokenizer, n int) []int32 {
	t.Helper()
	f, err := os.Open("../../demo/austen/heldout-sample.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ids []int32
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() && len(ids) < n {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			ids = append(append(ids, tk.Encode(line)...), 0)
		}
	}
	return ids[:min(n, len(ids))]
}

// contextLogits runs prompt through an engine on w and returns its logits [len][vocab].
func contextLogits(t testing.TB, w *Weights, prompt []int32) []float32 {
	t.Helper()
	e, err := New(w, KVConfig{NumBlocks: (len(prompt) + 63) / 64, TokensPerBlock: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	blocks := make([]int32, (len(prompt)+63)/64)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	return mustStep(t, e, Sequence{ID: 1, Tokens: prompt, Blocks: blocks, ContextLogits: true})[0].ContextLogits
}

func TestGGUFWeightsAreTheValuesGGUFReads(t *testing.T) {
	dir := ggufFixtures(t)
	for _, kind := range ggufKinds {
		t.Run(kind, func(t *testing.T) {
			g, err := model.Open(filepath.Join(dir, kind+".gguf"))
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			ref, err := model.Open(filepath.Join(dir, kind+"-ref"))
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			if g.Config.Hidden != ref.Config.Hidden || g.Config.Layers != ref.Config.Layers || g.Config.KVHeads != ref.Config.KVHeads ||
				g.Config.VocabSize != ref.Config.VocabSize || !g.Config.TiedHead || g.Config.Rope.Theta != ref.Config.Rope.Theta {
				t.Errorf("GGUF config %+v, the safetensors form's %+v", g.Config, ref.Config)
			}
			gw, err := g.Weights()
			if err != nil {
				t.Fatal(err)
			}
			rw, err := ref.Weights()
			if err != nil {
				t.Fatal(err)
			}
			if len(gw) != len(rw) {
				t.Fatalf("%d weights, the safetensors form %d", len(gw), len(rw))
			}
			dtypes := map[string]bool{}
			for i := range gw {
				a, err := gw[i].Float32()
				if err != nil {
					t.Fatal(err)
				}
				b, err := rw[i].Float32()
				if err != nil {
					t.Fatal(err)
				}
				// Dequantized by gollm and by gguf's Python (llama.cpp's reference), the
				// query and key rows put back in Hugging Face's order: the same values.
				if !slices.Equal(a, b) {
					t.Errorf("%s differs from the safetensors form by %g", &gw[i], maxAbsDiff(a, b))
				}
				for _, p := range gw[i].Parts {
					dtypes[p.Tensor.DType] = true
				}
			}
			t.Logf("GGML types: %v", slices.Sorted(func(yield func(string) bool) {
				for k := range dtypes {
					if !yield(k) {
						return
					}
				}
			}))
		})
	}
}

func TestGGUFLogitsMatchTheSafetensorsForm(t *testing.T) {
	dir := ggufFixtures(t)
	tk, err := tokenizer.Load(austenDir + "/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	prompt := heldOut(t, tk, 256)
	for _, kind := range ggufKinds {
		t.Run(kind, func(t *testing.T) {
			gw := loadAs(t, filepath.Join(dir, kind+".gguf"), FormatAuto)
			defer gw.Release()
			// Float weights are used where they lie in the file; quantized ones are
			// repacked four rows at a time (so the file is closed: austen's embedding is
			// its LM head).
			if quantized := strings.HasPrefix(kind, "Q"); quantized != (gw.ckpt == nil) {
				t.Errorf("%s: the checkpoint mapped %v", kind, gw.ckpt != nil)
			}
			if strings.HasPrefix(kind, "Q") {
				for _, m := range gw.matrices() {
					for _, p := range m.parts {
						if p.ilv != p.rows&^3 {
							t.Fatalf("%s: a %s part of %d rows has %d interleaved", kind, p.f, p.rows, p.ilv)
						}
					}
				}
			}
			t.Logf("%s: %.1f MB of weights, stored as %v", kind, float64(gw.Bytes())/1e6, gw.Formats())
			rw := loadAs(t, filepath.Join(dir, kind+"-ref"), FormatAuto)
			defer rw.Release()
			got, want := contextLogits(t, gw, prompt), contextLogits(t, rw, prompt)
			V := gw.cfg.VocabSize
			if !strings.HasPrefix(kind, "Q") && (kind != "BF16" || !useBF16) {
				// The same float weights: the same bits.
				if !slices.Equal(got, want) {
					t.Errorf("logits differ from the safetensors form's by %g", maxAbsDiff(got, want))
				}
				return
			}
			// Quantized: the integer kernels quantize the activations to 8 bits, the float
			// ones do not (nor do the bfloat16 kernels round them to bfloat16 for the float32
			// reference); the logits stay close and pick the same tokens almost always.
			agree := 0
			for i := range prompt {
				g, w := got[i*V:(i+1)*V], want[i*V:(i+1)*V]
				if argmax(g) == argmax(w) {
					agree++
				}
			}
			e := relL2(got, want)
			t.Logf("%s: relative L2 error %.3g, top-1 agreement %d/%d", kind, e, agree, len(prompt))
			if e > 0.03 || agree < len(prompt)*95/100 {
				t.Errorf("%s: relative L2 error %.3g, top-1 agreement %d/%d; want ≤ 0.03 and ≥ 95%%", kind, e, agree, len(prompt))
			}
		})
	}
}

// argmax is the index of v's largest value.
func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

func TestGGUFTokenizerIsTheCheckpointsTokenizer(t *testing.T) {
	dir := ggufFixtures(t)
	want, err := tokenizer.Load(austenDir + "/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := model.LoadTokenizer(filepath.Join(dir, "F16.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.ReadFile("../../demo/austen/heldout-sample.txt")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(f), "\n")
	lines = append(lines, "<|endoftext|>Hello, 123 worlds!  ", "  \t\n", "é∂ 🦙")
	for _, line := range lines {
		a, b := got.EncodePrompt(line), want.EncodePrompt(line)
		if !slices.Equal(a, b) {
			t.Fatalf("%q: GGUF tokenizer %v, tokenizer.json %v", line, a, b)
		}
		if got.Decode(a) != want.Decode(b) || got.DecodeText(a) != want.DecodeText(b) {
			t.Fatalf("%q: decodes differ", line)
		}
	}
	_, cfg, err := model.TokenizerFiles(filepath.Join(dir, "F16.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(austenDir + "/tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cfg), `"chat_template"`) || !strings.Contains(string(orig), "said she") || !strings.Contains(string(cfg), "said she") {
		t.Errorf("tokenizer_config.json made from the GGUF file lacks the chat template: %s", cfg)
	}
}

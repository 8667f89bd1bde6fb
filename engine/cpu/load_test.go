package cpu

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gollm/engine/enginetest"
	"gollm/model"
)

// storedAs copies the checkpoint folder src into a temporary folder with every float
// tensor re-encoded in dtype ("F16", "BF16"; "F32" copies as is).
func storedAs(t testing.TB, src, dtype string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"config.json", "generation_config.json"} {
		raw, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ts, err := enginetest.ReadSafetensors(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	var out []*model.Tensor
	for _, name := range slices.Sorted(maps.Keys(ts)) {
		tn := ts[name]
		v, err := tn.Float32()
		if err != nil {
			t.Fatal(err)
		}
		enc, err := model.NewFloatTensor(name, dtype, tn.Shape, v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, enc)
	}
	if err := model.WriteSafetensors(filepath.Join(dir, "model.safetensors"), out, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// loadAs opens dir and loads its weights in format f.
func loadAs(t testing.TB, dir string, f WeightFormat) *Weights {
	t.Helper()
	c, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := LoadWeights(c, f)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// run16 runs a 16-token prompt and 6 greedy steps on w; it returns the prompt's context
// logits followed by each step's logits, and the tokens.
func run16(t testing.TB, w *Weights) ([][]float32, []int32) {
	t.Helper()
	e, err := New(w, KVConfig{NumBlocks: 8, TokensPerBlock: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	g, err := generate(e, []int32{5, 17, 2, 9, 33, 1, 8, 40, 3, 3, 12, 7, 21, 30, 4, 11}, 6, SamplingParams{})
	if err != nil {
		t.Fatal(err)
	}
	return g.logits, g.tokens
}

func TestSixteenBitCheckpointsAreComputedWhereTheyLie(t *testing.T) {
	for _, fx := range []string{"gpt2-tiny", "llama-tiny", "qwen2-tiny", "qwen2moe-tiny"} {
		for _, dtype := range []string{"F32", "F16", "BF16"} {
			t.Run(fx+" in "+dtype, func(t *testing.T) {
				forEachKernelPath(t, func(t *testing.T) {
					dir := storedAs(t, filepath.Join("..", "..", "testdata", fx), dtype)
					// The float32 reference: every weight widened at load, as before.
					ref, err := model.LoadFloat32(dir)
					if err != nil {
						t.Fatal(err)
					}
					want, wantTok := run16(t, mustWeights(t, ref))
					w := loadAs(t, dir, FormatAuto)
					defer w.Release()
					got, gotTok := run16(t, w)
					if dtype == "BF16" && useBF16 {
						// The bfloat16 kernels round the inputs to bfloat16: close, not equal.
						for i := range want {
							if e := relL2(got[i], want[i]); e > bf16Tolerance {
								t.Fatalf("logits %d: relative L2 error %.3g against the float32 copy's, want ≤ %g", i, e, bf16Tolerance)
							}
						}
					} else {
						for i := range want {
							if !slices.Equal(got[i], want[i]) {
								t.Fatalf("logits %d differ from the float32 copy's by %g", i, maxAbsDiff(got[i], want[i]))
							}
						}
					}
					if !slices.Equal(gotTok, wantTok) {
						t.Errorf("tokens %v, the float32 copy's %v", gotTok, wantTok)
					}
					// GPT-2's transposed Conv1D matrices are copied (in their 16 bits);
					// LLaMA-shaped checkpoints are used in place entirely.
					if fx != "gpt2-tiny" {
						if w.ckpt == nil {
							t.Error("no matrix points into the checkpoint's mapping")
						}
						for f, rows := range w.Formats() {
							if f != dtype {
								t.Errorf("%d rows stored as %s, want every one as the checkpoint's %s", rows, f, dtype)
							}
						}
					}
					if f32 := loadAs(t, dir, FormatF32); true {
						defer f32.Release()
						got, _ := run16(t, f32)
						if !slices.Equal(got[0], want[0]) {
							t.Error("cpu_weight_format fp32 gives other logits than the float32 copy")
						}
					}
				})
			})
		}
	}
}

// mustWeights wraps NewWeights.
func mustWeights(t testing.TB, m *model.Float32) *Weights {
	t.Helper()
	w, err := NewWeights(m)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestQuantizedWeightsStayCloseToTheFloatModel(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "llama-tiny")
	ref, err := model.LoadFloat32(dir)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := run16(t, mustWeights(t, ref))
	for _, tc := range []struct {
		f       WeightFormat
		formats []string
		tol     float64
	}{
		{FormatF16, []string{"F16"}, 1e-3},
		{FormatBF16, []string{"BF16"}, 1e-2},
		{FormatQ8, []string{model.DTypeQ8_0}, 0.05},
		// Hidden 64 is no whole super-block: Q4_K falls back to Q8_0 for every matrix.
		{FormatQ4K, []string{model.DTypeQ8_0}, 0.05},
	} {
		t.Run(string(tc.f), func(t *testing.T) {
			w := loadAs(t, dir, tc.f)
			defer w.Release()
			if got := slices.Sorted(maps.Keys(w.Formats())); !slices.Equal(got, tc.formats) {
				t.Errorf("formats %v, want %v", got, tc.formats)
			}
			if w.ckpt != nil {
				t.Error("converted weights keep the checkpoint mapped")
			}
			// The prompt's logits at every position (greedy steps part ways once a token
			// differs, so they are not compared).
			got, _ := run16(t, w)
			if e := relL2(got[0], want[0]); e > tc.tol {
				t.Errorf("the prompt's logits: relative L2 error %.3g > %g", e, tc.tol)
			}
		})
	}
}

func TestWeightsUnmapTheirCheckpointWhenTheLastUserGoes(t *testing.T) {
	dir := storedAs(t, filepath.Join("..", "..", "testdata", "llama-tiny"), "F16")
	w := loadAs(t, dir, FormatAuto)
	if w.ckpt == nil {
		t.Fatal("the weights do not point into the checkpoint")
	}
	var engines []*Engine
	for range 2 {
		e, err := New(w, KVConfig{NumBlocks: 8, TokensPerBlock: 8})
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
	}
	if err := w.Release(); err != nil {
		t.Fatal(err)
	}
	if w.ckpt == nil {
		t.Fatal("the builder's Release unmapped weights two engines still use")
	}
	mustStep(t, engines[1], Sequence{ID: 1, Tokens: []int32{1, 2, 3}, Blocks: []int32{0}, Sample: true})
	engines[0].Close()
	mustStep(t, engines[1], Sequence{ID: 1, Tokens: []int32{1, 2, 3}, Blocks: []int32{0}, Sample: true})
	engines[1].Close()
	if w.ckpt != nil {
		t.Error("the last engine closed, the checkpoint is still mapped")
	}
	if _, err := New(w, KVConfig{NumBlocks: 8, TokensPerBlock: 8}); err == nil || !strings.Contains(err.Error(), "released") {
		t.Errorf("New on released weights: %v", err)
	}
}

func TestParseWeightFormatNamesWhatItAccepts(t *testing.T) {
	for _, s := range []string{"", "auto", "fp32", "fp16", "bf16", "q8_0", "q4_k"} {
		if _, err := ParseWeightFormat(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	_, err := ParseWeightFormat("int4")
	if err == nil || !strings.Contains(err.Error(), `"int4"`) || !strings.Contains(err.Error(), "q4_k") {
		t.Errorf("int4: %v", err)
	}
}

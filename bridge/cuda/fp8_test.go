package cuda

import (
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"gollm/model"
)

// TestFP8WeightsForTheArena: what the bridge hands the arena — an FP8 checkpoint's
// projections as stored, FP8 everywhere else dequantized; everything dequantized under
// tensor parallelism; quantization fp8 quantizes a float checkpoint's projections, a scale
// a row, and is refused where they could not stay FP8.
func TestFP8WeightsForTheArena(t *testing.T) {
	load := func(fixture string) (*model.Checkpoint, []model.Weight) {
		t.Helper()
		c, err := model.Open(filepath.Join("..", "..", "testdata", fixture))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ws, err := c.Weights()
		if err != nil {
			t.Fatal(err)
		}
		return c, ws
	}
	opts := Options{Logger: zap.NewNop()}
	fp8Only := func(ws []model.Weight, projections bool) bool {
		for _, w := range ws {
			if w.FP8() != (projections && fp8Projection(w.Role)) {
				return false
			}
		}
		return true
	}
	c, ws := load("llama-fp8-tiny")
	got, err := fp8Weights(ws, c, 1, opts)
	if err != nil || !fp8Only(got, true) {
		t.Fatalf("one GPU: %v; want the projections alone in FP8", err)
	}
	got, err = fp8Weights(ws, c, 2, opts)
	if err != nil || !fp8Only(got, false) {
		t.Fatalf("tensor parallel: %v; want nothing left in FP8", err)
	}
	c, ws = load("llama-tiny")
	q := opts
	q.Quantization = "fp8"
	got, err = fp8Weights(ws, c, 1, q)
	if err != nil || !fp8Only(got, true) {
		t.Fatalf("quantization fp8: %v; want the projections alone in FP8", err)
	}
	// A scale a row: the GPU's many-row GEMMs take the rowwise recipe (fp8lt.cuh's kRows).
	for _, w := range got {
		for _, p := range w.Parts {
			if p.Scale != nil && (p.BlockRows != 1 || p.BlockCols < w.Cols) {
				t.Fatalf("quantization fp8: %s has scale blocks of %d×%d; want one a row", &w, p.BlockRows, p.BlockCols)
			}
		}
	}
	c, ws = load("llama-tiny")
	if _, err := fp8Weights(ws, c, 2, q); err == nil || !strings.Contains(err.Error(), "quantization fp8: tensor parallelism") {
		t.Fatalf("quantization fp8 over 2 GPUs: %v; want a refusal", err)
	}
	c, ws = load("llama-tiny")
	if got, err = fp8Weights(ws, c, 1, opts); err != nil || !fp8Only(got, false) {
		t.Fatalf("a float checkpoint: %v; want it as stored", err)
	}
}

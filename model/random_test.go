package model

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestOpenRandomHasEveryWeight: a random checkpoint of the Mixtral and Qwen2-MoE fixtures'
// configs resolves every role as the files do (the same tensors, shapes, bfloat16),
// holds norms of 1 and other values within ±0.03, the same for the same seed, and a size
// over the bound is refused before anything is allocated.
func TestOpenRandomHasEveryWeight(t *testing.T) {
	for _, name := range []string{"mixtral-tiny", "qwen2moe-tiny", "gpt2-tiny"} {
		dir := t.TempDir()
		raw, err := os.ReadFile(filepath.Join("../testdata", name, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
		files, err := Open(filepath.Join("../testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		want, err := files.Weights()
		if err != nil {
			t.Fatal(err)
		}
		a, err := OpenRandom(dir, 7, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		got, err := a.Weights()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d weights, the files give %d", name, len(got), len(want))
		}
		b, err := OpenRandom(dir, 7, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := b.Weights()
		for i := range got {
			g, w := &got[i], &want[i]
			if g.Role != w.Role || g.Layer != w.Layer || g.Rows != w.Rows || g.Cols != w.Cols || len(g.Parts) != len(w.Parts) {
				t.Fatalf("%s: %s, the files give %s", name, g, w)
			}
			v, err := g.Float32()
			if err != nil {
				t.Fatal(err)
			}
			u, _ := again[i].Float32()
			if !slices.Equal(v, u) {
				t.Fatalf("%s: %s differs between two checkpoints of one seed", name, g)
			}
			norm := g.Role == RoleFinalNorm || g.Role == RoleAttnNorm || g.Role == RoleMLPNorm
			for _, x := range v {
				if norm && x != 1 || !norm && (x < -0.0301 || x > 0.0301) {
					t.Fatalf("%s: %s holds %g", name, g, x)
				}
			}
			if g.Parts[0].Tensor.DType != "BF16" {
				t.Fatalf("%s: %s is %s", name, g, g.Parts[0].Tensor.DType)
			}
		}
		_ = files.Close()
		if _, err := OpenRandom(dir, 7, 1000); err == nil || !strings.Contains(err.Error(), "more than the 1000 allowed") {
			t.Errorf("%s under 1000 bytes: %v", name, err)
		}
	}
}

package main

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gollm/engine"
)

func TestCPUInstancesShareOneCopyOfTheWeights(t *testing.T) {
	ms := &modelState{cfg: &modelConfig{ModelPath: "../testdata/gpt2-tiny"}}
	// Two instances load at once, as Triton may create them.
	got := make([]*engine.CPUWeights, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i], errs[i] = ms.cpuWeights() })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got[0] != got[1] {
		t.Errorf("two KIND_CPU instances got different weights %p and %p", got[0], got[1])
	}
}

func TestCPUWeightsOfABadCheckpointNameTheProblem(t *testing.T) {
	raw, err := os.ReadFile("../testdata/gpt2-tiny/config.json")
	if err != nil {
		t.Fatal(err)
	}
	tensors, err := os.ReadFile("../testdata/gpt2-tiny/model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, from, to, want string
	}{
		// model.LoadGPT2 checks the shapes; the engine checks what it can run.
		{"an MLP width the tensors do not have", `"n_inner": null`, `"n_inner": 128`, "h.0.mlp.c_fc.weight"},
		{"an epsilon that overflows float32", `"layer_norm_epsilon": 1e-05`, `"layer_norm_epsilon": 1e300`, "layer_norm_epsilon is +Inf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			config := strings.Replace(string(raw), tc.from, tc.to, 1)
			if config == string(raw) {
				t.Fatalf("config.json has no %s", tc.from)
			}
			if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), tensors, 0o644); err != nil {
				t.Fatal(err)
			}
			ms := &modelState{cfg: &modelConfig{ModelPath: dir}}
			w, err := ms.cpuWeights()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("cpuWeights = %p, %v; want an error naming %s and %q", w, err, dir, tc.want)
			}
			if ms.cpu != nil {
				t.Error("a failed load left weights behind")
			}
		})
	}
}

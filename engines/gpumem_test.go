package engines

import (
	"strings"
	"testing"
)

const gb = int64(1) << 30

func TestGPUShare(t *testing.T) {
	t.Run("two models at 0.45 of an 80 GiB GPU each get 36 GiB, whichever loads first", func(t *testing.T) {
		total := 80 * gb
		free := total - gb // the CUDA context
		for _, weights := range []int64{2 * gb, 14 * gb} {
			g := gpuShare{Utilization: 0.45, Total: total, Weights: weights, Instances: 1}
			per, err := g.perInstance()
			if err != nil {
				t.Fatal(err)
			}
			if got := weights + per; got != g.budget() || got != int64(0.45*float64(total)) {
				t.Errorf("weights %v + instance %v = %v, want the budget %v", weights, per, got, g.budget())
			}
			free -= weights
			if err := g.checkFree(per, free, ""); err != nil {
				t.Fatalf("model with %s of weights: %v", gib(weights), err)
			}
			free -= per
		}
		if free < 0 || free > 9*gb {
			t.Errorf("%s left free, want under the 10%% neither model asked for", gib(free))
		}
	})
	t.Run("instances on one GPU split what the shared weights leave", func(t *testing.T) {
		g := gpuShare{Utilization: 0.5, Total: 80 * gb, Weights: 10 * gb, Instances: 3}
		per, err := g.perInstance()
		if err != nil {
			t.Fatal(err)
		}
		if per != 10*gb {
			t.Errorf("per instance %s, want (40 - 10) / 3 = 10 GiB", gib(per))
		}
	})
	t.Run("weights beyond the budget fail, naming both", func(t *testing.T) {
		g := gpuShare{Utilization: 0.1, Total: 80 * gb, Weights: 14 * gb, Instances: 1}
		_, err := g.perInstance()
		if err == nil || !strings.Contains(err.Error(), "8.00 GiB") || !strings.Contains(err.Error(), "14.00 GiB") {
			t.Errorf("got %v, want an error naming the 8 GiB budget and the 14 GiB of weights", err)
		}
	})
	t.Run("a share larger than the free memory fails, saying how much it wanted and how much was free", func(t *testing.T) {
		g := gpuShare{Utilization: 0.9, Total: 80 * gb, Weights: 2 * gb, Instances: 1}
		per, err := g.perInstance()
		if err != nil {
			t.Fatal(err)
		}
		err = g.checkFree(per, 7*gb, "processes on the GPU (NVML): pid 1 other 70.00 GiB")
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		for _, want := range []string{"wants 70.00 GiB", "7.00 GiB is free", "pid 1 other 70.00 GiB"} {
			if !strings.Contains(msg, want) {
				t.Errorf("error %q lacks %q", msg, want)
			}
		}
	})
	t.Run("bad inputs", func(t *testing.T) {
		for _, g := range []gpuShare{{Utilization: 0, Total: gb, Instances: 1}, {Utilization: 1.5, Total: gb, Instances: 1},
			{Utilization: 0.5, Total: gb, Instances: 0}} {
			if _, err := g.perInstance(); err == nil {
				t.Errorf("%+v: no error", g)
			}
		}
	})
}

func TestGPUHoldersWithoutNVML(t *testing.T) {
	// On a machine without the driver the message says why NVML cannot help.
	if msg := gpuHolders("GPU-00000000-0000-0000-0000-000000000000"); !strings.Contains(msg, "NVML") {
		t.Errorf("gpuHolders = %q", msg)
	}
}

package engines

import (
	"strings"
	"testing"

	"gollm/hostmem"
	"gollm/model"
)

func TestFitsHost(t *testing.T) {
	mem := hostmem.Memory{Available: 20 << 30, Limit: 16 << 30, Used: 4 << 30, LimitFile: "/sys/fs/cgroup/memory.max"}
	if err := fitsHost(8<<30, "fp32", 2<<30, 1024, mem); err != nil {
		t.Errorf("10 GiB in 12 GiB of headroom: %v", err)
	}
	err := fitsHost(280<<30, "fp32", 2<<30, 65536, mem)
	if err == nil {
		t.Fatal("282 GiB in 12 GiB of headroom was let through")
	}
	for _, want := range []string{"the weights (cpu_weight_format fp32: 280.00 GiB)", "its KV pool (65536 positions, 2.00 GiB)", "need 282.00 GiB",
		"may take 12.00 GiB more", "MemAvailable 20.00 GiB", "cgroup limit 16.00 GiB (/sys/fs/cgroup/memory.max), 4.00 GiB in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	// Weights already loaded by another instance count nothing.
	if err := fitsHost(0, "q8_0", 13<<30, 1<<20, mem); err == nil || strings.Contains(err.Error(), "q8_0") {
		t.Errorf("a pool alone over the headroom: %v", err)
	}
	if err := fitsHost(1<<50, "auto", 0, 1, hostmem.Memory{Available: -1}); err != nil {
		t.Errorf("nothing known about the host: %v, want the load to go ahead", err)
	}
}

func TestWeightElements(t *testing.T) {
	ws := []model.Weight{{Rows: 3, Cols: 4}, {Rows: 1 << 20, Cols: 1 << 14}}
	if got := weightElements(ws); got != 12+1<<34 {
		t.Errorf("weightElements = %d", got)
	}
}

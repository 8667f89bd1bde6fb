package tests

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gollm/tests/harness"
)

// TestPerfAnalyzer runs perf_analyzer briefly against the served demo model: streaming
// over gRPC at concurrency 2, with the token inputs of tests/data/perf_input.json. It
// must finish with exit code 0 and report a throughput.
func TestPerfAnalyzer(t *testing.T) {
	s := sharedServer(t)
	pa, err := harness.PerfAnalyzer()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, pa,
		"-m", modelName, "-i", "grpc", "-u", s.GRPCAddr(), "--streaming",
		"--concurrency-range", "2:2",
		"--input-data", filepath.Join(s.Root, "tests", "data", "perf_input.json"),
		// Three windows of 3 s, accepted as stable at once: a short smoke run, not a
		// benchmark.
		"--measurement-mode", "time_windows", "-p", "3000", "-s", "1000", "-r", "3",
	)
	out, err := cmd.CombinedOutput()
	t.Logf("perf_analyzer output:\n%s", out)
	if err != nil {
		t.Fatalf("perf_analyzer: %v", err)
	}
	for _, bad := range []string{"error", "Error", "Failed"} {
		if strings.Contains(string(out), bad) {
			t.Errorf("perf_analyzer output mentions %q", bad)
		}
	}
	m := regexp.MustCompile(`Throughput: ([0-9.]+) infer/sec`).FindSubmatch(out)
	if m == nil {
		t.Fatal("no throughput line in perf_analyzer's output")
	}
	if m[1][0] == '0' && strings.Trim(string(m[1]), "0.") == "" {
		t.Errorf("throughput is %s infer/sec, want more than 0", m[1])
	}
	t.Logf("perf_analyzer throughput: %s infer/sec", m[1])
}

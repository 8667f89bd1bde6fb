package tests

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"gollm/tests/harness"
)

// genaiPerfDir is where scripts/deps.sh installs genai-perf for the tests (make test).
const genaiPerfDir = ".deps/genaiperf"

// genaiPerfOutputs are the outputs genai-perf reads from a TensorRT-LLM-style model.
var genaiPerfOutputs = []string{"output_ids", "sequence_length", "text_output"}

// TestGenAIPerf runs NVIDIA's genai-perf 0.0.16 unchanged, as written for the
// TensorRT-LLM backend (--endpoint-type kserve --backend tensorrtllm), against the
// served demo model, streaming and not: each run must profile every request and report
// the request latency and output token throughput, and the streaming run the time to
// first token and the inter-token latency.
//
// The model declares only the outputs genai-perf reads (genaiPerfOutputs): perf_analyzer
// 2.51 asks for every declared output and, for one a response leaves out, records
// whatever its previous lookup left in uninitialized variables; now and then those bytes
// read as a NaN, its JSON writer stops, and the profile export is left empty (about one
// run in twenty against the shipped config). README's "Load testing" says the same.
func TestGenAIPerf(t *testing.T) {
	s := harness.Start(t, harness.Options{Models: []harness.Model{{Outputs: genaiPerfOutputs}}})
	root := s.Root
	pkg := filepath.Join(root, genaiPerfDir)
	if _, err := os.Stat(filepath.Join(pkg, "genai_perf")); err != nil {
		t.Fatalf("genai-perf missing in %s (make test installs it: GOLLM_TEST_DEPS=1 bash scripts/deps.sh): %v", pkg, err)
	}
	tok, err := harness.DemoCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	const requests = 12
	for _, streaming := range []bool{true, false} {
		name := map[bool]string{true: "streaming", false: "not streaming"}[streaming]
		t.Run(name, func(t *testing.T) {
			art := t.TempDir()
			args := []string{"-m", "genai_perf.main", "profile", "-m", modelName,
				"--endpoint-type", "kserve", "--backend", "tensorrtllm", "-u", s.GRPCAddr(),
				"--tokenizer", tok, "--concurrency", "2", "--num-prompts", "8",
				"--request-count", "12", "--synthetic-input-tokens-mean", "24",
				"--output-tokens-mean", "12", "--artifact-dir", art}
			if streaming {
				args = append(args, "--streaming")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "python3", args...)
			// genai-perf runs perf_analyzer from PATH: the project's wrapper.
			cmd.Env = append(os.Environ(), "PYTHONPATH="+pkg,
				"PATH="+filepath.Join(root, ".deps", "bin")+string(os.PathListSeparator)+os.Getenv("PATH"),
				"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("genai-perf: %v\n%s", err, out)
			}
			t.Logf("genai-perf (%s):\n%s", name, out)
			exports, _ := filepath.Glob(filepath.Join(art, "*", "profile_export_genai_perf.json"))
			if len(exports) != 1 {
				t.Fatalf("genai-perf wrote %d profile exports, want 1", len(exports))
			}
			raw, err := os.ReadFile(exports[0])
			if err != nil {
				t.Fatal(err)
			}
			var rep map[string]struct {
				Avg *float64 `json:"avg"`
			}
			if err := json.Unmarshal(raw, &rep); err != nil {
				t.Fatal(err)
			}
			want := []string{"request_latency", "output_token_throughput", "request_throughput"}
			if streaming {
				want = append(want, "time_to_first_token", "inter_token_latency")
			}
			for _, k := range want {
				if v := rep[k].Avg; v == nil || *v <= 0 {
					t.Errorf("%s: %v, want a positive figure", k, v)
				}
			}
			if c := rep["request_count"].Avg; c == nil || *c != requests {
				t.Errorf("request_count %v, want %d", c, requests)
			}
		})
	}
}

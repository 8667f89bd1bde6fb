package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gollm/tests/harness"
)

// TestGuidedDecoding sends guided_decoding_guide_type and guided_decoding_guide with
// Triton's own Python client (tests/guided/test_guided.py) to a real tritonserver
// serving the austen demo model and the llama demo (SentencePiece, whose decoder drops
// the first token's space): JSON-schema answers on the ids path validate against the
// schema (jsonschema), regex, grammar and any-JSON answers on the text path match, beams
// follow the constraint, and bad constraints are refused naming the input while the
// server goes on serving. The backend's log must show no failed step.
func TestGuidedDecoding(t *testing.T) {
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	py, schema := filepath.Join(root, ".deps", "py"), filepath.Join(root, ".deps", "pyschema")
	for _, dir := range []string{filepath.Join(py, "tritonclient"), filepath.Join(schema, "jsonschema")} {
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("%s is missing (run `make deps`): %v", dir, err)
		}
	}
	llama := filepath.Join(root, llamaDemo)
	if _, err := os.Stat(filepath.Join(llama, "tokenizer.json")); err != nil {
		t.Fatalf("the llama demo checkpoint is missing (`make demo` writes it): %v", err)
	}
	s := harness.Start(t, harness.Options{Models: []harness.Model{
		{Name: "austen", Checkpoint: "model_repository/austen/1", Parameters: map[string]string{"max_beam_width": "2"}},
		{Name: "llama", Checkpoint: llamaDemo},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", filepath.Join(root, "tests", "guided", "test_guided.py"))
	cmd.Env = append(os.Environ(),
		"PYTHONPATH="+py+":"+schema,
		"GOLLM_GRPC_URL="+s.GRPCAddr(),
		"GOLLM_AUSTEN=austen",
		"GOLLM_LLAMA=llama",
		"GOLLM_TOKENIZERS=austen="+filepath.Join(root, "model_repository", "austen", "1", "tokenizer.json")+
			",llama="+filepath.Join(llama, "tokenizer.json"),
	)
	out, err := cmd.CombinedOutput()
	t.Logf("test_guided.py:\n%s", out)
	if err != nil {
		t.Fatalf("test_guided.py failed: %v (its output is above)", err)
	}
	if !strings.Contains(string(out), "\nOK") {
		t.Fatal("test_guided.py did not report OK")
	}
	if log := s.Log(); strings.Contains(log, "engine step failed") {
		t.Error("a step failed while serving guided requests (tritonserver's log)")
	}
}

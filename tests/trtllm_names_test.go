package tests

// TensorRT-LLM's client scripts (end_to_end_test.py, end_to_end_grpc_client.py) call four
// models by default: ensemble, tensorrt_llm, preprocessing and postprocessing.
// examples/trtllm serves the demo checkpoint under those names — the first two as the
// model itself, sharing one copy of the weights, the last two as tokenizer-only models
// (gollm_role) — and tests/trtllm/test_end_to_end.py makes the scripts' calls against it.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gollm/tests/harness"
)

// trtllmExample is the example model repository, from the repository root.
const trtllmExample = "examples/trtllm"

func TestTensorRTLLMModelNames(t *testing.T) {
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	pyDir := filepath.Join(root, ".deps", "py")
	for _, pkg := range []string{"tritonclient", "tokenizers"} {
		if _, err := os.Stat(filepath.Join(pyDir, pkg)); err != nil {
			t.Fatalf("Python's %s is missing from %s (run `make deps`): %v", pkg, pyDir, err)
		}
	}
	demo, err := harness.DemoCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	llama := filepath.Join(root, llamaDemo)
	if _, err := os.Stat(filepath.Join(llama, "tokenizer.json")); err != nil {
		t.Fatalf("the llama demo checkpoint is missing (`make demo` writes it): %v", err)
	}
	example := func(name string) string { return filepath.Join(trtllmExample, name, "config.pbtxt") }
	s := harness.Start(t, harness.Options{Models: []harness.Model{
		{Name: "ensemble", Config: example("ensemble")},
		{Name: "tensorrt_llm", Config: example("tensorrt_llm")},
		{Name: "preprocessing", Config: example("preprocessing")},
		{Name: "postprocessing", Config: example("postprocessing")},
		{Name: "preprocessing_llama", Config: example("preprocessing"), Checkpoint: llamaDemo},
	}})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", filepath.Join(root, "tests", "trtllm", "test_end_to_end.py"))
	cmd.Env = append(os.Environ(),
		"PYTHONPATH="+pyDir,
		"GOLLM_HTTP_URL="+strings.TrimPrefix(s.HTTPURL(), "http://"),
		"GOLLM_GRPC_URL="+s.GRPCAddr(),
		"GOLLM_TOKENIZER="+filepath.Join(demo, "tokenizer.json"),
		"GOLLM_LLAMA_TOKENIZER="+filepath.Join(llama, "tokenizer.json"),
	)
	out, err := cmd.CombinedOutput()
	t.Logf("test_end_to_end.py:\n%s", out)
	if err != nil {
		t.Fatalf("test_end_to_end.py failed: %v (its output is above)", err)
	}
	if !strings.Contains(string(out), "\nOK") {
		t.Fatal("test_end_to_end.py did not report OK")
	}

	// One copy of the weights: ensemble and tensorrt_llm share it, and the tokenizer-only
	// models open no weights at all.
	log := s.Log()
	if n := strings.Count(log, "its weights are shared, not loaded again"); n != 1 {
		t.Errorf("%d models logged that they share the checkpoint's weights, want 1", n)
	}
	if n := strings.Count(log, "tokenizer-only model loaded: no weights, no engine"); n != 3 {
		t.Errorf("%d tokenizer-only models loaded, want 3", n)
	}
}

// TestTensorRTLLMExampleConfigs keeps examples/trtllm what its README promises: its
// ensemble and tensorrt_llm are model_repository/gpt2's config (the inputs and outputs
// the harness serves, too) with only the name, decoupled and gpt_model_path changed, and
// all four models name one checkpoint.
func TestTensorRTLLMExampleConfigs(t *testing.T) {
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	read := func(rel string) string {
		raw, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	comment := regexp.MustCompile(`(?m)^\s*#.*\n`)
	changed := regexp.MustCompile(`(?m)^name: ".*"$|decoupled: (true|false)|^parameters \{ key: "gpt_model_path".*\n`)
	strip := func(cfg string) string { return changed.ReplaceAllString(comment.ReplaceAllString(cfg, ""), "") }
	gpt2 := strip(read("model_repository/gpt2/config.pbtxt"))
	var paths []string
	for _, name := range []string{"ensemble", "tensorrt_llm", "preprocessing", "postprocessing"} {
		cfg := read(filepath.Join(trtllmExample, name, "config.pbtxt"))
		if _, err := os.Stat(filepath.Join(root, trtllmExample, name, "1")); err != nil {
			t.Errorf("%s has no version folder 1/, which Triton needs: %v", name, err)
		}
		path, ok := harness.ConfigParameter(cfg, "gpt_model_path")
		if !ok {
			t.Errorf("%s names no gpt_model_path", name)
		}
		paths = append(paths, path)
		role, _ := harness.ConfigParameter(cfg, "gollm_role")
		switch name {
		case "ensemble", "tensorrt_llm":
			if strip(cfg) != gpt2 {
				t.Errorf("%s/config.pbtxt differs from model_repository/gpt2's in more than comments, the name, decoupled and gpt_model_path", name)
			}
			if role != "" || !strings.Contains(comment.ReplaceAllString(cfg, ""), "decoupled: false") {
				t.Errorf("%s: gollm_role %q, want none, and decoupled false (end_to_end_test.py calls it over HTTP)", name, role)
			}
		default:
			if role != name {
				t.Errorf("%s: gollm_role %q, want %q", name, role, name)
			}
		}
	}
	for _, p := range paths[1:] {
		if p != paths[0] {
			t.Errorf("gpt_model_path %q and %q: the four models must name one checkpoint", paths[0], p)
		}
	}
	if want := filepath.Join(root, demoCheckpointDir); filepath.Clean(filepath.Join(root, trtllmExample, "ensemble", paths[0])) != want {
		t.Errorf("gpt_model_path %q, relative to the model folder, is not the demo checkpoint %s", paths[0], want)
	}
}

// demoCheckpointDir is where make demo writes the gpt2 demo checkpoint.
const demoCheckpointDir = "model_repository/gpt2/1"

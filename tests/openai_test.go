package tests

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"gollm/kserve"
	"gollm/openai"
	"gollm/tests/harness"
)

// TestOpenAI runs the official openai Python package (tests/openai/test_openai.py)
// against gollm's OpenAI server in front of a real tritonserver serving three models:
// the gpt2 demo checkpoint as it is (its tokenizer_config.json has a ChatML template),
// the same weights without a tokenizer_config.json, so without a chat template (also
// served with stream_interval 3), and the trained austen demo model. Then no request of
// the server may be left running.
func TestOpenAI(t *testing.T) {
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	pyDir := filepath.Join(root, ".deps", "pyopenai")
	if _, err := os.Stat(filepath.Join(pyDir, "openai")); err != nil {
		t.Fatalf("the openai Python package is missing from %s (run `make deps`): %v", pyDir, err)
	}
	demo, err := harness.DemoCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(demo, "tokenizer_config.json")); err != nil {
		t.Fatalf("the demo checkpoint has no tokenizer_config.json (run `make demo`): %v", err)
	}
	// The plain model's checkpoint: the demo's files, linked, but no tokenizer config.
	plainDir := t.TempDir()
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		if err := os.Symlink(filepath.Join(demo, f), filepath.Join(plainDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	models := []harness.Model{{Name: "gpt2"}, {Name: "gpt2plain", Checkpoint: plainDir},
		{Name: "gpt2every3", Checkpoint: plainDir, Parameters: map[string]string{"stream_interval": "3"}},
		{Name: "austen", Checkpoint: "model_repository/austen/1"}}
	// The austen checkpoint under each tool-calling format's chat template
	// (tests/openai/templates): the trained weights, a template with tools.
	var toolModels []string
	for _, format := range []string{"hermes", "llama3_json", "mistral"} {
		dir := toolCheckpoint(t, root, format)
		name := "austen_" + format
		models = append(models, harness.Model{Name: name, Checkpoint: dir})
		toolModels = append(toolModels, format+"="+name)
	}
	srv := harness.Start(t, harness.Options{Models: models})

	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := openai.New(openai.Config{Triton: kserve.NewGRPCInferenceServiceClient(conn), ModelRepository: srv.RepoDir,
		Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	hs := httptest.NewServer(api)
	defer hs.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", filepath.Join(root, "tests", "openai", "test_openai.py"))
	cmd.Env = append(os.Environ(),
		"PYTHONPATH="+pyDir+":"+filepath.Join(root, ".deps", "pyschema"),
		"GOLLM_OPENAI_URL="+hs.URL+"/v1",
		"GOLLM_METRICS_URL="+srv.MetricsURL(),
		"GOLLM_MODEL=gpt2plain",
		"GOLLM_CHAT_MODEL=gpt2",
		"GOLLM_AUSTEN_MODEL=austen",
		"GOLLM_INTERVAL_MODEL=gpt2every3",
		"GOLLM_TOOL_MODELS="+strings.Join(toolModels, ","),
	)
	out, err := cmd.CombinedOutput()
	t.Logf("test_openai.py:\n%s", out)
	if err != nil {
		t.Fatalf("test_openai.py failed: %v (its output is above; tritonserver's log: %s)", err, srv.LogPath)
	}
	if !strings.Contains(string(out), "\nOK") {
		t.Fatalf("test_openai.py did not report OK")
	}

	// Nothing leaks: every request's goroutines are gone once the client is done.
	hs.CloseClientConnections()
	api.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "gollm/openai.") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines of the openai package still run after every request ended:\n%s", stacks)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// toolCheckpoint is the austen checkpoint's files, linked, with a tokenizer_config.json
// whose chat template is tests/openai/templates/<format>.jinja.
func toolCheckpoint(t *testing.T, root, format string) string {
	t.Helper()
	src := filepath.Join(root, "model_repository", "austen", "1")
	dir := t.TempDir()
	for _, f := range []string{"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} {
		if err := os.Symlink(filepath.Join(src, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	tmpl, err := os.ReadFile(filepath.Join(root, "tests", "openai", "templates", format+".jinja"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"] = string(tmpl)
	out, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

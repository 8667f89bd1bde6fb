package harness

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gollm/kserve"
)

const sampleConfig = `# A model with "decoupled: true" in a comment.
name: "gpt2"
backend: "gollm"
max_batch_size: 0
# parameters { key: "enable_chunked_context" value: { string_value: "true" } }
model_transaction_policy { decoupled: true }
input [
  { name: "input_ids" data_type: TYPE_INT32 dims: [ 1, -1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters: {
  key: "gpt_model_path"
  value: { string_value: "${model_dir}/1" }
}
parameters: {
  key: "max_tokens_in_paged_kv_cache"
  value: { string_value: "4096" }
}
`

func TestRewriteConfig(t *testing.T) {
	t.Run("renames the model and points gpt_model_path at the checkpoint", func(t *testing.T) {
		got, err := rewriteConfig(sampleConfig, Model{Name: "gpt2_sync"}, "/ckpt/dir")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got, "\nname: \"gpt2_sync\"\n") {
			t.Errorf("name not rewritten:\n%s", got)
		}
		if !strings.Contains(got, `name: "input_ids"`) {
			t.Errorf("input name changed:\n%s", got)
		}
		if !strings.Contains(got, `string_value: "/ckpt/dir"`) || strings.Contains(got, "${model_dir}") {
			t.Errorf("gpt_model_path not rewritten:\n%s", got)
		}
		if !strings.Contains(got, "decoupled: true") {
			t.Errorf("decoupled changed:\n%s", got)
		}
	})
	t.Run("turns decoupled off", func(t *testing.T) {
		got, err := rewriteConfig(sampleConfig, Model{Name: "gpt2", NonDecoupled: true}, "/c")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got, "{ decoupled: false }") || !strings.Contains(got, `"decoupled: true" in a comment`) {
			t.Errorf("decoupled not turned off:\n%s", got)
		}
	})
	t.Run("replaces an existing parameter and appends a new one", func(t *testing.T) {
		got, err := rewriteConfig(sampleConfig, Model{Name: "gpt2", Parameters: map[string]string{
			"max_tokens_in_paged_kv_cache": "128", "enable_kv_cache_reuse": `tr"ue`,
		}}, "/c")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(got, `"4096"`) || !strings.Contains(got, `string_value: "128"`) {
			t.Errorf("max_tokens_in_paged_kv_cache not replaced:\n%s", got)
		}
		if !strings.Contains(got, `key: "enable_kv_cache_reuse"`) || !strings.Contains(got, `string_value: "tr\"ue"`) {
			t.Errorf("enable_kv_cache_reuse not appended with escaping:\n%s", got)
		}
	})
	t.Run("sets a parameter that is only in a comment by appending it", func(t *testing.T) {
		got, err := rewriteConfig(sampleConfig, Model{Name: "gpt2", Parameters: map[string]string{"enable_chunked_context": "false"}}, "/c")
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := ConfigParameter(got, "enable_chunked_context"); !ok || v != "false" {
			t.Errorf("enable_chunked_context = %q, %v; want false:\n%s", v, ok, got)
		}
		if !strings.Contains(got, `# parameters { key: "enable_chunked_context" value: { string_value: "true" } }`) {
			t.Errorf("the comment was edited:\n%s", got)
		}
	})
	t.Run("reads parameters, not comments", func(t *testing.T) {
		if v, ok := ConfigParameter(sampleConfig, "max_tokens_in_paged_kv_cache"); !ok || v != "4096" {
			t.Errorf("max_tokens_in_paged_kv_cache = %q, %v; want 4096", v, ok)
		}
		if v, ok := ConfigParameter(sampleConfig, "enable_chunked_context"); ok {
			t.Errorf("enable_chunked_context = %q from a comment; want none", v)
		}
	})
	t.Run("sets the instance count", func(t *testing.T) {
		got, err := rewriteConfig(sampleConfig, Model{Name: "gpt2", InstanceCount: 3}, "/c")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got, "instance_group [ { count: 3 kind: KIND_CPU } ]") {
			t.Errorf("count not set:\n%s", got)
		}
	})
	t.Run("adds an instance group when there is none", func(t *testing.T) {
		got, err := rewriteConfig(`name: "gpt2"`, Model{Name: "gpt2", InstanceCount: 2}, "/c")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got, "count: 2 kind: KIND_CPU") {
			t.Errorf("instance group not added:\n%s", got)
		}
	})
	t.Run("adds a count to an instance group without one", func(t *testing.T) {
		got, err := rewriteConfig("instance_group [\n  {\n    kind: KIND_CPU\n  }\n]\n", Model{Name: "gpt2", InstanceCount: 4}, "/c")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got, "{ count: 4 \n    kind: KIND_CPU") {
			t.Errorf("count not added:\n%s", got)
		}
	})
	outputs := "output [\n  # ids\n  { name: \"output_ids\" dims: [ -1, -1 ] },\n  { name: \"cum_log_probs\" # a [ in a comment\n dims: [ -1 ] },\n  {\n    name: \"text_output\"\n  }\n]\nparameters { key: \"output\" value { string_value: \"]\" } }\n"
	t.Run("keeps the outputs named", func(t *testing.T) {
		got, err := rewriteConfig(outputs, Model{Name: "gpt2", Outputs: []string{"text_output", "output_ids"}}, "/c")
		if err != nil {
			t.Fatal(err)
		}
		want := "output [\n  { name: \"output_ids\" dims: [ -1, -1 ] },\n  {\n    name: \"text_output\"\n  }\n]\nparameters { key: \"output\""
		if !strings.Contains(got, want) {
			t.Errorf("got\n%s\nwant it to hold\n%s", got, want)
		}
	})
	t.Run("refuses an output the config does not have", func(t *testing.T) {
		_, err := rewriteConfig(outputs, Model{Name: "gpt2", Outputs: []string{"output_ids", "logits"}}, "/c")
		if err == nil || !strings.Contains(err.Error(), `"logits"`) {
			t.Errorf("err = %v, want one naming \"logits\"", err)
		}
	})
}

// TestServerWithEmptyRepository checks the harness itself against the real
// tritonserver: it starts, is live and ready over gRPC and HTTP, serves metrics, and
// exits with code 0 on SIGINT.
func TestServerWithEmptyRepository(t *testing.T) {
	s := Start(t, Options{Empty: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := s.Client(t)
	live, err := c.ServerLive(ctx, &kserve.ServerLiveRequest{})
	if err != nil || !live.GetLive() {
		t.Fatalf("ServerLive = %v, %v; want live", live, err)
	}
	meta, err := c.ServerMetadata(ctx, &kserve.ServerMetadataRequest{})
	if err != nil {
		t.Fatalf("ServerMetadata: %v", err)
	}
	if meta.GetName() != "triton" || meta.GetVersion() == "" {
		t.Errorf("ServerMetadata = %v; want name triton and a version", meta)
	}
	idx, err := c.RepositoryIndex(ctx, &kserve.RepositoryIndexRequest{})
	if err != nil {
		t.Fatalf("RepositoryIndex: %v", err)
	}
	if len(idx.GetModels()) != 0 {
		t.Errorf("RepositoryIndex lists %v; want no models", idx.GetModels())
	}
	for _, url := range []string{s.HTTPURL() + "/v2/health/live", s.MetricsURL()} {
		resp, err := s.HTTP().Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s", url, resp.Status)
		}
		if url == s.MetricsURL() && !strings.Contains(string(body), "# TYPE") {
			t.Errorf("metrics page has no metric families:\n%.500s", body)
		}
	}
	code, err := s.Stop()
	if err != nil || code != 0 {
		t.Fatalf("Stop = %d, %v; want exit code 0", code, err)
	}
	if !strings.Contains(s.Log(), "Started GRPCInferenceService at 127.0.0.1:") {
		t.Errorf("log does not show gRPC on loopback:\n%s", s.LogTail(4096))
	}
	if code2, _ := s.Stop(); code2 != code {
		t.Errorf("second Stop = %d, want %d", code2, code)
	}
}

func TestPrepareRepository(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, demoCheckpoint), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, shippedModel, "config.pbtxt"), []byte(sampleConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	repo := filepath.Join(t.TempDir(), "models")
	opts := Options{Models: []Model{{}, {Name: "gpt2_sync", NonDecoupled: true}}}
	err := prepareRepository(root, repo, opts)
	if err == nil || !strings.Contains(err.Error(), "make demo") {
		t.Fatalf("without a demo checkpoint: %v; want an error naming `make demo`", err)
	}
	if err := os.WriteFile(filepath.Join(root, demoCheckpoint, "model.safetensors"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := prepareRepository(root, repo, opts); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gpt2", "gpt2_sync"} {
		cfg, err := os.ReadFile(filepath.Join(repo, name, "config.pbtxt"))
		if err != nil {
			t.Fatal(err)
		}
		want := quote(filepath.Join(root, demoCheckpoint))
		if !strings.Contains(string(cfg), want) || !strings.Contains(string(cfg), quote(name)) {
			t.Errorf("%s/config.pbtxt lacks %s or its name:\n%s", name, want, cfg)
		}
		if fi, err := os.Stat(filepath.Join(repo, name, "1")); err != nil || !fi.IsDir() {
			t.Errorf("%s has no version folder 1: %v", name, err)
		}
	}
}

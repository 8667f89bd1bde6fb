package tests

// GGUF files and quantized CPU weights (issue 40), served through tritonserver and the
// OpenAI API: the austen demo model written as GGUF files by llama.cpp's gguf package
// (testdata/make_gguf.py) — float16, and Q4_K_M in a folder of its own — and its
// safetensors checkpoint quantized at load (cpu_weight_format q8_0), beside the
// checkpoint itself; and damaged GGUF files, refused at load.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/engine/enginetest"
	"gollm/kserve"
	"gollm/model"
	"gollm/openai"
	"gollm/tests/harness"
)

// generateReply is the part of a generate response these tests read.
type generateReply struct {
	// OutputIDs are the generateReply tokens (the shipped config excludes the prompt).
	OutputIDs json.RawMessage `json:"output_ids"`
	// TextOutput is their text.
	TextOutput string `json:"text_output"`
}

// generateText asks model for up to n greedy tokens after prompt over the generate
// endpoint.
func generateText(t *testing.T, s *harness.Server, model, prompt string, n int) ([]int32, string) {
	t.Helper()
	body, err := postJSON(testContext(t, 2*time.Minute), s.HTTP(), s.HTTPURL()+"/v2/models/"+model+"/generate",
		map[string]any{"text_input": prompt, "max_tokens": n, "temperature": 0})
	if err != nil {
		t.Fatalf("%s: %v", model, err)
	}
	var g generateReply
	if err := json.Unmarshal(body, &g); err != nil {
		t.Fatalf("%s: %v in %s", model, err, body)
	}
	var ids []int32
	if err := json.Unmarshal(g.OutputIDs, &ids); err != nil {
		var one int32
		if err := json.Unmarshal(g.OutputIDs, &one); err != nil {
			t.Fatalf("%s: output_ids %s", model, g.OutputIDs)
		}
		ids = []int32{one}
	}
	return ids, g.TextOutput
}

// quantizedGreedy runs the CPU engine in this process on the checkpoint at path in
// format f: prompt, then greedy tokens up to n, stopping at the end token 0 (which the
// server leaves out of output_ids).
func quantizedGreedy(t *testing.T, path string, f cpu.WeightFormat, prompt []int32, n int) []int32 {
	t.Helper()
	c, err := model.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := cpu.LoadWeights(c, f)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release()
	e, err := cpu.New(w, engine.KVConfig{NumBlocks: 4, TokensPerBlock: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	blocks := []int32{0, 1, 2, 3}
	history := slices.Clone(prompt)
	next := prompt
	var out []int32
	for len(out) < n {
		outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: next, Pos: len(history) - len(next),
			Blocks: blocks, Sample: true, History: history, NumGenerated: len(out)}}})
		if err != nil {
			t.Fatal(err)
		}
		tok := outs[0].Token
		if tok == 0 {
			break
		}
		out = append(out, tok)
		history = append(history, tok)
		next = []int32{tok}
	}
	return out
}

func TestGGUFAndQuantizedModelsServe(t *testing.T) {
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	austen := filepath.Join(root, "model_repository", "austen", "1")
	dir := t.TempDir()
	if err := enginetest.MakeGGUF(root, "model", austen, dir, "F16", "Q4_K_M"); err != nil {
		t.Fatal(err)
	}
	// The Q4_K_M file alone in a folder: gpt_model_path may name the folder.
	q4 := filepath.Join(dir, "q4")
	if err := os.MkdirAll(q4, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "Q4_K_M.gguf"), filepath.Join(q4, "austen-Q4_K_M.gguf")); err != nil {
		t.Fatal(err)
	}
	f16 := filepath.Join(dir, "F16.gguf")
	s := harness.Start(t, harness.Options{Models: []harness.Model{
		{Name: "austen", Checkpoint: austen},
		{Name: "austen_gguf", Checkpoint: f16},
		{Name: "austen_q4", Checkpoint: q4},
		{Name: "austen_q8", Checkpoint: austen, Parameters: map[string]string{"cpu_weight_format": "q8_0"}},
	}})

	// The server says how it holds each model's weights.
	formats := map[string]string{"austen_gguf": "rows_F16", "austen_q4": "rows_Q4_K", "austen_q8": "rows_Q8_0"}
	for name, want := range formats {
		found := false
		for _, line := range strings.Split(s.Log(), "\n") {
			if strings.Contains(line, "CPU weights loaded") && strings.Contains(line, want) &&
				strings.Contains(line, filepath.Base(map[string]string{"austen_gguf": f16, "austen_q4": q4, "austen_q8": austen}[name])) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no \"CPU weights loaded\" log line with %s", name, want)
		}
	}

	// The float16 GGUF file holds austen's weights: the greedy texts transformers wrote
	// in train.log, token for token the checkpoint's own.
	want, err := greedyFromTrainLog(root + "/demo/austen/train.log")
	if err != nil {
		t.Fatal(err)
	}
	for prompt, text := range want {
		ids, got := generateText(t, s, "austen_gguf", prompt, 40)
		if got != text {
			t.Errorf("austen_gguf, %q: %q, transformers' greedy %q", prompt, got, text)
		}
		if ref, _ := generateText(t, s, "austen", prompt, 40); !slices.Equal(ids, ref) {
			t.Errorf("austen_gguf, %q: tokens %v, the safetensors checkpoint's %v", prompt, ids, ref)
		}
	}

	// The quantized models: the tokens the CPU engine gives in this process on the same
	// weights, and English still (a trained model's greedy text, not noise).
	tok, err := model.LoadTokenizer(austen)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		f          cpu.WeightFormat
	}{{"austen_q4", q4, cpu.FormatAuto}, {"austen_q8", austen, cpu.FormatQ8}} {
		for prompt := range want {
			ids, text := generateText(t, s, tc.name, prompt, 32)
			ref := quantizedGreedy(t, tc.path, tc.f, tok.EncodePrompt(prompt), 32)
			if !slices.Equal(ids, ref) {
				t.Errorf("%s, %q: tokens %v, the engine in this process %v", tc.name, prompt, ids, ref)
			}
			if len(strings.Fields(text)) < 3 {
				t.Errorf("%s, %q: %q is hardly text", tc.name, prompt, text)
			}
			t.Logf("%s, %q → %q", tc.name, prompt, text)
		}
	}

	// The OpenAI API, with the official package: the GGUF file's chat template and
	// tokenizer (from its metadata) give the checkpoint's own chat.
	pyDir := filepath.Join(root, ".deps", "pyopenai")
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := openai.New(openai.Config{Triton: kserve.NewGRPCInferenceServiceClient(conn), ModelRepository: s.RepoDir,
		Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	hs := httptest.NewServer(api)
	defer hs.Close()
	const script = `
import json, sys
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1], api_key="unused")
out = {}
for m in sys.argv[2:]:
    r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "Will you dance with me, Mr. Darcy?"}],
                                  max_tokens=24, temperature=0, stop=['"'])
    out[m] = [r.choices[0].message.content, r.usage.prompt_tokens, r.choices[0].finish_reason]
print(json.dumps(out))
`
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "-c", script, hs.URL+"/v1", "austen", "austen_gguf", "austen_q4", "austen_q8")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pyDir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the openai package (make deps installs it in .deps/pyopenai): %v", err)
	}
	var chats map[string][3]any
	if err := json.Unmarshal(out, &chats); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	t.Logf("chat replies: %v", chats)
	ref := chats["austen"]
	if got := chats["austen_gguf"]; fmt.Sprint(got) != fmt.Sprint(ref) {
		t.Errorf("austen_gguf's chat %v, the checkpoint's %v", got, ref)
	}
	if q := chats["austen_q4"]; fmt.Sprint(q[1]) != fmt.Sprint(ref[1]) || q[0] == "" {
		t.Errorf("austen_q4's chat %v: want the same %v prompt tokens (the template from the file) and a reply", q, ref[1])
	}
	if q := chats["austen_q8"]; fmt.Sprint(q[1]) != fmt.Sprint(ref[1]) || q[0] == "" {
		t.Errorf("austen_q8's chat %v: want the same %v prompt tokens and a reply", q, ref[1])
	}
}

// TestBadGGUFFilesRefusedAtLoad loads damaged GGUF files through tritonserver: each
// load fails naming what is wrong, in bounded time and without a Go fatal error (the
// counts and sizes read from the file are checked before anything is allocated by
// them), and the server goes on serving the model it had.
func TestBadGGUFFilesRefusedAtLoad(t *testing.T) {
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := enginetest.MakeGGUF(root, "model", filepath.Join(root, "model_repository", "austen", "1"), dir, "F16"); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(dir, "F16.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	patched := func(off int, v uint64) []byte {
		b := slices.Clone(good)
		binary.LittleEndian.PutUint64(b[off:], v)
		return b
	}
	bad := []struct {
		name string
		file []byte
		want string
	}{
		{"not_gguf", append([]byte("GGUX"), good[4:]...), "not a GGUF file"},
		{"truncated", good[:len(good)/2], "run past the data region"},
		{"huge_tensor_count", patched(8, 1<<40), "exceeds"},
		{"huge_metadata_count", patched(16, 1<<60), "metadata count"},
	}
	models := []harness.Model{{}}
	for _, b := range bad {
		path := filepath.Join(dir, b.name+".gguf")
		if err := os.WriteFile(path, b.file, 0o644); err != nil {
			t.Fatal(err)
		}
		models = append(models, harness.Model{Name: b.name, Checkpoint: path})
	}
	s := harness.Start(t, harness.Options{Models: models,
		Flags: []string{"--model-control-mode=explicit", "--load-model=" + modelName}})
	c := s.Client(t)
	ctx := testContext(t, 5*time.Minute)
	ck := demoCheckpoint(t)
	want := greedyTokens(t, ck.dir, tokenPrompt, 4)
	for _, b := range bad {
		start := time.Now()
		_, err := c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: b.name})
		took := time.Since(start)
		if err == nil {
			t.Errorf("%s: loaded; want a refused load", b.name)
			continue
		}
		if !strings.Contains(err.Error(), b.want) || !strings.Contains(err.Error(), b.name+".gguf") {
			t.Errorf("%s: %v; want it to name the file and say %q", b.name, err, b.want)
		}
		if took > time.Minute {
			t.Errorf("%s: refused after %v", b.name, took)
		}
		t.Logf("%s: refused in %v: %v", b.name, took.Round(time.Millisecond), err)
		if live, err := c.ServerLive(ctx, &kserve.ServerLiveRequest{}); err != nil || !live.GetLive() {
			t.Fatalf("the server is not live after %s's refused load: %v, %v", b.name, live, err)
		}
		res, err := streamInfer(ctx, c, inferRequest(modelName, b.name, tokenInputs(tokenPrompt, 4, true)))
		if err != nil || res.errMsg != "" || !slices.Equal(res.tokens, want) {
			t.Fatalf("after %s: tokens %v, %v, error %q; want %v", b.name, res.tokens, err, res.errMsg, want)
		}
	}
	if strings.Contains(s.Log(), "fatal error") || strings.Contains(s.Log(), "panic:") {
		t.Error("the server's log shows a Go fatal error or panic")
	}
}

package tests

// FP8 through tritonserver on the CPU engine (issue 34): checkpoints in both published
// FP8 formats, written by the formats' own tools, serve transformers' greedy tokens; a
// float checkpoint with `quantization: fp8` serves the tokens of its FP8-quantized
// weights; a checkpoint with KV cache scales serves an FP8 KV cache (kv_cache_dtype fp8)
// scaled by them; other quantization methods, bad quantization parameters and an e5m2 KV
// cache are refused at load, naming them, while the other models keep serving.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/engine/enginetest"
	"gollm/kserve"
	"gollm/model"
	"gollm/tests/harness"
)

func TestFP8ThroughTriton(t *testing.T) {
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	// A copy of the fine-grained fixture whose config names GPTQ instead.
	gptq := t.TempDir()
	src := filepath.Join(root, "testdata", "llama-fp8-tiny")
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["quantization_config"] = map[string]any{"quant_method": "gptq", "bits": 4, "group_size": 128}
	if raw, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gptq, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(src, "model.safetensors"), filepath.Join(gptq, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	models := []harness.Model{
		{Name: "fp8", Checkpoint: "testdata/llama-fp8-tiny"},
		{Name: "fp8ct", Checkpoint: "testdata/llama-fp8ct-tiny"},
		{Name: "quantized", Checkpoint: "testdata/llama-tiny", Parameters: map[string]string{"quantization": "fp8"}},
		{Name: "gptq", Checkpoint: gptq},
		{Name: "int4", Checkpoint: "testdata/llama-tiny", Parameters: map[string]string{"quantization": "int4"}},
		{Name: "fp8kv", Checkpoint: "testdata/llama-fp8kv-tiny", Parameters: map[string]string{"kv_cache_dtype": "fp8"}},
		{Name: "e5m2", Checkpoint: "testdata/llama-tiny", Parameters: map[string]string{"kv_cache_dtype": "fp8_e5m2"}},
	}
	s := harness.Start(t, harness.Options{Models: models, Flags: []string{"--model-control-mode=explicit",
		"--load-model=fp8", "--load-model=fp8ct", "--load-model=quantized", "--load-model=fp8kv"}})
	c := s.Client(t)
	ctx := testContext(t, 2*time.Minute)
	serve := func(name string, prompt []int32, n int) []int32 {
		t.Helper()
		in := append(tokenInputs(prompt, n, true), int32s("end_id", []int64{1, 1}, -1))
		res, err := streamInfer(ctx, c, inferRequest(name, "fp8", in))
		if err != nil || res.errMsg != "" {
			t.Fatalf("%s: %v %q", name, err, res.errMsg)
		}
		return res.tokens
	}
	for _, f := range []struct{ model, fixture string }{{"fp8", "llama-fp8-tiny"}, {"fp8ct", "llama-fp8ct-tiny"}} {
		g, err := enginetest.LoadGolden(filepath.Join(root, "testdata", f.fixture+"-golden.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if got := serve(f.model, g.PromptIDs, len(g.Greedy)); !slices.Equal(got, g.Greedy) {
			t.Errorf("%s: tokens %v, transformers' greedy on the FP8 checkpoint %v", f.model, got, g.Greedy)
		}
	}
	prompt := []int32{17, 401, 3, 998, 250, 250, 12, 77, 640, 5, 31, 900}
	want := fp8Greedy(t, filepath.Join(root, "testdata", "llama-tiny"), prompt, 16)
	if got := serve("quantized", prompt, 16); !slices.Equal(got, want) {
		t.Errorf("quantization fp8: tokens %v, the CPU engine on the FP8-quantized weights %v", got, want)
	}
	// The FP8 KV cache: the tokens of the CPU engine with the checkpoint's k_scale and
	// v_scale, which part from the float32 cache's on this fixture (TestFP8KVCache* in
	// engine/cpu): the server rounded its pool, by those scales.
	kvDir := filepath.Join(root, "testdata", "llama-fp8kv-tiny")
	fp8KV, floatKV := kvGreedy(t, kvDir, prompt, 16, engine.KVFP8), kvGreedy(t, kvDir, prompt, 16, engine.KVAuto)
	if slices.Equal(fp8KV, floatKV) {
		t.Fatalf("the FP8 and float32 KV caches give the same tokens %v on this prompt: the check shows nothing", fp8KV)
	}
	if got := serve("fp8kv", prompt, 16); !slices.Equal(got, fp8KV) {
		t.Errorf("kv_cache_dtype fp8: tokens %v, the CPU engine with an FP8 KV cache %v (with a float32 one %v)", got, fp8KV, floatKV)
	}
	for _, b := range []struct{ name, says string }{
		{"gptq", `quantization_config.quant_method: "gptq" is not supported`},
		{"int4", `parameter "quantization": "int4": want fp8 or none`},
		{"e5m2", `parameter "kv_cache_dtype": "fp8_e5m2" is not supported`},
	} {
		if _, err := c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: b.name}); err == nil || !strings.Contains(err.Error(), b.says) {
			t.Errorf("load %s: %v; want a refusal saying %q", b.name, err, b.says)
		}
	}
	// The refusals left the loaded models serving.
	if got := serve("quantized", prompt, 16); !slices.Equal(got, want) {
		t.Errorf("after the refused loads: tokens %v, want %v", got, want)
	}
}

// kvGreedy runs n greedy steps of the CPU engine on dir's weights with a KV cache of
// type kvd, scaled by the checkpoint's KV scales under FP8.
func kvGreedy(t *testing.T, dir string, prompt []int32, n int, kvd engine.KVDType) []int32 {
	t.Helper()
	m, err := model.LoadFloat32(dir)
	if err != nil {
		t.Fatal(err)
	}
	kv := engine.KVConfig{NumBlocks: 4, TokensPerBlock: 16, DType: kvd}
	if kvd == engine.KVFP8 {
		ck, err := model.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		kv.KScales, kv.VScales, err = ck.KVScales()
		ck.Close()
		if err != nil || kv.KScales == nil {
			t.Fatalf("%s: KV scales %v, %v", dir, kv.KScales, err)
		}
	}
	return greedyOn(t, m, kv, prompt, n)
}

// fp8Greedy runs n greedy steps of the CPU engine on dir's weights quantized as
// `quantization: fp8` quantizes them.
func fp8Greedy(t *testing.T, dir string, prompt []int32, n int) []int32 {
	t.Helper()
	m, err := model.LoadFloat32FP8(dir)
	if err != nil {
		t.Fatal(err)
	}
	return greedyOn(t, m, engine.KVConfig{NumBlocks: 4, TokensPerBlock: 16}, prompt, n)
}

// greedyOn runs n greedy steps of a CPU engine on m with a KV pool of kv.
func greedyOn(t *testing.T, m *model.Float32, kv engine.KVConfig, prompt []int32, n int) []int32 {
	t.Helper()
	e, err := cpu.NewFromModel(m, kv)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	blocks := []int32{0, 1, 2, 3}
	history := slices.Clone(prompt)
	next := prompt
	var out []int32
	for k := range n {
		outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: next, Pos: len(history) - len(next),
			Blocks: blocks, Sample: true, History: history, NumGenerated: k}}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, outs[0].Token)
		history = append(history, outs[0].Token)
		next = history[len(history)-1:]
	}
	return out
}

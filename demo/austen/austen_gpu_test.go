package austen

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"gollm/bridge/cuda"
	"gollm/engine"
	"gollm/model"
)

// gpuEngine makes a GPU engine on the shipped model with quantization q ("" or "fp8"),
// skipping where no library or GPU is, failing where the load fails on a GPU.
func gpuEngine(t *testing.T, q string) *cuda.Engine {
	t.Helper()
	return gpuEngineKV(t, q, engine.KVAuto)
}

// gpuEngineKV is gpuEngine with a KV pool of type kv (FP8: scales of 1, as the shipped
// checkpoint has none).
func gpuEngineKV(t *testing.T, q string, kv engine.KVDType) *cuda.Engine {
	t.Helper()
	path := os.Getenv("GOLLM_CUDA_LIB")
	if path == "" {
		path, _ = filepath.Abs(filepath.Join("..", "..", "build", cuda.LibraryName))
	}
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not built", path)
	}
	if n, err := cuda.DeviceCount(path); err != nil || n == 0 {
		t.Skipf("no GPU here (%d, %v)", n, err)
	}
	ckpt, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	e, err := cuda.New(ckpt, cuda.Options{Library: path, DType: "float16", Quantization: q, NumBlocks: 8,
		TokensPerBlock: 64, MaxTokens: 512, MaxSeqs: 4, KVDType: kv})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// TestGPUHeldOutPerplexityFP8: on the GPU, the shipped model with quantization fp8 (its
// projections in FP8 on the device; each window a prompt step, whose projections' inputs
// the W8A8 GEMMs round to e4m3 too, where cuBLASLt has the shapes) stays within 2% of the fp16
// engine's held-out perplexity, which stays within 2% of the CPU engine's float32 one;
// the greedy agreement of FP8 with fp16 is reported.
func TestGPUHeldOutPerplexityFP8(t *testing.T) {
	f16, f8 := gpuEngine(t, ""), gpuEngine(t, "fp8")
	m, err := model.LoadFloat32(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids := heldOut(t)
	V := m.Config.VocabSize
	ref, n := cpuPerplexity(t, m, ids)
	a, _ := Perplexity(t, f16, V, ids)
	b, _ := Perplexity(t, f8, V, ids)
	t.Logf("held-out perplexity over %d tokens: CPU float32 %.3f, GPU fp16 %.3f, GPU FP8 %.3f (%+.2f%% from fp16)",
		n, ref, a, b, 100*(b/a-1))
	if math.Abs(a/ref-1) > 0.02 {
		t.Errorf("GPU fp16 perplexity %.3f is more than 2%% from the CPU's %.3f", a, ref)
	}
	if math.Abs(b/a-1) > 0.02 {
		t.Errorf("GPU FP8 perplexity %.3f is more than 2%% from fp16's %.3f", b, a)
	}
	same, all := 0, 0
	for k := range 8 {
		prompt := ids[k*97 : k*97+16]
		same += agreeing(Greedy(t, f16, prompt, 32), Greedy(t, f8, prompt, 32))
		all += 32
	}
	t.Logf("greedy agreement FP8 vs fp16 on the GPU: %d of %d tokens (8 continuations of 32, each up to its first difference)", same, all)
}

// TestGPUHeldOutPerplexityFP8KV: on the GPU, an FP8 KV cache (kv_cache_dtype fp8, scales
// of 1) keeps the fp16 engine's held-out perplexity within 2% of its auto (fp16) pool's,
// as the CPU engine's FP8 pool keeps its float32 one's (TestFP8KVCachePerplexity); the
// greedy agreement with the auto pool is reported.
func TestGPUHeldOutPerplexityFP8KV(t *testing.T) {
	auto, f8 := gpuEngine(t, ""), gpuEngineKV(t, "", engine.KVFP8)
	if f8.KVBytes*2 != auto.KVBytes {
		t.Fatalf("the FP8 pool takes %d bytes, the auto pool %d: want half", f8.KVBytes, auto.KVBytes)
	}
	m, err := model.LoadFloat32(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids := heldOut(t)
	V := m.Config.VocabSize
	a, n := Perplexity(t, auto, V, ids)
	b, _ := Perplexity(t, f8, V, ids)
	t.Logf("held-out perplexity over %d tokens on the GPU (fp16): auto KV pool %.3f, FP8 KV pool %.3f (%+.2f%%)", n, a, b, 100*(b/a-1))
	if math.Abs(b/a-1) > 0.02 {
		t.Errorf("GPU perplexity with an FP8 KV pool %.3f is more than 2%% from the auto pool's %.3f", b, a)
	}
	if a == b {
		t.Error("the FP8 and auto pools give the same perplexity: the pool was not rounded")
	}
	same, all := 0, 0
	for k := range 8 {
		prompt := ids[k*97 : k*97+16]
		same += agreeing(Greedy(t, auto, prompt, 32), Greedy(t, f8, prompt, 32))
		all += 32
	}
	t.Logf("greedy agreement FP8 KV vs auto on the GPU: %d of %d tokens (8 continuations of 32, each up to its first difference)", same, all)
}

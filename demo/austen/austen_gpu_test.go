package austen

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"gollm/bridge/cuda"
	"gollm/model"
)

// gpuEngine makes a GPU engine on the shipped model with quantization q ("" or "fp8"),
// skipping where no library or GPU is, failing where the load fails on a GPU.
func gpuEngine(t *testing.T, q string) *cuda.Engine {
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
		TokensPerBlock: 64, MaxTokens: 512, MaxSeqs: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// TestGPUHeldOutPerplexityFP8: on the GPU, the shipped model with quantization fp8 (its
// projections in FP8 on the device, fp16 activations) stays within 2% of the fp16
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
	t.Logf("held-out perplexity over %d tokens: CPU float32 %.3f, GPU fp16 %.3f, GPU FP8 weights %.3f (%+.2f%% from fp16)",
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

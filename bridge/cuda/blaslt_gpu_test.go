package cuda

import (
	"fmt"
	"testing"
	"time"
)

// TestGPUBlasLtMatchesCPU runs the Blas path (64 sequences a step: past the tiled rows of
// the tiny models) on cuBLASLt with the algorithms the warm-up timed per shape, and on
// cublasGemmEx (NoBLASLt), on a LLaMA-3 shape in fp16 and bf16: a prompt step and decode
// steps replayed from the bucket's graph, every row's logits within the large-batch
// test's bar of the float32 CPU engine's, greedy tokens its own but at near-ties. The
// warm-up must have called its GEMM shapes and stayed within the tuning's budget.
func TestGPUBlasLtMatchesCPU(t *testing.T) {
	for _, dtype := range []string{"float16", "bfloat16"} {
		for _, off := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/no_blaslt=%v", dtype, off), func(t *testing.T) {
				const n = 64
				g := gpuEngineWith(t, "llama3-tiny", Options{DType: dtype, NumBlocks: 2 * n, TokensPerBlock: 16,
					MaxTokens: 4096, MaxSeqs: 256, Tuning: Tuning{NoBLASLt: off}})
				if g.WarmupGEMMShapes == 0 {
					t.Fatalf("the warm-up called no GEMM shape")
				}
				if off && g.WarmupGEMMTuned != 0 {
					t.Fatalf("NoBLASLt: the warm-up timed %d shapes, want none", g.WarmupGEMMTuned)
				}
				// The library's budget is 4 s of timing; a shape started before it ran out
				// finishes.
				if g.WarmupTuneTime > 6*time.Second {
					t.Fatalf("the warm-up's GEMM tuning took %v", g.WarmupTuneTime)
				}
				t.Logf("warm-up: %d GEMM shapes, %d timed in %v, whole warm-up %v", g.WarmupGEMMShapes,
					g.WarmupGEMMTuned, g.WarmupTuneTime, g.WarmupTime)
				bar := map[string]float64{"float16": 2e-2, "bfloat16": 0.12}[dtype]
				largeBatchAgainstCPU(t, g, "llama3-tiny", dtype, n, bar)
			})
		}
	}
}

package cuda

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/engine/enginetest"
	"gollm/model"
)

// fp8Engine loads testdata/<fixture> with o on the first GPU, failing (not skipping) where
// a GPU is there but the load fails; it returns the engine and the arena's bytes.
func fp8Engine(t *testing.T, fixture string, o Options) (*Engine, int64) {
	t.Helper()
	path := os.Getenv("GOLLM_CUDA_LIB")
	if path == "" {
		path, _ = filepath.Abs(filepath.Join("..", "..", "build", LibraryName))
	}
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not built", path)
	}
	if n, err := DeviceCount(path); err != nil || n == 0 {
		t.Skipf("no GPU here (%d, %v)", n, err)
	}
	ckpt, err := model.Open(filepath.Join("..", "..", "testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	o.Library = path
	w, err := LoadWeights(ckpt, o)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release()
	e, err := NewEngine(w, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, w.Bytes()
}

// fp8Bound is the most bytes an arena may hold with the projections in FP8: every weight
// in 16 bits less half the projections' elements (FP8 saves one byte each, its scales
// 1/32 of that back).
func fp8Bound(t *testing.T, fixture string) int64 {
	t.Helper()
	ckpt, err := model.Open(filepath.Join("..", "..", "testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	ws, err := ckpt.Weights()
	if err != nil {
		t.Fatal(err)
	}
	var all, proj int64
	for _, w := range ws {
		n := int64(w.Rows) * int64(w.Cols)
		all += n
		if fp8Projection(w.Role) {
			proj += n
		}
	}
	return 2*all - proj/2
}

// TestGPUFP8CheckpointsMatchTransformers: both published FP8 formats (transformers'
// 128×128 blocks, compressed-tensors' channels) load with their projections in FP8 — the
// arena holds a byte a projection weight — and give transformers' logits of the same
// checkpoint (dequantized, float32) on every kind of step as the dense families do: the
// prompt's (fp8_mma_kernel), decode steps (fp8_gemv_kernel), a longer prompt beside a
// decode row, greedy generation from decode graphs; 2e-2 relative L2 a row in float16,
// 0.12 in bfloat16 (the families' bars: the weights are exact, the activations rounded).
// The weight-only kernels at every row count (NoBLASLt), as the goldens were computed:
// cuBLASLt's FP8 GEMMs round the activations to e4m3 as well, and meet their reference in
// TestGPUFP8RowCountsMatchCPU.
func TestGPUFP8CheckpointsMatchTransformers(t *testing.T) {
	for _, fixture := range []string{"llama-fp8-tiny", "llama-fp8ct-tiny"} {
		for _, dtype := range []string{"float16", "bfloat16"} {
			t.Run(fixture+" "+dtype, func(t *testing.T) {
				g, err := enginetest.LoadGolden(filepath.Join("..", "..", "testdata", fixture+"-golden.safetensors"))
				if err != nil {
					t.Fatal(err)
				}
				e, bytes := fp8Engine(t, fixture, Options{NumBlocks: 32, TokensPerBlock: 8, MaxTokens: 64, MaxSeqs: 8, DType: dtype,
					Tuning: Tuning{NoBLASLt: true}})
				if bound := fp8Bound(t, fixture); bytes > bound {
					t.Fatalf("the arena holds %d bytes, more than %d: the projections are not in FP8", bytes, bound)
				}
				engineMatches(t, e, g, dtype)
			})
		}
	}
}

// TestGPUQuantizeFP8MatchesCPU: a float checkpoint with quantization fp8 (llama-tiny)
// keeps its projections in FP8 on the GPU and gives the CPU engine's logits on the same
// quantized weights (model.LoadFloat32FP8, the prompt step's activations rounded as the
// GPU's many-row path does) within 2e-2 relative L2 a row in float16: the prompt's rows,
// then 12 decode steps of the CPU's greedy tokens.
func TestGPUQuantizeFP8MatchesCPU(t *testing.T) {
	const fixture = "llama-tiny"
	e, bytes := fp8Engine(t, fixture, Options{NumBlocks: 32, TokensPerBlock: 8, MaxTokens: 64, MaxSeqs: 8,
		DType: "float16", Quantization: "fp8"})
	if bound := fp8Bound(t, fixture); bytes > bound {
		t.Fatalf("the arena holds %d bytes, more than %d: the projections are not in FP8", bytes, bound)
	}
	m, err := model.LoadFloat32FP8(filepath.Join("..", "..", "testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	ce, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: 32, TokensPerBlock: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer ce.Close()
	ce.QuantizeActivationsFP8(fp8GemvRows) // the prompt's 12 rows take cuBLASLt's W8A8 GEMMs
	V := m.Config.VocabSize
	prompt := []int32{17, 401, 3, 998, 250, 250, 12, 77, 640, 5, 31, 900}
	blocks := []int32{5, 1, 7, 2}
	step := func(eng engine.Engine, s engine.Sequence) engine.Output {
		t.Helper()
		out, err := eng.Step(&engine.Batch{Seqs: []engine.Sequence{s}})
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	seq := engine.Sequence{ID: 1, Tokens: prompt, Blocks: blocks, History: slices.Clone(prompt), ContextLogits: true, Sample: true}
	want, got := step(ce, seq), step(e, seq)
	worst := 0.0
	for i := range prompt {
		err := enginetest.RelL2(got.ContextLogits[i*V:(i+1)*V], want.ContextLogits[i*V:(i+1)*V])
		worst = max(worst, err)
		if err > 2e-2 {
			t.Errorf("prompt row %d: relative L2 %.3g from the CPU engine's", i, err)
		}
	}
	history := slices.Clone(prompt)
	tok := want.Token
	for k := range 12 {
		history = append(history, tok)
		s := engine.Sequence{ID: 1, Tokens: []int32{tok}, Pos: len(history) - 1, Blocks: blocks, Sample: true,
			History: history, NumGenerated: k + 1, ReturnLogits: true}
		w, g := step(ce, s), step(e, s)
		err := enginetest.RelL2(g.Logits, w.Logits)
		worst = max(worst, err)
		if err > 2e-2 {
			t.Errorf("decode step %d: relative L2 %.3g from the CPU engine's", k, err)
		}
		tok = w.Token
	}
	t.Logf("worst relative L2 from the CPU engine %.3g; arena %d bytes", worst, bytes)
}

// fp8GemvRows is cuda/fp8.cuh's kFp8GemvRows: steps of more rows take cuBLASLt's FP8
// GEMMs, which round the activations to e4m3.
const fp8GemvRows = 8

// gemmRows is cuda/sizes.h's gemm_rows: the padded row counts a step's GEMMs run on.
func gemmRows(n int) int {
	if n <= 16 {
		return 16
	}
	p := 16
	for p*2 <= n {
		p *= 2
	}
	step := max(p/8, 16)
	return (n + step - 1) / step * step
}

// TestGPUFP8RowCountsMatchCPU: the many-row FP8 projections (fp8lt.cuh: activations
// quantized a row and 128 columns at a time, cuBLASLt's block-scaled FP8 GEMMs) give the
// logits of the CPU engine on the same FP8 weights rounding its activations alike
// (QuantizeActivationsFP8) within 2e-2 relative L2 a row, on prompt steps of 16,
// 64, 256 and 1,024 rows, for three models: llama-fp8-tiny (transformers' 128×128 blocks,
// widths multiples of 128: the warm-up must have found cuBLASLt algorithms for its four
// projections at every padded row count, four GEMM shapes a row count beyond the LM
// head's, so that the steps cannot have passed on the older kernels alone), llama-tiny
// quantized at load (inputs 64 and 160 wide, outputs 128, 320 and 64: partial 128-column
// groups and 128-row blocks) and llama-fp8ct-tiny (per-channel scales: cuBLASLt with
// VEC128 weight scales). The weight-only kernels differ from this by the activations'
// rounding (a few percent on these random weights), so a shape run on them would fail.
func TestGPUFP8RowCountsMatchCPU(t *testing.T) {
	const maxTokens, seqLen, perSeq = 1024, 128, 16
	sizes := 0
	for m := gemmRows(9); m <= gemmRows(maxTokens); m = gemmRows(m + 1) {
		sizes++
	}
	for _, tc := range []struct {
		fixture, quant string
		lt             bool // every projection shape must take cuBLASLt
	}{{"llama-fp8-tiny", "", true}, {"llama-tiny", "fp8", false}, {"llama-fp8ct-tiny", "", false}} {
		t.Run(tc.fixture, func(t *testing.T) {
			e, _ := fp8Engine(t, tc.fixture, Options{NumBlocks: 8*perSeq + 8, TokensPerBlock: 8, MaxTokens: maxTokens,
				MaxSeqs: 8, DType: "float16", Quantization: tc.quant})
			t.Logf("warm-up GEMM shapes %d (4 FP8 projections × %d row counts = %d, then the LM head's)",
				e.WarmupGEMMShapes, sizes, 4*sizes)
			if tc.lt && e.WarmupGEMMShapes < 4*sizes {
				t.Errorf("the warm-up readied %d GEMM shapes, fewer than the %d FP8 projection shapes cuBLASLt "+
					"should take (4 projections × %d row counts)", e.WarmupGEMMShapes, 4*sizes, sizes)
			}
			m, err := model.LoadFloat32FP8(filepath.Join("..", "..", "testdata", tc.fixture))
			if err != nil {
				t.Fatal(err)
			}
			ce, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: 8*perSeq + 8, TokensPerBlock: 8})
			if err != nil {
				t.Fatal(err)
			}
			defer ce.Close()
			ce.QuantizeActivationsFP8(fp8GemvRows)
			V := m.Config.VocabSize
			rng := rand.New(rand.NewPCG(34, 4))
			for _, rows := range []int{16, 64, 256, 1024} {
				nseq := max(1, rows/seqLen)
				var b engine.Batch
				for i := range nseq {
					toks := make([]int32, rows/nseq)
					for j := range toks {
						toks[j] = int32(rng.IntN(V))
					}
					blocks := make([]int32, perSeq)
					for j := range blocks {
						blocks[j] = int32(i*perSeq + j)
					}
					b.Seqs = append(b.Seqs, engine.Sequence{ID: uint64(rows*10 + i), Tokens: toks, Blocks: blocks,
						History: slices.Clone(toks), ContextLogits: true, Sample: true})
				}
				want, err := ce.Step(&b)
				if err != nil {
					t.Fatal(err)
				}
				got, err := e.Step(&b)
				if err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				for i, s := range b.Seqs {
					for r := range s.Tokens {
						err := enginetest.RelL2(got[i].ContextLogits[r*V:(r+1)*V], want[i].ContextLogits[r*V:(r+1)*V])
						worst = max(worst, err)
						if err > 2e-2 {
							t.Errorf("%d rows: sequence %d row %d: relative L2 %.3g from the CPU engine's", rows, i, r, err)
						}
					}
				}
				t.Logf("%d rows: worst relative L2 from the CPU engine %.3g", rows, worst)
			}
		})
	}
}

package cuda

import (
	"fmt"
	"math"
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

// fp8RowScaled says whether the GPU rounds fixture's activations a whole row at a time
// in its many-row FP8 GEMMs: weights quantized at load (quant "fp8", a scale a row) or
// stored with a scale a row (model.Quant.RowScaled).
func fp8RowScaled(t *testing.T, fixture, quant string) bool {
	t.Helper()
	if quant == "fp8" {
		return true
	}
	ckpt, err := model.Open(filepath.Join("..", "..", "testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	return ckpt.Quant() != nil && ckpt.Quant().RowScaled()
}

// TestGPUFP8CheckpointsMatchTransformers: both published FP8 formats (transformers'
// 128×128 blocks, compressed-tensors' channels) load with their projections in FP8 — the
// arena holds a byte a projection weight — and give transformers' logits of the same
// checkpoint (dequantized, float32) on every kind of step as the dense families do: the
// prompt's (fp8_mma_kernel), decode steps (gemv_stream_kernel's F8), a longer prompt beside a
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
// quantized weights (model.LoadFloat32FP8), its activations rounded where the GPU's are
// (the prompt's 12 rows take cuBLASLt's W8A8 GEMMs), within w8a8Rows' bars: the prompt's
// rows, then 12 decode steps of the CPU's greedy tokens (weight-only, over the prompt's
// keys and values).
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
	c8, c16 := w8a8CPUs(t, m, 32, true)
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
	var j w8a8Rows
	seq := engine.Sequence{ID: 1, Tokens: prompt, Blocks: blocks, History: slices.Clone(prompt), ContextLogits: true, Sample: true}
	want, want16, got := step(c8, seq), step(c16, seq), step(e, seq)
	for i := range prompt {
		r := func(x []float32) []float32 { return x[i*V : (i+1)*V] }
		j.add(fmt.Sprintf("prompt row %d", i), r(got.ContextLogits), r(want.ContextLogits), r(want16.ContextLogits))
	}
	history := slices.Clone(prompt)
	tok := want.Token
	for k := range 12 {
		history = append(history, tok)
		s := engine.Sequence{ID: 1, Tokens: []int32{tok}, Pos: len(history) - 1, Blocks: blocks, Sample: true,
			History: history, NumGenerated: k + 1, ReturnLogits: true}
		w, w16, g := step(c8, s), step(c16, s), step(e, s)
		j.add(fmt.Sprintf("decode step %d", k), g.Logits, w.Logits, w16.Logits)
		tok = w.Token
	}
	j.judge(t)
	t.Logf("arena %d bytes", bytes)
}

// w8a8CPUs are two CPU engines on m's weights with blocks blocks of 8 positions: c8
// rounding its activations as the GPU's many-row FP8 GEMMs do (a whole row at a time
// where rowWise: weights with a scale a row), c16 not.
func w8a8CPUs(t *testing.T, m *model.Float32, blocks int, rowWise bool) (c8, c16 *cpu.Engine) {
	t.Helper()
	c8, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: blocks, TokensPerBlock: 8})
	if err != nil {
		t.Fatal(err)
	}
	c16, err = cpu.NewFromModel(m, engine.KVConfig{NumBlocks: blocks, TokensPerBlock: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c8.Close(); _ = c16.Close() })
	c8.QuantizeActivationsFP8(fp8GemvRows, rowWise)
	return c8, c16
}

// stepEach runs b on each engine in turn, failing the test on an error: outs[i] is
// engines[i]'s outputs.
func stepEach(t *testing.T, b *engine.Batch, engines ...engine.Engine) (outs [][]engine.Output) {
	t.Helper()
	for _, e := range engines {
		o, err := e.Step(b)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, o)
	}
	return outs
}

// w8a8Rows judges the GPU's logits where its FP8 GEMMs round the activations to e4m3
// (W8A8) against the CPU engine's rounding them alike. The two cannot agree as closely as
// weight-only steps do: the engines' activations differ by their compute types before
// each rounding, which moves some elements across an e4m3 rounding boundary (a step,
// 6-12% of the element), and each such flip moves the next projection's inputs further,
// so that after a layer or two the roundings are all but independent. The bar is then
// the rounding's own size: a row's distance eq between the CPU's rounded and unrounded
// logits. A row may be at most 2e-2 + 3 × the larger of its eq and the rms of eq off the
// rounded CPU's; the rms over the rows at most 2e-2 + 1.5 × eq's. A scale misread or left
// out, a row's scales swapped with another's, or a weight misplaced errs by far more.
type w8a8Rows struct {
	rows []w8a8Row
}

type w8a8Row struct {
	what       string
	e, eq, e16 float64 // from c8's, c8's from c16's, and from c16's
}

// add records a row: got (the GPU's), want (c8's), want16 (c16's).
func (j *w8a8Rows) add(what string, got, want, want16 []float32) {
	j.rows = append(j.rows, w8a8Row{what, enginetest.RelL2(got, want), enginetest.RelL2(want, want16), enginetest.RelL2(got, want16)})
}

// judge applies the bars; it returns the rms of the GPU's distance from c16 (the
// unrounded CPU), which shows whether the rounding happened on the GPU at all.
func (j *w8a8Rows) judge(t *testing.T) (rms16 float64) {
	t.Helper()
	var se, seq, se16, worst float64
	for _, r := range j.rows {
		if math.IsNaN(r.e) || math.IsInf(r.e, 0) {
			t.Fatalf("%s: relative L2 %g from the CPU engine's", r.what, r.e)
		}
		se, seq, se16, worst = se+r.e*r.e, seq+r.eq*r.eq, se16+r.e16*r.e16, max(worst, r.e)
	}
	n := float64(max(1, len(j.rows)))
	rms, rmsq := math.Sqrt(se/n), math.Sqrt(seq/n)
	rms16 = math.Sqrt(se16 / n)
	t.Logf("%d rows: relative L2 from the rounding CPU rms %.3g, worst %.3g; the rounding's own (CPU rounded vs not) rms %.3g; from the unrounded CPU rms %.3g",
		len(j.rows), rms, worst, rmsq, rms16)
	if rms > 2e-2+1.5*rmsq {
		t.Errorf("relative L2 from the CPU engine's: rms %.3g over %d rows, above 2e-2 + 1.5 × the rounding's own rms %.3g", rms, len(j.rows), rmsq)
	}
	bad := 0
	for _, r := range j.rows {
		if lim := 2e-2 + 3*max(r.eq, rmsq); r.e > lim {
			if bad++; bad <= 10 {
				t.Errorf("%s: relative L2 %.3g from the CPU engine's (bar %.3g: 2e-2 + 3 × the larger of its own rounding's %.3g and the rms %.3g)", r.what, r.e, lim, r.eq, rmsq)
			}
		}
	}
	return rms16
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
// quantized a row and 128 columns at a time for block-scaled weights, a whole row for
// weights with a scale a row; cuBLASLt's scaled FP8 GEMMs) give the logits of the CPU
// engine on the same FP8 weights rounding its activations alike
// (QuantizeActivationsFP8) within w8a8Rows' bars, on prompt steps of 16,
// 64, 256 and 1,024 rows, for three models: llama-fp8-tiny (transformers' 128×128 blocks,
// widths multiples of 128: the warm-up must have found cuBLASLt algorithms for its four
// projections at every padded row count, four GEMM shapes a row count beyond the LM
// head's, so that the steps cannot have passed on the older kernels alone), llama-tiny
// quantized at load (a scale a row; inputs 64 and 160 wide, outputs 128, 320 and 64:
// OUTER_VEC scales over partial 128-column groups) and llama-fp8ct-tiny (per-channel
// scales, OUTER_VEC too). On llama-fp8-tiny the GPU must also be off the unrounded CPU's
// logits by 1e-2 or more (rms): the weight-only kernels would be within 1e-3.
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
			c8, c16 := w8a8CPUs(t, m, 8*perSeq+8, fp8RowScaled(t, tc.fixture, tc.quant))
			V := m.Config.VocabSize
			rng := rand.New(rand.NewPCG(34, 4))
			var j w8a8Rows
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
				outs := stepEach(t, &b, c8, c16, e)
				want, want16, got := outs[0], outs[1], outs[2]
				for i, s := range b.Seqs {
					for r := range s.Tokens {
						at := func(x []float32) []float32 { return x[r*V : (r+1)*V] }
						j.add(fmt.Sprintf("%d rows: sequence %d row %d", rows, i, r),
							at(got[i].ContextLogits), at(want[i].ContextLogits), at(want16[i].ContextLogits))
					}
				}
			}
			// Weight-only, the GPU would give the unrounded CPU's logits within 1e-3 (as
			// before these GEMMs): far less says its activations were not rounded.
			if rms16 := j.judge(t); tc.lt && rms16 < 1e-2 {
				t.Errorf("rms %.3g from the unrounded CPU engine's: the many-row steps did not round their activations (cuBLASLt's FP8 GEMMs did not run)", rms16)
			}
		})
	}
}

// TestGPUFP8FewRowsMatchCPU: the few-row FP8 projections — the streaming gemv over e4m3
// weights (gemv_stream_kernel's F8: steps of up to stream_rows rows, 4 on these models,
// with its fused norm, rotary and KV write, gate·up and residual add) and fp8_gemv_kernel
// (5-8 rows, the Blas path's epilogue kernels after it) — give the CPU engine's logits
// on the same FP8 weights (weight-only: neither rounds its activations at up to 8 rows),
// for prompts of 1 to 8 rows and then decode steps of 1 to 8 sequences over them, on the
// three FP8 models of TestGPUFP8RowCountsMatchCPU (128×128 blocks; a scale a row over
// partial 128-column groups; per-channel scales), float16 and bfloat16 against the families' bars. A scale
// read for the wrong group or row, or a weight decoded out of place, errs by far more.
func TestGPUFP8FewRowsMatchCPU(t *testing.T) {
	const perSeq = 4
	for _, tc := range []struct{ fixture, quant string }{{"llama-fp8-tiny", ""}, {"llama-tiny", "fp8"}, {"llama-fp8ct-tiny", ""}} {
		for _, dtype := range []string{"float16", "bfloat16"} {
			t.Run(tc.fixture+" "+dtype, func(t *testing.T) {
				e, _ := fp8Engine(t, tc.fixture, Options{NumBlocks: 8*perSeq + 8, TokensPerBlock: 8, MaxTokens: 64,
					MaxSeqs: 8, DType: dtype, Quantization: tc.quant})
				m, err := model.LoadFloat32FP8(filepath.Join("..", "..", "testdata", tc.fixture))
				if err != nil {
					t.Fatal(err)
				}
				_, c := w8a8CPUs(t, m, 8*perSeq+8, fp8RowScaled(t, tc.fixture, tc.quant))
				V := m.Config.VocabSize
				bar := map[string]float64{"float16": 2e-2, "bfloat16": 0.12}[dtype]
				rng := rand.New(rand.NewPCG(34, 8))
				var worst, se float64
				var count int
				prompts := make([][]int32, 9)
				judge := func(what string, got, want []float32) {
					t.Helper()
					d := enginetest.RelL2(got, want)
					if math.IsNaN(d) || d > bar {
						t.Errorf("%s: relative L2 %.3g from the CPU engine's (bar %.3g)", what, d, bar)
					}
					worst, se, count = max(worst, d), se+d*d, count+1
				}
				for rows := 1; rows <= 8; rows++ {
					// A prompt of rows tokens: one step of rows rows.
					id := uint64(100 * rows)
					toks := make([]int32, rows)
					for j := range toks {
						toks[j] = int32(rng.IntN(V))
					}
					prompts[rows] = toks
					blocks := []int32{int32(rows-1) * perSeq, int32(rows-1)*perSeq + 1}
					s := engine.Sequence{ID: id, Tokens: toks, Blocks: blocks, History: slices.Clone(toks), ContextLogits: true, Sample: true}
					outs := stepEach(t, &engine.Batch{Seqs: []engine.Sequence{s}}, c, e)
					want, got := outs[0], outs[1]
					for r := range rows {
						at := func(x []float32) []float32 { return x[r*V : (r+1)*V] }
						judge(fmt.Sprintf("prompt of %d rows, row %d", rows, r), at(got[0].ContextLogits), at(want[0].ContextLogits))
					}
				}
				// Decode steps of 1 to 8 rows: the first k prompts' sequences, one token each.
				for k := 1; k <= 8; k++ {
					var b engine.Batch
					for rows := 1; rows <= k; rows++ {
						tok := int32(rng.IntN(V))
						hist := append(slices.Clone(prompts[rows]), tok)
						b.Seqs = append(b.Seqs, engine.Sequence{ID: uint64(100 * rows), Tokens: []int32{tok}, Pos: rows,
							Blocks: []int32{int32(rows-1) * perSeq, int32(rows-1)*perSeq + 1}, Sample: true,
							History: hist, NumGenerated: 1, ReturnLogits: true})
					}
					outs := stepEach(t, &b, c, e)
					want, got := outs[0], outs[1]
					for i := range b.Seqs {
						judge(fmt.Sprintf("decode step of %d rows, row %d", k, i), got[i].Logits, want[i].Logits)
					}
					// Each row wrote its sequence's position rows; the next step writes it again.
				}
				t.Logf("%d rows: relative L2 from the CPU engine rms %.3g, worst %.3g (bar %.3g)", count, math.Sqrt(se/float64(count)), worst, bar)
			})
		}
	}
}

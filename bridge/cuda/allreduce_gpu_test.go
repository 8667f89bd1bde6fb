package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/engine"
)

// arWays are the rank counts the all-reduce tests run at: 2, and 4 where the machine has 4
// GPUs.
func arWays(t *testing.T, lib string) []int {
	n, err := DeviceCount(lib)
	if err != nil {
		t.Fatal(err)
	}
	if n >= 4 {
		return []int{2, 4}
	}
	return []int{2}
}

// arRounds is how many times TestGPUAllReduceMatchesHost checks each custom case: the
// check's own copies racing its kernels (cudaMemcpy from pageable memory returns before
// its DMA lands) failed one run in two at 64x4096 on 2 H200s, some rounds only.
const arRounds = 8

// TestGPUAllReduceMatchesHost runs the custom all-reduce, one-shot and two-shot, fused with the residual add and
// RMSNorm, over 2 and 4 GPUs in fp16 and bf16, at row counts that give a block one row, a
// block several and fewer rows than blocks, once eagerly and then from a graph of three
// calls replayed twice (the epochs alternate the buffers' halves across replays), the calls
// cycling through three sets of partial sums (a call that read a peer's payload of one of
// the two calls before it, or a region not yet written, gets other sums): h must
// be the host's sums — each rank's partial sums rounded to the payload type, added in rank
// order in fp32 — bit for bit on every rank, and the normed rows within the compute type's
// rounding. The two-shot is held to the same bars, and its normed rows' largest error
// must be the one-shot's to the bit (its sums go back in fp32 and it norms in the
// one-shot's order: the same bits); NCCL's fp32 path is checked against the same sums.
func TestGPUAllReduceMatchesHost(t *testing.T) {
	lib := tpLibrary(t, 2)
	for _, n := range arWays(t, lib) {
		c, err := NewAllReduceComm(tpDevices(n), lib)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		for _, dt := range []string{"float16", "bfloat16"} {
			for _, shape := range [][2]int{{1, 4096}, {1, 64}, {3, 5120}, {64, 4096}, {130, 1024}, {7, 8192}} {
				oneShotXn := -1.0
				for _, m := range []AllReduceMethod{AllReduceCustom, AllReduceTwoShot, AllReduceNCCLF32} {
					t.Run(fmt.Sprintf("tp%d/%s/%dx%d/%s", n, dt, shape[0], shape[1], m), func(t *testing.T) {
						// A race shows in some runs only: the custom methods' checks run
						// arRounds times, the first failure failing the test.
						rounds := 1
						if m != AllReduceNCCLF32 {
							rounds = arRounds
						}
						var res AllReduceResult
						var err error
						for k := 0; k < rounds; k++ {
							res, err = c.Run(AllReduceParams{Method: m, DType: dt, Rows: shape[0], Hidden: shape[1], Iters: 4, Reps: 1,
								Check: true, Timeout: 10 * time.Second})
							if err != nil {
								t.Fatal(err)
							}
							if res.MaxErrH > 0 || res.RanksDiffer != 0 {
								t.Logf("round %d of %d", k+1, rounds)
								break
							}
						}
						if m != AllReduceNCCLF32 && !res.Custom {
							t.Fatalf("the custom all-reduce did not run: %s", res.Reason)
						}
						// The custom one adds what the host adds in the same order; NCCL's
						// fp32 ring adds in its own.
						barH, barXn := 0.0, 1e-2
						if m == AllReduceNCCLF32 {
							barH = 1e-4
						}
						if dt == "bfloat16" {
							barXn = 2e-2
						}
						if res.MaxErrH > barH || res.MaxErrXn > barXn || res.RanksDiffer != 0 {
							t.Fatalf("h off the host's sums by %.3g (bar %g), xn by %.3g (bar %g), %d elements differ between ranks",
								res.MaxErrH, barH, res.MaxErrXn, barXn, res.RanksDiffer)
						}
						switch m {
						case AllReduceCustom:
							oneShotXn = res.MaxErrXn
						case AllReduceTwoShot:
							if oneShotXn >= 0 && res.MaxErrXn != oneShotXn {
								t.Fatalf("xn off the host's norm by %.9g, the one-shot's by %.9g: the two kernels' rows differ", res.MaxErrXn, oneShotXn)
							}
						}
					})
				}
			}
		}
	}
}

// TestGPUTensorParallelFailedRankTimesOut makes rank 1's fourth step fail before any of
// its work is enqueued while the engine's grace is a minute: rank 0 waits in its custom
// all-reduce for rank 1's flag until the all-reduce's timeout (2 s here) fails its step —
// no hang — and aborts the communicators, so that Recover says the engine is lost; a new
// engine then serves. Run with the abort tests (tests/gpu/tpar_check.sh), last.
func TestGPUTensorParallelFailedRankTimesOut(t *testing.T) { failedRankTimesOut(t, false) }

// TestGPUTensorParallelFailedRankTimesOutTwoShot is TestGPUTensorParallelFailedRankTimesOut with
// every all-reduce in two shots: rank 0's wait on the first shot's flags ends the same
// way.
func TestGPUTensorParallelFailedRankTimesOutTwoShot(t *testing.T) { failedRankTimesOut(t, true) }

func failedRankTimesOut(t *testing.T, two bool) {
	lib := tpLibrary(t, 2)
	dir := filepath.Join("..", "..", "testdata", "llama-tiny")
	t.Setenv("GOLLM_CUDA_FAIL_STEP", "4:early")
	t.Setenv("GOLLM_CUDA_FAIL_RANK", "1")
	opts := tpOptions(lib)
	opts.Tuning.AllReduceTimeout = 2 * time.Second
	if two {
		opts.Tuning.AllReduceTwoBytes = 16
	}
	e := tpOn(t, dir, 2, opts)
	e.grace = time.Minute
	start := time.Now()
	err := tpFailAt(t, e, 4)
	took := time.Since(start)
	t.Logf("step 4 after %v: %v", took.Round(time.Millisecond), err)
	if took > 30*time.Second {
		t.Fatalf("step 4 took %v: the all-reduce's 2 s timeout did not end rank 0's wait", took)
	}
	var re *RankError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "GOLLM_CUDA_FAIL_STEP=4:early") ||
		!strings.Contains(err.Error(), "custom all-reduce waited 2.0 s for rank 1") {
		t.Fatalf("step 4 = %v, want rank 1's injected failure and rank 0's all-reduce timeout", err)
	}
	rerr := e.Recover(err)
	if rerr == nil || !strings.Contains(rerr.Error(), "aborted") {
		t.Fatalf("Recover = %v, want the engine lost", rerr)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	os.Unsetenv("GOLLM_CUDA_FAIL_STEP")
	os.Unsetenv("GOLLM_CUDA_FAIL_RANK")
	again := tpOn(t, dir, 2, tpOptions(lib))
	s := engine.Sequence{ID: 2, Tokens: []int32{1, 2, 3}, Blocks: []int32{1}, Sample: true, History: []int32{1, 2, 3}}
	if outs, err := again.Step(&engine.Batch{Seqs: []engine.Sequence{s}}); err != nil || outs[0].Token < 0 {
		t.Fatalf("a new engine after the timeout: %v, %v", outs, err)
	}
}

// TestGPUTensorParallelSampledCandidates decodes rows sampled with top-k up to 64 (with
// top-p, min-p and temperatures, and a greedy row beside them) over 2 and 4 GPUs, where
// each rank sends only its first 64 tokens of a row and its sum of exponentials, and again
// with the same seeds from the gathered vocabulary (NoTPCandidates): every step's tokens
// must be the same and their log-probabilities within 1e-5 (the whole vocabulary's sum is
// added in another order). Both engines are fed the candidates' tokens.
func TestGPUTensorParallelSampledCandidates(t *testing.T) {
	lib := tpLibrary(t, 2)
	dir := filepath.Join("..", "..", "testdata", "llama-tiny")
	type row struct {
		temp       float32
		k          int
		p, minP    float32
		seed       uint64
		promptSeed int
	}
	rows := []row{{0.8, 40, 0, 0, 1, 3}, {1.3, 64, 0.9, 0, 2, 5}, {0.7, 5, 0, 0.05, 3, 17}, {1, 64, 0.95, 0.02, 4, 9},
		{0, 0, 0, 0, 5, 4}, {2, 2, 0, 0, 6, 1}}
	for _, n := range arWays(t, lib) {
		t.Run(fmt.Sprintf("tp%d", n), func(t *testing.T) {
			// tokens[k][i], lps[k][i]: step k's token and log-probability of row i, with
			// the candidates (0) and the gathered vocabulary (1).
			var tokens [2][][]int32
			var lps [2][][]float32
			for pass := range 2 {
				opts := tpOptions(lib)
				opts.Tuning.NoTPCandidates = pass == 1
				e := tpOn(t, dir, n, opts)
				seqs := make([]engine.Sequence, len(rows))
				for i, r := range rows {
					p := make([]int32, r.promptSeed)
					for j := range p {
						p[j] = int32(7*i + 13*j + 1)
					}
					seqs[i] = engine.Sequence{ID: uint64(i + 1), Tokens: p, Sample: true, History: slices.Clone(p),
						Sampling: engine.SamplingParams{Temperature: r.temp, TopK: r.k, TopP: r.p, MinP: r.minP, Seed: r.seed},
						Blocks:   []int32{int32(8 * i), int32(8*i + 1), int32(8*i + 2), int32(8*i + 3)}}
				}
				for k := range 24 {
					outs, err := e.Step(&engine.Batch{Seqs: seqs})
					if err != nil {
						t.Fatalf("pass %d, step %d: %v", pass, k, err)
					}
					tk, lp := make([]int32, len(seqs)), make([]float32, len(seqs))
					for i := range seqs {
						tk[i], lp[i] = outs[i].Token, outs[i].LogProb
					}
					tokens[pass] = append(tokens[pass], tk)
					lps[pass] = append(lps[pass], lp)
					// Both passes continue with the first pass's tokens.
					for i := range seqs {
						s := &seqs[i]
						next := tokens[0][k][i]
						if next < 0 {
							t.Fatalf("pass %d, step %d, row %d: token %d", pass, k, i, next)
						}
						s.Pos += len(s.Tokens)
						s.Tokens = []int32{next}
						s.History = append(slices.Clone(s.History), next)
						s.NumGenerated++
					}
				}
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
			}
			distinct := map[int32]bool{}
			for k := range tokens[0] {
				for i := range rows {
					a, b := tokens[0][k][i], tokens[1][k][i]
					distinct[a] = true
					if a != b {
						t.Fatalf("step %d, row %d (%+v): token %d from the candidates, %d from the gathered vocabulary", k, i, rows[i], a, b)
					}
					if d := math.Abs(float64(lps[0][k][i] - lps[1][k][i])); d > 1e-5 {
						t.Fatalf("step %d, row %d: log-probability %.7f from the candidates, %.7f gathered", k, i, lps[0][k][i], lps[1][k][i])
					}
				}
			}
			// The draws must have drawn: a sampler stuck on one token would pass trivially.
			if len(distinct) < 20 {
				t.Fatalf("%d distinct tokens over %d steps of %d rows", len(distinct), len(tokens[0]), len(rows))
			}
		})
	}
}

// TestGPUTensorParallelGuidedGreedy decodes plain greedy rows under guided decoding's
// masks over 2 GPUs, beside unmasked greedy rows: a masked row's every token must be one
// its mask allows (the decode steps of greedy rows sample from the ranks' candidates only
// where no row has a mask, which those candidates do not read).
func TestGPUTensorParallelGuidedGreedy(t *testing.T) {
	lib := tpLibrary(t, 2)
	dir := filepath.Join("..", "..", "testdata", "llama-tiny")
	e := tpOn(t, dir, 2, tpOptions(lib))
	V := e.Info().VocabSize
	// Row 0 may take only tokens 3, 500 and V-1 (one in each rank's half and the last);
	// row 1 none but 777; row 2 is free.
	allow := func(toks ...int) []uint64 {
		m := make([]uint64, engine.MaskWords(V))
		for _, tk := range toks {
			m[tk/64] |= 1 << (tk % 64)
		}
		return m
	}
	masks := [][]uint64{allow(3, 500, V-1), allow(777), nil}
	ok := []map[int32]bool{{3: true, 500: true, int32(V - 1): true}, {777: true}, nil}
	seqs := make([]engine.Sequence, len(masks))
	for i := range seqs {
		p := []int32{int32(11*i + 2), int32(5*i + 9)}
		seqs[i] = engine.Sequence{ID: uint64(i + 1), Tokens: p, Sample: true, History: slices.Clone(p), Allowed: masks[i],
			Blocks: []int32{int32(4 * i), int32(4*i + 1)}}
	}
	for k := range 12 {
		outs, err := e.Step(&engine.Batch{Seqs: seqs})
		if err != nil {
			t.Fatalf("step %d: %v", k, err)
		}
		for i := range seqs {
			if tk := outs[i].Token; tk < 0 || (ok[i] != nil && !ok[i][tk]) {
				t.Fatalf("step %d, row %d: token %d, its mask allows %v", k, i, tk, ok[i])
			}
			s := &seqs[i]
			s.Pos += len(s.Tokens)
			s.Tokens = []int32{outs[i].Token}
			s.History = append(slices.Clone(s.History), outs[i].Token)
			s.NumGenerated++
		}
	}
}

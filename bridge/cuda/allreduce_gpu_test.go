package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// TestGPUAllReduceMatchesHost runs the custom all-reduce, one-shot and two-shot, fused with the residual add and
// RMSNorm, over 2 and 4 GPUs in fp16 and bf16, at row counts that give a block one row, a
// block several and fewer rows than blocks, once eagerly and then from a graph of three
// calls replayed twice (the epochs alternate the buffers' halves across replays): h must
// be the host's sums — each rank's partial sums rounded to the payload type, added in rank
// order in fp32 — bit for bit on every rank, and the normed rows within the compute type's
// rounding. The two-shot is held to the same bars (its sums go back in fp32: the one-shot's
// bits); NCCL's fp32 path is checked against the same host sums.
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
				for _, m := range []AllReduceMethod{AllReduceCustom, AllReduceTwoShot, AllReduceNCCLF32} {
					t.Run(fmt.Sprintf("tp%d/%s/%dx%d/%s", n, dt, shape[0], shape[1], m), func(t *testing.T) {
						res, err := c.Run(AllReduceParams{Method: m, DType: dt, Rows: shape[0], Hidden: shape[1], Iters: 4, Reps: 1,
							Check: true, Timeout: 10 * time.Second})
						if err != nil {
							t.Fatal(err)
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

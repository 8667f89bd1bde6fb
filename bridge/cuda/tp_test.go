package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gollm/engine"
	"gollm/model"
)

// TestShardWeightsKeepsWholeBiases: the GPU's shares are model.ShardWeights' except that
// every rank holds the whole attention-output and MLP-down biases (added once, after the
// all-reduce), where ShardWeights zeroes them past rank 0.
func TestShardWeightsKeepsWholeBiases(t *testing.T) {
	ck, err := model.Open(filepath.Join("..", "..", "testdata", "gpt2-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ws, err := ck.Weights()
	if err != nil {
		t.Fatal(err)
	}
	l, err := ck.Config.TensorParallel(2)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := model.ShardWeights(ws, &ck.Config, l, 1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := shardWeights(ws, &ck.Config, l, 1)
	if err != nil {
		t.Fatal(err)
	}
	biases := 0
	for i := range got {
		g, r, w := &got[i], &ref[i], &ws[i]
		if g.Role == model.RoleOutBias || g.Role == model.RoleDownBias {
			biases++
			if g.Rows != w.Rows || &g.Parts[0].Tensor.Data[0] != &w.Parts[0].Tensor.Data[0] {
				t.Errorf("%s layer %d: not the whole bias", g.Role, g.Layer)
			}
			continue
		}
		if g.Role != r.Role || g.Layer != r.Layer || g.Rows != r.Rows || g.Cols != r.Cols {
			t.Errorf("weight %d: %s %d×%d, ShardWeights gives %s %d×%d", i, g.Role, g.Rows, g.Cols, r.Role, r.Rows, r.Cols)
		}
	}
	if biases != 2*ck.Config.Layers {
		t.Errorf("%d output and down biases, want %d", biases, 2*ck.Config.Layers)
	}
}

// goRun is fanOut's run for tests: each rank on a goroutine of its own.
func goRun(_ int, f func()) { go f() }

// TestFanOutAbortsForRanksLeftWaiting: a rank that fails may leave the others waiting for
// its collectives; those still out grace after its error are released by the abort.
func TestFanOutAbortsForRanksLeftWaiting(t *testing.T) {
	release := make(chan struct{})
	var aborts atomic.Int32
	var cause error
	outs, by := fanOut(3, goRun, func(r int) ([]engine.Output, error) {
		switch r {
		case 1:
			return nil, &Error{Code: CodeCUDA, Op: "gollm_launch", Message: "an illegal memory access"}
		case 2:
			<-release // waits for a collective until the abort
			return nil, &Error{Code: CodeNCCL, Op: "gollm_wait", Message: "aborted"}
		}
		return []engine.Output{{Token: 7}}, nil
	}, func(c error) {
		aborts.Add(1)
		cause = c
		close(release)
	}, 20*time.Millisecond, 0, time.Hour)
	if aborts.Load() != 1 || by != 1 {
		t.Fatalf("%d aborts, triggered by rank %d; want 1, by rank 1", aborts.Load(), by)
	}
	if !strings.Contains(cause.Error(), "1 of 3 ranks did not return within 20ms of rank 1's error") || !strings.Contains(cause.Error(), "illegal memory access") {
		t.Errorf("cause %v", cause)
	}
	if outs[0].err != nil || outs[0].outs[0].Token != 7 || outs[2].err == nil {
		t.Errorf("outcomes %+v", outs)
	}
}

// TestFanOutLeavesErrorsWhenEveryRankReturns: when every rank returns, nothing waits for a
// collective; the errors are the step's (Recover resets the ranks).
func TestFanOutLeavesErrorsWhenEveryRankReturns(t *testing.T) {
	for _, err := range []error{
		&Error{Code: CodeInvalidArgument, Op: "gollm_launch", Message: "sequence 0: token 5000 outside the vocabulary"},
		&Error{Code: CodeCUDA, Op: "gollm_step", Message: "step 4: cudaMemcpyAsync failed (injected)"},
		errors.New("cuda: sequence 3: Feed = 9 names no sequence of the 2 launched before"),
	} {
		outs, by := fanOut(2, goRun, func(int) ([]engine.Output, error) { return nil, err },
			func(error) { t.Errorf("aborted for %v", err) }, time.Hour, 0, time.Hour)
		if by != -1 || outs[0].err == nil || outs[1].err == nil {
			t.Errorf("%v: triggered by %d, outcomes %+v", err, by, outs)
		}
	}
}

// TestFanOutAbortsCallsPastTheirDeadline: Recover's resets wait for the ranks' streams;
// one held by a collective that will not come is aborted at the deadline.
func TestFanOutAbortsCallsPastTheirDeadline(t *testing.T) {
	release := make(chan struct{})
	_, by := fanOut(2, goRun, func(r int) ([]engine.Output, error) {
		if r == 1 {
			<-release
		}
		return nil, nil
	}, func(error) { close(release) }, time.Hour, 20*time.Millisecond, time.Hour)
	if by != 2 {
		t.Fatalf("triggered by %d, want 2 (the deadline, no rank's error)", by)
	}
}

// TestFanOutLeavesRanksStuckPastTheAbort: a rank the abort does not release is left,
// marked stuck, rather than hanging the call.
func TestFanOutLeavesRanksStuckPastTheAbort(t *testing.T) {
	never := make(chan struct{})
	defer close(never)
	outs, by := fanOut(2, goRun, func(r int) ([]engine.Output, error) {
		if r == 1 {
			<-never
		}
		return nil, errors.New("failed")
	}, func(error) {}, time.Millisecond, 0, 20*time.Millisecond)
	if by != 0 || outs[0].stuck || !outs[1].stuck || !strings.Contains(outs[1].err.Error(), "after the NCCL communicators' abort") {
		t.Fatalf("triggered by %d, outcomes %+v", by, outs)
	}
}

func TestRankErrorsNameTheRanks(t *testing.T) {
	tp := &TPEngine{devices: []int{4, 5}}
	same := &Error{Code: CodeAllMasked, Op: "gollm_wait", Message: "sequence 0: every token is masked"}
	err := tp.rankErrors([]rankOutcome{{err: same}, {err: same}}, -1)
	if !errors.Is(err, same) || !strings.Contains(err.Error(), "on every one of the 2 tensor-parallel ranks") {
		t.Errorf("alike: %v", err)
	}
	cause := &Error{Code: CodeCUDA, Op: "gollm_wait", Message: "an illegal memory access"}
	after := &Error{Code: CodeNCCL, Op: "gollm_wait", Message: "the NCCL communicators were aborted"}
	err = tp.rankErrors([]rankOutcome{{err: after}, {err: cause}}, 1)
	var re *RankError
	if !errors.As(err, &re) || re.Rank != 1 || re.Device != 5 || !strings.HasPrefix(err.Error(), "tensor parallel rank 1 of 2 (GPU 5): ") ||
		!strings.Contains(err.Error(), "; tensor parallel rank 0 of 2 (GPU 4): ") {
		t.Errorf("the cause first: %v", err)
	}
	if err := tp.rankErrors([]rankOutcome{{}, {err: cause}}, 1); !strings.HasPrefix(err.Error(), "tensor parallel rank 1 of 2 (GPU 5)") {
		t.Errorf("one rank: %v", err)
	}
	if err := tp.rankErrors([]rankOutcome{{}, {}}, -1); err != nil {
		t.Errorf("none: %v", err)
	}
}

func TestTensorParallelEngineChecksItsShares(t *testing.T) {
	l := &lib{}
	if _, err := NewTensorParallelEngine(nil, Options{}); err == nil || !strings.Contains(err.Error(), "want at least 1") {
		t.Errorf("no shares: %v", err)
	}
	if _, err := NewTensorParallelEngine([]*Weights{{lib: l, tpSize: 1}}, Options{}); err == nil || !strings.Contains(err.Error(), "rank 0 has no weights") {
		t.Errorf("a share never loaded: %v", err)
	}
	a, b := &Weights{lib: l, tpSize: 2, tpRank: 0, dir: "x"}, &Weights{lib: l, tpSize: 2, tpRank: 0, dir: "x"}
	if _, err := NewTensorParallelEngine([]*Weights{a, b}, Options{}); err == nil || !strings.Contains(err.Error(), "share 1 is rank 0 of 2, want rank 1 of 2") {
		t.Errorf("misplaced share: %v", err)
	}
	if _, err := NewEngine(&Weights{lib: l, tpSize: 2, tpRank: 1}, Options{}); err == nil || !strings.Contains(err.Error(), "NewTensorParallelEngine") {
		t.Errorf("NewEngine on a share: %v", err)
	}
}

// builtLibrary is the CUDA library to test against: $GOLLM_CUDA_LIB, else CMake's build;
// the test is skipped when neither exists or it does not load here (cuBLAS neither on the
// loader's path nor in .deps).
func builtLibrary(t *testing.T) string {
	t.Helper()
	path := os.Getenv(EnvLibrary)
	if path == "" {
		path, _ = filepath.Abs(filepath.Join("..", "..", "build", LibraryName))
	}
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not built", path)
	}
	// cuBLAS from the CUDA wheels scripts/deps.sh installs, where the loader's path has none.
	preloadDeps(filepath.Join("..", "..", ".deps", "cuda", "nvidia", "cu13", "lib"))
	if _, err := openLib(path); err != nil {
		t.Skipf("the library does not load here: %v", err)
	}
	return path
}

// TestNCCLIsOpenedAtRunTime: a machine without NCCL loads the library (TestBuilt… serve
// one GPU without it) and asking for NCCL names what was tried; with GOLLM_TEST_NCCL
// naming a libnccl.so.2, it is opened and its version read, with no GPU needed.
func TestNCCLIsOpenedAtRunTime(t *testing.T) {
	path := builtLibrary(t)
	t.Setenv("GOLLM_NCCL_LIB", "/nonexistent/libnccl.so.2")
	_, err := NCCL(path)
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != CodeNCCL || !strings.Contains(err.Error(), "/nonexistent/libnccl.so.2") ||
		!strings.Contains(err.Error(), "GOLLM_NCCL_LIB") {
		t.Fatalf("NCCL without NCCL = %v, want an NCCL error naming the path and GOLLM_NCCL_LIB", err)
	}
	real := os.Getenv("GOLLM_TEST_NCCL")
	if real == "" {
		t.Skip("set GOLLM_TEST_NCCL to a libnccl.so.2 to open it")
	}
	t.Setenv("GOLLM_NCCL_LIB", real)
	info, err := NCCL(path)
	if err != nil || info.Version < 20000 || info.Path != real {
		t.Fatalf("NCCL(%s) = %+v, %v", real, info, err)
	}
	t.Logf("NCCL %d from %s", info.Version, info.Path)
}

// TestWithinLeavesACallThatDoesNotReturn: the communicators' abort runs under within, so
// that one stuck inside NCCL (as ncclCommAbort was, waiting for graphs) loses the engine
// without hanging its caller; and one that returns reports its error.
func TestWithinLeavesACallThatDoesNotReturn(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	start := time.Now()
	returned, err := within(50*time.Millisecond, func() error { <-release; return nil })
	if returned || err != nil || time.Since(start) > 5*time.Second {
		t.Fatalf("a blocked call: %v, returned %v after %v; want left after 50ms", err, returned, time.Since(start))
	}
	want := errors.New("ncclCommAbort failed")
	if returned, err := within(time.Minute, func() error { return want }); !returned || err != want {
		t.Fatalf("a returning call: %v, returned %v; want %v", err, returned, want)
	}
}

// TestShutLeavesEverythingAfterAStuckAbort: after an abort that did not return, Close
// touches neither the ranks' engines nor the communicators (their GPUs' work never ends)
// and leaves the workers.
func TestShutLeavesEverythingAfterAStuckAbort(t *testing.T) {
	tp := &TPEngine{abortStuck: true, ranks: make([]*Engine, 2), stuck: make([]bool, 2),
		workers: []*rankWorker{startWorker(), startWorker()}}
	tp.shut()
	if !tp.stuck[0] || !tp.stuck[1] || tp.comm != nil {
		t.Fatalf("after shut: stuck %v, comm %v; want every rank left", tp.stuck, tp.comm)
	}
	// The workers are left running: they still take work.
	done := make(chan struct{})
	tp.run(1, func() { close(done) })
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("rank 1's worker did not run a job after shut")
	}
}

// TestExpertParallelIsRefusedBeforeLoading: expert parallelism of a model without experts,
// or of shares that disagree on it, is refused naming why, before any GPU is touched.
func TestExpertParallelIsRefusedBeforeLoading(t *testing.T) {
	ck, err := model.Open(filepath.Join("..", "..", "testdata", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	opts := Options{ExpertParallel: true, Library: "/nonexistent/libgollm_cuda.so"}
	if _, err := NewTensorParallel(ck, []int{0, 1}, opts); err == nil || !strings.Contains(err.Error(), "the model has no mixture of experts") {
		t.Errorf("NewTensorParallel of a dense model: %v", err)
	}
	if _, err := LoadShard(ck, 2, 0, opts); err == nil || !strings.Contains(err.Error(), "the model has no mixture of experts") {
		t.Errorf("LoadShard of a dense model: %v", err)
	}
	a, b := &Weights{tpSize: 2, tpRank: 0, ep: true}, &Weights{tpSize: 2, tpRank: 1, ep: false}
	if _, err := NewTensorParallelEngine([]*Weights{a, b}, Options{}); err == nil || !strings.Contains(err.Error(), "expert parallelism") {
		t.Errorf("shares that disagree: %v", err)
	}
}

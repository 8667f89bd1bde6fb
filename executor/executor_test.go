package executor

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"gollm/batchmanager"
	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/model"
)

func TestMain(m *testing.M) {
	// The CPU engine's matrix helpers (engine/cpu's pool) live as long as the process,
	// GOMAXPROCS-1 of them at most, as the runtime's own workers do.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("gollm/engine/cpu.(*pool).helper"))
}

var (
	tinyOnce  sync.Once
	tinyModel *model.Float32
	tinyErr   error
)

// newExecutor starts an executor on the tiny checkpoint's CPU engine.
func newExecutor(t *testing.T, cfg Config) *Executor {
	t.Helper()
	return newExecutorOn(t, cfg, nil)
}

// slowEngine takes at least a millisecond a step, so that a test can act while a
// request still runs however the machine schedules it.
type slowEngine struct{ engine.Engine }

func (s slowEngine) Step(b *engine.Batch) ([]engine.Output, error) {
	time.Sleep(time.Millisecond)
	return s.Engine.Step(b)
}

// newExecutorOn is newExecutor with the engine wrapped by wrap (nil: as it is).
func newExecutorOn(t *testing.T, cfg Config, wrap func(engine.Engine) engine.Engine) *Executor {
	t.Helper()
	tinyOnce.Do(func() {
		tinyModel, tinyErr = model.LoadFloat32("../testdata/gpt2-tiny")
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	eng, err := cpu.NewFromModel(tinyModel, engine.KVConfig{NumBlocks: 64, TokensPerBlock: 8})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Batch.IdleWait = time.Millisecond
	var e engine.Engine = eng
	if wrap != nil {
		e = wrap(eng)
	}
	ex, err := New(e, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ex.Shutdown()
		_ = eng.Close()
	})
	return ex
}

func i32(v int32) *int32 { return &v }

// collect awaits one request until its final response.
func collect(t *testing.T, ex *Executor, id uint64) []Response {
	t.Helper()
	var all []Response
	for {
		rs, err := ex.AwaitResponses(&id, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) == 0 {
			t.Fatalf("request %d: timed out", id)
		}
		all = append(all, rs...)
		if rs[len(rs)-1].IsFinal() {
			return all
		}
	}
}

func TestStreamingAndNonStreamingAgree(t *testing.T) {
	ex := newExecutor(t, Config{})
	prompt := []int32{5, 6, 7, 8, 9}
	a, err := ex.Enqueue(Request{InputIDs: prompt, MaxNewTokens: 6, Streaming: true, EndID: i32(-1), Output: OutputConfig{ReturnLogProbs: true}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ex.Enqueue(Request{InputIDs: prompt, MaxNewTokens: 6, EndID: i32(-1), Output: OutputConfig{ReturnLogProbs: true, ReturnContextLogits: true, ReturnGenerationLogits: true}})
	if err != nil {
		t.Fatal(err)
	}
	var streamed []int32
	var lps []float32
	for _, r := range collect(t, ex, a) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		streamed = append(streamed, r.Result.OutputTokenIDs...)
		lps = append(lps, r.Result.LogProbs...)
	}
	rs := collect(t, ex, b)
	if len(rs) != 1 || rs[0].Err != nil || !rs[0].Result.IsFinal {
		t.Fatalf("non-streaming: %+v", rs)
	}
	res := rs[0].Result
	if !slices.Equal(res.OutputTokenIDs, append(slices.Clone(prompt), streamed...)) {
		t.Errorf("non-streaming %v, streaming %v after the prompt", res.OutputTokenIDs, streamed)
	}
	if !slices.Equal(res.LogProbs, lps) || len(lps) != 6 {
		t.Errorf("log probs %v vs streamed %v", res.LogProbs, lps)
	}
	var sum float32
	for _, lp := range lps {
		sum += lp
	}
	if d := res.CumLogProb - sum; d > 1e-4 || d < -1e-4 {
		t.Errorf("cum log prob %v, sum %v", res.CumLogProb, sum)
	}
	if len(res.ContextLogits) != 5*1000 || len(res.GenerationLogits) != 6*1000 {
		t.Errorf("logits: %d context, %d generation values", len(res.ContextLogits), len(res.GenerationLogits))
	}
}

func TestAwaitAnyTimeoutAndUnknownIDs(t *testing.T) {
	ex := newExecutor(t, Config{})
	if rs, err := ex.AwaitResponses(nil, 5*time.Millisecond); err != nil || len(rs) != 0 {
		t.Fatalf("idle await: %v, %v; want nothing after the timeout", rs, err)
	}
	ids := map[uint64]bool{}
	for i := range 5 {
		id, err := ex.Enqueue(Request{InputIDs: []int32{int32(i + 1)}, MaxNewTokens: 3, EndID: i32(-1)})
		if err != nil {
			t.Fatal(err)
		}
		ids[id] = true
	}
	finals := 0
	for finals < 5 {
		rs, err := ex.AwaitResponses(nil, 10*time.Second)
		if err != nil || len(rs) == 0 {
			t.Fatalf("await any: %v %v", rs, err)
		}
		for _, r := range rs {
			if !ids[r.RequestID] || r.Err != nil {
				t.Fatalf("unexpected response %+v", r)
			}
			if r.IsFinal() {
				finals++
			}
		}
	}
	if _, err := ex.AwaitResponses(new(uint64(1)), time.Second); !errors.Is(err, ErrUnknownRequest) {
		t.Errorf("awaiting a finished request: %v, want ErrUnknownRequest", err)
	}
	if err := ex.Cancel(999); !errors.Is(err, ErrUnknownRequest) {
		t.Errorf("cancelling an unknown request: %v", err)
	}
	if ex.Stats().IterationCounter == 0 {
		t.Error("stats show no iteration")
	}
}

func TestCancelRunningAndQueuedRequests(t *testing.T) {
	// A slow engine: the running request's 100 steps outlast the cancellations below even
	// on a loaded machine, so the queued one is still queued when it is cancelled.
	ex := newExecutorOn(t, Config{Batch: batchmanager.Config{MaxBatchSize: 1}},
		func(e engine.Engine) engine.Engine { return slowEngine{e} })
	run, _ := ex.Enqueue(Request{InputIDs: []int32{1, 2}, MaxNewTokens: 100, Streaming: true, EndID: i32(-1)})
	queued, _ := ex.Enqueue(Request{InputIDs: []int32{3}, MaxNewTokens: 5, EndID: i32(-1)})
	if rs, err := ex.AwaitResponses(&run, 10*time.Second); err != nil || len(rs) == 0 {
		t.Fatalf("first token: %v %v", rs, err)
	}
	if err := ex.Cancel(queued); err != nil {
		t.Fatal(err)
	}
	if err := ex.Cancel(run); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint64{run, queued} {
		rs := collect(t, ex, id)
		last := rs[len(rs)-1]
		if !errors.Is(last.Err, batchmanager.ErrCancelled) {
			t.Errorf("request %d: last response %+v, want cancelled", id, last)
		}
	}
	if s := ex.Stats(); s.FreeKVCacheBlocks != s.MaxKVCacheBlocks {
		// The stats of the cancelling iteration may land just after the response.
		time.Sleep(50 * time.Millisecond)
		if s = ex.Stats(); s.FreeKVCacheBlocks != s.MaxKVCacheBlocks {
			t.Errorf("blocks not freed: %+v", s)
		}
	}
}

func TestShutdownAnswersEveryRequest(t *testing.T) {
	ex := newExecutor(t, Config{Batch: batchmanager.Config{MaxBatchSize: 2}})
	var ids []uint64
	for range 4 {
		id, _ := ex.Enqueue(Request{InputIDs: []int32{1}, MaxNewTokens: 120, EndID: i32(-1)})
		ids = append(ids, id)
	}
	ex.Shutdown()
	for _, id := range ids {
		rs, err := ex.AwaitResponses(&id, time.Second)
		if err != nil || len(rs) != 1 || !errors.Is(rs[0].Err, batchmanager.ErrShuttingDown) {
			t.Errorf("request %d: %+v %v", id, rs, err)
		}
	}
	if _, err := ex.Enqueue(Request{InputIDs: []int32{1}, MaxNewTokens: 1}); !errors.Is(err, ErrShutdown) {
		t.Errorf("Enqueue after Shutdown: %v", err)
	}
	if _, err := ex.AwaitResponses(nil, time.Second); !errors.Is(err, ErrShutdown) {
		t.Errorf("AwaitResponses after Shutdown: %v", err)
	}
}

func TestEnqueueRejectsBadRequests(t *testing.T) {
	ex := newExecutor(t, Config{MaxQueued: 1})
	if _, err := ex.Enqueue(Request{MaxNewTokens: 1}); err == nil {
		t.Error("empty prompt accepted")
	}
	if _, err := ex.Enqueue(Request{InputIDs: []int32{1}}); err == nil {
		t.Error("MaxNewTokens 0 accepted")
	}
	id, err := ex.Enqueue(Request{InputIDs: []int32{1000}, MaxNewTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	rs := collect(t, ex, id)
	if !errors.Is(rs[0].Err, batchmanager.ErrInvalidRequest) {
		t.Errorf("out-of-vocabulary prompt: %+v", rs)
	}
}

func TestEnqueueFailsWhenTheQueueIsFull(t *testing.T) {
	ex := newExecutor(t, Config{MaxQueued: 1, Batch: batchmanager.Config{MaxBatchSize: 1}})
	run, _ := ex.Enqueue(Request{InputIDs: []int32{1}, MaxNewTokens: 100, Streaming: true, EndID: i32(-1)})
	if rs, err := ex.AwaitResponses(&run, 10*time.Second); err != nil || len(rs) == 0 {
		t.Fatalf("first token: %v %v", rs, err)
	}
	if _, err := ex.Enqueue(Request{InputIDs: []int32{1}, MaxNewTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Enqueue(Request{InputIDs: []int32{1}, MaxNewTokens: 1}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("third request: %v, want ErrQueueFull", err)
	}
}

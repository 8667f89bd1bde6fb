package batchmanager

import (
	"errors"
	"sync"
	"testing"
	"time"

	"gollm/engine"
)

// recoveringFake is a fake engine that can recover from a failed step (as the CUDA engine
// does), or not, as the test says.
type recoveringFake struct {
	*fakeEngine
	// mu guards the fields below.
	mu sync.Mutex
	// causes are the errors Recover was called with.
	causes []error
	// fail is what Recover returns.
	fail error
}

func (r *recoveringFake) Recover(cause error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.causes = append(r.causes, cause)
	return r.fail
}

var _ engine.Recoverer = (*recoveringFake)(nil)

func TestAFailedStepLetsTheEngineRecover(t *testing.T) {
	eng := &recoveringFake{fakeEngine: newFake(64, 4)}
	m, c := start(t, eng, Config{})
	eng.fakeEngine.mu.Lock()
	eng.failNext = true
	eng.fakeEngine.mu.Unlock()
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 3, PadID: -1})
	c.wait(t, 1)
	if rs := c.responses(1); len(rs) != 1 || !errors.Is(rs[0].err, ErrEngine) || errors.Is(rs[0].err, ErrEngineBroken) {
		t.Fatalf("the failed step's request: got %+v, want one final ErrEngine", rs)
	}
	c.add(&InferenceRequest{ID: 2, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 3, PadID: -1})
	c.wait(t, 1)
	got, err := c.tokensOf(t, 2)
	if err != nil || len(got) != 6 {
		t.Fatalf("after the recovery: %v, %v; want the prompt and 3 tokens", got, err)
	}
	// The failed request's answer goes out before Recover runs; the next one's after.
	eng.mu.Lock()
	causes := eng.causes
	eng.mu.Unlock()
	if len(causes) != 1 || causes[0] == nil {
		t.Fatalf("Recover was called with %v, want once with the step's error", causes)
	}
	if err := m.Broken(); err != nil {
		t.Fatalf("Broken() = %v after a recovery", err)
	}
	poolWhole(t, m)
}

func TestAnEngineThatCannotRecoverEndsTheInstance(t *testing.T) {
	eng := &recoveringFake{fakeEngine: newFake(64, 4), fail: errors.New("fake: the CUDA context is lost")}
	c := newClient()
	failed := make(chan error, 2)
	cb := c.callbacks()
	// EngineFailed comes before any client hears of the failure: the instance says it is
	// not ready before a client could retry into it.
	var answeredBefore int
	cb.EngineFailed = func(err error) {
		c.mu.Lock()
		answeredBefore = len(c.resp)
		c.mu.Unlock()
		failed <- err
	}
	// One request per iteration: the second waits while the first's step fails.
	m, err := New(eng, Config{MaxBatchSize: 1, IdleWait: time.Millisecond}, cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.m = m
	c.mu.Unlock()
	t.Cleanup(m.Shutdown)
	eng.fakeEngine.mu.Lock()
	eng.failNext = true
	eng.fakeEngine.mu.Unlock()
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{1, 2}, MaxNewTokens: 4, PadID: -1},
		&InferenceRequest{ID: 2, InputIDs: []int32{3, 4}, MaxNewTokens: 4, PadID: -1})
	c.wait(t, 2)
	if rs := c.responses(1); len(rs) != 1 || !errors.Is(rs[0].err, ErrEngine) {
		t.Errorf("the failed step's request: got %+v, want one final ErrEngine", rs)
	}
	if rs := c.responses(2); len(rs) != 1 || !rs[0].final || !errors.Is(rs[0].err, ErrEngineBroken) {
		t.Errorf("the waiting request: got %+v, want one final ErrEngineBroken", rs)
	}
	select {
	case err := <-failed:
		if !errors.Is(err, ErrEngineBroken) {
			t.Errorf("EngineFailed(%v), want ErrEngineBroken", err)
		}
		if answeredBefore != 0 {
			t.Errorf("EngineFailed was called after %d responses, want before any", answeredBefore)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("EngineFailed was not called")
	}
	if err := m.Broken(); !errors.Is(err, ErrEngineBroken) {
		t.Fatalf("Broken() = %v, want ErrEngineBroken", err)
	}
	eng.fakeEngine.mu.Lock()
	steps := eng.steps
	eng.fakeEngine.mu.Unlock()
	c.add(&InferenceRequest{ID: 3, InputIDs: []int32{5}, MaxNewTokens: 2, PadID: -1})
	c.wait(t, 1)
	if rs := c.responses(3); len(rs) != 1 || !errors.Is(rs[0].err, ErrEngineBroken) {
		t.Errorf("a later request: got %+v, want one final ErrEngineBroken", rs)
	}
	eng.fakeEngine.mu.Lock()
	after := eng.steps
	eng.fakeEngine.mu.Unlock()
	if after != steps {
		t.Errorf("the broken engine was stepped %d more times", after-steps)
	}
	select {
	case err := <-failed:
		t.Errorf("EngineFailed called again: %v", err)
	default:
	}
	poolWhole(t, m)
}

package batchmanager

import (
	"testing"
	"time"

	"gollm/engine"
)

// firstStepPrompts runs n requests that arrive gap apart into a manager with window and
// returns how many prompts its first step held, and how long the first request waited
// for that step.
func firstStepPrompts(t *testing.T, window time.Duration, maxBatch, n int, gap time.Duration) (int, time.Duration) {
	t.Helper()
	eng := newFake(256, 8)
	first := make(chan int, 1)
	var stepAt time.Time
	eng.onStep = func(b *engine.Batch) {
		if stepAt.IsZero() {
			stepAt = time.Now()
			prompts := 0
			for _, s := range b.Seqs {
				if s.Pos == 0 {
					prompts++
				}
			}
			first <- prompts
		}
	}
	_, c := start(t, eng, Config{MaxBatchSize: maxBatch, AdmissionWindow: window})
	began := time.Now()
	for i := range n {
		if i > 0 {
			time.Sleep(gap)
		}
		c.add(&InferenceRequest{ID: uint64(i + 1), InputIDs: []int32{1, 2, int32(3 + i)}, MaxNewTokens: 2, PadID: -1})
	}
	c.wait(t, n)
	eng.mu.Lock()
	defer eng.mu.Unlock()
	return <-first, stepAt.Sub(began)
}

func TestAdmissionWindowGathersABurst(t *testing.T) {
	t.Run("without a window the first arrival starts alone", func(t *testing.T) {
		if got, _ := firstStepPrompts(t, 0, 8, 6, 3*time.Millisecond); got >= 6 {
			t.Errorf("the first step held %d prompts of 6 arriving 3 ms apart; want fewer without a window", got)
		}
	})
	t.Run("a window longer than the burst starts it in one step", func(t *testing.T) {
		if got, _ := firstStepPrompts(t, 200*time.Millisecond, 8, 6, 3*time.Millisecond); got != 6 {
			t.Errorf("the first step held %d prompts, want all 6", got)
		}
	})
	t.Run("a full batch ends the window early", func(t *testing.T) {
		got, waited := firstStepPrompts(t, 10*time.Second, 4, 4, time.Millisecond)
		if got != 4 || waited > 5*time.Second {
			t.Errorf("the first step held %d prompts after %v, want 4 at once", got, waited)
		}
	})
	t.Run("a burst that has ended does not wait the window out", func(t *testing.T) {
		got, waited := firstStepPrompts(t, 800*time.Millisecond, 8, 4, 2*time.Millisecond)
		if got != 4 || waited < 200*time.Millisecond || waited > 600*time.Millisecond {
			t.Errorf("the first step held %d prompts after %v, want 4 after about 200 ms (a quarter of the window past the last)", got, waited)
		}
	})
	t.Run("a lone request waits a quarter of the window, then runs", func(t *testing.T) {
		got, waited := firstStepPrompts(t, 120*time.Millisecond, 8, 1, 0)
		if got != 1 || waited < 30*time.Millisecond || waited > 100*time.Millisecond {
			t.Errorf("the first step held %d prompts after %v, want 1 after about 30 ms", got, waited)
		}
	})
	t.Run("a negative window is refused", func(t *testing.T) {
		if _, err := New(newFake(8, 8), Config{MaxBatchSize: 1, AdmissionWindow: -time.Millisecond}, newClient().callbacks(), nil); err == nil {
			t.Error("New accepted a negative AdmissionWindow")
		}
	})
}

package batchmanager

import (
	"runtime"
	"sync"
	"testing"
	"time"
	"weak"

	"gollm/engine"
)

// TestFinishedRequestsLeaveNothingBehind: once requests that asked for every logits
// row and the top log-probabilities have ended, nothing the manager keeps (the
// scheduled list, the engine batch, what was planned ahead) holds their buffers: a
// garbage collection frees them while the manager idles. Their rows are what filled
// gigabytes that stayed live until the model was unloaded.
func TestFinishedRequestsLeaveNothingBehind(t *testing.T) {
	for _, overlap := range []bool{false, true} {
		t.Run(map[bool]string{false: "without overlap", true: "with overlap"}[overlap], func(t *testing.T) {
			eng := cpuEngine(t, 64, 8)
			var mu sync.Mutex
			var held []weak.Pointer[float32]
			var heldTokens []weak.Pointer[int32]
			finals := make(chan struct{}, 64)
			var queue []*InferenceRequest
			cb := Callbacks{
				GetInferenceRequests: func(max int) []*InferenceRequest {
					mu.Lock()
					defer mu.Unlock()
					n := len(queue)
					if max >= 0 {
						n = min(n, max)
					}
					out := queue[:n:n]
					queue = queue[n:]
					return out
				},
				// Keeps only weak pointers: the client holds nothing.
				SendResponse: func(id uint64, res Result, final bool, err error) {
					mu.Lock()
					if len(res.GenerationLogits) > 0 {
						held = append(held, weak.Make(&res.GenerationLogits[0]))
					}
					if len(res.Tokens) > 0 {
						heldTokens = append(heldTokens, weak.Make(&res.Tokens[0]))
					}
					mu.Unlock()
					if err != nil {
						t.Errorf("request %d: %v", id, err)
					}
					if final {
						finals <- struct{}{}
					}
				},
			}
			m, err := New(eng, Config{Overlap: overlap, IdleWait: time.Millisecond}, cb, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Shutdown()
			const n = 6
			mu.Lock()
			for i := range n {
				queue = append(queue, &InferenceRequest{ID: uint64(i + 1), InputIDs: []int32{1, 2, int32(3 + i)}, MaxNewTokens: 5 + i, PadID: -1,
					Streaming: i%2 == 0, ReturnGenerationLogits: true, ReturnTopLogprobs: true, TopLogprobs: 3,
					Sampling: engine.SamplingParams{Temperature: 1, Seed: uint64(i)}})
			}
			mu.Unlock()
			m.Wake()
			for range n {
				select {
				case <-finals:
				case <-time.After(20 * time.Second):
					t.Fatal("timed out")
				}
			}
			poolWhole(t, m)
			eventually(t, "the finished requests' buffers are collected", func() bool {
				runtime.GC()
				mu.Lock()
				defer mu.Unlock()
				for _, w := range held {
					if w.Value() != nil {
						return false
					}
				}
				for _, w := range heldTokens {
					if w.Value() != nil {
						return false
					}
				}
				return true
			})
		})
	}
}

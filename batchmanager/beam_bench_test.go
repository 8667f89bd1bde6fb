package batchmanager

import (
	"testing"
	"time"
)

// BenchmarkBeamSearchHost is the host's share of beam search at a GPT-2 vocabulary: 16
// requests of width 4 (64 beams a step) generating 32 tokens on a fake engine whose
// steps cost nothing, so that what it measures is the manager — scoring each beam's
// logits row (penalties, log-softmax, its best 2W) and selecting, forking and
// releasing beams. b.N runs of the whole batch; the figure to read is ns/step.
func BenchmarkBeamSearchHost(b *testing.B) {
	const reqs, width, newTokens = 16, 4, 32
	eng := newFake(4096, 8)
	eng.info.VocabSize = 50257
	steps := 0
	start := time.Now()
	for range b.N {
		c := newClient()
		m, err := New(eng, Config{MaxBatchSize: reqs * width, IdleWait: time.Millisecond}, c.callbacks(), nil)
		if err != nil {
			b.Fatal(err)
		}
		c.mu.Lock()
		c.m = m
		c.mu.Unlock()
		for i := range reqs {
			c.add(&InferenceRequest{ID: uint64(i + 1), InputIDs: []int32{1, 2, 3, int32(i)}, MaxNewTokens: newTokens,
				PadID: -1, BeamWidth: width})
		}
		for deadline := time.Now().Add(time.Minute); ; {
			c.mu.Lock()
			n := 0
			for _, f := range c.finals {
				n += f
			}
			c.mu.Unlock()
			if n == reqs {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("timed out")
			}
			time.Sleep(100 * time.Microsecond)
		}
		if rs := c.responses(1); len(rs) == 0 || rs[len(rs)-1].err != nil {
			b.Fatalf("request 1: %v", rs[len(rs)-1].err)
		}
		steps += int(m.Stats().IterationCounter)
		m.Shutdown()
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(steps), "ns/step")
}

package main

import (
	"testing"

	"gollm/bench/loadstat"
	"gollm/engine"
)

// fakeEngine returns at once, counting the sequences of its steps.
type fakeEngine struct {
	*engine.SyncPipeline
	most int
}

func (e *fakeEngine) Info() engine.Info {
	return engine.Info{VocabSize: 1000, MaxSeqLen: 4096, NumBlocks: 4096, TokensPerBlock: 16}
}
func (e *fakeEngine) Close() error { return nil }
func (e *fakeEngine) Step(b *engine.Batch) ([]engine.Output, error) {
	e.most = max(e.most, len(b.Seqs))
	outs := make([]engine.Output, len(b.Seqs))
	for i, s := range b.Seqs {
		outs[i].Token = int32(s.Pos % 1000)
		if !s.Sample {
			outs[i].Token = -1
		}
	}
	return outs, nil
}

// TestRunLoad checks the load schedule on an engine that returns at once: every request
// streams its tokens, a fixed concurrency keeps at most C sequences a step, max load
// runs them all together.
func TestRunLoad(t *testing.T) {
	maxBatch, maxNumTokens = 1024, 8192
	for _, tc := range []struct {
		name string
		most int
	}{{"load_c4_n20_i8_o5", 4}, {"load_c0_n300_i8_o5", 300}} {
		l, err := loadstat.Parse(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		e := &fakeEngine{}
		e.SyncPipeline = engine.NewSyncPipeline(e)
		var it iterations
		reqs, err := runLoad(e, l, &it)
		if err != nil {
			t.Fatal(err)
		}
		s := loadstat.Summarize(reqs)
		if s.Tokens != l.Requests*l.Out || len(s.TTFT) != l.Requests {
			t.Errorf("%s: %d tokens, %d first tokens; want %d, %d", tc.name, s.Tokens, len(s.TTFT), l.Requests*l.Out, l.Requests)
		}
		if e.most != tc.most || it.most != tc.most {
			t.Errorf("%s: at most %d sequences a step (%d by the stats), want %d", tc.name, e.most, it.most, tc.most)
		}
		// Every iteration is of one kind; every one but the last is timed; the first
		// carries the prompts.
		if it.ctx.n+it.gen.n != it.n || it.ctx.timed+it.gen.timed != it.n-1 || it.ctx.n == 0 || it.gen.n == 0 {
			t.Errorf("%s: %d iterations, %d with prompt tokens and %d decode-only (%d and %d timed)", tc.name, it.n,
				it.ctx.n, it.gen.n, it.ctx.timed, it.gen.timed)
		}
	}
}

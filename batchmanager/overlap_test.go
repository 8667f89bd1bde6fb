package batchmanager

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gollm/engine"
)

// countingPipe is an engine whose Pipeliner (SyncPipeline) counts the fed rows, so that
// a test sees the overlap happen.
type countingPipe struct {
	engine.Engine
	pipe *engine.SyncPipeline
	fed  atomic.Int64
	// most is the most tokens of one launch.
	most atomic.Int64
}

func (c *countingPipe) Launch(b *engine.Batch) error {
	n := 0
	for _, s := range b.Seqs {
		if s.Feed > 0 {
			c.fed.Add(1)
		}
		n += len(s.Tokens)
	}
	if int64(n) > c.most.Load() {
		c.most.Store(int64(n))
	}
	return c.pipe.Launch(b)
}

func (c *countingPipe) Wait() ([]engine.Output, error) { return c.pipe.Wait() }

func newCountingPipe(eng engine.Engine) *countingPipe {
	return &countingPipe{Engine: eng, pipe: engine.NewSyncPipeline(eng)}
}

// overlapWorkload mixes what the overlap schedule must keep as it was: sampled and
// greedy requests, end tokens, stop words, min lengths, log probs, generation logits,
// streaming or not, requests that cannot run ahead (penalties, beams, several
// sequences, top-p decay) and staggered arrivals.
func overlapWorkload(seed uint64) []arrival {
	rng := rand.New(rand.NewPCG(seed, 7))
	var as []arrival
	for i := range 40 {
		r := &InferenceRequest{ID: uint64(i + 1), InputIDs: randPrompt(rng, 1+rng.IntN(30), 1000),
			MaxNewTokens: 1 + rng.IntN(40), PadID: -1, Streaming: rng.IntN(2) == 0, ExcludeInputInOutput: true,
			ReturnLogProbs: rng.IntN(2) == 0}
		if rng.IntN(2) == 0 {
			r.Sampling = engine.SamplingParams{Temperature: 1.3, TopK: 40, TopP: 0.95, Seed: rng.Uint64()}
			// Tokens this random model draws often enough for some requests to end early.
			r.EndIDs = []int32{int32(rng.IntN(1000)), int32(rng.IntN(1000))}
		}
		switch rng.IntN(8) {
		case 0:
			r.Sampling.MinLength = 3
		case 1:
			r.StopWords = [][]int32{{int32(rng.IntN(1000))}}
		case 2:
			r.ReturnGenerationLogits = true
		case 3:
			r.Sampling.BadWords = [][]int32{{int32(rng.IntN(1000))}}
		}
		at := 1 + rng.IntN(60)
		// Requests that cannot run ahead stop the overlap while they run: a few, early.
		if i < 8 {
			at = 1 + rng.IntN(10)
			switch i % 4 {
			case 0:
				r.Sampling.RepetitionPenalty = 1.3
			case 1:
				r.BeamWidth = 2
			case 2:
				r.NumReturnSequences, r.Sampling.Temperature, r.Sampling.Seed = 2, 1, rng.Uint64()
			case 3:
				r.TopPDecay, r.TopPMin, r.Sampling.Temperature, r.Sampling.TopP = 0.9, 0.1, 1, 0.9
			}
		}
		as = append(as, arrival{at: at, req: r})
	}
	return as
}

// runResponses is runArrivals keeping every response of every request.
func runResponses(t *testing.T, eng engine.Engine, cfg Config, arrivals []arrival) map[uint64][]response {
	t.Helper()
	c := runToEnd(t, eng, cfg, arrivals)
	out := map[uint64][]response{}
	for _, a := range arrivals {
		rs := c.responses(a.req.ID)
		for i := range rs {
			rs[i].out.Perf = nil
		}
		out[a.req.ID] = rs
	}
	return out
}

// TestOverlapGivesTheSameResponses runs one workload with and without the overlap
// schedule on the CPU engine: every response (tokens, log probs, logits, finish
// reasons, sequence indexes, which response is final) must be the same, the pool must
// be whole after each run, and rows must have been fed ahead.
func TestOverlapGivesTheSameResponses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		blocks int
		cfg    Config
	}{
		{"guaranteed_no_evict", 256, Config{Policy: GuaranteedNoEvict}},
		{"max_utilization with a small pool", 40, Config{Policy: MaxUtilization}},
		{"chunked context and prefix reuse", 128, Config{EnableChunkedContext: true, MaxNumTokens: 24, EnableKVCacheReuse: true}},
		{"V1 (no overlap)", 256, Config{ModelType: V1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arrivals := overlapWorkload(11)
			want := runResponses(t, cpuEngine(t, tc.blocks, 8), tc.cfg, arrivals)
			cfg := tc.cfg
			cfg.Overlap = true
			eng := newCountingPipe(cpuEngine(t, tc.blocks, 8))
			got := runResponses(t, eng, cfg, arrivals)
			for _, a := range arrivals {
				id := a.req.ID
				if !reflect.DeepEqual(got[id], want[id]) {
					t.Errorf("request %d: with overlap\n%+v\nwithout\n%+v", id, got[id], want[id])
				}
			}
			if most := eng.most.Load(); tc.cfg.MaxNumTokens > 0 && most > int64(tc.cfg.MaxNumTokens) {
				t.Errorf("a launch of %d tokens; max_num_tokens is %d", most, tc.cfg.MaxNumTokens)
			}
			fed := eng.fed.Load()
			if tc.cfg.ModelType == V1 {
				if fed != 0 {
					t.Errorf("%d rows fed ahead under V1", fed)
				}
			} else if fed < 100 {
				t.Errorf("only %d rows were fed ahead; the overlap hardly ran", fed)
			}
			t.Logf("%d rows fed ahead", fed)
		})
	}
}

// TestOverlapCancellationAndShutdown stops requests while steps run ahead and shuts the
// manager down with a step ahead in flight: every request gets one final response and
// every block comes back.
func TestOverlapCancellationAndShutdown(t *testing.T) {
	eng := newCountingPipe(cpuEngine(t, 128, 8))
	m, c := start(t, eng, Config{Overlap: true})
	rng := rand.New(rand.NewPCG(3, 3))
	for i := range 16 {
		c.add(&InferenceRequest{ID: uint64(i + 1), InputIDs: randPrompt(rng, 5, 1000), MaxNewTokens: 60, PadID: -1, Streaming: true})
	}
	eventually(t, "every request streams", func() bool {
		for i := range 16 {
			if len(c.responses(uint64(i+1))) == 0 {
				return false
			}
		}
		return true
	})
	c.stop(2, 5, 9, 16)
	c.wait(t, 16)
	for i := range 16 {
		id := uint64(i + 1)
		rs := c.responses(id)
		finals := 0
		for _, r := range rs {
			if r.final {
				finals++
			}
		}
		if finals != 1 || !rs[len(rs)-1].final {
			t.Errorf("request %d: %d final responses, last final %v", id, finals, rs[len(rs)-1].final)
		}
	}
	poolWhole(t, m)
	if eng.fed.Load() == 0 {
		t.Error("no row was fed ahead")
	}

	// Shutdown with steps ahead in flight.
	for i := range 8 {
		c.add(&InferenceRequest{ID: uint64(100 + i), InputIDs: randPrompt(rng, 5, 1000), MaxNewTokens: 100, PadID: -1, Streaming: true})
	}
	eventually(t, "the new requests stream", func() bool { return len(c.responses(107)) > 2 })
	m.Shutdown()
	c.wait(t, 8)
}

// TestOverlapEngineFailuresAndPanics fails, then panics, an engine step while steps run
// ahead: the requests in flight end with ErrEngine (ErrInternal for the panic), the
// engine is asked to recover once per failure, what was launched ahead is waited for
// and discarded, and the next requests run as if nothing had happened.
func TestOverlapEngineFailuresAndPanics(t *testing.T) {
	eng := &recoveringFake{fakeEngine: newFake(64, 4)}
	// Slow enough steps that the requests are still running when the fault is set (the
	// fake's sequences end at 128 positions).
	eng.delay = time.Millisecond
	m, c := start(t, eng, Config{Overlap: true})
	for round, want := range []error{ErrEngine, ErrInternal} {
		base := uint64(10 * round)
		c.add(&InferenceRequest{ID: base + 1, InputIDs: []int32{1, 2}, MaxNewTokens: 120, PadID: -1, Streaming: true},
			&InferenceRequest{ID: base + 2, InputIDs: []int32{3}, MaxNewTokens: 120, PadID: -1, Streaming: true})
		eventually(t, "both requests stream", func() bool { return len(c.responses(base+1)) > 3 && len(c.responses(base+2)) > 3 })
		eng.fakeEngine.mu.Lock()
		if want == ErrEngine {
			eng.failNext = true
		} else {
			eng.panicNext = true
		}
		eng.fakeEngine.mu.Unlock()
		c.wait(t, 2)
		for _, id := range []uint64{base + 1, base + 2} {
			rs := c.responses(id)
			if last := rs[len(rs)-1]; !last.final || !errors.Is(last.err, want) {
				t.Fatalf("round %d, request %d: last response %+v, want a final %v", round, id, last, want)
			}
		}
		c.add(&InferenceRequest{ID: base + 3, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 5, PadID: -1})
		c.wait(t, 1)
		if got, err := c.tokensOf(t, base+3); err != nil || len(got) != 8 {
			t.Fatalf("round %d, after the failure: %v, %v; want the prompt and 5 tokens", round, got, err)
		}
		poolWhole(t, m)
	}
	eng.mu.Lock()
	causes := len(eng.causes)
	eng.mu.Unlock()
	if causes != 1 {
		t.Errorf("Recover was called %d times, want once (for the failed step; a panic resets the pool instead)", causes)
	}
}

// maxNew is request id's length in TestOverlapGoesOnUnderAStreamOfArrivals.
func maxNew(id uint64) int { return 8 + int(id*7%13) }

// TestOverlapGoesOnUnderAStreamOfArrivals keeps 16 requests in flight, a new one sent as
// each ends (perf_analyzer's closed loop): arrivals join the step launched ahead, so
// almost every generated token comes from a fed row, and every request gets its tokens.
func TestOverlapGoesOnUnderAStreamOfArrivals(t *testing.T) {
	const total, inFlight = 200, 16
	eng := newCountingPipe(newFake(512, 4))
	c := newClient()
	cb := c.callbacks()
	var sent atomic.Int64
	mk := func() *InferenceRequest {
		id := uint64(sent.Add(1))
		// Lengths that differ, so that requests end, and others arrive, at every few steps.
		return &InferenceRequest{ID: id, InputIDs: []int32{int32(id % 7), 3, 4}, MaxNewTokens: maxNew(id), PadID: -1, Streaming: true}
	}
	send := cb.SendResponse
	cb.SendResponse = func(id uint64, res Result, final bool, err error) {
		send(id, res, final, err)
		if final && sent.Load() < total {
			c.add(mk())
		}
	}
	m, err := New(eng, Config{Overlap: true, IdleWait: 100e3}, cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	c.mu.Lock()
	c.m = m
	c.mu.Unlock()
	for range inFlight {
		c.add(mk())
	}
	c.wait(t, total)
	generated := 0
	for id := uint64(1); id <= total; id++ {
		toks, err := c.tokensOf(t, id)
		if err != nil || len(toks) != maxNew(id) {
			t.Fatalf("request %d: %d tokens, %v; want %d", id, len(toks), err, maxNew(id))
		}
		generated += len(toks)
	}
	// Each request's first token comes from its prompt's row; the others may be fed.
	fed, feedable := int(eng.fed.Load()), generated-total
	t.Logf("%d of %d tokens after the first came from rows fed ahead", fed, feedable)
	if fed < feedable*8/10 {
		t.Errorf("only %d of %d tokens came from rows fed ahead; arrivals stop the overlap", fed, feedable)
	}
	poolWhole(t, m)
}

// launchFailing is a fake engine whose launch of a fed step fails once when told to (a
// CUDA error while a step is enqueued ahead).
type launchFailing struct {
	*recoveringFake
	pipe    *engine.SyncPipeline
	failFed atomic.Bool
}

func (l *launchFailing) Launch(b *engine.Batch) error {
	if slices.ContainsFunc(b.Seqs, func(s engine.Sequence) bool { return s.Feed > 0 }) && l.failFed.CompareAndSwap(true, false) {
		return errors.New("injected: launch ahead failed")
	}
	return l.pipe.Launch(b)
}

func (l *launchFailing) Wait() ([]engine.Output, error) { return l.pipe.Wait() }

// TestOverlapFailedLaunchAheadFailsTheRequestsInFlight fails the launch of a step ahead:
// like any failed step, the requests in flight end with ErrEngine, the engine is asked
// to recover, and the next request runs.
func TestOverlapFailedLaunchAheadFailsTheRequestsInFlight(t *testing.T) {
	rf := &recoveringFake{fakeEngine: newFake(64, 4)}
	rf.delay = time.Millisecond
	eng := &launchFailing{recoveringFake: rf, pipe: engine.NewSyncPipeline(rf)}
	m, c := start(t, eng, Config{Overlap: true})
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{1, 2}, MaxNewTokens: 100, PadID: -1, Streaming: true},
		&InferenceRequest{ID: 2, InputIDs: []int32{3}, MaxNewTokens: 100, PadID: -1, Streaming: true})
	eventually(t, "both requests stream", func() bool { return len(c.responses(1)) > 3 && len(c.responses(2)) > 3 })
	eng.failFed.Store(true)
	c.wait(t, 2)
	for _, id := range []uint64{1, 2} {
		rs := c.responses(id)
		if last := rs[len(rs)-1]; !last.final || !errors.Is(last.err, ErrEngine) || !strings.Contains(last.err.Error(), "launch ahead failed") {
			t.Fatalf("request %d: last response %+v, want a final ErrEngine naming the failed launch", id, last)
		}
	}
	rf.mu.Lock()
	causes := len(rf.causes)
	rf.mu.Unlock()
	if causes != 1 {
		t.Errorf("Recover was called %d times, want once", causes)
	}
	c.add(&InferenceRequest{ID: 3, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 5, PadID: -1})
	c.wait(t, 1)
	if got, err := c.tokensOf(t, 3); err != nil || len(got) != 8 {
		t.Fatalf("after the failure: %v, %v; want the prompt and 5 tokens", got, err)
	}
	poolWhole(t, m)
}

// TestPlanAheadLeavesNoRunningRequestBehind plans the step after a step that left a
// running request out (the scheduler's token budget can): no step is launched ahead,
// since it would continue only the rows of the step before and the request left out
// would wait for as long as steps run ahead. With every running request in the step, the
// step ahead feeds each one.
func TestPlanAheadLeavesNoRunningRequestBehind(t *testing.T) {
	m, err := newManager(newFake(32, 4), Config{Overlap: true}, Callbacks{
		GetInferenceRequests: func(int) []*InferenceRequest { return nil },
		SendResponse:         func(uint64, Result, bool, error) {},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var base []engine.Sequence
	var refs []seqRef
	for id := range uint64(2) {
		r, err := m.newRequest(&InferenceRequest{ID: id + 1, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 8, PadID: -1})
		if err != nil {
			t.Fatal(err)
		}
		r.kv = m.pool.Add(r.tokens[:r.promptLen], false)
		r.tokens = append(r.tokens, 7)
		r.generated, r.computed, r.n, r.phase = 1, 3, 1, phaseRunning
		if err := r.kv.Reserve(4); err != nil {
			t.Fatal(err)
		}
		m.running = append(m.running, r)
		base = append(base, engine.Sequence{ID: r.id, Tokens: r.tokens[3:4], Pos: 3, Blocks: r.kv.Blocks(), Sample: true, NumGenerated: 1})
		refs = append(refs, seqRef{r, &r.branch})
	}
	if a := m.planAhead(base[:1], refs[:1]); a != nil {
		t.Fatalf("a step ahead of %d rows was planned with a running request left out", len(a.batch.Seqs))
	}
	a := m.planAhead(base, refs)
	if a == nil || len(a.batch.Seqs) != 2 || a.batch.Seqs[0].Feed != 1 || a.batch.Seqs[1].Feed != 2 {
		t.Fatalf("with every running request in the step: %+v, want two rows fed from rows 1 and 2", a)
	}
}

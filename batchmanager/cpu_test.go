package batchmanager

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/model"
)

func TestMain(m *testing.M) {
	// The CPU engine's matrix helpers (engine/cpu's pool) live as long as the process,
	// GOMAXPROCS-1 of them at most, as the runtime's own workers do.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("gollm/engine/cpu.(*pool).helper"))
}

// tinyDir is the tiny random GPT-2 checkpoint (vocab 1000, 128 positions).
const tinyDir = "../testdata/gpt2-tiny"

var (
	tinyOnce  sync.Once
	tinyModel *model.Float32
	tinyErr   error
)

// tinyGPT2 loads the checkpoint once; engines share its (read-only) weights.
func tinyGPT2(t testing.TB) *model.Float32 {
	t.Helper()
	tinyOnce.Do(func() { tinyModel, tinyErr = model.LoadFloat32(tinyDir) })
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return tinyModel
}

// cpuEngine is a CPU engine on the tiny checkpoint with the given pool.
func cpuEngine(t testing.TB, blocks, perBlock int) *cpu.Engine {
	t.Helper()
	e, err := cpu.NewFromModel(tinyGPT2(t), engine.KVConfig{NumBlocks: blocks, TokensPerBlock: perBlock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// soloGreedy runs one request straight on a fresh engine, without the manager: the
// reference its in-flight run must match.
func soloGreedy(t testing.TB, prompt []int32, maxNew int) []int32 {
	t.Helper()
	return soloRun(t, cpuEngine(t, 16, 8), prompt, maxNew, engine.SamplingParams{})
}

// soloRun runs one request straight on e, a fresh engine of 16 blocks of 8 positions,
// with sampling sp, until maxNew tokens or the model's length; it does not stop at an
// end token.
func soloRun(t testing.TB, e engine.Engine, prompt []int32, maxNew int, sp engine.SamplingParams) []int32 {
	t.Helper()
	return soloRunTopP(t, e, prompt, maxNew, sp, nil)
}

// soloRunTopP is soloRun with step k drawn at the top-p topP(k, tokens so far) (nil:
// sp's own).
func soloRunTopP(t testing.TB, e engine.Engine, prompt []int32, maxNew int, sp engine.SamplingParams, topP func(k int, out []int32) float32) []int32 {
	t.Helper()
	blocks := make([]int32, 16)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	hist := slices.Clone(prompt)
	toks, pos := prompt, 0
	var out []int32
	for len(out) < maxNew && len(hist) < e.Info().MaxSeqLen {
		p := sp
		if topP != nil {
			p.TopP = topP(len(out), out)
		}
		outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: toks, Pos: pos, Blocks: blocks, Sample: true,
			Sampling: p, History: hist, NumGenerated: len(out)}}})
		if err != nil {
			t.Fatal(err)
		}
		pos += len(toks)
		tok := outs[0].Token
		hist = append(hist, tok)
		out = append(out, tok)
		toks = hist[len(hist)-1:]
	}
	return out
}

// arrival is a request that the client hands out from a given Get call on.
type arrival struct {
	// at is the GetInferenceRequests call from which it is available.
	at int
	// req is handed out as it is.
	req *InferenceRequest
}

// runArrivals runs requests arriving at the given Get calls (iterations) and returns
// every request's tokens and the typed stats of the run.
func runArrivals(t *testing.T, eng engine.Engine, cfg Config, arrivals []arrival) (map[uint64][]int32, []Stats) {
	t.Helper()
	c := runToEnd(t, eng, cfg, arrivals)
	out := map[uint64][]int32{}
	for _, a := range arrivals {
		toks, err := c.tokensOf(t, a.req.ID)
		if err != nil {
			t.Fatalf("request %d: %v", a.req.ID, err)
		}
		out[a.req.ID] = toks
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return out, slices.Clone(c.typed)
}

// runToEnd runs requests arriving at the given Get calls until each has had its final
// response, checks that every KV block came back, and returns the client that heard
// them.
func runToEnd(t *testing.T, eng engine.Engine, cfg Config, arrivals []arrival) *client {
	t.Helper()
	c := newClient()
	cfg.IdleWait = 100 * time.Microsecond
	m, err := New(eng, cfg, arrivalCallbacks(c, arrivals), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	c.wait(t, len(arrivals))
	poolWhole(t, m)
	return c
}

// arrivalCallbacks are c's callbacks with the arrivals handed out from their Get calls
// on.
func arrivalCallbacks(c *client, arrivals []arrival) Callbacks {
	calls := 0
	cb := c.callbacks()
	get := cb.GetInferenceRequests
	pending := slices.Clone(arrivals)
	cb.GetInferenceRequests = func(max int) []*InferenceRequest {
		calls++
		var now []*InferenceRequest
		rest := pending[:0]
		for _, a := range pending {
			if a.at <= calls {
				now = append(now, a.req)
			} else {
				rest = append(rest, a)
			}
		}
		pending = rest
		c.add(now...)
		return get(max)
	}
	return cb
}

// probeWorkload is a probe arriving first and 31 requests with random prompt and
// output lengths arriving at random iterations.
func probeWorkload(seed uint64, maxPrompt int) []arrival {
	rng := rand.New(rand.NewPCG(seed, 99))
	probe := &InferenceRequest{ID: 1000, InputIDs: randPrompt(rng, 12, 1000), MaxNewTokens: 24, PadID: -1, ExcludeInputInOutput: true}
	as := []arrival{{at: 1 + rng.IntN(3), req: probe}}
	for i := range 31 {
		as = append(as, arrival{at: 1 + rng.IntN(40), req: &InferenceRequest{
			ID: uint64(i), InputIDs: randPrompt(rng, 1+rng.IntN(maxPrompt), 1000), MaxNewTokens: 1 + rng.IntN(30),
			PadID: -1, Streaming: i%2 == 1, ExcludeInputInOutput: true,
		}})
	}
	return as
}

func TestInflightTokensMatchSoloRuns(t *testing.T) {
	arrivals := probeWorkload(7, 40)
	want := map[uint64][]int32{}
	for _, a := range arrivals {
		want[a.req.ID] = soloGreedy(t, a.req.InputIDs, a.req.MaxNewTokens)
	}
	maxPaused := func(st []Stats) (paused, ctxWithGen int) {
		for _, s := range st {
			paused = max(paused, s.PausedRequests)
			if s.ContextRequests > 0 && s.GenerationRequests > 0 {
				ctxWithGen++
			}
		}
		return paused, ctxWithGen
	}
	cases := []struct {
		name   string
		blocks int
		cfg    Config
		check  func(t *testing.T, st []Stats)
	}{
		{"guaranteed_no_evict with a roomy pool", 256, Config{Policy: GuaranteedNoEvict}, nil},
		{"max_utilization with a pool so small that requests pause and resume", 24, Config{Policy: MaxUtilization},
			func(t *testing.T, st []Stats) {
				if p, _ := maxPaused(st); p == 0 {
					t.Error("no request was ever paused; the test needs pauses")
				}
			}},
		{"guaranteed_no_evict with the same small pool never pauses", 24, Config{Policy: GuaranteedNoEvict},
			func(t *testing.T, st []Stats) {
				if p, _ := maxPaused(st); p != 0 {
					t.Errorf("%d requests paused under guaranteed_no_evict", p)
				}
			}},
		{"chunked context mixed with generation steps", 256, Config{EnableChunkedContext: true, MaxNumTokens: 16},
			func(t *testing.T, st []Stats) {
				if _, mixed := maxPaused(st); mixed == 0 {
					t.Error("no iteration mixed context chunks with generation steps")
				}
				for _, s := range st {
					if s.TotalContextTokens+s.GenerationRequests > 16 {
						t.Fatalf("iteration %d ran %d tokens, max_num_tokens is 16", s.IterationCounter, s.TotalContextTokens+s.GenerationRequests)
					}
				}
			}},
		{"max_utilization with chunked context and a small pool", 24, Config{Policy: MaxUtilization, EnableChunkedContext: true, MaxNumTokens: 16}, nil},
		{"inflight_batching with prefix reuse on", 64, Config{ModelType: InflightBatching, EnableKVCacheReuse: true}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, st := runArrivals(t, cpuEngine(t, tc.blocks, 8), tc.cfg, arrivals)
			if !slices.Equal(got[1000], want[1000]) {
				t.Errorf("probe: got %v, want %v", got[1000], want[1000])
			}
			for id, w := range want {
				if !slices.Equal(got[id], w) {
					t.Errorf("request %d: got %v, want %v", id, got[id], w)
				}
			}
			if tc.check != nil {
				tc.check(t, st)
			}
		})
	}
}

func TestStaticBatchAdmitsNothingUntilTheBatchFinishes(t *testing.T) {
	eng := newFake(256, 4)
	rec := recordSteps(eng)
	rng := rand.New(rand.NewPCG(5, 5))
	var as []arrival
	for i := range 12 {
		as = append(as, arrival{at: 1 + rng.IntN(20), req: &InferenceRequest{ID: uint64(i), InputIDs: randPrompt(rng, 1+rng.IntN(8), 50),
			MaxNewTokens: 1 + rng.IntN(12), PadID: -1}})
	}
	runArrivals(t, eng, Config{Policy: StaticBatch, MaxBatchSize: 4}, as)
	eng.mu.Lock()
	defer eng.mu.Unlock()
	steps := *rec
	batches := 0
	for k := 1; k < len(steps); k++ {
		prev, cur := steps[k-1], steps[k]
		newcomer := false
		for _, id := range cur {
			if !slices.Contains(prev, id) {
				newcomer = true
			}
		}
		if !newcomer {
			continue
		}
		batches++
		// A new batch: nothing of the previous one may run any more.
		for _, later := range steps[k:] {
			for _, id := range prev {
				if slices.Contains(later, id) {
					t.Fatalf("step %d admitted %v while %d of the batch %v still ran", k, cur, id, prev)
				}
			}
		}
	}
	if batches < 2 {
		t.Errorf("only %d batches formed; the test wants several", batches+1)
	}
}

func TestV1PadsAndRunsInLockstep(t *testing.T) {
	eng := newFake(256, 4)
	rec := recordSteps(eng)
	c := newClient()
	finalAt := map[uint64]int{}
	cb := c.callbacks()
	send := cb.SendResponse
	cb.SendResponse = func(id uint64, out Result, final bool, err error) {
		if final {
			eng.mu.Lock() // Step has returned; read its counter
			finalAt[id] = eng.steps
			eng.mu.Unlock()
		}
		send(id, out, final, err)
	}
	reqs := []*InferenceRequest{
		{ID: 1, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 3, PadID: 49},
		{ID: 2, InputIDs: []int32{4}, MaxNewTokens: 9, PadID: 49},
		{ID: 3, InputIDs: []int32{5, 6}, MaxNewTokens: 6, PadID: 49, Streaming: true},
	}
	c.add(reqs...)
	m, err := New(eng, Config{ModelType: V1, IdleWait: time.Millisecond}, cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	c.wait(t, 3)
	// A late request must wait for the whole batch.
	c.add(&InferenceRequest{ID: 4, InputIDs: []int32{7}, MaxNewTokens: 2, PadID: 49})
	c.wait(t, 1)

	t.Run("every answer of a batch goes out at the same iteration", func(t *testing.T) {
		for id := range uint64(5) {
			for _, r := range c.responses(id) {
				if r.err != nil {
					t.Fatalf("request %d: %v", id, r.err)
				}
			}
		}
		if finalAt[1] != finalAt[2] || finalAt[2] != finalAt[3] {
			t.Errorf("finals at steps %v", finalAt)
		}
	})
	t.Run("the batch steps together and shrinks only as members finish", func(t *testing.T) {
		eng.mu.Lock()
		steps := *rec
		eng.mu.Unlock()
		if !slices.Equal(steps[0], []uint64{1, 2, 3}) {
			t.Errorf("first step ran %v", steps[0])
		}
		for k := 1; k < 9; k++ {
			want := []uint64{2}
			if k < 3 {
				want = []uint64{1, 2, 3}
			} else if k < 6 {
				want = []uint64{2, 3}
			}
			if !slices.Equal(steps[k], want) {
				t.Errorf("step %d ran %v, want %v", k, steps[k], want)
			}
		}
		if !slices.Equal(steps[9], []uint64{4}) {
			t.Errorf("after the batch, step 9 ran %v, want the late request alone", steps[9])
		}
	})
	t.Run("non-streaming outputs are padded with pad_id to the longest", func(t *testing.T) {
		rs := c.responses(1)
		ids, sl := rs[0].out.Tokens, rs[0].out.Length
		gen := fakeGenerate([]int32{1, 2, 3}, 3, 50, 128, -1, nil)
		want := append(append([]int32{1, 2, 3}, gen...), slices.Repeat([]int32{49}, 6)...)
		if !slices.Equal(ids, want) || sl != 6 {
			t.Errorf("output_ids %v sequence_length %v, want %v and 6", ids, sl, want)
		}
	})
	t.Run("the stats carry the V1 fields", func(t *testing.T) {
		c.mu.Lock()
		defer c.mu.Unlock()
		empty := 0
		for _, s := range c.stats {
			var f map[string]any
			if err := json.Unmarshal([]byte(s), &f); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"Total Generation Tokens", "Empty Generation Slots", "Scheduled Requests", "Context Requests", "Total Context Tokens"} {
				if _, ok := f[k]; !ok {
					t.Fatalf("V1 stats lack %q: %s", k, s)
				}
			}
			if _, ok := f["MicroBatch ID"]; ok {
				t.Fatalf("V1 stats carry MicroBatch ID: %s", s)
			}
			empty = max(empty, int(f["Empty Generation Slots"].(float64)))
		}
		if empty != 2 {
			t.Errorf("most empty generation slots %d, want 2 (requests 1 and 3 finished early)", empty)
		}
	})
}

// recordSteps makes eng record the sequence IDs of every step it runs.
func recordSteps(eng *fakeEngine) *[][]uint64 {
	var steps [][]uint64
	eng.onStep = func(b *engine.Batch) {
		var ids []uint64
		for _, s := range b.Seqs {
			ids = append(ids, s.ID)
		}
		steps = append(steps, ids)
	}
	return &steps
}

// TestTensorParallelEngineUnderTheManager runs the probe workload through the batch
// manager on the CPU engine split over 2 ranks (cpu.TensorParallel): the shared block
// tables address each rank's own KV heads, and every request gets its solo greedy tokens.
func TestTensorParallelEngineUnderTheManager(t *testing.T) {
	ck, err := model.Open(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ws, err := ck.Weights()
	if err != nil {
		t.Fatal(err)
	}
	tp, err := cpu.NewTensorParallel(&ck.Config, ws, 2, engine.KVConfig{NumBlocks: 64, TokensPerBlock: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	arrivals := probeWorkload(7, 40)
	got, _ := runArrivals(t, tp, Config{EnableKVCacheReuse: true}, arrivals)
	for _, a := range arrivals {
		if want := soloGreedy(t, a.req.InputIDs, a.req.MaxNewTokens); !slices.Equal(got[a.req.ID], want) {
			t.Errorf("request %d: got %v, want %v", a.req.ID, got[a.req.ID], want)
		}
	}
}

// TestEveryEndIDOfTheCheckpointEndsASequence runs llama3-tiny, whose
// generation_config.json lists two end tokens, [2, 3], under the manager with them as
// the request's EndIDs (as the backend sets them). An embedding bias of +1000 on one end
// token makes greedy take it as soon as min_length (4) no longer masks the end tokens:
// each end token, the second as well as the first, ends the sequence there and is left
// out; a request whose EndIDs lack it generates it instead.
func TestEveryEndIDOfTheCheckpointEndsASequence(t *testing.T) {
	const dir = "../testdata/llama3-tiny"
	m, err := model.LoadFloat32(dir)
	if err != nil {
		t.Fatal(err)
	}
	gen, err := model.LoadGeneration(dir, m.Config.VocabSize)
	if err != nil {
		t.Fatal(err)
	}
	ends := gen.EOSIDs
	if len(ends) < 2 {
		t.Fatalf("%s lists end tokens %v; the test needs two", dir, ends)
	}
	newEngine := func() engine.Engine {
		e, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: 16, TokensPerBlock: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	const minLen, maxNew = 4, 10
	prompt := []int32{1, 17, 401, 99, 250, 12}
	// Greedy with the end tokens masked, which the biased requests follow until min_length.
	masked := soloRun(t, newEngine(), prompt, minLen, engine.SamplingParams{MinLength: minLen, EndIDs: ends})
	for _, end := range ends {
		bias := make([]float32, m.Config.VocabSize)
		bias[end] = 1000
		others := slices.DeleteFunc(slices.Clone(ends), func(id int32) bool { return id == end })
		_, c := start(t, newEngine(), Config{})
		var reqs []*InferenceRequest
		for i, streaming := range []bool{false, true} {
			sp := engine.SamplingParams{MinLength: minLen, EmbeddingBias: bias}
			reqs = append(reqs,
				&InferenceRequest{ID: uint64(2 * i), InputIDs: prompt, MaxNewTokens: maxNew, Sampling: sp, EndIDs: ends,
					PadID: -1, Streaming: streaming, ExcludeInputInOutput: true},
				&InferenceRequest{ID: uint64(2*i + 1), InputIDs: prompt, MaxNewTokens: maxNew, Sampling: sp, EndIDs: others,
					PadID: -1, Streaming: streaming, ExcludeInputInOutput: true})
		}
		c.add(reqs...)
		c.wait(t, len(reqs))
		for _, r := range reqs {
			got, err := c.tokensOf(t, r.ID)
			if err != nil {
				t.Fatalf("end %d, request %d: %v", end, r.ID, err)
			}
			rs := c.responses(r.ID)
			finish := rs[len(rs)-1].out.Finish
			if slices.Contains(r.EndIDs, end) {
				if !slices.Equal(got, masked) || finish != FinishedEndID {
					t.Errorf("end %d among EndIDs %v (streaming %v): %v finished %v; want %v, then END_ID", end, r.EndIDs, r.Streaming, got, finish, masked)
				}
				continue
			}
			if len(got) != maxNew || slices.ContainsFunc(got, func(tok int32) bool { return tok != end }) || finish != FinishedLength {
				t.Errorf("end %d not among EndIDs %v (streaming %v): %v finished %v; want %d × %d, then LENGTH", end, r.EndIDs, r.Streaming, got, finish, maxNew, end)
			}
		}
	}
}

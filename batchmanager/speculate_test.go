package batchmanager

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/model"
	"gollm/speculate"
	"gollm/tokenizer"
)

// oracle proposes each sequence's true continuation (computed beforehand, without the
// manager), spoiling some proposals on purpose, so that steps accept runs of tokens of
// every length and stop conditions fall inside them.
type oracle struct {
	// mu guards the fields below (the test reads them after the run).
	mu sync.Mutex
	// future is each request's continuation after its prompt, by request ID.
	future map[uint64][]int32
	// asked counts Propose's requests by key; forgotten the Forget calls.
	asked, forgotten map[uint64]int
	// resets counts Reset calls; closed says Close was called.
	resets int
	closed bool
	// maxSeen is the largest Max asked for.
	maxSeen int
}

func newOracle() *oracle {
	return &oracle{future: map[uint64][]int32{}, asked: map[uint64]int{}, forgotten: map[uint64]int{}}
}

func (o *oracle) Propose(reqs []*speculate.Request) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, r := range reqs {
		o.asked[r.Key]++
		o.maxSeen = max(o.maxSeen, r.Max)
		f := o.future[r.Key]
		g := r.NumGenerated
		r.Draft = r.Draft[:0]
		for i := 0; i < r.Max && g+i < len(f); i++ {
			t := f[g+i]
			if (g+i)%5 == 3 {
				t = (t + 1) % 1000 // a wrong proposal now and then
			}
			r.Draft = append(r.Draft, t)
		}
	}
	return nil
}

func (o *oracle) Forget(key uint64) {
	o.mu.Lock()
	o.forgotten[key]++
	o.mu.Unlock()
}

func (o *oracle) Reset() {
	o.mu.Lock()
	o.resets++
	o.mu.Unlock()
}

func (o *oracle) Close() error {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	return nil
}

// stopAfter is a TextStopper that ends a sequence once its output holds tok.
type stopAfter struct{ tok int32 }

func (s stopAfter) Stopped(_ int, gen []int32) bool { return slices.Contains(gen, s.tok) }

// specWorkload is a mix of requests whose every stop condition falls inside the runs of
// tokens speculation accepts: greedy and sampled (penalties, top-k), end tokens, stop
// words and strings, min length, the length limits, log-probabilities, generation
// logits, streaming. future gives each request's continuation without stopping.
func specWorkload(t *testing.T, rng *rand.Rand) ([]*InferenceRequest, map[uint64][]int32) {
	t.Helper()
	future := map[uint64][]int32{}
	var reqs []*InferenceRequest
	add := func(r *InferenceRequest) {
		r.ID = uint64(len(reqs) + 1)
		r.PadID = -1
		sp := r.Sampling
		sp.EndIDs = r.EndIDs
		future[r.ID] = soloRun(t, cpuEngine(t, 16, 8), r.InputIDs, 60, sp)
		reqs = append(reqs, r)
	}
	sampled := engine.SamplingParams{Temperature: 0.8, TopK: 40, RepetitionPenalty: 1.1, Seed: 77}
	for i := range 2 {
		// A prompt that repeats itself, so that greedy output soon loops.
		base := randPrompt(rng, 6, 1000)
		prompt := append(append(slices.Clone(base), base...), base...)
		add(&InferenceRequest{InputIDs: prompt, MaxNewTokens: 40, Streaming: i == 0, ReturnLogProbs: true})
		add(&InferenceRequest{InputIDs: prompt, MaxNewTokens: 35, Sampling: sampled, ReturnLogProbs: true, ReturnGenerationLogits: true})
	}
	for i := range 3 {
		prompt := randPrompt(rng, 5+i, 1000)
		probe := soloRun(t, cpuEngine(t, 16, 8), prompt, 40, engine.SamplingParams{})
		add(&InferenceRequest{InputIDs: prompt, MaxNewTokens: 40, StopWords: [][]int32{probe[9+i : 11+i]}, Streaming: i == 1})
		add(&InferenceRequest{InputIDs: prompt, MaxNewTokens: 40, EndIDs: []int32{probe[7+i]}, Streaming: true, ReturnLogProbs: true})
		add(&InferenceRequest{InputIDs: prompt, MaxNewTokens: 4 + i, ReturnLogProbs: true})
		add(&InferenceRequest{InputIDs: prompt, MaxNewTokens: 40, EndIDs: []int32{probe[2]},
			Sampling: engine.SamplingParams{MinLength: 6}, Streaming: i == 2})
		add(&InferenceRequest{InputIDs: prompt, MaxNewTokens: 40, TextStop: stopAfter{probe[12+i]}, Streaming: true})
	}
	// The model's length limit (128 positions) inside a run.
	add(&InferenceRequest{InputIDs: randPrompt(rng, 117, 1000), MaxNewTokens: 60, Streaming: true})
	// A request that opts out.
	add(&InferenceRequest{InputIDs: randPrompt(rng, 9, 1000), MaxNewTokens: 20, NoSpeculation: true, ExcludeInputInOutput: true})
	return reqs, future
}

// runWith runs reqs on a fresh engine under cfg and returns every request's responses.
func runWith(t *testing.T, blocks int, cfg Config, reqs []*InferenceRequest) (map[uint64][]response, []Stats) {
	t.Helper()
	var arrivals []arrival
	for i, r := range reqs {
		arrivals = append(arrivals, arrival{at: 1 + i%7, req: r})
	}
	c := runToEnd(t, cpuEngine(t, blocks, 8), cfg, arrivals)
	out := map[uint64][]response{}
	for _, r := range reqs {
		rs := c.responses(r.ID)
		for i := range rs {
			rs[i].out.Perf = nil
		}
		out[r.ID] = rs
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return out, slices.Clone(c.typed)
}

// TestSpeculationChangesNoResponse: a workload run with proposals — true continuations
// with every fifth token wrong, so that steps accept runs of every length and end
// tokens, stop words and strings, min length and both length limits fall inside the
// runs — gives every request exactly the responses it gets without speculation:
// tokens, one streaming response per token, log-probabilities and their sums,
// generation logits, finish reasons; under every policy, with prefix reuse, with the
// overlap schedule and with chunked context. Proposals were made and accepted, a
// request that opted out was never asked for, and every KV block came back.
func TestSpeculationChangesNoResponse(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	reqs, future := specWorkload(t, rng)
	cases := []struct {
		name   string
		blocks int
		cfg    Config
	}{
		{"guaranteed_no_evict", 96, Config{}},
		{"max_utilization with a short pool", 40, Config{Policy: MaxUtilization}},
		{"prefix reuse", 96, Config{EnableKVCacheReuse: true}},
		{"overlap", 96, Config{Overlap: true}},
		{"chunked context under a token budget", 96, Config{EnableChunkedContext: true, MaxNumTokens: 24}},
		{"stream interval 3", 96, Config{StreamInterval: 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want, _ := runWith(t, c.blocks, c.cfg, reqs)
			o := newOracle()
			o.future = future
			cfg := c.cfg
			cfg.Speculation = Speculation{Proposer: o, MaxDraft: 6}
			got, stats := runWith(t, c.blocks, cfg, reqs)
			for _, r := range reqs {
				if err := sameResponses(got[r.ID], want[r.ID]); err != nil {
					t.Errorf("request %d: %v", r.ID, err)
				}
			}
			var drafted, accepted int
			for _, s := range stats {
				drafted += s.DraftTokens
				accepted += s.AcceptedDraftTokens
			}
			last := stats[len(stats)-1]
			if accepted == 0 || accepted == drafted || uint64(drafted) != last.DraftTokensTotal || uint64(accepted) != last.AcceptedDraftTokensTotal {
				t.Errorf("stats: %d of %d proposals accepted (totals %d of %d); want some accepted and some not",
					accepted, drafted, last.AcceptedDraftTokensTotal, last.DraftTokensTotal)
			}
			o.mu.Lock()
			defer o.mu.Unlock()
			if n := o.asked[reqs[len(reqs)-1].ID]; n != 0 {
				t.Errorf("the request that opted out was asked for proposals %d times", n)
			}
			if !o.closed {
				t.Error("Shutdown did not close the proposer")
			}
			for _, r := range reqs {
				if o.asked[r.ID] > 0 && o.forgotten[r.ID] == 0 {
					t.Errorf("request %d ended without the proposer forgetting it", r.ID)
				}
			}
			t.Logf("%d of %d proposals accepted over %d iterations", accepted, drafted, len(stats))
		})
	}
}

// sameResponses compares two runs' responses of one request.
func sameResponses(got, want []response) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d responses, want %d:\n got  %s\n want %s", len(got), len(want), describe(got), describe(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.final != w.final || fmt.Sprint(g.err) != fmt.Sprint(w.err) || !reflect.DeepEqual(g.out, w.out) {
			return fmt.Errorf("response %d differs:\n got  %+v (final %v, err %v)\n want %+v (final %v, err %v)", i, g.out, g.final, g.err, w.out, w.final, w.err)
		}
	}
	return nil
}

// describe lists responses' token counts and flags.
func describe(rs []response) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "[%d tok %v final %v] ", len(r.out.Tokens), r.out.Finish, r.final)
	}
	return b.String()
}

// TestSpeculationShrinksAsTheBatchGrows: proposals per sequence follow the step budget
// — many at batch 1, fewer as sequences join, none once the generating sequences alone
// reach it — and never more than num_speculative_tokens.
func TestSpeculationShrinksAsTheBatchGrows(t *testing.T) {
	m := &Manager{cfg: Config{Speculation: Speculation{Proposer: newOracle(), MaxDraft: 6, MaxStepTokens: 32}}}
	for _, c := range []struct{ g, s, want int }{
		{1, 1, 6}, {4, 4, 6}, {8, 8, 3}, {16, 16, 1}, {16, 2, 6}, {31, 1, 1}, {32, 32, 0}, {64, 64, 0}, {3, 0, 0},
	} {
		if got := m.perSequenceDraft(c.g, c.s); got != c.want {
			t.Errorf("%d generating, %d speculating: %d proposals each, want %d", c.g, c.s, got, c.want)
		}
	}
	// Through the manager: 40 greedy requests at once propose nothing while they all
	// generate, and the run's tokens are those without speculation.
	rng := rand.New(rand.NewPCG(8, 9))
	var reqs []*InferenceRequest
	o := newOracle()
	for i := range 40 {
		p := randPrompt(rng, 4, 1000)
		r := &InferenceRequest{ID: uint64(i + 1), InputIDs: p, MaxNewTokens: 6, PadID: -1}
		o.future[r.ID] = soloGreedy(t, p, 6)
		reqs = append(reqs, r)
	}
	var arrivals []arrival
	for _, r := range reqs {
		arrivals = append(arrivals, arrival{at: 1, req: r})
	}
	c := runToEnd(t, cpuEngine(t, 200, 8), Config{Speculation: Speculation{Proposer: o, MaxDraft: 4}}, arrivals)
	for _, s := range c.typed {
		if s.GenerationRequests >= DefaultMaxStepTokens && s.DraftTokens > 0 {
			t.Errorf("iteration %d: %d generating sequences carried %d proposals", s.IterationCounter, s.GenerationRequests, s.DraftTokens)
		}
	}
	if o.maxSeen > 4 {
		t.Errorf("a request was asked for %d proposals, num_speculative_tokens is 4", o.maxSeen)
	}
	for _, r := range reqs {
		got, err := c.tokensOf(t, r.ID)
		if err != nil || !slices.Equal(got, append(slices.Clone(r.InputIDs), o.future[r.ID]...)) {
			t.Errorf("request %d: %v (%v), want %v", r.ID, got, err, o.future[r.ID])
		}
	}
}

// TestSpeculationConfigIsChecked: a bad speculation setting fails New with a message
// naming it.
func TestSpeculationConfigIsChecked(t *testing.T) {
	cb := newClient().callbacks()
	for _, c := range []struct {
		name string
		eng  engine.Engine
		cfg  Config
		want string
	}{
		{"no proposals", cpuEngine(t, 8, 8), Config{Speculation: Speculation{Proposer: newOracle(), MaxDraft: 0}}, "num_speculative_tokens 0"},
		{"too many", cpuEngine(t, 8, 8), Config{Speculation: Speculation{Proposer: newOracle(), MaxDraft: engine.MaxDraftTokens + 1}}, "want 1 to 16"},
		{"V1", cpuEngine(t, 8, 8), Config{ModelType: V1, Speculation: Speculation{Proposer: newOracle(), MaxDraft: 2}}, "needs in-flight batching"},
		{"an engine that does not verify", newFake(8, 8), Config{Speculation: Speculation{Proposer: newOracle(), MaxDraft: 2}}, "does not verify"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.eng, c.cfg, cb, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			}
		})
	}
}

// TestCancellingASpeculatingRequestFreesItsBlocks: a request stopped mid-run gets its
// final error, the proposer forgets it, and every block (those of its proposals
// included) comes back.
func TestCancellingASpeculatingRequestFreesItsBlocks(t *testing.T) {
	o := newOracle()
	rng := rand.New(rand.NewPCG(1, 1))
	prompt := randPrompt(rng, 8, 1000)
	o.future[1] = soloGreedy(t, prompt, 100)
	m, c := start(t, cpuEngine(t, 32, 8), Config{Speculation: Speculation{Proposer: o, MaxDraft: 5}})
	c.add(&InferenceRequest{ID: 1, InputIDs: prompt, MaxNewTokens: 100, PadID: -1, Streaming: true})
	eventually(t, "a few responses", func() bool { return len(c.responses(1)) >= 3 })
	c.stop(1)
	c.wait(t, 1)
	rs := c.responses(1)
	if last := rs[len(rs)-1]; !last.final || last.err == nil {
		t.Fatalf("last response %+v, want a final error", last)
	}
	poolWhole(t, m)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.forgotten[1] != 1 {
		t.Errorf("the proposer forgot the request %d times, want once", o.forgotten[1])
	}
}

// austenDir is the shipped demo model: trained, so its greedy text repeats itself as
// small models' does, which prompt lookup feeds on.
const austenDir = "../model_repository/austen/1"

var (
	austenOnce  sync.Once
	austenModel *model.Float32
	austenTok   *tokenizer.Tokenizer
	austenErr   error
)

// austenEngine is a CPU engine on the Austen model with the given pool, and its
// tokenizer.
func austenEngine(t testing.TB, blocks, perBlock int) (*cpu.Engine, *tokenizer.Tokenizer) {
	t.Helper()
	austenOnce.Do(func() {
		if austenModel, austenErr = model.LoadFloat32(austenDir); austenErr == nil {
			austenTok, austenErr = tokenizer.Load(filepath.Join(austenDir, "tokenizer.json"))
		}
	})
	if austenErr != nil {
		t.Fatal(austenErr)
	}
	e, err := cpu.NewFromModel(austenModel, engine.KVConfig{NumBlocks: blocks, TokensPerBlock: perBlock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, austenTok
}

// runOn runs reqs on eng under cfg and returns every request's responses and the stats.
func runOn(t *testing.T, eng engine.Engine, cfg Config, reqs []*InferenceRequest) (map[uint64][]response, []Stats) {
	t.Helper()
	var arrivals []arrival
	for i, r := range reqs {
		arrivals = append(arrivals, arrival{at: 1 + i%3, req: r})
	}
	c := runToEnd(t, eng, cfg, arrivals)
	out := map[uint64][]response{}
	for _, r := range reqs {
		rs := c.responses(r.ID)
		for i := range rs {
			rs[i].out.Perf = nil
		}
		out[r.ID] = rs
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return out, slices.Clone(c.typed)
}

// TestPromptLookupKeepsTheOutput: with prompt lookup (speculate.NGram) on the CPU engine
// and the trained Austen model, greedy and sampled requests get the responses they get
// without speculation, and proposals are accepted (its text repeats itself).
func TestPromptLookupKeepsTheOutput(t *testing.T) {
	_, tok := austenEngine(t, 1, 64)
	prompts := []string{"It is a truth universally acknowledged", "Hello, my name is", "The weather at Bath",
		"Mr. Darcy said that he", "Emma was not", "\"I am sure,\" said she,"}
	var reqs []*InferenceRequest
	for i, text := range prompts {
		r := &InferenceRequest{ID: uint64(i + 1), InputIDs: tok.EncodePrompt(text), MaxNewTokens: 48, PadID: -1,
			Streaming: i%2 == 0, ReturnLogProbs: true, EndIDs: []int32{0}}
		if i >= 4 {
			r.Sampling = engine.SamplingParams{Temperature: 0.7, TopP: 0.9, Seed: uint64(i)}
		}
		reqs = append(reqs, r)
	}
	eng, _ := austenEngine(t, 32, 64)
	want, _ := runOn(t, eng, Config{}, reqs)
	g, err := speculate.NewNGram(2, 4)
	if err != nil {
		t.Fatal(err)
	}
	eng, _ = austenEngine(t, 32, 64)
	got, stats := runOn(t, eng, Config{Speculation: Speculation{Proposer: g, MaxDraft: 8}}, reqs)
	for _, r := range reqs {
		if err := sameResponses(got[r.ID], want[r.ID]); err != nil {
			t.Errorf("request %d: %v", r.ID, err)
		}
	}
	last := stats[len(stats)-1]
	if last.AcceptedDraftTokensTotal == 0 {
		t.Fatalf("prompt lookup had none of its %d proposals accepted", last.DraftTokensTotal)
	}
	t.Logf("prompt lookup: %d of %d proposals accepted in %d verification steps, %d iterations",
		last.AcceptedDraftTokensTotal, last.DraftTokensTotal, last.SpeculativeStepsTotal, len(stats))
}

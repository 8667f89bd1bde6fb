package batchmanager

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/engine/enginetest"
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
	add(&InferenceRequest{InputIDs: randPrompt(rng, 117, 1000), MaxNewTokens: 11, Streaming: true})
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
				if o.forgotten[r.ID] == 0 {
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

// gated is a proposer that holds the manager in its second Propose until released, so
// that a test can act in the middle of a request's run.
type gated struct {
	*oracle
	// calls counts Propose calls; reached is closed at the second, which then waits for
	// release.
	calls            int
	reached, release chan struct{}
}

func (g *gated) Propose(reqs []*speculate.Request) error {
	g.calls++
	if g.calls == 2 {
		close(g.reached)
		<-g.release
	}
	return g.oracle.Propose(reqs)
}

// TestCancellingASpeculatingRequestFreesItsBlocks: a request stopped in the middle of
// its run gets its final error, the proposer forgets it, and every block (those of its
// proposals included) comes back.
func TestCancellingASpeculatingRequestFreesItsBlocks(t *testing.T) {
	o := newOracle()
	rng := rand.New(rand.NewPCG(1, 1))
	prompt := randPrompt(rng, 8, 1000)
	o.future[1] = soloGreedy(t, prompt, 100)
	g := &gated{oracle: o, reached: make(chan struct{}), release: make(chan struct{})}
	m, c := start(t, cpuEngine(t, 32, 8), Config{Speculation: Speculation{Proposer: g, MaxDraft: 5}})
	c.add(&InferenceRequest{ID: 1, InputIDs: prompt, MaxNewTokens: 100, PadID: -1, Streaming: true})
	<-g.reached
	c.stop(1)
	close(g.release)
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

// TestDraftModelKeepsGreedyOutput: with a draft model on the CPU engine, greedy requests
// get the responses they get without speculation, whether the draft is the target
// itself (every proposal accepted) or a random model of the same vocabulary (few).
// Sampled requests with the target as their own draft have every proposal accepted:
// speculative sampling keeps a proposal whose probability is the target's with
// certainty.
func TestDraftModelKeepsGreedyOutput(t *testing.T) {
	_, tok := austenEngine(t, 1, 64)
	var reqs []*InferenceRequest
	for i, text := range []string{"It is a truth universally acknowledged", "Hello, my name is", "The weather at Bath", "Emma was not"} {
		reqs = append(reqs, &InferenceRequest{ID: uint64(i + 1), InputIDs: tok.EncodePrompt(text), MaxNewTokens: 30, PadID: -1,
			Streaming: i%2 == 0, ReturnLogProbs: true, EndIDs: []int32{0}})
	}
	// A stop word inside the output.
	probe := soloRun(t, mustAusten(t), reqs[0].InputIDs, 20, engine.SamplingParams{})
	reqs = append(reqs, &InferenceRequest{ID: 9, InputIDs: reqs[0].InputIDs, MaxNewTokens: 30, PadID: -1, StopWords: [][]int32{probe[6:8]}})
	want, _ := runOn(t, mustAusten(t), Config{}, reqs)
	random := enginetest.Random(enginetest.Llama(4096, 1024, 64, 1, 2, 1, 128), 3)
	for name, draftEngine := range map[string]func() engine.Engine{
		"the target as draft": func() engine.Engine { e, _ := austenEngine(t, 32, 64); return e },
		"a random draft": func() engine.Engine {
			e, err := cpu.NewFromModel(random, engine.KVConfig{NumBlocks: 32, TokensPerBlock: 64})
			if err != nil {
				t.Fatal(err)
			}
			return e
		},
	} {
		t.Run(name, func(t *testing.T) {
			d, err := speculate.NewDraft(draftEngine(), 4096)
			if err != nil {
				t.Fatal(err)
			}
			got, stats := runOn(t, mustAusten(t), Config{Speculation: Speculation{Proposer: d, MaxDraft: 4}}, reqs)
			for _, r := range reqs {
				if err := sameResponses(got[r.ID], want[r.ID]); err != nil {
					t.Errorf("request %d: %v", r.ID, err)
				}
			}
			last := stats[len(stats)-1]
			t.Logf("%d of %d proposals accepted", last.AcceptedDraftTokensTotal, last.DraftTokensTotal)
			if last.DraftTokensTotal == 0 {
				t.Fatal("no proposals were made")
			}
			if name == "the target as draft" && last.AcceptedDraftTokensTotal != last.DraftTokensTotal {
				t.Errorf("the target as its own draft had %d of %d proposals accepted, want all", last.AcceptedDraftTokensTotal, last.DraftTokensTotal)
			}
		})
	}
	t.Run("sampled, the target as draft", func(t *testing.T) {
		e, _ := austenEngine(t, 32, 64)
		d, err := speculate.NewDraft(e, 4096)
		if err != nil {
			t.Fatal(err)
		}
		var sampled []*InferenceRequest
		for i, r := range reqs[:4] {
			s := *r
			s.ID = uint64(100 + i)
			s.Sampling = engine.SamplingParams{Temperature: 0.8, TopP: 0.95, Seed: uint64(i)}
			sampled = append(sampled, &s)
		}
		_, stats := runOn(t, mustAusten(t), Config{Speculation: Speculation{Proposer: d, MaxDraft: 4}}, sampled)
		last := stats[len(stats)-1]
		if last.DraftTokensTotal == 0 || last.AcceptedDraftTokensTotal != last.DraftTokensTotal {
			t.Errorf("%d of %d proposals accepted, want all", last.AcceptedDraftTokensTotal, last.DraftTokensTotal)
		}
	})
}

// mustAusten is a fresh Austen CPU engine of 32 blocks of 64 positions.
func mustAusten(t *testing.T) engine.Engine {
	t.Helper()
	e, _ := austenEngine(t, 32, 64)
	return e
}

// TestSampledOutputKeepsTheTargetDistribution: on a vocabulary of 4, a random target
// with a random draft model of its own (speculative sampling, the draft's
// distributions passed to the engine), 10,000 requests of distinct seeds generate four
// tokens each through the manager, the second and third from a step with two proposals;
// the joint distribution of those two is the target's, computed
// from the target's own logits (chi-squared with 15 degrees of freedom below the 0.001
// critical value), and not the draft's.
func TestSampledOutputKeepsTheTargetDistribution(t *testing.T) {
	const V, runs = 4, 10000
	target := enginetest.Random(enginetest.Llama(V, 64, 16, 1, 2, 1, 32), 21)
	draft := enginetest.Random(enginetest.Llama(V, 64, 16, 1, 2, 1, 32), 22)
	newEngine := func(m *model.Float32) engine.Engine {
		e, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: 512, TokensPerBlock: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	sp := engine.SamplingParams{Temperature: 2}
	prompt := []int32{1, 3, 0}
	// probs is m's next-token distribution after ctx at sp.
	probs := func(m *model.Float32, ctx []int32) []float64 {
		e := newEngine(m)
		outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{Tokens: ctx, Blocks: []int32{0, 1}, History: ctx, ReturnLogits: true, Sampling: sp}}})
		if err != nil {
			t.Fatal(err)
		}
		s := engine.NewSampler(V)
		p, err := s.Probs(outs[0].Logits, &sp)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(p)
	}
	// The first token comes from the prompt's step, without proposals; the second and
	// third from the first step with proposals: their joint distribution, over the first.
	var want, draftWant [V * V]float64
	p0, q0 := probs(target, prompt), probs(draft, prompt)
	for c := range V {
		ctx := append(slices.Clone(prompt), int32(c))
		p1, q1 := probs(target, ctx), probs(draft, ctx)
		for a := range V {
			ctx2 := append(slices.Clone(ctx), int32(a))
			p2, q2 := probs(target, ctx2), probs(draft, ctx2)
			for b := range V {
				want[a*V+b] += p0[c] * p1[a] * p2[b]
				draftWant[a*V+b] += q0[c] * q1[a] * q2[b]
			}
		}
	}
	var reqs []*InferenceRequest
	for i := range runs {
		s := sp
		s.Seed = uint64(i)
		reqs = append(reqs, &InferenceRequest{ID: uint64(i + 1), InputIDs: prompt, MaxNewTokens: 4, PadID: -1,
			Sampling: s, ExcludeInputInOutput: true})
	}
	d, err := speculate.NewDraft(newEngine(draft), V)
	if err != nil {
		t.Fatal(err)
	}
	got, stats := runOn(t, newEngine(target), Config{Speculation: Speculation{Proposer: d, MaxDraft: 2, MaxStepTokens: 1000}}, reqs)
	var counts [V * V]float64
	for _, r := range reqs {
		rs := got[r.ID]
		toks := rs[len(rs)-1].out.Tokens
		if len(toks) != 4 {
			t.Fatalf("request %d: %v, want 4 tokens", r.ID, toks)
		}
		counts[toks[1]*V+toks[2]]++
	}
	chi := func(dist [V * V]float64) float64 {
		var x float64
		for i, w := range dist {
			e := w * runs
			x += (counts[i] - e) * (counts[i] - e) / e
		}
		return x
	}
	const critical = 37.70 // chi-squared, 15 degrees of freedom, p = 0.001
	if x := chi(want); x > critical {
		t.Errorf("chi-squared %.1f against the target's distribution exceeds %.2f: counts %v, want %v × %d", x, critical, counts, want, runs)
	}
	if x := chi(draftWant); x < critical {
		t.Errorf("chi-squared %.1f against the draft's distribution: the test cannot tell them apart", x)
	}
	last := stats[len(stats)-1]
	if last.AcceptedDraftTokensTotal == 0 || last.AcceptedDraftTokensTotal == last.DraftTokensTotal {
		t.Errorf("%d of %d proposals accepted: the rule was not exercised both ways", last.AcceptedDraftTokensTotal, last.DraftTokensTotal)
	}
	t.Logf("chi-squared %.1f (target), %.1f (draft); %d of %d proposals accepted", chi(want), chi(draftWant),
		last.AcceptedDraftTokensTotal, last.DraftTokensTotal)
}

// TestEagle3KeepsGreedyOutput: with the EAGLE-3 head fixture (published format, random
// weights) reading llama-tiny's hidden states on the CPU engine, greedy requests — one
// of them with prefix reuse's chunked prompt — get the responses they get without
// speculation, proposals are made from the head, and every block comes back.
func TestEagle3KeepsGreedyOutput(t *testing.T) {
	target, err := model.LoadFloat32("../testdata/llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	h, err := model.LoadEagle3("../testdata/eagle3-tiny")
	if err != nil {
		t.Fatal(err)
	}
	newTarget := func() engine.Engine {
		e, err := cpu.NewFromModel(target, engine.KVConfig{NumBlocks: 64, TokensPerBlock: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	rng := rand.New(rand.NewPCG(36, 36))
	var reqs []*InferenceRequest
	for i := range 5 {
		reqs = append(reqs, &InferenceRequest{ID: uint64(i + 1), InputIDs: randPrompt(rng, 3+4*i, 1000), MaxNewTokens: 25,
			PadID: -1, Streaming: i%2 == 0, ReturnLogProbs: true})
	}
	for _, cfg := range []Config{{}, {EnableChunkedContext: true, MaxNumTokens: 9}} {
		want, _ := runOn(t, newTarget(), cfg, reqs)
		head, err := cpu.NewEagle3(h, 2, target.Model[model.RoleEmbed], engine.KVConfig{NumBlocks: 64, TokensPerBlock: 8})
		if err != nil {
			t.Fatal(err)
		}
		g, err := speculate.NewEagle3(head, 1000)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Speculation = Speculation{Proposer: g, MaxDraft: 3}
		got, stats := runOn(t, newTarget(), cfg, reqs)
		for _, r := range reqs {
			if err := sameResponses(got[r.ID], want[r.ID]); err != nil {
				t.Errorf("request %d: %v", r.ID, err)
			}
		}
		last := stats[len(stats)-1]
		if last.DraftTokensTotal == 0 {
			t.Errorf("the EAGLE-3 head proposed nothing")
		}
		t.Logf("EAGLE-3 head (random weights): %d of %d proposals accepted", last.AcceptedDraftTokensTotal, last.DraftTokensTotal)
	}
}

// silent is a proposer that never has anything to propose, counting its calls.
type silent struct{ calls atomic.Int64 }

func (s *silent) Propose(reqs []*speculate.Request) error {
	s.calls.Add(1)
	for _, r := range reqs {
		r.Draft = r.Draft[:0]
	}
	return nil
}
func (s *silent) Forget(uint64) {}
func (s *silent) Reset()        {}
func (s *silent) Close() error  { return nil }

// TestSpeculationWithNothingToProposeRunsAhead: under the overlap schedule, a request
// the proposer has nothing for stops blocking the steps ahead — its steps are launched
// ahead of the outputs (fed rows) while it waits out its next proposals, and it is asked
// only now and then — with the tokens of decoding without speculation.
func TestSpeculationWithNothingToProposeRunsAhead(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	p := randPrompt(rng, 6, 1000)
	const n = 60
	want := soloGreedy(t, p, n)
	pr := &silent{}
	eng := newCountingPipe(cpuEngine(t, 32, 8))
	c := runToEnd(t, eng, Config{Overlap: true, Speculation: Speculation{Proposer: pr, MaxDraft: 4}},
		[]arrival{{at: 1, req: &InferenceRequest{ID: 1, InputIDs: p, MaxNewTokens: n, PadID: -1}}})
	got, err := c.tokensOf(t, 1)
	if err != nil || !slices.Equal(got, append(slices.Clone(p), want...)) {
		t.Fatalf("%v (%v), want %v", got, err, want)
	}
	calls, fed := pr.calls.Load(), eng.fed.Load()
	t.Logf("%d proposer calls, %d rows fed ahead, %d tokens", calls, fed, n)
	if fed < n/2 {
		t.Errorf("%d of %d steps ran ahead", fed, n)
	}
	if calls >= n/2 {
		t.Errorf("the proposer was asked %d times in %d steps", calls, n)
	}
}

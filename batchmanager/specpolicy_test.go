package batchmanager

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"gollm/engine"
	"gollm/speculate"
)

// fakeClock is the adaptive policy's clock in the tests: time moves only as the engine
// and the proposer say their work costs.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// clockedEngine is an engine whose every step costs step on the clock, whatever it
// verifies (a launch-bound GPU step).
type clockedEngine struct {
	engine.Engine
	clk  *fakeClock
	step time.Duration
}

func (e *clockedEngine) Step(b *engine.Batch) ([]engine.Output, error) {
	e.clk.add(e.step)
	return e.Engine.Step(b)
}

// costlyOracle proposes each sequence's true greedy continuation (every proposal
// accepted) at perToken on the clock for each token proposed (a draft model's steps).
type costlyOracle struct {
	clk      *fakeClock
	perToken time.Duration
	future   map[uint64][]int32
}

func (o *costlyOracle) Propose(reqs []*speculate.Request) error {
	most := 0
	for _, r := range reqs {
		f := o.future[r.Key]
		r.Draft = r.Draft[:0]
		for i := 0; i < r.Max && r.NumGenerated+i < len(f); i++ {
			r.Draft = append(r.Draft, f[r.NumGenerated+i])
		}
		most = max(most, r.Max)
	}
	o.clk.add(time.Duration(most) * o.perToken)
	return nil
}

func (o *costlyOracle) Forget(uint64) {}
func (o *costlyOracle) Reset()        {}
func (o *costlyOracle) Close() error  { return nil }

// policyIter is what one iteration of a policy run did.
type policyIter struct {
	drafted, tokens int
	held            bool
}

// policyRun drives a manager with the adaptive policy (MaxDraft 4) through requests
// served one after another at batch 1 — each 8 prompt tokens and 100 generated, their
// greedy tokens checked against solo runs — on an engine whose steps cost 10 ms and a
// proposer whose costs perToken(iteration) sets, for iters iterations.
func policyRun(t *testing.T, overlap bool, iters int, perToken func(i int) time.Duration) []policyIter {
	t.Helper()
	const maxNew = 100
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	rng := rand.New(rand.NewPCG(11, 12))
	prompts := map[uint64][]int32{}
	pr := &costlyOracle{clk: clk, future: map[uint64][]int32{}}
	next := uint64(0)
	newReq := func() *InferenceRequest {
		next++
		p := randPrompt(rng, 8, 1000)
		prompts[next] = p
		pr.future[next] = soloGreedy(t, p, maxNew)
		return &InferenceRequest{ID: next, InputIDs: p, MaxNewTokens: maxNew, PadID: -1}
	}
	queue := []*InferenceRequest{newReq()}
	got := map[uint64][]int32{}
	done := 0
	cb := Callbacks{
		GetInferenceRequests: func(most int) []*InferenceRequest {
			n := min(most, len(queue))
			out := queue[:n:n]
			queue = queue[n:]
			return out
		},
		SendResponse: func(id uint64, out Result, final bool, err error) {
			if err != nil {
				t.Errorf("request %d: %v", id, err)
			}
			if final {
				got[id] = slices.Clone(out.Tokens[:out.Length])
				done++
				queue = append(queue, newReq())
			}
		},
	}
	eng := &clockedEngine{Engine: cpuEngine(t, 64, 8), clk: clk, step: 10 * time.Millisecond}
	cfg := Config{Overlap: overlap, Speculation: Speculation{Proposer: pr, MaxDraft: 4, Adaptive: true}}
	m, err := newManager(eng, cfg, cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.clock = clk.now
	var out []policyIter
	for i := range iters {
		pr.perToken = perToken(i)
		if !m.iterate() {
			continue
		}
		out = append(out, policyIter{drafted: m.it.drafted, tokens: m.it.genTokens, held: m.policy.heldNow})
	}
	m.drainPipe()
	if done == 0 {
		t.Fatal("no request finished")
	}
	for id, toks := range got {
		want := append(slices.Clone(prompts[id]), pr.future[id]...)
		if !slices.Equal(toks, want) {
			t.Errorf("request %d: %v, want the greedy %v", id, toks, want)
		}
	}
	if s := m.Stats(); s.SpeculationHeldOffTotal != uint64(count(out, func(it policyIter) bool { return it.held })) {
		t.Errorf("stats count %d iterations held off", s.SpeculationHeldOffTotal)
	}
	return out
}

func count[T any](s []T, f func(T) bool) int {
	n := 0
	for _, x := range s {
		if f(x) {
			n++
		}
	}
	return n
}

// TestAdaptiveSpeculationFollowsWhatItGains: with every proposal accepted and steps of
// 10 ms, a proposer at 1 ms a token (a verifying step gives up to 5 tokens for 14 ms)
// stays on — nearly every token comes from steps that verified proposals and nothing
// is held off; one at 15 ms a token (5 tokens for 70 ms against 50 ms without) is held
// off within 64 iterations (8 samples at each of 4, 2 and 1 proposals) and afterwards
// proposes only in its probes, one token each, fewer and fewer; and once it gets cheap
// again the next probe (32 iterations after it was held off) turns it back on. Greedy
// tokens are those of solo runs throughout, with and without the overlap schedule.
func TestAdaptiveSpeculationFollowsWhatItGains(t *testing.T) {
	for _, overlap := range []bool{false, true} {
		t.Run(fmt.Sprintf("overlap=%v", overlap), func(t *testing.T) {
			t.Run("it pays", func(t *testing.T) {
				its := policyRun(t, overlap, 400, func(int) time.Duration { return time.Millisecond })
				spec, held := 0, 0
				total := 0
				for _, it := range its {
					total += it.tokens
					if it.drafted > 0 {
						spec += it.tokens
					}
					if it.held {
						held++
					}
				}
				t.Logf("%d iterations, %d tokens, %d of them from verifying steps, %d held off", len(its), total, spec, held)
				if held > 0 || spec < total*3/4 {
					t.Errorf("%d of %d tokens from verifying steps, %d iterations held off; want 3/4 and none", spec, total, held)
				}
			})
			t.Run("it does not pay", func(t *testing.T) {
				its := policyRun(t, overlap, 600, func(int) time.Duration { return 15 * time.Millisecond })
				first := slices.IndexFunc(its, func(it policyIter) bool { return it.held })
				if first < 0 || first > 64 {
					t.Fatalf("first held off at iteration %d; want within 64", first)
				}
				var probes []int
				for i, it := range its[first:] {
					if it.drafted > 0 {
						probes = append(probes, first+i)
					}
					if it.drafted > 1 {
						t.Errorf("iteration %d: a probe with %d proposals; want one", first+i, it.drafted)
					}
				}
				t.Logf("held off from iteration %d of %d; iterations with proposals after: %v", first, len(its), probes)
				if n := len(probes); n == 0 || n > 30 {
					t.Errorf("%d iterations with proposals after it was held off; want some probes, at most 30", n)
				}
			})
			t.Run("it pays again", func(t *testing.T) {
				const switchAt = 40
				its := policyRun(t, overlap, 400, func(i int) time.Duration {
					if i < switchAt {
						return 15 * time.Millisecond
					}
					return time.Millisecond
				})
				if !slices.ContainsFunc(its[:switchAt], func(it policyIter) bool { return it.held }) {
					t.Fatal("not held off while it did not pay")
				}
				back := switchAt + slices.IndexFunc(its[switchAt:], func(it policyIter) bool { return it.drafted > 0 })
				tail := its[len(its)-100:]
				t.Logf("proposals again from iteration %d; held off in the last 100: %d", back,
					count(tail, func(it policyIter) bool { return it.held }))
				if back < switchAt || back > switchAt+40 {
					t.Errorf("proposals again at iteration %d; want within 40 of %d", back, switchAt)
				}
				if n := count(tail, func(it policyIter) bool { return it.held }); n > 0 {
					t.Errorf("%d of the last 100 iterations held off", n)
				}
			})
		})
	}
}

// TestSpecPolicyByBatchSize: the policy's decisions are per batch size — a bucket held
// off leaves the others on — and a policy without measurements asks for the plain cost
// first.
func TestSpecPolicyByBatchSize(t *testing.T) {
	p := newSpecPolicy(4)
	at := time.Unix(1e9, 0)
	feed := func(g int, asked bool, cost time.Duration, tokens int) {
		at = at.Add(cost)
		p.observe(specSample{at: at, gen: g, tokens: tokens, asked: asked, eligible: true})
	}
	if l := p.limit(1); l != 0 {
		t.Fatalf("limit %d before any plain sample; want 0", l)
	}
	p.observe(specSample{at: at, gen: 1, ctx: 1, tokens: 1})
	for range 3 {
		feed(1, false, 10*time.Millisecond, 1)
		feed(8, false, 20*time.Millisecond, 8)
	}
	for range 80 {
		if p.limit(1) > 0 {
			feed(1, true, 70*time.Millisecond, 5) // 5 tokens for 70 ms against 50: not paying
		} else {
			feed(1, false, 10*time.Millisecond, 1)
		}
		if p.limit(8) > 0 {
			feed(8, true, 30*time.Millisecond, 8*3) // 3 tokens each for 30 ms against 60: paying
		} else {
			feed(8, false, 20*time.Millisecond, 8)
		}
	}
	if l1, l8 := p.bucket(1).limit, p.bucket(8).limit; l1 != 0 || l8 != 4 {
		t.Errorf("limits %d at batch 1 and %d at batch 8; want 0 and 4", l1, l8)
	}
	if !p.heldNow && p.heldOff == 0 {
		t.Error("nothing counted as held off")
	}
}

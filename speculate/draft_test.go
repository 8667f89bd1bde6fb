package speculate

import (
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/engine/enginetest"
	"gollm/model"
)

// austenDir is the shipped demo model.
const austenDir = "../model_repository/austen/1"

var (
	austenOnce  sync.Once
	austenModel *model.Float32
	austenErr   error
)

// austen is a CPU engine on the Austen model with a pool of blocks of 16 positions.
func austen(t *testing.T, blocks int) *cpu.Engine {
	t.Helper()
	austenOnce.Do(func() { austenModel, austenErr = model.LoadFloat32(austenDir) })
	if austenErr != nil {
		t.Fatal(austenErr)
	}
	e, err := cpu.NewFromModel(austenModel, engine.KVConfig{NumBlocks: blocks, TokensPerBlock: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// greedyAfter decodes n greedy tokens after ctx on a fresh engine, one step each.
func greedyAfter(t *testing.T, ctx []int32, n int) []int32 {
	t.Helper()
	e := austen(t, 16)
	blocks := make([]int32, 16)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	hist := slices.Clone(ctx)
	toks, pos := ctx, 0
	for range n {
		outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: toks, Pos: pos, Blocks: blocks, Sample: true, History: hist}}})
		if err != nil {
			t.Fatal(err)
		}
		pos += len(toks)
		hist = append(hist, outs[0].Token)
		toks = hist[len(hist)-1:]
	}
	return hist[len(ctx):]
}

// TestDraftProposesItsGreedyContinuation: a greedy sequence's proposals are the draft
// model's greedy tokens; after the target keeps some of them and adds a token of its
// own, the next proposals continue from there (the draft's KV of the rejected ones is
// overwritten); Forget gives every block back.
func TestDraftProposesItsGreedyContinuation(t *testing.T) {
	d, err := NewDraft(austen(t, 32), 4096)
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{40, 318, 257, 3288, 11, 290, 262, 286}
	r := &Request{Key: 7, Tokens: prompt, Max: 5}
	if err := d.Propose([]*Request{r}); err != nil {
		t.Fatal(err)
	}
	want := greedyAfter(t, prompt, 5)
	if !slices.Equal(r.Draft, want) || len(r.Probs) != 0 {
		t.Fatalf("proposals %v (probs %d), want %v", r.Draft, len(r.Probs), want)
	}
	// The target keeps two and samples a token of its own.
	ctx := append(append(slices.Clone(prompt), want[:2]...), (want[2]+1)%4096)
	r2 := &Request{Key: 7, Tokens: ctx, Max: 4, NumGenerated: 3}
	other := &Request{Key: 8, Tokens: prompt[:5], Max: 3}
	if err := d.Propose([]*Request{r2, other}); err != nil {
		t.Fatal(err)
	}
	if want := greedyAfter(t, ctx, 4); !slices.Equal(r2.Draft, want) {
		t.Fatalf("after a rejection: proposals %v, want %v", r2.Draft, want)
	}
	if want := greedyAfter(t, prompt[:5], 3); !slices.Equal(other.Draft, want) {
		t.Fatalf("a second sequence in the same steps: proposals %v, want %v", other.Draft, want)
	}
	d.Forget(7)
	d.Forget(8)
	if used := d.pool.Stats().Used; used != 0 {
		t.Fatalf("%d draft blocks still used after Forget", used)
	}
}

// TestDraftSampledProposalsCarryTheirDistribution: a sampled sequence's proposals come
// with the draft's distributions, one row each, which sum to 1 and give the proposal a
// chance.
func TestDraftSampledProposalsCarryTheirDistribution(t *testing.T) {
	d, err := NewDraft(austen(t, 32), 4096)
	if err != nil {
		t.Fatal(err)
	}
	r := &Request{Key: 1, Tokens: []int32{40, 318, 257}, Max: 4,
		Sampling: engine.SamplingParams{Temperature: 0.9, TopP: 0.95, Seed: 3}}
	if err := d.Propose([]*Request{r}); err != nil {
		t.Fatal(err)
	}
	if len(r.Draft) != 4 || len(r.Probs) != 4*4096 {
		t.Fatalf("%d proposals with %d probabilities, want 4 with %d", len(r.Draft), len(r.Probs), 4*4096)
	}
	for i, tok := range r.Draft {
		row := r.Probs[i*4096 : (i+1)*4096]
		var sum float64
		for _, q := range row {
			sum += float64(q)
		}
		if math.Abs(sum-1) > 1e-4 || row[tok] <= 0 {
			t.Fatalf("proposal %d (%d): its row sums to %g and gives it %g", i, tok, sum, row[tok])
		}
	}
}

// TestDraftMustShareTheVocabulary: a draft with another vocabulary is refused, naming
// both sizes.
func TestDraftMustShareTheVocabulary(t *testing.T) {
	m := enginetest.Random(enginetest.Llama(512, 64, 32, 1, 2, 1, 64), 1)
	e, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: 4, TokensPerBlock: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := NewDraft(e, 4096); err == nil || !strings.Contains(err.Error(), "512 tokens, the model's 4096") {
		t.Fatalf("err = %v, want a vocabulary mismatch", err)
	}
}

// TestDraftWithoutRoomProposesNothing: a sequence longer than the draft's pool gets no
// proposals rather than an error.
func TestDraftWithoutRoomProposesNothing(t *testing.T) {
	d, err := NewDraft(austen(t, 1), 4096)
	if err != nil {
		t.Fatal(err)
	}
	long := make([]int32, 40)
	r := &Request{Key: 1, Tokens: long, Max: 3}
	if err := d.Propose([]*Request{r}); err != nil || len(r.Draft) != 0 {
		t.Fatalf("proposals %v, err %v; want none and no error", r.Draft, err)
	}
}

// pipedEngine is a CPU engine with the Pipeliner contract (engine.SyncPipeline), counting
// the launches and the fed rows among them.
type pipedEngine struct {
	*cpu.Engine
	pipe          *engine.SyncPipeline
	launches, fed int
}

func (p *pipedEngine) Launch(b *engine.Batch) error {
	p.launches++
	for _, s := range b.Seqs {
		if s.Feed > 0 {
			p.fed++
		}
	}
	return p.pipe.Launch(b)
}

func (p *pipedEngine) Wait() ([]engine.Output, error) { return p.pipe.Wait() }

// TestDraftChainsItsStepsOnAPipeliner: on an engine that pipelines, a greedy call's
// draft steps are launched each before the previous one's outputs are read, fed on the
// engine (Sequence.Feed), and give the proposals of steps run one at a time — across
// calls whose first tokens the target rejected, for sequences of different Max and for
// one whose end token stops it early; a sampled sequence in the call runs step by step.
func TestDraftChainsItsStepsOnAPipeliner(t *testing.T) {
	cpuEng := austen(t, 64)
	piped := &pipedEngine{Engine: cpuEng, pipe: engine.NewSyncPipeline(cpuEng)}
	chained, err := NewDraft(piped, 4096)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := NewDraft(austen(t, 64), 4096)
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{40, 318, 257, 3288, 11, 290, 262, 286}
	run := func(d *Draft, reqs []Request) [][]int32 {
		var rs []*Request
		for i := range reqs {
			r := reqs[i]
			r.Tokens = slices.Clone(r.Tokens)
			rs = append(rs, &r)
		}
		if err := d.Propose(rs); err != nil {
			t.Fatal(err)
		}
		var out [][]int32
		for _, r := range rs {
			out = append(out, slices.Clone(r.Draft))
		}
		return out
	}
	first := run(plain, []Request{{Key: 1, Tokens: prompt, Max: 5}, {Key: 2, Tokens: prompt[:5], Max: 2}})
	if got := run(chained, []Request{{Key: 1, Tokens: prompt, Max: 5}, {Key: 2, Tokens: prompt[:5], Max: 2}}); !slices.EqualFunc(got, first, slices.Equal) {
		t.Fatalf("chained proposals %v, want %v", got, first)
	}
	if piped.launches != 5 || piped.fed != 5 {
		t.Fatalf("%d launches with %d fed rows, want 5 and 5 (4 + 1)", piped.launches, piped.fed)
	}
	// The target kept two of the first sequence's and added its own; the second
	// sequence's end token is its second proposal.
	ctx := append(append(slices.Clone(prompt), first[0][:2]...), (first[0][2]+1)%4096)
	next := []Request{{Key: 1, Tokens: ctx, Max: 4, NumGenerated: 3}, {Key: 2, Tokens: prompt[:5], Max: 4, EndIDs: first[1][1:2]}}
	want := run(plain, next)
	if got := run(chained, next); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("after a rejection, with an end token: chained %v, want %v", got, want)
	}
	if len(want[1]) != 2 {
		t.Fatalf("the end token did not stop the second sequence: %v", want[1])
	}
	// The target kept all of the first sequence's and added its own (two tokens to catch
	// up: one in a step ahead); a new sequence of three tokens (two ahead).
	ctx = append(append(slices.Clone(ctx), want[0]...), 17)
	next = []Request{{Key: 1, Tokens: ctx, Max: 3, NumGenerated: 8}, {Key: 4, Tokens: prompt[2:5], Max: 2}}
	launches, fed := piped.launches, piped.fed
	want = run(plain, next)
	if got := run(chained, next); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("catching up in steps ahead: chained %v, want %v", got, want)
	}
	if piped.launches-launches != 5 || piped.fed-fed != 3 {
		t.Fatalf("%d launches with %d fed rows, want 2 ahead, the main step and 2 fed", piped.launches-launches, piped.fed-fed)
	}
	// A sampled sequence: step by step.
	launches = piped.launches
	sampled := []Request{{Key: 3, Tokens: prompt, Max: 3, Sampling: engine.SamplingParams{Temperature: 0.8, Seed: 1}}}
	if got, want := run(chained, sampled), run(plain, sampled); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("sampled: %v, want %v", got, want)
	}
	if piped.launches != launches {
		t.Fatal("a sampled sequence's steps were chained")
	}
}

package batchmanager

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"gollm/engine"
	"gollm/engine/cpu"
)

// fullLogits runs seq from scratch on a fresh block table of e (no sharing, no copies)
// and returns its last position's logits.
func fullLogits(t *testing.T, e *cpu.Engine, seq []int32) []float32 {
	t.Helper()
	T := e.Info().TokensPerBlock
	blocks := make([]int32, (len(seq)+T-1)/T)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 99, Tokens: seq, Blocks: blocks, History: seq, ReturnLogits: true}}})
	if err != nil {
		t.Fatal(err)
	}
	return outs[0].Logits
}

// refBeam is a beam or a finished hypothesis of the reference search.
type refBeam struct {
	toks  []int32
	lps   []float32
	cum   float32
	score float32
}

// referenceBeamSearch is beam search written plainly: every beam's logits recomputed
// from the whole sequence, every candidate of every beam sorted at once. It follows the
// rules of beam.go with early stopping on, for comparing the manager's KV-sharing,
// copy-on-write search against; diversity is beam_search_diversity_rate, by its
// definition: the k-th best continuation of a beam (from 0) is ranked by its
// cumulative log-probability plus diversity × k.
func referenceBeamSearch(t *testing.T, e *cpu.Engine, prompt []int32, W, maxNew int, endID int32, lenPenalty, diversity float32) []refBeam {
	t.Helper()
	live := []refBeam{{}}
	var hyps []refBeam
	for step := 0; step < maxNew; step++ {
		type cand struct {
			beam, rank   int
			tok          int32
			lp, cum, key float32
		}
		var all []cand
		for bi, b := range live {
			w := fullLogits(t, e, append(slices.Clone(prompt), b.toks...))
			if !engine.LogSoftmax(w, w, 1) {
				t.Fatal("all masked")
			}
			idx := make([]int, len(w))
			for i := range idx {
				idx[i] = i
			}
			sort.SliceStable(idx, func(a, c int) bool { return w[idx[a]] > w[idx[c]] })
			for k, i := range idx[:2*W] {
				all = append(all, cand{bi, k, int32(i), w[i], b.cum + w[i], b.cum + w[i] + diversity*float32(k)})
			}
		}
		sort.SliceStable(all, func(a, c int) bool { return all[a].key > all[c].key })
		all = all[:2*W]
		var next []refBeam
		stop := false
		for i, c := range all {
			p := live[c.beam]
			if c.tok == endID {
				if i < W {
					h := refBeam{toks: p.toks, lps: append(slices.Clone(p.lps), c.lp), cum: c.cum, score: lengthPenalty(c.cum, step+1, lenPenalty)}
					hyps = append(hyps, h)
					sort.SliceStable(hyps, func(a, c int) bool { return hyps[a].score > hyps[c].score })
					if len(hyps) > W {
						hyps = hyps[:W]
					}
				}
				continue
			}
			next = append(next, refBeam{toks: append(slices.Clone(p.toks), c.tok), lps: append(slices.Clone(p.lps), c.lp), cum: c.cum})
			if len(next) == W {
				break
			}
		}
		live = next
		if len(hyps) == W {
			stop = true
		}
		if stop || step == maxNew-1 {
			for _, b := range live {
				b.score = lengthPenalty(b.cum, len(b.toks), lenPenalty)
				if len(hyps) < W || b.score > hyps[len(hyps)-1].score {
					hyps = append(hyps, b)
					sort.SliceStable(hyps, func(a, c int) bool { return hyps[a].score > hyps[c].score })
					if len(hyps) > W {
						hyps = hyps[:W]
					}
				}
			}
			break
		}
	}
	return hyps
}

// finalOf returns a request's final response, failing on errors or a missing one.
func finalOf(t *testing.T, c *client, id uint64) Result {
	t.Helper()
	rs := c.responses(id)
	if len(rs) == 0 || !rs[len(rs)-1].final {
		t.Fatalf("request %d: no final response among %d", id, len(rs))
	}
	last := rs[len(rs)-1]
	if last.err != nil {
		t.Fatalf("request %d: %v", id, last.err)
	}
	return last.out
}

func TestBeamSearchMatchesAReferenceThatSharesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	ref := cpuEngine(t, 64, 4)
	for _, tc := range []struct {
		name       string
		prompt     int
		width      int
		maxNew     int
		lenPenalty float32
		withEnd    bool
	}{
		{"width 4 over a prompt ending inside a block", 10, 4, 9, 0, false},
		{"width 3 over a prompt filling its blocks", 8, 3, 7, 0, false},
		{"width 4 with an end token and a length penalty", 6, 4, 10, 1, true},
		{"width 2 over a one-token prompt", 1, 2, 6, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prompt := randPrompt(rng, tc.prompt, 1000)
			endID := int32(-1)
			if tc.withEnd {
				// An end token beams will meet: the greedy path's third token.
				endID = soloGreedy(t, prompt, 3)[2]
			}
			want := referenceBeamSearch(t, ref, prompt, tc.width, tc.maxNew, endID, tc.lenPenalty, 0)
			// A small pool of small blocks: beams share the prompt and copy on write.
			m, c := start(t, cpuEngine(t, 40, 4), Config{})
			ir := &InferenceRequest{ID: 1, InputIDs: prompt, MaxNewTokens: tc.maxNew, PadID: -1, BeamWidth: tc.width,
				LengthPenalty: tc.lenPenalty, EarlyStopping: 1, ReturnLogProbs: true, ExcludeInputInOutput: true}
			if endID >= 0 {
				ir.EndIDs = []int32{endID}
			}
			// A plain request beside it shares the batch and the pool.
			c.add(ir, &InferenceRequest{ID: 2, InputIDs: prompt[:1], MaxNewTokens: 5, PadID: -1})
			c.wait(t, 2)
			got := finalOf(t, c, 1).Beams
			if len(got) != len(want) {
				t.Fatalf("%d beams, reference %d", len(got), len(want))
			}
			for i := range want {
				if !slices.Equal(got[i].Tokens, want[i].toks) || math.Abs(float64(got[i].CumLogProb-want[i].cum)) > 1e-4 {
					t.Errorf("beam %d: %v (cum %g), reference %v (cum %g)", i, got[i].Tokens, got[i].CumLogProb, want[i].toks, want[i].cum)
				}
			}
			poolWhole(t, m)
		})
	}
}

func TestBeamsAreSortedTheirScoresAddUpAndTheBestBeatsGreedy(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	m, c := start(t, cpuEngine(t, 64, 8), Config{})
	for id := uint64(1); id <= 4; id++ {
		prompt := randPrompt(rng, 5+int(id), 1000)
		c.add(&InferenceRequest{ID: 10 + id, InputIDs: prompt, MaxNewTokens: 12, PadID: -1, ReturnLogProbs: true},
			&InferenceRequest{ID: id, InputIDs: prompt, MaxNewTokens: 12, PadID: -1, BeamWidth: 4, EarlyStopping: 1, ReturnLogProbs: true})
	}
	c.wait(t, 8)
	for id := uint64(1); id <= 4; id++ {
		beams := finalOf(t, c, id).Beams
		greedy := finalOf(t, c, 10+id)
		if len(beams) != 4 {
			t.Fatalf("request %d: %d beams, want 4", id, len(beams))
		}
		for i, b := range beams {
			var sum float64
			for _, lp := range b.LogProbs {
				sum += float64(lp)
			}
			if math.Abs(sum-float64(b.CumLogProb)) > 1e-4 || len(b.LogProbs) != 12 || len(b.Tokens) != 5+int(id)+12 {
				t.Errorf("request %d beam %d: cum %g, sum of %d log-probs %g, %d tokens", id, i, b.CumLogProb, len(b.LogProbs), sum, len(b.Tokens))
			}
			if i > 0 && b.CumLogProb > beams[i-1].CumLogProb {
				t.Errorf("request %d: beam %d (%g) ranks after beam %d (%g)", id, i, b.CumLogProb, i-1, beams[i-1].CumLogProb)
			}
		}
		if beams[0].CumLogProb < greedy.CumLogProb-1e-5 {
			t.Errorf("request %d: best beam %g is worse than greedy %g", id, beams[0].CumLogProb, greedy.CumLogProb)
		}
	}
	poolWhole(t, m)
}

func TestStreamedBeamsCarryEveryTokenOfTheCurrentBeams(t *testing.T) {
	m, c := start(t, cpuEngine(t, 64, 4), Config{})
	prompt := []int32{5, 6, 7, 8, 9}
	c.add(&InferenceRequest{ID: 1, InputIDs: prompt, MaxNewTokens: 6, PadID: -1, BeamWidth: 3, EarlyStopping: 1, Streaming: true},
		&InferenceRequest{ID: 2, InputIDs: prompt, MaxNewTokens: 6, PadID: -1, BeamWidth: 3, EarlyStopping: 1})
	c.wait(t, 2)
	rs := c.responses(1)
	if len(rs) != 6 {
		t.Fatalf("%d streamed responses, want one per step (6)", len(rs))
	}
	for i, r := range rs {
		if len(r.out.Beams) != 3 {
			t.Fatalf("response %d: %d beams", i, len(r.out.Beams))
		}
		for _, b := range r.out.Beams {
			if len(b.Tokens) != i+1 {
				t.Errorf("response %d: a beam of %d tokens, want every generated token (%d)", i, len(b.Tokens), i+1)
			}
		}
	}
	whole := finalOf(t, c, 2).Beams
	for i, b := range rs[5].out.Beams {
		if !slices.Equal(b.Tokens, whole[i].Tokens[len(prompt):]) {
			t.Errorf("beam %d streamed %v, not streamed %v", i, b.Tokens, whole[i].Tokens[len(prompt):])
		}
	}
	poolWhole(t, m)
}

func TestNumReturnSequencesDrawEachSequenceFromItsOwnStream(t *testing.T) {
	m, c := start(t, cpuEngine(t, 64, 4), Config{})
	prompt := []int32{11, 12, 13, 14, 15, 16}
	sp := engine.SamplingParams{Temperature: 1, TopK: 50, Seed: 42}
	for _, streaming := range []bool{false, true} {
		id := uint64(1)
		if streaming {
			id = 2
		}
		c.add(&InferenceRequest{ID: id, InputIDs: prompt, MaxNewTokens: 8, PadID: -1, NumReturnSequences: 3, Sampling: sp,
			Streaming: streaming, ExcludeInputInOutput: true, ReturnLogProbs: true})
	}
	// Each sequence alone: a plain request drawing from the sequence's stream.
	for i := range 3 {
		p := sp
		p.Seed = branchSeed(sp.Seed, i)
		c.add(&InferenceRequest{ID: uint64(10 + i), InputIDs: prompt, MaxNewTokens: 8, PadID: -1, Sampling: p, ExcludeInputInOutput: true})
	}
	c.wait(t, 5)
	for _, id := range []uint64{1, 2} {
		rs := c.responses(id)
		got := map[int][]int32{}
		finals, seqFinals := 0, map[int]int{}
		for _, r := range rs {
			if r.err != nil {
				t.Fatalf("request %d: %v", id, r.err)
			}
			got[r.out.SequenceIndex] = append(got[r.out.SequenceIndex], r.out.Tokens[:r.out.Length]...)
			if r.final {
				finals++
			}
			if r.out.SequenceFinal {
				seqFinals[r.out.SequenceIndex]++
			}
		}
		if finals != 1 || !rs[len(rs)-1].final {
			t.Errorf("request %d: %d final responses, the last final %v; want exactly one, the last", id, finals, rs[len(rs)-1].final)
		}
		for i := range 3 {
			want, _ := c.tokensOf(t, uint64(10+i))
			if !slices.Equal(got[i], want) || seqFinals[i] != 1 {
				t.Errorf("request %d sequence %d: %v (%d sequence-final), alone %v", id, i, got[i], seqFinals[i], want)
			}
		}
		if slices.Equal(got[0], got[1]) && slices.Equal(got[1], got[2]) {
			t.Errorf("request %d: three identical sequences %v", id, got[0])
		}
	}
	poolWhole(t, m)
}

func TestTopPDecayFollowsItsDefinition(t *testing.T) {
	prompt := []int32{3, 1, 4, 1, 5}
	const n = 10
	sp := engine.SamplingParams{Temperature: 1.5, TopP: 0.9, Seed: 7}
	m, c := start(t, cpuEngine(t, 64, 8), Config{})
	c.add(&InferenceRequest{ID: 1, InputIDs: prompt, MaxNewTokens: n, PadID: -1, Sampling: sp, ExcludeInputInOutput: true,
		TopPDecay: 0.5, TopPMin: 0.05, TopPResetID: -1})
	c.add(&InferenceRequest{ID: 2, InputIDs: prompt, MaxNewTokens: n, PadID: -1, Sampling: sp, ExcludeInputInOutput: true})
	c.wait(t, 2)
	got, _ := c.tokensOf(t, 1)
	plain, _ := c.tokensOf(t, 2)
	// By hand: step k draws with top-p max(0.9·0.5^k, 0.05).
	e := cpuEngine(t, 16, 8)
	blocks := []int32{0, 1, 2, 3}
	hist := slices.Clone(prompt)
	toks, pos := prompt, 0
	var want []int32
	topP := float32(0.9)
	for k := range n {
		p := sp
		p.TopP = topP
		outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: toks, Pos: pos, Blocks: blocks, Sample: true, Sampling: p, History: hist, NumGenerated: k}}})
		if err != nil {
			t.Fatal(err)
		}
		pos += len(toks)
		hist = append(hist, outs[0].Token)
		want = append(want, outs[0].Token)
		toks = hist[len(hist)-1:]
		topP = max(topP*0.5, 0.05)
	}
	if !slices.Equal(got, want) {
		t.Errorf("with decay: %v, by the definition %v", got, want)
	}
	if slices.Equal(got, plain) {
		t.Errorf("the decay changed nothing: %v", got)
	}
	poolWhole(t, m)
}

func TestLogitsPostProcessorDecidesTheTokens(t *testing.T) {
	m, c := start(t, cpuEngine(t, 64, 8), Config{})
	var seen []uint64
	only := func(tok int32) LogitsPostProcessor {
		return func(id uint64, logits []float32, tokens []int32) {
			seen = append(seen, id)
			for i := range logits {
				if int32(i) != tok {
					logits[i] = float32(math.Inf(-1))
				}
			}
		}
	}
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 4, PadID: -1, ExcludeInputInOutput: true, LogitsPostProcessor: only(77)},
		&InferenceRequest{ID: 2, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 4, PadID: -1, ExcludeInputInOutput: true, BeamWidth: 2, LogitsPostProcessor: only(88)},
		&InferenceRequest{ID: 3, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 4, PadID: -1, ExcludeInputInOutput: true,
			Sampling: engine.SamplingParams{Temperature: 1, Seed: 5}, LogitsPostProcessor: only(99), Streaming: true})
	c.wait(t, 3)
	if got, _ := c.tokensOf(t, 1); !slices.Equal(got, []int32{77, 77, 77, 77}) {
		t.Errorf("greedy: %v", got)
	}
	if got, _ := c.tokensOf(t, 3); !slices.Equal(got, []int32{99, 99, 99, 99}) {
		t.Errorf("sampled and streamed: %v", got)
	}
	if b := finalOf(t, c, 2).Beams; len(b) == 0 || !slices.Equal(b[0].Tokens, []int32{88, 88, 88, 88}) {
		t.Errorf("beam search: %+v", b)
	}
	if len(seen) == 0 {
		t.Error("the post-processor was never called")
	}
	poolWhole(t, m)
}

func TestEndSignalAnswersWithWhatWasGenerated(t *testing.T) {
	c := newClient()
	ends := map[uint64]struct{}{}
	var endMu = &c.mu
	cb := c.callbacks()
	cb.PollEndSignal = func() map[uint64]struct{} {
		endMu.Lock()
		defer endMu.Unlock()
		out := ends
		ends = map[uint64]struct{}{}
		return out
	}
	m, err := New(cpuEngine(t, 64, 8), Config{IdleWait: 1e6}, cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.m = m
	defer m.Shutdown()
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 100, PadID: -1, Streaming: true},
		&InferenceRequest{ID: 2, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 100, PadID: -1, ExcludeInputInOutput: true},
		&InferenceRequest{ID: 3, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 100, PadID: -1, BeamWidth: 2, ExcludeInputInOutput: true})
	eventually(t, "tokens stream", func() bool { return len(c.responses(1)) >= 3 })
	endMu.Lock()
	ends[1], ends[2], ends[3] = struct{}{}, struct{}{}, struct{}{}
	endMu.Unlock()
	c.wait(t, 3)
	for _, id := range []uint64{1, 2} {
		res := finalOf(t, c, id)
		toks, _ := c.tokensOf(t, id)
		if res.Finish != FinishedCancelled || len(toks) == 0 || len(toks) >= 100 {
			t.Errorf("request %d: finish %v with %d tokens", id, res.Finish, len(toks))
		}
	}
	if b := finalOf(t, c, 3).Beams; len(b) != 2 || len(b[0].Tokens) == 0 {
		t.Errorf("beam request ended with beams %+v", b)
	}
	poolWhole(t, m)
}

func TestGroupsUnderEveryPolicyNeverRunShortAndLeaveNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, policy := range []SchedulerPolicy{GuaranteedNoEvict, MaxUtilization, StaticBatch} {
		t.Run(string(policy), func(t *testing.T) {
			// 24 blocks of 4: a width-4 request of 6 + 10 tokens needs 1 + 4·3 = 13.
			m, c := start(t, cpuEngine(t, 24, 4), Config{Policy: policy, MaxBatchSize: 8})
			var n int
			for i := range 12 {
				ir := &InferenceRequest{ID: uint64(i + 1), InputIDs: randPrompt(rng, 2+rng.IntN(6), 1000), MaxNewTokens: 4 + rng.IntN(7), PadID: -1}
				switch i % 3 {
				case 0:
					ir.BeamWidth = 2 + rng.IntN(3)
				case 1:
					ir.NumReturnSequences = 2 + rng.IntN(2)
					ir.Sampling = engine.SamplingParams{Temperature: 1, Seed: uint64(i)}
				}
				c.add(ir)
				n++
			}
			c.wait(t, n)
			for id := uint64(1); id <= uint64(n); id++ {
				for _, r := range c.responses(id) {
					if r.err != nil {
						t.Errorf("request %d: %v", id, r.err)
					}
				}
			}
			poolWhole(t, m)
		})
	}
}

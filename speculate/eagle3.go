package speculate

import (
	"fmt"
	"slices"

	"gollm/engine"
	"gollm/kvcache"
)

// HiddenReader is a proposer that reads the target's hidden states: the manager asks
// the engine for the outputs of HiddenLayers at every position of the sequences that
// speculate, and hands over those of the positions the target kept with Observe.
type HiddenReader interface {
	Proposer
	// HiddenLayers are the target layers whose outputs the proposer reads.
	HiddenLayers() []int
	// Observe gives the hidden states of positions [pos, pos+n) of sequence key, row-major
	// [n][len(HiddenLayers)·hidden]; hidden is the caller's, read during the call only.
	Observe(key uint64, pos, n int, hidden []float32)
}

// Eagle3 proposes with an EAGLE-3 head (engine.Head): position j's target feature and
// token j+1 predict token j+2, each further proposal feeding back the head's own output.
// Each iteration it catches every sequence up — the positions the target kept since,
// whose features it was handed (Observe) — then runs up to Max-1 more steps, batched
// over the sequences. What the head wrote from its own outputs (the proposals' positions)
// is overwritten by the next catch-up. Greedy sequences get the head's greedy tokens;
// sampled ones tokens drawn from its distribution at their temperature, top-k and top-p
// over the draft vocabulary, with that distribution for speculative sampling. A sequence
// whose features have a gap, or which the head's pool has no room for, gets none.
type Eagle3 struct {
	// head runs the layer; info is its HeadInfo; vocab the target's vocabulary.
	head  engine.Head
	info  engine.HeadInfo
	vocab int
	// pool is the bookkeeping of the head's KV pool.
	pool *kvcache.Pool
	// seqs are the sequences' states by key.
	seqs map[uint64]*eagleSeq
	// sampler draws sampled sequences' proposals over the draft vocabulary.
	sampler *engine.Sampler
	// rows and runs are Propose's scratch.
	rows []engine.HeadRow
	runs []*eagleRun
}

// eagleSeq is one sequence's state in the head.
type eagleSeq struct {
	// kv is its block table in the head's pool.
	kv *kvcache.Sequence
	// real is the number of leading positions whose head KV came from target features.
	real int
	// feat holds the features of positions [fstart, fstart+len/width), not yet consumed.
	feat   []float32
	fstart int
	// broken says a feature was missed: the sequence gets no more proposals.
	broken bool
}

// eagleRun is one sequence's part of a call of Propose.
type eagleRun struct {
	// req is the request being filled; st its state.
	req *Request
	st  *eagleSeq
	// out and logits receive the output and logits of the run's latest row.
	out, logits []float32
	// sampled says proposals are drawn; done that the run proposes no more.
	sampled, done bool
}

// NewEagle3 makes an EAGLE-3 proposer on head (which it owns: Close closes it) for a
// target of vocabulary vocab.
func NewEagle3(head engine.Head, vocab int) (*Eagle3, error) {
	info := head.HeadInfo()
	for d, off := range info.D2T {
		if t := d + int(off); t < 0 || t >= vocab {
			return nil, fmt.Errorf("EAGLE-3 head: draft token %d maps to %d, outside the model's vocabulary [0, %d)", d, t, vocab)
		}
	}
	if len(info.D2T) != info.DraftVocab {
		return nil, fmt.Errorf("EAGLE-3 head: %d token mappings for a draft vocabulary of %d", len(info.D2T), info.DraftVocab)
	}
	pool, err := kvcache.New(kvcache.Config{NumBlocks: info.NumBlocks, TokensPerBlock: info.TokensPerBlock})
	if err != nil {
		return nil, fmt.Errorf("EAGLE-3 head: KV pool: %w", err)
	}
	return &Eagle3{head: head, info: info, vocab: vocab, pool: pool, seqs: map[uint64]*eagleSeq{},
		sampler: engine.NewSampler(info.DraftVocab)}, nil
}

// HiddenLayers are the target layers the head reads (HiddenReader).
func (g *Eagle3) HiddenLayers() []int { return g.info.AuxLayers }

// Observe keeps the features of positions [pos, pos+n) (HiddenReader).
func (g *Eagle3) Observe(key uint64, pos, n int, hidden []float32) {
	F := g.info.Features
	st := g.seqs[key]
	if st == nil {
		if pos != 0 {
			return // a sequence met midway has no features before: it never proposes
		}
		st = &eagleSeq{kv: g.pool.Add(nil, false)}
		g.seqs[key] = st
	}
	if skip := st.fstart - pos; skip > 0 {
		// Positions already consumed (their KV came from these features): skip them.
		if skip >= n {
			return
		}
		pos, n, hidden = st.fstart, n-skip, hidden[skip*F:]
	}
	end := st.fstart + len(st.feat)/F
	switch {
	case len(hidden) < n*F:
		st.broken = true
	case pos > end:
		st.broken = true
	default:
		st.feat = append(st.feat[:(pos-st.fstart)*F], hidden[:n*F]...)
	}
}

// Propose runs the head for the requests (Proposer).
func (g *Eagle3) Propose(reqs []*Request) error {
	H, F := g.info.Hidden, g.info.Features
	g.rows, g.runs = g.rows[:0], g.runs[:0]
	for _, r := range reqs {
		r.Draft, r.Probs = r.Draft[:0], r.Probs[:0]
		st := g.seqs[r.Key]
		L := len(r.Tokens)
		if st == nil || st.broken || L < 2 {
			continue
		}
		max := min(r.Max, g.info.MaxSeqLen-L+2)
		// Features for positions from..L-2 must be at hand: those whose KV the head wrote
		// from its own outputs, and at least the last, whose output gives the first
		// proposal.
		from := min(st.real, L-2)
		if from < st.fstart || st.fstart+len(st.feat)/F < L-1 || max < 1 {
			continue
		}
		if err := st.kv.Reserve(L - 2 + max); err != nil {
			continue
		}
		r.Max = max
		run := &eagleRun{req: r, st: st, out: make([]float32, H), logits: make([]float32, g.info.DraftVocab),
			sampled: r.Sampling.Temperature != 0 && r.Sampling.TopK != 1}
		for j := from; j <= L-2; j++ {
			row := engine.HeadRow{Pos: j, Token: r.Tokens[j+1], Blocks: st.kv.Blocks(),
				Feature: st.feat[(j-st.fstart)*F : (j-st.fstart+1)*F], Out: make([]float32, H)}
			if j == L-2 {
				row.Out, row.Logits = run.out, run.logits
			}
			g.rows = append(g.rows, row)
		}
		g.runs = append(g.runs, run)
	}
	for step := 0; len(g.rows) > 0; step++ {
		if err := g.head.Forward(g.rows); err != nil {
			g.Reset()
			return fmt.Errorf("EAGLE-3 head: %w", err)
		}
		g.rows = g.rows[:0]
		for _, run := range g.runs {
			if run.done {
				continue
			}
			r, st := run.req, run.st
			L := len(r.Tokens)
			if step == 0 {
				// The catch-up is done: positions below L-1 came from the target's features,
				// which are not needed again but the last one's (a call with no new token
				// recomputes that position for its output).
				st.real = L - 1
				drop := (L - 2 - st.fstart) * F
				st.feat = append(st.feat[:0], st.feat[drop:]...)
				st.fstart = L - 2
			}
			tok, err := g.pick(run)
			if err != nil {
				run.done = true
				continue
			}
			r.Draft = append(r.Draft, tok)
			if len(r.Draft) >= r.Max || slices.Contains(r.EndIDs, tok) {
				run.done = true
				continue
			}
			own := run.out
			run.out = make([]float32, H)
			g.rows = append(g.rows, engine.HeadRow{Pos: L - 2 + len(r.Draft), Token: tok, Blocks: st.kv.Blocks(),
				Own: own, Out: run.out, Logits: run.logits})
		}
	}
	return nil
}

// pick chooses a run's next proposal from its logits over the draft vocabulary: the
// greedy one, or a draw at the request's temperature, top-k and top-p, whose
// distribution, over the target's vocabulary, goes with it.
func (g *Eagle3) pick(run *eagleRun) (int32, error) {
	r := run.req
	p := engine.SamplingParams{Temperature: r.Sampling.Temperature, TopK: r.Sampling.TopK, TopP: r.Sampling.TopP}
	q, err := g.sampler.Probs(run.logits, &p)
	if err != nil {
		return -1, err
	}
	var d int32
	if run.sampled {
		at := len(r.Probs)
		r.Probs = slices.Grow(r.Probs, g.vocab)[:at+g.vocab]
		row := r.Probs[at:]
		clear(row)
		for x, v := range q {
			row[x+int(g.info.D2T[x])] = float32(v)
		}
		t := engine.SampleProbs(row, engine.Uniform(DraftSeed(r.Sampling.Seed), r.NumGenerated+len(r.Draft)))
		return t, nil
	}
	d = int32(slices.Index(q, 1))
	if d < 0 {
		d = 0
	}
	return d + g.info.D2T[d], nil
}

// Forget releases a sequence's head KV and features (Proposer).
func (g *Eagle3) Forget(key uint64) {
	if st := g.seqs[key]; st != nil {
		_ = st.kv.Release()
		delete(g.seqs, key)
	}
}

// Reset forgets every sequence (Proposer).
func (g *Eagle3) Reset() {
	for key := range g.seqs {
		g.Forget(key)
	}
}

// Close frees the head (Proposer).
func (g *Eagle3) Close() error {
	g.Reset()
	return g.head.Close()
}

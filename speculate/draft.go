package speculate

import (
	"errors"
	"fmt"
	"slices"

	"gollm/engine"
	"gollm/kvcache"
)

// Draft proposes with a draft model: a smaller model with the target's vocabulary (and
// tokenizer), on an engine of the same kind with a KV pool of its own. Each iteration it
// catches every sequence up — the tokens the target accepted since, on the first call
// the whole prompt — and then runs up to Max steps of the draft model, all sequences
// batched in each, one proposal per sequence per step; on an engine that pipelines
// (engine.Pipeliner) greedy calls chain those steps on the device (proposeChained). Greedy sequences get the draft's
// greedy tokens (certain proposals: the output is that of decoding without
// speculation); sampled ones get tokens drawn from the draft's distribution under the
// sequence's own settings, with that distribution, for speculative sampling's rule.
//
// The draft's KV of a sequence holds the tokens it has fed: its last run's proposals
// among them. Those the target did not keep are simply overwritten: the next call
// compares what was fed with the sequence's tokens and goes on from the first
// difference. A sequence the draft's pool has no room for gets no proposals.
type Draft struct {
	// eng runs the draft model; info is its Info.
	eng  engine.Engine
	info engine.Info
	// pool is the bookkeeping of eng's KV pool.
	pool *kvcache.Pool
	// seqs are the sequences' states by key.
	seqs map[uint64]*draftSeq
	// sampler draws sampled sequences' proposals.
	sampler *engine.Sampler
	// batch, runs and outs are Propose's scratch.
	batch engine.Batch
	runs  []*draftRun
	// broken, once set, turns the proposer off (its engine failed and did not recover).
	broken error
}

// draftSeq is one sequence's state in the draft model.
type draftSeq struct {
	// kv is its block table in the draft's pool.
	kv *kvcache.Sequence
	// fed are the tokens whose keys and values kv holds, positions 0 on.
	fed []int32
}

// draftRun is one sequence's part in a call of Propose.
type draftRun struct {
	// req is the request being filled.
	req *Request
	// st is its state.
	st *draftSeq
	// hist is its tokens followed by the proposals so far.
	hist []int32
	// sampled says the proposals are drawn from the draft's distribution.
	sampled bool
	// done says it proposes no more this call.
	done bool
	// pre is how many of its catch-up tokens proposeChained feeds one a step first, and
	// main the position of the first its main step 0 feeds.
	pre, main int
}

// NewDraft makes a draft-model proposer on eng, which it owns from then on (Close
// closes it). vocab is the target's vocabulary: the draft's must be the same.
func NewDraft(eng engine.Engine, vocab int) (*Draft, error) {
	info := eng.Info()
	if info.VocabSize != vocab {
		return nil, fmt.Errorf("draft model: its vocabulary has %d tokens, the model's %d: a draft must share the model's tokenizer and vocabulary", info.VocabSize, vocab)
	}
	pool, err := kvcache.New(kvcache.Config{NumBlocks: info.NumBlocks, TokensPerBlock: info.TokensPerBlock})
	if err != nil {
		return nil, fmt.Errorf("draft model: KV pool: %w", err)
	}
	return &Draft{eng: eng, info: info, pool: pool, seqs: map[uint64]*draftSeq{}, sampler: engine.NewSampler(info.VocabSize)}, nil
}

// Propose runs the draft model for the requests (Proposer).
func (d *Draft) Propose(reqs []*Request) error {
	if d.broken != nil {
		return d.broken
	}
	d.runs = d.runs[:0]
	for _, r := range reqs {
		r.Draft, r.Probs = r.Draft[:0], r.Probs[:0]
		if run := d.start(r); run != nil {
			d.runs = append(d.runs, run)
		}
	}
	if pipe, ok := d.eng.(engine.Pipeliner); ok && d.chains() {
		return d.proposeChained(pipe)
	}
	for step := 0; ; step++ {
		d.batch.Seqs = d.batch.Seqs[:0]
		var live []*draftRun
		for _, run := range d.runs {
			if run.done {
				continue
			}
			d.batch.Seqs = append(d.batch.Seqs, d.row(run))
			live = append(live, run)
		}
		if len(live) == 0 {
			return nil
		}
		outs, err := d.eng.Step(&d.batch)
		if err == nil && len(outs) != len(live) {
			err = fmt.Errorf("%d outputs for %d sequences", len(outs), len(live))
		}
		if err != nil {
			d.fail(err)
			return fmt.Errorf("draft model: %w", err)
		}
		for i, run := range live {
			if err := d.take(run, &d.batch.Seqs[i], &outs[i]); err != nil {
				d.fail(err)
				return fmt.Errorf("draft model: %w", err)
			}
		}
	}
}

// chains says whether this call's runs may be chained on the engine (proposeChained):
// every one greedy, and nothing it samples with reads the fed token's history
// (penalties, bad words of several tokens).
func (d *Draft) chains() bool {
	for _, run := range d.runs {
		p := &run.req.Sampling
		if run.sampled || p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
			return false
		}
		for _, w := range p.BadWords {
			if len(w) > 1 {
				return false
			}
		}
	}
	return true
}

// maxPreSteps is the most catch-up tokens of a run, past its last, that proposeChained
// feeds in steps of one token ahead of its first proposal: a few chained decode steps
// (graph replays on the GPU) cost less than one step of several tokens run eagerly.
const maxPreSteps = 3

// proposeChained runs the draft's steps on a Pipeliner, each launched before the
// previous one's outputs are read, its rows fed by that one's sampled tokens on the
// device (Sequence.Feed). A run's catch-up — the tokens the target accepted since, and
// its own — goes first: all but the last of up to maxPreSteps+1 tokens in steps of one
// token (their samples unread), more in the main step 0. Main step 0 feeds each run's
// last token and samples its first proposal; main step j feeds proposal j-1 of each run
// that proposes more than j tokens. The engine runs the steps back to back, and the host
// reads each one's proposals while the next computes. A run that meets an end token
// stops taking proposals; the rows already launched for it compute for nothing, their
// keys and values past what it fed.
func (d *Draft) proposeChained(pipe engine.Pipeliner) error {
	pre := 0 // steps before main step 0
	for _, run := range d.runs {
		run.pre = 0
		if m := len(run.hist) - len(run.st.fed); m <= maxPreSteps+1 {
			run.pre = m - 1
		}
		run.main = len(run.st.fed) + run.pre
		pre = max(pre, run.pre)
	}
	// rows[s%2] are the runs of step s, in its batch's order.
	var rows [2][]*draftRun
	launched := 0
	fail := func(err error) error {
		for ; launched > 0; launched-- {
			_, _ = pipe.Wait()
		}
		d.fail(err)
		return fmt.Errorf("draft model: %w", err)
	}
	launch := func(s int) error {
		cur, prev := &rows[s%2], rows[(s+1)%2]
		d.batch.Seqs = d.batch.Seqs[:0]
		*cur = (*cur)[:0]
		switch j := s - pre; {
		case j < 0:
			// A catch-up token of each run with one in this step, known on the host.
			for _, run := range d.runs {
				if k := run.pre + j; k >= 0 {
					r, at := run.req, len(run.hist)-run.pre-1+k
					*cur = append(*cur, run)
					d.batch.Seqs = append(d.batch.Seqs, engine.Sequence{
						ID: r.Key, Tokens: run.hist[at : at+1 : at+1], Pos: at, Blocks: run.st.kv.Blocks(), Sample: true,
						Sampling: r.Sampling, History: run.hist[: at+1 : at+1], NumGenerated: r.NumGenerated,
					})
				}
			}
		case j == 0:
			for _, run := range d.runs {
				*cur = append(*cur, run)
				q := d.row(run)
				// Past the catch-up tokens the steps before feed (some may not be read yet).
				q.Tokens, q.Pos = run.hist[run.main:len(run.hist):len(run.hist)], run.main
				d.batch.Seqs = append(d.batch.Seqs, q)
			}
		default:
			for i, run := range prev {
				if run.done || run.req.Max <= j {
					continue
				}
				// Proposal j-1, at position len(Tokens)+j-1, comes from step s-1's
				// sampling: a placeholder here, and History lacks it (proposals up to j-2
				// are taken).
				r := run.req
				pos := len(r.Tokens) + j - 1
				*cur = append(*cur, run)
				d.batch.Seqs = append(d.batch.Seqs, engine.Sequence{
					ID: r.Key, Tokens: run.hist[:1:1], Pos: pos, Blocks: run.st.kv.Blocks(), Sample: true,
					Sampling: r.Sampling, History: run.hist[:pos:pos], NumGenerated: r.NumGenerated + j, Feed: i + 1,
				})
			}
		}
		if len(d.batch.Seqs) == 0 {
			return nil
		}
		if err := pipe.Launch(&d.batch); err != nil {
			return err
		}
		launched++
		return nil
	}
	if err := launch(0); err != nil {
		return fail(err)
	}
	for s := 0; launched > 0; s++ {
		// Step s+1 is launched before step s's outputs are read; rows of runs that step s
		// ends compute for nothing.
		if err := launch(s + 1); err != nil {
			return fail(err)
		}
		outs, err := pipe.Wait()
		launched--
		cur := rows[s%2]
		if err == nil && len(outs) != len(cur) {
			err = fmt.Errorf("%d outputs for %d sequences", len(outs), len(cur))
		}
		if err != nil {
			return fail(err)
		}
		for i, run := range cur {
			if run.done {
				continue
			}
			// The tokens step s fed: one before main step 0 and after it, the rest of
			// the catch-up at it.
			n := len(run.st.fed)
			fed := 1
			if s == pre {
				fed = len(run.hist) - n
			}
			if s < pre {
				run.st.fed = append(run.st.fed, run.hist[n])
				continue
			}
			q := engine.Sequence{Tokens: run.hist[n : n+fed]}
			if err := d.take(run, &q, &outs[i]); err != nil {
				return fail(err)
			}
		}
	}
	return nil
}

// start readies one request: its state caught up to what still matches its tokens, and
// blocks for every position this call may feed. It returns nil when the request gets no
// proposals (no room).
func (d *Draft) start(r *Request) *draftRun {
	L := len(r.Tokens)
	max := min(r.Max, d.info.MaxSeqLen-L+1)
	if L == 0 || max <= 0 {
		return nil
	}
	st := d.seqs[r.Key]
	if st == nil {
		st = &draftSeq{kv: d.pool.Add(nil, false)}
		d.seqs[r.Key] = st
	}
	// What the draft computed stays valid up to the first token that differs.
	n := 0
	for n < len(st.fed) && n < L-1 && st.fed[n] == r.Tokens[n] {
		n++
	}
	st.fed = st.fed[:n]
	// Positions n..L-1 are fed first, then up to max-1 proposals.
	if err := st.kv.Reserve(L + max - 1); err != nil {
		max = st.kv.Capacity() - L + 1
		if max <= 0 {
			return nil
		}
	}
	r.Max = max
	p := &r.Sampling
	return &draftRun{req: r, st: st, hist: slices.Grow(slices.Clone(r.Tokens), max),
		sampled: p.Temperature != 0 && p.TopK != 1}
}

// row is a run's draft-model sequence for its next step: the tokens not fed yet.
func (d *Draft) row(run *draftRun) engine.Sequence {
	r, st := run.req, run.st
	n := len(st.fed)
	end := len(run.hist)
	s := engine.Sequence{
		ID: r.Key, Tokens: run.hist[n:end:end], Pos: n, Blocks: st.kv.Blocks(),
		Sampling: r.Sampling, History: run.hist[:end:end], NumGenerated: r.NumGenerated + len(r.Draft),
	}
	if run.sampled {
		s.ReturnLogits = true
	} else {
		s.Sample = true
	}
	return s
}

// take applies a run's step output: the tokens fed are in the draft's KV, and the next
// proposal is appended.
func (d *Draft) take(run *draftRun, s *engine.Sequence, out *engine.Output) error {
	r, st := run.req, run.st
	st.fed = append(st.fed, s.Tokens...)
	tok := out.Token
	if run.sampled {
		if len(out.Logits) != d.info.VocabSize {
			return fmt.Errorf("sequence %d: %d logits, vocabulary %d", r.Key, len(out.Logits), d.info.VocabSize)
		}
		d.sampler.Process(out.Logits, s)
		q, err := d.sampler.Probs(out.Logits, &s.Sampling)
		if err != nil {
			// Every token masked: the target would fail the same way; propose nothing more.
			run.done = true
			return nil
		}
		at := len(r.Probs)
		for _, x := range q {
			r.Probs = append(r.Probs, float32(x))
		}
		tok = engine.SampleProbs(r.Probs[at:], engine.Uniform(DraftSeed(s.Sampling.Seed), s.NumGenerated))
	}
	if tok < 0 || int(tok) >= d.info.VocabSize {
		return fmt.Errorf("sequence %d: proposed token %d outside the vocabulary", r.Key, tok)
	}
	r.Draft = append(r.Draft, tok)
	run.hist = append(run.hist, tok)
	run.done = len(r.Draft) >= r.Max || slices.Contains(r.EndIDs, tok)
	return nil
}

// fail drops every sequence's state after a failed step (the engine may have written
// anything) and recovers the engine where it can; one that cannot turns the proposer
// off.
func (d *Draft) fail(cause error) {
	d.Reset()
	if rec, ok := d.eng.(engine.Recoverer); ok {
		if err := rec.Recover(cause); err != nil {
			d.broken = fmt.Errorf("draft model: its engine failed and cannot recover: %w", errors.Join(err, cause))
		}
	}
}

// Forget releases a sequence's draft KV (Proposer).
func (d *Draft) Forget(key uint64) {
	if st := d.seqs[key]; st != nil {
		_ = st.kv.Release()
		delete(d.seqs, key)
	}
}

// Reset releases every sequence's draft KV (Proposer).
func (d *Draft) Reset() {
	for key := range d.seqs {
		d.Forget(key)
	}
}

// Close closes the draft engine (Proposer).
func (d *Draft) Close() error {
	d.Reset()
	return d.eng.Close()
}

package batchmanager

import (
	"errors"
	"fmt"
	"math"

	"go.uber.org/zap"

	"gollm/engine"
	"gollm/kvcache"
	"gollm/speculate"
)

// Speculative decoding (Config.Speculation). After scheduling, each generation step of
// a request that speculates asks the proposer for up to k tokens that may follow; they
// are written after the request's tokens (in its buffer's spare capacity, past every
// view a response holds), their positions get KV blocks, and the step runs the last
// token and the proposals as one sequence with engine.Sequence.Draft. The engine returns
// the accepted proposals and one token more; they are taken one by one exactly as tokens
// of successive steps would be — end tokens, stop words and strings, the length limit,
// log-probabilities, generation logits, streaming — and the keys and values written for
// the rejected proposals stay in the blocks, to be overwritten by the next step (the
// computed count stops after the accepted ones). A request's worst case in blocks is
// unchanged: proposals never reach past its last position.
//
// How many tokens are proposed: at most MaxDraft (num_speculative_tokens); no more than
// the request has left to generate; about one more than the request's recent accepted
// count (a running average), so that a request whose proposals fail proposes little
// (and below a quarter of a token, only every fourth step);
// and within the step's budget of generation rows, MaxStepTokens: with g sequences
// generating, of which s speculate, each proposes at most (MaxStepTokens-g)/s, so
// proposals shrink as the batch grows and stop once g reaches the budget; with
// Speculation.Adaptive, no more than the policy allows at the batch's size, none where
// proposals do not pay (specpolicy.go). They also stop for what the token budget
// (max_num_tokens) or the KV pool (max_utilization) does not leave.
//
// A request the proposer has nothing for counts as one whose proposals failed. Under the
// overlap schedule a request that waits out its next step has its steps launched ahead
// meanwhile; one that may propose is not launched ahead of.
//
// Which requests speculate: single-sequence requests sampled by the engine, without a
// runtime top-p decay (it moves with every token on the host), that did not opt out
// (InferenceRequest.NoSpeculation), under in-flight batching. A step with proposals is
// never launched ahead of its predecessor's outputs (Config.Overlap): its successor's
// tokens are not known until its own are. A proposer that reads the model's hidden
// states (speculate.HiddenReader: EAGLE-3) is handed those of every position a
// speculating request keeps, from its prompt on (engine.Batch.HiddenLayers), and then no
// step is launched ahead.

// Speculation configures speculative decoding.
type Speculation struct {
	// Proposer proposes the tokens; nil turns speculation off. The manager closes it at
	// Shutdown (and, when New fails, the caller does).
	Proposer speculate.Proposer
	// MaxDraft is num_speculative_tokens: the most tokens proposed for a sequence in a
	// step, from 1 to the engine's Info.MaxDraft.
	MaxDraft int
	// MaxStepTokens bounds a step's generation rows with their proposals (default
	// DefaultMaxStepTokens).
	MaxStepTokens int
	// Adaptive measures what proposals gain per batch size and holds them back where
	// they do not pay (specpolicy.go); off, every request that may speculate proposes
	// as the rules above allow.
	Adaptive bool
}

// lowAcceptance is the running average of accepted proposals per step below which a
// request proposes only every fourth step: each proposal costs a row of the step (and,
// with a draft model, its steps), which a request that never has one accepted wastes.
const lowAcceptance = 0.25

// DefaultMaxStepTokens is Speculation.MaxStepTokens's default: a batch of up to 16
// generating sequences can afford at least one proposal each, and 32 or more none.
const DefaultMaxStepTokens = 32

// withDefaults checks the speculation settings against the engine.
func (s Speculation) withDefaults(info engine.Info, mt ModelType) (Speculation, error) {
	if s.Proposer == nil {
		return s, nil
	}
	switch {
	case info.MaxDraft == 0:
		return s, errors.New("batchmanager: speculative decoding: this engine does not verify proposed tokens")
	case s.MaxDraft < 1 || s.MaxDraft > info.MaxDraft:
		return s, fmt.Errorf("batchmanager: num_speculative_tokens %d: want 1 to %d (the most this engine verifies per sequence and step)", s.MaxDraft, info.MaxDraft)
	case mt == V1:
		return s, errors.New("batchmanager: speculative decoding needs in-flight batching; gpt_model_type is V1")
	case info.Hidden == 0 && hiddenReader(s.Proposer):
		return s, errors.New("batchmanager: speculative decoding: the proposer reads the model's hidden states, which this engine does not return")
	case s.MaxStepTokens < 0:
		return s, fmt.Errorf("batchmanager: speculative max step tokens %d must not be negative", s.MaxStepTokens)
	}
	if s.MaxStepTokens == 0 {
		s.MaxStepTokens = DefaultMaxStepTokens
	}
	return s, nil
}

// specRequest is a request's speculation state.
type specRequest struct {
	// req is the proposer's request, its buffers reused from step to step.
	req speculate.Request
	// avg is a running average of the proposals accepted per step.
	avg float64
	// rest counts the steps a request whose proposals keep failing still waits before
	// it proposes again.
	rest int
	// draft is the number of proposals scheduled this step; probs their distributions
	// (empty for certain proposals).
	draft int
	probs []float32
}

// specTotals count the manager's speculation since it started.
type specTotals struct {
	// drafted and accepted count proposals; steps count the sequences' steps that
	// verified proposals.
	drafted, accepted, steps uint64
}

// speculates says whether r may carry proposals.
func (m *Manager) speculates(r *request) bool {
	// A guided sequence's mask holds for its next token only; the proposals past it
	// would need a mask each, so guided requests decode one token a step.
	return m.cfg.Speculation.Proposer != nil && !r.req.NoSpeculation && r.width == 1 && !r.hostSampled() &&
		r.req.TopPDecay <= 0 && m.cfg.ModelType != V1 && r.req.Guide == nil
}

// proposesNext says whether r may ask for proposals at its next step: not while it
// waits out steps after proposals that kept failing.
func (r *request) proposesNext() bool {
	return r.spec == nil || r.spec.avg >= lowAcceptance || r.spec.rest <= 0
}

// perSequenceDraft is the most proposals each of s speculating sequences may carry in
// a step where g sequences generate.
func (m *Manager) perSequenceDraft(g, s int) int {
	sp := &m.cfg.Speculation
	if s == 0 || g >= sp.MaxStepTokens {
		return 0
	}
	return min(sp.MaxDraft, (sp.MaxStepTokens-g)/s, m.policy.limit(g))
}

// generating says whether r's scheduled work this iteration is one generation step: its
// last token, with nothing else to compute.
func (r *request) generating() bool {
	return r.n == 1 && r.generated > 0 && r.computed == len(r.tokens)-1 && r.kv != nil && !r.ended
}

// propose asks the proposer for the scheduled generation steps' proposals and makes
// room for them: KV blocks, the token budget, the request's buffer.
func (m *Manager) propose() {
	sp := &m.cfg.Speculation
	if sp.Proposer == nil {
		return
	}
	g, cands := 0, m.specCands[:0]
	for _, r := range m.sched {
		for _, b := range r.branches() {
			if b.n == 1 && b.generated > 0 {
				g++
			}
		}
		if m.speculates(r) && r.generating() {
			cands = append(cands, r)
		}
	}
	m.specCands = cands
	per := m.perSequenceDraft(g, len(cands))
	if per <= 0 {
		return
	}
	budget := math.MaxInt
	if m.cfg.MaxNumTokens > 0 {
		budget = m.cfg.MaxNumTokens
		for _, r := range m.sched {
			for _, b := range r.branches() {
				budget -= b.n
			}
		}
	}
	reqs, asked := m.specReqs[:0], cands[:0]
	for _, r := range cands {
		if r.spec == nil {
			r.spec = &specRequest{avg: float64(sp.MaxDraft)}
		}
		// The last position a request can write is promptLen+maxNew-2: proposals stop
		// there, inside its worst case.
		k := min(per, r.maxNew-r.generated-1, m.info.MaxSeqLen-len(r.tokens), int(math.Ceil(r.spec.avg))+1)
		if k <= 0 {
			continue
		}
		if r.spec.avg < lowAcceptance {
			// Its proposals keep failing: try again every fourth step only.
			if r.spec.rest > 0 {
				r.spec.rest--
				continue
			}
			r.spec.rest = 3
		}
		q := &r.spec.req
		q.Key, q.Tokens, q.Max = r.id, r.tokens[:len(r.tokens):len(r.tokens)], k
		q.Sampling, q.NumGenerated, q.EndIDs = r.samplingFor(&r.branch), r.generated, r.req.EndIDs
		q.Draft, q.Probs = q.Draft[:0], q.Probs[:0]
		reqs = append(reqs, q)
		asked = append(asked, r)
	}
	m.specReqs = reqs
	if len(reqs) == 0 {
		return
	}
	m.it.asked = true
	if err := m.callPropose(reqs); err != nil {
		m.log.Warn("the proposer failed; this step runs without proposals", zap.Error(err))
		return
	}
	V := m.info.VocabSize
	for _, r := range asked {
		q := &r.spec.req
		if len(q.Draft) == 0 {
			// Nothing to propose (prompt lookup found no match) counts as a step with none
			// accepted: a request the proposer rarely has anything for goes back to
			// plain steps, which may run ahead (Config.Overlap), asking every fourth step.
			r.spec.avg *= 0.7
			continue
		}
		if budget <= 0 {
			continue
		}
		d := min(len(q.Draft), q.Max, budget)
		if len(q.Probs) != 0 && len(q.Probs) < d*V {
			m.log.Warn("the proposer gave distributions of the wrong size; proposals dropped",
				zap.Uint64("request", r.id), zap.Int("proposals", len(q.Draft)), zap.Int("values", len(q.Probs)))
			continue
		}
		for i, t := range q.Draft[:d] {
			if t < 0 || int(t) >= V {
				d = i
				break
			}
		}
		d = m.reserveDraft(r, d)
		if d == 0 {
			continue
		}
		L := len(r.tokens)
		copy(r.tokens[L:L+d], q.Draft[:d])
		r.n, r.spec.draft = 1+d, d
		r.spec.probs = nil
		if len(q.Probs) != 0 {
			r.spec.probs = q.Probs[:d*V]
		}
		budget -= d
	}
}

// callPropose runs the proposer, turning a panic in it into an error.
func (m *Manager) callPropose(reqs []*speculate.Request) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("proposer panicked: %v", p)
		}
	}()
	return m.cfg.Speculation.Proposer.Propose(reqs)
}

// reserveDraft gives r's d proposals their positions' KV blocks and returns how many
// got them: all under the guaranteed policies (the worst case covers them), what the
// pool has under max_utilization, which speculation never pauses a request for.
func (m *Manager) reserveDraft(r *request, d int) int {
	tpb := m.pool.TokensPerBlock()
	before := len(r.kv.Blocks())
	end := r.computed + 1 + d // positions [computed, end) are written
	if err := r.kv.Reserve(end); err != nil {
		if !errors.Is(err, kvcache.ErrFull) {
			m.log.Error("reserving KV blocks for proposals", zap.Uint64("request", r.id), zap.Error(err))
		}
		end = min(end, r.kv.Capacity())
	}
	r.perf.NewBlocks += len(r.kv.Blocks()) - before
	for blk := r.computed / tpb; blk <= (end-1)/tpb; blk++ {
		src, dst, copied, err := r.kv.Writable(blk * tpb)
		if err != nil {
			end = blk * tpb
			break
		}
		if copied {
			r.perf.NewBlocks++
			m.batch.BlockCopies = append(m.batch.BlockCopies, engine.BlockCopy{Src: src, Dst: dst})
		}
	}
	return max(0, end-r.computed-1)
}

// forgetSpec tells the proposer that r's sequence is gone (ended, paused, cancelled):
// every request's, since a proposer may hold state for one it never proposed for (an
// EAGLE-3 head's features of its prompt).
func (m *Manager) forgetSpec(r *request) {
	if m.cfg.Speculation.Proposer == nil {
		return
	}
	m.cfg.Speculation.Proposer.Forget(r.id)
}

// acceptDraft applies the output of a step with proposals: the tokens kept, one by one
// as if from successive steps, until one ends the request.
func (m *Manager) acceptDraft(r *request, b *branch, seq *engine.Sequence, out *engine.Output) {
	vocab := m.info.VocabSize
	d := seq.Draft
	drafts := seq.Tokens[len(seq.Tokens)-d:]
	toks := out.Tokens
	r.spec.draft = 0
	if out.Err != nil {
		// This sequence alone failed at its first position (every token masked).
		r.failed = fmt.Errorf("%w: generated token %d: %w", seqFailure(out.Err), b.generated+1, out.Err)
		return
	}
	switch {
	case len(toks) < 1 || len(toks) > d+1:
		r.failed = fmt.Errorf("%w: %d tokens for %d proposals", ErrEngine, len(toks), d)
		return
	case len(out.LogProbs) != len(toks):
		r.failed = fmt.Errorf("%w: %d log-probabilities for %d tokens", ErrEngine, len(out.LogProbs), len(toks))
		return
	case seq.ReturnLogits && len(out.Logits) != len(toks)*vocab:
		r.failed = fmt.Errorf("%w: %d logits for %d tokens of vocabulary %d", ErrEngine, len(out.Logits), len(toks), vocab)
		return
	}
	for i, t := range toks[:len(toks)-1] {
		if t != drafts[i] {
			r.failed = fmt.Errorf("%w: token %d is %d where the proposal it keeps is %d", ErrEngine, i, t, drafts[i])
			return
		}
	}
	accepted := len(toks) - 1
	// The last real token and the accepted proposals are in the KV now; what the
	// rejected ones wrote is overwritten from here on.
	b.computed = seq.Pos + len(toks)
	if seq.ReturnHidden {
		m.observe(r, seq.Pos, len(toks), out)
	}
	if m.cfg.EnableKVCacheReuse {
		b.kv.Commit(b.computed)
	}
	m.it.drafted += d
	m.it.accepted += accepted
	m.it.specSteps++
	m.specTotal.drafted += uint64(d)
	m.specTotal.accepted += uint64(accepted)
	m.specTotal.steps++
	r.perf.DraftTokens += d
	r.perf.AcceptedDraftTokens += accepted
	r.spec.avg = 0.7*r.spec.avg + 0.3*float64(accepted)
	for i, t := range toks {
		var logits []float32
		if seq.ReturnLogits {
			logits = out.Logits[i*vocab : (i+1)*vocab : (i+1)*vocab]
		}
		if m.takeToken(r, b, t, out.LogProbs[i], logits) {
			return
		}
	}
}

// observeSpec hands the iteration that just completed to the adaptive policy.
func (m *Manager) observeSpec() {
	if m.policy == nil {
		return
	}
	eligible := false
	if m.it.genReqs < m.cfg.Speculation.MaxStepTokens {
		for _, r := range m.sched {
			if m.speculates(r) {
				eligible = true
				break
			}
		}
	}
	m.policy.observe(specSample{at: m.clock(), gen: m.it.genReqs, ctx: m.it.ctxReqs, tokens: m.it.genTokens,
		asked: m.it.asked, eligible: eligible})
}

// closeProposer closes the proposer when the loop ends.
func (m *Manager) closeProposer() {
	if sp := m.cfg.Speculation.Proposer; sp != nil {
		if err := sp.Close(); err != nil {
			m.log.Warn("closing the proposer", zap.Error(err))
		}
	}
}

// hiddenReader says whether p reads the target's hidden states.
func hiddenReader(p speculate.Proposer) bool {
	_, ok := p.(speculate.HiddenReader)
	return ok
}

// observe hands the hidden states of a step's kept positions [pos, pos+n) of r to the
// proposer that reads them.
func (m *Manager) observe(r *request, pos, n int, out *engine.Output) {
	if m.hidden == nil || n <= 0 {
		return
	}
	w := len(m.hidden.HiddenLayers()) * m.info.Hidden
	if len(out.Hidden) < n*w {
		m.log.Warn("the engine returned too few hidden states; the proposer skips the request",
			zap.Uint64("request", r.id), zap.Int("values", len(out.Hidden)), zap.Int("want", n*w))
		m.hidden.Forget(r.id)
		return
	}
	m.hidden.Observe(r.id, pos, n, out.Hidden[:n*w])
}

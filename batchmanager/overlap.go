package batchmanager

import (
	"fmt"
	"math"
	"time"

	"gollm/engine"
)

// The overlap schedule (Config.Overlap). An iteration whose rows each either sample a
// token for a request that samples without its token history, or compute a prompt chunk
// whose next chunk is known, and that holds a row of every running request, launches
// its successor before its own outputs are read: each continuing generation gets a row
// fed by its own sampled token on the engine (engine.Sequence.Feed), one position on;
// each prompt its next chunk; waiting requests their first chunk; every row's blocks are
// reserved now. The host then reads the first iteration's outputs and does its work on
// them — new tokens, stop conditions, responses — while the engine computes the second.
// That one, the step ahead, is the next iteration: it is not scheduled again but waited
// for, and while it runs the step after it may be launched ahead in turn, for as long as
// the batch stays eligible. A request that ended meanwhile (an end token, a stop word, a
// cancellation) has its row computed for nothing; its blocks are released at once,
// which is safe because every later iteration runs after the step ahead on the engine,
// and the position that row writes is past everything the block holds for reuse.

// aheadStep is an iteration launched ahead: generation rows fed by the iteration
// launched before it, prompt chunks, and the first chunks of requests admitted into it.
type aheadStep struct {
	// batch is what was launched.
	batch engine.Batch
	// refs name each row's request and branch.
	refs []seqRef
	// late says some rows' masks are to be supplied (engine.LateMasker).
	late bool
}

// stepPiped runs the scheduled batch through the pipe: it is launched, then its
// successor is launched ahead when the batch allows, then it is waited for.
func (m *Manager) stepPiped() ([]engine.Output, error) {
	if err := m.pipe.Launch(&m.batch); err != nil {
		return nil, err
	}
	m.launched++
	if next := m.planAhead(m.batch.Seqs, m.refs); next != nil {
		if err := m.launchAhead(next); err != nil {
			// The step's requests end with the error (step's failStep waits for it).
			return nil, err
		}
	}
	m.launched--
	return m.pipe.Wait()
}

// launchAhead launches next and makes it the step ahead. A launch that fails is an
// engine failure like any other (the engine must recover before it runs again): the
// caller fails the requests in flight; requests admitted into next stay admitted and
// are scheduled in turn.
func (m *Manager) launchAhead(next *aheadStep) error {
	if err := m.pipe.Launch(&next.batch); err != nil {
		m.keepSpare(next)
		return err
	}
	m.launched++
	m.ahead = next
	return nil
}

// drainPipe waits for every launched iteration, discarding its outputs, and forgets the
// step ahead: after a failure, before anything is launched again.
func (m *Manager) drainPipe() {
	for ; m.launched > 0; m.launched-- {
		_, _ = m.pipe.Wait()
	}
	if m.ahead != nil {
		m.keepSpare(m.ahead)
		m.ahead = nil
	}
}

// keepSpare keeps a finished aheadStep for the next plan, its references cleared.
func (m *Manager) keepSpare(a *aheadStep) {
	clear(a.refs)
	a.refs = a.refs[:0]
	clear(a.batch.Seqs)
	a.batch.Seqs = a.batch.Seqs[:0]
	a.batch.BlockCopies = a.batch.BlockCopies[:0]
	a.late = false
	m.spare = a
}

// runsAhead says whether r may have rows launched ahead: the engine samples it, and
// nothing it samples with reads the token the row is fed (penalties and bad words of
// several tokens read the history, top-p decay the last token; beams and sampled
// groups are chosen among on the host), or only what its masks come with after the
// launch (a constraint, with lateMasks: engine.LateMasker).
func (r *request) runsAhead(lateMasks bool) bool {
	if r.hostSampled() || r.beams || r.width > 1 || r.req.TopPDecay > 0 || r.req.Guide != nil && !lateMasks {
		return false
	}
	p := &r.sampling
	if p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		return false
	}
	for _, w := range p.BadWords {
		if len(w) > 1 {
			return false
		}
	}
	return true
}

// alive says whether a row's branch still runs: its request was not ended, stopped,
// failed or released since the row was launched.
func alive(ref seqRef) bool {
	return ref.r.phase == phaseRunning && ref.r.failed == nil && !ref.b.ended && ref.b.kv != nil
}

// planAhead builds the iteration after base (launched, its outputs not read yet): a fed
// row for each row of base that samples and whose branch goes on unless its token ends
// it, the next chunk of each prompt chunk, and waiting requests admitted after them; or
// nil when base is not eligible — not in-flight batching under guaranteed_no_evict or
// max_utilization, a paused request, a waiting one that cannot join (joinsAhead), a
// running request without a row in base, a sampling row whose request cannot run ahead,
// a row whose next tokens the host chooses — or when nothing goes on, a chunk does not
// fit the budget, or a block cannot be had.
func (m *Manager) planAhead(base []engine.Sequence, refs []seqRef) *aheadStep {
	if m.cfg.ModelType == V1 || m.cfg.Policy == StaticBatch || len(m.paused) > 0 || len(base) == 0 || m.hidden != nil {
		// A proposer that reads hidden states needs every step's (m.hidden): no step is
		// launched ahead, whose rows ask for none.
		return nil
	}
	if len(m.waiting) > 0 && !m.joinsAhead(m.waiting[0]) {
		// The scheduler admits it, in turn.
		return nil
	}
	// Every running request must have a row in base: one the scheduler left out (the
	// token budget) would get none in the steps ahead either, for as long as they go on.
	rows := 0
	for _, ref := range refs {
		if alive(ref) {
			rows++
		}
	}
	if rows != len(m.running) {
		return nil
	}
	for i := range base {
		s, r := &base[i], refs[i].r
		switch {
		case r.req.Guide != nil && m.late == nil:
			// Its next mask needs its next token, and the engine takes masks only at launch.
			return nil
		case s.Sample && !r.runsAhead(m.late != nil):
			return nil
		case s.Draft > 0 || s.Sample && m.speculates(r) && m.perSequenceDraft(len(base), 1) > 0 && r.proposesNext():
			// Its tokens are not known before its outputs are read, or it may carry
			// proposals in the next step, which the scheduler makes. One whose proposals
			// keep failing and that waits out its next step (specRequest.rest) runs
			// ahead: the step ahead stands for that step.
			return nil
		case !s.Sample && (s.ReturnLogits || r.width > 1):
			// The host chooses its token from these logits, or a group may fork after
			// this chunk: the next row is not known before the outputs are read.
			return nil
		}
	}
	a := m.spare
	m.spare = nil
	if a == nil {
		a = &aheadStep{}
	}
	// Generation rows first, one token each; prompt chunks take what the budget leaves
	// (the scheduler's order).
	budget := math.MaxInt
	if m.cfg.MaxNumTokens > 0 {
		budget = m.cfg.MaxNumTokens
		for i := range base {
			if base[i].Sample {
				budget--
			}
		}
	}
	tpb := m.pool.TokensPerBlock()
	for i := range base {
		s, ref := &base[i], refs[i]
		r, b := ref.r, ref.b
		if !alive(ref) {
			continue
		}
		if !s.Sample {
			// A prompt chunk: the next chunk's tokens are known.
			if !m.planChunk(a, s, ref, &budget) {
				m.keepSpare(a)
				return nil
			}
			continue
		}
		// The token base samples goes at pos; the row ahead computes it there.
		pos := s.Pos + len(s.Tokens)
		if len(b.tokens) != pos || b.computed > s.Pos {
			m.log.Sugar().Errorw("a row planned ahead does not follow its branch; the step ahead is dropped",
				"request", r.id, "tokens", len(b.tokens), "computed", b.computed, "pos", pos)
			m.keepSpare(a)
			return nil
		}
		if b.generated+1 >= r.maxNew || pos+1 >= m.info.MaxSeqLen || cap(b.tokens) <= pos {
			continue // base's token ends it at the length limit
		}
		before := len(b.kv.Blocks())
		if err := b.kv.Reserve(pos + 1); err != nil {
			// The pool is short: the scheduler decides who pauses, in turn.
			m.keepSpare(a)
			return nil
		}
		r.perf.NewBlocks += len(b.kv.Blocks()) - before
		src, dst, copied, err := b.kv.Writable(pos / tpb * tpb)
		if err != nil {
			m.keepSpare(a)
			return nil
		}
		if copied {
			r.perf.NewBlocks++
			a.batch.BlockCopies = append(a.batch.BlockCopies, engine.BlockCopy{Src: src, Dst: dst})
		}
		a.batch.Seqs = append(a.batch.Seqs, engine.Sequence{
			ID:           r.id,
			Tokens:       m.placeholder,
			Pos:          pos,
			Blocks:       b.kv.Blocks(),
			Sample:       true,
			Sampling:     r.samplingFor(b),
			History:      b.tokens[: pos+1 : pos+1],
			NumGenerated: s.NumGenerated + 1,
			ReturnLogits: s.ReturnLogits,
			Feed:         i + 1,
			LateMask:     r.req.Guide != nil,
		})
		a.late = a.late || r.req.Guide != nil
		a.refs = append(a.refs, ref)
	}
	if len(m.waiting) > 0 {
		m.admitAhead(a)
	}
	if len(a.batch.Seqs) == 0 {
		m.keepSpare(a)
		return nil
	}
	// The step ahead is a step the requests waiting out their proposals skip.
	for _, ref := range a.refs {
		if r := ref.r; ref.b == &r.branch && r.spec != nil && !r.proposesNext() {
			r.spec.rest--
		}
	}
	return a
}

// planChunk adds to a the next prompt chunk of a request whose base row s is a chunk
// that samples nothing (chunked context, or a resumed request recomputing), as the
// scheduler would size it from the budget left, with its blocks; false when none fits
// or the blocks cannot be had (the scheduler then decides, in turn).
func (m *Manager) planChunk(a *aheadStep, s *engine.Sequence, ref seqRef, budget *int) bool {
	r, b := ref.r, ref.b
	pos := s.Pos + len(s.Tokens)
	if b.computed > s.Pos || pos >= len(b.tokens) {
		return false
	}
	n := m.chunk(r, len(b.tokens)-pos, *budget)
	if n == 0 {
		return false
	}
	tpb := m.pool.TokensPerBlock()
	before := len(b.kv.Blocks())
	if err := b.kv.Reserve(pos + n); err != nil {
		return false
	}
	r.perf.NewBlocks += len(b.kv.Blocks()) - before
	for blk := pos / tpb; blk <= (pos+n-1)/tpb; blk++ {
		src, dst, copied, err := b.kv.Writable(blk * tpb)
		if err != nil {
			return false
		}
		if copied {
			r.perf.NewBlocks++
			a.batch.BlockCopies = append(a.batch.BlockCopies, engine.BlockCopy{Src: src, Dst: dst})
		}
	}
	*budget -= n
	end := pos + n
	last := end == len(b.tokens)
	row := engine.Sequence{
		ID:            r.id,
		Tokens:        b.tokens[pos:end:end],
		Pos:           pos,
		Blocks:        b.kv.Blocks(),
		Sampling:      r.samplingFor(b),
		History:       b.tokens[:end:end],
		NumGenerated:  b.generated,
		ContextLogits: r.ctxLogits != nil && pos < r.promptLen && !r.ctxSent,
	}
	if r.hostSampled() {
		row.ReturnLogits = last
	} else {
		row.Sample, row.ReturnLogits = last, r.wantsRows()
	}
	if row.Sample && r.req.Guide != nil {
		row.LateMask, a.late = true, true
	}
	a.batch.Seqs = append(a.batch.Seqs, row)
	a.refs = append(a.refs, ref)
	return true
}

// joinsAhead says whether a waiting request may be admitted into a step launched ahead:
// one sequence, no batched post-processor (which runs over a whole step's logits), no
// constraint unless the engine takes masks late (its first mask is then made with the
// others of the step, lateMasks). Its prompt's tokens are known, so it needs nothing the
// step before samples.
func (m *Manager) joinsAhead(r *request) bool {
	return r.width == 1 && !r.req.BatchedPostProcessing && (r.req.Guide == nil || m.late != nil)
}

// admitAhead admits waiting requests into the step ahead a, as the scheduler admits
// them (the same fit checks and reservations), and adds their prompt rows after its fed
// rows. Arrivals so join the next launch whether or not steps run ahead, and the
// overlap goes on under a steady stream of them.
func (m *Manager) admitAhead(a *aheadStep) {
	budget := math.MaxInt
	if m.cfg.MaxNumTokens > 0 {
		budget = m.cfg.MaxNumTokens
		for _, s := range a.batch.Seqs {
			budget -= len(s.Tokens)
		}
		if budget <= 0 {
			return
		}
	}
	// admit appends to m.sched and m.batch.BlockCopies: both belong to the step before
	// (read again when its outputs are applied), and its copies have run.
	saved := m.sched
	m.sched = m.admittedAhead[:0]
	m.batch.BlockCopies = m.batch.BlockCopies[:0]
	m.admit(budget, m.joinsAhead)
	admitted := m.sched
	defer clear(admitted) // hold no request past the step
	m.admittedAhead = admitted[:0]
	m.sched = saved
	a.batch.BlockCopies = append(a.batch.BlockCopies, m.batch.BlockCopies...)
	m.batch.BlockCopies = m.batch.BlockCopies[:0]
	for _, r := range admitted {
		b := &r.branch
		if b.n == 0 {
			continue
		}
		start, end := b.computed, b.computed+b.n
		last := end == len(b.tokens)
		s := engine.Sequence{
			ID:            r.id,
			Tokens:        b.tokens[start:end:end],
			Pos:           start,
			Blocks:        b.kv.Blocks(),
			Sampling:      r.samplingFor(b),
			History:       b.tokens[:end:end],
			NumGenerated:  b.generated,
			ContextLogits: r.ctxLogits != nil && start < r.promptLen && !r.ctxSent,
		}
		if r.hostSampled() {
			s.ReturnLogits = last
		} else {
			s.Sample, s.ReturnLogits = last, r.wantsRows()
		}
		if s.Sample && r.req.Guide != nil {
			s.LateMask, a.late = true, true
		}
		a.batch.Seqs = append(a.batch.Seqs, s)
		a.refs = append(a.refs, seqRef{r, b})
	}
}

// stepAhead is an iteration whose batch was launched ahead: the step after it is
// launched ahead in turn when it may be, then its outputs are read and applied to the
// rows whose branches still run.
func (m *Manager) stepAhead() {
	a := m.ahead
	m.ahead = nil
	m.it = iterCounts{}
	clear(m.sched) // hold no finished request
	m.sched = m.sched[:0]
	for _, ref := range a.refs {
		if alive(ref) {
			m.sched = append(m.sched, ref.r)
		}
	}
	if a.late {
		// The tokens of the step before are applied: its guided rows' masks now, while
		// the engine runs its forward pass; the step after it launches behind them.
		m.lateMasks(a)
		if err := m.late.SupplyMasks(&a.batch); err != nil {
			m.keepSpare(a)
			m.failStep(err)
			return
		}
	}
	if next := m.planAhead(a.batch.Seqs, a.refs); next != nil {
		if err := m.launchAhead(next); err != nil {
			m.keepSpare(a)
			m.failStep(err)
			return
		}
	}
	t0 := time.Now()
	m.launched--
	outs, err := m.pipe.Wait()
	m.it.engine = time.Since(t0)
	if err == nil && len(outs) != len(a.refs) {
		err = fmt.Errorf("engine returned %d outputs for %d sequences", len(outs), len(a.refs))
	}
	if err != nil {
		m.keepSpare(a)
		m.failStep(err)
		return
	}
	for i, ref := range a.refs {
		if !alive(ref) {
			continue
		}
		r, b, seq := ref.r, ref.b, &a.batch.Seqs[i]
		if b.computed != seq.Pos {
			r.failed = fmt.Errorf("%w: the step ahead computed position %d of a sequence at %d", ErrInternal, seq.Pos, b.computed)
			continue
		}
		b.n = len(seq.Tokens)
		if seq.Feed > 0 {
			m.it.genReqs++
		} else {
			m.it.ctxReqs++
			m.it.ctxTokens += b.n
		}
		m.advance(r, b, seq, &outs[i])
	}
	for _, r := range m.sched {
		m.afterStep(r)
		m.respond(r)
	}
	m.keepSpare(a)
	m.running = compact(m.running, phaseRunning)
}

// lateMasks makes the masks of a's rows launched without them (engine.Sequence.LateMask),
// as the scheduler makes a step's: the rows whose branches still run get their
// constraint's mask after the tokens applied since; the others, computed for nothing,
// none.
func (m *Manager) lateMasks(a *aheadStep) {
	seqs, refs := m.lateSeqs[:0], m.lateRefs[:0]
	for i, ref := range a.refs {
		s := &a.batch.Seqs[i]
		if !s.LateMask {
			continue
		}
		s.Allowed = nil
		if alive(ref) {
			seqs = append(seqs, *s)
			refs = append(refs, ref)
		}
	}
	m.guideMasks(seqs, refs)
	k := 0
	for i, ref := range a.refs {
		if s := &a.batch.Seqs[i]; s.LateMask && alive(ref) {
			s.Allowed = seqs[k].Allowed
			k++
		}
	}
	clear(seqs)
	clear(refs)
	m.lateSeqs, m.lateRefs = seqs[:0], refs[:0]
}

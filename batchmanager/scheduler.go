package batchmanager

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"go.uber.org/zap"

	"gollm/engine"
	"gollm/kvcache"
)

// Groups. A request of several sequences — a beam search, or several sampled sequences
// (num_return_sequences) — is a group: its first branch computes the prompt (up to
// forkAt), then it forks into its branches, which share the prompt's KV blocks and get
// a block of their own only when they write into a shared one (copy-on-write,
// kvcache.Sequence.Writable, run by the engine from Batch.BlockCopies). Its branches
// are scheduled together, one token each per iteration; a group counts its width
// against max_batch_size. Under every policy a group is admitted only when its worst
// case fits (the prompt's shared blocks once, plus every branch's own blocks), and it is
// never paused: max_utilization pauses single-sequence requests only, and keeps the
// groups' worst cases out of what it admits singles into. Requests of different beam
// widths run side by side in one batch: the engine sees only sequences, so nothing needs
// reconfiguring (the executor seed waits for every request of one width to finish
// before it starts another width; gollm does not).

// schedule picks this iteration's work into m.sched, each branch's token count in its
// n, with its KV blocks reserved. Running requests come first (generation steps cost
// one token per branch; contexts take what the token budget leaves), then admissions:
// paused requests before new ones, in order, stopping at the first that does not fit.
func (m *Manager) schedule() {
	clear(m.sched) // hold no finished request
	m.sched = m.sched[:0]
	m.batch.BlockCopies = m.batch.BlockCopies[:0]
	m.it = iterCounts{}
	budget := m.cfg.MaxNumTokens
	if budget == 0 {
		budget = math.MaxInt
	}
	v1 := m.cfg.ModelType == V1
	// V1 and static_batch admit only into an empty batch.
	batchEmpty := len(m.running) == 0 && len(m.held) == 0

	for _, r := range m.running {
		n := m.planRunning(r, budget, v1)
		if n == 0 {
			continue
		}
		budget -= min(n, budget)
		m.sched = append(m.sched, r)
	}
	m.reserveRunning()

	if (v1 || m.cfg.Policy == StaticBatch) && !batchEmpty {
		return
	}
	m.admit(budget, nil)
}

// planRunning sets the token counts of a running request's branches for this iteration
// and returns their sum (0: not scheduled).
func (m *Manager) planRunning(r *request, budget int, v1 bool) int {
	if !r.forked {
		// One sequence: a plain request, or a group's first branch on its prompt.
		limit := len(r.tokens)
		if r.width > 1 && !r.beams {
			limit = r.forkAt
		}
		n := 1
		if !v1 || r.generated == 0 {
			n = m.chunk(r, limit-r.computed, budget)
		}
		r.n = n
		return n
	}
	// A forked group: every live branch feeds its last token, all or none.
	total := 0
	for _, b := range r.branches() {
		b.n = 0
		if !b.ended && b.kv != nil {
			b.n = len(b.tokens) - b.computed
			total += b.n
		}
	}
	if total > budget {
		for _, b := range r.branches() {
			b.n = 0
		}
		return 0
	}
	return total
}

// chunk is how many of a running request's remaining tokens fit the budget: a
// generation step needs one; a context takes them all, or with chunked context (and
// always when recomputing a paused request) as many as the budget leaves.
func (m *Manager) chunk(r *request, remaining, budget int) int {
	if remaining <= budget {
		return remaining
	}
	if m.cfg.EnableChunkedContext || r.resumes > 0 || r.phase == phasePaused {
		return budget
	}
	return 0
}

// reserveRunning grows the block tables of the scheduled running requests' branches
// and gives each the blocks it writes (copy-on-write). Under max_utilization a shortage
// pauses the most recently admitted single-sequence requests until the rest fit; the
// guaranteed policies (and groups under every policy) never run short (a shortage there
// is a bookkeeping bug and fails the request rather than the loop).
func (m *Manager) reserveRunning() {
	for i := 0; i < len(m.sched); i++ {
		r := m.sched[i]
		for {
			err := m.reserve(r)
			if err == nil {
				break
			}
			victim := m.pauseVictim()
			if !errors.Is(err, kvcache.ErrFull) || m.cfg.Policy != MaxUtilization || m.cfg.ModelType == V1 || victim == nil {
				m.log.Error("KV reservation failed under a guaranteed policy", zap.Uint64("request", r.id), zap.Error(err))
				m.release(r)
				m.running = compact(m.running, phaseRunning)
				m.sched = slices.Delete(m.sched, i, i+1)
				i--
				m.send(r.id, Result{}, true, fmt.Errorf("request %d: %w: KV blocks: %w", r.id, ErrInternal, err))
				break
			}
			m.pause(victim)
			if j := slices.Index(m.sched, victim); j >= 0 {
				m.sched = slices.Delete(m.sched, j, j+1)
				if j < i {
					i--
				}
			}
			if victim == r {
				i--
				break
			}
		}
	}
}

// reserve gives every scheduled branch of r the blocks its new tokens need, each its
// own: a shared block about to be written is replaced by a copy (queued in
// m.batch.BlockCopies). On an error some branches may hold more blocks than before,
// which a retry reuses.
func (m *Manager) reserve(r *request) error {
	tpb := m.pool.TokensPerBlock()
	for _, b := range r.branches() {
		if b.n == 0 || b.kv == nil {
			continue
		}
		before := len(b.kv.Blocks())
		if err := b.kv.Reserve(b.computed + b.n); err != nil {
			return err
		}
		r.perf.NewBlocks += len(b.kv.Blocks()) - before
		for blk := b.computed / tpb; blk <= (b.computed+b.n-1)/tpb; blk++ {
			src, dst, copied, err := b.kv.Writable(blk * tpb)
			if err != nil {
				return err
			}
			if copied {
				r.perf.NewBlocks++
				m.batch.BlockCopies = append(m.batch.BlockCopies, engine.BlockCopy{Src: src, Dst: dst})
			}
		}
	}
	return nil
}

// pauseVictim is the request max_utilization pauses next: the most recently admitted
// single-sequence request (groups are never paused), or nil.
func (m *Manager) pauseVictim() *request {
	for i := len(m.running) - 1; i >= 0; i-- {
		if r := m.running[i]; r.width == 1 {
			return r
		}
	}
	return nil
}

// pause evicts a running single-sequence request: its blocks go back to the pool and
// it will recompute its whole context when resumed.
func (m *Manager) pause(r *request) {
	if err := r.kv.Release(); err != nil {
		m.log.Error("releasing KV blocks of a paused request", zap.Uint64("request", r.id), zap.Error(err))
	}
	r.kv, r.computed, r.n = nil, 0, 0
	m.forgetSpec(r)
	r.phase = phasePaused
	if n := len(m.running); n > 0 && m.running[n-1] == r {
		// The usual victim: dropping it moves nothing (a compaction per pause would
		// make a run of pauses quadratic in the running requests).
		m.running[n-1] = nil
		m.running = m.running[:n-1]
	} else {
		m.running = compact(m.running, phaseRunning)
	}
	i, _ := slices.BinarySearchFunc(m.paused, r.admitSeq, func(p *request, s uint64) int { return cmpU64(p.admitSeq, s) })
	m.paused = slices.Insert(m.paused, i, r)
	m.it.pausedNow++
	m.log.Debug("paused request", zap.Uint64("request", r.id), zap.Int("tokens", len(r.tokens)))
}

// cmpU64 orders two uint64.
func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// guaranteed says whether r's worst case is kept back for it: under the guaranteed
// policies every request's, under max_utilization (in-flight) a group's only.
func (m *Manager) guaranteed(r *request) bool {
	return !(m.cfg.Policy == MaxUtilization && m.cfg.ModelType != V1) || r.width > 1
}

// reservedBlocks is what the guaranteed requests keep back: each one's worst case
// minus the blocks it already holds.
func (m *Manager) reservedBlocks() int {
	n := 0
	for _, r := range m.running {
		if m.guaranteed(r) {
			n += max(0, r.worstBlocks-r.heldBlocks())
		}
	}
	return n
}

// heldBlocks counts the distinct KV blocks r's branches hold.
func (r *request) heldBlocks() int {
	if !r.forked {
		if r.kv == nil {
			return 0
		}
		return len(r.kv.Blocks())
	}
	var ids []int32
	for _, b := range r.branches() {
		if b.kv != nil {
			ids = append(ids, b.kv.Blocks()...)
		}
	}
	slices.Sort(ids)
	return len(slices.Compact(ids))
}

// runningSeqs counts the engine sequences the running requests may use at once.
func (m *Manager) runningSeqs() int {
	n := 0
	for _, r := range m.running {
		n += r.width
	}
	return n
}

// admit moves paused (max_utilization) and waiting requests into the batch while they
// fit the batch size, the token budget and the KV pool under the policy, and, when only
// is set, while only says they may be admitted.
func (m *Manager) admit(budget int, only func(*request) bool) {
	reserved := m.reservedBlocks()
	seqs := m.runningSeqs()
	tpb := m.pool.TokensPerBlock()
	admittedWaiting := 0
	for {
		if budget == 0 {
			break
		}
		var r *request
		fromPaused := len(m.paused) > 0
		if fromPaused {
			r = m.paused[0]
		} else if admittedWaiting < len(m.waiting) {
			r = m.waiting[admittedWaiting]
		} else {
			break
		}
		if seqs+r.width > m.cfg.MaxBatchSize || only != nil && !only(r) {
			break
		}
		// Context logits need every prompt position computed, so no prefix reuse then.
		useCache := m.cfg.EnableKVCacheReuse && r.ctxLogits == nil
		matched, idle := 0, 0
		if useCache {
			matched, idle = m.pool.Match(r.tokens[:r.promptLen])
		}
		reusedTok := matched * tpb
		limit := len(r.tokens)
		if r.width > 1 && !r.beams {
			limit = r.forkAt
		}
		n := 0
		if reusedTok < limit {
			n = m.chunk(r, limit-reusedTok, budget)
			if n == 0 {
				break
			}
		} else if budget < r.width {
			// A group whose prompt up to the fork is all reused forks at once: every
			// branch feeds the last prompt token.
			break
		}
		guar := m.guaranteed(r)
		var need int
		if guar {
			need = r.worstBlocks - matched
		} else {
			need = m.pool.BlocksFor(reusedTok+n) - matched
		}
		if need+idle > m.pool.Free()-reserved {
			break
		}
		r.kv = m.pool.Add(r.tokens[:r.promptLen], useCache)
		r.computed = r.kv.ReusedTokens()
		r.perf.ReusedBlocks = len(r.kv.Blocks())
		r.n = n
		if n == 0 {
			m.forkSamples(r)
		}
		if err := m.reserve(r); err != nil {
			// Match said it fits; undo and leave the request where it was.
			m.log.Error("KV reservation failed after the fit check", zap.Uint64("request", r.id), zap.Error(err))
			m.dropBranches(r)
			break
		}
		if guar {
			reserved += max(0, r.worstBlocks-r.heldBlocks())
		}
		if n == 0 {
			n = r.width
		}
		budget -= min(n, budget)
		seqs += r.width
		r.phase = phaseRunning
		if r.perf.FirstScheduled.IsZero() {
			r.perf.FirstScheduled = m.now
		}
		if fromPaused {
			m.paused = m.paused[1:]
			r.resumes++
			m.it.resumedNow++
			i, _ := slices.BinarySearchFunc(m.running, r.admitSeq, func(p *request, s uint64) int { return cmpU64(p.admitSeq, s) })
			m.running = slices.Insert(m.running, i, r)
		} else {
			admittedWaiting++
			m.admitted++
			r.admitSeq = m.admitted
			m.running = append(m.running, r)
		}
		m.sched = append(m.sched, r)
	}
	if admittedWaiting > 0 {
		n := copy(m.waiting, m.waiting[admittedWaiting:])
		clear(m.waiting[n:])
		m.waiting = m.waiting[:n]
	}
}

// dropBranches releases the KV of every branch of r and forgets its forks, leaving it
// as it was before admission.
func (m *Manager) dropBranches(r *request) {
	for _, b := range r.branches() {
		if b.kv != nil {
			_ = b.kv.Release()
			b.kv = nil
		}
	}
	r.forks, r.forked = nil, false
	r.all = r.all[:1]
	r.computed, r.n = 0, 0
	r.tokens = r.tokens[:r.promptLen]
}

package batchmanager

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"go.uber.org/zap"

	"gollm/kvcache"
)

// schedule picks this iteration's work into m.sched, each request's token count in
// r.n, with its KV blocks reserved. Running requests come first (generation steps cost
// one token each; contexts take what the token budget leaves), then admissions:
// paused requests before new ones, in order, stopping at the first that does not fit.
func (m *Manager) schedule() {
	m.sched = m.sched[:0]
	m.it = iterCounts{}
	budget := m.cfg.MaxNumTokens
	if budget == 0 {
		budget = math.MaxInt
	}
	v1 := m.cfg.ModelType == V1
	// V1 and static_batch admit only into an empty batch.
	batchEmpty := len(m.running) == 0 && len(m.held) == 0

	for _, r := range m.running {
		n := 1
		if !v1 || r.generated == 0 {
			n = m.chunk(r, len(r.tokens)-r.computed, budget)
		}
		r.n = n
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
	m.admit(budget)
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

// reserveRunning grows the block tables of the scheduled running requests. Under
// max_utilization a shortage pauses the most recently admitted requests until the rest
// fit; the guaranteed policies never run short (a shortage there is a bookkeeping bug
// and fails the request rather than the loop).
func (m *Manager) reserveRunning() {
	for i := 0; i < len(m.sched); i++ {
		r := m.sched[i]
		for {
			err := r.kv.Reserve(r.computed + r.n)
			if err == nil {
				break
			}
			if !errors.Is(err, kvcache.ErrFull) || m.cfg.Policy != MaxUtilization || m.cfg.ModelType == V1 {
				m.log.Error("KV reservation failed under a guaranteed policy", zap.Uint64("request", r.id), zap.Error(err))
				m.release(r)
				m.running = compact(m.running, phaseRunning)
				m.sched = slices.Delete(m.sched, i, i+1)
				i--
				m.send(r.id, Result{}, true, fmt.Errorf("request %d: %w: KV blocks: %w", r.id, ErrInternal, err))
				break
			}
			victim := m.running[len(m.running)-1]
			m.pause(victim)
			if n := len(m.sched); n > 0 && m.sched[n-1] == victim {
				m.sched = m.sched[:n-1]
			}
			if victim == r {
				break
			}
		}
	}
}

// pause evicts a running request (the most recently admitted): its blocks go back to
// the pool and it will recompute its whole context when resumed.
func (m *Manager) pause(r *request) {
	if err := r.kv.Release(); err != nil {
		m.log.Error("releasing KV blocks of a paused request", zap.Uint64("request", r.id), zap.Error(err))
	}
	r.kv, r.computed, r.n = nil, 0, 0
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

// reservedBlocks is what the guaranteed policies keep back: every running request's
// worst case minus the blocks it already holds.
func (m *Manager) reservedBlocks() int {
	n := 0
	for _, r := range m.running {
		n += r.worstBlocks - len(r.kv.Blocks())
	}
	return n
}

// admit moves paused (max_utilization) and waiting requests into the batch while they
// fit the batch size, the token budget and the KV pool under the policy.
func (m *Manager) admit(budget int) {
	maxUtil := m.cfg.Policy == MaxUtilization && m.cfg.ModelType != V1
	reserved := 0
	if !maxUtil {
		reserved = m.reservedBlocks()
	}
	tpb := m.pool.TokensPerBlock()
	admittedWaiting := 0
	for {
		if len(m.running) >= m.cfg.MaxBatchSize || budget == 0 {
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
		// Context logits need every prompt position computed, so no prefix reuse then.
		useCache := m.cfg.EnableKVCacheReuse && r.ctxLogits == nil
		matched, idle := 0, 0
		if useCache {
			matched, idle = m.pool.Match(r.tokens[:r.promptLen])
		}
		reusedTok := matched * tpb
		n := m.chunk(r, len(r.tokens)-reusedTok, budget)
		if n == 0 {
			break
		}
		var need int
		if maxUtil {
			need = m.pool.BlocksFor(reusedTok+n) - matched
			if need+idle > m.pool.Free() {
				break
			}
		} else {
			need = r.worstBlocks - matched
			if need+idle > m.pool.Free()-reserved {
				break
			}
		}
		r.kv = m.pool.Add(r.tokens[:r.promptLen], useCache)
		r.computed = r.kv.ReusedTokens()
		if err := r.kv.Reserve(r.computed + n); err != nil {
			// Match said it fits; undo and leave the request where it was.
			m.log.Error("KV reservation failed after the fit check", zap.Uint64("request", r.id), zap.Error(err))
			_ = r.kv.Release()
			r.kv, r.computed = nil, 0
			break
		}
		if !maxUtil {
			reserved += r.worstBlocks - len(r.kv.Blocks())
		}
		budget -= min(n, budget)
		r.n = n
		r.phase = phaseRunning
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

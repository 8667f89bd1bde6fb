package batchmanager

import (
	"fmt"
	"slices"
	"time"

	"gollm/engine"
)

// iterCounts are the numbers of one iteration, for the stats.
type iterCounts struct {
	// ctxReqs and genReqs count the scheduled context and generation steps.
	ctxReqs, genReqs int
	// ctxTokens is the number of context tokens scheduled.
	ctxTokens int
	// genTokens is the number of tokens sampled (generation tokens).
	genTokens int
	// emptySlots counts V1 slots whose sequence already finished (padding).
	emptySlots int
	// pausedNow and resumedNow count this iteration's pauses and resumes.
	pausedNow, resumedNow int
	// engine is the wall time of the iteration's Engine.Step.
	engine time.Duration
}

// step builds the engine batch from m.sched, runs it, and applies the outputs: new
// tokens, stop conditions, responses.
func (m *Manager) step() {
	m.fillBatch()
	if m.cfg.ModelType == V1 {
		m.it.emptySlots = len(m.held)
	}

	t0 := time.Now()
	outs, err := m.eng.Step(&m.batch)
	m.it.engine = time.Since(t0)
	if err == nil && len(outs) != len(m.sched) {
		err = fmt.Errorf("engine returned %d outputs for %d sequences", len(outs), len(m.sched))
	}
	if err != nil {
		m.log.Sugar().Errorw("engine step failed; failing the iteration's requests", "requests", len(m.sched), "error", err)
		for _, r := range m.sched {
			m.release(r)
			m.send(r.id, Result{}, true, fmt.Errorf("request %d: %w: %w", r.id, ErrEngine, err))
		}
		m.running = compact(m.running, phaseRunning)
		m.finishV1Batch()
		m.recoverEngine(err)
		return
	}

	for i, r := range m.sched {
		m.advance(r, &m.batch.Seqs[i], &outs[i])
		m.respond(r)
	}
	m.running = compact(m.running, phaseRunning)
	m.finishV1Batch()
}

// fillBatch writes this iteration's engine batch from m.sched into the reused
// m.batch.Seqs, field by field: appending whole Sequence values copies them through a
// temporary and, while the garbage collector marks, through its bulk write barrier.
func (m *Manager) fillBatch() {
	n := len(m.sched)
	if cap(m.batch.Seqs) < n {
		m.batch.Seqs = make([]engine.Sequence, n, max(n, 2*cap(m.batch.Seqs)))
	}
	seqs := m.batch.Seqs[:n]
	for i, r := range m.sched {
		start, end := r.computed, r.computed+r.n
		sample := end == len(r.tokens)
		if r.n == 1 && r.generated > 0 && sample {
			m.it.genReqs++
		} else {
			m.it.ctxReqs++
			m.it.ctxTokens += r.n
		}
		s := &seqs[i]
		s.ID = r.id
		s.Tokens = r.tokens[start:end:end]
		s.Pos = start
		s.Blocks = r.kv.Blocks()
		s.Sample = sample
		s.Sampling = r.sampling
		s.History = r.tokens[:end:end]
		s.NumGenerated = r.generated
		s.ReturnLogits = r.req.ReturnGenerationLogits
		s.ContextLogits = r.ctxLogits != nil && start < r.promptLen && !r.ctxSent
	}
	m.batch.Seqs = seqs
}

// advance applies one sequence's output to its request.
func (m *Manager) advance(r *request, seq *engine.Sequence, out *engine.Output) {
	vocab := m.info.VocabSize
	if seq.ContextLogits {
		rows := min(r.n, r.promptLen-r.computed)
		if len(out.ContextLogits) < r.n*vocab {
			r.failed = fmt.Errorf("%w: %d context logits for %d positions of vocabulary %d", ErrEngine, len(out.ContextLogits), r.n, vocab)
			return
		}
		copy(r.ctxLogits[r.computed*vocab:], out.ContextLogits[:rows*vocab])
	}
	r.computed += r.n
	if m.cfg.EnableKVCacheReuse {
		r.kv.Commit(r.computed)
	}
	if !seq.Sample {
		return
	}
	tok := out.Token
	if tok < 0 || int(tok) >= vocab {
		r.failed = fmt.Errorf("%w: sampled token %d outside the vocabulary [0, %d)", ErrEngine, tok, vocab)
		return
	}
	m.it.genTokens++
	if slices.Contains(r.req.EndIDs, tok) {
		// The end token is not part of the output (as in TensorRT-LLM).
		r.ended, r.finish = true, FinishedEndID
		return
	}
	if r.req.ReturnGenerationLogits {
		if len(out.Logits) != vocab {
			r.failed = fmt.Errorf("%w: %d generation logits, vocabulary is %d", ErrEngine, len(out.Logits), vocab)
			return
		}
		r.genLogits = append(r.genLogits, out.Logits...)
	}
	r.tokens = append(r.tokens, tok)
	r.generated++
	if r.logProbs != nil {
		r.logProbs = append(r.logProbs, out.LogProb)
		r.cumLogProb += out.LogProb
	}
	switch {
	case hitsStopWord(r.tokens, r.req.StopWords):
		r.ended, r.finish = true, FinishedStopWord
	case r.generated >= r.maxNew || len(r.tokens) >= m.info.MaxSeqLen:
		r.ended, r.finish = true, FinishedLength
	}
}

// hitsStopWord says whether toks ends with one of the stop words.
func hitsStopWord(toks []int32, words [][]int32) bool {
	for _, w := range words {
		if len(w) <= len(toks) && slices.Equal(toks[len(toks)-len(w):], w) {
			return true
		}
	}
	return false
}

// respond sends what a request has to say after an iteration, freeing its state first
// when the response is final.
func (m *Manager) respond(r *request) {
	if r.failed != nil {
		m.release(r)
		m.send(r.id, Result{}, true, fmt.Errorf("request %d: %w", r.id, r.failed))
		return
	}
	if r.ended {
		if m.cfg.ModelType == V1 {
			// The slot stays in the batch as padding; the answer goes out with the batch.
			if err := r.kv.Release(); err != nil {
				m.log.Sugar().Errorw("releasing KV blocks", "request", r.id, "error", err)
			}
			r.kv = nil
			r.phase = phaseHeld
			m.held = append(m.held, r)
			if r.req.Streaming && r.generated > r.sent {
				m.send(r.id, m.streamResult(r), false, nil)
			}
			return
		}
		m.release(r)
		if r.req.Streaming {
			m.send(r.id, m.streamResult(r), true, nil)
		} else {
			m.send(r.id, m.finalResult(r, 0), true, nil)
		}
		return
	}
	if r.req.Streaming && r.generated > r.sent {
		m.send(r.id, m.streamResult(r), false, nil)
	}
}

// finishV1Batch sends the held answers of a V1 batch once none of it runs any more,
// padded to the batch's longest output.
func (m *Manager) finishV1Batch() {
	if m.cfg.ModelType != V1 || len(m.running) > 0 || len(m.held) == 0 {
		return
	}
	longest := 0
	for _, r := range m.held {
		longest = max(longest, r.generated)
	}
	held := m.held
	m.held = nil
	for _, r := range held {
		if r.phase == phaseDone {
			continue
		}
		m.release(r)
		if r.req.Streaming {
			m.send(r.id, m.streamResult(r), true, nil)
			continue
		}
		m.send(r.id, m.finalResult(r, longest), true, nil)
	}
}

// streamResult is a streaming response: the tokens generated since the last one
// (usually one; none on the final response after an end token), with what the request
// asked for of them.
func (m *Manager) streamResult(r *request) Result {
	from, to := r.sent, r.generated
	r.sent = to
	res := Result{Tokens: r.tokens[r.promptLen+from : r.promptLen+to : r.promptLen+to], Length: to - from}
	m.addExtras(&res, r, from, to, !r.ctxSent)
	r.ctxSent = true
	return res
}

// finalResult is a non-streaming answer: the prompt (unless excluded) and every
// generated token, padded with PadID to padTo generated tokens (V1). Length counts the
// real tokens.
func (m *Manager) finalResult(r *request, padTo int) Result {
	start := 0
	if r.req.ExcludeInputInOutput {
		start = r.promptLen
	}
	n := len(r.tokens) - start
	ids := r.tokens[start:len(r.tokens):len(r.tokens)]
	if pad := padTo - r.generated; pad > 0 && r.req.PadID >= 0 {
		ids = make([]int32, n, n+pad)
		copy(ids, r.tokens[start:])
		for range pad {
			ids = append(ids, r.req.PadID)
		}
	}
	res := Result{Tokens: ids, Length: n}
	m.addExtras(&res, r, 0, r.generated, true)
	return res
}

// addExtras fills the counts, the finish reason and the asked-for log probs and logits
// of generated tokens [from, to), and the context logits when withCtx.
func (m *Manager) addExtras(res *Result, r *request, from, to int, withCtx bool) {
	vocab := m.info.VocabSize
	res.PromptLen, res.Generated, res.Finish = r.promptLen, r.generated, r.finish
	if r.logProbs != nil {
		res.CumLogProb = r.cumLogProb
		res.LogProbs = r.logProbs[from:to:to]
	}
	if r.ctxLogits != nil && withCtx {
		res.ContextLogits = r.ctxLogits
	}
	if r.req.ReturnGenerationLogits {
		res.GenerationLogits = r.genLogits[from*vocab : to*vocab : to*vocab]
		if res.GenerationLogits == nil {
			res.GenerationLogits = []float32{}
		}
	}
}

// recoverEngine lets an engine that can (engine.Recoverer) check and restore itself
// after a failed step. One that cannot recover ends the instance: everything in flight
// gets a final error wrapping ErrEngineBroken, and so does every later request.
func (m *Manager) recoverEngine(cause error) {
	rec, ok := m.eng.(engine.Recoverer)
	if !ok {
		return
	}
	rerr := rec.Recover(cause)
	if rerr == nil {
		m.log.Sugar().Warnw("the engine recovered from the failed step; serving on", "error", cause)
		return
	}
	broken := fmt.Errorf("%w: %w (after: %w)", ErrEngineBroken, rerr, cause)
	m.log.Sugar().Errorw("the engine cannot recover from the failed step; the instance serves nothing more", "error", broken)
	m.statsMu.Lock()
	m.broken = broken
	m.statsMu.Unlock()
	m.failAll(broken)
	if m.cb.EngineFailed != nil {
		func() {
			defer func() {
				if r := recover(); r != nil {
					m.log.Sugar().Errorw("EngineFailed panicked", "panic", r)
				}
			}()
			m.cb.EngineFailed(broken)
		}()
	}
}

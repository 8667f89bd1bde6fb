package batchmanager

import (
	"fmt"
	"reflect"
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
			m.send(r.id, nil, true, fmt.Errorf("request %d: %w: %w", r.id, ErrEngine, err))
		}
		m.running = compact(m.running, phaseRunning)
		m.finishV1Batch()
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
	if r.req.EndID >= 0 && tok == r.req.EndID {
		// The end token is not part of the output (as in TensorRT-LLM).
		r.ended = true
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
	if r.generated >= r.maxNew || len(r.tokens) >= m.info.MaxSeqLen || hitsStopWord(r.tokens, r.req.StopWords) {
		r.ended = true
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
		m.send(r.id, nil, true, fmt.Errorf("request %d: %w", r.id, r.failed))
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
				m.send(r.id, m.streamOutputs(r), false, nil)
			}
			return
		}
		m.release(r)
		if r.req.Streaming {
			m.send(r.id, m.streamOutputs(r), true, nil)
		} else {
			m.send(r.id, m.finalOutputs(r, 0), true, nil)
		}
		return
	}
	if r.req.Streaming && r.generated > r.sent {
		m.send(r.id, m.streamOutputs(r), false, nil)
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
			m.send(r.id, m.streamOutputs(r), true, nil)
			continue
		}
		m.send(r.id, m.finalOutputs(r, longest), true, nil)
	}
}

// streamOutputs are the tensors of a streaming response: the tokens generated since the
// last one (usually one; none on the final response after an end token).
func (m *Manager) streamOutputs(r *request) []Tensor {
	from, to := r.sent, r.generated
	r.sent = to
	gen := r.tokens[r.promptLen+from : r.promptLen+to]
	plain := r.logProbs == nil && !r.req.ReturnGenerationLogits && (r.ctxLogits == nil || r.ctxSent)
	if plain {
		return m.slab.tokens(gen)
	}
	out := tokenTensors(gen)
	out = m.appendExtras(out, r, from, to, !r.ctxSent)
	r.ctxSent = true
	return out
}

// finalOutputs are the tensors of a non-streaming answer: the prompt (unless excluded)
// and every generated token, padded with PadID to padTo generated tokens (V1).
// sequence_length counts the real tokens.
func (m *Manager) finalOutputs(r *request, padTo int) []Tensor {
	start := 0
	if r.req.ExcludeInputInOutput {
		start = r.promptLen
	}
	n := len(r.tokens) - start
	ids := make([]int32, n, n+max(0, padTo-r.generated))
	copy(ids, r.tokens[start:])
	if r.req.PadID >= 0 {
		for range padTo - r.generated {
			ids = append(ids, r.req.PadID)
		}
	}
	out := []Tensor{
		{Name: "output_ids", Shape: []int64{1, int64(len(ids))}, Data: ids},
		{Name: "sequence_length", Shape: []int64{1}, Data: []int32{int32(n)}},
	}
	return m.appendExtras(out, r, 0, r.generated, true)
}

// tokenTensors builds output_ids [1, n] and sequence_length [1] for toks (copied).
func tokenTensors(toks []int32) []Tensor {
	ids := slices.Clone(toks)
	if ids == nil {
		ids = []int32{}
	}
	return []Tensor{
		{Name: "output_ids", Shape: []int64{1, int64(len(ids))}, Data: ids},
		{Name: "sequence_length", Shape: []int64{1}, Data: []int32{int32(len(ids))}},
	}
}

// appendExtras adds the asked-for log probs and logits of generated tokens [from, to),
// and the context logits when withCtx.
func (m *Manager) appendExtras(out []Tensor, r *request, from, to int, withCtx bool) []Tensor {
	vocab := m.info.VocabSize
	if r.logProbs != nil {
		out = append(out,
			Tensor{Name: "cum_log_probs", Shape: []int64{1}, Data: []float32{r.cumLogProb}},
			Tensor{Name: "output_log_probs", Shape: []int64{1, int64(to - from)}, Data: slices.Clone(r.logProbs[from:to:to])})
	}
	if r.ctxLogits != nil && withCtx {
		out = append(out, Tensor{Name: "context_logits", Shape: []int64{int64(r.promptLen), int64(vocab)}, Data: r.ctxLogits})
	}
	if r.req.ReturnGenerationLogits {
		out = append(out, Tensor{Name: "generation_logits", Shape: []int64{1, int64(to - from), int64(vocab)},
			Data: slices.Clone(r.genLogits[from*vocab : to*vocab : to*vocab])})
	}
	return out
}

// responseSlab backs one-token streaming responses (output_ids [1, 1] and
// sequence_length [1], the bulk of the responses) with a few allocations per batch
// instead of one or more per response: at hundreds of sequences, per-response
// allocations set how often the garbage collector runs. Its blocks are carved across
// iterations and never reused, so each response still gets its own token element,
// output_ids header and tensor list (capped, so appends cannot reach the next one): a
// receiver may keep them. What a receiver keeps holds on to its block: under 1 KiB
// for an output_ids, 14 KiB for a tensor list.
type responseSlab struct {
	// i32 holds the tokens of the current box chunk, one element per response.
	i32 []int32
	// box is the current chunk of output_ids headers, header j over i32[j], boxed as
	// one non-addressable array value. Index(j).Interface() yields an interface
	// holding header j; for such a value reflect points the interface at the header
	// where it is instead of boxing a copy (an allocation per response). Correctness
	// does not depend on that, only the allocation count, which
	// TestOneTokenResponsesEachOwnTheirData checks.
	box reflect.Value
	// used is the number of the chunk's headers handed out.
	used int
	// ts backs the tensor lists.
	ts []Tensor
}

// boxChunk is the number of output_ids headers boxed per allocation.
const boxChunk = 32

// tensorBlock is the number of tensors allocated at a time.
const tensorBlock = 256

// Read-only parts shared by one-token streaming responses: their shapes and their
// sequence_length, boxed once.
var (
	shapeOneToken     = []int64{1, 1}
	shapeOne          = []int64{1}
	lengthOne     any = []int32{1}
)

// newChunk starts a chunk of boxChunk token elements and their boxed headers.
func (s *responseSlab) newChunk() {
	s.i32 = make([]int32, boxChunk)
	// Filled here, then boxed (copied) once by ValueOf.
	var c [boxChunk][]int32
	for j := range c {
		c[j] = s.i32[j : j+1 : j+1]
	}
	s.box = reflect.ValueOf(c)
	s.used = 0
}

// tokens builds output_ids [1, n] and sequence_length [1] for toks (copied), out of the
// slab when toks is one token.
func (s *responseSlab) tokens(toks []int32) []Tensor {
	if len(toks) != 1 {
		return tokenTensors(toks)
	}
	if s.used == len(s.i32) {
		s.newChunk()
	}
	j := s.used
	s.used++
	s.i32[j] = toks[0]
	if cap(s.ts)-len(s.ts) < 2 {
		s.ts = make([]Tensor, 0, tensorBlock)
	}
	n := len(s.ts)
	s.ts = s.ts[:n+2]
	ts := s.ts[n : n+2 : n+2]
	ts[0].Name, ts[0].Shape, ts[0].Data = "output_ids", shapeOneToken, s.box.Index(j).Interface()
	ts[1].Name, ts[1].Shape, ts[1].Data = "sequence_length", shapeOne, lengthOne
	return ts
}

package batchmanager

import (
	"errors"
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
	// drafted and accepted count the iteration's proposed tokens and those accepted;
	// specSteps its sequences that verified proposals.
	drafted, accepted, specSteps int
	// asked says the proposer was asked for proposals.
	asked bool
	// engine is the wall time of the iteration's Engine.Step.
	engine time.Duration
}

// seqRef names the request and branch of one engine sequence of the batch.
type seqRef struct {
	// r owns b.
	r *request
	// b is its branch.
	b *branch
}

// step builds the engine batch from m.sched, runs it, and applies the outputs: new
// tokens, stop conditions, beam selection, responses.
func (m *Manager) step() {
	// The batch's sequences and references reach the requests' buffers: none is held
	// past the step, or a finished request's would stay live while the manager idles.
	defer func() {
		clear(m.batch.Seqs)
		clear(m.refs)
	}()
	m.fillBatch()
	m.guideMasks(m.batch.Seqs, m.refs)
	if m.cfg.ModelType == V1 {
		m.it.emptySlots = len(m.held)
	}

	t0 := time.Now()
	var outs []engine.Output
	var err error
	if m.pipe != nil {
		outs, err = m.stepPiped()
	} else {
		outs, err = m.eng.Step(&m.batch)
	}
	m.it.engine = time.Since(t0)
	if err == nil && len(outs) != len(m.refs) {
		err = fmt.Errorf("engine returned %d outputs for %d sequences", len(outs), len(m.refs))
	}
	if err != nil {
		m.failStep(err)
		return
	}

	m.batchedPostProcess(outs)
	for i, ref := range m.refs {
		m.advance(ref.r, ref.b, &m.batch.Seqs[i], &outs[i])
	}
	m.scoreBeams()
	for _, r := range m.sched {
		m.afterStep(r)
		m.respond(r)
	}
	m.running = compact(m.running, phaseRunning)
	m.finishV1Batch()
}

// failStep ends the requests of a step the engine failed (m.sched) with ErrEngine: what
// was launched ahead is waited for and dropped, and the engine recovers — first, so
// that an instance whose engine is lost says so before the failed step's clients hear
// of it and none of them retries into it unwarned; one that cannot recover ends
// everything.
func (m *Manager) failStep(err error) {
	m.log.Sugar().Errorw("engine step failed; failing the iteration's requests", "requests", len(m.sched), "error", err)
	if m.pipe != nil {
		m.drainPipe()
	}
	broken := m.recoverEngine(err)
	for _, r := range m.sched {
		m.release(r)
		m.send(r.id, Result{}, true, fmt.Errorf("request %d: %w: %w", r.id, ErrEngine, err))
	}
	m.running = compact(m.running, phaseRunning)
	m.finishV1Batch()
	if broken != nil {
		m.failAll(broken)
	}
}

// wantsRows says whether r reads its generated positions' logits rows: to return them,
// or to take its top log-probabilities from them.
func (r *request) wantsRows() bool {
	return r.req.ReturnGenerationLogits || r.req.ReturnTopLogprobs
}

// hostSampled says whether the manager, not the engine, chooses r's tokens from the
// logits the engine returns: beam search, and requests with a logits post-processor.
func (r *request) hostSampled() bool {
	return r.beams || r.req.LogitsPostProcessor != nil || r.req.BatchedPostProcessing
}

// batchedPostProcess hands the iteration's logits of the requests with
// BatchedPostProcessing to the batched post-processor, in one call; a panic in it fails
// those requests.
func (m *Manager) batchedPostProcess(outs []engine.Output) {
	pp := m.cfg.BatchedLogitsPostProcessor
	if pp == nil {
		return
	}
	var ids []uint64
	var logits [][]float32
	var tokens [][]int32
	var reqs []*request
	for i, ref := range m.refs {
		if ref.r.req.BatchedPostProcessing && m.batch.Seqs[i].ReturnLogits && len(outs[i].Logits) == m.info.VocabSize {
			if ref.r.wantsRows() && !ref.r.beams {
				ref.b.rawLogits = slices.Clone(outs[i].Logits)
			}
			ids = append(ids, ref.r.id)
			logits = append(logits, outs[i].Logits)
			tokens = append(tokens, ref.b.tokens[:len(ref.b.tokens):len(ref.b.tokens)])
			reqs = append(reqs, ref.r)
		}
	}
	if len(ids) == 0 {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			for _, r := range reqs {
				r.failed = fmt.Errorf("%w: batched logits post-processor panicked: %v", ErrEngine, p)
			}
		}
	}()
	pp(ids, logits, tokens)
}

// samplingFor is r's sampling with b's own random stream and runtime top-p.
func (r *request) samplingFor(b *branch) engine.SamplingParams {
	p := r.sampling
	p.Seed, p.TopP = b.seed, b.topP
	return p
}

// fillBatch writes this iteration's engine batch from m.sched into the reused
// m.batch.Seqs, field by field: appending whole Sequence values copies them through a
// temporary and, while the garbage collector marks, through its bulk write barrier.
func (m *Manager) fillBatch() {
	n := 0
	for _, r := range m.sched {
		for _, b := range r.branches() {
			if b.n > 0 {
				n++
			}
		}
	}
	if cap(m.batch.Seqs) < n {
		m.batch.Seqs = make([]engine.Sequence, n, max(n, 2*cap(m.batch.Seqs)))
	}
	seqs := m.batch.Seqs[:n]
	m.refs = slices.Grow(m.refs[:0], n)
	i := 0
	hidden := false
	for _, r := range m.sched {
		for _, b := range r.branches() {
			if b.n == 0 {
				continue
			}
			draft := 0
			if b == &r.branch && r.spec != nil {
				draft = r.spec.draft
			}
			start, end := b.computed, b.computed+b.n
			last := end == len(b.tokens)+draft
			if b.n-draft == 1 && b.generated > 0 && last {
				m.it.genReqs++
			} else {
				m.it.ctxReqs++
				m.it.ctxTokens += b.n
			}
			s := &seqs[i]
			s.ID = r.id
			s.Tokens = b.tokens[start:end:end]
			s.Pos = start
			s.Blocks = b.kv.Blocks()
			s.Sampling = r.samplingFor(b)
			s.History = b.tokens[:end:end]
			s.NumGenerated = b.generated
			if r.hostSampled() {
				s.Sample = false
				s.ReturnLogits = last
			} else {
				s.Sample = last
				s.ReturnLogits = r.wantsRows()
			}
			s.ContextLogits = b == &r.branch && r.ctxLogits != nil && start < r.promptLen && !r.ctxSent
			s.Feed = 0
			s.Allowed, s.LateMask = nil, false // guideMasks sets Allowed
			s.Draft, s.DraftProbs = draft, nil
			if draft > 0 {
				s.DraftProbs = r.spec.probs
			}
			s.ReturnHidden = m.hidden != nil && b == &r.branch && m.speculates(r)
			hidden = hidden || s.ReturnHidden
			m.refs = append(m.refs, seqRef{r, b})
			i++
		}
	}
	m.batch.Seqs = seqs
	m.batch.HiddenLayers = nil
	if hidden {
		m.batch.HiddenLayers = m.hidden.HiddenLayers()
	}
}

// advance applies one branch's output: the computed positions, the context logits, and
// for a sampled branch its new token and stop conditions. A host-sampled branch keeps
// its logits for afterStep.
func (m *Manager) advance(r *request, b *branch, seq *engine.Sequence, out *engine.Output) {
	if seq.Draft > 0 {
		m.acceptDraft(r, b, seq, out)
		return
	}
	vocab := m.info.VocabSize
	if seq.ContextLogits {
		rows := min(b.n, r.promptLen-b.computed)
		if len(out.ContextLogits) < b.n*vocab {
			r.failed = fmt.Errorf("%w: %d context logits for %d positions of vocabulary %d", ErrEngine, len(out.ContextLogits), b.n, vocab)
			return
		}
		copy(r.ctxLogits[b.computed*vocab:], out.ContextLogits[:rows*vocab])
	}
	b.computed += b.n
	if m.cfg.EnableKVCacheReuse {
		b.kv.Commit(b.computed)
	}
	if seq.ReturnHidden {
		m.observe(r, seq.Pos, b.n, out)
	}
	if r.hostSampled() {
		if seq.ReturnLogits {
			if len(out.Logits) != vocab {
				r.failed = fmt.Errorf("%w: %d logits, vocabulary is %d", ErrEngine, len(out.Logits), vocab)
				return
			}
			b.logits = out.Logits
		}
		if r.beams {
			return
		}
	}
	if !seq.Sample && !(r.hostSampled() && seq.ReturnLogits) {
		return
	}
	if out.Err != nil {
		// This sequence alone failed (every token masked: its settings leave no choice
		// after this history); its request ends, the rest of the batch goes on.
		r.failed = fmt.Errorf("%w: generated token %d: %w", seqFailure(out.Err), b.generated+1, out.Err)
		return
	}
	tok, lp := out.Token, out.LogProb
	if r.hostSampled() {
		var err error
		if tok, lp, err = m.hostSample(r, b, seq); err != nil {
			r.failed = fmt.Errorf("%w: %w", ErrEngine, err)
			return
		}
	}
	logits := out.Logits
	if r.hostSampled() {
		logits = b.rawLogits
		b.rawLogits = nil
	}
	m.takeToken(r, b, tok, lp, logits)
}

// takeToken adds one generated token to b, with its log-probability and (when the
// request wants rows: generation logits, top log-probabilities) its position's logits,
// and applies the stop conditions; it says whether b is done (ended or failed).
func (m *Manager) takeToken(r *request, b *branch, tok int32, lp float32, logits []float32) bool {
	vocab := m.info.VocabSize
	if tok < 0 || int(tok) >= vocab {
		r.failed = fmt.Errorf("%w: sampled token %d outside the vocabulary [0, %d)", ErrEngine, tok, vocab)
		return true
	}
	m.it.genTokens++
	m.tokenTimes(r)
	if slices.Contains(r.req.EndIDs, tok) {
		// The end token is not part of the output (as in TensorRT-LLM).
		b.ended, b.finish = true, FinishedEndID
		return true
	}
	if r.wantsRows() {
		if len(logits) != vocab {
			r.failed = fmt.Errorf("%w: %d generation logits, vocabulary is %d", ErrEngine, len(logits), vocab)
			return true
		}
		if r.req.ReturnGenerationLogits {
			b.genLogits = append(b.genLogits, logits...)
		}
		if r.req.ReturnTopLogprobs {
			m.best = b.addTopLogprobs(logits, tok, r.req.TopLogprobs, m.best)
		}
	}
	b.tokens = append(b.tokens, tok)
	b.generated++
	if b.logProbs != nil {
		b.logProbs = append(b.logProbs, lp)
		b.cumLogProb += lp
	}
	if r.req.Guide != nil {
		st, err := b.gst.Advance(tok)
		if err != nil {
			r.failed = fmt.Errorf("%w: guided decoding: %w", ErrEngine, err)
			return true
		}
		b.gst = st
	}
	m.decayTopP(r, b, tok)
	m.checkStop(r, b)
	if !b.ended && r.req.Guide != nil && b.gst.Done() {
		// The text is complete: nothing but an end token could follow.
		b.ended, b.finish = true, FinishedEndID
	}
	return b.ended
}

// seqFailure is the sentinel a sequence's own failure ends its request with: an
// invalid request where its settings leave no token to choose, else an engine error.
func seqFailure(err error) error {
	if errors.Is(err, engine.ErrAllMasked) {
		return ErrInvalidRequest
	}
	return ErrEngine
}

// tokenTimes records the first and latest token times (perf metrics).
func (m *Manager) tokenTimes(r *request) {
	if r.perf.FirstToken.IsZero() {
		r.perf.FirstToken = m.now
	}
	r.perf.LastToken = m.now
}

// checkStop ends b after a stop word, a stop string, or at its length limit.
func (m *Manager) checkStop(r *request, b *branch) {
	switch {
	case hitsStopWord(b.tokens, r.req.StopWords):
		b.ended, b.finish = true, FinishedStopWord
	case r.req.TextStop != nil && r.req.TextStop.Stopped(b.index, b.tokens[r.promptLen:]):
		b.ended, b.finish = true, FinishedStopWord
	case b.generated >= r.maxNew || len(b.tokens) >= m.info.MaxSeqLen:
		b.ended, b.finish = true, FinishedLength
	}
}

// decayTopP moves b's runtime top-p after token tok (TensorRT-LLM's runtime top-p
// decay: back to the request's top-p at the reset token, else times the decay, not
// below the minimum).
func (m *Manager) decayTopP(r *request, b *branch, tok int32) {
	d := r.req.TopPDecay
	if d <= 0 {
		return
	}
	if tok == r.req.TopPResetID {
		b.topP = r.initialTopP()
		return
	}
	b.topP = max(b.topP*d, r.req.TopPMin)
}

// initialTopP is the runtime top-p a branch starts from: the request's top-p, and
// under a decay 1 where the request sets none (0: no limit).
func (r *request) initialTopP() float32 {
	if r.req.TopPDecay > 0 && (r.sampling.TopP == 0 || r.sampling.TopP > 1) {
		return 1
	}
	return r.sampling.TopP
}

// hostSample chooses b's token from the logits the engine returned, after r's logits
// post-processor, with the engine's rules.
func (m *Manager) hostSample(r *request, b *branch, seq *engine.Sequence) (int32, float32, error) {
	w := b.logits
	b.logits = nil
	if r.wantsRows() && !r.req.BatchedPostProcessing {
		b.rawLogits = slices.Clone(w)
	}
	if pp := r.req.LogitsPostProcessor; pp != nil {
		if err := m.callPostProcessor(pp, r.id, w, b.tokens); err != nil {
			return -1, 0, err
		}
	}
	m.sampler.Process(w, seq)
	tok, lp, err := m.sampler.Pick(w, &seq.Sampling, seq.NumGenerated)
	if err != nil {
		// No request number here: respond names the request once, and the backend
		// replaces that name with the client's request id.
		return -1, 0, fmt.Errorf("sample after the logits post-processor: %w", err)
	}
	return tok, lp, nil
}

// callPostProcessor runs a logits post-processor, turning a panic in it into an error
// for its request.
func (m *Manager) callPostProcessor(pp LogitsPostProcessor, id uint64, logits []float32, tokens []int32) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("logits post-processor panicked: %v", p)
		}
	}()
	pp(id, logits, tokens[:len(tokens):len(tokens)])
	return nil
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

// afterStep moves a request on after its branches advanced: a group whose prompt is
// computed forks, a beam search selects its next beams, and the request is complete
// when it has nothing left to generate.
func (m *Manager) afterStep(r *request) {
	if r.failed != nil {
		return
	}
	switch {
	case r.beams:
		if r.logits != nil && (r.forked || r.computed == r.promptLen) {
			m.beamStep(r)
		}
	case r.width > 1:
		if !r.forked && r.computed >= r.forkAt {
			m.forkSamples(r)
			return
		}
		if r.forked {
			r.complete = true
			for _, b := range r.forks {
				r.complete = r.complete && b.ended
			}
			r.complete = r.complete && r.ended
		}
	default:
		r.complete = r.ended
	}
}

// forkSamples makes a sampled group's branches once its prompt is computed up to
// forkAt: the first branch keeps its blocks, each other one shares them, and each
// feeds the rest of the prompt (the last token) and draws from its own stream.
func (m *Manager) forkSamples(r *request) {
	for i := 1; i < r.width; i++ {
		kv, err := r.kv.Fork()
		if err != nil {
			r.failed = fmt.Errorf("%w: fork: %w", ErrInternal, err)
			return
		}
		b := &branch{tokens: make([]int32, r.promptLen, r.promptLen+r.maxNew), kv: kv, computed: r.computed,
			index: i, seed: branchSeed(r.sampling.Seed, i), topP: r.initialTopP(), gst: r.gst}
		copy(b.tokens, r.tokens[:r.promptLen])
		if r.req.ReturnLogProbs {
			b.logProbs = make([]float32, 0, r.maxNew)
		}
		r.forks = append(r.forks, b)
	}
	r.forked = true
	r.all = append(r.all[:1], r.forks...)
	for _, b := range r.branches() {
		b.n = len(b.tokens) - b.computed
	}
}

// branchSeed is the random stream of sequence i of a request seeded seed: the seed
// itself for the first, so one sequence draws as a request without
// num_return_sequences does.
func branchSeed(seed uint64, i int) uint64 {
	return seed + uint64(i)*0x9e3779b97f4a7c15
}

// respond sends what a request has to say after an iteration, freeing its state first
// when the response is final.
func (m *Manager) respond(r *request) {
	if r.failed != nil {
		m.release(r)
		m.send(r.id, Result{}, true, fmt.Errorf("request %d: %w", r.id, r.failed))
		return
	}
	if r.complete {
		m.complete(r)
		return
	}
	switch {
	case r.beams:
		if r.req.Streaming && r.forked && r.generated > r.sent {
			r.sent = r.generated
			m.send(r.id, m.beamResult(r, false), false, nil)
		}
	case r.width > 1:
		for _, b := range r.branches() {
			if b.replied {
				continue
			}
			if b.ended {
				// One sequence finished; the request goes on.
				if b.kv != nil {
					_ = b.kv.Release()
					b.kv = nil
				}
				b.replied = true
				m.send(r.id, m.branchResult(r, b, true), false, nil)
			} else if r.req.Streaming && m.streamDue(b) {
				m.send(r.id, m.branchResult(r, b, false), false, nil)
			}
		}
	default:
		// A step with proposals may add several tokens: each goes out as it would have
		// from steps of its own.
		for r.req.Streaming && m.streamDue(&r.branch) {
			m.send(r.id, m.streamResult(r, &r.branch, m.streamChunk(&r.branch)), false, nil)
		}
	}
}

// streamChunk is the most tokens a streaming response of b carries before its last:
// the first token alone, then Config.StreamInterval.
func (m *Manager) streamChunk(b *branch) int {
	if b.sent == 0 {
		return 1
	}
	return max(1, m.cfg.StreamInterval)
}

// streamDue says whether a streaming sequence has a response due that is not its last:
// its first token at once (the time to the first token does not wait), then every
// Config.StreamInterval new tokens.
func (m *Manager) streamDue(b *branch) bool {
	n := b.generated - b.sent
	return n > 0 && (b.sent == 0 || n >= max(1, m.cfg.StreamInterval))
}

// complete ends a request that finished: in V1 it waits, as padding, for the end of
// its batch; otherwise its state is freed and its last responses go out.
func (m *Manager) complete(r *request) {
	if m.cfg.ModelType == V1 {
		// The slot stays in the batch as padding; the answer goes out with the batch.
		m.releaseKV(r)
		r.phase = phaseHeld
		m.held = append(m.held, r)
		if r.width == 1 && r.req.Streaming && r.generated > r.sent {
			m.send(r.id, m.streamResult(r, &r.branch, 0), false, nil)
		}
		return
	}
	m.release(r)
	m.sendLast(r, 0)
}

// sendLast sends a finished request's last responses (its state already freed), the
// last of them final; padTo pads a plain non-streaming answer (V1).
func (m *Manager) sendLast(r *request, padTo int) {
	switch {
	case r.beams:
		m.send(r.id, m.beamResult(r, true), true, nil)
	case r.width > 1:
		var last []*branch
		for _, b := range r.branches() {
			if !b.replied {
				last = append(last, b)
			}
		}
		for i, b := range last {
			b.replied = true
			m.send(r.id, m.branchResult(r, b, true), i == len(last)-1, nil)
		}
		if len(last) == 0 {
			// Every sequence has had its last response: the flag alone ends the request.
			m.send(r.id, Result{SequenceFinal: true, PromptLen: r.promptLen, Perf: m.perf(r)}, true, nil)
		}
	case r.req.Streaming:
		// A step with proposals may have added several tokens before the end: the
		// responses due after each token that did not end the request go out first, as
		// from steps of their own. The token that ends it (a stop word, the length
		// limit) goes with the final response; an end token is none of the output.
		b := &r.branch
		last := b.generated
		if b.finish == FinishedStopWord || b.finish == FinishedLength {
			last--
		}
		for last-b.sent >= m.streamChunk(b) && b.sent < last {
			res := m.streamResult(r, b, m.streamChunk(b))
			res.Finish = NotFinished
			m.send(r.id, res, false, nil)
		}
		m.send(r.id, m.streamResult(r, b, 0), true, nil)
	default:
		m.send(r.id, m.finalResult(r, &r.branch, padTo), true, nil)
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
		m.sendLast(r, longest)
	}
}

// branchResult is a response of one sequence of a sampled group: streaming, its new
// tokens; at its end (last), streaming its last new tokens, else its whole output.
func (m *Manager) branchResult(r *request, b *branch, last bool) Result {
	var res Result
	if r.req.Streaming {
		res = m.streamResult(r, b, 0)
	} else {
		res = m.finalResult(r, b, 0)
	}
	res.SequenceIndex, res.SequenceFinal = b.index, last
	if !last {
		res.Finish = NotFinished
	}
	return res
}

// streamResult is a streaming response: the tokens b generated since its last one
// (usually one; none on the final response after an end token), with what the request
// asked for of them.
func (m *Manager) streamResult(r *request, b *branch, most int) Result {
	from, to := b.sent, b.generated
	if most > 0 {
		to = min(to, from+most)
	}
	b.sent = to
	res := Result{Tokens: b.tokens[r.promptLen+from : r.promptLen+to : r.promptLen+to], Length: to - from}
	m.addExtras(&res, r, b, from, to, true)
	if to < b.generated {
		// Some of a step's tokens (speculative decoding): the response their own step
		// would have sent.
		res.Generated, res.Finish = to, NotFinished
		if b.logProbs != nil {
			var c float32
			for _, x := range b.logProbs[:to] {
				c += x
			}
			res.CumLogProb = c
		}
	}
	r.ctxSent = true
	// The rows sent are the response's now: the next ones start a new buffer.
	b.genLogits, b.genFrom = nil, to
	return res
}

// finalResult is a non-streaming answer: the prompt (unless excluded) and every token
// b generated, padded with PadID to padTo generated tokens (V1). Length counts the real
// tokens.
func (m *Manager) finalResult(r *request, b *branch, padTo int) Result {
	start := 0
	if r.req.ExcludeInputInOutput {
		start = r.promptLen
	}
	n := len(b.tokens) - start
	ids := b.tokens[start:len(b.tokens):len(b.tokens)]
	if pad := padTo - b.generated; pad > 0 && r.req.PadID >= 0 {
		ids = make([]int32, n, n+pad)
		copy(ids, b.tokens[start:])
		for range pad {
			ids = append(ids, r.req.PadID)
		}
	}
	res := Result{Tokens: ids, Length: n}
	m.addExtras(&res, r, b, 0, b.generated, true)
	r.ctxSent = true
	return res
}

// addExtras fills the counts, the finish reason and the asked-for log probs and logits
// of b's generated tokens [from, to), and the context logits when withCtx. Context
// logits go with every response that asks (as TensorRT-LLM's do when streaming).
func (m *Manager) addExtras(res *Result, r *request, b *branch, from, to int, withCtx bool) {
	vocab := m.info.VocabSize
	res.PromptLen, res.Generated, res.Finish = r.promptLen, b.generated, b.finish
	res.SequenceIndex = b.index
	if b.logProbs != nil {
		res.CumLogProb = b.cumLogProb
		res.LogProbs = b.logProbs[from:to:to]
	}
	if r.ctxLogits != nil && withCtx {
		res.ContextLogits = r.ctxLogits
	}
	if r.req.ReturnGenerationLogits {
		lo, hi := (from-b.genFrom)*vocab, (to-b.genFrom)*vocab
		res.GenerationLogits = b.genLogits[lo:hi:hi]
		if res.GenerationLogits == nil {
			res.GenerationLogits = []float32{}
		}
	}
	if r.req.ReturnTopLogprobs {
		k := r.req.TopLogprobs
		res.TokenLogprobs = b.tokLPs[from:to:to]
		res.TopLogprobIDs, res.TopLogprobs = b.topIDs[from*k:to*k:to*k], b.topLPs[from*k:to*k:to*k]
	}
	res.Perf = m.perf(r)
}

// perf is r's perf metrics for a response, when asked.
func (m *Manager) perf(r *request) *PerfMetrics {
	if !r.req.ReturnPerfMetrics {
		return nil
	}
	p := r.perf
	return &p
}

// recoverEngine lets an engine that can (engine.Recoverer) check and restore itself
// after a failed step. One that cannot recover ends the instance: it returns the error
// (wrapping ErrEngineBroken) with which the caller ends everything in flight, and every
// later request gets it too; EngineFailed hears of it first.
func (m *Manager) recoverEngine(cause error) error {
	rec, ok := m.eng.(engine.Recoverer)
	if !ok {
		return nil
	}
	rerr := rec.Recover(cause)
	if rerr == nil {
		m.log.Sugar().Warnw("the engine recovered from the failed step; serving on", "error", cause)
		return nil
	}
	broken := fmt.Errorf("%w: %w (after: %w)", ErrEngineBroken, rerr, cause)
	m.log.Sugar().Errorw("the engine cannot recover from the failed step; the instance serves nothing more", "error", broken)
	m.statsMu.Lock()
	m.broken = broken
	m.statsMu.Unlock()
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
	return broken
}

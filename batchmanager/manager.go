package batchmanager

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"gollm/engine"
	"gollm/guide"
	"gollm/kvcache"
	"gollm/speculate"
)

// Sentinel errors carried (wrapped) by final error responses; test with errors.Is.
var (
	// ErrCancelled ends a request named by PollStopSignal.
	ErrCancelled = errors.New("request cancelled")
	// ErrShuttingDown ends every request in flight when the manager shuts down.
	ErrShuttingDown = errors.New("model is shutting down")
	// ErrDuplicateID rejects a request whose ID is already in flight.
	ErrDuplicateID = errors.New("request ID already in flight")
	// ErrInvalidRequest rejects a request that can never run (bad field values).
	ErrInvalidRequest = errors.New("invalid request")
	// ErrEngine ends the requests of an iteration whose engine step failed.
	ErrEngine = errors.New("engine step failed")
	// ErrInternal ends the requests in flight when the loop recovered from a panic.
	ErrInternal = errors.New("batch manager internal error")
	// ErrEngineBroken ends every request once a step failed and the engine could not
	// recover (engine.Recoverer): the instance serves nothing more.
	ErrEngineBroken = errors.New("the engine failed and cannot recover; reload the model")
)

// Manager runs the iteration loop of one model instance on its own goroutine.
//
// Each iteration: GetInferenceRequests(free slots) (new requests are validated; a bad
// one or an ID already in flight gets a final error at once), scheduling under the
// model type and policy, one Engine.Step, stop conditions and SendResponse calls,
// PollStopSignal, and the stats callbacks. Idle, it waits up to Config.IdleWait (Wake
// cuts it short), still calling GetInferenceRequests and PollStopSignal.
//
// Responses carry a Result. Streaming: each response carries that iteration's new
// token; the final one carries the last token, or none when the request ended at its
// end token. Non-streaming: one final response with the prompt (unless
// ExcludeInputInOutput) and every generated token; in V1 the row is padded with PadID
// (when ≥ 0) to the batch's longest output and Length counts the real tokens only. On
// request: log-probabilities, context logits (first streaming response, or the final
// one) and generation logits. The end token is never part of the output; a stop word
// is.
//
// A request ends at MaxNewTokens, at one of its EndIDs, after a stop word, or when it
// reaches the model's MaxSeqLen. Its KV blocks and ID are freed before its final response. Errors
// in final responses wrap ErrCancelled, ErrShuttingDown, ErrDuplicateID,
// ErrInvalidRequest, ErrEngine or ErrInternal.
type Manager struct {
	// eng runs the iterations.
	eng engine.Engine
	// info is eng.Info(), read once.
	info engine.Info
	// cfg is the validated configuration, defaults filled in.
	cfg Config
	// cb are the four callbacks (and the optional typed stats one).
	cb Callbacks
	// log receives the loop's diagnostics.
	log *zap.Logger
	// pool owns the KV blocks: the engine only reads and writes the ones it is handed.
	pool *kvcache.Pool
	// wake cuts an idle wait short (buffered, 1).
	wake chan struct{}
	// quit is closed by Shutdown.
	quit chan struct{}
	// done is closed when the worker goroutine has exited.
	done chan struct{}
	// shutdownOnce makes Shutdown idempotent.
	shutdownOnce sync.Once

	// byID holds every request the manager has and has not finished (waiting, running,
	// paused, or finished but held for the end of a V1 batch).
	byID map[uint64]*request
	// waiting are accepted requests not admitted yet, in arrival order.
	waiting []*request
	// admitBy is when the burst being gathered starts at the latest
	// (Config.AdmissionWindow); zero when none is. lastArrival is when intake last took
	// a request; admitWake is when the loop looks again.
	admitBy, lastArrival, admitWake time.Time
	// running are admitted requests that hold KV blocks, in admission order.
	running []*request
	// paused are requests evicted under max_utilization, by admission order.
	paused []*request
	// held are V1 requests that finished before the rest of their batch.
	held []*request
	// admitted numbers admissions, to order running and paused.
	admitted uint64
	// iter is the iteration counter of the stats.
	iter uint64

	// sched are the requests of this iteration's batch, in batch order.
	sched []*request
	// refs name the request and branch of each sequence of the batch.
	refs []seqRef
	// sampler chooses the tokens of host-sampled requests and scores beams.
	sampler *engine.Sampler
	// best is addTopLogprobs' scratch.
	best []int
	// beamScorers score beams' logits rows, one per worker goroutine (scoreBeams).
	beamScorers []*beamScorer
	// beamJobs is scoreBeams' scratch; guideJobs guideMasks'.
	beamJobs  []beamJob
	guideJobs []guideJob
	// masks are the shared guided decoding masks (guideMasks), read-only once made;
	// maskGuides the constraints they are of.
	masks      map[maskKey][]uint64
	maskGuides []*guide.Guide
	// now is when the current iteration started.
	now time.Time
	// batch is the engine batch, reused each iteration.
	batch engine.Batch
	// it counts this iteration's work for the stats.
	it iterCounts

	// pipe launches and waits for iterations under Config.Overlap; nil without it. late is
	// pipe when it takes guided masks after a launch (guided requests then run ahead too).
	pipe engine.Pipeliner
	late engine.LateMasker
	// lateSeqs and lateRefs are lateMasks' scratch.
	lateSeqs []engine.Sequence
	lateRefs []seqRef
	// launched counts the iterations launched on pipe and not waited for.
	launched int
	// ahead is the iteration launched ahead of its outputs' predecessor (Config.Overlap),
	// still on the engine; nil when none is.
	ahead *aheadStep
	// spare is a finished aheadStep kept for reuse; placeholder is the token of every
	// fed sequence.
	spare       *aheadStep
	placeholder []int32
	// admittedAhead is admitAhead's scratch.
	admittedAhead []*request

	// hidden is the proposer when it reads the target's hidden states; nil otherwise.
	hidden speculate.HiddenReader
	// specCands and specReqs are propose's scratch; specTotal counts speculation since
	// the start.
	specCands []*request
	specReqs  []*speculate.Request
	specTotal specTotals
	// policy is the adaptive speculation policy (Speculation.Adaptive); nil without it.
	// clock times its iterations (time.Now; tests control it).
	policy *specPolicy
	clock  func() time.Time

	// statsEnc encodes the stats JSON of ReturnBatchManagerStats.
	statsEnc statsEncoder

	// statsMu guards last and broken.
	statsMu sync.Mutex
	// last answers Stats() between iterations.
	last Stats
	// broken is set, wrapping ErrEngineBroken, once the engine could not recover from a
	// failed step.
	broken error
}

// phase is where a request is in its life.
type phase uint8

const (
	phaseWaiting phase = iota
	phaseRunning
	phasePaused
	phaseHeld
	phaseDone
)

// request is the manager's state of one InferenceRequest. Its embedded branch is its
// sequence — the only one, or the first of a beam search's beams or of its sampled
// sequences (num_return_sequences), whose other branches are in forks.
type request struct {
	branch
	// req belongs to the client; the manager only reads it.
	req *InferenceRequest
	// id is req.ID.
	id uint64
	// phase says which list holds the request.
	phase phase
	// promptLen counts the prompt's tokens at the front of tokens.
	promptLen int
	// maxNew is MaxNewTokens (CheckLengths: it fits the model's MaxSeqLen).
	maxNew int
	// worstBlocks is the most KV blocks the request can need (all its branches).
	worstBlocks int
	// admitSeq orders admissions (pause victims are the highest).
	admitSeq uint64
	// sampling is req.Sampling with EndIDs set from req.EndIDs.
	sampling engine.SamplingParams
	// ctxLogits are the prompt positions' logits (when asked), [promptLen][vocab].
	ctxLogits []float32
	// ctxSent says context_logits went out once (streaming).
	ctxSent bool
	// failed is the error ending the request this iteration, if any.
	failed error
	// resumes counts how many times the request came back from a pause.
	resumes int

	// width is the most engine sequences the request runs at once: its beam width or
	// its number of sampled sequences; 1 for a plain request.
	width int
	// beams says the request runs beam search (BeamWidth > 1).
	beams bool
	// forkAt is where a group's branches start writing KV of their own: the prompt's
	// length for beams (the first branch computes the prompt and its logits start the
	// search), one less for sampled sequences (each computes the last prompt token and
	// draws its own first token).
	forkAt int
	// forked says a group's branches exist (its prompt is computed up to forkAt).
	forked bool
	// forks are the branches besides the embedded one.
	forks []*branch
	// search is a beam request's finished hypotheses and settings.
	search *beamSearch
	// perf holds the request's timings and KV counts (ReturnPerfMetrics).
	perf PerfMetrics
	// complete says the whole request finished this iteration (every branch ended, or
	// the beam search is done).
	complete bool
	// all lists the branches: the embedded one, then forks.
	all []*branch
	// spec is the request's speculation state, from its first proposal on.
	spec *specRequest
}

// branch is one sequence of a request.
type branch struct {
	// tokens are the prompt followed by the generated tokens.
	tokens []int32
	// kv is the block table while running; nil otherwise.
	kv *kvcache.Sequence
	// computed is the number of leading tokens whose KV is in kv.
	computed int
	// generated is the number of tokens generated (the end token excluded).
	generated int
	// cumLogProb is the sum of logProbs (a beam's score before the length penalty).
	cumLogProb float32
	// logProbs are the generated tokens' log-probabilities (when asked; beams always).
	logProbs []float32
	// genLogits are the generated positions' logits (when asked) from token genFrom on,
	// [generated-genFrom][vocab]: a streaming request's rows leave with the response
	// that carries them.
	genLogits []float32
	genFrom   int
	// tokLPs, topIDs and topLPs are the generated tokens' log-probabilities and their
	// positions' best alternatives (ReturnTopLogprobs), [generated] and
	// [generated][TopLogprobs].
	tokLPs []float32
	topIDs []int32
	topLPs []float32
	// sent is the number of generated tokens already streamed.
	sent int
	// n is the number of tokens scheduled this iteration.
	n int
	// ended says the branch finished (this iteration or before).
	ended bool
	// finish is why the branch ended, once it has.
	finish FinishReason
	// index is the branch's sequence index (num_return_sequences).
	index int
	// seed starts the branch's random stream (from random_seed; each sampled sequence its own).
	seed uint64
	// topP is the branch's runtime top-p (runtime_top_p_decay moves it each step).
	topP float32
	// replied says the branch's last response went out (a group's branch ends alone).
	replied bool
	// logits are the last position's logits this iteration, for the manager to sample
	// or score (host-sampled requests); nil otherwise.
	logits []float32
	// top are a beam's best 2W tokens this iteration with their log-probabilities
	// (scoreBeams), best first; masked says every token was masked.
	top    []tokLP
	masked bool
	// rawLogits are logits as the engine returned them, before a post-processor
	// (ReturnGenerationLogits or ReturnTopLogprobs of a host-sampled request).
	rawLogits []float32
	// gst is the branch's place in its request's constraint (guided decoding).
	gst guide.State
	// mask is the branch's buffer for its allowed tokens; allowed is it when this
	// iteration's row of the branch samples under the constraint, else nil.
	mask, allowed []uint64
}

// branches lists r's branches, the embedded one first (the slice is r's own).
func (r *request) branches() []*branch { return r.all }

// New validates cfg, sizes the KV pool from eng.Info() and starts the worker goroutine.
func New(eng engine.Engine, cfg Config, cb Callbacks, log *zap.Logger) (*Manager, error) {
	m, err := newManager(eng, cfg, cb, log)
	if err != nil {
		return nil, err
	}
	go m.loop()
	return m, nil
}

// newManager builds a manager without starting its loop (benchmarks drive iterate).
func newManager(eng engine.Engine, cfg Config, cb Callbacks, log *zap.Logger) (*Manager, error) {
	if eng == nil {
		return nil, errors.New("batchmanager: engine is nil")
	}
	if log == nil {
		log = zap.NewNop()
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cb.GetInferenceRequests == nil || cb.SendResponse == nil {
		return nil, errors.New("batchmanager: callbacks GetInferenceRequests and SendResponse are required")
	}
	info := eng.Info()
	if info.VocabSize <= 0 || info.MaxSeqLen <= 0 {
		return nil, fmt.Errorf("batchmanager: engine info: VocabSize %d and MaxSeqLen %d must be positive", info.VocabSize, info.MaxSeqLen)
	}
	if cfg.Speculation, err = cfg.Speculation.withDefaults(info, cfg.ModelType); err != nil {
		return nil, err
	}
	hidden, _ := cfg.Speculation.Proposer.(speculate.HiddenReader)
	pool, err := kvcache.New(kvcache.Config{NumBlocks: info.NumBlocks, TokensPerBlock: info.TokensPerBlock, EnableReuse: cfg.EnableKVCacheReuse})
	if err != nil {
		return nil, fmt.Errorf("batchmanager: KV pool from engine info: %w", err)
	}
	m := &Manager{
		sampler: engine.NewSampler(info.VocabSize),
		eng:     eng,
		info:    info,
		cfg:     cfg,
		cb:      cb,
		log:     log,
		pool:    pool,
		wake:    make(chan struct{}, 1),
		quit:    make(chan struct{}),
		done:    make(chan struct{}),
		byID:    map[uint64]*request{},
		hidden:  hidden,
		clock:   time.Now,
	}
	if cfg.Speculation.Proposer != nil && cfg.Speculation.Adaptive {
		m.policy = newSpecPolicy(cfg.Speculation.MaxDraft)
	}
	if cfg.Overlap {
		if p, ok := eng.(engine.Pipeliner); ok {
			m.pipe = p
		} else {
			m.pipe = engine.NewSyncPipeline(eng)
		}
		m.late, _ = m.pipe.(engine.LateMasker)
		m.placeholder = []int32{0}
	}
	m.last = m.snapshot(time.Now())
	return m, nil
}

// withDefaults checks a Config and fills in its zero fields.
func (c Config) withDefaults() (Config, error) {
	if c.ModelType == "" {
		c.ModelType = InflightFusedBatching
	}
	switch c.ModelType {
	case V1, InflightBatching, InflightFusedBatching:
	default:
		return c, fmt.Errorf("batchmanager: gpt_model_type %q: want V1, inflight_batching or inflight_fused_batching", c.ModelType)
	}
	if c.Policy == "" {
		c.Policy = GuaranteedNoEvict
	}
	switch c.Policy {
	case MaxUtilization, GuaranteedNoEvict, StaticBatch:
	default:
		return c, fmt.Errorf("batchmanager: batch_scheduler_policy %q: want max_utilization, guaranteed_no_evict or static_batch", c.Policy)
	}
	if c.MaxBatchSize == 0 {
		c.MaxBatchSize = 64
	}
	if c.MaxBatchSize < 0 {
		return c, fmt.Errorf("batchmanager: max_batch_size must be positive, got %d", c.MaxBatchSize)
	}
	if c.MaxNumTokens < 0 {
		return c, fmt.Errorf("batchmanager: max_num_tokens must be 0 (no limit) or positive, got %d", c.MaxNumTokens)
	}
	if c.ModelType == V1 && c.EnableChunkedContext {
		return c, errors.New("batchmanager: enable_chunked_context needs in-flight batching, gpt_model_type is V1")
	}
	if c.IdleWait == 0 {
		c.IdleWait = 10 * time.Millisecond
	}
	if c.AdmissionWindow < 0 {
		return c, fmt.Errorf("batchmanager: AdmissionWindow must not be negative, got %v", c.AdmissionWindow)
	}
	if c.StreamInterval < 0 {
		return c, fmt.Errorf("batchmanager: StreamInterval must not be negative, got %d", c.StreamInterval)
	}
	if c.IdleWait < 0 {
		return c, fmt.Errorf("batchmanager: IdleWait must be positive, got %v", c.IdleWait)
	}
	return c, nil
}

// Wake tells the loop that requests were queued: an idle wait ends now.
func (m *Manager) Wake() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Shutdown stops the loop: every request in flight (and every request
// GetInferenceRequests still hands over) gets a final ErrShuttingDown response. It
// returns once the worker goroutine has exited; later calls return at once.
func (m *Manager) Shutdown() {
	m.shutdownOnce.Do(func() { close(m.quit) })
	<-m.done
}

// Stats returns the latest stats snapshot (the one last sent to
// ReturnBatchManagerStats, or the idle state). Safe from any goroutine.
func (m *Manager) Stats() Stats {
	m.statsMu.Lock()
	defer m.statsMu.Unlock()
	return m.last
}

// loop is the worker goroutine.
func (m *Manager) loop() {
	defer close(m.done)
	defer m.closeProposer()
	// The engine may hold thread-bound state (a CUDA context); keep it on one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	idle := time.NewTimer(time.Hour)
	idle.Stop()
	for {
		select {
		case <-m.quit:
			m.stopAll()
			return
		default:
		}
		worked, ok := m.safeIterate()
		if worked {
			continue
		}
		if !ok {
			// A panic: do not spin hot if it repeats.
			time.Sleep(m.cfg.IdleWait)
		}
		wait := m.cfg.IdleWait
		if !m.admitBy.IsZero() {
			// A burst is being gathered: look again when it may be over.
			wait = min(wait, max(time.Until(m.admitWake), 0))
		}
		idle.Reset(wait)
		select {
		case <-m.quit:
			idle.Stop()
			m.stopAll()
			return
		case <-m.wake:
			idle.Stop()
		case <-idle.C:
		}
	}
}

// safeIterate runs one iteration, turning a panic into final errors for everything in
// flight and a fresh KV pool. worked says the engine ran; ok is false after a panic.
func (m *Manager) safeIterate() (worked, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			m.log.Error("batch manager iteration panicked; failing every request in flight",
				zap.Any("panic", r), zap.Stack("stack"))
			m.failAll(fmt.Errorf("%w: %v", ErrInternal, r))
			worked, ok = false, false
		}
	}()
	return m.iterate(), true
}

// stopAll ends the loop: everything in flight and everything still queued upstream gets
// a final ErrShuttingDown.
func (m *Manager) stopAll() {
	m.failAll(ErrShuttingDown)
	reqs := m.getRequests(-1)
	for _, r := range reqs {
		if r != nil {
			m.send(r.ID, Result{}, true, fmt.Errorf("request %d: %w", r.ID, ErrShuttingDown))
		}
	}
}

// failAll ends every request the manager holds with err and starts a fresh pool, so no
// bookkeeping survives whatever went wrong.
func (m *Manager) failAll(err error) {
	if m.pipe != nil {
		m.drainPipe()
	}
	all := make([]*request, 0, len(m.byID))
	for _, r := range m.byID {
		all = append(all, r)
	}
	m.byID = map[uint64]*request{}
	m.waiting, m.running, m.paused, m.held, m.sched = nil, nil, nil, nil, nil
	if sp := m.cfg.Speculation.Proposer; sp != nil {
		sp.Reset()
	}
	m.batch.Seqs = m.batch.Seqs[:0]
	if pool, perr := kvcache.New(kvcache.Config{NumBlocks: m.info.NumBlocks, TokensPerBlock: m.info.TokensPerBlock, EnableReuse: m.cfg.EnableKVCacheReuse}); perr == nil {
		m.pool = pool
	}
	for _, r := range all {
		for _, b := range r.branches() {
			b.kv = nil
		}
		r.phase = phaseDone
		m.send(r.id, Result{}, true, fmt.Errorf("request %d: %w", r.id, err))
	}
	m.publishStats(time.Now(), false)
}

// getRequests calls GetInferenceRequests, containing a panic in it.
func (m *Manager) getRequests(max int) (reqs []*InferenceRequest) {
	defer func() {
		if r := recover(); r != nil {
			m.log.Error("GetInferenceRequests panicked", zap.Any("panic", r))
			reqs = nil
		}
	}()
	return m.cb.GetInferenceRequests(max)
}

// pollStop calls PollStopSignal, if set, containing a panic in it.
func (m *Manager) pollStop() (ids map[uint64]struct{}) {
	if m.cb.PollStopSignal == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			m.log.Error("PollStopSignal panicked", zap.Any("panic", r))
			ids = nil
		}
	}()
	return m.cb.PollStopSignal()
}

// pollEnd calls PollEndSignal, if set, containing a panic in it.
func (m *Manager) pollEnd() (ids map[uint64]struct{}) {
	if m.cb.PollEndSignal == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			m.log.Error("PollEndSignal panicked", zap.Any("panic", r))
			ids = nil
		}
	}()
	return m.cb.PollEndSignal()
}

// send calls SendResponse, containing a panic in it (one bad response must not take
// the others down).
func (m *Manager) send(id uint64, res Result, final bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			m.log.Error("SendResponse panicked", zap.Uint64("request", id), zap.Any("panic", r))
		}
	}()
	m.cb.SendResponse(id, res, final, err)
}

// Broken returns the error (wrapping ErrEngineBroken) that ended the engine, nil while
// it serves.
func (m *Manager) Broken() error {
	m.statsMu.Lock()
	defer m.statsMu.Unlock()
	return m.broken
}

// iterate runs one iteration; it reports whether the engine ran.
func (m *Manager) iterate() bool {
	m.now = time.Now()
	if err := m.Broken(); err != nil {
		// Nothing runs any more: every new request ends at once.
		for _, r := range m.getRequests(-1) {
			if r != nil {
				m.send(r.ID, Result{}, true, fmt.Errorf("request %d: %w", r.ID, err))
			}
		}
		return false
	}
	m.intake()
	if m.ahead != nil {
		// The iteration launched ahead is the next one; admissions wait for the step
		// after it, which stepAhead leaves to the scheduler when requests are waiting.
		m.iter++
		now := time.Now()
		m.stepAhead()
		m.observeSpec()
		m.applyEnds(m.pollEnd())
		m.applyStops(m.pollStop())
		m.publishStats(now, true)
		return true
	}
	if m.gathering() {
		m.policy.idle()
		m.publishStats(time.Now(), false)
		return false
	}
	m.schedule()
	if len(m.sched) > 0 {
		m.propose()
	}
	if len(m.sched) == 0 {
		m.policy.idle()
		m.applyEnds(m.pollEnd())
		m.applyStops(m.pollStop())
		// Keep Stats current (waiting or cancelled requests) without a stats callback.
		m.publishStats(time.Now(), false)
		return false
	}
	m.iter++
	now := time.Now()
	m.step()
	m.observeSpec()
	m.applyEnds(m.pollEnd())
	m.applyStops(m.pollStop())
	m.publishStats(now, true)
	return true
}

// gathering reports whether the iteration should wait for more of a burst
// (Config.AdmissionWindow): requests wait, nothing runs, there is room for more, the
// window is open and the burst is still arriving — the last request came less than a
// quarter of the window ago, so that a burst that has ended, or a lone request, does not
// wait the window out. It opens the window at the first request of an idle manager.
func (m *Manager) gathering() bool {
	w := m.cfg.AdmissionWindow
	if w <= 0 || len(m.running) > 0 || len(m.waiting) == 0 || len(m.waiting) >= m.cfg.MaxBatchSize {
		m.admitBy = time.Time{}
		return false
	}
	if m.admitBy.IsZero() {
		m.admitBy = m.now.Add(w)
	}
	quiet := m.lastArrival.Add(w / 4)
	if m.now.Before(m.admitBy) && m.now.Before(quiet) {
		m.admitWake = quiet
		if m.admitBy.Before(quiet) {
			m.admitWake = m.admitBy
		}
		return true
	}
	m.admitBy = time.Time{}
	return false
}

// intake takes new requests: at most the free request slots, the rest stay queued
// upstream. Each one is validated and checked for a duplicate ID.
func (m *Manager) intake() {
	slots := m.cfg.MaxBatchSize - len(m.byID)
	if slots < 0 {
		slots = 0
	}
	for _, ir := range m.getRequests(slots) {
		if ir == nil {
			m.log.Warn("GetInferenceRequests returned a nil request; skipped")
			continue
		}
		if _, dup := m.byID[ir.ID]; dup {
			m.send(ir.ID, Result{}, true, fmt.Errorf("request %d: %w", ir.ID, ErrDuplicateID))
			continue
		}
		r, err := m.newRequest(ir)
		if err != nil {
			m.send(ir.ID, Result{}, true, fmt.Errorf("request %d: %w: %w", ir.ID, ErrInvalidRequest, err))
			continue
		}
		m.byID[r.id] = r
		m.waiting = append(m.waiting, r)
		m.lastArrival = m.now
	}
}

// newRequest validates an InferenceRequest against the model and the pool.
func (m *Manager) newRequest(ir *InferenceRequest) (*request, error) {
	n := len(ir.InputIDs)
	if err := CheckLengths(n, ir.MaxNewTokens, m.info.MaxSeqLen, "input_ids", "request_output_len"); err != nil {
		return nil, err
	}
	for i, t := range ir.InputIDs {
		if t < 0 || int(t) >= m.info.VocabSize {
			return nil, fmt.Errorf("input_ids[%d] = %d is outside the vocabulary [0, %d)", i, t, m.info.VocabSize)
		}
	}
	if !m.cfg.EnableChunkedContext && m.cfg.MaxNumTokens > 0 && n > m.cfg.MaxNumTokens {
		return nil, fmt.Errorf("input_ids: a prompt of %d tokens exceeds max_num_tokens %d (enable_chunked_context splits long prompts)", n, m.cfg.MaxNumTokens)
	}
	if err := checkSampling(ir, m.info.VocabSize); err != nil {
		return nil, err
	}
	var gst guide.State
	if ir.Guide != nil {
		if v := ir.Guide.Vocab().Size(); v != m.info.VocabSize {
			return nil, fmt.Errorf("guided decoding: the constraint's vocabulary has %d tokens, the model's %d", v, m.info.VocabSize)
		}
		var err error
		if gst, err = ir.Guide.Start(); err != nil {
			return nil, fmt.Errorf("guided decoding: %w", err)
		}
	}
	for i, w := range ir.StopWords {
		if len(w) == 0 {
			return nil, fmt.Errorf("stop_words_list[%d]: empty stop word", i)
		}
	}
	for i, w := range ir.Sampling.BadWords {
		if len(w) == 0 {
			return nil, fmt.Errorf("bad_words_list[%d]: empty bad word", i)
		}
	}
	width, beams, err := m.checkGroup(ir)
	if err != nil {
		return nil, err
	}
	maxNew := ir.MaxNewTokens
	// The last generated token is never fed back, so the KV holds n+maxNew-1 positions.
	worst := m.pool.BlocksFor(n + maxNew - 1)
	forkAt := n
	if width > 1 {
		// A group shares its prompt's blocks up to the fork, then each branch may hold
		// its own copy of every later block.
		if !beams {
			forkAt = n - 1
		}
		shared := forkAt / m.pool.TokensPerBlock()
		worst = shared + width*(worst-shared)
	}
	if worst > m.pool.NumBlocks() {
		return nil, fmt.Errorf("input_ids and request_output_len: %d prompt + %d new tokens need %d KV blocks of %d tokens (%d sequences), the pool has %d",
			n, maxNew, worst, m.pool.TokensPerBlock(), width, m.pool.NumBlocks())
	}
	r := &request{
		req:         ir,
		id:          ir.ID,
		promptLen:   n,
		maxNew:      maxNew,
		worstBlocks: worst,
		sampling:    ir.Sampling,
		width:       width,
		beams:       beams,
		forkAt:      forkAt,
	}
	r.tokens = make([]int32, n, n+maxNew)
	r.gst = gst
	r.all = []*branch{&r.branch}
	copy(r.tokens, ir.InputIDs)
	r.sampling.EndIDs = ir.EndIDs
	r.seed = r.sampling.Seed
	r.topP = r.initialTopP()
	if ir.ReturnLogProbs || beams {
		r.logProbs = make([]float32, 0, maxNew)
	}
	if beams {
		r.search = &beamSearch{}
	}
	r.perf.Arrival = ir.Arrival
	if r.perf.Arrival.IsZero() {
		r.perf.Arrival = m.now
	}
	if ir.ReturnContextLogits {
		r.ctxLogits = make([]float32, n*m.info.VocabSize)
	}
	return r, nil
}

// release frees a request's state: its KV blocks, its ID. Called before its final
// response.
func (m *Manager) release(r *request) {
	m.releaseKV(r)
	m.forgetSpec(r)
	delete(m.byID, r.id)
	r.phase = phaseDone
}

// releaseKV gives back the KV blocks of every branch of r.
func (m *Manager) releaseKV(r *request) {
	for _, b := range r.branches() {
		if b.kv != nil {
			if err := b.kv.Release(); err != nil {
				m.log.Error("releasing KV blocks", zap.Uint64("request", r.id), zap.Error(err))
			}
			b.kv = nil
		}
	}
}

// applyEnds ends the named requests now as if they had finished (PollEndSignal): a
// waiting one answers with nothing generated; a running one with what it has, its beams
// ranked as at the length limit.
func (m *Manager) applyEnds(ids map[uint64]struct{}) {
	if len(ids) == 0 {
		return
	}
	ended := false
	for id := range ids {
		r, ok := m.byID[id]
		if !ok || r.phase == phaseHeld {
			continue
		}
		ended = true
		for _, b := range r.branches() {
			if !b.ended {
				b.ended, b.finish = true, FinishedCancelled
			}
		}
		if r.beams && r.forked {
			for _, b := range r.branches() {
				if b.kv != nil {
					r.search.addHyp(hyp{tokens: b.tokens[r.promptLen:], logProbs: b.logProbs, cum: b.cumLogProb,
						score: lengthPenalty(b.cumLogProb, b.generated, r.req.LengthPenalty), finish: FinishedCancelled}, r.width)
				}
			}
		}
		r.complete = true
		m.release(r)
		m.sendLast(r, 0)
	}
	if ended {
		m.waiting = compact(m.waiting, phaseWaiting)
		m.running = compact(m.running, phaseRunning)
		m.paused = compact(m.paused, phasePaused)
		m.finishV1Batch()
	}
}

// applyStops stops the named requests now: state freed, final ErrCancelled response.
func (m *Manager) applyStops(ids map[uint64]struct{}) {
	if len(ids) == 0 {
		return
	}
	stopped := false
	for id := range ids {
		r, ok := m.byID[id]
		if !ok {
			continue
		}
		stopped = true
		m.release(r)
		m.send(id, Result{}, true, fmt.Errorf("request %d: %w", id, ErrCancelled))
	}
	if stopped {
		m.waiting = compact(m.waiting, phaseWaiting)
		m.running = compact(m.running, phaseRunning)
		m.paused = compact(m.paused, phasePaused)
		m.held = compact(m.held, phaseHeld)
		m.finishV1Batch()
	}
}

// compact drops the requests that left a list (their phase is no longer keep),
// keeping the order. It moves as few entries as it can, since every pointer store
// costs a write barrier while the garbage collector marks: the entries before the first
// departure stay put, and when only leading entries left (the oldest requests finish
// first when outputs are alike) the list is resliced past them, moving none.
func compact(rs []*request, keep phase) []*request {
	gone := 0 // the first entry that left
	for gone < len(rs) && rs[gone].phase == keep {
		gone++
	}
	if gone == len(rs) {
		return rs
	}
	next := gone + 1 // the first entry after it that stays
	for next < len(rs) && rs[next].phase != keep {
		next++
	}
	if gone == 0 && next < len(rs) && !slices.ContainsFunc(rs[next:], func(r *request) bool { return r.phase != keep }) {
		clear(rs[:next])
		return rs[next:]
	}
	out := rs[:gone]
	for _, r := range rs[next:] {
		if r.phase == keep {
			out = append(out, r)
		}
	}
	clear(rs[len(out):])
	return out
}

// checkGroup validates a request's beam search and sequence settings and returns how
// many engine sequences it runs at once and whether it is a beam search.
func (m *Manager) checkGroup(ir *InferenceRequest) (width int, beams bool, err error) {
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	switch {
	case ir.BeamWidth < 0:
		return 0, false, fmt.Errorf("beam_width: %d must be at least 1", ir.BeamWidth)
	case ir.NumReturnSequences < 0:
		return 0, false, fmt.Errorf("num_return_sequences: %d must be at least 1", ir.NumReturnSequences)
	case !finite(ir.LengthPenalty):
		return 0, false, fmt.Errorf("len_penalty: %g must be finite", ir.LengthPenalty)
	case !finite(ir.DiversityRate):
		return 0, false, fmt.Errorf("beam_search_diversity_rate: %g must be finite", ir.DiversityRate)
	case ir.TopPDecay != 0 && !(ir.TopPDecay > 0 && ir.TopPDecay <= 1):
		return 0, false, fmt.Errorf("runtime_top_p_decay: %g must be in (0, 1]", ir.TopPDecay)
	case ir.TopPDecay != 0 && !(ir.TopPMin > 0 && ir.TopPMin <= 1):
		return 0, false, fmt.Errorf("runtime_top_p_min: %g must be in (0, 1]", ir.TopPMin)
	case ir.TopPResetID < -1 || int(ir.TopPResetID) >= m.info.VocabSize:
		return 0, false, fmt.Errorf("runtime_top_p_reset_ids: %d is outside the vocabulary [0, %d) (-1: none)", ir.TopPResetID, m.info.VocabSize)
	case ir.ReturnTopLogprobs && (ir.TopLogprobs < 0 || ir.TopLogprobs > m.info.VocabSize):
		return 0, false, fmt.Errorf("top log-probabilities: %d alternatives per token, want 0 to the vocabulary's %d", ir.TopLogprobs, m.info.VocabSize)
	}
	if ir.BatchedPostProcessing && m.cfg.BatchedLogitsPostProcessor == nil {
		return 0, false, errors.New("logits post-processor: the request asks for the batched one, and none is configured")
	}
	width = max(1, ir.BeamWidth)
	beams = width > 1
	if beams {
		if ir.NumReturnSequences > width {
			return 0, false, fmt.Errorf("num_return_sequences: %d exceeds beam_width %d (beam search returns at most its beams)", ir.NumReturnSequences, width)
		}
		if ir.ReturnGenerationLogits || ir.ReturnTopLogprobs {
			return 0, false, errors.New("return_generation_logits and top log-probabilities: not available with beam search (beam_width > 1)")
		}
		if m.cfg.MaxBeamWidth > 0 && width > m.cfg.MaxBeamWidth {
			return 0, false, fmt.Errorf("beam_width: %d exceeds the model's max_beam_width %d", width, m.cfg.MaxBeamWidth)
		}
	} else {
		width = max(1, ir.NumReturnSequences)
	}
	if width > m.cfg.MaxBatchSize {
		return 0, false, fmt.Errorf("beam_width or num_return_sequences: %d sequences exceed max_batch_size %d (each one is a sequence of the batch)", width, m.cfg.MaxBatchSize)
	}
	return width, beams, nil
}

// checkSampling validates a request's sampling settings, once, at admission: engines
// do not check them again each step. The request's EndIDs are the ones the engine sees.
func checkSampling(ir *InferenceRequest, vocab int) error {
	p := ir.Sampling
	p.EndIDs = ir.EndIDs
	return p.Validate(vocab)
}

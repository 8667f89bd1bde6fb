package main

import (
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"gollm/batchmanager"
	"gollm/bridge/triton"
	"gollm/engine"
	"gollm/engines"
	"gollm/tokenizer"
)

// nextID numbers requests for the batch managers: IDs are never reused, so a late stop
// signal or response can never hit a newer request.
var nextID atomic.Uint64

// inflight is the backend's state of one request from Execute to its final response.
type inflight struct {
	// id keys the request in the batch manager and in inflight.
	id uint64
	// tritonID is the client's request id, for logs and stop requests ("" if none).
	tritonID string
	// factory makes the request's responses; deleted after the final one.
	factory triton.ResponseFactory
	// streaming says responses carry new tokens as they come.
	streaming bool
	// spec says what the request's responses carry (outputs, text).
	spec outputSpec
	// stop is set by a stop request naming this one.
	stop atomic.Bool
	// departing is set when the request is ended because the model is going away: its
	// final error then says so.
	departing atomic.Bool
	// responses counts the responses sent.
	responses int
	// cancelSeen is set once Triton reported the request cancelled (under the instance's mu).
	cancelSeen bool
	// lastSent is when its last response went to Triton (its sender goroutine's).
	lastSent time.Time
}

// instance is one model instance: an engine, its batch manager, and the requests
// between Triton and the manager.
type instance struct {
	// ms holds what the model's instances share: config, weights, tokenizer, limits.
	ms *modelState
	// ti is Triton's instance.
	ti triton.ModelInstance
	// name labels the instance's logs and metrics (Triton's instance name).
	name string
	// log carries the model and instance names.
	log *zap.Logger
	// eng runs the iterations.
	eng engine.Engine
	// mgr schedules the requests onto eng, one iteration at a time.
	mgr *batchmanager.Manager

	// mu guards queue, inflight and metrics.
	mu sync.Mutex
	// metrics are the instance's series on /metrics; nil without metrics.
	metrics *instanceMetrics
	// queue holds requests Execute accepted that the manager has not taken yet.
	queue []*batchmanager.InferenceRequest
	// engineGone is set, once idle, before the engine is freed at the model's unload
	// (unloadwatch.go): no request is queued after it.
	engineGone bool
	// inflight holds every request between Execute and its final response.
	inflight map[uint64]*inflight

	// senders each send the responses of the requests whose ID falls to them (ID mod
	// len), in order: the frontend encodes each response inside Triton's ResponseSend,
	// so one goroutine cannot keep up with a large batch of streams.
	senders []*sender
	// sendersDone is done when every sender goroutine has exited.
	sendersDone sync.WaitGroup
	// heldFinals holds final responses back a moment
	// (cancelfinal.go).
	heldFinals heldFinals

	// pollFactories and pollCancelled are PollStopSignal's scratch (manager goroutine).
	pollFactories []triton.ResponseFactory
	pollCancelled []bool
	// pollIDs match pollFactories index by index.
	pollIDs []uint64

	// trace records iterations and sender batches (GOLLM_ITER_TRACE); nil when off.
	trace *iterTrace
	// away sees the server stopping or the model unloading (shutdown.go).
	away *departure
	// gpu is the instance's GPU and the memory its engine holds; UUID "" off the GPU.
	gpu engines.GPUUse
	// broken is set (wrapping batchmanager.ErrEngineBroken) once the engine failed a step
	// and could not recover: the instance is not ready, and refuses every request.
	broken atomic.Pointer[error]
	// tokenizing counts the goroutines tokenizing long prompts (prompt.go).
	tokenizing sync.WaitGroup
	// engineMu guards engineStopped, set once stopEngine ran.
	engineMu      sync.Mutex
	engineStopped bool
	// watch is the unload watcher (unloadwatch.go).
	watch unloadWatch
}

// newInstance builds the engine and batch manager of an instance.
func newInstance(ms *modelState, ti triton.ModelInstance) (_ *instance, err error) {
	name, err := ti.Name()
	if err != nil {
		return nil, err
	}
	kind, err := ti.Kind()
	if err != nil {
		return nil, err
	}
	log := ms.log.With(zap.String("instance", name))
	away, err := newDeparture(ti, ms, log)
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", name, err)
	}
	var ek engines.Kind
	device := 0
	switch kind {
	case triton.KindCPU:
		ek = engines.CPU
	case triton.KindGPU:
		ek = engines.GPU
		if device, err = ti.DeviceID(); err != nil {
			return nil, err
		}
	default:
		return nil, triton.Errorf(triton.CodeUnsupported, "instance %s: kind %v is not supported; use KIND_CPU or KIND_GPU", name, kind)
	}
	eng, err := ms.weights.NewEngine(ek, device, ms.engineSettings(log))
	if err != nil {
		if ek == engines.GPU {
			return nil, fmt.Errorf("instance %s (KIND_GPU, device %d): %w", name, device, err)
		}
		return nil, fmt.Errorf("instance %s: %w", name, err)
	}
	in := &instance{
		ms:       ms,
		ti:       ti,
		name:     name,
		log:      log,
		eng:      eng,
		inflight: map[uint64]*inflight{},
		senders:  make([]*sender, max(1, ms.cfg.ResponseSenders)),
		trace:    newIterTrace(name),
		away:     away,
	}
	if u, ok := engines.GPUOf(eng); ok {
		in.gpu = u
		log.Info("instance on GPU", zap.Int("gpu", u.Ordinal), zap.String("name", u.Name), zap.String("uuid", u.UUID),
			zap.Int64("weight_bytes", u.Weights), zap.Int64("kv_bytes", u.KV), zap.Int64("scratch_bytes", u.Scratch))
		currentGPUGauges().attach(ms.cfg.Name, name, u)
	}
	if fams := currentFamilies(); fams != nil {
		// Metrics are not worth failing the instance for.
		in.metrics, err = newInstanceMetrics(fams, ms.cfg.Name, ms.version, name, initialValues(eng.Info().NumBlocks), log)
		if err != nil {
			log.Warn("the instance has no metrics", zap.Error(err))
			in.metrics, err = nil, nil
		}
	}
	for i := range in.senders {
		sd := &sender{}
		sd.cond = sync.NewCond(&sd.mu)
		in.senders[i] = sd
		in.sendersDone.Add(1)
		go in.send(sd)
	}
	defer func() {
		if err != nil {
			currentGPUGauges().detach(name, in.gpu.UUID)
			in.stopSender()
			if merr := in.metrics.close(); merr != nil {
				log.Warn("delete the instance's metrics", zap.Error(merr))
			}
			_ = eng.Close()
		}
	}()
	spec, err := ms.proposer(eng, ek, device, log)
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", name, err)
	}
	cfg := batchmanager.Config{
		Speculation:          spec,
		ModelType:            ms.cfg.ModelType,
		Policy:               ms.cfg.Policy,
		MaxBatchSize:         ms.cfg.MaxBatchSize,
		MaxNumTokens:         ms.cfg.MaxNumTokens,
		EnableChunkedContext: ms.cfg.EnableChunkedContext,
		EnableKVCacheReuse:   ms.cfg.EnableKVCacheReuse,
		MaxBeamWidth:         ms.cfg.MaxBeamWidth,
		AdmissionWindow:      ms.cfg.AdmissionWindow,
		StreamInterval:       ms.cfg.StreamInterval,
		Overlap:              overlapOn(ms.cfg.OverlapScheduler, eng),
	}
	in.mgr, err = batchmanager.New(eng, cfg, batchmanager.Callbacks{
		GetInferenceRequests: in.getRequests,
		SendResponse:         in.sendResponse,
		PollStopSignal:       in.pollStop,
		PollEndSignal:        in.pollEnd,
		// No ReturnBatchManagerStats: iterationStats encodes the JSON only when the
		// verbose log would show it, not every iteration.
		IterationStats: in.iterationStats,
		EngineFailed:   in.engineFailed,
	}, log.Named("batchmanager"))
	if err != nil {
		if spec.Proposer != nil {
			_ = spec.Proposer.Close()
		}
		return nil, fmt.Errorf("instance %s: %w", name, err)
	}
	info := eng.Info()
	log.Info("instance ready", zap.String("kind", kind.String()), zap.Bool("overlap_scheduler", cfg.Overlap), zap.Int("kv_blocks", info.NumBlocks),
		zap.Int("tokens_per_block", info.TokensPerBlock))
	return in, nil
}

// close shuts the batch manager down (every request still in flight or queued gets a
// final error), waits for the last responses to go out, and frees the engine.
func (in *instance) close() error {
	in.stopWatch()
	err := in.stopEngine()
	in.stopSender()
	// Nothing should be left; if something is, it still gets its final response.
	in.mu.Lock()
	left := in.inflight
	in.inflight = map[uint64]*inflight{}
	in.queue = nil
	in.mu.Unlock()
	for _, f := range left {
		requestEnded()
		in.log.Warn("request still in flight at shutdown", zap.Uint64("id", f.id), zap.String("request_id", f.tritonID))
		in.finish(f, &batchmanager.Result{}, triton.Errorf(triton.CodeUnavailable, "model %q is unloading", in.ms.cfg.Name))
	}
	if terr := in.trace.write(); terr != nil {
		in.log.Warn("write the iteration trace", zap.Error(terr))
	}
	return err
}

// stopEngine shuts the batch manager down (every request still in flight or queued gets
// a final error), sends the final flags held back, deletes the instance's metrics and
// frees the engine — once: at finalize, or before it when the model's unload has begun
// and the instance is idle (unloadwatch.go). The senders go on until close.
func (in *instance) stopEngine() error {
	in.engineMu.Lock()
	defer in.engineMu.Unlock()
	if in.engineStopped {
		return nil
	}
	in.engineStopped = true
	// Long prompts still being tokenized join the queue (and its final errors) first.
	in.tokenizing.Wait()
	in.mgr.Shutdown()
	in.heldFinals.flush(in.enqueue)
	in.mu.Lock()
	merr := in.metrics.close()
	in.metrics = nil
	in.mu.Unlock()
	if merr != nil {
		in.log.Warn("delete the instance's metrics", zap.Error(merr))
	}
	currentGPUGauges().detach(in.name, in.gpu.UUID)
	return in.eng.Close()
}

// execute takes a batch of requests from Triton: each is copied, validated and released
// at once; a good one is queued for the batch manager, a bad one gets its error as its
// only (final) response.
func (in *instance) execute(reqs []triton.Request) {
	// Once a request is touched it is the backend's: a panic must not reach the entry
	// point, whose error would hand the requests back to Triton. accept contains its
	// own; this one covers the rest.
	defer logExecutePanic(in.log)
	var began time.Time
	if in.trace != nil {
		began = time.Now()
	}
	start := triton.Now()
	queued := 0
	for _, r := range reqs {
		if in.accept(r, start) {
			queued++
		}
	}
	if queued == 0 {
		return
	}
	in.mgr.Wake()
	in.trace.add('A', began, time.Now(), queued, 0, 0)
	// The batch's work is handing the requests over; the generation is the manager's.
	reportBatch(in.ti, in.log, queued, start)
}

// logExecutePanic logs a panic in an execute and ends it there; it must be deferred
// directly, for recover to see the panic.
func logExecutePanic(log *zap.Logger) {
	if p := recover(); p != nil {
		log.Error("panic in execute", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
	}
}

// reportBatch reports a batch of n requests executed from start until now.
func reportBatch(ti triton.ModelInstance, log *zap.Logger, n int, start uint64) {
	end := triton.Now()
	ts := triton.Timestamps{ExecStart: start, ComputeStart: start, ComputeEnd: end, ExecEnd: end}
	if err := ti.ReportBatchStatistics(n, ts); err != nil {
		log.Debug("report batch statistics", zap.Error(err))
	}
}

// accept handles one request; it reports whether it was queued. Whatever happens, the
// request is released exactly once and, unless queued, has had its final response.
func (in *instance) accept(r triton.Request, start uint64) (queued bool) {
	ts := triton.Timestamps{ExecStart: start}
	tritonID := r.ID()
	var factory triton.ResponseFactory
	haveFactory := false
	// handedOver is set once the request's release (and, unless queued, its answer) is
	// up to a single function: a panic after it must not release the request twice.
	handedOver := false
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		in.log.Error("panic while accepting a request", zap.String("request_id", tritonID),
			zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
		if !handedOver {
			in.reject(r, factory, haveFactory, tritonID, ts, triton.Errorf(triton.CodeInternal, "gollm: internal error: %v", p))
		}
	}()

	var err error
	factory, err = triton.NewResponseFactory(r)
	if err != nil {
		in.log.Error("cannot make a response factory", zap.String("request_id", tritonID), zap.Error(err))
		handedOver = true
		in.reject(r, factory, false, tritonID, ts, err)
		return false
	}
	haveFactory = true
	if l := in.away.left(); l != nil {
		handedOver = true
		in.reject(r, factory, true, tritonID, ts, l.err)
		return false
	}
	if b := in.broken.Load(); b != nil {
		handedOver = true
		in.reject(r, factory, true, tritonID, ts, in.notReady(*b))
		return false
	}
	p, err := in.read(r)
	ts.ComputeStart = triton.Now()
	if err != nil {
		handedOver = true
		in.reject(r, factory, true, tritonID, ts, err)
		return false
	}
	if p.Stop {
		handedOver = true
		in.stopRequest(r, factory, tritonID, ts)
		return false
	}
	// A short text prompt is tokenized here; a long one off Execute, once the request
	// is released (prompt.go).
	later := len(p.PromptText) > inlinePromptBytes
	if p.PromptText != "" && !later {
		if err := p.tokenizePrompt(in.ms.lim); err != nil {
			handedOver = true
			in.log.Debug("request refused", zap.String("request_id", tritonID), zap.Error(err))
			in.reject(r, factory, true, tritonID, ts, triton.WithCode(triton.CodeInvalidArg, err))
			return false
		}
	}

	f := &inflight{
		id:        nextID.Add(1),
		tritonID:  tritonID,
		factory:   factory,
		streaming: p.Req.Streaming,
		spec: outputSpec{
			vocab: in.ms.lim.VocabSize,
			asked: askedOutputs{logProbs: p.Req.ReturnLogProbs, contextLogits: p.Req.ReturnContextLogits,
				generationLogits: p.GenerationLogits, perf: p.Perf,
				tokenLogprobs: p.TopLogprobs >= 0, topLogprobs: max(p.TopLogprobs, 0),
				sequences:    p.Req.BeamWidth <= 1 && p.Req.NumReturnSequences > 1,
				finishReason: p.FinishReason},
			want:           p.Outputs,
			streaming:      p.Req.Streaming,
			padID:          p.Req.PadID,
			promptInOutput: !p.Req.ExcludeInputInOutput,
			counts:         p.Counts,
		},
	}
	if p.Text {
		f.spec.text = &textState{d: tokenText{in.ms.tok}, stops: p.StopStrings}
	}
	if len(p.StopStrings) > 0 {
		p.Req.TextStop = &textStopper{d: tokenText{in.ms.tok}, stops: p.StopStrings}
	}
	p.Req.Arrival = time.Now()
	p.Req.ID = f.id
	ts.ComputeEnd = triton.Now()
	ts.ExecEnd = ts.ComputeEnd
	// Statistics need the request, so they go before the release; from the queueing on,
	// the batch manager answers the request.
	if err := in.ti.ReportStatistics(r, true, ts); err != nil {
		in.log.Debug("report statistics", zap.Error(err))
	}
	handedOver = true
	if err := r.Release(); err != nil {
		in.log.Error("release request", zap.String("request_id", tritonID), zap.Error(err))
	}
	in.mu.Lock()
	if in.engineGone {
		// The engine was freed at the model's unload (unloadwatch.go) after the check
		// above.
		in.mu.Unlock()
		err := triton.Errorf(triton.CodeUnavailable, "model %q is unloading", in.ms.cfg.Name)
		if l := in.away.left(); l != nil {
			err = l.err
		}
		in.sendFinal(factory, err, tritonID)
		if derr := factory.Delete(); derr != nil {
			in.log.Error("delete response factory", zap.String("request_id", tritonID), zap.Error(derr))
		}
		return false
	}
	in.ms.track(f)
	requestStarted()
	in.inflight[f.id] = f
	if !later {
		in.queue = append(in.queue, &p.Req)
	}
	in.mu.Unlock()
	if later {
		in.log.Debug("request accepted; its long prompt is tokenized off Execute", zap.Uint64("id", f.id), zap.String("request_id", tritonID),
			zap.Int("prompt_bytes", len(p.PromptText)), zap.Int("max_new_tokens", p.Req.MaxNewTokens))
		in.tokenizeLater(f, p)
		return true
	}
	in.log.Debug("request queued", zap.Uint64("id", f.id), zap.String("request_id", tritonID),
		zap.Int("prompt", len(p.Req.InputIDs)), zap.Int("max_new_tokens", p.Req.MaxNewTokens),
		zap.Bool("streaming", f.streaming), zap.Bool("text", f.spec.text != nil))
	return true
}

// read copies a request's inputs and validates them; a text prompt is left for the
// caller to tokenize (readRequest).
func (in *instance) read(r triton.Request) (*parsedRequest, error) {
	tensors, requested, err := requestIO(r)
	if err != nil {
		return nil, err
	}
	p, err := readRequest(tensors, requested, in.ms.lim)
	if err != nil {
		in.log.Debug("request refused", zap.String("request_id", r.ID()), zap.String("inputs", describe(tensors)), zap.Error(err))
		return nil, triton.WithCode(triton.CodeInvalidArg, err)
	}
	return p, nil
}

// requestIO is a request's input tensors and the names of the outputs it asks for.
func requestIO(r triton.Request) ([]triton.Tensor, []string, error) {
	tensors, err := r.Inputs()
	if err != nil {
		return nil, nil, err
	}
	requested, err := r.RequestedOutputs()
	if err != nil {
		return nil, nil, err
	}
	return tensors, requested, nil
}

// reject answers a request that will not run with err, as its only and final response,
// and releases it.
func (in *instance) reject(r triton.Request, factory triton.ResponseFactory, haveFactory bool, tritonID string, ts triton.Timestamps, err error) {
	if haveFactory {
		in.sendFinal(factory, err, tritonID)
		if derr := factory.Delete(); derr != nil {
			in.log.Error("delete response factory", zap.String("request_id", tritonID), zap.Error(derr))
		}
	} else if serr := triton.SendRequestError(r, err); serr != nil {
		in.log.Error("cannot answer a request", zap.String("request_id", tritonID), zap.NamedError("answer", serr), zap.Error(err))
	}
	now := triton.Now()
	ts.ComputeStart, ts.ComputeEnd, ts.ExecEnd = max(ts.ComputeStart, ts.ExecStart), now, now
	if serr := in.ti.ReportStatistics(r, false, ts); serr != nil {
		in.log.Debug("report statistics", zap.Error(serr))
	}
	if rerr := r.Release(); rerr != nil {
		in.log.Error("release request", zap.String("request_id", tritonID), zap.Error(rerr))
	}
}

// stopRequest handles a request whose stop input is set: the requests in flight with
// its request id stop at the next iteration; it is answered with an empty final
// response.
func (in *instance) stopRequest(r triton.Request, factory triton.ResponseFactory, tritonID string, ts triton.Timestamps) {
	if tritonID == "" {
		in.reject(r, factory, true, tritonID, ts, triton.Errorf(triton.CodeInvalidArg,
			"input %q: a stop request needs the request id of the request to stop", inStop))
		return
	}
	n := in.ms.stop(tritonID)
	in.log.Debug("stop request", zap.String("request_id", tritonID), zap.Int("stopping", n))
	in.sendFinal(factory, nil, tritonID)
	if err := factory.Delete(); err != nil {
		in.log.Error("delete response factory", zap.String("request_id", tritonID), zap.Error(err))
	}
	ts.ComputeEnd = triton.Now()
	ts.ExecEnd = ts.ComputeEnd
	if err := in.ti.ReportStatistics(r, true, ts); err != nil {
		in.log.Debug("report statistics", zap.Error(err))
	}
	if err := r.Release(); err != nil {
		in.log.Error("release request", zap.String("request_id", tritonID), zap.Error(err))
	}
}

// sendFinal sends a response without outputs, with err (nil: success), flagged final.
func (in *instance) sendFinal(factory triton.ResponseFactory, err error, tritonID string) {
	resp, nerr := triton.NewResponse(factory)
	if nerr != nil {
		in.log.Error("new response", zap.String("request_id", tritonID), zap.Error(nerr))
		// The flag alone still ends the request for the client.
		if ferr := factory.SendFlags(triton.ResponseFinal); ferr != nil {
			in.log.Error("send final flag", zap.String("request_id", tritonID), zap.Error(ferr))
		}
		return
	}
	if serr := resp.Send(triton.ResponseFinal, err); serr != nil {
		in.log.Error("send final response", zap.String("request_id", tritonID), zap.Error(serr))
	}
}

// getRequests is the batch manager's GetInferenceRequests: it hands over up to max
// queued requests (max < 0: all).
func (in *instance) getRequests(max int) []*batchmanager.InferenceRequest {
	in.mu.Lock()
	defer in.mu.Unlock()
	n := len(in.queue)
	if max >= 0 && max < n {
		n = max
	}
	if n == 0 {
		return nil
	}
	out := make([]*batchmanager.InferenceRequest, n)
	copy(out, in.queue)
	rest := copy(in.queue, in.queue[n:])
	clear(in.queue[rest:])
	in.queue = in.queue[:rest]
	return out
}

// tokenText adapts the checkpoint's tokenizer to what text answers need.
type tokenText struct {
	// t holds the checkpoint's tokenizer.json.
	t *tokenizer.Tokenizer
}

// Decode is the tokens' text without special tokens (BOS, chat markers), as the
// TensorRT-LLM backend's postprocessing and transformers' pipelines show it.
func (t tokenText) Decode(ids []int32) string { return t.t.DecodeText(ids) }

// NewStream starts a token-by-token decoder, without special tokens.
func (t tokenText) NewStream() tokenStream { return t.t.NewTextStreamDecoder() }

// overlapOn is overlap_scheduler for an instance's engine: as set, else on when the
// engine overlaps on its own (engine.Pipeliner, the GPU engine). Elsewhere the schedule
// would run through engine.SyncPipeline: nothing overlapped, and a row computed for
// nothing after each request that ends.
func overlapOn(set *bool, eng engine.Engine) bool {
	if set != nil {
		return *set
	}
	_, ok := eng.(engine.Pipeliner)
	return ok
}

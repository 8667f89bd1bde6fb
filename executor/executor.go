// Package executor is gollm's embedding API, modelled on TensorRT-LLM's Executor: enqueue
// requests, await their responses (of one request or of any), cancel, read the latest
// iteration stats. It runs a batchmanager.Manager over an engine and implements the
// manager's callbacks itself, so no callback code is needed.
//
//	ex, _ := executor.New(eng, executor.Config{}, log)
//	defer ex.Shutdown()
//	id, _ := ex.Enqueue(executor.Request{InputIDs: prompt, MaxNewTokens: 16})
//	for done := false; !done; {
//		rs, _ := ex.AwaitResponses(&id, time.Second)
//		for _, r := range rs { ...; done = r.Result.IsFinal }
//	}
package executor

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"gollm/batchmanager"
	"gollm/engine"
)

// Sentinel errors of the Executor; responses carry the batchmanager's errors
// (batchmanager.ErrCancelled, ErrShuttingDown, ErrInvalidRequest, …).
var (
	// ErrShutdown is returned by calls on an executor that was shut down.
	ErrShutdown = errors.New("executor: shut down")
	// ErrUnknownRequest names a request ID that is not in flight (or whose responses
	// have all been taken).
	ErrUnknownRequest = errors.New("executor: unknown request ID")
	// ErrQueueFull is returned by Enqueue when MaxQueued requests already wait.
	ErrQueueFull = errors.New("executor: queue full")
)

// Config holds an executor's settings.
type Config struct {
	// Batch configures the batch manager (model type, scheduler policy, limits).
	Batch batchmanager.Config
	// MaxQueued caps the requests waiting for admission; 0 means no limit.
	MaxQueued int
	// LogitsPostProcessors are the named logits post-processors requests may pick
	// (Request.LogitsPostProcessorName), as TensorRT-LLM's LogitsPostProcessorConfig.
	LogitsPostProcessors map[string]LogitsPostProcessor
	// LogitsPostProcessorBatched serves, in one call per iteration, the requests that
	// name BatchedPostProcessorName.
	LogitsPostProcessorBatched LogitsPostProcessorBatched
}

// BatchedPostProcessorName is the name a request gives to use
// Config.LogitsPostProcessorBatched.
const BatchedPostProcessorName = "batched"

// LogitsPostProcessor changes one sequence's logits before its token is chosen (the
// seed's logits post-processor): the request ID, the logits row [vocab] to change in
// place (after the embedding bias, before the penalties), the sequence's tokens so far
// (prompt and generated; read-only), and the request's ClientID (nil when unset). It is
// called on the executor's worker goroutine and must not block for long. A request
// with a post-processor has its logits copied back from the engine and its tokens
// chosen by the engine's rules on the host (beam search scores them there anyway).
type LogitsPostProcessor func(reqID uint64, logits []float32, tokens []int32, clientID *uint64)

// LogitsPostProcessorBatched is the batched variant: every sequence of an iteration
// whose request named BatchedPostProcessorName, in one call, index by index.
type LogitsPostProcessorBatched func(reqIDs []uint64, logits [][]float32, tokens [][]int32, clientIDs []*uint64)

// Request is one generation request.
type Request struct {
	// InputIDs holds the prompt's token ids.
	InputIDs []int32
	// MaxNewTokens bounds the generated tokens.
	MaxNewTokens int
	// Streaming returns each token as it is generated; otherwise one final result.
	Streaming bool
	// Sampling holds the sampling configuration; the zero value is greedy.
	Sampling engine.SamplingParams
	// EndID ends generation when sampled (not included in the output); nil means the
	// model's own end tokens, -1 means none.
	EndID *int32
	// PadID pads V1 outputs; nil means the (first) end token.
	PadID *int32
	// StopWords end generation once generated (kept in the output).
	StopWords [][]int32
	// Output selects what results carry.
	Output OutputConfig
	// BeamWidth > 1 runs beam search (Result.Beams).
	BeamWidth int
	// NumReturnSequences: sampling, this many sequences (Result.SequenceIndex); beam
	// search, the best this many beams (0: all).
	NumReturnSequences int
	// LengthPenalty, EarlyStopping and DiversityRate steer beam search
	// (batchmanager.InferenceRequest's fields of those names).
	LengthPenalty float32
	// EarlyStopping: 1 stops once BeamWidth beams finished; 0 transformers' heuristic;
	// other values never early (0 in a Request means the default, 1).
	EarlyStopping *int
	// DiversityRate is beam_search_diversity_rate.
	DiversityRate float32
	// LogitsPostProcessorName picks one of Config.LogitsPostProcessors, or
	// BatchedPostProcessorName; "" for none.
	LogitsPostProcessorName string
	// ClientID is handed to the post-processor.
	ClientID *uint64
}

// OutputConfig selects the optional parts of a result.
type OutputConfig struct {
	// ReturnLogProbs fills CumLogProb and LogProbs.
	ReturnLogProbs bool
	// ReturnContextLogits fills ContextLogits.
	ReturnContextLogits bool
	// ReturnGenerationLogits fills GenerationLogits.
	ReturnGenerationLogits bool
	// ExcludeInputFromOutput leaves the prompt out of a non-streaming result.
	ExcludeInputFromOutput bool
}

// Response is one answer for a request: an error (always final) or a Result.
type Response struct {
	// RequestID matches the ID Enqueue returned.
	RequestID uint64
	// Err is non-nil when the request failed or was cancelled; it is the last response.
	Err error
	// Result holds the output when Err is nil.
	Result Result
}

// IsFinal says whether this is the request's last response.
func (r Response) IsFinal() bool { return r.Err != nil || r.Result.IsFinal }

// Result is the output part of a response.
type Result struct {
	// IsFinal marks the request's last result.
	IsFinal bool
	// OutputTokenIDs are the new tokens (streaming) or the whole output (prompt first
	// unless excluded).
	OutputTokenIDs []int32
	// CumLogProb is the sum of the generated tokens' log-probabilities so far.
	CumLogProb float32
	// LogProbs are this result's generated tokens' log-probabilities.
	LogProbs []float32
	// ContextLogits are the prompt's logits, [len(prompt)][vocab] row-major.
	ContextLogits []float32
	// GenerationLogits are this result's generated positions' logits, [n][vocab].
	GenerationLogits []float32
	// FinishReason says why the request ended (in its final result).
	FinishReason batchmanager.FinishReason
	// Beams are a beam search's beams, best first once finished (OutputTokenIDs and
	// CumLogProb are the first's).
	Beams []batchmanager.BeamResult
	// SequenceIndex is the sequence of this result (NumReturnSequences).
	SequenceIndex int
	// IsSequenceFinal marks the last result of SequenceIndex.
	IsSequenceFinal bool
}

// Executor runs requests on an engine with in-flight batching.
type Executor struct {
	// m schedules the requests onto the engine.
	m *batchmanager.Manager
	// info gives requests their default end tokens.
	info engine.Info
	// cfg holds the logits post-processors and the queue bound.
	cfg Config

	// mu guards everything below.
	mu sync.Mutex
	// nextID is the next request ID to hand out.
	nextID uint64
	// queue are enqueued requests not yet taken by the manager.
	queue []*batchmanager.InferenceRequest
	// live are the IDs whose final response has not been produced yet.
	live map[uint64]struct{}
	// stops are the IDs to report to the manager until they end.
	stops map[uint64]struct{}
	// ready are the responses not yet awaited, in arrival order.
	ready []Response
	// notify is closed (and replaced) whenever ready grows or the executor closes.
	notify chan struct{}
	// closed is set by Shutdown.
	closed bool
	// clients are the ClientIDs of requests in flight that have one.
	clients map[uint64]*uint64
}

// New starts an executor over eng. The engine stays the caller's to Close after
// Shutdown.
func New(eng engine.Engine, cfg Config, log *zap.Logger) (*Executor, error) {
	if eng == nil {
		return nil, errors.New("executor: engine is nil")
	}
	if cfg.MaxQueued < 0 {
		return nil, fmt.Errorf("executor: MaxQueued must be 0 (no limit) or positive, got %d", cfg.MaxQueued)
	}
	e := &Executor{info: eng.Info(), cfg: cfg, nextID: 1, live: map[uint64]struct{}{}, stops: map[uint64]struct{}{}, notify: make(chan struct{}),
		clients: map[uint64]*uint64{}}
	batch := cfg.Batch
	if pp := cfg.LogitsPostProcessorBatched; pp != nil {
		batch.BatchedLogitsPostProcessor = func(ids []uint64, logits [][]float32, tokens [][]int32) {
			clients := make([]*uint64, len(ids))
			e.mu.Lock()
			for i, id := range ids {
				clients[i] = e.clients[id]
			}
			e.mu.Unlock()
			pp(ids, logits, tokens, clients)
		}
	}
	m, err := batchmanager.New(eng, batch, batchmanager.Callbacks{
		GetInferenceRequests: e.get,
		SendResponse:         e.send,
		PollStopSignal:       e.pollStop,
	}, log)
	if err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	e.m = m
	return e, nil
}

// Enqueue queues a request and returns its ID. Requests the batch manager rejects
// (bad values) get an error response rather than an error here.
func (e *Executor) Enqueue(req Request) (uint64, error) {
	if err := batchmanager.CheckLengths(len(req.InputIDs), req.MaxNewTokens, e.info.MaxSeqLen, "Request.InputIDs", "Request.MaxNewTokens"); err != nil {
		return 0, fmt.Errorf("executor: %w", err)
	}
	endIDs := e.info.EndIDs
	if req.EndID != nil {
		endIDs = nil
		if *req.EndID >= 0 {
			endIDs = []int32{*req.EndID}
		}
	}
	padID := int32(-1)
	if len(endIDs) > 0 {
		padID = endIDs[0]
	}
	if req.PadID != nil {
		padID = *req.PadID
	}
	var pp batchmanager.LogitsPostProcessor
	batched := false
	switch name := req.LogitsPostProcessorName; {
	case name == "":
	case name == BatchedPostProcessorName:
		if e.cfg.LogitsPostProcessorBatched == nil {
			return 0, errors.New("executor: Request.LogitsPostProcessorName is the batched one, and Config has no LogitsPostProcessorBatched")
		}
		batched = true
	default:
		f := e.cfg.LogitsPostProcessors[name]
		if f == nil {
			return 0, fmt.Errorf("executor: Request.LogitsPostProcessorName %q is not in Config.LogitsPostProcessors", name)
		}
		client := req.ClientID
		pp = func(id uint64, logits []float32, tokens []int32) { f(id, logits, tokens, client) }
	}
	early := 1
	if req.EarlyStopping != nil {
		early = *req.EarlyStopping
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return 0, ErrShutdown
	}
	if e.cfg.MaxQueued > 0 && len(e.queue) >= e.cfg.MaxQueued {
		e.mu.Unlock()
		return 0, fmt.Errorf("%w: %d requests wait", ErrQueueFull, len(e.queue))
	}
	id := e.nextID
	e.nextID++
	e.queue = append(e.queue, &batchmanager.InferenceRequest{
		ID:                     id,
		InputIDs:               slices.Clone(req.InputIDs),
		MaxNewTokens:           req.MaxNewTokens,
		Sampling:               req.Sampling,
		EndIDs:                 endIDs,
		PadID:                  padID,
		StopWords:              req.StopWords,
		Streaming:              req.Streaming,
		ExcludeInputInOutput:   req.Output.ExcludeInputFromOutput,
		ReturnLogProbs:         req.Output.ReturnLogProbs,
		ReturnContextLogits:    req.Output.ReturnContextLogits,
		ReturnGenerationLogits: req.Output.ReturnGenerationLogits,
		BeamWidth:              req.BeamWidth,
		NumReturnSequences:     req.NumReturnSequences,
		LengthPenalty:          req.LengthPenalty,
		EarlyStopping:          early,
		DiversityRate:          req.DiversityRate,
		TopPResetID:            -1,
		LogitsPostProcessor:    pp,
		BatchedPostProcessing:  batched,
	})
	e.live[id] = struct{}{}
	if req.ClientID != nil {
		e.clients[id] = req.ClientID
	}
	e.mu.Unlock()
	e.m.Wake()
	return id, nil
}

// AwaitResponses waits up to timeout (≤ 0: no limit) for responses of request *id, or
// of any request when id is nil, and returns all that are ready, in order. On timeout
// it returns none and no error. Awaiting an ID that has no responses to come returns
// ErrUnknownRequest.
func (e *Executor) AwaitResponses(id *uint64, timeout time.Duration) ([]Response, error) {
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	e.mu.Lock()
	for {
		if got := e.take(id); len(got) > 0 {
			e.mu.Unlock()
			return got, nil
		}
		if id != nil {
			if _, ok := e.live[*id]; !ok {
				e.mu.Unlock()
				return nil, fmt.Errorf("%w: %d", ErrUnknownRequest, *id)
			}
		}
		if e.closed {
			e.mu.Unlock()
			return nil, ErrShutdown
		}
		ch := e.notify
		e.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			return nil, nil
		}
		e.mu.Lock()
	}
}

// take removes and returns the ready responses of id (all when id is nil). Called with
// mu held.
func (e *Executor) take(id *uint64) []Response {
	if id == nil {
		got := e.ready
		e.ready = nil
		return got
	}
	var got []Response
	rest := e.ready[:0]
	for _, r := range e.ready {
		if r.RequestID == *id {
			got = append(got, r)
		} else {
			rest = append(rest, r)
		}
	}
	clear(e.ready[len(rest):])
	e.ready = rest
	return got
}

// Cancel stops a request: it gets a final response carrying batchmanager.ErrCancelled
// (at the end of the current iteration when it is running).
func (e *Executor) Cancel(id uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.live[id]; !ok {
		return fmt.Errorf("%w: %d", ErrUnknownRequest, id)
	}
	// Still queued here: answer at once.
	for i, r := range e.queue {
		if r.ID == id {
			e.queue = slices.Delete(e.queue, i, i+1)
			e.deliver(Response{RequestID: id, Err: fmt.Errorf("request %d: %w", id, batchmanager.ErrCancelled)})
			return nil
		}
	}
	e.stops[id] = struct{}{}
	return nil
}

// Stats returns the latest iteration's statistics.
func (e *Executor) Stats() batchmanager.Stats { return e.m.Stats() }

// Shutdown stops the executor: every request not finished gets a final response with
// batchmanager.ErrShuttingDown (still awaitable); later Enqueue calls fail.
func (e *Executor) Shutdown() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.m.Shutdown()
	e.mu.Lock()
	close(e.notify)
	e.notify = make(chan struct{})
	e.mu.Unlock()
}

// deliver adds a response and wakes the waiters. Called with mu held.
func (e *Executor) deliver(r Response) {
	e.ready = append(e.ready, r)
	if r.IsFinal() {
		delete(e.live, r.RequestID)
		delete(e.stops, r.RequestID)
		delete(e.clients, r.RequestID)
	}
	close(e.notify)
	e.notify = make(chan struct{})
}

// get is the manager's GetInferenceRequests.
func (e *Executor) get(max int) []*batchmanager.InferenceRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.queue)
	if max >= 0 && max < n {
		n = max
	}
	if n == 0 {
		return nil
	}
	out := slices.Clone(e.queue[:n])
	e.queue = slices.Delete(e.queue, 0, n)
	return out
}

// pollStop is the manager's PollStopSignal: cancelled IDs stay raised until they end.
func (e *Executor) pollStop() map[uint64]struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.stops) == 0 {
		return nil
	}
	out := make(map[uint64]struct{}, len(e.stops))
	for id := range e.stops {
		out[id] = struct{}{}
	}
	return out
}

// send is the manager's SendResponse: it turns the manager's result into a Result.
func (e *Executor) send(id uint64, res batchmanager.Result, final bool, err error) {
	r := Response{RequestID: id, Err: err}
	if err == nil {
		r.Result = Result{
			IsFinal: final,
			// V1 pads the tokens; Length says how many are real.
			OutputTokenIDs:   res.Tokens[:res.Length],
			CumLogProb:       res.CumLogProb,
			LogProbs:         res.LogProbs,
			ContextLogits:    res.ContextLogits,
			GenerationLogits: res.GenerationLogits,
			FinishReason:     res.Finish,
			Beams:            res.Beams,
			SequenceIndex:    res.SequenceIndex,
			IsSequenceFinal:  res.SequenceFinal || final,
		}
	}
	e.mu.Lock()
	e.deliver(r)
	e.mu.Unlock()
}

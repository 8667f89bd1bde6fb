// Package batchmanager schedules requests onto an engine with in-flight batching, in
// the manner of TensorRT-LLM's GptManager: a worker goroutine per model instance drives
// the iteration loop through four callbacks (get requests, send responses, poll stop
// signals, report stats).
package batchmanager

import "gollm/engine"

// InferenceRequest is one generation request as the manager sees it.
type InferenceRequest struct {
	// ID identifies the request; it must not be in flight already.
	ID uint64
	// InputIDs is the prompt.
	InputIDs []int32
	// MaxNewTokens is the number of tokens to generate at most (request_output_len).
	MaxNewTokens int
	// Sampling holds the sampling configuration (temperature, top-k/p, penalties, seed,
	// min length, bad words, embedding bias).
	Sampling engine.SamplingParams
	// EndID stops generation when sampled; -1 for none.
	EndID int32
	// PadID fills output_ids past a sequence's end in V1's padded batches; -1 for none.
	PadID int32
	// StopWords are token sequences that end generation once generated (they are kept
	// in the output).
	StopWords [][]int32
	// Streaming sends each token as it is generated; otherwise one response at the end.
	Streaming bool
	// ExcludeInputInOutput leaves the prompt out of output_ids.
	ExcludeInputInOutput bool
	// ReturnLogProbs adds cum_log_probs and output_log_probs.
	ReturnLogProbs bool
	// ReturnContextLogits adds context_logits.
	ReturnContextLogits bool
	// ReturnGenerationLogits adds generation_logits.
	ReturnGenerationLogits bool
}

// Tensor is one output tensor of a response. Tensors are read-only: the manager shares
// immutable parts (the shapes and sequence_length of one-token streaming responses)
// between responses. Data is not reused by the manager, so a receiver may keep it.
type Tensor struct {
	// Name is the output's name (output_ids, sequence_length, cum_log_probs, …).
	Name string
	// Shape is the tensor's shape.
	Shape []int64
	// Data is []int32 or []float32, row-major.
	Data any
}

// Callbacks connect the manager to whatever serves the requests (Triton, the Executor).
// All four are called from the manager's worker goroutine and must not block for long.
type Callbacks struct {
	// GetInferenceRequests returns at most max new requests (max < 0: no limit).
	GetInferenceRequests func(max int) []*InferenceRequest
	// SendResponse delivers a request's outputs; err != nil always comes with final.
	// The manager has freed all of the request's state before a final response.
	SendResponse func(id uint64, outputs []Tensor, final bool, err error)
	// PollStopSignal returns the IDs of requests to stop now.
	PollStopSignal func() map[uint64]struct{}
	// ReturnBatchManagerStats receives the stats JSON of every iteration with work.
	ReturnBatchManagerStats func(stats string)
	// IterationStats, optional, receives the same stats as a struct (for metrics,
	// without parsing the JSON); called right after ReturnBatchManagerStats.
	IterationStats func(stats Stats)
}

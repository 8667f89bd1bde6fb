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
	// EndIDs stop generation when one is sampled (the model's end-of-sequence tokens, or
	// the request's end_id); empty for none.
	EndIDs []int32
	// PadID fills output_ids past a sequence's end in V1's padded batches; -1 for none.
	PadID int32
	// StopWords are token sequences that end generation once generated (they are kept
	// in the output).
	StopWords [][]int32
	// Streaming sends each token as it is generated; otherwise one response at the end.
	Streaming bool
	// ExcludeInputInOutput leaves the prompt out of a non-streaming Result.Tokens.
	ExcludeInputInOutput bool
	// ReturnLogProbs fills Result.CumLogProb and LogProbs.
	ReturnLogProbs bool
	// ReturnContextLogits fills Result.ContextLogits.
	ReturnContextLogits bool
	// ReturnGenerationLogits fills Result.GenerationLogits.
	ReturnGenerationLogits bool
}

// FinishReason says why a request ended.
type FinishReason uint8

const (
	// NotFinished marks a response that is not the request's last.
	NotFinished FinishReason = iota
	// FinishedEndID: an end token was sampled (it is not part of the output).
	FinishedEndID
	// FinishedStopWord: a stop word was generated (it is part of the output).
	FinishedStopWord
	// FinishedLength: MaxNewTokens were generated, or the model's maximum sequence
	// length was reached.
	FinishedLength
)

// String names the reason as TensorRT-LLM's FinishReason does.
func (f FinishReason) String() string {
	switch f {
	case FinishedEndID:
		return "END_ID"
	case FinishedStopWord:
		return "STOP_WORDS"
	case FinishedLength:
		return "LENGTH"
	}
	return "NOT_FINISHED"
}

// Result is the content of one response. Its slices are read-only views of the
// request's own append-only buffers, which the manager never writes again where a view
// reaches (each is capped at its end): a receiver may keep them without copying.
type Result struct {
	// Tokens are, streaming, the tokens generated since the previous response (usually
	// one; none in a final response after the end token); otherwise the whole output —
	// the prompt unless ExcludeInputInOutput, then every generated token — padded in V1
	// batches with PadID to the batch's longest output.
	Tokens []int32
	// Length is the number of real tokens in Tokens (sequence_length): less than
	// len(Tokens) only when V1 padding follows them.
	Length int
	// CumLogProb is the sum of the log-probabilities of every token generated so far
	// (ReturnLogProbs).
	CumLogProb float32
	// LogProbs are the log-probabilities of this response's generated tokens
	// (ReturnLogProbs; nil otherwise).
	LogProbs []float32
	// ContextLogits are the prompt's logits [PromptLen][vocab], in the first streaming
	// response or the final one (ReturnContextLogits; nil otherwise and in later
	// responses).
	ContextLogits []float32
	// GenerationLogits are the logits of this response's generated positions [n][vocab]
	// (ReturnGenerationLogits; nil otherwise).
	GenerationLogits []float32
	// PromptLen is the prompt's length in tokens.
	PromptLen int
	// Generated is the number of tokens generated so far (the end token excluded).
	Generated int
	// Finish says why the request ended, in its final response; NotFinished before.
	Finish FinishReason
}

// Callbacks connect the manager to whatever serves the requests (Triton, the Executor).
// All four are called from the manager's worker goroutine and must not block for long.
type Callbacks struct {
	// GetInferenceRequests returns at most max new requests (max < 0: no limit).
	GetInferenceRequests func(max int) []*InferenceRequest
	// SendResponse delivers a request's result; err != nil always comes with final (and
	// an empty result). The manager has freed all of the request's state before a final
	// response.
	SendResponse func(id uint64, res Result, final bool, err error)
	// PollStopSignal returns the IDs of requests to stop now.
	PollStopSignal func() map[uint64]struct{}
	// ReturnBatchManagerStats receives the stats JSON of every iteration with work.
	ReturnBatchManagerStats func(stats string)
	// IterationStats, optional, receives the same stats as a struct (for metrics,
	// without parsing the JSON); called right after ReturnBatchManagerStats.
	IterationStats func(stats Stats)
	// EngineFailed, optional, is called once, on the manager's goroutine, when a step
	// failed and the engine could not recover (engine.Recoverer): every request in flight
	// has had its final error, and every later one gets ErrEngineBroken at once.
	EngineFailed func(err error)
}

// Package batchmanager schedules requests onto an engine with in-flight batching, in
// the manner of TensorRT-LLM's GptManager: a worker goroutine per model instance drives
// the iteration loop through four callbacks (get requests, send responses, poll stop
// signals, report stats).
package batchmanager

import (
	"time"

	"gollm/engine"
	"gollm/guide"
)

// InferenceRequest is one generation request as the manager sees it.
type InferenceRequest struct {
	// ID identifies the request; it must not be in flight already.
	ID uint64
	// InputIDs holds the prompt's token ids, in the vocabulary.
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
	// ReturnTopLogprobs fills Result.TokenLogprobs, and TopLogprobIDs and TopLogprobs
	// with TopLogprobs alternatives per token: computed from each generated position's
	// logits at its step, so that no logits row is kept past it.
	ReturnTopLogprobs bool
	// TopLogprobs is the alternatives per token of ReturnTopLogprobs (0 or more).
	TopLogprobs int
	// ReturnPerfMetrics fills Result.Perf.
	ReturnPerfMetrics bool
	// Arrival is when the request arrived (Result.Perf.Arrival); zero: when the manager
	// took it.
	Arrival time.Time

	// BeamWidth > 1 runs beam search with that many beams (0 and 1: none).
	BeamWidth int
	// NumReturnSequences is, for sampling, the number of sequences to generate from the
	// prompt (each with its SequenceIndex); for beam search, the number of best beams to
	// return (0: BeamWidth). 0 and 1 mean one.
	NumReturnSequences int
	// LengthPenalty divides a finished beam's cumulative log-probability by
	// length^LengthPenalty to rank it (TensorRT-LLM's len_penalty; 0: none).
	LengthPenalty float32
	// EarlyStopping ends a beam search once BeamWidth beams have finished (1, the
	// default as TensorRT-LLM's); 0 stops when no running beam can beat the finished
	// ones (transformers' heuristic); any other value never stops early.
	EarlyStopping int
	// DiversityRate adds DiversityRate × k to the k-th best continuation of each beam
	// (from 0) when ranking candidates (beam_search_diversity_rate; negative values
	// favour diverse siblings, Li et al. 2016).
	DiversityRate float32
	// TopPDecay, when positive, multiplies the runtime top-p after every generated
	// token, down to TopPMin (runtime_top_p_decay, runtime_top_p_min; Krishna et al.
	// 2022), and TopPResetID (≥ 0) sets it back to the request's top-p when generated.
	TopPDecay float32
	// TopPMin is the lowest runtime top-p under TopPDecay.
	TopPMin float32
	// TopPResetID resets the runtime top-p when generated; -1: none.
	TopPResetID int32

	// Guide, when set, constrains the generated text (guided decoding): each sampled
	// token is one the constraint allows, an end token only where the text may end, and
	// a sequence whose text is complete ends there (FinishedEndID) without a sampled end
	// token. Its vocabulary must be the model's.
	Guide *guide.Guide

	// TextStop, when set, sees each sequence's generated tokens after every token and
	// ends the sequence when it says so (stop strings matched on the text); the sequence
	// then finishes with FinishedStopWord.
	TextStop TextStopper
	// LogitsPostProcessor, when set, may change each sequence's logits before its token
	// is chosen: the logits come back from the engine (after the embedding bias) and the
	// manager samples or scores them with the engine's rules (engine.Sampler).
	LogitsPostProcessor LogitsPostProcessor
	// NoSpeculation keeps the request out of speculative decoding (the
	// speculative_decoding input set false).
	NoSpeculation bool
	// BatchedPostProcessing hands the request's logits to Config's
	// BatchedLogitsPostProcessor, with those of every other such request of the
	// iteration, in one call.
	BatchedPostProcessing bool
}

// BatchedLogitsPostProcessor changes the logits of every sequence of an iteration whose
// request asked for it, in one call (TensorRT-LLM's LogitsPostProcessorBatched): the
// request IDs, the logits rows to change in place, and each sequence's tokens so far,
// index by index. Called from the manager's goroutine.
type BatchedLogitsPostProcessor func(ids []uint64, logits [][]float32, tokens [][]int32)

// TextStopper decides on conditions over a sequence's text, which the manager cannot
// see. It is called from the manager's goroutine only.
type TextStopper interface {
	// Stopped reports whether the sequence index seq must end with the generated tokens
	// it has now (every one so far, the prompt excluded). Beams may change from one call
	// to the next.
	Stopped(seq int, generated []int32) bool
}

// LogitsPostProcessor changes the logits of a request's sequences (TensorRT-LLM's
// logits post-processor). It is called from the manager's goroutine, once per sequence
// and step, with the request ID, the logits row [vocab] to change in place, and the
// tokens of the sequence so far (prompt and generated, read-only).
type LogitsPostProcessor func(id uint64, logits []float32, tokens []int32)

// PerfMetrics are a request's timings and KV counts (TensorRT-LLM's request perf
// metrics).
type PerfMetrics struct {
	// Arrival is when the request arrived.
	Arrival time.Time
	// FirstScheduled is when it was first scheduled.
	FirstScheduled time.Time
	// FirstToken and LastToken are when its first and latest tokens were generated.
	FirstToken, LastToken time.Time
	// ReusedBlocks counts the KV blocks it took from shared prompt prefixes.
	ReusedBlocks int
	// NewBlocks counts the KV blocks allocated for it (copies for beams included).
	NewBlocks int
	// DraftTokens and AcceptedDraftTokens count its proposed tokens (speculative
	// decoding) and those the model accepted.
	DraftTokens, AcceptedDraftTokens int
}

// FinishReason says why a request ended.
type FinishReason uint8

const (
	// NotFinished marks a response that is not the request's last.
	NotFinished FinishReason = iota
	// FinishedEndID: an end token was sampled (it is not part of the output), or a
	// guided sequence's text is complete.
	FinishedEndID
	// FinishedStopWord: a stop word was generated (it is part of the output).
	FinishedStopWord
	// FinishedLength: MaxNewTokens were generated, or the model's maximum sequence
	// length was reached.
	FinishedLength
	// FinishedCancelled: a stop signal ended the request before it finished (it returns
	// what it had generated).
	FinishedCancelled
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
	case FinishedCancelled:
		return "CANCELLED"
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
	// ContextLogits are the prompt's logits [PromptLen][vocab], in every response,
	// streaming or not (ReturnContextLogits; nil otherwise).
	ContextLogits []float32
	// GenerationLogits are the logits of this response's generated positions [n][vocab]
	// (ReturnGenerationLogits; nil otherwise).
	GenerationLogits []float32
	// TokenLogprobs are the log-probabilities of this response's generated tokens under
	// the model's distribution at their positions — the log-softmax, in float64, of the
	// logits after the embedding bias, before penalties and temperature
	// (ReturnTopLogprobs; nil otherwise).
	TokenLogprobs []float32
	// TopLogprobIDs and TopLogprobs are, for each of those tokens, the TopLogprobs most
	// likely tokens of its position and their log-probabilities, best first (ties: the
	// lower id), [n][TopLogprobs] (ReturnTopLogprobs).
	TopLogprobIDs []int32
	TopLogprobs   []float32
	// PromptLen counts the prompt's tokens.
	PromptLen int
	// Generated is the number of tokens generated so far (the end token excluded).
	Generated int
	// Finish says why the request ended, in its final response; NotFinished before.
	// With several sequences, why this response's sequence ended, in its last response.
	Finish FinishReason
	// Beams holds, for beam search, one entry per beam in order (best first once
	// finished); the fields above then describe Beams[0]. Streaming, each response
	// carries every generated token of the current beams (they change as the search
	// goes on); the final one the finished beams.
	Beams []BeamResult
	// SequenceIndex is the sequence this response belongs to (num_return_sequences
	// when sampling; 0 otherwise).
	SequenceIndex int
	// SequenceFinal marks the last response of SequenceIndex.
	SequenceFinal bool
	// Perf holds the request's timings and KV counts (ReturnPerfMetrics; nil otherwise).
	Perf *PerfMetrics
}

// BeamResult is one beam of a beam search's response.
type BeamResult struct {
	// Tokens are the beam's tokens: the generated ones (streaming, or with
	// ExcludeInputInOutput), else the prompt and the generated ones.
	Tokens []int32
	// CumLogProb is the sum of the beam's log-probabilities.
	CumLogProb float32
	// LogProbs are the log-probabilities of the beam's generated tokens (ReturnLogProbs).
	LogProbs []float32
	// Score is CumLogProb after the length penalty, which ranks finished beams.
	Score float32
	// Finish says why the beam ended (END_ID, STOP_WORDS, LENGTH).
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
	// PollStopSignal returns the IDs of requests to stop now (cancelled: a final error
	// response wrapping ErrCancelled).
	PollStopSignal func() map[uint64]struct{}
	// PollEndSignal, optional, returns the IDs of requests to end now as if they had
	// finished: a normal final response with what they generated, FinishedCancelled
	// (TensorRT-LLM's stop input).
	PollEndSignal func() map[uint64]struct{}
	// ReturnBatchManagerStats receives the stats JSON of every iteration with work.
	ReturnBatchManagerStats func(stats string)
	// IterationStats, optional, receives the same stats as a struct (for metrics,
	// without parsing the JSON); called right after ReturnBatchManagerStats.
	IterationStats func(stats Stats)
	// EngineFailed, optional, is called once, on the manager's goroutine, when a step
	// failed and the engine could not recover (engine.Recoverer), before the requests in
	// flight get their final errors (so that the caller can report itself not ready
	// before any client hears of the failure); every later request gets ErrEngineBroken
	// at once.
	EngineFailed func(err error)
}

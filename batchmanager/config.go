package batchmanager

import "time"

// ModelType is gpt_model_type: how requests are batched.
type ModelType string

// The model types of TensorRT-LLM's TrtGptModelType.
const (
	// V1 runs a static batch in lockstep, padded, until every sequence finishes.
	V1 ModelType = "V1"
	// InflightBatching lets requests join and leave at every iteration.
	InflightBatching ModelType = "inflight_batching"
	// InflightFusedBatching is in-flight batching with context and generation steps in
	// one engine call (gollm always fuses them; the name is kept for config compatibility).
	InflightFusedBatching ModelType = "inflight_fused_batching"
)

// SchedulerPolicy is batch_scheduler_policy: how requests are admitted.
type SchedulerPolicy string

// The capacity scheduler policies of TensorRT-LLM.
const (
	// MaxUtilization admits as many requests as fit and pauses the newest when the KV
	// cache runs short.
	MaxUtilization SchedulerPolicy = "max_utilization"
	// GuaranteedNoEvict admits a request only when its worst case fits.
	GuaranteedNoEvict SchedulerPolicy = "guaranteed_no_evict"
	// StaticBatch admits no new request until the running batch has finished.
	StaticBatch SchedulerPolicy = "static_batch"
)

// Config holds a manager's settings; zero fields take the documented defaults.
type Config struct {
	// ModelType is gpt_model_type (default inflight_fused_batching).
	ModelType ModelType
	// Policy is batch_scheduler_policy (default guaranteed_no_evict).
	Policy SchedulerPolicy
	// MaxBatchSize is the most sequences in one iteration (default 64).
	MaxBatchSize int
	// MaxNumTokens is the most tokens (prompt and generated) in one iteration; 0: no limit
	// beyond what the KV cache holds.
	MaxNumTokens int
	// EnableChunkedContext splits prompts longer than the token budget over iterations.
	EnableChunkedContext bool
	// EnableKVCacheReuse shares the KV blocks of common prompt prefixes.
	EnableKVCacheReuse bool
	// MaxBeamWidth is the widest beam search accepted (max_beam_width); 0: no limit
	// beyond MaxBatchSize.
	MaxBeamWidth int
	// BatchedLogitsPostProcessor serves the requests with BatchedPostProcessing; a
	// request asking for it without one is refused.
	BatchedLogitsPostProcessor BatchedLogitsPostProcessor
	// IdleWait is how long the loop waits for work when idle before polling again
	// (default 10ms); Manager.Wake cuts it short.
	IdleWait time.Duration
	// AdmissionWindow, when positive, gathers a burst: a request that arrives while
	// nothing runs waits up to this long for others to arrive, so that requests sent
	// together start in one prompt step instead of one step each as they trickle in
	// (streams opened together reach the manager spread over several steps). The wait
	// ends early once MaxBatchSize requests are waiting, or once none has arrived for a
	// quarter of the window (the burst is over; a lone request waits that long).
	// Requests arriving while others run are not held: they join the next step. 0 (the
	// default): no wait.
	AdmissionWindow time.Duration
	// StreamInterval, when above 1, gives a streaming request a response every
	// StreamInterval generated tokens instead of every token; its final response carries
	// what is left. Each response costs the server a send and the client a message
	// (through tritonserver at batch 64 those, not the engine, set the pace: README,
	// Performance), so a client that reads text, not token timings, trades a few
	// iterations of latency for throughput. Beam search
	// streams as without it. 0 or 1 (the default): every token.
	StreamInterval int
	// Overlap launches the next iteration before the current one's outputs are read
	// (TensorRT-LLM's overlap scheduler), so that the host's work on a step's results —
	// stop conditions, responses — runs while the engine computes the next. It applies
	// to in-flight batching under guaranteed_no_evict and max_utilization, while every
	// request of the batch that samples is sampled by the engine without its token
	// history (no repetition, presence or frequency penalty, no bad word longer than one
	// token, no top-p decay, no beams or several sequences) and no request is paused;
	// prompt chunks go on in it; other iterations run as without it. A request that ends leaves one row computed for
	// nothing in the step after; requests that arrive join the next step launched, as
	// without it (one sequence each; others wait for the overlap to pause). The tokens
	// are those without it. Engines that cannot overlap (engine.Pipeliner) run
	// it through engine.SyncPipeline: same schedule, nothing overlapped. Speculation
	// takes precedence: a step with proposals, or before which requests may propose, is
	// not launched ahead.
	Overlap bool
	// Speculation runs speculative decoding when its Proposer is set (speculate.go).
	Speculation Speculation
}

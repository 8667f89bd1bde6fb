// Package engine defines the Engine interface — one call per iteration of the batch
// manager — and what every engine shares: the batch and its sequences, the sampling
// rules and their random stream (rules.go), token counting for the penalties, and the
// structural check of a batch. The engines themselves are engine/cpu (pure Go, the
// reference) and bridge/cuda (the GPU).
//
// An engine owns the model weights and a paged KV pool. It keeps no per-request state:
// everything an iteration needs (new tokens, positions, block tables, sampling
// parameters) arrives in the Batch, so the batch manager alone decides what runs.
package engine

// Engine runs iterations of a decoder-only language model.
type Engine interface {
	// Info describes the model and the KV pool geometry.
	Info() Info
	// Step runs one iteration over every sequence of b: the forward pass of each
	// sequence's new tokens (their keys and values are written into the KV blocks named
	// by its block table) and, for sequences with Sample set, the sampling of one token.
	// The outputs are in the order of b.Seqs. An error fails the whole iteration; a
	// failure of one sequence alone (every token masked) is its Output.Err instead, and
	// the other sequences' outputs stand.
	Step(b *Batch) ([]Output, error)
	// Close frees the engine's memory. The engine is unusable afterwards.
	Close() error
}

// Pipeliner is implemented by an engine that can start an iteration before the host
// has read the previous one's outputs (the overlap of TensorRT-LLM's scheduler): the
// batch manager launches iteration k+1, whose generation steps take their tokens from
// iteration k's sampling on the device (Sequence.Feed), and then waits for k, so that
// the host's work on k's results runs while the device computes k+1.
//
// Launch starts b's iteration; b may be changed once Launch returns. At most two
// launched iterations wait at once, and Wait returns the oldest one's outputs, in the
// order of its Seqs. Feed may be set only on a batch launched while its predecessor
// still waits, and must name a sequence of that predecessor that samples. An error from
// either call fails the iteration it names; after one, the caller waits for every other
// launched iteration (discarding its outputs) before it launches again. Step must not be
// called while an iteration waits.
type Pipeliner interface {
	Launch(b *Batch) error
	Wait() ([]Output, error)
}

// LateMasker is implemented by a Pipeliner whose launch may leave guided decoding's masks
// (Sequence.Allowed) of its rows marked Sequence.LateMask to a later call, so that the
// host makes them from the tokens of the launch before while the engine already runs
// this one's forward pass; only the sampling waits for them. After Launch(b) with such
// rows, SupplyMasks(b) must come, with those rows' Allowed set (nil: unconstrained), before
// the next Launch and before the Wait that returns b's outputs; a Wait for the launch
// before b may come between. b must not change between the two calls but for Allowed. An
// error fails b's iteration as Launch's would.
type LateMasker interface {
	SupplyMasks(b *Batch) error
}

// Recoverer is implemented by an engine that can check and restore itself after a Step
// failed (a CUDA error). Recover returns nil when the engine is fit to run steps again —
// whatever the failed step left half done, such as counters of split reductions, is
// reset, so that no later step computes a wrong answer from it — or an error when it
// cannot be (a lost CUDA context); the engine must not be stepped after that.
type Recoverer interface {
	// Recover readies the engine after Step returned cause.
	Recover(cause error) error
}

// Info describes a loaded model and the engine's KV pool.
type Info struct {
	// VocabSize is the number of logits per position.
	VocabSize int
	// MaxSeqLen is the longest sequence (prompt plus output) the model can hold.
	MaxSeqLen int
	// Layers, KVHeads and HeadDim give the KV cache geometry per token.
	Layers, KVHeads, HeadDim int
	// NumBlocks is the number of KV blocks in the pool; block ids are 0..NumBlocks-1.
	NumBlocks int
	// TokensPerBlock is the number of token positions one KV block holds.
	TokensPerBlock int
	// EndIDs are the checkpoint's end-of-sequence tokens; empty when it names none.
	EndIDs []int32
	// MaxDraft is the most proposed tokens one sequence may carry in a step
	// (Sequence.Draft); 0 when the engine does not verify proposals.
	MaxDraft int
	// Hidden is the width of the residual stream when the engine returns hidden states
	// (Batch.HiddenLayers, Sequence.ReturnHidden); 0 when it does not.
	Hidden int
}

// MaxDraftTokens bounds Info.MaxDraft on every engine: past a dozen proposals per step a
// sequence rarely has any accepted, and each costs a row of the step.
const MaxDraftTokens = 16

// KVConfig sizes an engine's paged KV pool.
type KVConfig struct {
	// NumBlocks is the number of blocks in the pool.
	NumBlocks int
	// TokensPerBlock is the number of positions per block (gollm's default is 64).
	TokensPerBlock int
	// MaxSeqLen is the longest sequence the engine serves; 0 means the model's maximum
	// positions.
	MaxSeqLen int
	// DType is the pool's element type.
	DType KVDType
	// KScales and VScales, under KVFP8, are each layer's key and value scales (the
	// checkpoint's k_scale and v_scale); nil means 1 for every layer.
	KScales, VScales []float32
}

// Batch is the work of one iteration.
type Batch struct {
	// Seqs are the scheduled sequences, context (prompt) and generation steps mixed.
	Seqs []Sequence
	// BlockCopies are whole KV blocks to copy, in order, before the forward pass: the
	// copy-on-write of beams (sequences sharing their prompt's blocks) that diverge
	// inside a shared block. A batch with copies has at least one sequence.
	BlockCopies []BlockCopy
	// HiddenLayers are the layers whose outputs (the residual stream after the layer)
	// are returned for the sequences with ReturnHidden: an EAGLE-3 head reads them.
	HiddenLayers []int
}

// BlockCopy copies one KV block of the pool onto another: every layer's keys and
// values, every position.
type BlockCopy struct {
	// Src is only read.
	Src int32
	// Dst is the block written; no two copies of a batch write one block.
	Dst int32
}

// Sequence is one sequence's share of an iteration.
type Sequence struct {
	// ID identifies the sequence (the request ID) in logs and errors.
	ID uint64
	// Tokens are the new tokens of this iteration: a prompt chunk, or the one token
	// sampled in the previous iteration.
	Tokens []int32
	// Pos is the position of Tokens[0]: the number of tokens already in the KV cache.
	Pos int
	// Blocks is the block table: block Blocks[i] holds positions [i*T, (i+1)*T) where T
	// is Info.TokensPerBlock. It covers at least Pos+len(Tokens) positions.
	Blocks []int32
	// Sample asks for a token after the last of Tokens; it is false for a prompt chunk
	// that is not the prompt's last.
	Sample bool
	// Sampling holds the sampling parameters; used only when Sample is set.
	Sampling SamplingParams
	// History is every token of the sequence so far, prompt and generated, Tokens
	// included; penalties read it.
	History []int32
	// NumGenerated is the number of tokens generated before this iteration; min length
	// and the per-step random stream read it.
	NumGenerated int
	// ReturnLogits copies the last position's logits (after the embedding bias, before
	// the penalties and masks) into Output.Logits, with or without Sample.
	ReturnLogits bool
	// ContextLogits copies the logits of every position of Tokens into
	// Output.ContextLogits.
	ContextLogits bool
	// Allowed, when not nil, are the only tokens the sampled position may take (guided
	// decoding): bit i%64 of word i/64 for token i, MaskWords(VocabSize) words. It is
	// applied after the other masks; a mask of one token is that token, chosen without a
	// draw.
	Allowed []uint64
	// LateMask says that Allowed comes after the launch, by LateMasker.SupplyMasks.
	LateMask bool
	// Feed, when positive, makes the one new token the token sampled for sequence
	// Feed-1 of the batch launched just before (Pipeliner); Tokens[0] is then only a
	// placeholder in the vocabulary, and History lacks that token. Step refuses it.
	Feed int
	// Draft, when positive, says that the last Draft of Tokens are proposed tokens to
	// verify (speculative decoding): the step samples at each of the last Draft+1
	// positions, as it would one token at a time, and keeps the proposals up to the
	// first one the target does not accept, then the token it sampled after them
	// (Output.Tokens). The keys and values written for the proposals that were not
	// accepted are left in the KV blocks; the caller's next step overwrites them. Row i
	// of the verification (0 ≤ i ≤ Draft) follows the rules with History's first
	// len(History)-Draft+i tokens and NumGenerated+i. Needs Sample, no ContextLogits
	// and no Feed, and at most Info.MaxDraft proposals.
	Draft int
	// ReturnHidden copies, for every position of Tokens, the outputs of
	// Batch.HiddenLayers into Output.Hidden.
	ReturnHidden bool
	// DraftProbs, when set with Draft, are the distributions the proposals were drawn
	// from, row-major [Draft][VocabSize]: the acceptance rule is then speculative
	// sampling's (Leviathan et al. 2023, Chen et al. 2023), a proposal kept with
	// probability min(1, p/q). Without them a proposal counts as certain (a point mass:
	// prompt lookup, a greedy draft) and is kept when the token sampled at its position
	// is the proposal, so that the tokens are those of decoding without speculation.
	// Greedy sequences ignore them.
	DraftProbs []float32
}

// SamplingParams are one sequence's sampling settings. The zero value is greedy.
type SamplingParams struct {
	// Temperature divides the logits; 0 means greedy.
	Temperature float32
	// TopK keeps the K most likely tokens; 0 means no limit, 1 means greedy.
	TopK int
	// TopP keeps the smallest set of tokens whose probability reaches P; 0 or 1 means no limit.
	TopP float32
	// MinP, after top-k and top-p, keeps the tokens at least MinP times as likely as the
	// most likely one (temperature applied); 0 means no limit.
	MinP float32
	// Seed starts the sequence's random stream; step n draws from (Seed, n), so the
	// tokens do not depend on what else is in the batch.
	Seed uint64
	// RepetitionPenalty divides positive (multiplies negative) logits of tokens seen in
	// History; 0 or 1 means none.
	RepetitionPenalty float32
	// PresencePenalty is subtracted once from the logit of every token seen in History.
	PresencePenalty float32
	// FrequencyPenalty is subtracted from a token's logit once per occurrence in History.
	FrequencyPenalty float32
	// MinLength forbids every token of EndIDs until this many tokens have been generated.
	MinLength int
	// EndIDs lists the tokens MinLength forbids.
	EndIDs []int32
	// BadWords are token sequences that must not be generated: when a sequence's last
	// tokens match a bad word's prefix, its final token is masked.
	BadWords [][]int32
	// EmbeddingBias is added to the logits (length VocabSize) when not nil.
	EmbeddingBias []float32
}

// Output is what one sequence produced in an iteration.
type Output struct {
	// Token is the sampled token; -1 when the sequence did not ask for one. With
	// Sequence.Draft, the first of Tokens.
	Token int32
	// LogProb is the log-probability of Token under the distribution it was drawn from.
	LogProb float32
	// Logits are the sampled position's logits, when asked; with Sequence.Draft, one
	// row per token of Tokens, row-major [len(Tokens)][VocabSize].
	Logits []float32
	// Tokens are, for a sequence with Sequence.Draft, its new tokens in order: the
	// proposals accepted, then the token sampled after them — 1 to Draft+1 tokens, of
	// which all but the last equal the proposals. Nil for other sequences.
	Tokens []int32
	// LogProbs are the log-probabilities of Tokens, each as LogProb is Token's.
	LogProbs []float32
	// Hidden are, with ReturnHidden, the outputs of Batch.HiddenLayers at every position
	// of Tokens, row-major [len(Tokens)][len(HiddenLayers)·Info.Hidden], the layers in
	// the batch's order.
	Hidden []float32
	// ContextLogits are the logits of every position of Tokens, row-major
	// [len(Tokens)][VocabSize], when asked.
	ContextLogits []float32
	// Err is this sequence's own failure, nil when it has none: its token could not be
	// chosen (ErrAllMasked). Token is then -1, and the batch manager fails the
	// sequence's request alone. A row fed from it in a step launched after this one
	// (Pipeliner) runs on a placeholder token; its output means nothing.
	Err error
}

// MaskWords is the length in 64-bit words of a Sequence.Allowed mask over a vocabulary
// of v tokens.
func MaskWords(v int) int { return (v + 63) / 64 }

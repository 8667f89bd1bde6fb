package engine

// A draft head (EAGLE-3) is a small network that proposes tokens from the target
// model's hidden states (Batch.HiddenLayers) and its own: one decoder layer over a paged
// KV pool of its own, a step per proposal. An engine package implements it (engine/cpu's
// Eagle3); the proposer (speculate.Eagle3) drives it.

// Head runs a draft head's layer over its KV pool.
type Head interface {
	// HeadInfo describes the head and its pool.
	HeadInfo() HeadInfo
	// Forward runs rows, in order: each writes its keys and values at its position of its
	// block table and attends over its positions so far (those of earlier rows of the
	// call included). Rows of one sequence come in position order.
	Forward(rows []HeadRow) error
	// Close frees the head's pool.
	Close() error
}

// HeadInfo describes a draft head.
type HeadInfo struct {
	// Hidden is the head's width; TargetHidden the target's.
	Hidden, TargetHidden int
	// Features is the width of a position's target feature: the outputs of AuxLayers,
	// side by side [len(AuxLayers)·TargetHidden].
	Features int
	// AuxLayers are the target layers whose outputs the head reads (Batch.HiddenLayers).
	AuxLayers []int
	// DraftVocab is the number of logits; token d of it is D2T[d]+d of the target's.
	DraftVocab int
	// D2T maps the head's tokens to the target's [DraftVocab].
	D2T []int32
	// NumBlocks, TokensPerBlock and MaxSeqLen are its KV pool's geometry.
	NumBlocks, TokensPerBlock, MaxSeqLen int
}

// HeadRow is one position of a head's step.
type HeadRow struct {
	// Pos is the position; Token the token after it (the head reads position j's
	// feature with token j+1's embedding and predicts token j+2).
	Pos   int
	Token int32
	// Blocks is the sequence's block table in the head's pool.
	Blocks []int32
	// Feature is the target's feature at Pos [Features]; nil to read Own instead.
	Feature []float32
	// Own is the head's own output at the position before [Hidden], when Feature is nil.
	Own []float32
	// Out receives the layer's output [Hidden] (before the final norm).
	Out []float32
	// Logits, when not nil, receives the draft vocabulary's logits [DraftVocab].
	Logits []float32
}

// Package speculate holds the proposers of speculative decoding: each iteration the
// batch manager asks its proposer for up to k tokens that may follow each sequence that
// speculates, the engine verifies them in the same step as the sequence's own token
// (engine.Sequence.Draft), and the manager keeps the accepted ones. A proposal is a
// guess: a bad one costs a row of the step, never a wrong token.
//
// Proposers: NGram (prompt lookup: the tokens that followed the sequence's last n tokens
// where they occurred before, no model), Draft (a smaller model with the same
// vocabulary on an engine of its own, with its own KV pool), and Eagle3 (EAGLE-3 heads,
// reading the target's hidden states).
package speculate

import "gollm/engine"

// Request is one sequence's call for proposals in an iteration.
type Request struct {
	// Key names the sequence across iterations (the request ID), for proposers that keep
	// state per sequence.
	Key uint64
	// Tokens are the sequence so far, prompt and generated; read-only.
	Tokens []int32
	// Max is the most tokens to propose (at least 1).
	Max int
	// Sampling are the sequence's sampling settings, its Seed its random stream; a
	// proposer that draws its proposals draws from its own stream derived from it.
	Sampling engine.SamplingParams
	// NumGenerated is the number of tokens the sequence has generated: the first
	// proposal would be token NumGenerated.
	NumGenerated int
	// EndIDs end the sequence: nothing is proposed past one.
	EndIDs []int32

	// Draft receives the proposals, at most Max (Propose appends to Draft[:0]).
	Draft []int32
	// Probs receives, for proposals drawn from distributions, those distributions
	// row-major [len(Draft)][vocab]; it stays empty for proposals counted as certain.
	Probs []float32
}

// Proposer proposes tokens for the sequences that speculate. Its methods are called from
// the batch manager's goroutine only.
type Proposer interface {
	// Propose fills each request's Draft (and Probs); it may leave any of them empty.
	// An error drops this iteration's proposals (the sequences step without them).
	Propose(reqs []*Request) error
	// Forget drops what the proposer keeps for the sequence key: it ended, was paused or
	// cancelled.
	Forget(key uint64)
	// Reset forgets every sequence, after the manager started afresh from a failure.
	Reset()
	// Close frees what the proposer holds (a draft model's engine).
	Close() error
}

// DraftSeed is the random stream a proposer draws a sequence's proposals from, given
// the sequence's own: another stream, so that the acceptance test, which draws from the
// sequence's, does not depend on the proposal.
func DraftSeed(seed uint64) uint64 { return seed ^ 0x6a09e667f3bcc909 }

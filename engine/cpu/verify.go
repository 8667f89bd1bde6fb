package cpu

import (
	"fmt"
	"slices"

	"gollm/engine"
)

// Speculative verification on the CPU engine: a sequence with proposals
// (engine.Sequence.Draft) runs its new tokens through the forward pass like any other;
// the LM head then computes the logits of its last Draft+1 positions, and
// engine.Sampler.Verify turns them into the step's tokens.

// draftRows queues the LM-head rows of sq, a sequence with proposals whose first row in
// the residual stream is r0: its last Draft+1 positions, whose logits land in s.logits
// from row k on. It returns those logits as one slice [(Draft+1)·vocab], filled once the
// LM head has run.
func (e *Engine) draftRows(sq *engine.Sequence, r0, k int) []float32 {
	s := &e.s
	w := e.w
	n, V := sq.Draft+1, w.cfg.VocabSize
	first := r0 + len(sq.Tokens) - n
	for i := range n {
		s.lmIn = append(s.lmIn, s.hf.rows[len(s.lmIn)])
		e.norm(s.lmIn[len(s.lmIn)-1], s.h.rows[first+i])
		s.lmOut = append(s.lmOut, s.logits.rows[k+i])
	}
	return s.logits.data[k*V : (k+n)*V : (k+n)*V]
}

// verify fills the output of a sequence with proposals from its rows' logits.
func (e *Engine) verify(sq *engine.Sequence, logits []float32, sp *engine.Sampler, out *engine.Output) error {
	V := e.info.VocabSize
	rows := make([][]float32, sq.Draft+1)
	for i := range rows {
		rows[i] = logits[i*V : (i+1)*V : (i+1)*V]
	}
	if err := sp.Verify(rows, sq, out); err != nil {
		return fmt.Errorf("cpu: sequence %d: %w", sq.ID, err)
	}
	return nil
}

// captureHidden copies the residual stream after layer li, where li is one of
// b.HiddenLayers, into the outputs of the sequences with ReturnHidden (an EAGLE-3 head
// reads them).
func (e *Engine) captureHidden(b *engine.Batch, li int, outs []engine.Output) {
	k := slices.Index(b.HiddenLayers, li)
	if k < 0 {
		return
	}
	H, n := e.w.cfg.Hidden, len(b.HiddenLayers)
	r0 := 0
	for si := range b.Seqs {
		sq := &b.Seqs[si]
		if sq.ReturnHidden {
			o := &outs[si]
			if o.Hidden == nil {
				o.Hidden = make([]float32, len(sq.Tokens)*n*H)
			}
			for i := range sq.Tokens {
				copy(o.Hidden[(i*n+k)*H:(i*n+k+1)*H], e.s.h.rows[r0+i])
			}
		}
		r0 += len(sq.Tokens)
	}
}

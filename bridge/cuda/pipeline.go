package cuda

/*
#include "trampoline.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"gollm/engine"
)

// launchRec is one launched iteration (engine.Pipeliner) until Wait: either done on the
// host already (outs, err), or waiting in the library (async), its arrays in prep.
type launchRec struct {
	// async says its last library call waits for gollm_wait.
	async bool
	// prep holds the waiting call's arrays; n is its batch's sequence count.
	prep *stepPrep
	n    int
	// outs and err are the outcome of a launch that completed on the host.
	outs []engine.Output
	err  error
}

// Launch starts one iteration without waiting for it (engine.Pipeliner). A batch that
// fits one library call is enqueued on the GPU, its fed sequences reading the previous
// launch's sampled tokens there; one that needs several calls first waits for the
// launch before it (its fed tokens are then known on the host) and runs at once.
func (e *Engine) Launch(b *engine.Batch) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("cuda: Launch on a closed engine")
	}
	if b == nil {
		return errors.New("cuda: Launch: nil batch")
	}
	if len(e.queue) >= 2 {
		return errors.New("cuda: Launch with two iterations launched and not waited for")
	}
	if _, err := e.check.CheckLaunch(b); err != nil {
		return err
	}
	fed := slices.ContainsFunc(b.Seqs, func(s engine.Sequence) bool { return s.Feed != 0 })
	var prev *launchRec
	if len(e.queue) > 0 {
		prev = e.queue[len(e.queue)-1]
	}
	if fed && prev == nil {
		return errors.New("cuda: Launch: fed sequences without a launched predecessor")
	}
	parts := splitBatch(b, e.opts.MaxTokens, e.opts.MaxSeqs)
	drafted := slices.ContainsFunc(b.Seqs, func(s engine.Sequence) bool { return s.Draft > 0 })
	if len(parts) != 1 || fed && !prev.async || drafted {
		return e.launchOnHost(b, parts, fed, prev)
	}
	// One call, enqueued: its arrays in the prep no waiting call uses.
	p := &e.preps[0]
	if prev != nil && prev.prep == p {
		p = &e.preps[1]
	}
	p.build(b, parts[0], e.info)
	p.copies = p.copies[:0]
	for _, c := range b.BlockCopies {
		p.copies = append(p.copies, c.Src, c.Dst)
	}
	p.feed = p.feed[:0]
	if fed {
		for i := range b.Seqs {
			f := int32(-1)
			if s := &b.Seqs[i]; s.Feed > 0 {
				if s.Feed > prev.n {
					return fmt.Errorf("cuda: sequence %d: Feed = %d names no sequence of the %d launched before", s.ID, s.Feed, prev.n)
				}
				f = int32(s.Feed - 1) // one call: the library's rows are the batch's
			}
			p.feed = append(p.feed, f)
		}
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	in := p.stepIn(&pin)
	var st C.gollm_status
	if err := statusErr("gollm_launch", C.call_launch(e.lib.launch, e.ptr, in, C.int64_t(p.logitsLen), &st), &st); err != nil {
		return err
	}
	e.queue = append(e.queue, &launchRec{async: true, prep: p, n: len(b.Seqs)})
	return nil
}

// launchOnHost runs a launch that cannot wait in the library — several calls, fed from a
// launch on the host, or proposals to verify on the host: every launch before it is
// waited for, fed tokens are taken from the previous one's outputs, and the batch runs
// now; its outcome waits in the queue.
func (e *Engine) launchOnHost(b *engine.Batch, parts [][]piece, fed bool, prev *launchRec) error {
	for _, r := range e.queue {
		e.finish(r)
	}
	run := b
	if fed {
		if prev.err != nil {
			e.queue = append(e.queue, &launchRec{err: fmt.Errorf("cuda: the iteration this one is fed from failed: %w", prev.err)})
			return nil
		}
		c := &engine.Batch{Seqs: slices.Clone(b.Seqs), BlockCopies: b.BlockCopies}
		for i := range c.Seqs {
			s := &c.Seqs[i]
			if s.Feed == 0 {
				continue
			}
			if s.Feed > len(prev.outs) || prev.outs[s.Feed-1].Token < 0 {
				return fmt.Errorf("cuda: sequence %d: Feed = %d names no sampled sequence of the %d launched before", s.ID, s.Feed, len(prev.outs))
			}
			t := prev.outs[s.Feed-1].Token
			s.Tokens = []int32{t}
			s.History = append(slices.Clone(s.History[:len(s.History)-1]), t)
			s.Feed = 0
		}
		run = c
	}
	outs, err := e.stepParts(run, parts)
	e.queue = append(e.queue, &launchRec{outs: outs, err: err})
	return nil
}

// finish waits in the library for a launch that is waiting there, keeping its outcome.
func (e *Engine) finish(r *launchRec) {
	if !r.async {
		return
	}
	r.async = false
	p := r.prep
	r.prep = nil
	logits := e.logitsBuffer(p.logitsLen)
	var pin runtime.Pinner
	defer pin.Unpin()
	out := p.stepOut(&pin, logits, p.logitsLen)
	var st C.gollm_status
	if err := statusErr("gollm_wait", C.call_wait(e.lib.wait, e.ptr, out, &st), &st); err != nil {
		r.err = err
		return
	}
	r.outs = make([]engine.Output, r.n)
	p.collectLaunched(logits, r.outs, e.info.VocabSize)
}

// Wait returns the oldest launched iteration's outputs (engine.Pipeliner).
func (e *Engine) Wait() ([]engine.Output, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("cuda: Wait on a closed engine")
	}
	if len(e.queue) == 0 {
		return nil, errors.New("cuda: Wait with no iteration launched")
	}
	r := e.queue[0]
	e.queue = append(e.queue[:0], e.queue[1:]...)
	e.finish(r)
	return r.outs, r.err
}

// stepIn points a gollm_step_in at p's arrays, pinning them for the call.
func (p *stepPrep) stepIn(pin *runtime.Pinner) *C.gollm_step_in {
	ptr := func(n int, first unsafe.Pointer) unsafe.Pointer {
		if n == 0 {
			return nil
		}
		pin.Pin(first)
		return first
	}
	in := &C.gollm_step_in{
		num_seqs:      C.int32_t(len(p.seqs)),
		num_tokens:    C.int32_t(len(p.tokens)),
		num_block_ids: C.int32_t(len(p.blocks)),
		num_penalties: C.int32_t(len(p.penTok)),
		num_masks:     C.int32_t(len(p.masks)),
		num_bias:      C.int64_t(len(p.bias)),
	}
	in.seqs = (*C.gollm_seq)(ptr(len(p.seqs), unsafe.Pointer(unsafe.SliceData(p.seqs))))
	in.tokens = (*C.int32_t)(ptr(len(p.tokens), unsafe.Pointer(unsafe.SliceData(p.tokens))))
	in.block_ids = (*C.int32_t)(ptr(len(p.blocks), unsafe.Pointer(unsafe.SliceData(p.blocks))))
	in.penalty_tokens = (*C.int32_t)(ptr(len(p.penTok), unsafe.Pointer(unsafe.SliceData(p.penTok))))
	in.penalty_counts = (*C.int32_t)(ptr(len(p.penCnt), unsafe.Pointer(unsafe.SliceData(p.penCnt))))
	in.mask_tokens = (*C.int32_t)(ptr(len(p.masks), unsafe.Pointer(unsafe.SliceData(p.masks))))
	in.bias = (*C.float)(ptr(len(p.bias), unsafe.Pointer(unsafe.SliceData(p.bias))))
	in.num_allowed = C.int64_t(len(p.allowed))
	in.allowed = (*C.uint32_t)(ptr(len(p.allowed), unsafe.Pointer(unsafe.SliceData(p.allowed))))
	in.num_block_copies = C.int32_t(len(p.copies) / 2)
	in.block_copies = (*C.int32_t)(ptr(len(p.copies), unsafe.Pointer(unsafe.SliceData(p.copies))))
	in.feed = (*C.int32_t)(ptr(len(p.feed), unsafe.Pointer(unsafe.SliceData(p.feed))))
	return in
}

// stepOut points a gollm_step_out at p's result arrays and logits, pinning them. n is the
// call's length of logits: len(logits), or with logits nil (a tensor-parallel rank past 0,
// which gets none back) the length its steps are checked against.
func (p *stepPrep) stepOut(pin *runtime.Pinner, logits []float32, n int) *C.gollm_step_out {
	ptr := func(n int, first unsafe.Pointer) unsafe.Pointer {
		if n == 0 {
			return nil
		}
		pin.Pin(first)
		return first
	}
	out := &C.gollm_step_out{logits_len: C.int64_t(n)}
	out.tokens = (*C.int32_t)(ptr(len(p.outTok), unsafe.Pointer(unsafe.SliceData(p.outTok))))
	out.log_probs = (*C.float)(ptr(len(p.outLP), unsafe.Pointer(unsafe.SliceData(p.outLP))))
	out.logits = (*C.float)(ptr(len(logits), unsafe.Pointer(unsafe.SliceData(logits))))
	return out
}

// collectLaunched is collect for a launched call of one part, whose sequence i is the
// batch's sequence i: what each asked for is read from its descriptor's flags, since
// the batch may have changed since the launch.
func (p *stepPrep) collectLaunched(logits []float32, outs []engine.Output, V int) {
	for i := range p.seqs {
		d := &p.seqs[i]
		o := &outs[i]
		off := int(d.logits_offset)
		n := int(d.token_count)
		if d.flags&C.GOLLM_SEQ_CONTEXT_LOGITS != 0 && logits != nil {
			o.ContextLogits = logits[off : off+n*V : off+n*V]
			off += n * V
		}
		o.Token = -1
		if d.flags&C.GOLLM_SEQ_RETURN_LOGITS != 0 && logits != nil {
			o.Logits = logits[off : off+V : off+V]
		}
		if d.flags&C.GOLLM_SEQ_SAMPLE != 0 {
			o.Token, o.LogProb = p.outTok[i], p.outLP[i]
			o.Err = maskedErr(o, p.ids[i])
		}
	}
}

// The GPU engine overlaps on its own.
var _ engine.Pipeliner = (*Engine)(nil)

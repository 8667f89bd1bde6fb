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
	// late says the launch waits for its masks (engine.LateMasker): in the library when
	// async (its forward pass enqueued), else on the host, which runs it all at
	// SupplyMasks with hostRun's arguments.
	late    bool
	hostRun *hostRun
}

// hostRun is a launch on the host whose masks come late: launchOnHost's arguments.
type hostRun struct {
	b     *engine.Batch
	parts [][]piece
	fed   bool
	prev  *launchRec
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
	if len(e.queue) > 0 && e.queue[len(e.queue)-1].late {
		return errors.New("cuda: Launch before the masks of the launch before it (SupplyMasks)")
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
	// Proposals verified in rows on the GPU are sampled there like any row; those left to
	// the host need their logits first.
	drafted := false
	for _, pc := range parts[0] {
		drafted = drafted || b.Seqs[pc.seq].Draft > 0 && !pc.rows
	}
	for _, part := range parts[1:] {
		for _, pc := range part {
			drafted = drafted || b.Seqs[pc.seq].Draft > 0
		}
	}
	late := slices.ContainsFunc(b.Seqs, func(s engine.Sequence) bool { return s.LateMask })
	// The library takes masks late for a step whose rows return no logits (one GPU: a
	// tensor-parallel engine steps its ranks, under engine.SyncPipeline).
	lateLib := e.rank == 0 && !slices.ContainsFunc(b.Seqs, func(s engine.Sequence) bool {
		return s.ReturnLogits || s.ContextLogits || s.ReturnHidden
	})
	if len(parts) != 1 || fed && !prev.async || drafted || late && !lateLib {
		if late {
			// Everything before it is waited for now; it runs when its masks come.
			for _, r := range e.queue {
				e.finish(r)
			}
			e.queue = append(e.queue, &launchRec{late: true, hostRun: &hostRun{b, parts, fed, prev}})
			return nil
		}
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
		// One call: the library's sequences are the batch's, but for the rows of
		// proposals verified on the GPU (stepPrep.first).
		for range p.seqs {
			p.feed = append(p.feed, -1)
		}
		for i := range b.Seqs {
			if s := &b.Seqs[i]; s.Feed > 0 {
				if s.Feed > prev.n {
					return fmt.Errorf("cuda: sequence %d: Feed = %d names no sequence of the %d launched before", s.ID, s.Feed, prev.n)
				}
				p.feed[p.first[i]] = int32(prev.prep.first[s.Feed-1])
			}
		}
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	in := p.stepIn(&pin)
	if late {
		// The masks' room: a mask a row, every mask distinct at worst.
		in.late_allowed = 1
		in.allowed, in.num_allowed = nil, C.int64_t(p.lateRows(b)*((e.info.VocabSize+31)/32))
	}
	var st C.gollm_status
	if err := statusErr("gollm_launch", C.call_launch(e.lib.launch, e.ptr, in, C.int64_t(p.logitsLen), &st), &st); err != nil {
		return err
	}
	e.queue = append(e.queue, &launchRec{async: true, prep: p, n: len(b.Seqs), late: late})
	return nil
}

// SupplyMasks gives the latest launch, made with rows whose masks come late, its rows'
// Allowed (engine.LateMasker): the library uploads them and enqueues the sampling behind
// the forward pass already running; a launch on the host runs now.
func (e *Engine) SupplyMasks(b *engine.Batch) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("cuda: SupplyMasks on a closed engine")
	}
	if len(e.queue) == 0 || !e.queue[len(e.queue)-1].late {
		return errors.New("cuda: SupplyMasks with no launch waiting for its masks")
	}
	r := e.queue[len(e.queue)-1]
	words := engine.MaskWords(e.info.VocabSize)
	for i := range b.Seqs {
		if a := b.Seqs[i].Allowed; a != nil && len(a) != words {
			return fmt.Errorf("cuda: sequence %d: Allowed has %d words, a vocabulary of %d needs %d", b.Seqs[i].ID, len(a), e.info.VocabSize, words)
		}
	}
	r.late = false
	if h := r.hostRun; h != nil {
		r.hostRun = nil
		r.outs, r.err = e.runOnHost(h.b, h.parts, h.fed, h.prev)
		return nil
	}
	if len(b.Seqs) != r.n {
		return fmt.Errorf("cuda: SupplyMasks for %d sequences, %d launched", len(b.Seqs), r.n)
	}
	return e.supply(r, b)
}

// supply hands the library the masks of r's late launch (b's rows'; none with b nil).
func (e *Engine) supply(r *launchRec, b *engine.Batch) error {
	p := r.prep
	offs := p.supplyOffsets(b, r.n, (e.info.VocabSize+31)/32)
	var pin runtime.Pinner
	defer pin.Unpin()
	var offPtr *C.int32_t
	var allowPtr *C.uint32_t
	if len(offs) > 0 {
		pin.Pin(&offs[0])
		offPtr = (*C.int32_t)(unsafe.Pointer(&offs[0]))
	}
	if len(p.allowed) > 0 {
		pin.Pin(&p.allowed[0])
		allowPtr = (*C.uint32_t)(unsafe.Pointer(&p.allowed[0]))
	}
	var st C.gollm_status
	return statusErr("gollm_supply_allowed", C.call_supply_allowed(e.lib.supplyAllowed, e.ptr, offPtr,
		C.int32_t(len(offs)), allowPtr, C.int64_t(len(p.allowed)), &st), &st)
}

// lateRows counts the rows of b that may get a mask at SupplyMasks; build left every
// row's allowed_offset at -1 and p.allowed empty, as a late launch must have them.
func (p *stepPrep) lateRows(b *engine.Batch) int {
	for i := range p.seqs {
		p.seqs[i].allowed_offset = -1
	}
	n := 0
	for i := range p.first {
		if s := &b.Seqs[i]; p.rows[i] == 1 && s.Sample && (s.LateMask || s.Allowed != nil) {
			n++
		}
	}
	p.allowed = p.allowed[:0]
	return n
}

// supplyOffsets lays out b's masks for gollm_supply_allowed in p.allowed (each distinct
// one once) and returns each of the call's sequences' offset there, -1 for none: the rows
// of proposals verified on the GPU (n is b's sequence count) take none.
func (p *stepPrep) supplyOffsets(b *engine.Batch, n, words int) []int32 {
	p.allowed = p.allowed[:0]
	clear(p.shared)
	p.shared = p.shared[:0]
	p.offs = p.offs[:0]
	for i := range n {
		off, rows := int32(-1), 1
		if i < len(p.rows) {
			rows = p.rows[i]
		}
		if b != nil && rows == 1 {
			if s := &b.Seqs[i]; s.Sample && s.Allowed != nil {
				off = int32(p.allow(s.Allowed, words))
			}
		}
		p.offs = append(p.offs, off)
		for range rows - 1 {
			p.offs = append(p.offs, -1)
		}
	}
	return p.offs
}

// launchOnHost runs a launch that cannot wait in the library — several calls, fed from a
// launch on the host, or proposals whose logits the host verifies: every launch before it is
// waited for, fed tokens are taken from the previous one's outputs, and the batch runs
// now; its outcome waits in the queue.
func (e *Engine) launchOnHost(b *engine.Batch, parts [][]piece, fed bool, prev *launchRec) error {
	for _, r := range e.queue {
		e.finish(r)
	}
	outs, err := e.runOnHost(b, parts, fed, prev)
	e.queue = append(e.queue, &launchRec{outs: outs, err: err})
	return nil
}

// runOnHost runs b now, its fed tokens taken from prev's outputs (every launch before it
// waited for).
func (e *Engine) runOnHost(b *engine.Batch, parts [][]piece, fed bool, prev *launchRec) ([]engine.Output, error) {
	run := b
	if fed {
		if prev.err != nil {
			return nil, fmt.Errorf("cuda: the iteration this one is fed from failed: %w", prev.err)
		}
		c := &engine.Batch{Seqs: slices.Clone(b.Seqs), BlockCopies: b.BlockCopies}
		for i := range c.Seqs {
			s := &c.Seqs[i]
			if s.Feed == 0 {
				continue
			}
			if s.Feed > len(prev.outs) || prev.outs[s.Feed-1].Token < 0 {
				return nil, fmt.Errorf("cuda: sequence %d: Feed = %d names no sampled sequence of the %d launched before", s.ID, s.Feed, len(prev.outs))
			}
			t := prev.outs[s.Feed-1].Token
			s.Tokens = []int32{t}
			s.History = append(slices.Clone(s.History[:len(s.History)-1]), t)
			s.Feed = 0
		}
		run = c
	}
	return e.stepParts(run, parts)
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
// A launch still waiting for its masks is dropped with an error (the caller drains the
// pipe after a failure).
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
	if r.late {
		// Its masks never came (the caller drains after a failure): the library's launch is
		// completed without them, so that the library waits for nothing, and dropped; the
		// host's never ran.
		r.late, r.hostRun = false, nil
		if r.async {
			if err := e.supply(r, nil); err == nil {
				e.finish(r)
			}
			r.async = false
		}
		return nil, errors.New("cuda: Wait for a launch whose masks never came (SupplyMasks)")
	}
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
	for i, first := range p.first {
		d := &p.seqs[first]
		o := &outs[i]
		if p.rows[i] > 1 {
			p.acceptRows(first, p.rows[i], o, p.ids[first])
			continue
		}
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
			o.Token, o.LogProb = p.outTok[first], p.outLP[first]
			o.Err = maskedErr(o, p.ids[first])
		}
	}
}

// The GPU engine overlaps on its own, guided rows included.
var (
	_ engine.Pipeliner  = (*Engine)(nil)
	_ engine.LateMasker = (*Engine)(nil)
)

package cuda

/*
#include <stdlib.h>
#include "trampoline.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"go.uber.org/zap"

	"gollm/engine"
	"gollm/model"
)

// TPEngine is a model split over several GPUs of this process by tensor parallelism
// (Megatron's split, model.ShardWeights): engine.Engine, engine.Pipeliner and
// engine.Recoverer over one Engine per rank, each on its share of the weights and its GPU,
// driven by a goroutine locked to its OS thread. Every call runs on all ranks at once —
// their collectives (NCCL all-reduces after the embedding and each layer's attention and
// MLP, an all-gather of the LM head's vocabulary rows) pair up on the GPUs — and returns
// rank 0's outputs: every rank computes the same logits and samples the same tokens, so
// the tokens fed on the GPU (Launch) agree without a broadcast. The batch manager and the
// KV block tables are shared: each rank's pool holds its KV heads' share of every block.
//
// A rank that fails may leave the others waiting inside a collective for it. After a
// rank's error the others get tpGrace to return; those still out then wait for
// collectives that will not come, and the communicators are aborted (their calls
// return, the step fails with every rank's error, and the engine is lost: Recover says
// so). When every rank returns, the step fails with their errors and Recover resets each
// rank, as on one GPU (a rank whose CUDA context is lost aborts the communicators then).
type TPEngine struct {
	// lib is the library in use.
	lib *lib
	// comm are the ranks' communicators (the creator's reference, released by Close).
	comm *C.gollm_comm
	// ranks are the ranks' engines; workers run their calls, one per rank.
	ranks   []*Engine
	workers []*rankWorker
	// devices are the ranks' CUDA ordinals.
	devices []int
	// info describes the whole model over the (shared) block tables.
	info engine.Info
	// check validates batches once, before they go to the ranks.
	check *engine.BatchChecker
	// log receives the engine's messages.
	log *zap.Logger
	// grace is how long the ranks may take to return after one failed (and Recover's
	// resets in all) before the communicators are aborted.
	grace time.Duration
	// mu serialises the calls; closed and lost are guarded by it.
	mu     sync.Mutex
	closed bool
	// lost is set once the communicators were aborted: every later call fails with it.
	lost error
	// stuck marks ranks whose call never returned after the abort (fanOut): Close leaves
	// them.
	stuck []bool
	// abortStuck is set when the communicators' abort itself did not return within
	// tpAbandon: Close then leaves every rank and the communicators.
	abortStuck bool
}

// tpGrace is TPEngine.grace: a rank returns within a step's time of another's failure
// (most failures arise on every rank alike, or after the rank's collectives), so ranks
// still out after this long wait for a collective that will not come.
const tpGrace = 30 * time.Second

// rankWorker runs one rank's calls on a goroutine locked to its OS thread.
type rankWorker struct {
	jobs chan func()
}

func startWorker() *rankWorker {
	w := &rankWorker{jobs: make(chan func())}
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for f := range w.jobs {
			f()
		}
	}()
	return w
}

// RankError is one tensor-parallel rank's error.
type RankError struct {
	// Rank and Size place the rank; Device is its CUDA ordinal.
	Rank, Size, Device int
	// Err is what the rank's call returned.
	Err error
}

func (e *RankError) Error() string {
	return fmt.Sprintf("tensor parallel rank %d of %d (GPU %d): %v", e.Rank, e.Size, e.Device, e.Err)
}

func (e *RankError) Unwrap() error { return e.Err }

// rankOutcome is what one rank's call returned.
type rankOutcome struct {
	outs []engine.Output
	err  error
	// stuck is set for a rank that had not returned tpAbandon after the abort: its call
	// (and its worker) are left running.
	stuck bool
}

// tpAbandon is how long ranks may take to return after the communicators' abort released
// their collectives; a rank still out then is stuck elsewhere (a GPU that stopped
// answering) and is left.
const tpAbandon = 30 * time.Second

// fanOut runs call for every one of n ranks at once (run hands rank r's function to its
// worker) and returns their outcomes. Once a rank has failed, abort is called (once) if
// some rank has not returned within grace (0: at once); with deadline > 0 also if some
// rank has not returned that long after the start. Aborting the communicators is what
// returns a rank waiting for collectives that will not come; ranks still out abandon
// after it are marked stuck. It reports which rank's failure led to the abort (-1: none;
// n when the deadline passed with no failure).
func fanOut(n int, run func(r int, f func()), call func(r int) ([]engine.Output, error),
	abort func(cause error), grace, deadline, abandon time.Duration) (outs []rankOutcome, abortedBy int) {
	type done struct {
		r int
		rankOutcome
	}
	ch := make(chan done, n) // a stuck rank's late outcome lands here unread
	for r := range n {
		run(r, func() {
			o, err := call(r)
			ch <- done{r, rankOutcome{outs: o, err: err}}
		})
	}
	outs = make([]rankOutcome, n)
	back := make([]bool, n)
	abortedBy = -1
	var graceC, deadC, abandonC <-chan time.Time
	timer := func(d time.Duration) <-chan time.Time {
		t := time.NewTimer(d)
		return t.C
	}
	if deadline > 0 {
		deadC = timer(deadline)
	}
	armed := false
	first := -1
	aborted := func(cause error) {
		abort(cause)
		abandonC = timer(abandon)
	}
	for got := 0; got < n; {
		select {
		case d := <-ch:
			got++
			back[d.r] = true
			outs[d.r] = d.rankOutcome
			if d.err != nil && first < 0 {
				first = d.r
			}
			if first >= 0 && !armed && got < n {
				armed = true
				graceC = timer(grace)
			}
		case <-graceC:
			graceC = nil
			if abortedBy < 0 {
				abortedBy = first
				aborted(fmt.Errorf("%d of %d ranks did not return within %v of rank %d's error: %w", n-got, n, grace, first, outs[first].err))
			}
		case <-deadC:
			deadC = nil
			if abortedBy < 0 {
				abortedBy = n
				if first >= 0 {
					abortedBy = first
				}
				aborted(fmt.Errorf("%d of %d ranks did not return within %v", n-got, n, deadline))
			}
		case <-abandonC:
			for r := range n {
				if !back[r] {
					outs[r] = rankOutcome{stuck: true, err: fmt.Errorf("no return %v after the NCCL communicators' abort: the rank's GPU is left as it is", abandon)}
				}
			}
			return outs, abortedBy
		}
	}
	return outs, abortedBy
}

// rankErrs joins ranks' errors with "; " (errors.Join's newlines read badly in a
// response's message).
type rankErrs []error

func (e rankErrs) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e rankErrs) Unwrap() []error { return e }

// NewTensorParallel loads ckpt's shares onto devices (rank r on devices[r]) and makes a
// tensor-parallel engine of them (NewTensorParallelEngine); the weights go with it.
// opts.Device is not used.
func NewTensorParallel(ckpt *model.Checkpoint, devices []int, opts Options) (*TPEngine, error) {
	if ckpt == nil {
		return nil, errors.New("cuda: NewTensorParallel: nil checkpoint")
	}
	if _, err := ckpt.Config.Parallel(len(devices), opts.ExpertParallel); err != nil {
		return nil, fmt.Errorf("cuda: %s: %w", ckpt.Dir, err)
	}
	ws := make([]*Weights, len(devices))
	defer func() {
		for _, w := range ws {
			if w != nil {
				w.Release() // the engines hold their own references
			}
		}
	}()
	for r, d := range devices {
		o := opts
		o.Device = d
		w, err := LoadShard(ckpt, len(devices), r, o)
		if err != nil {
			return nil, fmt.Errorf("cuda: tensor parallel rank %d (GPU %d): %w", r, d, err)
		}
		ws[r] = w
	}
	return NewTensorParallelEngine(ws, opts)
}

// NewTensorParallelEngine makes the engine of a model split over len(ws) GPUs: ws[r] is
// rank r's share (LoadShard) on its GPU. It creates the GPUs' NCCL communicators (NCCL is
// opened here: without it this fails, naming what was tried) and every rank's engine at
// once — their KV pools get the same blocks, the fewest any GPU can hold. Engines on the
// same shares may share them, as NewEngine's do; opts.Device is not used.
func NewTensorParallelEngine(ws []*Weights, opts Options) (*TPEngine, error) {
	opts = opts.withDefaults()
	n := len(ws)
	// One share runs the tensor-parallel path on one GPU, over an NCCL communicator of one
	// rank: not a way to serve (NewEngine runs one GPU without NCCL), but it puts the
	// collectives, the vocabulary join and the ranks' meeting points to work where a
	// machine has only one GPU.
	if n < 1 {
		return nil, fmt.Errorf("cuda: NewTensorParallelEngine: %d shares; want at least 1", n)
	}
	devices := make([]int, n)
	for r, w := range ws {
		switch {
		case w == nil:
			return nil, fmt.Errorf("cuda: NewTensorParallelEngine: rank %d has no weights", r)
		case w.tpSize != n || w.tpRank != r:
			return nil, fmt.Errorf("cuda: NewTensorParallelEngine: share %d is rank %d of %d, want rank %d of %d", r, w.tpRank, w.tpSize, r, n)
		case w.lib != ws[0].lib:
			return nil, errors.New("cuda: NewTensorParallelEngine: the shares were loaded through different libraries")
		case w.dir != ws[0].dir || w.dtype != ws[0].dtype:
			return nil, fmt.Errorf("cuda: NewTensorParallelEngine: share %d is of %s (%s), share 0 of %s (%s)", r, w.dir, w.dtype, ws[0].dir, ws[0].dtype)
		case w.ep != ws[0].ep:
			return nil, fmt.Errorf("cuda: NewTensorParallelEngine: share %d's experts are split with expert parallelism %v, share 0's %v", r, w.ep, ws[0].ep)
		}
		devices[r] = w.device
	}
	for r, w := range ws {
		if w.ptr == nil {
			return nil, fmt.Errorf("cuda: NewTensorParallelEngine: rank %d has no weights", r)
		}
	}
	l := ws[0].lib
	cdev := make([]C.int32_t, n)
	for r, d := range devices {
		cdev[r] = C.int32_t(d)
	}
	var comm *C.gollm_comm
	var st C.gollm_status
	nl := ncclPath()
	defer C.free(unsafe.Pointer(nl))
	if err := statusErr("gollm_comm_create_all", C.call_comm_create_all(l.commCreateAll, C.int32_t(n), &cdev[0], nl, &comm, &st), &st); err != nil {
		return nil, fmt.Errorf("cuda: tensor parallelism over GPUs %v: %w", devices, err)
	}
	t := &TPEngine{lib: l, comm: comm, devices: devices, log: opts.Logger, grace: tpGrace,
		ranks: make([]*Engine, n), workers: make([]*rankWorker, n), stuck: make([]bool, n)}
	for r := range n {
		t.workers[r] = startWorker()
	}
	// Every rank's engine at once: creation agrees on the KV pool, then its warm-up runs
	// collectives. Any failure aborts the communicators, so that no rank waits for
	// another that will not come.
	outs, by := fanOut(n, t.run, func(r int) ([]engine.Output, error) {
		e, err := newEngine(ws[r], opts, comm)
		t.ranks[r] = e
		return nil, err
	}, func(cause error) { t.abort(cause) }, 0, 0, tpAbandon)
	t.noteStuck(outs)
	if err := t.rankErrors(outs, by); err != nil {
		t.shut()
		return nil, fmt.Errorf("cuda: tensor parallelism over GPUs %v: %w", devices, err)
	}
	info := t.ranks[0].info
	for r, e := range t.ranks {
		if e.info.NumBlocks != info.NumBlocks {
			t.shut()
			return nil, fmt.Errorf("cuda: tensor parallelism over GPUs %v: rank %d has %d KV blocks, rank 0 %d (the ranks' creation should have agreed)", devices, r, e.info.NumBlocks, info.NumBlocks)
		}
	}
	info.KVHeads = ws[0].cfg.KVHeads
	t.info = info
	t.check = engine.NewBatchChecker(info, "cuda")
	var weights, kv int64
	for _, e := range t.ranks {
		weights += e.WeightBytes
		kv += e.KVBytes
	}
	t.log.Info("gpu tensor parallel engine ready", zap.Ints("gpus", devices), zap.String("device", t.ranks[0].DeviceName),
		zap.Int("kv_blocks", info.NumBlocks), zap.Int64("weight_bytes", weights), zap.Int64("kv_bytes", kv))
	return t, nil
}

// run hands f to rank r's worker.
func (t *TPEngine) run(r int, f func()) { t.workers[r].jobs <- f }

// noteStuck records the ranks a call left stuck.
func (t *TPEngine) noteStuck(outs []rankOutcome) {
	for r, o := range outs {
		if o.stuck {
			t.stuck[r] = true
			t.log.Error("a tensor parallel rank did not return after the NCCL communicators' abort; its engine is left", zap.Int("rank", r), zap.Int("gpu", t.devices[r]))
		}
	}
}

// abort aborts the communicators (once) and marks the engine lost.
func (t *TPEngine) abort(cause error) {
	if t.lost != nil || t.comm == nil {
		return
	}
	t.lost = fmt.Errorf("cuda: the tensor parallel engine over GPUs %v is lost (its NCCL communicators were aborted after: %w)", t.devices, cause)
	// The abort waits inside NCCL for the ranks' work to end; should it never return, the
	// engine is lost all the same and its caller goes on (the call is left running).
	comm, ccause := t.comm, C.CString(cause.Error())
	returned, err := within(tpAbandon, func() error {
		defer C.free(unsafe.Pointer(ccause))
		var st C.gollm_status
		return statusErr("gollm_comm_abort", C.call_comm_abort(t.lib.commAbort, comm, ccause, &st), &st)
	})
	switch {
	case !returned:
		t.abortStuck = true
		t.log.Error("aborting the NCCL communicators did not return: the instance's GPUs are left as they are until the server restarts",
			zap.Ints("gpus", t.devices), zap.Duration("waited", tpAbandon))
	case err != nil:
		t.log.Error("aborting the NCCL communicators failed", zap.Ints("gpus", t.devices), zap.Error(err))
	}
	t.log.Error("tensor parallel engine lost: NCCL communicators aborted", zap.Ints("gpus", t.devices), zap.Error(cause))
}

// within runs call on a goroutine of its own and waits up to limit for it: true and its
// error, or false and nil when it had not returned (it is left running).
func within(limit time.Duration, call func() error) (returned bool, err error) {
	done := make(chan error, 1)
	go func() { done <- call() }()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case err := <-done:
		return true, err
	case <-t.C:
		return false, nil
	}
}

// rankErrors is the error of a call's outcomes: nil when every rank succeeded; the one
// error, marked as every rank's, when all failed alike; else each failing rank's, the one
// whose failure aborted the communicators (by, or -1) first — the others' errors after it
// are mostly the abort's.
func (t *TPEngine) rankErrors(outs []rankOutcome, by int) error {
	var errs rankErrs
	same := true
	for r, o := range outs {
		if o.err == nil {
			same = false
			continue
		}
		if outs[0].err == nil || o.err.Error() != outs[0].err.Error() {
			same = false
		}
		re := &RankError{Rank: r, Size: len(outs), Device: t.devices[r], Err: o.err}
		if r == by {
			errs = append(rankErrs{re}, errs...)
		} else {
			errs = append(errs, re)
		}
	}
	switch {
	case len(errs) == 0:
		return nil
	case same && by < 0:
		return fmt.Errorf("%w (on every one of the %d tensor-parallel ranks)", outs[0].err, len(outs))
	case same:
		return fmt.Errorf("%w (every one of the %d ranks failed alike)", errs[0], len(outs))
	case len(errs) == 1:
		return errs[0]
	}
	return errs
}

// each runs call on every rank and returns rank 0's outputs, or the ranks' errors (with
// the communicators aborted when ranks stayed out: fanOut; deadline as fanOut's).
func (t *TPEngine) each(call func(e *Engine) ([]engine.Output, error), deadline time.Duration) ([]engine.Output, error) {
	outs, by := fanOut(len(t.ranks), t.run, func(r int) ([]engine.Output, error) { return call(t.ranks[r]) },
		func(cause error) { t.abort(cause) }, t.grace, deadline, tpAbandon)
	t.noteStuck(outs)
	if err := t.rankErrors(outs, by); err != nil {
		return nil, err
	}
	return outs[0].outs, nil
}

// enter takes the engine for a call, failing when it is closed or lost.
func (t *TPEngine) enter(op string) error {
	t.mu.Lock()
	switch {
	case t.closed:
		t.mu.Unlock()
		return fmt.Errorf("cuda: %s on a closed engine", op)
	case t.lost != nil:
		err := t.lost
		t.mu.Unlock()
		return err
	}
	return nil
}

// Info describes the whole model and the KV pool's blocks (each rank holds its KV
// heads' share of every block).
func (t *TPEngine) Info() engine.Info { return t.info }

// Size is the number of ranks (GPUs).
func (t *TPEngine) Size() int { return len(t.ranks) }

// Devices returns each rank's GPU (its memory as at the engine's creation).
func (t *TPEngine) Devices() []DeviceInfo {
	d := make([]DeviceInfo, len(t.ranks))
	for r, e := range t.ranks {
		d[r] = e.Device
	}
	return d
}

// Memory returns rank r's device memory in use: its share of the weights, its KV pool and
// its scratch buffers.
func (t *TPEngine) Memory(r int) (weights, kv, scratch int64) {
	e := t.ranks[r]
	return e.WeightBytes, e.KVBytes, e.ScratchBytes
}

// DeviceName is rank 0's GPU's name.
func (t *TPEngine) DeviceName() string { return t.ranks[0].DeviceName }

// Step runs one iteration on every rank (engine.Engine).
func (t *TPEngine) Step(b *engine.Batch) ([]engine.Output, error) {
	if err := t.enter("Step"); err != nil {
		return nil, err
	}
	defer t.mu.Unlock()
	if b == nil {
		return nil, errors.New("cuda: Step: nil batch")
	}
	if _, err := t.check.Check(b); err != nil {
		return nil, err
	}
	return t.each(func(e *Engine) ([]engine.Output, error) { return e.Step(b) }, 0)
}

// Launch starts one iteration on every rank (engine.Pipeliner): each rank's fed
// sequences read its own previous launch's tokens, which are every rank's.
func (t *TPEngine) Launch(b *engine.Batch) error {
	if err := t.enter("Launch"); err != nil {
		return err
	}
	defer t.mu.Unlock()
	if b == nil {
		return errors.New("cuda: Launch: nil batch")
	}
	if _, err := t.check.CheckLaunch(b); err != nil {
		return err
	}
	outs, by := fanOut(len(t.ranks), t.run, func(r int) ([]engine.Output, error) { return nil, t.ranks[r].Launch(b) },
		func(cause error) { t.abort(cause) }, t.grace, 0, tpAbandon)
	t.noteStuck(outs)
	err := t.rankErrors(outs, by)
	if err != nil && by < 0 {
		// Ranks that launched wait for collectives the failed ranks never enqueued.
		for _, o := range outs {
			if o.err == nil {
				t.abort(fmt.Errorf("the ranks' launches disagreed: %w", err))
				break
			}
		}
	}
	return err
}

// Wait returns the oldest launched iteration's outputs, rank 0's (engine.Pipeliner).
func (t *TPEngine) Wait() ([]engine.Output, error) {
	if err := t.enter("Wait"); err != nil {
		return nil, err
	}
	defer t.mu.Unlock()
	return t.each(func(e *Engine) ([]engine.Output, error) { return e.Wait() }, 0)
}

// Recover readies every rank after a failed iteration (engine.Recoverer); an engine whose
// communicators were aborted, or a rank whose CUDA context is lost, cannot be.
func (t *TPEngine) Recover(cause error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return errors.New("cuda: Recover on a closed engine")
	case t.lost != nil:
		return t.lost
	}
	// A reset waits for the rank's stream: one held by a collective that will not come
	// does not return by itself.
	_, err := t.each(func(e *Engine) ([]engine.Output, error) { return nil, e.Recover(cause) }, t.grace)
	if err != nil && t.lost == nil {
		t.abort(err)
	}
	if t.lost != nil {
		return t.lost
	}
	return err
}

// Close frees every rank's engine, then the communicators.
func (t *TPEngine) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	t.shut()
	return nil
}

// shut destroys the ranks' engines (each on its worker), releases the communicators and
// stops the workers.
func (t *TPEngine) shut() {
	if t.abortStuck {
		// Engines and communicators wait on the GPUs' work the abort could not end.
		for r := range t.stuck {
			t.stuck[r] = true
		}
		t.comm = nil
	}
	var wg sync.WaitGroup
	for r, e := range t.ranks {
		if e == nil || t.stuck[r] {
			continue
		}
		wg.Add(1)
		t.run(r, func() {
			defer wg.Done()
			_ = e.Close()
		})
	}
	wg.Wait()
	if t.comm != nil {
		C.call_comm_release(t.lib.commRelease, t.comm)
		t.comm = nil
	}
	for r, w := range t.workers {
		if !t.stuck[r] {
			close(w.jobs)
		}
	}
}

// String names the engine for logs: its GPUs.
func (t *TPEngine) String() string {
	s := make([]string, len(t.devices))
	for i, d := range t.devices {
		s[i] = fmt.Sprint(d)
	}
	return "tensor parallel engine on GPUs " + strings.Join(s, ",")
}

var (
	_ engine.Engine    = (*TPEngine)(nil)
	_ engine.Pipeliner = (*TPEngine)(nil)
	_ engine.Recoverer = (*TPEngine)(nil)
)

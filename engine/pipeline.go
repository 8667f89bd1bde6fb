package engine

import (
	"errors"
	"fmt"
	"slices"
)

// SyncPipeline gives an engine without an overlap of its own the Pipeliner contract:
// Launch runs the iteration at once with Step, resolving each fed token from the
// previous launch's outputs, and Wait hands the outputs back in launch order. Nothing
// overlaps; it lets the batch manager's overlap schedule run on any engine (the CPU
// engine, and tests), with the tokens it would have given without it.
type SyncPipeline struct {
	// eng runs the iterations.
	eng Engine
	// queue are the outputs (or errors) launched and not waited for, oldest first.
	queue []syncResult
	// last are the outputs of the latest launch, for the next launch's feeds.
	last []Output
	// lastOK says last holds a successful launch's outputs.
	lastOK bool
	// batch and toks are Launch's scratch: b with its feeds resolved; failed are its
	// fed sequences whose predecessors failed.
	batch  Batch
	toks   []int32
	failed []fedFailure
}

// syncResult is one launched iteration's outcome.
type syncResult struct {
	outs []Output
	err  error
}

// NewSyncPipeline wraps eng.
func NewSyncPipeline(eng Engine) *SyncPipeline { return &SyncPipeline{eng: eng} }

// Launch runs b now (Pipeliner).
func (p *SyncPipeline) Launch(b *Batch) error {
	if len(p.queue) >= 2 {
		return errors.New("engine: Launch with two iterations waiting")
	}
	run := b
	if slices.ContainsFunc(b.Seqs, func(s Sequence) bool { return s.Feed != 0 }) {
		if len(p.queue) == 0 || !p.lastOK {
			p.push(nil, errors.New("engine: a fed sequence without a waiting predecessor that succeeded"))
			return nil
		}
		p.batch.BlockCopies = b.BlockCopies
		p.batch.Seqs = append(p.batch.Seqs[:0], b.Seqs...)
		p.toks = slices.Grow(p.toks[:0], len(b.Seqs))[:len(b.Seqs)]
		p.failed = p.failed[:0]
		for i := range p.batch.Seqs {
			s := &p.batch.Seqs[i]
			if s.Feed == 0 {
				continue
			}
			if s.Feed > len(p.last) || p.last[s.Feed-1].Token < 0 && p.last[s.Feed-1].Err == nil {
				p.push(nil, fmt.Errorf("engine: sequence %d: Feed = %d names no sampled sequence of the %d before it", s.ID, s.Feed, len(p.last)))
				return nil
			}
			if len(s.Tokens) != 1 {
				p.push(nil, fmt.Errorf("engine: sequence %d: a fed sequence has %d new tokens, want 1", s.ID, len(s.Tokens)))
				return nil
			}
			p.toks[i] = p.last[s.Feed-1].Token
			if prev := p.last[s.Feed-1].Err; prev != nil {
				// Its predecessor failed alone: the row runs on a placeholder token, for
				// nothing, and fails as its predecessor did.
				p.toks[i] = 0
				p.failed = append(p.failed, fedFailure{i, prev})
			}
			s.Tokens = p.toks[i : i+1 : i+1]
			s.History = append(s.History[:len(s.History)-1:len(s.History)-1], p.toks[i])
			s.Feed = 0
		}
		run = &p.batch
	}
	outs, err := p.eng.Step(run)
	if err == nil {
		for _, f := range p.failed {
			outs[f.seq] = Output{Token: -1, Err: f.err}
		}
	}
	p.failed = p.failed[:0]
	p.push(outs, err)
	return nil
}

// fedFailure is a fed sequence whose predecessor failed alone.
type fedFailure struct {
	// seq is its index in the batch.
	seq int
	// err is the predecessor's Output.Err.
	err error
}

// push queues one outcome and remembers it for the next launch's feeds.
func (p *SyncPipeline) push(outs []Output, err error) {
	p.queue = append(p.queue, syncResult{outs, err})
	p.last, p.lastOK = outs, err == nil
}

// Wait returns the oldest launched iteration's outputs (Pipeliner).
func (p *SyncPipeline) Wait() ([]Output, error) {
	if len(p.queue) == 0 {
		return nil, errors.New("engine: Wait with no iteration launched")
	}
	r := p.queue[0]
	p.queue = append(p.queue[:0], p.queue[1:]...)
	return r.outs, r.err
}

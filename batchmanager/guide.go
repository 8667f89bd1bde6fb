package batchmanager

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"gollm/engine"
)

// Guided decoding. A request with a constraint (InferenceRequest.Guide) has, per
// branch, a place in it (guide.State), advanced by every token the branch takes. Each
// iteration, before the engine runs, the rows that choose a token under a constraint
// get the mask of the tokens it allows (engine.Sequence.Allowed) — end tokens only
// where the text may end, and only tokens that leave the text finishable within the
// request's token budget — which every engine applies after its other masks. A branch
// whose text is complete ends at once, without a step for its end token.
//
// The masks are made on the host between the step that chose the tokens and the step
// that uses them, spread over the cores. Requests with a constraint are therefore not
// run in the overlap schedule (Config.Overlap): a row launched before its
// predecessor's token is read would have no mask (overlap.go).

// ErrGuide wraps a request's failure under its constraint: the constraint allows no
// token (the vocabulary lacks the bytes it needs next) or passes a limit at run time.
var ErrGuide = errors.New("guided decoding")

// guideJob is one row that samples under a constraint.
type guideJob struct {
	r   *request
	b   *branch
	s   *engine.Sequence
	err error
}

// guideMasks fills the Allowed mask of the rows of seqs that choose a token under a
// constraint (an engine-sampled row that samples, or a host-sampled one that returns
// its logits).
func (m *Manager) guideMasks(seqs []engine.Sequence, refs []seqRef) {
	jobs := m.guideJobs[:0]
	for i, ref := range refs {
		b := ref.b
		b.allowed = nil
		if ref.r.req.Guide == nil {
			continue
		}
		s := &seqs[i]
		if s.Sample || ref.r.hostSampled() && s.ReturnLogits {
			jobs = append(jobs, guideJob{r: ref.r, b: b, s: s})
		} else {
			s.Allowed = nil
		}
	}
	m.guideJobs = jobs[:0]
	if len(jobs) == 0 {
		return
	}
	defer clear(jobs)
	workers := min(runtime.GOMAXPROCS(0), (len(jobs)+3)/4)
	if workers <= 1 {
		for k := range jobs {
			m.guideMask(&jobs[k])
		}
	} else {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for k := next.Add(1) - 1; k < int64(len(jobs)); k = next.Add(1) - 1 {
					m.guideMask(&jobs[k])
				}
			})
		}
		wg.Wait()
	}
	for _, j := range jobs {
		if j.err != nil && j.r.failed == nil {
			j.r.failed = j.err
		}
	}
}

// guideMask makes one row's mask. A failure (j.err) fails the request; its row runs
// unconstrained, for nothing.
func (m *Manager) guideMask(j *guideJob) {
	r, b, s := j.r, j.b, j.s
	s.Allowed = nil
	words := engine.MaskWords(m.info.VocabSize)
	if len(b.mask) != words {
		b.mask = make([]uint64, words)
	}
	// The tokens the branch may still take, this one included.
	budget := min(r.maxNew-b.generated, m.info.MaxSeqLen-len(b.tokens))
	n, err := b.gst.Mask(b.mask, budget)
	if err != nil {
		j.err = fmt.Errorf("%w: %w", ErrGuide, err)
		return
	}
	if !b.gst.Accepting() {
		// An end token that is also text (a custom end_id) ends nothing here.
		for _, id := range r.req.EndIDs {
			if b.mask[id>>6]&(1<<(uint(id)&63)) != 0 {
				b.mask[id>>6] &^= 1 << (uint(id) & 63)
				n--
			}
		}
	} else {
		for _, id := range r.req.EndIDs {
			if b.mask[id>>6]&(1<<(uint(id)&63)) == 0 {
				b.mask[id>>6] |= 1 << (uint(id) & 63)
				n++
			}
		}
		if n == 0 {
			// No end token to end with (end_id -1) and no room for more: go on unbudgeted.
			n, err = b.gst.Mask(b.mask, -1)
			if err != nil {
				j.err = fmt.Errorf("%w: %w", ErrGuide, err)
				return
			}
		}
	}
	if n == 0 {
		j.err = fmt.Errorf("%w: no token of the vocabulary can continue the constrained text after %d generated tokens", ErrGuide, b.generated)
		return
	}
	s.Allowed, b.allowed = b.mask, b.mask
}

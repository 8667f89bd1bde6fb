package batchmanager

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"gollm/engine"
	"gollm/guide"
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
// that samples with them, spread over the cores. In the overlap schedule (Config.Overlap)
// a guided row is launched before its predecessor's token is read, without its mask
// (engine.Sequence.LateMask), on an engine that takes masks late (engine.LateMasker):
// the mask is made once that token is applied and handed over while the engine runs the
// row's forward pass (overlap.go's lateMasks).

// ErrGuide wraps a request's failure under its constraint: the constraint allows no
// token (the vocabulary lacks the bytes it needs next) or passes a limit at run time.
var ErrGuide = errors.New("guided decoding")

// guideJob is one row that samples under a constraint.
type guideJob struct {
	r   *request
	b   *branch
	s   *engine.Sequence
	err error
	// key names the row's mask among the shared ones when shared is set (maskKey); the
	// job that makes it (lead) stores it in Manager.masks, the others wait for it.
	key    maskKey
	shared bool
	lead   bool
}

// maskKey names a mask that rows in the same place of the same constraint share: a
// place whose mask is its automaton state's table alone (guide.State.MaskKey), with the
// request's end tokens (at most two; requests with more make their own).
type maskKey struct {
	g     *guide.Guide
	state uint64
	ends  [2]int32
}

// maxSharedMasks bounds Manager.masks, and maxMaskGuides the constraints it holds masks
// of (each keeps its guide, and the guide's tables, alive); past either the cache starts
// again. A step without a guided row empties it.
const (
	maxSharedMasks = 256
	maxMaskGuides  = 16
)

// guideMasks fills the Allowed mask of the rows of seqs that choose a token under a
// constraint (an engine-sampled row that samples, or a host-sampled one that returns
// its logits). A row whose mask is its constraint state's alone gets that state's mask,
// made once and shared by every such row (the engine then also uploads it once); the
// others are made for their rows, spread over the cores.
func (m *Manager) guideMasks(seqs []engine.Sequence, refs []seqRef) {
	jobs := m.guideJobs[:0]
	pending := 0
	for i, ref := range refs {
		b := ref.b
		b.allowed = nil
		if ref.r.req.Guide == nil {
			continue
		}
		s := &seqs[i]
		if !(s.Sample || ref.r.hostSampled() && s.ReturnLogits) {
			s.Allowed = nil
			continue
		}
		j := guideJob{r: ref.r, b: b, s: s}
		m.shareMask(&j)
		if j.shared && !j.lead {
			if mask := m.masks[j.key]; mask != nil {
				s.Allowed, b.allowed = mask, mask
				continue
			}
			// Another row of this step makes it (nil: being made).
		}
		if !j.shared || j.lead {
			pending++
		}
		jobs = append(jobs, j)
	}
	m.guideJobs = jobs[:0]
	if len(jobs) == 0 {
		if m.masks != nil && !slices.ContainsFunc(refs, func(ref seqRef) bool { return ref.r.req.Guide != nil }) {
			m.dropMasks()
		}
		return
	}
	defer clear(jobs)
	run := func(k int) {
		if j := &jobs[k]; !j.shared || j.lead {
			m.guideMask(j)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), (pending+3)/4)
	if workers <= 1 {
		for k := range jobs {
			run(k)
		}
	} else {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for k := next.Add(1) - 1; k < int64(len(jobs)); k = next.Add(1) - 1 {
					run(int(k))
				}
			})
		}
		wg.Wait()
	}
	for k := range jobs {
		j := &jobs[k]
		switch {
		case j.lead && j.err == nil:
			m.masks[j.key] = j.s.Allowed
		case j.lead:
			delete(m.masks, j.key)
		}
	}
	for k := range jobs {
		if j := &jobs[k]; j.shared && !j.lead {
			// Its lead made the mask this step (or failed, and so does it).
			if mask := m.masks[j.key]; mask != nil {
				j.s.Allowed, j.b.allowed = mask, mask
			} else {
				j.s.Allowed, j.err = nil, fmt.Errorf("%w: the constraint allows no token here", ErrGuide)
			}
		}
	}
	for _, j := range jobs {
		if j.err != nil && j.r.failed == nil {
			j.r.failed = j.err
		}
	}
}

// shareMask sets j.key and j.shared when j's row can take a shared mask, and j.lead when
// no mask of that key exists or is being made yet (it is then marked as being made).
func (m *Manager) shareMask(j *guideJob) {
	r, b := j.r, j.b
	if len(r.req.EndIDs) > 2 {
		return
	}
	key, ok, err := b.gst.MaskKey(m.guideBudget(r, b))
	if err != nil || !ok {
		return // Mask meets the error again, in its job
	}
	j.key = maskKey{g: r.req.Guide, state: key, ends: [2]int32{-1, -1}}
	copy(j.key.ends[:], r.req.EndIDs)
	j.shared = true
	if !slices.Contains(m.maskGuides, j.key.g) {
		if len(m.maskGuides) == maxMaskGuides {
			m.dropMasks()
		}
		m.maskGuides = append(m.maskGuides, j.key.g)
	}
	if m.masks == nil || len(m.masks) >= maxSharedMasks {
		m.masks = make(map[maskKey][]uint64)
	}
	if _, ok := m.masks[j.key]; !ok {
		// nil marks it as being made by this job.
		m.masks[j.key] = nil
		j.lead = true
		return
	}
}

// dropMasks empties the shared masks, holding none of their guides.
func (m *Manager) dropMasks() {
	clear(m.maskGuides)
	m.masks, m.maskGuides = nil, m.maskGuides[:0]
}

// guideBudget is the tokens b may still take, the one being chosen included.
func (m *Manager) guideBudget(r *request, b *branch) int {
	return min(r.maxNew-b.generated, m.info.MaxSeqLen-len(b.tokens))
}

// guideMask makes one row's mask. A failure (j.err) fails the request; its row runs
// unconstrained, for nothing.
func (m *Manager) guideMask(j *guideJob) {
	r, b, s := j.r, j.b, j.s
	s.Allowed = nil
	words := engine.MaskWords(m.info.VocabSize)
	if j.lead || len(b.mask) != words {
		// A shared mask is the cache's from now on, never written again.
		b.mask = make([]uint64, words)
	}
	budget := m.guideBudget(r, b)
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
	if j.lead {
		b.mask = nil
	}
}

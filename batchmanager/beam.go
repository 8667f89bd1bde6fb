package batchmanager

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"gollm/engine"
)

// Beam search runs in the manager, on any engine: each beam is a sequence whose last
// position's logits the engine returns (Sequence.ReturnLogits, after the embedding
// bias), and the manager scores them with the engine's rules — penalties and masks
// (engine.Sampler.Process), the temperature when one is set, then log-softmax — and
// selects the next beams as TensorRT-LLM's beam search kernels do (after transformers'
// BeamSearchScorer):
//
//   - each live beam proposes its 2W best continuations (W: the beam width), scored by
//     the beam's cumulative log-probability plus the token's; a continuation's rank k
//     among its beam's (from 0) adds DiversityRate × k to the key it is ranked by (not
//     to its score);
//   - the 2W best keys of all beams are visited in order: an end token among the first
//     W finishes its beam as a hypothesis, scored cum / length^LengthPenalty (length:
//     the generated tokens with the end token); when W hypotheses are kept a better
//     one replaces the worst, and a worse one stops the visit under EarlyStopping 1;
//     other tokens continue as the next live beams until W are chosen;
//   - the search is done when W hypotheses are kept and EarlyStopping is 1, or, under
//     other values, when the worst hypothesis is at least the best live beam's score
//     at its length now (or at MaxNewTokens under "never" with a positive length
//     penalty) — transformers' heuristic; a search done this way returns its
//     hypotheses. At the length limit the live beams among the step's first W
//     candidates compete with the hypotheses for the W places.
//
// testdata/beam-golden.json holds transformers 5.17's beams for the tiny LLaMA-family
// and GPT-2 checkpoints (no end token, an end token under the heuristic, early
// stopping with a length penalty): executor/beam_hf_test.go wants the same beams, in the
// same order, with the same scores.
//
// A beam that generates a stop word or a stop string finishes as a hypothesis with its
// tokens. Beams fork from their parents' KV blocks (kvcache.Sequence.Fork); a child
// that writes into a block its parent shares gets a copy (engine.Batch.BlockCopies).
//
// Cost on the GPU: every beam's logits row (vocabulary × 4 bytes, 200 KB for GPT-2) is
// copied to the host each step and scored there (scoreBeams spreads the rows over the
// cores), and a beam step cannot replay a CUDA graph (it returns logits); the README's
// Performance section has what that costs. A top-2W selection on the GPU would copy 2W
// (token, score) pairs per beam instead — about 64 bytes at width 4 — and keep decode
// steps in graphs; the host work (a pass over the vocabulary per beam) would go too.

// beamSearch is a beam request's search state.
type beamSearch struct {
	// hyps are the finished hypotheses, at most the beam width, best first.
	hyps []hyp
	// cands is scratch for the candidates of a step.
	cands []beamCand
}

// hyp is a finished beam.
type hyp struct {
	// tokens are its generated tokens (the end token excluded).
	tokens []int32
	// logProbs are their log-probabilities (an end token's last).
	logProbs []float32
	// cum ranks the hypothesis before the length penalty.
	cum float32
	// score is cum after the length penalty.
	score float32
	// finish is why it ended.
	finish FinishReason
}

// beamCand is one continuation of a live beam.
type beamCand struct {
	// beam is the parent's index in the request's branches.
	beam int
	// tok extends the parent beam.
	tok int32
	// lp is tok's log-probability under the parent's distribution.
	lp float32
	// cum is the parent's cumulative log-probability plus lp.
	cum float32
	// key ranks the candidates: cum plus the diversity term.
	key float32
}

// lengthPenalty is TensorRT-LLM's applyLengthPenalty: score / length^penalty.
func lengthPenalty(cum float32, length int, penalty float32) float32 {
	if penalty == 0 || length <= 0 {
		return cum
	}
	return float32(float64(cum) / math.Pow(float64(length), float64(penalty)))
}

// addHyp keeps a finished beam if there is room or it beats the worst kept one; it
// reports whether it was kept.
func (s *beamSearch) addHyp(h hyp, width int) bool {
	if len(s.hyps) == width {
		if h.score <= s.hyps[width-1].score {
			return false
		}
		s.hyps = s.hyps[:width-1]
	}
	i, _ := slices.BinarySearchFunc(s.hyps, h.score, func(x hyp, sc float32) int {
		// Best first; a new hypothesis goes after those of equal score.
		if x.score >= sc {
			return -1
		}
		return 1
	})
	s.hyps = slices.Insert(s.hyps, i, h)
	return true
}

// beamStep scores the live beams' logits and selects the next beams (see the top of
// this file). The first step starts from the prompt's logits alone.
func (m *Manager) beamStep(r *request) {
	W := r.width
	s := r.search
	s.cands = s.cands[:0]
	beams := r.branches()
	for i, b := range beams {
		w := b.logits
		b.logits = nil
		switch {
		case w == nil:
			r.failed = fmt.Errorf("%w: beam %d has no logits", ErrInternal, i)
			return
		case b.masked:
			r.failed = fmt.Errorf("%w: beam %d: %w", ErrInvalidRequest, i, engine.ErrAllMasked)
			return
		}
		for k, c := range b.top {
			cum := b.cumLogProb + c.lp
			s.cands = append(s.cands, beamCand{beam: i, tok: c.tok, lp: c.lp, cum: cum, key: cum + r.req.DiversityRate*float32(k)})
		}
	}
	slices.SortStableFunc(s.cands, func(a, b beamCand) int {
		switch {
		case a.key > b.key:
			return -1
		case a.key < b.key:
			return 1
		}
		return 0
	})
	top := s.cands[:min(len(s.cands), 2*W)]
	m.it.genTokens += len(beams)
	m.tokenTimes(r)

	genLen := r.generated + 1 // every live beam has generated as many tokens
	var next []beamCand
	// topW counts the next beams that rank among the first W candidates: at the length
	// limit only those compete with the hypotheses (the rest are spares, as in
	// transformers).
	topW := 0
	for i, c := range top {
		if slices.Contains(r.req.EndIDs, c.tok) {
			if i >= W {
				continue
			}
			p := beams[c.beam]
			h := hyp{tokens: p.tokens[r.promptLen:len(p.tokens):len(p.tokens)], cum: c.cum,
				logProbs: append(slices.Clip(p.logProbs), c.lp), score: lengthPenalty(c.cum, genLen, r.req.LengthPenalty), finish: FinishedEndID}
			if !s.addHyp(h, W) && r.req.EarlyStopping == 1 {
				break
			}
			continue
		}
		next = append(next, c)
		if i < W {
			topW++
		}
		if len(next) == W {
			break
		}
	}
	done := len(next) == 0
	if len(s.hyps) == W {
		if r.req.EarlyStopping == 1 {
			done = true
		} else if len(next) > 0 {
			// transformers' heuristic: the best live beam, at its length now (or at the
			// length limit under "never" with a positive penalty), cannot beat the
			// worst hypothesis.
			l := genLen
			if r.req.EarlyStopping != 0 && r.req.LengthPenalty > 0 {
				l = r.maxNew
			}
			done = s.hyps[W-1].score >= lengthPenalty(next[0].cum, l, r.req.LengthPenalty)
		}
	}

	// The next beams, each a fork of its parent; then the parents go.
	children := make([]*branch, 0, len(next))
	for k, c := range next {
		p := beams[c.beam]
		kv, err := p.kv.Fork()
		if err != nil {
			r.failed = fmt.Errorf("%w: fork a beam: %w", ErrInternal, err)
			return
		}
		toks := make([]int32, len(p.tokens), len(p.tokens)+1+max(0, r.maxNew-p.generated-1))
		copy(toks, p.tokens)
		b := &branch{tokens: append(toks, c.tok), kv: kv, computed: p.computed, generated: p.generated + 1,
			cumLogProb: c.cum, logProbs: append(slices.Clone(p.logProbs), c.lp), index: k, seed: p.seed, topP: p.topP,
			sent: p.sent, gst: p.gst}
		children = append(children, b)
		if r.req.Guide != nil {
			if b.gst, err = p.gst.Advance(c.tok); err != nil {
				for _, ch := range children {
					_ = ch.kv.Release()
				}
				r.failed = fmt.Errorf("%w: guided decoding: %w", ErrEngine, err)
				return
			}
		}
	}
	for _, p := range beams {
		if p.kv != nil {
			_ = p.kv.Release()
			p.kv = nil
		}
	}
	live := children[:0]
	atLimit := false
	for _, b := range children {
		m.checkStop(r, b)
		switch {
		case !b.ended && r.req.Guide != nil && b.gst.Done():
			// The text is complete: a finished beam, as at an end token.
			s.addHyp(hyp{tokens: b.tokens[r.promptLen:], logProbs: b.logProbs, cum: b.cumLogProb,
				score: lengthPenalty(b.cumLogProb, b.generated, r.req.LengthPenalty), finish: FinishedEndID}, W)
			_ = b.kv.Release()
			b.kv = nil
		case b.ended && b.finish == FinishedStopWord:
			s.addHyp(hyp{tokens: b.tokens[r.promptLen:], logProbs: b.logProbs, cum: b.cumLogProb,
				score: lengthPenalty(b.cumLogProb, b.generated, r.req.LengthPenalty), finish: FinishedStopWord}, W)
			_ = b.kv.Release()
			b.kv = nil
		case b.ended:
			done = true // the length limit: every live beam is as long
			atLimit = true
			live = append(live, b)
		default:
			live = append(live, b)
		}
	}
	if len(live) == 0 {
		done = true
	}
	if done {
		for _, b := range live {
			// Live beams become hypotheses only at the length limit, and only those
			// among the step's first W candidates; a search that stopped early (W
			// hypotheses kept, none to beat) returns its hypotheses, as transformers.
			if atLimit && b.index < topW {
				s.addHyp(hyp{tokens: b.tokens[r.promptLen:], logProbs: b.logProbs, cum: b.cumLogProb,
					score: lengthPenalty(b.cumLogProb, b.generated, r.req.LengthPenalty), finish: FinishedLength}, W)
			}
			if b.kv != nil {
				_ = b.kv.Release()
				b.kv = nil
			}
		}
		r.complete = true
	}
	// The embedded branch is the first beam (or, with none left, an empty husk).
	if len(live) > 0 {
		r.branch = *live[0]
		r.forks = live[1:]
	} else {
		r.branch = branch{tokens: r.tokens[:r.promptLen:r.promptLen], generated: genLen, sent: r.sent}
		r.forks = nil
	}
	r.forked = true
	r.all = append(r.all[:1], r.forks...)
	if !done {
		return
	}
	r.generated = genLen
}

// beamJob is one beam's logits row to score.
type beamJob struct {
	r *request
	b *branch
}

// beamScorer scores rows on one goroutine: its own sampler and top-k scratch.
type beamScorer struct {
	sampler *engine.Sampler
	top     []tokLP
}

// minParallelBeamFloats is the step's beam logits (rows × vocabulary) above which
// scoreBeams spreads the rows over goroutines: below it, starting them costs more
// than it saves.
const minParallelBeamFloats = 1 << 18

// scoreBeams scores the logits rows of every beam search of the step before the
// searches select their beams (beamStep): each row's penalties and masks, temperature
// and log-softmax, and its best 2W tokens. A step of 64 beams over GPT-2's vocabulary
// is 3.2 M exponentials, too many for one core between two steps, so the rows are
// spread over the machine's cores. The logits post-processor runs first, on the manager's
// goroutine, as for sampled requests; the results do not depend on the spreading.
func (m *Manager) scoreBeams() {
	jobs := m.beamJobs[:0]
	for _, r := range m.sched {
		if !r.beams || r.failed != nil || r.logits == nil || !(r.forked || r.computed == r.promptLen) {
			continue
		}
		for _, b := range r.branches() {
			if b.logits == nil {
				break // beamStep reports it
			}
			if pp := r.req.LogitsPostProcessor; pp != nil {
				if err := m.callPostProcessor(pp, r.id, b.logits, b.tokens); err != nil {
					r.failed = fmt.Errorf("%w: %w", ErrEngine, err)
					break
				}
			}
			jobs = append(jobs, beamJob{r: r, b: b})
		}
	}
	m.beamJobs = jobs[:0]
	if len(jobs) == 0 {
		return
	}
	defer clear(jobs) // hold no request past the step
	workers := 1
	if len(jobs)*m.info.VocabSize >= minParallelBeamFloats {
		workers = min(runtime.GOMAXPROCS(0), len(jobs))
	}
	for len(m.beamScorers) < workers {
		m.beamScorers = append(m.beamScorers, &beamScorer{sampler: engine.NewSampler(m.info.VocabSize)})
	}
	if workers == 1 {
		for _, j := range jobs {
			m.beamScorers[0].score(j)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for _, sc := range m.beamScorers[:workers] {
		wg.Go(func() {
			for k := next.Add(1) - 1; k < int64(len(jobs)); k = next.Add(1) - 1 {
				sc.score(jobs[k])
			}
		})
	}
	wg.Wait()
}

// score fills j's branch's top and masked from its logits row (in place).
func (sc *beamScorer) score(j beamJob) {
	r, b := j.r, j.b
	scale := 1.0
	if t := r.sampling.Temperature; t > 0 {
		scale = 1 / float64(t)
	}
	seq := engine.Sequence{Sampling: r.sampling, History: b.tokens, NumGenerated: b.generated, Allowed: b.allowed}
	sc.sampler.Process(b.logits, &seq)
	b.masked = !engine.LogSoftmax(b.logits, b.logits, scale)
	b.top = b.top[:0]
	if !b.masked {
		b.top = append(b.top, topK(b.logits, 2*r.width, &sc.top)...)
	}
}

// tokLP is a token with its log-probability.
type tokLP struct {
	// tok could continue the beam.
	tok int32
	// lp is its log-probability.
	lp float32
}

// topK returns the k best entries of w (ties: the lower token first), best first, in
// *scratch.
func topK(w []float32, k int, scratch *[]tokLP) []tokLP {
	c := (*scratch)[:0]
	worse := func(a, b tokLP) bool { return a.lp < b.lp || (a.lp == b.lp && a.tok > b.tok) }
	for i, l := range w {
		if math.IsInf(float64(l), -1) {
			continue
		}
		x := tokLP{int32(i), l}
		if len(c) < k {
			c = append(c, x)
			// Keep the worst at the end once full: a simple insertion keeps c sorted.
			for j := len(c) - 1; j > 0 && worse(c[j-1], c[j]); j-- {
				c[j-1], c[j] = c[j], c[j-1]
			}
			continue
		}
		if !worse(c[k-1], x) {
			continue
		}
		c[k-1] = x
		for j := k - 1; j > 0 && worse(c[j-1], c[j]); j-- {
			c[j-1], c[j] = c[j], c[j-1]
		}
	}
	*scratch = c
	return c
}

// beamResult is a beam request's response: streaming, every generated token of the
// current beams (final: the finished beams); otherwise the finished beams, each with
// the prompt unless excluded. Every response carries the best NumReturnSequences (or
// all) of its beams, the streamed ones too, as TensorRT-LLM's (getNumReturnBeams).
func (m *Manager) beamResult(r *request, final bool) Result {
	var beams []BeamResult
	if final {
		n := len(r.search.hyps)
		if k := r.req.NumReturnSequences; k > 0 && k < n {
			n = k
		}
		for _, h := range r.search.hyps[:n] {
			toks := h.tokens
			if !r.req.Streaming && !r.req.ExcludeInputInOutput {
				toks = append(slices.Clone(r.tokens[:r.promptLen]), h.tokens...)
			}
			br := BeamResult{Tokens: toks, CumLogProb: h.cum, Score: h.score, Finish: h.finish}
			if r.req.ReturnLogProbs {
				br.LogProbs = h.logProbs
			}
			beams = append(beams, br)
		}
	} else {
		// The live beams are in the order the search ranked them, best first.
		for _, b := range r.branches() {
			if b.kv == nil && !b.ended {
				continue
			}
			if k := r.req.NumReturnSequences; k > 0 && len(beams) == k {
				break
			}
			br := BeamResult{Tokens: b.tokens[r.promptLen:len(b.tokens):len(b.tokens)], CumLogProb: b.cumLogProb,
				Score: b.cumLogProb}
			if r.req.ReturnLogProbs {
				br.LogProbs = b.logProbs
			}
			beams = append(beams, br)
		}
	}
	res := Result{Beams: beams, PromptLen: r.promptLen, Generated: r.generated}
	if len(beams) > 0 {
		res.Tokens, res.Length, res.CumLogProb, res.LogProbs = beams[0].Tokens, len(beams[0].Tokens), beams[0].CumLogProb, beams[0].LogProbs
		if final {
			res.Finish = beams[0].Finish
		}
	}
	if r.ctxLogits != nil {
		res.ContextLogits = r.ctxLogits
		r.ctxSent = true
	}
	res.Perf = m.perf(r)
	return res
}

package cuda

/*
#include "trampoline.h"
*/
import "C"

import (
	"fmt"
	"slices"
	"unsafe"

	"gollm/engine"
)

// piece is a run of one sequence's new tokens handled by one library call.
type piece struct {
	// seq is the index in Batch.Seqs.
	seq int
	// from and to bound the run within the sequence's Tokens.
	from, to int
	// last is set on the run that ends the sequence's Tokens: it samples and returns
	// the last position's logits.
	last bool
	// rows says its proposals are verified in rows on the GPU (verifiesOnGPU).
	rows bool
}

// splitBatch cuts b into library calls of at most maxTokens tokens and maxSeqs
// sequences, in order; a prompt too long for one call is split into chunks. A sequence
// whose proposals are verified in rows on the GPU (verifiesOnGPU) is never split: it
// takes Draft+1 of a call's sequences and tokens, one a row.
func splitBatch(b *engine.Batch, maxTokens, maxSeqs int) [][]piece {
	var parts [][]piece
	var cur []piece
	curTok, curSeqs := 0, 0
	for si := range b.Seqs {
		sq := &b.Seqs[si]
		n := len(sq.Tokens)
		if verifiesOnGPU(sq, maxTokens, maxSeqs) {
			if curSeqs+n > maxSeqs || curTok+n > maxTokens {
				parts = append(parts, cur)
				cur, curTok, curSeqs = nil, 0, 0
			}
			cur = append(cur, piece{seq: si, from: 0, to: n, last: true, rows: true})
			curTok += n
			curSeqs += n
			continue
		}
		for from := 0; from < n; {
			if curSeqs == maxSeqs || curTok == maxTokens {
				parts = append(parts, cur)
				cur, curTok, curSeqs = nil, 0, 0
			}
			k := min(n-from, maxTokens-curTok)
			cur = append(cur, piece{seq: si, from: from, to: from + k, last: from+k == n})
			curTok += k
			curSeqs++
			from += k
		}
	}
	if len(cur) > 0 {
		parts = append(parts, cur)
	}
	return parts
}

// verifiesOnGPU says whether sq's proposals are verified as rows sampled on the GPU:
// each of its last Draft+1 positions a sequence of one token of its own (over the same
// block table, GOLLM_SEQ_CHAINED), sampled as a step of one token would sample it, so
// that the step is a decode step (its graph replayed) and only the tokens come back.
// That is Verify's rule wherever the proposals are certain (no DraftProbs, or greedy);
// proposals drawn from a distribution (speculative sampling) and rows whose logits are
// asked for come back as logits for the host to verify (verifyDrafts).
func verifiesOnGPU(sq *engine.Sequence, maxTokens, maxSeqs int) bool {
	p := &sq.Sampling
	return sq.Draft > 0 && sq.Sample && !sq.ReturnLogits && !sq.ContextLogits && !sq.ReturnHidden &&
		sq.Allowed == nil && !sq.LateMask && sq.Feed == 0 &&
		(sq.DraftProbs == nil || p.Temperature == 0 || p.TopK == 1) &&
		len(sq.Tokens) == sq.Draft+1 && len(sq.History) >= sq.Draft &&
		sq.Draft+1 <= maxSeqs && sq.Draft+1 <= maxTokens
}

// stepPrep holds the flat arrays of one library call, reused between steps.
type stepPrep struct {
	// seqs are the per-sequence descriptors.
	seqs []C.gollm_seq
	// ids are the sequence IDs, for error messages.
	ids []uint64
	// tokens, blocks: new tokens and block tables of all sequences.
	tokens, blocks []int32
	// penTok and penCnt are the distinct history tokens with their counts.
	penTok, penCnt []int32
	// masks are the tokens to mask (min length, bad words).
	masks []int32
	// bias holds the embedding biases.
	bias []float32
	// allowed holds guided decoding's bitmasks, 32-bit words.
	allowed []uint32
	// shared are the masks of allowed by their Go slices, so that rows given the same
	// mask (the batch manager's shared masks of one constraint state) upload it once.
	shared []sharedMask
	// offs are a late launch's rows' mask offsets (SupplyMasks).
	offs []int32
	// logitsLen is the number of floats of returned logits.
	logitsLen int
	// outTok and outLP receive the sampled tokens and log-probabilities.
	outTok []int32
	outLP  []float32
	// hist counts a history's tokens for the penalties.
	hist engine.TokenCounts
	// copies are the call's KV block copies, (src, dst) pairs.
	copies []int32
	// feed is, for a launched call, each sequence's fed row of the call before (-1:
	// none); empty when no sequence is fed.
	feed []int32
	// first and rows are, for each piece of the call, its first sequence in seqs and how
	// many it has there: Draft+1 for proposals verified in rows on the GPU, else 1.
	first, rows []int
	// chained says some piece's proposals are verified in rows (rows > 1).
	chained bool
}

// init sizes the per-vocabulary buffers.
func (p *stepPrep) init(vocab int) {
	p.hist = engine.NewTokenCounts(vocab)
}

// build fills the arrays for the pieces of one call.
func (p *stepPrep) build(b *engine.Batch, part []piece, info engine.Info) {
	T, V := info.TokensPerBlock, info.VocabSize
	p.seqs, p.ids = p.seqs[:0], p.ids[:0]
	p.tokens, p.blocks = p.tokens[:0], p.blocks[:0]
	p.penTok, p.penCnt, p.masks, p.bias = p.penTok[:0], p.penCnt[:0], p.masks[:0], p.bias[:0]
	p.allowed = p.allowed[:0]
	clear(p.shared)
	p.shared = p.shared[:0]
	p.logitsLen = 0
	p.first, p.rows, p.chained = p.first[:0], p.rows[:0], false
	for _, pc := range part {
		sq := &b.Seqs[pc.seq]
		p.first = append(p.first, len(p.seqs))
		if pc.rows {
			p.buildRows(sq, T, V)
			p.rows = append(p.rows, sq.Draft+1)
			p.chained = true
			continue
		}
		p.rows = append(p.rows, 1)
		n := pc.to - pc.from
		pos := sq.Pos + pc.from
		need := (pos + n + T - 1) / T
		d := C.gollm_seq{
			token_offset: C.int32_t(len(p.tokens)), token_count: C.int32_t(n), pos: C.int32_t(pos),
			block_offset: C.int32_t(len(p.blocks)), block_count: C.int32_t(need),
			logits_offset: C.int64_t(p.logitsLen), bias_offset: -1, allowed_offset: -1,
		}
		p.tokens = append(p.tokens, sq.Tokens[pc.from:pc.to]...)
		p.blocks = append(p.blocks, sq.Blocks[:need]...)
		if sq.Draft > 0 {
			// Proposals to verify (engine.Sequence.Draft): every row's logits come back and
			// the host verifies them (verifyDrafts); nothing is sampled on the GPU.
			d.flags |= C.GOLLM_SEQ_CONTEXT_LOGITS
			p.logitsLen += n * V
			p.seqs = append(p.seqs, d)
			p.ids = append(p.ids, sq.ID)
			continue
		}
		if sq.ContextLogits {
			d.flags |= C.GOLLM_SEQ_CONTEXT_LOGITS
			p.logitsLen += n * V
		}
		if pc.last && sq.ReturnLogits {
			d.flags |= C.GOLLM_SEQ_RETURN_LOGITS
			p.logitsLen += V
		}
		sp := &sq.Sampling
		if pc.last && (sq.Sample || sq.ReturnLogits) && len(sp.EmbeddingBias) > 0 {
			d.bias_offset = C.int32_t(len(p.bias))
			p.bias = append(p.bias, sp.EmbeddingBias...)
		}
		if pc.last && sq.Sample {
			p.sampling(&d, sq, V)
		}
		p.seqs = append(p.seqs, d)
		p.ids = append(p.ids, sq.ID)
	}
	p.outTok = slices.Grow(p.outTok[:0], len(p.seqs))[:len(p.seqs)]
	p.outLP = slices.Grow(p.outLP[:0], len(p.seqs))[:len(p.seqs)]
}

// sampling fills d's sampling fields from sq, which samples after its last new token.
func (p *stepPrep) sampling(d *C.gollm_seq, sq *engine.Sequence, V int) {
	sp := &sq.Sampling
	d.flags |= C.GOLLM_SEQ_SAMPLE
	d.temperature = C.float(sp.Temperature)
	d.top_k = C.int32_t(sp.TopK)
	d.top_p = C.float(sp.TopP)
	d.repetition_penalty = C.float(sp.RepetitionPenalty)
	d.presence_penalty = C.float(sp.PresencePenalty)
	d.frequency_penalty = C.float(sp.FrequencyPenalty)
	d.uniform = C.double(engine.Uniform(sp.Seed, sq.NumGenerated))
	d.penalty_offset = C.int32_t(len(p.penTok))
	if (sp.RepetitionPenalty != 0 && sp.RepetitionPenalty != 1) || sp.PresencePenalty != 0 || sp.FrequencyPenalty != 0 {
		p.hist.Each(sq.History, func(t, n int32) {
			p.penTok = append(p.penTok, t)
			p.penCnt = append(p.penCnt, n)
		})
	}
	d.penalty_count = C.int32_t(len(p.penTok) - int(d.penalty_offset))
	d.mask_offset = C.int32_t(len(p.masks))
	p.masks = engine.AppendMasks(p.masks, sq)
	d.mask_count = C.int32_t(len(p.masks) - int(d.mask_offset))
	d.min_p = C.float(sp.MinP)
	if sq.Allowed != nil {
		d.allowed_offset = C.int32_t(p.allow(sq.Allowed, (V+31)/32))
	}
}

// buildRows lays out sq's verification (verifiesOnGPU): row i (0 ≤ i ≤ Draft) is a
// sequence of one token, Tokens[i] at Pos+i, over sq's blocks, sampled as Verify's row i
// is — History's first len(History)-Draft+i tokens, NumGenerated+i — so that its token is
// the one a step of one token would sample there. The rows share one copy of the
// embedding bias.
func (p *stepPrep) buildRows(sq *engine.Sequence, T, V int) {
	k := sq.Draft
	bias := int32(-1)
	if len(sq.Sampling.EmbeddingBias) > 0 {
		bias = int32(len(p.bias))
		p.bias = append(p.bias, sq.Sampling.EmbeddingBias...)
	}
	row := *sq
	for i := 0; i <= k; i++ {
		pos := sq.Pos + i
		need := (pos + 1 + T - 1) / T
		d := C.gollm_seq{
			token_offset: C.int32_t(len(p.tokens)), token_count: 1, pos: C.int32_t(pos),
			block_offset: C.int32_t(len(p.blocks)), block_count: C.int32_t(need),
			logits_offset: C.int64_t(p.logitsLen), bias_offset: C.int32_t(bias), allowed_offset: -1,
			flags: C.GOLLM_SEQ_CHAINED,
		}
		p.tokens = append(p.tokens, sq.Tokens[i])
		p.blocks = append(p.blocks, sq.Blocks[:need]...)
		row.History = sq.History[:len(sq.History)-k+i]
		row.NumGenerated = sq.NumGenerated + i
		p.sampling(&d, &row, V)
		p.seqs = append(p.seqs, d)
		p.ids = append(p.ids, sq.ID)
	}
}

// acceptRows fills o from the tokens sampled at the rows of a verification starting at
// p.seqs[first]: the proposals up to the first that differs from the token sampled at
// its position, then that token (Verify's rule for certain proposals). A row with every
// token masked (-2) ends it; at the first row it is the sequence's failure.
func (p *stepPrep) acceptRows(first, rows int, o *engine.Output, id uint64) {
	o.Tokens = make([]int32, 0, rows)
	o.LogProbs = make([]float32, 0, rows)
	o.Logits, o.ContextLogits = nil, nil
	for i := range rows {
		t := p.outTok[first+i]
		if t == -2 {
			if i == 0 {
				o.Token, o.LogProb, o.Tokens, o.LogProbs = -1, 0, nil, nil
				o.Err = fmt.Errorf("cuda: sequence %d: %w", id, engine.ErrAllMasked)
				return
			}
			break
		}
		o.Tokens = append(o.Tokens, t)
		o.LogProbs = append(o.LogProbs, p.outLP[first+i])
		if i == rows-1 || t != p.tokens[p.seqs[first+i+1].token_offset] {
			break
		}
	}
	o.Token, o.LogProb, o.Err = o.Tokens[0], o.LogProbs[0], nil
}

// collect moves one call's results into outs. Logits slices share the call's buffer,
// each capped at its own length; context logits of a prompt split over calls are joined.
// With logits nil (a tensor-parallel rank past 0) only the tokens are collected.
func (p *stepPrep) collect(b *engine.Batch, part []piece, logits []float32, outs []engine.Output, V int) {
	for i, pc := range part {
		sq := &b.Seqs[pc.seq]
		o := &outs[pc.seq]
		if p.rows[i] > 1 {
			p.acceptRows(p.first[i], p.rows[i], o, sq.ID)
			continue
		}
		off := int(p.seqs[p.first[i]].logits_offset)
		if (sq.ContextLogits || sq.Draft > 0) && logits != nil {
			n := (pc.to - pc.from) * V
			rows := logits[off : off+n : off+n]
			if pc.from == 0 && pc.last {
				o.ContextLogits = rows
			} else {
				o.ContextLogits = append(o.ContextLogits, rows...)
			}
			off += n
		}
		if !pc.last || sq.Draft > 0 {
			continue
		}
		o.Token = -1
		if sq.ReturnLogits && logits != nil {
			o.Logits = logits[off : off+V : off+V]
		}
		if sq.Sample {
			o.Token, o.LogProb = p.outTok[p.first[i]], p.outLP[p.first[i]]
			o.Err = maskedErr(o, sq.ID)
		}
	}
}

// sharedMask is a mask placed in stepPrep.allowed.
type sharedMask struct {
	// first is the mask's first word (its identity).
	first *uint64
	// off is its offset in allowed.
	off int
}

// allow places mask (engine.Sequence.Allowed) in p.allowed as words 32-bit words and
// returns their offset: once per distinct mask of the call. The 64-bit words go over as
// they lie in memory, which on the little-endian hosts Go and CUDA share is the 32-bit
// words' order, low half first.
func (p *stepPrep) allow(mask []uint64, words int) int {
	first := &mask[0]
	for _, m := range p.shared {
		if m.first == first {
			return m.off
		}
	}
	off := len(p.allowed)
	p.allowed = append(p.allowed, unsafe.Slice((*uint32)(unsafe.Pointer(first)), 2*len(mask))[:words]...)
	p.shared = append(p.shared, sharedMask{first, off})
	return off
}

// maskedErr turns a sampled token of -2 (every token masked, gollm_step_out.tokens)
// into the sequence's own failure; nil otherwise.
func maskedErr(o *engine.Output, id uint64) error {
	if o.Token != -2 {
		return nil
	}
	o.Token, o.LogProb = -1, 0
	return fmt.Errorf("cuda: sequence %d: %w", id, engine.ErrAllMasked)
}

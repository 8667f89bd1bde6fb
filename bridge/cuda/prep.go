package cuda

/*
#include "trampoline.h"
*/
import "C"

import (
	"fmt"
	"slices"

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
}

// splitBatch cuts b into library calls of at most maxTokens tokens and maxSeqs
// sequences, in order; a prompt too long for one call is split into chunks.
func splitBatch(b *engine.Batch, maxTokens, maxSeqs int) [][]piece {
	var parts [][]piece
	var cur []piece
	curTok := 0
	for si := range b.Seqs {
		n := len(b.Seqs[si].Tokens)
		for from := 0; from < n; {
			if len(cur) == maxSeqs || curTok == maxTokens {
				parts = append(parts, cur)
				cur, curTok = nil, 0
			}
			k := min(n-from, maxTokens-curTok)
			cur = append(cur, piece{seq: si, from: from, to: from + k, last: from+k == n})
			curTok += k
			from += k
		}
	}
	if len(cur) > 0 {
		parts = append(parts, cur)
	}
	return parts
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
	p.logitsLen = 0
	for _, pc := range part {
		sq := &b.Seqs[pc.seq]
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
				// The library's words are 32 bits: each 64-bit word's low half first.
				d.allowed_offset = C.int32_t(len(p.allowed))
				for i := range (V + 31) / 32 {
					p.allowed = append(p.allowed, uint32(sq.Allowed[i/2]>>(32*(i%2))))
				}
			}
		}
		p.seqs = append(p.seqs, d)
		p.ids = append(p.ids, sq.ID)
	}
	p.outTok = slices.Grow(p.outTok[:0], len(part))[:len(part)]
	p.outLP = slices.Grow(p.outLP[:0], len(part))[:len(part)]
}

// collect moves one call's results into outs. Logits slices share the call's buffer,
// each capped at its own length; context logits of a prompt split over calls are joined.
// With logits nil (a tensor-parallel rank past 0) only the tokens are collected.
func (p *stepPrep) collect(b *engine.Batch, part []piece, logits []float32, outs []engine.Output, V int) {
	for i, pc := range part {
		sq := &b.Seqs[pc.seq]
		o := &outs[pc.seq]
		off := int(p.seqs[i].logits_offset)
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
			o.Token, o.LogProb = p.outTok[i], p.outLP[i]
			o.Err = maskedErr(o, sq.ID)
		}
	}
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

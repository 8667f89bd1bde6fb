package engine

import "fmt"

// BatchChecker validates the structure of batches against an engine's model and KV pool
// before any of them runs — new tokens in the vocabulary, positions in the model, block
// tables inside the pool and not shared by two writers — with the same rules and
// messages for every engine, in time proportional to the new tokens and blocks. A
// request's settings and history are the batch manager's to validate, once, when it
// admits the request (SamplingParams.Validate); they are not checked again each step.
// It keeps scratch space between calls, so an engine holds one and uses it from its Step
// goroutine only.
type BatchChecker struct {
	// info is the model and pool the batches must fit.
	info Info
	// prefix starts every error ("engine", "cuda").
	prefix string
	// blockSeq and blockStep detect two sequences writing one KV block in a step.
	blockSeq, blockStep []int
	// blockMark detects a block listed twice in one block table.
	blockMark []int
	// stepNo and seqNo number the checks, so the marks need no clearing.
	stepNo, seqNo int
}

// NewBatchChecker returns a checker for info; its errors start with prefix.
func NewBatchChecker(info Info, prefix string) *BatchChecker {
	return &BatchChecker{info: info, prefix: prefix,
		blockSeq: make([]int, info.NumBlocks), blockStep: make([]int, info.NumBlocks), blockMark: make([]int, info.NumBlocks)}
}

// Check validates every sequence of b and returns the number of new tokens. Its errors
// name the sequence ID and the rule broken. Fed sequences (Sequence.Feed) are refused:
// Step has no predecessor to feed from.
func (c *BatchChecker) Check(b *Batch) (int, error) { return c.check(b, false) }

// CheckLaunch is Check for Pipeliner.Launch: fed sequences are allowed.
func (c *BatchChecker) CheckLaunch(b *Batch) (int, error) { return c.check(b, true) }

func (c *BatchChecker) check(b *Batch, allowFeed bool) (int, error) {
	c.stepNo++
	T, V := c.info.TokensPerBlock, c.info.VocabSize
	if len(b.BlockCopies) > 0 {
		if len(b.Seqs) == 0 {
			return 0, fmt.Errorf("%s: %d block copies in a batch without sequences", c.prefix, len(b.BlockCopies))
		}
		// Marks with a number of their own: the sequences' checks below reuse blockMark.
		c.seqNo++
		for i, cp := range b.BlockCopies {
			for _, blk := range [2]int32{cp.Src, cp.Dst} {
				if blk < 0 || int(blk) >= c.info.NumBlocks {
					return 0, fmt.Errorf("%s: block copy %d (%d -> %d): block %d is outside the KV pool [0, %d)", c.prefix, i, cp.Src, cp.Dst, blk, c.info.NumBlocks)
				}
			}
			if cp.Src == cp.Dst {
				return 0, fmt.Errorf("%s: block copy %d copies block %d onto itself", c.prefix, i, cp.Src)
			}
			if c.blockMark[cp.Dst] == c.seqNo {
				return 0, fmt.Errorf("%s: block copy %d writes block %d, which an earlier copy of the batch also writes", c.prefix, i, cp.Dst)
			}
			c.blockMark[cp.Dst] = c.seqNo
		}
	}
	for _, l := range b.HiddenLayers {
		if c.info.Hidden == 0 {
			return 0, fmt.Errorf("%s: HiddenLayers: this engine does not return hidden states", c.prefix)
		}
		if l < 0 || l >= c.info.Layers {
			return 0, fmt.Errorf("%s: HiddenLayers: layer %d is outside the model's [0, %d)", c.prefix, l, c.info.Layers)
		}
	}
	n := 0
	for si := range b.Seqs {
		sq := &b.Seqs[si]
		fail := func(format string, args ...any) (int, error) {
			return 0, fmt.Errorf("%s: sequence %d: %s", c.prefix, sq.ID, fmt.Sprintf(format, args...))
		}
		if len(sq.Tokens) == 0 {
			return fail("Tokens is empty; every scheduled sequence needs at least one new token")
		}
		if sq.Feed != 0 && !allowFeed {
			return fail("Feed = %d: fed sequences need a launch (Pipeliner), not Step", sq.Feed)
		}
		if sq.Feed < 0 || sq.Feed > 0 && len(sq.Tokens) != 1 {
			return fail("Feed = %d: a fed sequence has one new token (it has %d)", sq.Feed, len(sq.Tokens))
		}
		if sq.Allowed != nil && len(sq.Allowed) != MaskWords(V) {
			return fail("Allowed has %d words, a vocabulary of %d needs %d", len(sq.Allowed), V, MaskWords(V))
		}
		if sq.ReturnHidden && len(b.HiddenLayers) == 0 {
			return fail("ReturnHidden without Batch.HiddenLayers")
		}
		if sq.Draft != 0 || sq.DraftProbs != nil {
			if err := c.checkDraft(sq); err != nil {
				return fail("%v", err)
			}
		}
		for i, t := range sq.Tokens {
			if t < 0 || int(t) >= V {
				return fail("Tokens[%d] = %d is outside the vocabulary [0, %d)", i, t, V)
			}
		}
		if sq.Pos < 0 {
			return fail("Pos = %d is negative", sq.Pos)
		}
		end := sq.Pos + len(sq.Tokens)
		if end > c.info.MaxSeqLen {
			return fail("Pos %d + %d tokens = %d exceeds the model's maximum sequence length %d", sq.Pos, len(sq.Tokens), end, c.info.MaxSeqLen)
		}
		need := (end + T - 1) / T
		if len(sq.Blocks) < need {
			return fail("block table has %d blocks, positions [0, %d) need %d of %d tokens", len(sq.Blocks), end, need, T)
		}
		c.seqNo++
		for i, blk := range sq.Blocks[:need] {
			if blk < 0 || int(blk) >= c.info.NumBlocks {
				return fail("Blocks[%d] = %d is outside the KV pool [0, %d)", i, blk, c.info.NumBlocks)
			}
			if c.blockMark[blk] == c.seqNo {
				return fail("block table lists KV block %d twice", blk)
			}
			c.blockMark[blk] = c.seqNo
		}
		for i := sq.Pos / T; i < need; i++ {
			blk := sq.Blocks[i]
			if c.blockStep[blk] == c.stepNo && c.blockSeq[blk] != si {
				return fail("writes KV block %d, which sequence %d also writes in this batch", blk, b.Seqs[c.blockSeq[blk]].ID)
			}
			c.blockStep[blk], c.blockSeq[blk] = c.stepNo, si
		}
		n += len(sq.Tokens)
	}
	return n, nil
}

// checkDraft validates a sequence's proposals (Sequence.Draft, DraftProbs).
func (c *BatchChecker) checkDraft(sq *Sequence) error {
	V := c.info.VocabSize
	switch {
	case sq.Draft < 0:
		return fmt.Errorf("%d proposed tokens (Draft) is negative", sq.Draft)
	case sq.Draft == 0:
		return fmt.Errorf("proposal distributions (DraftProbs) without proposals")
	case c.info.MaxDraft == 0:
		return fmt.Errorf("%d proposed tokens: this engine does not verify proposed tokens", sq.Draft)
	case sq.Draft > c.info.MaxDraft:
		return fmt.Errorf("%d proposed tokens exceed the engine's %d per sequence", sq.Draft, c.info.MaxDraft)
	case sq.Draft >= len(sq.Tokens):
		return fmt.Errorf("%d proposed tokens leave none of its %d tokens to verify them from", sq.Draft, len(sq.Tokens))
	case !sq.Sample || sq.ContextLogits || sq.Feed != 0:
		return fmt.Errorf("%d proposed tokens need Sample, and neither ContextLogits nor Feed", sq.Draft)
	case len(sq.History) < sq.Draft:
		return fmt.Errorf("%d proposed tokens exceed the %d tokens of History", sq.Draft, len(sq.History))
	case sq.DraftProbs != nil && len(sq.DraftProbs) != sq.Draft*V:
		return fmt.Errorf("proposal distributions (DraftProbs) hold %d values, want proposals × vocabulary = %d", len(sq.DraftProbs), sq.Draft*V)
	}
	for i, q := range sq.DraftProbs {
		if !(q >= 0 && q <= 1) {
			return fmt.Errorf("proposal distributions (DraftProbs): value %d is %g, not a probability", i, q)
		}
	}
	return nil
}

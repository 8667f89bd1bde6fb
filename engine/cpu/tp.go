package cpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"gollm/engine"
	"gollm/model"
)

// TensorParallel is the CPU engine split over ranks as tensor parallelism splits a model
// over GPUs (model.ShardWeights): the reference the GPU engine's ranks are checked
// against. Each rank is an Engine on its share of the weights, with a KV pool of its own
// KV heads under the shared block tables; a step walks the recipe, each stage on the
// ranks one after the other, and adds their partial results where GPUs all-reduce — the
// embedding's lookups, and the branch at each residual stage (a layer's attention output
// and MLP output; before its post-norm, where the layer has one) — and joins their
// vocabulary rows of the LM head's logits where GPUs gather them. Under expert parallelism
// (NewExpertParallel) each rank's mixture-of-experts stage runs its experts alone and the
// same sum after the stage joins their partial results.
type TensorParallel struct {
	// mu serialises Step and Close.
	mu sync.Mutex
	// closed is set by Close.
	closed bool
	// ranks are the shares' engines, rank order.
	ranks []*Engine
	// layout says which heads and rows each rank holds.
	layout model.TPLayout
	// cfg describes the whole model; each rank's share is in layout.
	cfg model.Config
	// info is the whole model's (its vocabulary) over the ranks' pools.
	info engine.Info
	// check validates batches as every engine does.
	check *engine.BatchChecker
	// sum is a partial result added over the ranks [N][hidden].
	sum buf
	// logits holds the needed rows' whole-vocabulary logits [M][vocab]; part is one
	// rank's rows of them [M][vocab rows].
	logits, part buf
	// samplers are per-goroutine sampling buffers.
	samplers []*engine.Sampler
}

// NewTensorParallel builds the engine of weights ws (Checkpoint.Weights) of the model
// cfg describes over n ranks, each with a KV pool of kv.
func NewTensorParallel(cfg *model.Config, ws []model.Weight, n int, kv engine.KVConfig) (*TensorParallel, error) {
	return newParallel(cfg, ws, n, false, kv)
}

// NewExpertParallel is NewTensorParallel with the experts spread whole over the ranks
// (model.Config.ExpertParallel): each rank's mixture-of-experts stages run its experts'
// (token, expert) pairs alone, weighted as the whole top-k says, and the all-reduce after
// the stage adds the ranks' partial sums.
func NewExpertParallel(cfg *model.Config, ws []model.Weight, n int, kv engine.KVConfig) (*TensorParallel, error) {
	return newParallel(cfg, ws, n, true, kv)
}

func newParallel(cfg *model.Config, ws []model.Weight, n int, experts bool, kv engine.KVConfig) (*TensorParallel, error) {
	l, err := cfg.Parallel(n, experts)
	if err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	t := &TensorParallel{layout: l, cfg: *cfg}
	for r := range n {
		share, err := model.ShardWeights(ws, cfg, l, r)
		if err != nil {
			return nil, fmt.Errorf("cpu: %w", err)
		}
		m, err := model.NewFloat32(cfg.RankConfig(l, r), share)
		if err != nil {
			return nil, fmt.Errorf("cpu: rank %d: %w", r, err)
		}
		e, err := NewFromModel(m, kv)
		if err != nil {
			return nil, fmt.Errorf("cpu: rank %d: %w", r, err)
		}
		t.ranks = append(t.ranks, e)
	}
	t.info = t.ranks[0].info
	t.info.VocabSize = cfg.VocabSize
	t.info.KVHeads = cfg.KVHeads
	// Its step has no verification rows nor hidden states: both are refused.
	t.info.MaxDraft, t.info.Hidden = 0, 0
	t.check = engine.NewBatchChecker(t.info, "cpu")
	return t, nil
}

// Info describes the whole model over the pool.
func (t *TensorParallel) Info() engine.Info { return t.info }

// Close closes every rank.
func (t *TensorParallel) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	var errs []error
	for _, e := range t.ranks {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}

// allReduce adds every rank's rows of part into sum, then adds sum to every rank's
// residual stream: what an all-reduce after a row-parallel projection does.
func (t *TensorParallel) allReduce(part func(e *Engine) [][]float32) {
	t.reduce(part)
	for _, e := range t.ranks {
		addRows(e.s.h.rows, t.sum.rows)
	}
}

// reduce adds every rank's rows of part into t.sum.
func (t *TensorParallel) reduce(part func(e *Engine) [][]float32) {
	n := len(t.ranks[0].s.rows)
	t.sum.resize(n, t.cfg.Hidden)
	clear(t.sum.data)
	for _, e := range t.ranks {
		addRows(t.sum.rows, part(e))
	}
}

// Step runs one iteration over the ranks (engine.Engine).
func (t *TensorParallel) Step(b *engine.Batch) ([]engine.Output, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errors.New("cpu: Step on a closed engine")
	}
	if b == nil {
		return nil, errors.New("cpu: Step: nil batch")
	}
	n, err := t.check.Check(b)
	if err != nil {
		return nil, err
	}
	for _, e := range t.ranks {
		e.copyBlocks(b.BlockCopies)
	}
	outs := make([]engine.Output, len(b.Seqs))
	if n == 0 {
		return outs, nil
	}
	// The recipe's stages run on every rank; a residual stage adds the ranks' branches
	// (the all-reduce) — a post-norm first sums them into every rank's branch, which it
	// normalises whole —, and the embedding and the LM head join the ranks' vocabulary rows.
	var last [][]float32
	summed := false // the branch is the ranks' sum already (a post-norm's)
	for i := range t.ranks[0].recipe {
		switch st := &t.ranks[0].recipe[i]; st.Kind {
		case model.StageEmbed:
			t.embed(b, n)
			for _, e := range t.ranks {
				e.scaleEmbeddings(st)
			}
		case model.StagePostNorm:
			t.reduce(func(e *Engine) [][]float32 { return e.s.tmp.rows })
			for _, e := range t.ranks {
				for r, row := range t.sum.rows {
					copy(e.s.tmp.rows[r], row)
				}
				e.stage(b, st)
			}
			summed = true
		case model.StageResidual:
			if summed {
				for _, e := range t.ranks {
					addRows(e.s.h.rows, e.s.tmp.rows)
				}
				summed = false
				continue
			}
			t.allReduce(func(e *Engine) [][]float32 { return e.s.tmp.rows })
		case model.StageLMHead:
			last = t.lmHead(b, outs, st)
		default:
			for _, e := range t.ranks {
				e.stage(b, st)
			}
		}
	}
	r0 := t.ranks[0]
	V := t.cfg.VocabSize
	for len(t.samplers) < runtime.GOMAXPROCS(0) {
		t.samplers = append(t.samplers, engine.NewSampler(V))
	}
	parallelFor(len(b.Seqs), 1, 1, func(w, lo, hi int) {
		for si := lo; si < hi; si++ {
			// A sequence whose token cannot be chosen fails alone (Output.Err).
			outs[si].Err = r0.finish(&b.Seqs[si], last[si], t.samplers[w], &outs[si])
		}
	})
	return outs, nil
}

// embed sets every rank's residual stream to the step's embeddings: each rank looks up
// the tokens of its vocabulary rows (rank 0 adds the positions); the sum is every
// token's row.
func (t *TensorParallel) embed(b *engine.Batch, n int) {
	for r, e := range t.ranks {
		e.embedRows(b, n, r*t.layout.VocabRows, r == 0)
	}
	for _, e := range t.ranks[1:] {
		addRows(t.ranks[0].s.h.rows, e.s.h.rows)
	}
	for _, e := range t.ranks[1:] {
		for i, row := range t.ranks[0].s.h.rows {
			copy(e.s.h.rows[i], row)
		}
	}
}

// lmHead runs the LM head st on the rows whose logits someone reads, each rank its
// vocabulary rows, normed by the norm stage before it, soft-capped where st says; it
// returns each sequence's last row of whole-vocabulary logits (nil where none is read).
func (t *TensorParallel) lmHead(b *engine.Batch, outs []engine.Output, st *model.Stage) [][]float32 {
	H, V, VR := t.cfg.Hidden, t.cfg.VocabSize, t.layout.VocabRows
	var need []int // row of the residual stream
	for si := range b.Seqs {
		sq := &b.Seqs[si]
		if sq.ContextLogits || sq.Sample || sq.ReturnLogits {
			need = append(need, si)
		}
	}
	rows := 0
	first := make([]int, len(b.Seqs)) // the sequence's first row of the step
	for si := range b.Seqs {
		first[si] = rows
		rows += len(b.Seqs[si].Tokens)
	}
	var in [][]float32
	var seqOf []int
	r0 := t.ranks[0]
	for _, si := range need {
		sq := &b.Seqs[si]
		from := first[si] + len(sq.Tokens) - 1
		if sq.ContextLogits {
			from = first[si]
		}
		for r := from; r < first[si]+len(sq.Tokens); r++ {
			x := make([]float32, H)
			r0.norm(x, r0.s.h.rows[r])
			in = append(in, x)
			seqOf = append(seqOf, si)
		}
	}
	t.logits.resize(len(in), V)
	t.part.resize(len(in), VR)
	for r, e := range t.ranks {
		e.w.lmHead.mul(t.part.rows, in, nil, &e.s.mm)
		lo, hi := r*VR, min(V, (r+1)*VR)
		for i := range in {
			copy(t.logits.rows[i][lo:hi], t.part.rows[i][:hi-lo])
		}
	}
	softcapRows(t.logits.rows, st.SoftCap)
	last := make([][]float32, len(b.Seqs))
	for i, si := range seqOf {
		sq := &b.Seqs[si]
		if sq.ContextLogits {
			outs[si].ContextLogits = append(outs[si].ContextLogits, t.logits.rows[i]...)
		}
		last[si] = t.logits.rows[i]
	}
	return last
}

// Package cpu is gollm's pure-Go reference engine: a float32 forward pass over a paged KV
// pool, and sampling, with the matmuls spread over GOMAXPROCS goroutines. It walks the
// model's recipe (model.Config.Recipe), one method a stage — LayerNorm or RMSNorm,
// learned or rotary positions (over the whole head or a part of it, longrope's two
// frequency sets), per-head query and key norms, multi-head, multi-query or grouped-query
// attention with a window per layer and soft-capped scores, post-norms of the branches,
// a plain or gated MLP or a mixture of experts (moe.go), a tied or separate LM head with
// soft-capped logits — and knows no architecture beyond it.
package cpu

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"

	"gollm/engine"
	"gollm/model"
)

// Engine is the CPU engine.
//
// Step is meant to be called from one goroutine at a time (the batch manager's worker);
// a mutex serialises concurrent calls, so they are safe but do not run in parallel.
// The scratch buffers of one Step are reused by the next, so a steady decode loop
// allocates little besides the returned outputs. Engines made by New on one Weights
// step in parallel: each has its own mutex, KV pool and scratch.
type Engine struct {
	// mu serialises Step and Close.
	mu sync.Mutex
	// closed is set by Close.
	closed bool
	// info is what Info returns.
	info engine.Info
	// w holds the weights, shared with the other engines made on them; read-only.
	w *Weights
	// recipe is the forward pass Step walks.
	recipe model.Recipe
	// freqs are the rotary frequencies of each rope the recipe's rotary stages use;
	// longFreqs longrope's frequencies of long sequences.
	freqs, longFreqs map[model.Rope][]float32
	// kv is the paged KV pool, laid out [block][layer][K,V][kv head][slot][head dim]
	// so that one head's keys within a block are contiguous for attention; kv8 is the
	// same pool of float8_e4m3fn codes under KVConfig.DType KVFP8 (kv is then nil).
	kv  []float32
	kv8 []uint8
	// fp8 holds, under KVFP8, each layer's key and value scales and their decode tables
	// (each code's real value, times the scale).
	fp8 *kvFP8
	// s holds the buffers reused across steps.
	s scratch
	// check validates each batch's structure before it runs.
	check *engine.BatchChecker
	// actFP8 is QuantizeActivationsFP8's row count (-1: off); actFP8Row its rowWise.
	actFP8    int
	actFP8Row bool
}

// rowInfo places one new token of the batch.
type rowInfo struct {
	// seq is the index of its sequence in Batch.Seqs.
	seq int
	// pos is its position in the sequence.
	pos int
}

// scratch holds one step's working buffers; they grow to the largest batch seen.
type scratch struct {
	// rows places each token row of the step.
	rows []rowInfo
	// norm is the last norm stage walked: the stages after it that read the block input
	// (QKV, the MLP, the LM head) read its norm of the residual stream.
	norm *model.Stage
	// h holds the residual stream, [N][hidden].
	h buf
	// xn holds a norm's output, [N][hidden].
	xn buf
	// qkv holds the fused projection's output, [N][QKVWidth].
	qkv buf
	// att holds the attention output before its projection, [N][heads·head_dim].
	att buf
	// tmp is a projection output before the residual add [N][hidden].
	tmp buf
	// up is the MLP's first projection [N][inner, or 2·inner when gated].
	up buf
	// act is the gated MLP's activation [N][inner] (the plain MLP activates up in place).
	act buf
	// hf holds the final norm of the rows whose logits are needed [M][hidden].
	hf buf
	// logits holds the logits of rows that are sampled but not returned as context
	// logits [M][vocab].
	logits buf
	// lmIn and lmOut are the row views the LM head reads and writes this step.
	lmIn, lmOut [][]float32
	// lastLogits is, per sequence, its last row's logits (nil when not computed).
	lastLogits [][]float32
	// scores are per-worker attention score buffers [MaxSeqLen].
	scores [][]float32
	// stage holds, under an FP8 pool, one layer's keys and values of the blocks the step
	// reads, decoded [staged block][K,V][kv head][slot][head dim]; staged maps a pool
	// block to its index there (-1: not staged), stageList lists them.
	stage     []float32
	staged    []int32
	stageList []int32
	// samplers hold the sampling buffers, one per goroutine.
	samplers []*engine.Sampler
	// mm holds the matrix products' buffers.
	mm mulScratch
	// moe holds the mixture-of-experts stages' buffers.
	moe moeScratch
}

// buf is a row-major matrix with per-row views, regrown only when too small.
type buf struct {
	// data holds the rows back to back.
	data []float32
	// rows are views of data, one per row.
	rows [][]float32
}

// resize makes b hold n rows of width w, reusing its memory when it is big enough.
func (b *buf) resize(n, w int) {
	if cap(b.data) < n*w {
		b.data = make([]float32, n*w)
	}
	b.data = b.data[:n*w]
	if cap(b.rows) < n {
		b.rows = make([][]float32, n)
	}
	b.rows = b.rows[:n]
	for i := range b.rows {
		b.rows[i] = b.data[i*w : (i+1)*w : (i+1)*w]
	}
}

// maxKVFloats caps the KV pool (2^36 floats, 256 GiB) so that a wrong size fails with
// an error instead of an allocation panic.
const maxKVFloats = 1 << 36

// NewFromModel builds an engine over m's weights with a KV pool of kv.NumBlocks blocks
// of kv.TokensPerBlock positions: NewWeights then New, for a caller that runs one engine
// on the model.
func NewFromModel(m *model.Float32, kv engine.KVConfig) (*Engine, error) {
	w, err := NewWeights(m)
	if err != nil {
		return nil, err
	}
	defer w.Release() // the engine holds its own reference
	return New(w, kv)
}

// New builds a CPU engine on shared weights with its own KV pool of kv.NumBlocks blocks
// of kv.TokensPerBlock positions.
func New(w *Weights, kv engine.KVConfig) (*Engine, error) {
	if w == nil {
		return nil, errors.New("cpu: New: nil weights")
	}
	cfg := &w.cfg
	if kv.NumBlocks < 1 {
		return nil, fmt.Errorf("cpu: New: KVConfig.NumBlocks is %d, must be at least 1", kv.NumBlocks)
	}
	if kv.TokensPerBlock < 1 {
		return nil, fmt.Errorf("cpu: New: KVConfig.TokensPerBlock is %d, must be at least 1", kv.TokensPerBlock)
	}
	maxLen := cfg.MaxPositions
	if kv.MaxSeqLen != 0 {
		if kv.MaxSeqLen < 1 || kv.MaxSeqLen > cfg.MaxPositions {
			return nil, fmt.Errorf("cpu: New: KVConfig.MaxSeqLen %d must be in [1, %d] (the model's positions)", kv.MaxSeqLen, cfg.MaxPositions)
		}
		maxLen = kv.MaxSeqLen
	}
	perBlock := int64(kv.TokensPerBlock) * int64(cfg.Layers) * 2 * int64(cfg.KVHeads) * int64(cfg.HeadDim)
	if perBlock > maxKVFloats || int64(kv.NumBlocks) > maxKVFloats/perBlock {
		return nil, fmt.Errorf("cpu: New: KV pool of %d blocks × %d floats exceeds %d floats", kv.NumBlocks, perBlock, int64(maxKVFloats))
	}
	if kv.DType != engine.KVAuto && kv.DType != engine.KVFP8 {
		return nil, fmt.Errorf("cpu: New: KVConfig.DType %d is neither auto nor fp8", kv.DType)
	}
	if err := kv.CheckScales(cfg.Layers); err != nil {
		return nil, fmt.Errorf("cpu: New: %w", err)
	}
	recipe := cfg.Recipe()
	if err := checkRecipe(recipe, cfg); err != nil {
		return nil, fmt.Errorf("cpu: New: %w", err)
	}
	if !w.acquire() {
		return nil, errors.New("cpu: New: the weights are released")
	}
	e := &Engine{
		recipe:    recipe,
		freqs:     ropeFreqs(recipe),
		longFreqs: longRopeFreqs(recipe),
		actFP8:    -1,
		info: engine.Info{
			VocabSize:      cfg.VocabSize,
			MaxSeqLen:      maxLen,
			Layers:         cfg.Layers,
			KVHeads:        cfg.KVHeads,
			HeadDim:        cfg.HeadDim,
			NumBlocks:      kv.NumBlocks,
			TokensPerBlock: kv.TokensPerBlock,
			EndIDs:         cfg.EOSIDs,
			MaxDraft:       engine.MaxDraftTokens,
			Hidden:         cfg.Hidden,
		},
		w: w,
	}
	if kv.DType == engine.KVFP8 {
		e.fp8 = newKVFP8(kv.KScales, kv.VScales, cfg.Layers)
		e.kv8 = make([]uint8, int64(kv.NumBlocks)*perBlock)
	} else {
		e.kv = make([]float32, int64(kv.NumBlocks)*perBlock)
	}
	e.check = engine.NewBatchChecker(e.info, "cpu")
	return e, nil
}

// checkRecipe refuses the stage values the engine does not implement.
func checkRecipe(r model.Recipe, cfg *model.Config) error {
	for _, s := range r {
		switch {
		case (s.Kind == model.StageAttention || s.Kind == model.StageLMHead) && !(s.SoftCap >= 0):
			return fmt.Errorf("layer %d: soft-cap %g must be positive or 0 (none)", s.Layer, s.SoftCap)
		case s.Kind == model.StageQKNorm && !cfg.QKNorm, s.Kind == model.StagePostNorm && !cfg.PostNorms:
			return fmt.Errorf("layer %d: a %s stage where the weights have no %s", s.Layer, s.Kind, s.Weight)
		case (s.Kind == model.StageQKNorm || s.Kind == model.StagePostNorm) && s.Norm != model.RMSNorm:
			return fmt.Errorf("layer %d: a %s stage under %s (only RMSNorm is implemented)", s.Layer, s.Kind, s.Norm)
		case s.Kind == model.StageRotary && (s.Rope.Dim < 2 || s.Rope.Dim%2 != 0 || s.Rope.Dim > cfg.HeadDim):
			return fmt.Errorf("layer %d: rotary dimensions %d must be even, at least 2 and at most head_dim %d", s.Layer, s.Rope.Dim, cfg.HeadDim)
		case s.Kind == model.StageMLP && s.Gated != cfg.GatedMLP:
			return fmt.Errorf("layer %d: a gated MLP %v where the weights' shapes say %v", s.Layer, s.Gated, cfg.GatedMLP)
		case s.Kind == model.StageMLP && cfg.Sparse(s.Layer):
			return fmt.Errorf("layer %d: a dense MLP where the weights are experts", s.Layer)
		case s.Kind == model.StageMoE:
			if err := checkMoEStage(s, cfg); err != nil {
				return err
			}
		}
	}
	return nil
}

// ropeFreqs computes the frequencies of each rope the recipe's rotary stages use.
func ropeFreqs(r model.Recipe) map[model.Rope][]float32 {
	freqs := map[model.Rope][]float32{}
	for _, s := range r {
		if s.Kind == model.StageRotary {
			if _, ok := freqs[s.Rope]; !ok {
				freqs[s.Rope] = s.Rope.InvFreq()
			}
		}
	}
	return freqs
}

// Info describes the model and the pool.
func (e *Engine) Info() engine.Info { return e.info }

// Close frees the KV pool and drops the engine's reference to its weights, which are
// freed (a checkpoint they point into unmapped) once nothing else holds them; later
// Steps fail.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	err := e.w.release()
	e.kv, e.kv8, e.w = nil, nil, nil
	e.s = scratch{}
	return err
}

// kvBase returns the offset in the pool of slot 0 of (block, layer, kind, kv head),
// where kind is 0 for keys and 1 for values.
func (e *Engine) kvBase(block, layer, kind, head int) int {
	return (((block*e.w.cfg.Layers+layer)*2+kind)*e.w.cfg.KVHeads + head) * e.info.TokensPerBlock * e.w.cfg.HeadDim
}

// Step runs one iteration: the forward pass of every sequence's new tokens, all
// batched into each matmul, the KV writes, the LM head for the rows whose logits are
// needed, and sampling. A malformed batch fails the whole step before anything is
// written to the KV pool.
func (e *Engine) Step(b *engine.Batch) ([]engine.Output, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("cpu: Step on a closed engine")
	}
	if b == nil {
		return nil, errors.New("cpu: Step: nil batch")
	}
	n, err := e.check.Check(b)
	if err != nil {
		return nil, err
	}
	// Copy-on-write of KV blocks (beams that diverge inside a shared block) comes first:
	// the forward pass may write the copies.
	e.copyBlocks(b.BlockCopies)
	outs := make([]engine.Output, len(b.Seqs))
	if n == 0 {
		return outs, nil
	}
	for i := range e.recipe {
		switch st := &e.recipe[i]; st.Kind {
		case model.StageEmbed:
			e.embedRows(b, n, 0, true)
			e.scaleEmbeddings(st)
		case model.StageLMHead:
			e.lmHead(b, outs, st)
		default:
			e.stage(b, st)
			if len(b.HiddenLayers) > 0 && st.Layer >= 0 && (i+1 == len(e.recipe) || e.recipe[i+1].Layer != st.Layer) {
				// The layer's last stage: its output, for the sequences that read it.
				e.captureHidden(b, st.Layer, outs)
			}
		}
	}
	return e.sample(b, outs)
}

// lmHead runs the LM head st on the rows whose logits someone reads — every row of a
// sequence that asks for context logits (written straight into its output), and the last
// row of the others that sample or return logits —, each normed by the norm stage before
// it, its logits soft-capped where st says; s.lastLogits gets each sequence's last row of
// logits.
func (e *Engine) lmHead(b *engine.Batch, outs []engine.Output, st *model.Stage) {
	w := e.w
	H, V := w.cfg.Hidden, w.cfg.VocabSize
	s := &e.s
	m, mScratch := 0, 0
	for si := range b.Seqs {
		sq := &b.Seqs[si]
		switch {
		case sq.ContextLogits:
			m += len(sq.Tokens)
		case sq.Draft > 0:
			m += sq.Draft + 1
			mScratch += sq.Draft + 1
		case sq.Sample || sq.ReturnLogits:
			m++
			mScratch++
		}
	}
	s.hf.resize(m, H)
	s.logits.resize(mScratch, V)
	s.lmIn, s.lmOut = s.lmIn[:0], s.lmOut[:0]
	if cap(s.lastLogits) < len(b.Seqs) {
		s.lastLogits = make([][]float32, len(b.Seqs))
	}
	s.lastLogits = s.lastLogits[:len(b.Seqs)]
	r0, k := 0, 0
	for si := range b.Seqs {
		sq := &b.Seqs[si]
		s.lastLogits[si] = nil
		switch {
		case sq.ContextLogits:
			out := make([]float32, len(sq.Tokens)*V)
			outs[si].ContextLogits = out
			for i := range sq.Tokens {
				s.lmIn = append(s.lmIn, s.hf.rows[len(s.lmIn)])
				e.norm(s.lmIn[len(s.lmIn)-1], s.h.rows[r0+i])
				s.lmOut = append(s.lmOut, out[i*V:(i+1)*V:(i+1)*V])
			}
			s.lastLogits[si] = s.lmOut[len(s.lmOut)-1]
		case sq.Draft > 0:
			s.lastLogits[si] = e.draftRows(sq, r0, k)
			k += sq.Draft + 1
		case sq.Sample || sq.ReturnLogits:
			s.lmIn = append(s.lmIn, s.hf.rows[len(s.lmIn)])
			e.norm(s.lmIn[len(s.lmIn)-1], s.h.rows[r0+len(sq.Tokens)-1])
			s.lmOut = append(s.lmOut, s.logits.rows[k])
			s.lastLogits[si] = s.logits.rows[k]
			k++
		}
		r0 += len(sq.Tokens)
	}
	w.lmHead.mul(s.lmOut, s.lmIn, nil, &s.mm)
	softcapRows(s.lmOut, st.SoftCap)
}

// sample fills every sequence's output from its last row's logits (s.lastLogits).
// Sampling reads only its own sequence's row, so sequences are spread over the
// goroutines, each with its own sampler buffers.
func (e *Engine) sample(b *engine.Batch, outs []engine.Output) ([]engine.Output, error) {
	s, V := &e.s, e.w.cfg.VocabSize
	for len(s.samplers) < runtime.GOMAXPROCS(0) {
		s.samplers = append(s.samplers, engine.NewSampler(V))
	}
	// A sequence whose token cannot be chosen fails alone (Output.Err).
	parallelFor(len(b.Seqs), 1, 1, func(w, lo, hi int) {
		for si := lo; si < hi; si++ {
			outs[si].Err = e.finish(&b.Seqs[si], s.lastLogits[si], s.samplers[w], &outs[si])
		}
	})
	return outs, nil
}

// embedRows places the step's n new tokens and sizes the buffers for them, then sets
// the residual stream to their embeddings: the rows of tokens in [first, first+vocab)
// of this engine's embedding (the whole vocabulary unless it holds one tensor-parallel
// rank's share; other tokens' rows are zero), plus the position embedding when withPos.
func (e *Engine) embedRows(b *engine.Batch, n, first int, withPos bool) {
	w := e.w
	cfg := &w.cfg
	H := cfg.Hidden
	s := &e.s
	s.rows = s.rows[:0]
	for si := range b.Seqs {
		sq := &b.Seqs[si]
		for i := range sq.Tokens {
			s.rows = append(s.rows, rowInfo{seq: si, pos: sq.Pos + i})
		}
	}
	s.h.resize(n, H)
	s.xn.resize(n, H)
	s.qkv.resize(n, cfg.QKVWidth())
	s.att.resize(n, cfg.AttnWidth())
	s.tmp.resize(n, H)
	upW, _, _ := cfg.Shape(model.RoleUp)
	s.up.resize(n, upW)
	if cfg.GatedMLP {
		s.act.resize(n, cfg.Inner)
	}
	for r, ri := range s.rows {
		tok := int(b.Seqs[ri.seq].Tokens[ri.pos-b.Seqs[ri.seq].Pos]) - first
		h := s.h.rows[r]
		if tok >= 0 && tok < cfg.VocabSize {
			w.embed.row(tok, h)
		} else {
			clear(h)
		}
		if w.pos != nil && withPos {
			pe := w.pos[ri.pos*H : (ri.pos+1)*H]
			for j := range h {
				h[j] += pe[j]
			}
		}
	}
}

// stage runs one stage of the recipe between the embedding and the LM head on the step's
// rows. The projections write s.qkv, s.att (through attention) and s.tmp, the branch a
// residual stage adds to s.h; a norm stage's norm is applied by the stages that read it.
func (e *Engine) stage(b *engine.Batch, st *model.Stage) {
	w := e.w
	s := &e.s
	switch st.Kind {
	case model.StageNorm:
		s.norm = st
	case model.StageQKV:
		l := &w.layers[st.Layer]
		e.normRows(s.xn.rows, s.h.rows)
		e.quantFP8Rows(s.xn.rows)
		l.qkv.mul(s.qkv.rows, s.xn.rows, l.qkvB, &s.mm)
	case model.StageRotary:
		e.rotate(b, st)
	case model.StageQKNorm:
		e.qkNorm(st)
	case model.StagePostNorm:
		e.postNorm(st)
	case model.StageKVWrite:
		e.writeKV(b, st.Layer)
	case model.StageAttention:
		e.attention(b, st)
	case model.StageOut:
		l := &w.layers[st.Layer]
		e.quantFP8Rows(s.att.rows)
		l.out.mul(s.tmp.rows, s.att.rows, l.outB, &s.mm)
	case model.StageMLP:
		e.mlp(st)
	case model.StageMoE:
		e.moe(st)
	case model.StageResidual:
		addRows(s.h.rows, s.tmp.rows)
	}
}

// mlp runs a layer's MLP on the normed residual stream into s.tmp: act(up), or
// act(gate) · up when gated, then the down projection.
func (e *Engine) mlp(st *model.Stage) {
	w := e.w
	cfg := &w.cfg
	s := &e.s
	l := &w.layers[st.Layer]
	n := len(s.rows)
	act := s.up.rows
	if st.Gated {
		act = s.act.rows
	}
	fn := activationOf(st.Act)
	e.normRows(s.xn.rows, s.h.rows)
	e.quantFP8Rows(s.xn.rows)
	l.up.mul(s.up.rows, s.xn.rows, l.upB, &s.mm)
	parallelFor(n, 1, max(1, 4096/cfg.Inner), func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			if st.Gated {
				gatedApply(fn, act[r], s.up.rows[r][:cfg.Inner], s.up.rows[r][cfg.Inner:])
			} else {
				fn.apply(act[r])
			}
		}
	})
	e.quantFP8Rows(act)
	l.down.mul(s.tmp.rows, act, l.downB, &s.mm)
}

// copyBlocks copies whole KV blocks of the pool, in order (a block is contiguous: every
// layer's keys and values of every KV head).
func (e *Engine) copyBlocks(copies []engine.BlockCopy) {
	if len(copies) == 0 {
		return
	}
	size := e.kvBase(1, 0, 0, 0)
	for _, c := range copies {
		src, dst := int(c.Src)*size, int(c.Dst)*size
		if e.kv8 != nil {
			copy(e.kv8[dst:dst+size], e.kv8[src:src+size])
		} else {
			copy(e.kv[dst:dst+size], e.kv[src:src+size])
		}
	}
}

// norm writes into dst the norm of x of the last norm stage walked (s.norm): its kind,
// epsilon, weight and (LayerNorm) bias.
func (e *Engine) norm(dst, x []float32) {
	st := e.s.norm
	g, b := e.normWeights(st)
	if st.Norm == model.RMSNorm {
		rmsNorm(dst, x, g, st.Eps)
	} else {
		layerNorm(dst, x, g, b, st.Eps)
	}
}

// normWeights returns the weight and bias (nil under RMSNorm) of norm stage st.
func (e *Engine) normWeights(st *model.Stage) (g, b []float32) {
	w := e.w
	switch st.Weight {
	case model.RoleAttnNorm:
		return w.layers[st.Layer].attnNorm, w.layers[st.Layer].attnNormB
	case model.RoleMLPNorm:
		return w.layers[st.Layer].mlpNorm, w.layers[st.Layer].mlpNormB
	case model.RoleQNorm:
		return w.layers[st.Layer].qNorm, nil
	case model.RolePostAttnNorm:
		return w.layers[st.Layer].postAttn, nil
	case model.RolePostMLPNorm:
		return w.layers[st.Layer].postMLP, nil
	}
	return w.finalNorm, w.finalNormB
}

// normRows applies norm to every row.
func (e *Engine) normRows(dst, x [][]float32) {
	for r := range x {
		e.norm(dst[r], x[r])
	}
}

// rotate applies rotary stage st to the query and key heads of every row, at the row's
// position: the first Rope.Dim dimensions of each head rotate, dimension i pairing with
// i + Dim/2 (rotate_half) by the angle inv[i] · pos, cos and sin times the rope's
// CosSinScale; the rest of the head passes. Under longrope a row takes the long
// frequencies where its sequence's length after the step asks for them.
func (e *Engine) rotate(b *engine.Batch, st *model.Stage) {
	cfg := &e.w.cfg
	D, half := cfg.HeadDim, st.Rope.Dim/2
	heads := cfg.Heads + cfg.KVHeads // the query heads, then the key heads
	short, long, scale := e.freqs[st.Rope], e.longFreqs[st.Rope], st.Rope.CosSinScale()
	for r, ri := range e.s.rows {
		row := e.s.qkv.rows[r]
		pos := float32(ri.pos)
		inv := short
		if sq := &b.Seqs[ri.seq]; long != nil && st.Rope.UsesLong(sq.Pos+len(sq.Tokens)) {
			inv = long
		}
		for i := range half {
			// The angle as transformers computes it: a float32 product, then cos and sin
			// (times the scale, exact when it is 1).
			ang := float64(inv[i] * pos)
			c, sn := float32(math.Cos(ang))*scale, float32(math.Sin(ang))*scale
			for h := range heads {
				x := row[h*D : h*D+2*half]
				a, b := x[i], x[i+half]
				x[i] = a*c - b*sn
				x[i+half] = b*c + a*sn
			}
		}
	}
}

// finish fills a sequence's output from its last row's logits: the returned logits
// and, when it asks for one, the sampled token; an error is the sequence's own.
func (e *Engine) finish(sq *engine.Sequence, last []float32, sp *engine.Sampler, out *engine.Output) error {
	out.Token = -1
	if last == nil {
		return nil
	}
	if sq.Draft > 0 {
		return e.verify(sq, last, sp, out)
	}
	if !sq.Sample {
		if sq.ReturnLogits {
			out.Logits = slices.Clone(last)
			engine.AddBias(out.Logits, sq.Sampling.EmbeddingBias)
		}
		return nil
	}
	tok, lp, logits, err := sp.Sample(last, sq)
	if err != nil {
		return fmt.Errorf("cpu: sequence %d: %w", sq.ID, err)
	}
	out.Token, out.LogProb = tok, lp
	if sq.ReturnLogits {
		out.Logits = logits
	}
	return nil
}

// addRows adds src to dst row by row (the residual connection).
func addRows(dst, src [][]float32) {
	for r, d := range dst {
		sr := src[r][:len(d)]
		for j := range d {
			d[j] += sr[j]
		}
	}
}

// writeKV stores the keys and values of layer li of every new token in its sequence's
// KV blocks.
func (e *Engine) writeKV(b *engine.Batch, li int) {
	cfg := &e.w.cfg
	D, T := cfg.HeadDim, e.info.TokensPerBlock
	kOff, vOff := cfg.Heads*D, (cfg.Heads+cfg.KVHeads)*D
	for r, ri := range e.s.rows {
		blk := int(b.Seqs[ri.seq].Blocks[ri.pos/T])
		slot := ri.pos % T
		qkv := e.s.qkv.rows[r]
		for h := range cfg.KVHeads {
			kb := e.kvBase(blk, li, 0, h) + slot*D
			vb := e.kvBase(blk, li, 1, h) + slot*D
			k, v := qkv[kOff+h*D:kOff+(h+1)*D], qkv[vOff+h*D:vOff+(h+1)*D]
			if e.fp8 != nil {
				e.fp8.encode(e.kv8[kb:kb+D], k, li, 0)
				e.fp8.encode(e.kv8[vb:vb+D], v, li, 1)
				continue
			}
			copy(e.kv[kb:kb+D], k)
			copy(e.kv[vb:vb+D], v)
		}
	}
}

// attention computes, for every new token and query head, causal softmax attention over
// its sequence's cached keys and values of the head's KV head (query head h reads KV
// head h / (heads / kv_heads)), the products times the stage's scale, at positions from
// the stage's window start to pos, into s.att. The (token, head) pairs are spread over
// the goroutines; each reads its sequence's blocks in order.
func (e *Engine) attention(b *engine.Batch, st *model.Stage) {
	s := &e.s
	cfg := &e.w.cfg
	heads, D, T := cfg.Heads, cfg.HeadDim, e.info.TokensPerBlock
	group := cfg.Heads / cfg.KVHeads
	li, window, scale, capped := st.Layer, st.Window, st.Scale, st.SoftCap
	workers := runtime.GOMAXPROCS(0)
	for len(s.scores) < workers {
		s.scores = append(s.scores, make([]float32, e.info.MaxSeqLen))
	}
	// at is where (block, kind, kv head)'s slot 0 lies in pool: the float32 pool, or the
	// FP8 pool's blocks this step reads, decoded once for every row and query head.
	pool, at := e.kv, func(blk, kind, h int) int { return e.kvBase(blk, li, kind, h) }
	if e.fp8 != nil {
		e.stageFP8(b, li, window)
		pool, at = s.stage, func(blk, kind, h int) int { return ((int(s.staged[blk])*2+kind)*cfg.KVHeads + h) * T * D }
	}
	// The work of a row grows with its position; weigh chunks by a typical length.
	minItems := max(1, 8192/max(1, D*(s.rows[len(s.rows)-1].pos+1)))
	parallelFor(len(s.rows)*heads, 1, minItems, func(w, lo, hi int) {
		scores := s.scores[w]
		for it := lo; it < hi; it++ {
			r, h := it/heads, it%heads
			kvh := h / group
			ri := s.rows[r]
			blocks := b.Seqs[ri.seq].Blocks
			q := s.qkv.rows[r][h*D : (h+1)*D]
			first := 0
			if window > 0 {
				first = max(0, ri.pos-window+1)
			}
			sc := scores[first : ri.pos+1]
			best := float32(math.Inf(-1))
			for t := first; t <= ri.pos; {
				base := at(int(blocks[t/T]), 0, kvh)
				slot := t % T
				cnt := min(T-slot, ri.pos+1-t)
				keys := pool[base+slot*D : base+(slot+cnt)*D]
				for j := range cnt {
					v := dot(q, keys[j*D:(j+1)*D]) * scale
					if capped > 0 {
						v = softcap(v, capped)
					}
					sc[t-first+j] = v
					best = max(best, v)
				}
				t += cnt
			}
			var sum float32
			for i, v := range sc {
				p := float32(expFast(float64(v - best)))
				sc[i] = p
				sum += p
			}
			out := s.att.rows[r][h*D : (h+1)*D]
			clear(out)
			for t := first; t <= ri.pos; {
				base := at(int(blocks[t/T]), 1, kvh)
				slot := t % T
				cnt := min(T-slot, ri.pos+1-t)
				vals := pool[base+slot*D : base+(slot+cnt)*D]
				for j := range cnt {
					axpy(out, sc[t-first+j], vals[j*D:(j+1)*D])
				}
				t += cnt
			}
			inv := 1 / sum
			for j := range out {
				out[j] *= inv
			}
		}
	})
}

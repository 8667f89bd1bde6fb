package engine

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"

	"gollm/model"
)

// CPU is the pure-Go GPT-2 engine: a float32 forward pass over a paged KV pool, and
// sampling, with the matmuls spread over GOMAXPROCS goroutines.
//
// Step is meant to be called from one goroutine at a time (the batch manager's worker);
// a mutex serialises concurrent calls, so they are safe but do not run in parallel.
// The scratch buffers of one Step are reused by the next, so a steady decode loop
// allocates little besides the returned outputs. Engines made by NewCPUFrom on one
// CPUWeights step in parallel: each has its own mutex, KV pool and scratch.
type CPU struct {
	// mu serialises Step and Close.
	mu sync.Mutex
	// closed is set by Close.
	closed bool
	// info is what Info returns.
	info Info
	// w holds the weights, shared with the other engines made on them; read-only.
	w *CPUWeights
	// kv is the paged KV pool, laid out [block][layer][K,V][kv head][slot][head dim]
	// so that one head's keys within a block are contiguous for attention.
	kv []float32
	// s holds the buffers reused across steps.
	s scratch
	// check validates each batch before it runs.
	check *BatchChecker
}

// CPUWeights is a GPT-2 model prepared for the CPU engine, built once by NewCPUWeights
// and shared by every engine NewCPUFrom makes on it: several instances of one model
// then hold one copy of the weights, not one each.
//
// It is never written after NewCPUWeights returns (Step only reads it), so any number
// of engines may use it concurrently from different goroutines.
//
// It holds its own transposed copies of each layer's four matrices (attn.c_attn,
// attn.c_proj, mlp.c_fc and mlp.c_proj weights) and does not reference the model's,
// so a caller that drops the *model.GPT2 lets those be collected. It does reference,
// without copying, the model's WTE, WPE, LNFW, LNFB and each layer's LN1W, LN1B, LN2W,
// LN2B and biases (AttnB, ProjB, FCB, MLPProjB): the caller must not modify those.
type CPUWeights struct {
	// cfg holds the model's hyperparameters.
	cfg model.Config
	// act is the MLP nonlinearity.
	act activation
	// wte is the token embedding [vocab][hidden], also the tied LM head.
	wte []float32
	// wpe is the position embedding [positions][hidden].
	wpe []float32
	// lnfW and lnfB are the final LayerNorm's scale and shift.
	lnfW, lnfB []float32
	// layers hold the transformer blocks with their matrices transposed.
	layers []cpuLayer
}

// cpuLayer is one transformer block with its Conv1D matrices transposed to [out][in],
// so that every output is a dot product of two contiguous vectors.
type cpuLayer struct {
	// ln1W, ln1B: LayerNorm before attention, [hidden].
	ln1W, ln1B []float32
	// attnWT [3*hidden][hidden] and attnB [3*hidden]: the fused Q, K, V projection.
	attnWT, attnB []float32
	// projWT [hidden][hidden] and projB [hidden]: the attention output projection.
	projWT, projB []float32
	// ln2W, ln2B: LayerNorm before the MLP, [hidden].
	ln2W, ln2B []float32
	// fcWT [inner][hidden] and fcB [inner]: the MLP's first projection.
	fcWT, fcB []float32
	// mlpWT [hidden][inner] and mlpB [hidden]: the MLP's second projection.
	mlpWT, mlpB []float32
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
	// h is the residual stream [N][hidden].
	h buf
	// xn is a LayerNorm output [N][hidden].
	xn buf
	// qkv is the fused projection [N][3*hidden].
	qkv buf
	// att is the attention output [N][hidden].
	att buf
	// tmp is a projection output before the residual add [N][hidden].
	tmp buf
	// fc is the MLP's inner activation [N][inner].
	fc buf
	// hf holds the final LayerNorm of the rows whose logits are needed [M][hidden].
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
	// samplers hold the sampling buffers, one per goroutine.
	samplers []*sampler
	// errs collects the sampling errors of one step, per sequence.
	errs []error
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

// NewCPU builds a CPU engine over m's weights with a KV pool of kv.NumBlocks blocks of
// kv.TokensPerBlock positions: NewCPUWeights then NewCPUFrom, for a caller that runs
// one engine on the model.
func NewCPU(m *model.GPT2, kv KVConfig) (*CPU, error) {
	w, err := NewCPUWeights(m)
	if err != nil {
		return nil, err
	}
	return NewCPUFrom(w, kv)
}

// NewCPUWeights checks m against its config (the hyperparameters, the activation and
// every tensor's length, naming the tensor that does not fit) and prepares its weights
// for the CPU engine. What the result keeps of m is listed on CPUWeights.
func NewCPUWeights(m *model.GPT2) (*CPUWeights, error) {
	if m == nil {
		return nil, errors.New("engine: NewCPUWeights: nil model")
	}
	cfg := m.Config
	if err := checkConfig(cfg); err != nil {
		return nil, fmt.Errorf("engine: NewCPUWeights: %w", err)
	}
	act, ok := parseActivation(cfg.Activation)
	if !ok {
		return nil, fmt.Errorf("engine: NewCPUWeights: activation_function %q is not supported (gelu_new, gelu_pytorch_tanh, gelu_fast, gelu, relu)", cfg.Activation)
	}

	H, I, V := cfg.Hidden, cfg.Inner, cfg.VocabSize
	checks := []struct {
		name string
		got  []float32
		want int
	}{
		{"wte.weight", m.WTE, V * H},
		{"wpe.weight", m.WPE, cfg.MaxPositions * H},
		{"ln_f.weight", m.LNFW, H},
		{"ln_f.bias", m.LNFB, H},
	}
	if len(m.Layers) != cfg.Layers {
		return nil, fmt.Errorf("engine: NewCPUWeights: model has %d layers, config says n_layer=%d", len(m.Layers), cfg.Layers)
	}
	for i := range m.Layers {
		l := &m.Layers[i]
		p := fmt.Sprintf("h.%d.", i)
		checks = append(checks, []struct {
			name string
			got  []float32
			want int
		}{
			{p + "ln_1.weight", l.LN1W, H}, {p + "ln_1.bias", l.LN1B, H},
			{p + "attn.c_attn.weight", l.AttnW, H * 3 * H}, {p + "attn.c_attn.bias", l.AttnB, 3 * H},
			{p + "attn.c_proj.weight", l.ProjW, H * H}, {p + "attn.c_proj.bias", l.ProjB, H},
			{p + "ln_2.weight", l.LN2W, H}, {p + "ln_2.bias", l.LN2B, H},
			{p + "mlp.c_fc.weight", l.FCW, H * I}, {p + "mlp.c_fc.bias", l.FCB, I},
			{p + "mlp.c_proj.weight", l.MLPProjW, I * H}, {p + "mlp.c_proj.bias", l.MLPProjB, H},
		}...)
	}
	for _, c := range checks {
		if len(c.got) != c.want {
			return nil, fmt.Errorf("engine: NewCPUWeights: tensor %s has %d values, want %d for the config", c.name, len(c.got), c.want)
		}
	}

	w := &CPUWeights{cfg: cfg, act: act, wte: m.WTE, wpe: m.WPE, lnfW: m.LNFW, lnfB: m.LNFB,
		layers: make([]cpuLayer, cfg.Layers)}
	for i := range m.Layers {
		l := &m.Layers[i]
		w.layers[i] = cpuLayer{
			ln1W: l.LN1W, ln1B: l.LN1B,
			attnWT: transpose(l.AttnW, H, 3*H), attnB: l.AttnB,
			projWT: transpose(l.ProjW, H, H), projB: l.ProjB,
			ln2W: l.LN2W, ln2B: l.LN2B,
			fcWT: transpose(l.FCW, H, I), fcB: l.FCB,
			mlpWT: transpose(l.MLPProjW, I, H), mlpB: l.MLPProjB,
		}
	}
	return w, nil
}

// NewCPUFrom builds a CPU engine on shared weights with its own KV pool of
// kv.NumBlocks blocks of kv.TokensPerBlock positions.
func NewCPUFrom(w *CPUWeights, kv KVConfig) (*CPU, error) {
	if w == nil {
		return nil, errors.New("engine: NewCPUFrom: nil weights")
	}
	cfg := w.cfg
	if kv.NumBlocks < 1 {
		return nil, fmt.Errorf("engine: NewCPUFrom: KVConfig.NumBlocks is %d, must be at least 1", kv.NumBlocks)
	}
	if kv.TokensPerBlock < 1 {
		return nil, fmt.Errorf("engine: NewCPUFrom: KVConfig.TokensPerBlock is %d, must be at least 1", kv.TokensPerBlock)
	}
	perBlock := int64(kv.TokensPerBlock) * int64(cfg.Layers) * 2 * int64(cfg.KVHeads) * int64(cfg.HeadDim)
	if perBlock > maxKVFloats || int64(kv.NumBlocks) > maxKVFloats/perBlock {
		return nil, fmt.Errorf("engine: NewCPUFrom: KV pool of %d blocks × %d floats exceeds %d floats", kv.NumBlocks, perBlock, int64(maxKVFloats))
	}
	e := &CPU{
		info: Info{
			Arch:           cfg.Arch,
			VocabSize:      cfg.VocabSize,
			MaxSeqLen:      cfg.MaxPositions,
			Layers:         cfg.Layers,
			KVHeads:        cfg.KVHeads,
			HeadDim:        cfg.HeadDim,
			NumBlocks:      kv.NumBlocks,
			TokensPerBlock: kv.TokensPerBlock,
			EndID:          cfg.EOSID,
		},
		w:  w,
		kv: make([]float32, int64(kv.NumBlocks)*perBlock),
	}
	if e.info.Arch == "" {
		e.info.Arch = "gpt2"
	}
	if e.info.EndID >= int32(cfg.VocabSize) {
		e.info.EndID = -1
	}
	e.check = NewBatchChecker(e.info, "engine")
	return e, nil
}

// checkConfig rejects hyperparameters the engine cannot run.
func checkConfig(c model.Config) error {
	switch {
	case c.Arch != "" && c.Arch != "gpt2":
		return fmt.Errorf("model_type %q is not gpt2", c.Arch)
	case c.VocabSize < 1:
		return fmt.Errorf("vocab_size is %d, must be at least 1", c.VocabSize)
	case c.MaxPositions < 1:
		return fmt.Errorf("n_positions is %d, must be at least 1", c.MaxPositions)
	case c.Hidden < 1 || c.Layers < 1 || c.Heads < 1 || c.Inner < 1:
		return fmt.Errorf("n_embd=%d, n_layer=%d, n_head=%d, n_inner=%d must all be at least 1", c.Hidden, c.Layers, c.Heads, c.Inner)
	case c.KVHeads != c.Heads:
		return fmt.Errorf("KVHeads=%d differs from n_head=%d; GPT-2 has no grouped-query attention", c.KVHeads, c.Heads)
	case c.HeadDim*c.Heads != c.Hidden:
		return fmt.Errorf("HeadDim=%d × n_head=%d is not n_embd=%d", c.HeadDim, c.Heads, c.Hidden)
	case !(c.LayerNormEps > 0) || math.IsInf(float64(c.LayerNormEps), 0):
		return fmt.Errorf("layer_norm_epsilon is %g, must be positive and finite", c.LayerNormEps)
	}
	return nil
}

// transpose returns the [cols][rows] transpose of the row-major [rows][cols] matrix w.
func transpose(w []float32, rows, cols int) []float32 {
	t := make([]float32, len(w))
	// Tiles keep both the reads and the writes within a few cache lines.
	const tile = 32
	for r0 := 0; r0 < rows; r0 += tile {
		for c0 := 0; c0 < cols; c0 += tile {
			for r := r0; r < min(r0+tile, rows); r++ {
				for c := c0; c < min(c0+tile, cols); c++ {
					t[c*rows+r] = w[r*cols+c]
				}
			}
		}
	}
	return t
}

// Info describes the model and the KV pool.
func (e *CPU) Info() Info { return e.info }

// Close frees the KV pool and drops the engine's reference to its weights, which are
// freed once nothing else holds them; later Steps fail.
func (e *CPU) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.kv, e.w = nil, nil
	e.s = scratch{}
	return nil
}

// kvBase returns the offset in the pool of slot 0 of (block, layer, kind, head), where
// kind is 0 for keys and 1 for values.
func (e *CPU) kvBase(block, layer, kind, head int) int {
	return (((block*e.w.cfg.Layers+layer)*2+kind)*e.w.cfg.KVHeads + head) * e.info.TokensPerBlock * e.w.cfg.HeadDim
}

// Step runs one iteration: the forward pass of every sequence's new tokens, all
// batched into each matmul, the KV writes, the LM head for the rows whose logits are
// needed, and sampling. A bad sequence fails the whole step before anything is
// written to the KV pool.
func (e *CPU) Step(b *Batch) ([]Output, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("engine: Step on a closed CPU engine")
	}
	if b == nil {
		return nil, errors.New("engine: Step: nil batch")
	}
	n, err := e.check.Check(b)
	if err != nil {
		return nil, err
	}
	outs := make([]Output, len(b.Seqs))
	if n == 0 {
		return outs, nil
	}
	cfg := e.w.cfg
	H, V := cfg.Hidden, cfg.VocabSize
	s := &e.s

	// Place every new token and embed it.
	s.rows = s.rows[:0]
	for si := range b.Seqs {
		sq := &b.Seqs[si]
		for i := range sq.Tokens {
			s.rows = append(s.rows, rowInfo{seq: si, pos: sq.Pos + i})
		}
	}
	s.h.resize(n, H)
	s.xn.resize(n, H)
	s.qkv.resize(n, 3*H)
	s.att.resize(n, H)
	s.tmp.resize(n, H)
	s.fc.resize(n, cfg.Inner)
	for r, ri := range s.rows {
		tok := int(b.Seqs[ri.seq].Tokens[ri.pos-b.Seqs[ri.seq].Pos])
		h, te, pe := s.h.rows[r], e.w.wte[tok*H:(tok+1)*H], e.w.wpe[ri.pos*H:(ri.pos+1)*H]
		for j := range h {
			h[j] = te[j] + pe[j]
		}
	}

	for li := range e.w.layers {
		l := &e.w.layers[li]
		for r := range s.rows {
			layerNorm(s.xn.rows[r], s.h.rows[r], l.ln1W, l.ln1B, cfg.LayerNormEps)
		}
		matmul(s.qkv.rows, s.xn.rows, l.attnWT, H, 3*H, l.attnB)
		e.writeKV(b, li)
		e.attention(b, li)
		matmul(s.tmp.rows, s.att.rows, l.projWT, H, H, l.projB)
		addRows(s.h.rows, s.tmp.rows)
		for r := range s.rows {
			layerNorm(s.xn.rows[r], s.h.rows[r], l.ln2W, l.ln2B, cfg.LayerNormEps)
		}
		matmul(s.fc.rows, s.xn.rows, l.fcWT, H, cfg.Inner, l.fcB)
		parallelFor(n, 1, max(1, 4096/cfg.Inner), func(_, lo, hi int) {
			for r := lo; r < hi; r++ {
				e.w.act.apply(s.fc.rows[r])
			}
		})
		matmul(s.tmp.rows, s.fc.rows, l.mlpWT, cfg.Inner, H, l.mlpB)
		addRows(s.h.rows, s.tmp.rows)
	}

	// The LM head runs only on the rows whose logits someone reads: every row of a
	// sequence that asks for context logits (written straight into its output), and
	// the last row of the others that sample or return logits.
	m, mScratch := 0, 0
	for si := range b.Seqs {
		sq := &b.Seqs[si]
		switch {
		case sq.ContextLogits:
			m += len(sq.Tokens)
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
				layerNorm(s.lmIn[len(s.lmIn)-1], s.h.rows[r0+i], e.w.lnfW, e.w.lnfB, cfg.LayerNormEps)
				s.lmOut = append(s.lmOut, out[i*V:(i+1)*V:(i+1)*V])
			}
			s.lastLogits[si] = s.lmOut[len(s.lmOut)-1]
		case sq.Sample || sq.ReturnLogits:
			s.lmIn = append(s.lmIn, s.hf.rows[len(s.lmIn)])
			layerNorm(s.lmIn[len(s.lmIn)-1], s.h.rows[r0+len(sq.Tokens)-1], e.w.lnfW, e.w.lnfB, cfg.LayerNormEps)
			s.lmOut = append(s.lmOut, s.logits.rows[k])
			s.lastLogits[si] = s.logits.rows[k]
			k++
		}
		r0 += len(sq.Tokens)
	}
	matmul(s.lmOut, s.lmIn, e.w.wte, H, V, nil)

	// Sampling reads only its own sequence's row, so sequences are spread over the
	// goroutines, each with its own sampler buffers.
	for len(s.samplers) < runtime.GOMAXPROCS(0) {
		sp := &sampler{}
		sp.init(V)
		s.samplers = append(s.samplers, sp)
	}
	if cap(s.errs) < len(b.Seqs) {
		s.errs = make([]error, len(b.Seqs))
	}
	errs := s.errs[:len(b.Seqs)]
	parallelFor(len(b.Seqs), 1, 1, func(w, lo, hi int) {
		for si := lo; si < hi; si++ {
			errs[si] = e.finish(&b.Seqs[si], s.lastLogits[si], s.samplers[w], &outs[si])
		}
	})
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return outs, nil
}

// finish fills a sequence's output from its last row's logits: the returned logits
// and, when it asks for one, the sampled token.
func (e *CPU) finish(sq *Sequence, last []float32, sp *sampler, out *Output) error {
	out.Token = -1
	if last == nil {
		return nil
	}
	if !sq.Sample {
		if sq.ReturnLogits {
			out.Logits = applyBias(last, sq.Sampling.EmbeddingBias)
		}
		return nil
	}
	tok, lp, logits, err := sp.sample(last, sq)
	if err != nil {
		return fmt.Errorf("engine: sequence %d: %w", sq.ID, err)
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
func (e *CPU) writeKV(b *Batch, li int) {
	H, D, T := e.w.cfg.Hidden, e.w.cfg.HeadDim, e.info.TokensPerBlock
	for r, ri := range e.s.rows {
		blk := int(b.Seqs[ri.seq].Blocks[ri.pos/T])
		slot := ri.pos % T
		qkv := e.s.qkv.rows[r]
		for h := 0; h < e.w.cfg.KVHeads; h++ {
			kb := e.kvBase(blk, li, 0, h) + slot*D
			vb := e.kvBase(blk, li, 1, h) + slot*D
			copy(e.kv[kb:kb+D], qkv[H+h*D:H+(h+1)*D])
			copy(e.kv[vb:vb+D], qkv[2*H+h*D:2*H+(h+1)*D])
		}
	}
}

// attention computes, for every new token and head, causal softmax attention over its
// sequence's cached keys and values at positions 0..pos, into s.att. The (token, head)
// pairs are spread over the goroutines; each reads its sequence's blocks in order.
func (e *CPU) attention(b *Batch, li int) {
	s := &e.s
	heads, D, T := e.w.cfg.Heads, e.w.cfg.HeadDim, e.info.TokensPerBlock
	workers := runtime.GOMAXPROCS(0)
	for len(s.scores) < workers {
		s.scores = append(s.scores, make([]float32, e.info.MaxSeqLen))
	}
	scale := float32(1 / math.Sqrt(float64(D)))
	// The work of a row grows with its position; weigh chunks by a typical length.
	minItems := max(1, 8192/max(1, D*(s.rows[len(s.rows)-1].pos+1)))
	parallelFor(len(s.rows)*heads, 1, minItems, func(w, lo, hi int) {
		scores := s.scores[w]
		for it := lo; it < hi; it++ {
			r, h := it/heads, it%heads
			ri := s.rows[r]
			blocks := b.Seqs[ri.seq].Blocks
			q := s.qkv.rows[r][h*D : (h+1)*D]
			sc := scores[:ri.pos+1]
			best := float32(math.Inf(-1))
			for t0 := 0; t0 <= ri.pos; t0 += T {
				base := e.kvBase(int(blocks[t0/T]), li, 0, h)
				cnt := min(T, ri.pos+1-t0)
				keys := e.kv[base : base+cnt*D]
				for j := 0; j < cnt; j++ {
					v := dot(q, keys[j*D:(j+1)*D]) * scale
					sc[t0+j] = v
					best = max(best, v)
				}
			}
			var sum float32
			for t, v := range sc {
				p := float32(expFast(float64(v - best)))
				sc[t] = p
				sum += p
			}
			out := s.att.rows[r][h*D : (h+1)*D]
			clear(out)
			for t0 := 0; t0 <= ri.pos; t0 += T {
				base := e.kvBase(int(blocks[t0/T]), li, 1, h)
				cnt := min(T, ri.pos+1-t0)
				vals := e.kv[base : base+cnt*D]
				for j := 0; j < cnt; j++ {
					axpy(out, sc[t0+j], vals[j*D:(j+1)*D])
				}
			}
			inv := 1 / sum
			for j := range out {
				out[j] *= inv
			}
		}
	})
}

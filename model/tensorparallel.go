package model

import (
	"fmt"
)

// Tensor parallelism splits each layer over the GPUs of one host as Megatron-LM,
// FasterTransformer and TensorRT-LLM do: the query, key and value projections and the
// MLP's first projection by output rows (each rank its heads, its MLP units), the
// attention output and the MLP's second projection by input columns (each rank's partial
// sums added by an all-reduce, after attention and after the MLP), the embedding and the
// LM head by vocabulary rows (the embedding's lookups added by an all-reduce, the logits
// gathered). A mixture of experts splits each expert (and the shared expert) as the MLP:
// every rank holds its units of every expert and the whole router, routes every token
// alike, and its experts' partial sums join the MLP's all-reduce. Norms and the position
// embedding are whole on every rank; a bias added after an all-reduce is kept by rank 0,
// zero elsewhere. When there are fewer KV heads than ranks, each KV head is held by the
// ranks whose query heads read it.
//
// Expert parallelism (ExpertParallel) is the same split but for the experts: rank r holds
// experts [r·E/N, (r+1)·E/N) whole, routes every token alike over all E (its router
// whole), and computes only the pairs of (token, expert) its experts take, each weighted
// as the whole top-k says; its partial sum, with its units of the shared expert (split as
// under tensor parallelism), joins the same all-reduce. Only the experts' weights and the
// expert range a rank runs differ from tensor parallelism.

// TPLayout is one rank's share of a model split over Size ranks.
type TPLayout struct {
	// Size counts the ranks.
	Size int
	// Heads and KVHeads are each rank's query and KV heads.
	Heads, KVHeads int
	// KVShare is how many ranks hold the same KV heads: 1 when the KV heads are split,
	// Size/kv_heads when there are fewer KV heads than ranks.
	KVShare int
	// Inner is each rank's MLP units.
	Inner int
	// MoEInner and SharedInner are each rank's units of every expert it holds and of the
	// shared expert: under tensor parallelism experts are split as the dense MLP is, each
	// along its inner width; under expert parallelism MoEInner is an expert's whole width.
	MoEInner, SharedInner int
	// Experts, under expert parallelism, is each rank's count of whole experts: rank r
	// holds experts [r·Experts, (r+1)·Experts). 0: every rank holds its units of every
	// expert (tensor parallelism).
	Experts int
	// VocabRows is each rank's rows of the embedding and the LM head: the vocabulary
	// divided by Size, rounded up; the last rank's rows past the vocabulary are zero.
	VocabRows int
}

// TensorParallel checks that the model splits over n ranks and returns the layout.
// Its errors name the config field that does not divide.
func (c *Config) TensorParallel(n int) (TPLayout, error) { return c.Parallel(n, false) }

// ExpertParallel checks that the model splits over n ranks with its experts spread whole
// over them (expert parallelism) and returns the layout. It refuses a model without
// experts, and experts that n does not divide, naming the numbers.
func (c *Config) ExpertParallel(n int) (TPLayout, error) { return c.Parallel(n, true) }

// Parallel is ExpertParallel(n) when experts, else TensorParallel(n).
func (c *Config) Parallel(n int, experts bool) (TPLayout, error) {
	if n < 1 {
		return TPLayout{}, fmt.Errorf("tensor_parallel_size %d: want at least 1", n)
	}
	if c.Heads%n != 0 {
		return TPLayout{}, fmt.Errorf("tensor_parallel_size %d does not divide the model's %d attention heads (num_attention_heads, n_head)", n, c.Heads)
	}
	l := TPLayout{Size: n, Heads: c.Heads / n, KVShare: 1, VocabRows: (c.VocabSize + n - 1) / n}
	switch {
	case c.KVHeads%n == 0:
		l.KVHeads = c.KVHeads / n
	case n%c.KVHeads == 0:
		// Each KV head is read by heads/kv_heads query heads; a rank's heads/n of them
		// read one KV head when n is a multiple of kv_heads (heads is, already).
		l.KVHeads, l.KVShare = 1, n/c.KVHeads
	default:
		return TPLayout{}, fmt.Errorf("tensor_parallel_size %d neither divides nor is a multiple of the model's %d KV heads (num_key_value_heads)", n, c.KVHeads)
	}
	if c.Inner%n != 0 {
		return TPLayout{}, fmt.Errorf("tensor_parallel_size %d does not divide the MLP's %d units (intermediate_size, n_inner)", n, c.Inner)
	}
	l.Inner = c.Inner / n
	if experts && c.MoE == nil {
		return TPLayout{}, fmt.Errorf("expert parallelism over %d ranks: the model has no mixture of experts (its MLPs are dense)", n)
	}
	if m := c.MoE; m != nil && experts {
		if m.Experts%n != 0 {
			return TPLayout{}, fmt.Errorf("expert parallelism over %d ranks (tensor_parallel_size): %d does not divide the model's %d experts (num_experts, num_local_experts)", n, n, m.Experts)
		}
		if m.SharedInner%n != 0 {
			return TPLayout{}, fmt.Errorf("tensor_parallel_size %d does not divide the shared expert's %d units (shared_expert_intermediate_size)", n, m.SharedInner)
		}
		l.Experts, l.MoEInner, l.SharedInner = m.Experts/n, m.Inner, m.SharedInner/n
	} else if m != nil {
		if m.Inner%n != 0 {
			return TPLayout{}, fmt.Errorf("tensor_parallel_size %d does not divide the experts' %d units (moe_intermediate_size, or Mixtral's intermediate_size)", n, m.Inner)
		}
		if m.SharedInner%n != 0 {
			return TPLayout{}, fmt.Errorf("tensor_parallel_size %d does not divide the shared expert's %d units (shared_expert_intermediate_size)", n, m.SharedInner)
		}
		l.MoEInner, l.SharedInner = m.Inner/n, m.SharedInner/n
	}
	return l, nil
}

// RankConfig is the config of rank's share: its heads, KV heads, MLP units, vocabulary
// rows and, under expert parallelism, its experts; everything else as c.
func (c *Config) RankConfig(l TPLayout, rank int) Config {
	r := *c
	r.Heads, r.KVHeads, r.Inner, r.VocabSize = l.Heads, l.KVHeads, l.Inner, l.VocabRows
	if c.MoE != nil {
		m := *c.MoE
		m.Inner, m.SharedInner = l.MoEInner, l.SharedInner
		if l.Experts > 0 {
			m.FirstLocal, m.Local = rank*l.Experts, l.Experts
		}
		r.MoE = &m
	}
	return r
}

// ShardWeights returns rank's share of a model's weights (as Checkpoint.Weights gives
// them) under l: the canonical shapes of RankConfig(l). A share that is a run of stored
// rows is a view into the same data; others (GPT-2's transposed matrices split by rows,
// matrices split by columns, padding, zeroed biases) are copies.
func ShardWeights(ws []Weight, c *Config, l TPLayout, rank int) ([]Weight, error) {
	if rank < 0 || rank >= l.Size {
		return nil, fmt.Errorf("tensor parallel rank %d outside [0, %d)", rank, l.Size)
	}
	D := c.HeadDim
	q0 := rank * l.Heads * D
	kvFirst := (rank / l.KVShare) * l.KVHeads
	k0 := c.Heads*D + kvFirst*D
	v0 := (c.Heads+c.KVHeads)*D + kvFirst*D
	qkv := [][2]int{{q0, q0 + l.Heads*D}, {k0, k0 + l.KVHeads*D}, {v0, v0 + l.KVHeads*D}}
	u0 := rank * l.Inner
	up := [][2]int{{u0, u0 + l.Inner}}
	if c.GatedMLP {
		up = append(up, [2]int{c.Inner + u0, c.Inner + u0 + l.Inner})
	}
	// Each expert's gate and up rows of this rank's units, expert by expert; the shared
	// expert's likewise.
	// Under expert parallelism, the rank's experts' rows whole: every row of each, its
	// down projection's hidden rows.
	var experts, shared [][2]int
	var down [2]int
	if m := c.MoE; m != nil {
		e0 := rank * l.MoEInner
		switch {
		case l.Experts > 0:
			x0, x1 := rank*l.Experts, (rank+1)*l.Experts
			experts = [][2]int{{x0 * 2 * m.Inner, x1 * 2 * m.Inner}}
			down = [2]int{x0 * c.Hidden, x1 * c.Hidden}
		default:
			for e := range m.Experts {
				b := e * 2 * m.Inner
				experts = append(experts, [2]int{b + e0, b + e0 + l.MoEInner}, [2]int{b + m.Inner + e0, b + m.Inner + e0 + l.MoEInner})
			}
		}
		s0 := rank * l.SharedInner
		shared = [][2]int{{s0, s0 + l.SharedInner}, {m.SharedInner + s0, m.SharedInner + s0 + l.SharedInner}}
	}
	out := make([]Weight, 0, len(ws))
	for i := range ws {
		w := &ws[i]
		for _, p := range w.Parts {
			if p.Perm != nil || IsQuantized(p.Tensor.DType) {
				return nil, fmt.Errorf("%s: a GGUF file's weights (row-permuted or quantized) are not split for tensor parallelism", w)
			}
		}
		var s Weight
		var err error
		switch w.Role {
		case RoleEmbed, RoleLMHead:
			s, err = w.vocabRows(rank*l.VocabRows, l.VocabRows)
		case RoleQKV, RoleQKVBias:
			s, err = w.rowRanges(qkv)
		case RoleUp, RoleUpBias:
			s, err = w.rowRanges(up)
		case RoleOut:
			s, err = w.colRange(q0, q0+l.Heads*D)
		case RoleDown:
			s, err = w.colRange(u0, u0+l.Inner)
		case RoleExpertUp:
			s, err = w.rowRanges(experts)
		case RoleExpertDown:
			if l.Experts > 0 {
				s, err = w.rowRanges([][2]int{down})
			} else {
				s, err = w.colRange(rank*l.MoEInner, (rank+1)*l.MoEInner)
			}
		case RoleSharedUp:
			s, err = w.rowRanges(shared)
		case RoleSharedDown:
			s, err = w.colRange(rank*l.SharedInner, (rank+1)*l.SharedInner)
		case RoleOutBias, RoleDownBias:
			s = *w
			if rank > 0 {
				s, err = w.zeroRows(w.Rows)
			}
		default:
			s = *w
		}
		if err != nil {
			return nil, fmt.Errorf("tensor parallel rank %d of %d: %s: %w", rank, l.Size, w, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// elemSize is the byte size of the weight's stored elements.
func (w *Weight) elemSize() (int, error) {
	if len(w.Parts) == 0 {
		return 0, fmt.Errorf("no tensors")
	}
	dt := w.Parts[0].Tensor.DType
	es, ok := dtypeSizes[dt]
	if !ok {
		return 0, fmt.Errorf("dtype %s", dt)
	}
	for _, p := range w.Parts {
		if p.Tensor.DType != dt {
			return 0, fmt.Errorf("its tensors mix %s and %s", dt, p.Tensor.DType)
		}
	}
	return es, nil
}

// rowRanges is the weight made of the canonical rows in ranges, in order.
func (w *Weight) rowRanges(ranges [][2]int) (Weight, error) {
	es, err := w.elemSize()
	if err != nil {
		return Weight{}, err
	}
	s := Weight{Role: w.Role, Layer: w.Layer, Cols: w.Cols}
	for _, rg := range ranges {
		if rg[0] < 0 || rg[1] > w.Rows || rg[0] > rg[1] {
			return Weight{}, fmt.Errorf("rows [%d, %d) outside its %d", rg[0], rg[1], w.Rows)
		}
		off := 0
		for _, p := range w.Parts {
			lo, hi := max(rg[0], off)-off, min(rg[1], off+p.Rows)-off
			if lo < hi {
				s.Parts = append(s.Parts, p.rows(lo, hi, w.Cols, es))
				s.Rows += hi - lo
			}
			off += p.Rows
		}
	}
	return s, nil
}

// rows is the part's rows [lo, hi) of a weight of cols columns: a view of stored rows,
// or a copy for a transposed part (whose rows are stored columns).
func (p Part) rows(lo, hi, cols, es int) Part {
	t := p.Tensor
	n := hi - lo
	name := fmt.Sprintf("%s[rows %d:%d]", t.Name, lo, hi)
	if !p.Transposed || cols == 1 {
		shape := []int{n, cols}
		if len(t.Shape) == 1 {
			shape = []int{n}
		}
		return Part{Tensor: &Tensor{Name: name, DType: t.DType, Shape: shape, Data: t.Data[lo*cols*es : hi*cols*es]}, Rows: n}
	}
	// Stored [cols][p.Rows]: each stored row's run [lo, hi).
	data := make([]byte, cols*n*es)
	for c := range cols {
		copy(data[c*n*es:(c+1)*n*es], t.Data[(c*p.Rows+lo)*es:(c*p.Rows+hi)*es])
	}
	return Part{Tensor: &Tensor{Name: name, DType: t.DType, Shape: []int{cols, n}, Data: data}, Transposed: true, Rows: n}
}

// colRange is the weight made of the canonical columns [c0, c1) of every row: a view
// for a transposed part (whose columns are stored rows), else a copy.
func (w *Weight) colRange(c0, c1 int) (Weight, error) {
	if c0 < 0 || c1 > w.Cols || c0 > c1 {
		return Weight{}, fmt.Errorf("columns [%d, %d) outside its %d", c0, c1, w.Cols)
	}
	es, err := w.elemSize()
	if err != nil {
		return Weight{}, err
	}
	n := c1 - c0
	s := Weight{Role: w.Role, Layer: w.Layer, Rows: w.Rows, Cols: n}
	for _, p := range w.Parts {
		t := p.Tensor
		name := fmt.Sprintf("%s[cols %d:%d]", t.Name, c0, c1)
		if p.Transposed {
			view := t.Data[c0*p.Rows*es : c1*p.Rows*es]
			s.Parts = append(s.Parts, Part{Tensor: &Tensor{Name: name, DType: t.DType, Shape: []int{n, p.Rows}, Data: view}, Transposed: true, Rows: p.Rows})
			continue
		}
		data := make([]byte, p.Rows*n*es)
		for r := range p.Rows {
			copy(data[r*n*es:(r+1)*n*es], t.Data[(r*w.Cols+c0)*es:(r*w.Cols+c1)*es])
		}
		s.Parts = append(s.Parts, Part{Tensor: &Tensor{Name: name, DType: t.DType, Shape: []int{p.Rows, n}, Data: data}, Rows: p.Rows})
	}
	return s, nil
}

// vocabRows is the weight's rows [first, first+n), the ones past its rows zero.
func (w *Weight) vocabRows(first, n int) (Weight, error) {
	have := max(0, min(n, w.Rows-first))
	s, err := w.rowRanges([][2]int{{first, first + have}})
	if err != nil || have == n {
		return s, err
	}
	pad, err := w.zeroRows(n - have)
	if err != nil {
		return Weight{}, err
	}
	s.Parts = append(s.Parts, pad.Parts...)
	s.Rows += pad.Rows
	return s, nil
}

// zeroRows is a weight of n zero rows of w's columns and stored type.
func (w *Weight) zeroRows(n int) (Weight, error) {
	es, err := w.elemSize()
	if err != nil {
		return Weight{}, err
	}
	shape := []int{n, w.Cols}
	if w.Cols == 1 {
		shape = []int{n}
	}
	t := &Tensor{Name: fmt.Sprintf("zero %s", w.Role), DType: w.Parts[0].Tensor.DType, Shape: shape, Data: make([]byte, n*w.Cols*es)}
	return Weight{Role: w.Role, Layer: w.Layer, Rows: n, Cols: w.Cols, Parts: []Part{{Tensor: t, Rows: n}}}, nil
}

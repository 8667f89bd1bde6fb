package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Part is one checkpoint tensor of a weight.
type Part struct {
	// Tensor is the stored tensor (its Data points into the checkpoint's mapping).
	Tensor *Tensor
	// Transposed says the tensor is stored [cols][Rows] (GPT-2's Conv1D) rather than
	// [Rows][cols].
	Transposed bool
	// Rows is the number of the weight's rows this part holds.
	Rows int
	// Scale holds the dequantization scales of a part stored in F8_E4M3, F32
	// [ceil(Rows/br)][ceil(cols/bc)] for blocks of br × bc weights (a whole dimension
	// where one scale covers it): the weight is the stored value times its block's scale.
	// Nil for a part in a float type.
	Scale *Tensor
	// BlockRows and BlockCols are the br × bc weights one scale covers (a block is cut
	// short at the matrix's edge).
	BlockRows, BlockCols int
	// Perm, when not nil, says stored row i is the part's row Perm[i]: a GGUF file's
	// LLaMA query and key projections store each head's rows in the order of llama.cpp's
	// rotary pairs, which this maps back (see gguf_llama.go).
	Perm []int32
}

// Weight is one role's weight: its parts joined along the rows give the canonical
// [Rows][Cols] matrix ([Rows] for a vector, Cols 1).
type Weight struct {
	// Role says where the engine uses the weight.
	Role Role
	// Layer is the block it belongs to, -1 for the model's own weights.
	Layer int
	// Rows and Cols give the canonical shape, whatever the checkpoint's layout.
	Rows, Cols int
	// Parts hold the data, in row order.
	Parts []Part
}

// String names the weight by role and layer and its tensors, for messages.
func (w *Weight) String() string {
	names := make([]string, len(w.Parts))
	for i, p := range w.Parts {
		names[i] = p.Tensor.Name
	}
	where := w.Role.String()
	if w.Layer >= 0 {
		where = fmt.Sprintf("layer %d %s", w.Layer, w.Role)
	}
	return fmt.Sprintf("%s (%s)", where, strings.Join(names, " + "))
}

// Float32 converts the weight to float32 in the canonical layout, [Rows][Cols].
func (w *Weight) Float32() ([]float32, error) {
	out := make([]float32, w.Rows*w.Cols)
	row := 0
	for _, p := range w.Parts {
		dst := out[row*w.Cols : (row+p.Rows)*w.Cols]
		if p.quantized() {
			if err := p.dequantize(dst, w.Cols); err != nil {
				return nil, err
			}
			row += p.Rows
			continue
		}
		v, err := p.Tensor.Float32()
		if err != nil {
			return nil, err
		}
		switch {
		case p.Transposed:
			transposeInto(dst, v, w.Cols, p.Rows)
		case p.Perm != nil:
			for i, r := range p.Perm {
				copy(dst[int(r)*w.Cols:int(r+1)*w.Cols], v[i*w.Cols:(i+1)*w.Cols])
			}
		default:
			copy(dst, v)
		}
		row += p.Rows
	}
	return out, nil
}

// quantized says the part's values need its scales or blocks to be read: FP8 with
// scales, or one of GGML's block formats.
func (p *Part) quantized() bool { return p.Scale != nil || IsQuantized(p.Tensor.DType) }

// dequantize writes a quantized part's rows into dst [Rows][cols], in order.
func (p *Part) dequantize(dst []float32, cols int) error {
	if p.Scale != nil {
		return dequantizeFP8(dst, p, cols)
	}
	rb, err := RowBytes(p.Tensor.DType, cols)
	if err != nil {
		return fmt.Errorf("tensor %s: %w", p.Tensor.Name, err)
	}
	if len(p.Tensor.Data) != p.Rows*rb {
		return fmt.Errorf("tensor %s: %d bytes for %d rows of %d", p.Tensor.Name, len(p.Tensor.Data), p.Rows, rb)
	}
	for i := range p.Rows {
		r := i
		if p.Perm != nil {
			r = int(p.Perm[i])
		}
		if err := DequantizeRow(p.Tensor.DType, p.Tensor.Data[i*rb:(i+1)*rb], dst[r*cols:(r+1)*cols]); err != nil {
			return fmt.Errorf("tensor %s: %w", p.Tensor.Name, err)
		}
	}
	return nil
}

// transposeInto writes the [cols][rows] transpose of the row-major [rows][cols] matrix w
// into t.
func transposeInto(t, w []float32, rows, cols int) {
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
}

// partRows splits a role's rows among n parts: a fused QKV's query, key and value
// projections, or a gated MLP's gate and up projections.
func partRows(c *Config, r Role, rows, n int) []int {
	switch {
	case n == 1:
		return []int{rows}
	case (r == RoleQKV || r == RoleQKVBias) && n == 3:
		return []int{c.Heads * c.HeadDim, c.KVHeads * c.HeadDim, c.KVHeads * c.HeadDim}
	case (r == RoleUp || r == RoleUpBias) && n == 2:
		return []int{c.Inner, c.Inner}
	case c.MoE != nil && (r == RoleExpertUp && n == 2*c.MoE.Experts || r == RoleExpertDown && n == c.MoE.Experts ||
		r == RoleSharedUp && n == 2):
		// Each expert's gate and up projections, or its down projection; the shared
		// expert's gate and up.
		split := make([]int, n)
		for i := range split {
			split[i] = rows / n
		}
		return split
	}
	return nil
}

// Weights resolves every role of the checkpoint's architecture to its tensors and
// checks them — present, a float dtype, the shape the config implies — before anything
// is converted. It first checks that the checkpoint holds exactly the config's number of
// layers, so that a config asking for more than the files hold fails at once with a
// message naming the field. The weights point into the checkpoint's mapping: valid until
// Close.
func (c *Checkpoint) Weights() ([]Weight, error) {
	if c.fam == nil {
		return nil, errNoFamily
	}
	cfg := &c.Config
	if err := c.checkLayerCount(); err != nil {
		return nil, err
	}
	var out []Weight
	add := func(r Role, l int) error {
		rows, cols, present := cfg.Shape(r)
		if l >= 0 {
			rows, cols, present = cfg.LayerShape(r, l)
		}
		if !present {
			return nil
		}
		names := c.fam.names(cfg, r, l)
		if names == nil {
			return fmt.Errorf("the %s loader has no tensor for role %s", c.fam.name, r)
		}
		split := partRows(cfg, r, rows, len(names))
		if split == nil {
			return fmt.Errorf("role %s: %d tensors do not split %d rows", r, len(names), rows)
		}
		w := Weight{Role: r, Layer: l, Rows: rows, Cols: cols}
		for i, pn := range names {
			t, err := c.Tensor(pn.name)
			if err != nil {
				return err
			}
			var want []int
			switch {
			case r.IsVector():
				want = []int{split[i]}
			case pn.transposed:
				want = []int{cols, split[i]}
			default:
				want = []int{split[i], cols}
			}
			fp8 := t.DType == "F8_E4M3" && !r.IsVector() && !pn.transposed
			switch {
			case t.DType == "F32" || t.DType == "F16" || t.DType == "BF16" || fp8:
			case c.gguf == nil:
				return fmt.Errorf("tensor %s: dtype %s, expected F32, F16 or BF16%s", t.Name, t.DType, c.fp8Hint(r, pn.transposed))
			case r.IsVector() || !IsQuantized(t.DType):
				return fmt.Errorf("tensor %s: GGML type %s, expected F32, F16 or BF16 (or, for a matrix, Q8_0, Q4_K or Q6_K)", t.Name, t.DType)
			}
			if !slices.Equal(t.Shape, want) {
				return fmt.Errorf("tensor %s: shape %v, expected %v for %s", t.Name, t.Shape, want, c.shapeWhy(r))
			}
			var scale *Tensor
			var br, bc int
			if fp8 {
				if scale, br, bc, err = c.fp8Scale(t, split[i], cols); err != nil {
					return err
				}
			}
			if pn.plusOne {
				if t, err = plusOne(t); err != nil {
					return err
				}
			}
			p := Part{Tensor: t, Transposed: pn.transposed, Rows: split[i], Scale: scale, BlockRows: br, BlockCols: bc}
			if pn.ropeHeads > 0 {
				if p.Perm, err = ropePerm(split[i], pn.ropeHeads); err != nil {
					return fmt.Errorf("tensor %s: %w", t.Name, err)
				}
			}
			w.Parts = append(w.Parts, p)
		}
		out = append(out, w)
		return nil
	}
	for r := Role(0); r < FirstLayerRole; r++ {
		if err := add(r, -1); err != nil {
			return nil, err
		}
	}
	for l := range cfg.Layers {
		for r := FirstLayerRole; r < NumRoles; r++ {
			if err := add(r, l); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// plusOne returns a float32 copy of vector t with 1 added to every element, as Gemma's
// RMSNorm computes its scale (1 + w.float()).
func plusOne(t *Tensor) (*Tensor, error) {
	v, err := t.Float32()
	if err != nil {
		return nil, err
	}
	data := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(1+x))
	}
	return &Tensor{Name: t.Name + " + 1", DType: "F32", Shape: slices.Clone(t.Shape), Data: data}, nil
}

// shapeWhy names the config fields a role's shape comes from, for messages.
func (c *Checkpoint) shapeWhy(r Role) string {
	f := func(k string) string {
		if n, ok := c.fields[k]; ok {
			return n
		}
		return k
	}
	cfg := &c.Config
	switch r {
	case RoleEmbed, RoleLMHead:
		return fmt.Sprintf("%s %d × %s %d", f("vocab"), cfg.VocabSize, f("hidden"), cfg.Hidden)
	case RolePosEmbed:
		return fmt.Sprintf("%s %d × %s %d", f("positions"), cfg.MaxPositions, f("hidden"), cfg.Hidden)
	case RoleQKV, RoleQKVBias, RoleOut, RoleOutBias:
		return fmt.Sprintf("%s %d, %s %d, head_dim %d, %s %d", f("heads"), cfg.Heads, f("kv_heads"), cfg.KVHeads,
			cfg.HeadDim, f("hidden"), cfg.Hidden)
	case RoleUp, RoleUpBias, RoleDown, RoleDownBias:
		return fmt.Sprintf("%s %d, %s %d", f("inner"), cfg.Inner, f("hidden"), cfg.Hidden)
	case RoleQNorm, RoleKNorm:
		return fmt.Sprintf("head_dim %d", cfg.HeadDim)
	case RoleRouter, RoleExpertUp, RoleExpertDown:
		return fmt.Sprintf("%s %d, %s %d, %s %d", f("experts"), cfg.MoE.Experts, f("moe_inner"), cfg.MoE.Inner,
			f("hidden"), cfg.Hidden)
	case RoleSharedUp, RoleSharedDown, RoleSharedGate:
		return fmt.Sprintf("shared_expert_intermediate_size %d, %s %d", cfg.MoE.SharedInner, f("hidden"), cfg.Hidden)
	}
	return fmt.Sprintf("%s %d", f("hidden"), cfg.Hidden)
}

// checkLayerCount compares the config's layer count with the layers the checkpoint's
// tensor names hold.
func (c *Checkpoint) checkLayerCount() error {
	root := c.fam.layerPrefix(0)
	root = root[:len(root)-2] // "h.0." → "h."
	seen := map[int]bool{}
	for name := range c.tensors {
		for _, prefix := range c.fam.prefixes() {
			if rest, ok := strings.CutPrefix(name, prefix); ok {
				name = rest
				break
			}
		}
		rest, ok := strings.CutPrefix(name, root)
		if !ok {
			continue
		}
		num, _, ok := strings.Cut(rest, ".")
		if n, err := strconv.Atoi(num); ok && err == nil && n >= 0 {
			seen[n] = true
		}
	}
	field := c.fields["layers"]
	if len(seen) == 0 {
		return fmt.Errorf("field %s: %d, but the checkpoint holds no tensor of a layer (%s0.…)", field, c.Config.Layers, root)
	}
	idx := make([]int, 0, len(seen))
	for n := range seen {
		idx = append(idx, n)
	}
	sort.Ints(idx)
	if len(idx) != c.Config.Layers || idx[len(idx)-1] != len(idx)-1 {
		return fmt.Errorf("field %s: %d, but the checkpoint's tensors hold layers %s%d … %s%d (%d layers)",
			field, c.Config.Layers, root, idx[0], root, idx[len(idx)-1], len(idx))
	}
	return nil
}

// Float32 holds a model's weights converted to float32 in the canonical layout, as the
// CPU engine computes with them.
type Float32 struct {
	// Config describes the architecture the weights are for.
	Config Config
	// Model holds the model-level roles (those before FirstLayerRole); nil where absent.
	Model [NumRoles][]float32
	// Layers hold each block's roles (from FirstLayerRole on); nil where absent.
	Layers [][NumRoles][]float32
}

// Float32Weights converts every weight of the checkpoint to float32. The result owns its
// memory; the checkpoint may be closed afterwards.
func (c *Checkpoint) Float32Weights() (*Float32, error) {
	ws, err := c.Weights()
	if err != nil {
		return nil, err
	}
	return NewFloat32(c.Config, ws)
}

// NewFloat32 converts weights of the model cfg describes (Checkpoint.Weights, or one
// rank's share from ShardWeights with RankConfig) to float32.
func NewFloat32(cfg Config, ws []Weight) (*Float32, error) {
	m := &Float32{Config: cfg, Layers: make([][NumRoles][]float32, cfg.Layers)}
	for i := range ws {
		w := &ws[i]
		v, err := w.Float32()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w, err)
		}
		if w.Layer < 0 {
			m.Model[w.Role] = v
		} else {
			m.Layers[w.Layer][w.Role] = v
		}
	}
	return m, nil
}

// LoadFloat32 opens the checkpoint folder dir, converts its weights to float32 and
// closes it. Every error names dir once.
func LoadFloat32(dir string) (*Float32, error) {
	c, err := Open(dir)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	m, err := c.Float32Weights()
	// The weights are copies, so a failed unmap does not spoil them; it is still an
	// error, since the mapping may be left behind.
	if cerr := c.Close(); err == nil && cerr != nil {
		return nil, fmt.Errorf("load %s: close: %w", dir, cerr)
	}
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	return m, nil
}

// LMHead is the LM head's weights [vocab][hidden]: the embedding when tied.
func (m *Float32) LMHead() []float32 {
	if m.Config.TiedHead {
		return m.Model[RoleEmbed]
	}
	return m.Model[RoleLMHead]
}

// errNoFamily is returned by a Checkpoint not made by Open.
var errNoFamily = errors.New("checkpoint has no architecture (not opened with Open)")

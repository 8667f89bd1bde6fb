package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
)

// FP8 checkpoints as Hugging Face publishes them come in two formats, both storing a
// linear layer's weight as float8_e4m3fn (safetensors F8_E4M3) [out][in] beside its
// dequantization scales, the real weight being the stored value times its scale:
//
//   - transformers' fine-grained FP8, quantization_config {"quant_method": "fp8",
//     "weight_block_size": [128, 128] or null, "activation_scheme": "dynamic"|"static",
//     "modules_to_not_convert": [...]}: X.weight_scale_inv, float32
//     [ceil(out/128)][ceil(in/128)] (a scalar without blocks); X.activation_scale under
//     static activations.
//   - compressed-tensors float quantization, quantization_config {"quant_method":
//     "compressed-tensors", "format": "float-quantized"|"naive-quantized",
//     "config_groups": {name: {"targets", "weights": {"num_bits": 8, "type": "float",
//     "strategy": "tensor"|"channel"|"block", "block_structure"}, "input_activations"}},
//     "ignore": [...]}: X.weight_scale [1] (tensor), [out][1] (channel) or
//     [ceil(out/b)][ceil(in/b)] (block); X.input_scale under static activations.
//
// A module the config leaves out (lm_head, the router) is stored in a float type; the
// loader goes by each tensor's dtype and requires the scales of every F8_E4M3 one.

// Quant describes a checkpoint's FP8 weight quantization, read from quantization_config.
type Quant struct {
	// Method is the quant_method: "fp8" or "compressed-tensors".
	Method string
	// ScaleSuffix replaces a weight's trailing "weight" to name its scale tensor.
	ScaleSuffix string
	// BlockRows and BlockCols are the rows and columns one scale covers; 0 means the whole
	// dimension (a per-tensor scale has both 0, a per-channel one BlockRows 1).
	BlockRows, BlockCols int
	// StaticActivations says the checkpoint gives activation scales; engines compute
	// per-token scales instead (dynamic), which the static ones only bound.
	StaticActivations bool
	// Skip lists the modules the config keeps unquantized (modules_to_not_convert,
	// ignore), for logs: the dtype of each tensor decides.
	Skip []string
}

// RowScaled says whether each weight row has one scale (per-channel and per-tensor
// scales), the recipe whose activations the GPU's FP8 GEMMs round a whole row at a time.
func (q *Quant) RowScaled() bool { return q.BlockCols == 0 }

// String describes the scheme for logs and messages.
func (q *Quant) String() string {
	var g string
	switch {
	case q.BlockRows == 0 && q.BlockCols == 0:
		g = "per-tensor"
	case q.BlockRows == 1 && q.BlockCols == 0:
		g = "per-channel"
	default:
		g = fmt.Sprintf("%d×%d block", q.BlockRows, q.BlockCols)
	}
	act := "dynamic"
	if q.StaticActivations {
		act = "static"
	}
	return fmt.Sprintf("%s float8_e4m3fn weights, %s scales, %s activations", q.Method, g, act)
}

// maxFP8Block bounds a configured block's side.
const maxFP8Block = 1 << 16

// parseQuant reads config.json's quantization_config; nil when there is none.
func parseQuant(raw json.RawMessage) (*Quant, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var head struct {
		// Method names the quantization scheme.
		Method string `json:"quant_method"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("field quantization_config: %w", err)
	}
	switch head.Method {
	case "fp8":
		return parseFineGrainedFP8(raw)
	case "compressed-tensors":
		return parseCompressedTensors(raw)
	case "":
		return nil, fmt.Errorf("field quantization_config.quant_method: missing")
	}
	return nil, fmt.Errorf("field quantization_config.quant_method: %q is not supported (gollm loads fp8 and compressed-tensors float8 checkpoints, or quantizes a float checkpoint with quantization: fp8)", head.Method)
}

// parseFineGrainedFP8 reads transformers' FineGrainedFP8Config.
func parseFineGrainedFP8(raw json.RawMessage) (*Quant, error) {
	var c struct {
		// Activation is "dynamic" or "static".
		Activation *string `json:"activation_scheme"`
		// Block is [rows, cols] a scale covers; null for one scale a tensor.
		Block []int `json:"weight_block_size"`
		// Skip are the modules kept in the model's dtype.
		Skip []string `json:"modules_to_not_convert"`
		// Fmt is the float8 format ("e4m3").
		Fmt *string `json:"fmt"`
		// ScaleFmt is "float", or "ue8m0" for power-of-two scales.
		ScaleFmt *string `json:"scale_fmt"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("field quantization_config: %w", err)
	}
	q := &Quant{Method: "fp8", ScaleSuffix: "weight_scale_inv", Skip: c.Skip}
	if c.Activation != nil {
		switch strings.ToLower(*c.Activation) {
		case "dynamic":
		case "static":
			q.StaticActivations = true
		default:
			return nil, fmt.Errorf("field quantization_config.activation_scheme: %q is not dynamic or static", *c.Activation)
		}
	}
	if c.Fmt != nil && *c.Fmt != "e4m3" {
		return nil, fmt.Errorf("field quantization_config.fmt: %q is not supported (only e4m3)", *c.Fmt)
	}
	if c.ScaleFmt != nil && *c.ScaleFmt != "float" && *c.ScaleFmt != "ue8m0" {
		return nil, fmt.Errorf("field quantization_config.scale_fmt: %q is not float or ue8m0", *c.ScaleFmt)
	}
	if c.Block != nil {
		if len(c.Block) != 2 || c.Block[0] < 1 || c.Block[1] < 1 || c.Block[0] > maxFP8Block || c.Block[1] > maxFP8Block {
			return nil, fmt.Errorf("field quantization_config.weight_block_size: %v is not two sizes in [1, %d]", c.Block, maxFP8Block)
		}
		q.BlockRows, q.BlockCols = c.Block[0], c.Block[1]
	}
	return q, nil
}

// ctArgs are compressed-tensors' QuantizationArgs, as much as gollm reads.
type ctArgs struct {
	// Bits is num_bits.
	Bits int `json:"num_bits"`
	// Type is "float" or "int".
	Type string `json:"type"`
	// Strategy is tensor, channel, group, block or token.
	Strategy string `json:"strategy"`
	// Block is block_structure [rows, cols].
	Block []int `json:"block_structure"`
	// Dynamic says the scales are computed at run time.
	Dynamic json.RawMessage `json:"dynamic"`
	// Symmetric must hold for float quantization.
	Symmetric *bool `json:"symmetric"`
}

// parseCompressedTensors reads a compressed-tensors quantization_config of FP8 weights.
func parseCompressedTensors(raw json.RawMessage) (*Quant, error) {
	var c struct {
		// Format is the checkpoint's compression format.
		Format string `json:"format"`
		// Groups map a name to the modules it targets and their schemes.
		Groups map[string]struct {
			// Weights are the weights' quantization arguments.
			Weights *ctArgs `json:"weights"`
			// Input are the activations' quantization arguments.
			Input *ctArgs `json:"input_activations"`
			// Format may override the checkpoint's per group.
			Format string `json:"format"`
		} `json:"config_groups"`
		// Ignore are the modules kept unquantized.
		Ignore []string `json:"ignore"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("field quantization_config: %w", err)
	}
	okFormat := func(f string) bool { return f == "float-quantized" || f == "naive-quantized" }
	if !okFormat(c.Format) {
		return nil, fmt.Errorf("field quantization_config.format: %q is not supported (gollm loads float-quantized and naive-quantized FP8)", c.Format)
	}
	if len(c.Groups) == 0 {
		return nil, fmt.Errorf("field quantization_config.config_groups: missing or empty")
	}
	names := make([]string, 0, len(c.Groups))
	for n := range c.Groups {
		names = append(names, n)
	}
	slices.Sort(names)
	var q *Quant
	for _, n := range names {
		g := c.Groups[n]
		where := "quantization_config.config_groups." + n
		if g.Format != "" && !okFormat(g.Format) {
			return nil, fmt.Errorf("field %s.format: %q is not supported (gollm loads float-quantized and naive-quantized FP8)", where, g.Format)
		}
		w := g.Weights
		if w == nil {
			return nil, fmt.Errorf("field %s.weights: missing (gollm loads weight quantization only)", where)
		}
		if w.Bits != 8 || w.Type != "float" {
			return nil, fmt.Errorf("field %s.weights: %d-bit %s is not supported (gollm loads 8-bit float weights)", where, w.Bits, w.Type)
		}
		if w.Symmetric != nil && !*w.Symmetric {
			return nil, fmt.Errorf("field %s.weights.symmetric: false is not supported", where)
		}
		if d := string(w.Dynamic); d != "" && d != "false" && d != "null" {
			return nil, fmt.Errorf("field %s.weights.dynamic: %s is not supported (weights carry their scales)", where, d)
		}
		gq := &Quant{Method: "compressed-tensors", ScaleSuffix: "weight_scale", Skip: c.Ignore}
		switch w.Strategy {
		case "tensor":
		case "channel":
			gq.BlockRows = 1
		case "block":
			if len(w.Block) != 2 || w.Block[0] < 1 || w.Block[1] < 1 || w.Block[0] > maxFP8Block || w.Block[1] > maxFP8Block {
				return nil, fmt.Errorf("field %s.weights.block_structure: %v is not two sizes in [1, %d]", where, w.Block, maxFP8Block)
			}
			gq.BlockRows, gq.BlockCols = w.Block[0], w.Block[1]
		default:
			return nil, fmt.Errorf("field %s.weights.strategy: %q is not supported (tensor, channel or block)", where, w.Strategy)
		}
		if a := g.Input; a != nil {
			if a.Bits != 8 || a.Type != "float" {
				return nil, fmt.Errorf("field %s.input_activations: %d-bit %s is not supported (8-bit float)", where, a.Bits, a.Type)
			}
			switch d := string(a.Dynamic); {
			case d == "true" && (a.Strategy == "token" || a.Strategy == "tensor"):
			case (d == "false" || d == "") && a.Strategy == "tensor":
				gq.StaticActivations = true
			default:
				return nil, fmt.Errorf("field %s.input_activations: strategy %q with dynamic %s is not supported (dynamic per token, or a static per-tensor scale)", where, a.Strategy, d)
			}
		}
		if q != nil && (q.BlockRows != gq.BlockRows || q.BlockCols != gq.BlockCols || q.StaticActivations != gq.StaticActivations) {
			return nil, fmt.Errorf("field %s: %s differs from %s; one scheme a checkpoint is supported", where, gq, q)
		}
		q = gq
	}
	return q, nil
}

// block is the rows and columns one scale covers in a rows × cols weight under q, a zero
// block side covering the dimension.
func (q *Quant) block(rows, cols int) (int, int) {
	br, bc := q.BlockRows, q.BlockCols
	if br == 0 {
		br = rows
	}
	if bc == 0 {
		bc = cols
	}
	return br, bc
}

// fp8Scale finds and checks the scales of F8_E4M3 tensor t ([rows][cols]) and returns
// them as an owned F32 tensor of the canonical shape [ceil(rows/br)][ceil(cols/bc)], with
// the block br × bc one scale covers.
func (c *Checkpoint) fp8Scale(t *Tensor, rows, cols int) (_ *Tensor, br, bc int, _ error) {
	q := c.quant
	if q == nil {
		return nil, 0, 0, fmt.Errorf("tensor %s: dtype F8_E4M3, but config.json has no quantization_config", t.Name)
	}
	base, ok := strings.CutSuffix(t.Name, "weight")
	if !ok {
		return nil, 0, 0, fmt.Errorf("tensor %s: dtype F8_E4M3 on a tensor not named …weight", t.Name)
	}
	name := base + q.ScaleSuffix
	s, err := c.Tensor(name)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("tensor %s: dtype F8_E4M3 without its scales: %w", t.Name, err)
	}
	br, bc = q.block(rows, cols)
	sr, sc := (rows+br-1)/br, (cols+bc-1)/bc
	n := s.NumElements()
	fits := false
	switch {
	case q.BlockRows == 0 && q.BlockCols == 0:
		fits = n == 1 && len(s.Shape) <= 1
	case q.BlockRows == 1 && q.BlockCols == 0:
		fits = slices.Equal(s.Shape, []int{rows, 1}) || slices.Equal(s.Shape, []int{rows})
	default:
		fits = slices.Equal(s.Shape, []int{sr, sc})
	}
	if !fits {
		return nil, 0, 0, fmt.Errorf("tensor %s: shape %v does not hold the scales of %s %v under %s (want %d×%d)", s.Name, s.Shape, t.Name, t.Shape, q, sr, sc)
	}
	v, err := s.Float32()
	if err != nil {
		return nil, 0, 0, err
	}
	for i, x := range v {
		if !(x > 0) || math.IsInf(float64(x), 0) {
			return nil, 0, 0, fmt.Errorf("tensor %s: scale %d is %g, not positive and finite", s.Name, i, x)
		}
	}
	st, err := NewFloatTensor(s.Name, "F32", []int{sr, sc}, v)
	return st, br, bc, err
}

// e4m3Table decodes every float8_e4m3fn byte: 1 sign, 4 exponent (bias 7), 3 mantissa
// bits; no infinities, S.1111.111 is NaN, the largest finite value 448.
var e4m3Table = func() (t [256]float32) {
	for b := range 256 {
		exp := (b >> 3) & 0xf
		mant := b & 7
		var v float64
		switch {
		case exp == 0xf && mant == 7:
			v = math.NaN()
		case exp == 0:
			v = math.Ldexp(float64(mant)/8, -6)
		default:
			v = math.Ldexp(1+float64(mant)/8, exp-7)
		}
		if b&0x80 != 0 {
			v = -v
		}
		t[b] = float32(v)
	}
	return t
}()

// E4M3ToFloat32 decodes a float8_e4m3fn value.
func E4M3ToFloat32(b uint8) float32 { return e4m3Table[b] }

// Float32ToE4M3 encodes f as float8_e4m3fn, rounding to nearest even and saturating at
// ±448, as torch's conversion of a clamped value does; NaN stays NaN.
func Float32ToE4M3(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	b &= 0x7fffffff
	switch {
	case b > 0x7f800000:
		return sign | 0x7f
	case b >= 0x43e00000: // 448 and beyond
		return sign | 0x7e
	case b < 0x3c800000: // below 2^-6: e4m3's subnormals, steps of 2^-9
		x := math.Float32frombits(b) * 512
		m := uint8(x)
		if r := x - float32(m); r > 0.5 || (r == 0.5 && m&1 == 1) {
			m++
		}
		return sign | m // 8 is 2^-6, the first normal
	}
	exp := int(b>>23) - 127 + 7
	mant := b & 0x7fffff
	q := uint32(exp)<<3 | mant>>20
	if rem := mant & 0xfffff; rem > 0x80000 || (rem == 0x80000 && q&1 == 1) {
		q++ // a carry out of the mantissa moves to the next binade, as it should
	}
	return sign | uint8(min(q, 0x7e))
}

// dequantizeFP8 writes the real values of F8_E4M3 part p (rows × cols, [rows][cols])
// into dst.
func dequantizeFP8(dst []float32, p *Part, cols int) error {
	t, s := p.Tensor, p.Scale
	if len(t.Data) != p.Rows*cols {
		return fmt.Errorf("tensor %s: %d bytes of data for %d×%d F8_E4M3 elements", t.Name, len(t.Data), p.Rows, cols)
	}
	sv, err := s.Float32()
	if err != nil {
		return err
	}
	sc, br, bc := s.Shape[1], p.BlockRows, p.BlockCols
	if br < 1 || bc < 1 || len(sv) != ((p.Rows+br-1)/br)*((cols+bc-1)/bc) {
		return fmt.Errorf("tensor %s: %d scales for blocks of %d×%d in %d×%d", s.Name, len(sv), br, bc, p.Rows, cols)
	}
	for r := range p.Rows {
		row := sv[(r/br)*sc : (r/br+1)*sc]
		src := t.Data[r*cols : (r+1)*cols]
		out := dst[r*cols : (r+1)*cols]
		for c, b := range src {
			out[c] = e4m3Table[b] * row[c/bc]
		}
	}
	return nil
}

// QuantizeFP8 returns ws with every projection matrix (attention, MLP, experts; not the
// embeddings, the LM head or the router) quantized to float8_e4m3fn with one scale a row
// (per channel), each the row's largest magnitude over 448, as compressed-tensors'
// FP8-dynamic releases are: with the activations' scale a row, the GPU's FP8 GEMMs then
// apply both after the whole sum (OUTER_VEC_32F), faster than 128×128 blocks, whose
// scales must be applied along the sum (bench/results/2026-11-28-fp8recipes-h200.jsonl).
// A row of e4m3 keeps its relative precision at any scale short of subnormals, 2^-6 of
// the row's largest magnitude. The result owns the quantized weights; the others still
// point where ws's do.
func QuantizeFP8(ws []Weight) ([]Weight, error) {
	out := make([]Weight, len(ws))
	errs := make([]error, len(ws))
	// The weights one at a time on each of GOMAXPROCS workers: an 8B model's 7 billion
	// projection weights in seconds, one float32 copy a worker at a time.
	next := make(chan int)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i], errs[i] = quantizeWeight(ws[i])
			}
		}()
	}
	for i := range ws {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// quantizeWeight is QuantizeFP8 of one weight.
func quantizeWeight(w Weight) (Weight, error) {
	if !fp8Role(w.Role) || w.FP8() {
		return w, nil
	}
	v, err := w.Float32()
	if err != nil {
		return w, fmt.Errorf("quantize %s: %w", &w, err)
	}
	q, s := quantizeBlocks(v, w.Rows, w.Cols, 1, w.Cols)
	name := w.Parts[0].Tensor.Name
	if len(w.Parts) > 1 {
		name = w.String()
	}
	qt := &Tensor{Name: name + " (fp8)", DType: "F8_E4M3", Shape: []int{w.Rows, w.Cols}, Data: q}
	st, err := NewFloatTensor(name+" (fp8 scales)", "F32", []int{w.Rows, 1}, s)
	if err != nil {
		return w, err
	}
	w.Parts = []Part{{Tensor: qt, Rows: w.Rows, Scale: st, BlockRows: 1, BlockCols: w.Cols}}
	return w, nil
}

// fp8Role says whether gollm stores the role in FP8 when it quantizes a checkpoint.
func fp8Role(r Role) bool {
	switch r {
	case RoleQKV, RoleOut, RoleUp, RoleDown, RoleExpertUp, RoleExpertDown, RoleSharedUp, RoleSharedDown:
		return true
	}
	return false
}

// quantizeBlocks quantizes the rows × cols matrix v with one scale a br × bc block,
// the scales [ceil(rows/br)][ceil(cols/bc)].
func quantizeBlocks(v []float32, rows, cols, br, bc int) ([]byte, []float32) {
	sr, sc := (rows+br-1)/br, (cols+bc-1)/bc
	scales := make([]float32, sr*sc)
	for r := range rows {
		for c, x := range v[r*cols : (r+1)*cols] {
			k := (r/br)*sc + c/bc
			scales[k] = max(scales[k], float32(math.Abs(float64(x))))
		}
	}
	for k, m := range scales {
		if m > 0 {
			scales[k] = m / 448
		} else {
			scales[k] = 1
		}
	}
	q := make([]byte, rows*cols)
	for r := range rows {
		for c, x := range v[r*cols : (r+1)*cols] {
			q[r*cols+c] = Float32ToE4M3(x / scales[(r/br)*sc+c/bc])
		}
	}
	return q, scales
}

// FP8 says whether any part of the weight is stored in float8_e4m3fn.
func (w *Weight) FP8() bool {
	for _, p := range w.Parts {
		if p.Scale != nil {
			return true
		}
	}
	return false
}

// fp8Hint adds to a dtype refusal what FP8 the loader takes for the role.
func (c *Checkpoint) fp8Hint(r Role, transposed bool) string {
	if r.IsVector() || transposed {
		return ""
	}
	return " (or F8_E4M3 with its scales)"
}

// DequantizeFP8 returns ws with every FP8 part replaced by an owned F32 tensor of its
// real values, for an engine that computes in float types only.
func DequantizeFP8(ws []Weight) ([]Weight, error) {
	out := make([]Weight, len(ws))
	for i, w := range ws {
		out[i] = w
		if !w.FP8() {
			continue
		}
		out[i].Parts = slices.Clone(w.Parts)
		for j := range out[i].Parts {
			p := &out[i].Parts[j]
			if p.Scale == nil {
				continue
			}
			v := make([]float32, p.Rows*w.Cols)
			if err := dequantizeFP8(v, p, w.Cols); err != nil {
				return nil, fmt.Errorf("%s: %w", &w, err)
			}
			t, err := NewFloatTensor(p.Tensor.Name, "F32", []int{p.Rows, w.Cols}, v)
			if err != nil {
				return nil, err
			}
			*p = Part{Tensor: t, Rows: p.Rows}
		}
	}
	return out, nil
}

// LoadFloat32FP8 is LoadFloat32 with the projections quantized to FP8 first
// (QuantizeFP8), as `quantization: fp8` serves a float checkpoint: the float32 weights
// carry FP8's rounding. An FP8 checkpoint's projections are taken as stored.
func LoadFloat32FP8(dir string) (*Float32, error) {
	c, err := Open(dir)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	defer c.Close()
	ws, err := c.Weights()
	if err == nil {
		ws, err = QuantizeFP8(ws)
	}
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	m, err := NewFloat32(c.Config, ws)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	return m, nil
}

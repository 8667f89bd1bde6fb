package cpu

import (
	"fmt"
	"runtime"
	"unsafe"

	"gollm/model"
)

// format is how a weight matrix's values are stored.
type format uint8

const (
	// fmtF32 is float32.
	fmtF32 format = iota
	// fmtF16 is IEEE half precision, widened in registers.
	fmtF16
	// fmtBF16 is bfloat16, widened in registers.
	fmtBF16
	// fmtQ8 is model.DTypeQ8_0: blocks of 32 int8 with an fp16 scale.
	fmtQ8
	// fmtQ4K is model.DTypeQ4_K: super-blocks of 256 4-bit values.
	fmtQ4K
	// fmtQ6K is model.DTypeQ6_K: super-blocks of 256 6-bit values.
	fmtQ6K
)

// formatNames are the formats as model's dtypes name them.
var formatNames = [...]string{"F32", "F16", "BF16", model.DTypeQ8_0, model.DTypeQ4_K, model.DTypeQ6_K}

// String names the format by its dtype.
func (f format) String() string { return formatNames[f] }

// formatOf maps a dtype onto a format.
func formatOf(dtype string) (format, bool) {
	for f, n := range formatNames {
		if n == dtype {
			return format(f), true
		}
	}
	return 0, false
}

// matrix is a weight matrix [rows][cols], each output's weights one contiguous row (the
// canonical [out][in] layout), held as parts of consecutive rows — a fused projection's
// tensors, each in its stored format (a GGUF file may store a model's value projection
// in Q6_K beside Q4_K queries and keys). y = x·Wᵀ is computed for a row x by dot
// products of x with each weight row, the weights widened or the activations quantized
// in registers: the weights are read where they lie (often in the checkpoint's mapping),
// never copied into float32.
type matrix struct {
	// rows and cols are the matrix's shape.
	rows, cols int
	// parts hold the rows, in order.
	parts []matPart
}

// matPart is a block of consecutive rows of a matrix in one format.
type matPart struct {
	// f is the storage format.
	f format
	// row0 is the matrix row of the part's first row; rows the number of rows.
	row0, rows int
	// f32 holds an fmtF32 part [rows][cols].
	f32 []float32
	// raw holds the other formats: rows × rowBytes.
	raw []byte
	// rowBytes is the stored size of one row; blockBytes of one block of a quantized
	// format.
	rowBytes, blockBytes int
	// ilv is the number of leading rows stored interleaved four at a time block by block
	// (a multiple of 4; 0 for none): block b of row r of the group of rows 4g..4g+3 at
	// 4g·rowBytes + (4b+r)·blockBytes, so that a group is one sequential stream, as
	// llama.cpp repacks its quantized weights. The rows after them follow one another.
	ilv int
	// perm, when not nil, says stored row i is the part's row perm[i] (GGUF's LLaMA
	// files store the query and key rows of each head interleaved for their rotary
	// layout); outputs are written where their row belongs.
	perm []int32
}

// out is the output column the part's stored row i feeds.
func (p *matPart) out(i int) int {
	if p.perm != nil {
		return p.row0 + int(p.perm[i])
	}
	return p.row0 + i
}

// rowRaw is stored row i's bytes, for a row stored whole (not interleaved).
func (p *matPart) rowRaw(i int) []byte { return p.raw[i*p.rowBytes : (i+1)*p.rowBytes] }

// rowCopy is stored row i's bytes in one slice: in place for a row stored whole, else
// gathered from its group into buf.
func (p *matPart) rowCopy(i int, buf []byte) []byte {
	if i >= p.ilv {
		return p.rowRaw(i)
	}
	buf = buf[:0]
	base := i/4*4*p.rowBytes + i%4*p.blockBytes
	for b := range p.rowBytes / p.blockBytes {
		at := base + 4*b*p.blockBytes
		buf = append(buf, p.raw[at:at+p.blockBytes]...)
	}
	return buf
}

// quad returns the four stored rows i..i+3 as the integer kernels take them — each row's
// bytes from its first block on, and the distance between a row's blocks — and whether
// they can be taken together: a whole interleaved group, or four rows stored whole.
func (p *matPart) quad(i int) (w [4][]byte, step int, ok bool) {
	switch {
	case i >= p.ilv:
		for r := range 4 {
			w[r] = p.raw[(i+r)*p.rowBytes:]
		}
		return w, p.blockBytes, true
	case i%4 == 0 && i+4 <= p.ilv:
		for r := range 4 {
			w[r] = p.raw[i*p.rowBytes+r*p.blockBytes:]
		}
		return w, 4 * p.blockBytes, true
	}
	return w, 0, false
}

// interleave stores the first rows&^3 rows of a quantized part four at a time block by
// block (matPart.ilv), in a new buffer from b; the one it replaces is dropped when it
// is b's.
func (p *matPart) interleave(b *buffers) error {
	n := p.rows &^ 3
	if n == 0 || p.blockBytes == 0 {
		return nil
	}
	out, err := b.bytes(len(p.raw))
	if err != nil {
		return err
	}
	nb := p.rowBytes / p.blockBytes
	for g := 0; g < n; g += 4 {
		for r := range 4 {
			src := p.raw[(g+r)*p.rowBytes:]
			for b := range nb {
				at := g*p.rowBytes + (4*b+r)*p.blockBytes
				copy(out[at:at+p.blockBytes], src[b*p.blockBytes:(b+1)*p.blockBytes])
			}
		}
	}
	copy(out[n*p.rowBytes:], p.raw[n*p.rowBytes:])
	old := p.raw
	p.raw, p.ilv = out, n
	return b.drop(old)
}

// rowF32 is stored row i of an fmtF32 part.
func (p *matPart) rowF32(i, cols int) []float32 { return p.f32[i*cols : (i+1)*cols] }

// f32Matrix wraps a float32 [rows][cols] matrix.
func f32Matrix(v []float32, rows, cols int) *matrix {
	return &matrix{rows: rows, cols: cols, parts: []matPart{{f: fmtF32, rows: rows, f32: v}}}
}

// addPart appends rows stored as raw bytes in dtype (or, for F32, as float32 values in
// f32), perm as matPart's.
func (m *matrix) addPart(f format, rows int, raw []byte, f32 []float32, perm []int32) error {
	p := matPart{f: f, row0: m.partRows(), rows: rows, raw: raw, f32: f32, perm: perm}
	if f == fmtF32 {
		if len(f32) != rows*m.cols {
			return fmt.Errorf("%d float32 values for %d rows of %d", len(f32), rows, m.cols)
		}
	} else {
		rb, err := model.RowBytes(f.String(), m.cols)
		if err != nil {
			return err
		}
		if len(raw) != rows*rb {
			return fmt.Errorf("%d bytes for %d rows of %d %s values (want %d)", len(raw), rows, m.cols, f, rows*rb)
		}
		p.rowBytes = rb
		if _, bb, _ := model.BlockLayout(f.String()); f >= fmtQ8 {
			p.blockBytes = bb
		}
	}
	if perm != nil && len(perm) != rows {
		return fmt.Errorf("a row order of %d for %d rows", len(perm), rows)
	}
	m.parts = append(m.parts, p)
	return nil
}

// partRows counts the rows the parts hold.
func (m *matrix) partRows() int {
	n := 0
	for i := range m.parts {
		n += m.parts[i].rows
	}
	return n
}

// bytes is the memory the weights take.
func (m *matrix) bytes() int64 {
	var n int64
	for i := range m.parts {
		p := &m.parts[i]
		n += int64(len(p.raw)) + 4*int64(len(p.f32))
	}
	return n
}

// row writes matrix row r (an embedding lookup) into dst [cols].
func (m *matrix) row(r int, dst []float32) {
	for i := range m.parts {
		p := &m.parts[i]
		if r < p.row0 || r >= p.row0+p.rows {
			continue
		}
		i := r - p.row0
		if p.perm != nil {
			for s, q := range p.perm {
				if int(q) == i {
					i = s
					break
				}
			}
		}
		if p.f == fmtF32 {
			copy(dst, p.rowF32(i, m.cols))
			return
		}
		_ = model.DequantizeRow(p.f.String(), p.rowCopy(i, nil), dst[:m.cols]) // sizes checked by addPart
		return
	}
}

// mulScratch holds one engine's buffers for matrix products: the activations quantized
// for the integer kernels, and each worker's weights widened for prompt steps.
type mulScratch struct {
	// a8 and a8K are the inputs quantized for Q8_0 and for the k-quants.
	a8  act8
	a8K act8K
	// wide are per-worker float32 copies of a block of weight rows, packed for the
	// register tile (or row by row).
	wide [][]float32
	// xpack holds the input rows packed for the register tile, 4 at a time
	// ([⌈n/4⌉][cols/8][4][8]), when packed says this product uses it.
	xpack  []float32
	packed bool
	// xbf holds the input rows rounded to bfloat16 and packed for the tile (packBF16)
	// when bf16 says this product takes the bfloat16 path; wbf are per-worker blocks of
	// bfloat16 weight rows packed for it.
	xbf  []uint16
	wbf  [][]uint16
	bf16 bool
	// zeros is a row of zeros (float32 and 16-bit) that pads tiles.
	zeros []float32
}

// mul computes ys[r][j] = bias[j] + Σ_k xs[r][k]·W[j][k] for every row r of xs and every
// row j of the matrix; bias may be nil. The weight rows are split over GOMAXPROCS
// goroutines, so that each reads only its share of the weights; rows of xs are taken in
// tiles so that a weight row read from memory serves several of them (gemm.go).
func (m *matrix) mul(ys, xs [][]float32, bias []float32, s *mulScratch) {
	n := len(xs)
	if n == 0 || m.rows == 0 {
		return
	}
	var need8, need8K bool
	for i := range m.parts {
		switch m.parts[i].f {
		case fmtQ8:
			need8 = true
		case fmtQ4K, fmtQ6K:
			need8K = true
		case fmtF16, fmtBF16:
			for len(s.wide) < runtime.GOMAXPROCS(0) {
				s.wide = append(s.wide, nil)
			}
		}
	}
	s.packed = false
	s.bf16 = m.bfPacked()
	if useTile && n >= tileRows && m.cols%8 == 0 && m.hasFloat(s.bf16) {
		s.packX(xs, m.cols)
		for len(s.wide) < runtime.GOMAXPROCS(0) {
			s.wide = append(s.wide, nil)
		}
	}
	if s.bf16 {
		s.packBF16(xs, m.cols)
		for len(s.wbf) < runtime.GOMAXPROCS(0) {
			s.wbf = append(s.wbf, nil)
		}
	}
	if need8 {
		s.a8.quantize(xs, m.cols)
	}
	if need8K {
		s.a8K.quantize(xs, m.cols)
	}
	minRows := max(4, matmulMinWork/max(1, n*m.cols))
	parallelFor(m.rows, 4, minRows, func(w, lo, hi int) {
		for i := range m.parts {
			p := &m.parts[i]
			a, b := max(lo, p.row0), min(hi, p.row0+p.rows)
			if a < b {
				m.mulPart(p, ys, xs, bias, a-p.row0, b-p.row0, s, w)
			}
		}
	})
}

// mulPart computes the outputs of part p's stored rows [i0, i1) on worker w.
func (m *matrix) mulPart(p *matPart, ys, xs [][]float32, bias []float32, i0, i1 int, s *mulScratch, w int) {
	switch p.f {
	case fmtF32:
		mulF32(p, m.cols, ys, xs, bias, i0, i1, s, w)
	case fmtF16, fmtBF16:
		if p.f == fmtBF16 && s.bf16 {
			mulBF16(p, m.cols, ys, bias, i0, i1, s, w)
			return
		}
		mul16(p, m.cols, ys, xs, bias, i0, i1, s, w)
	case fmtQ8, fmtQ4K, fmtQ6K:
		mulQuant(p, ys, bias, i0, i1, quantDot{a8: &s.a8, a8K: &s.a8K})
	}
}

// hasFloat says whether any part is in a float format that takes the float32 kernels
// (bfloat16 ones not, where bf16 says they take the bfloat16 path).
func (m *matrix) hasFloat(bf16 bool) bool {
	for i := range m.parts {
		if f := m.parts[i].f; f <= fmtBF16 && !(f == fmtBF16 && bf16) {
			return true
		}
	}
	return false
}

// packX packs the input rows for the register tile into s.xpack, 4 rows at a time, the
// last tile padded with rows of zeros.
func (s *mulScratch) packX(xs [][]float32, cols int) {
	tiles := (len(xs) + tileRows - 1) / tileRows
	s.xpack = grow(s.xpack, tiles*tileRows*cols)
	if len(s.zeros) < cols {
		s.zeros = make([]float32, cols)
	}
	var src [6]*float32
	for t := range tiles {
		for k := range tileRows {
			if r := t*tileRows + k; r < len(xs) {
				src[k] = &xs[r][:cols][0]
			} else {
				src[k] = &s.zeros[0]
			}
		}
		packRowsF32AVX2(&src, tileRows, cols, &s.xpack[t*tileRows*cols])
	}
	s.packed = true
}

// store4 writes the outputs of stored rows i..i+3 of p for input row r, adding the bias.
func store4(p *matPart, y []float32, bias []float32, i int, v [4]float32) {
	for k := range 4 {
		j := p.out(i + k)
		if bias != nil {
			v[k] += bias[j]
		}
		y[j] = v[k]
	}
}

// store1 writes the output of stored row i of p, adding the bias.
func store1(p *matPart, y []float32, bias []float32, i int, v float32) {
	j := p.out(i)
	if bias != nil {
		v += bias[j]
	}
	y[j] = v
}

// float32View returns b's bytes as float32 values when b is 4-byte aligned (a mapped
// safetensors or GGUF tensor is), else ok is false.
func float32View(b []byte) (v []float32, ok bool) {
	if len(b) == 0 {
		return nil, true
	}
	if uintptr(unsafe.Pointer(&b[0]))%4 != 0 || len(b)%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4), true
}

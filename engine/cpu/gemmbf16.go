package cpu

import (
	"math"
	"unsafe"
)

// The bfloat16 path (useBF16): a product with bfloat16 weights rounds its inputs to
// bfloat16 once (mulScratch.packBF16) and multiplies pairs of bfloat16s with AVX-512
// BF16's VDPBF16PS, as llama.cpp does, where the float32 path widens the weights and
// runs float32 FMAs at half the rate. Prompt steps pack the weights block by block for
// the register tile (4 input rows × 6 weight rows); decode steps read the rows as they
// are stored. Both compute every output by dotBF16Go's operations, so prompts and decode
// steps, batched or not, agree bit for bit. The inputs' rounding (8 significant bits)
// is this path's error against the float32 one.

// bfChunk is the values each lane's pair of products spans per step: 8 lanes of 2.
const bfChunk = 16

// toBF16 rounds f to the nearest bfloat16, ties to even (a NaN stays a NaN).
func toBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// bfFloat widens a bfloat16 as VDPBF16PS reads it: subnormals as zero.
func bfFloat(h uint16) float32 {
	if h&0x7f80 == 0 {
		h &= 0x8000
	}
	return math.Float32frombits(uint32(h) << 16)
}

// flush returns f with a subnormal result flushed to zero, as VDPBF16PS writes it.
func flush(f float32) float32 {
	if math.Float32bits(f)&0x7f800000 == 0 {
		return math.Float32frombits(math.Float32bits(f) & 0x80000000)
	}
	return f
}

// dpBF16 is one VDPBF16PS: each lane l of acc adds x[2l+1]·w[2l+1], then x[2l]·w[2l],
// each addition rounded (the products of two bfloat16s are exact in float32).
func dpBF16(acc *[8]float32, x, w *[bfChunk]uint16) {
	for l := range 8 {
		p1 := float32(bfFloat(x[2*l+1]) * bfFloat(w[2*l+1]))
		p0 := float32(bfFloat(x[2*l]) * bfFloat(w[2*l]))
		acc[l] = flush(float32(flush(float32(acc[l]+p1)) + p0))
	}
}

// dotBF16Go returns the dot product of bfloat16 rows x and w (little-endian bytes) as
// the bfloat16 kernels compute it: chunk by chunk through dpBF16, then reduce8. len(x)
// is a multiple of bfChunk.
func dotBF16Go(x []uint16, w []byte) float32 {
	var acc [8]float32
	var xc, wc [bfChunk]uint16
	for c := 0; c+bfChunk <= len(x); c += bfChunk {
		copy(xc[:], x[c:])
		for k := range wc {
			wc[k] = uint16(w[2*(c+k)]) | uint16(w[2*(c+k)+1])<<8
		}
		dpBF16(&acc, &xc, &wc)
	}
	return reduce8(&acc)
}

// bfPacked says whether m's products take the bfloat16 path: m has a bfloat16 part,
// whole chunks a row, and the CPU the instruction.
func (m *matrix) bfPacked() bool {
	if !useBF16 || m.cols%bfChunk != 0 {
		return false
	}
	for i := range m.parts {
		if m.parts[i].f == fmtBF16 {
			return true
		}
	}
	return false
}

// packBF16 rounds the input rows to bfloat16 into s.xbf, packed for the register tile 4
// rows at a time ([⌈n/4⌉][cols/16][4][16]), the last tile's missing rows zero.
func (s *mulScratch) packBF16(xs [][]float32, cols int) {
	n := len(xs)
	tiles := (n + tileRows - 1) / tileRows
	s.xbf = grow(s.xbf, tiles*tileRows*cols)
	nc := cols / bfChunk
	for r := n; r < tiles*tileRows; r++ {
		base := (r/tileRows*nc*tileRows + r%tileRows) * bfChunk
		for c := range nc {
			clear(s.xbf[base+c*tileRows*bfChunk : base+c*tileRows*bfChunk+bfChunk])
		}
	}
	parallelFor(n, 1, max(1, 16384/cols), func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			x := xs[r][:cols]
			base := (r/tileRows*nc*tileRows + r%tileRows) * bfChunk
			for c := range nc {
				d := s.xbf[base+c*tileRows*bfChunk : base+c*tileRows*bfChunk+bfChunk]
				for k, v := range x[c*bfChunk : (c+1)*bfChunk] {
					d[k] = toBF16(v)
				}
			}
		}
	})
	if len(s.zeros) < cols {
		s.zeros = make([]float32, cols)
	}
}

// xRowBF16 is input row r's first chunk in s.xbf; its chunks lie 4·16 values apart.
func (s *mulScratch) xRowBF16(r, cols int) *uint16 {
	return &s.xbf[(r/tileRows*(cols/bfChunk)*tileRows+r%tileRows)*bfChunk]
}

// mulBF16 computes the outputs of bfloat16 part p's stored rows [i0, i1) on worker wk
// from the inputs packed by packBF16.
func mulBF16(p *matPart, cols int, ys [][]float32, bias []float32, i0, i1 int, s *mulScratch, wk int) {
	n := len(ys)
	if n >= tileRows {
		nb := blockRows(2 * cols)
		for b0 := i0; b0 < i1; b0 += nb {
			b1 := min(b0+nb, i1)
			s.wbf[wk] = packWBF16(s.wbf[wk], p, cols, b0, b1, unsafe.Pointer(&s.zeros[0]))
			gemmBF16(p, cols, ys, bias, b0, b1, s.wbf[wk], s.xbf)
		}
		return
	}
	const xstep = tileRows * bfChunk * 2
	var out [4]float32
	for i := i0; i < i1; i += 4 {
		w0 := &p.rowRaw(i)[0]
		w1 := &p.rowRaw(min(i+1, i1-1))[0]
		w2 := &p.rowRaw(min(i+2, i1-1))[0]
		w3 := &p.rowRaw(min(i+3, i1-1))[0]
		for r := range n {
			dot4BF16DP(s.xRowBF16(r, cols), xstep, cols, w0, w1, w2, w3, &out)
			for k := 0; k < 4 && i+k < i1; k++ {
				store1(p, ys[r], bias, i+k, out[k])
			}
		}
	}
}

// packWBF16 packs stored rows [i0, i1) of bfloat16 part p for the tile, 6 at a time
// ([⌈rows/6⌉][cols/16][6][16]), the last tile padded with the zero row at zero.
func packWBF16(dst []uint16, p *matPart, cols, i0, i1 int, zero unsafe.Pointer) []uint16 {
	tiles := (i1 - i0 + tileCols - 1) / tileCols
	dst = grow(dst, tiles*tileCols*cols)
	for t := range tiles {
		var src [6]*byte
		for k := range tileCols {
			if i := i0 + t*tileCols + k; i < i1 {
				src[k] = &p.rowRaw(i)[:2*cols][0]
			} else {
				src[k] = (*byte)(zero)
			}
		}
		packRowsBF16AVX2(&src, cols, &dst[t*tileCols*cols])
	}
	return dst
}

// gemmBF16 computes stored rows [i0, i1) of p for every input row from the packed
// weight rows and input rows, tile by tile; the padding's outputs are dropped.
func gemmBF16(p *matPart, cols int, ys [][]float32, bias []float32, i0, i1 int, wpack, xpack []uint16) {
	n := len(ys)
	var out [tileRows * tileCols]float32
	for rt := 0; rt*tileRows < n; rt++ {
		xt := &xpack[rt*tileRows*cols]
		for ct := 0; i0+ct*tileCols < i1; ct++ {
			tilePackedBF16AVX512(xt, &wpack[ct*tileCols*cols], cols, &out)
			for k := 0; k < tileRows && rt*tileRows+k < n; k++ {
				y := ys[rt*tileRows+k]
				for j := 0; j < tileCols && i0+ct*tileCols+j < i1; j++ {
					store1(p, y, bias, i0+ct*tileCols+j, out[k*tileCols+j])
				}
			}
		}
	}
}

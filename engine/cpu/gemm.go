package cpu

import (
	"encoding/binary"
	"math"
	"unsafe"

	"gollm/model"
)

// The drivers of matrix.mul, one per family of formats. Each computes the outputs of a
// range of a part's stored rows for every input row. Prompt steps (many input rows) take
// the weights in blocks that stay in the core's L2 cache while every input row passes
// over them, so that each weight is read from memory once per step, not once per row;
// on amd64 with AVX-512VL a register tile of 4 input rows × 6 weight rows (24
// accumulators of the 32 vector registers) computes the float products. Whatever the
// path, every output element is computed by the same sequence of operations as the
// one-row kernels do, so prompts and decode steps, batched or not, agree bit for bit.

// blockBytes is the size of the block of weights kept in L2 while the input rows pass.
const blockBytes = 192 << 10

// tileRows is the input rows of the float register tile; tileCols its weight rows.
const tileRows, tileCols = 4, 6

// blockRows is the number of weight rows of rowBytes each in a block (a multiple of
// tileCols, at least one tile).
func blockRows(rowBytes int) int {
	return max(tileCols, blockBytes/max(1, rowBytes)/tileCols*tileCols)
}

// mulF32 computes the outputs of float32 part p's stored rows [i0, i1) on worker wk.
func mulF32(p *matPart, cols int, ys, xs [][]float32, bias []float32, i0, i1 int, s *mulScratch, wk int) {
	if s.packed {
		nb := blockRows(4 * cols)
		for b0 := i0; b0 < i1; b0 += nb {
			b1 := min(b0+nb, i1)
			s.wide[wk] = packW(s.wide[wk], cols, b1-b0, func(i int) unsafe.Pointer {
				return unsafe.Pointer(&p.rowF32(b0+i, cols)[0])
			}, unsafe.Pointer(&s.zeros[0]), 0, false)
			gemmPacked(p, cols, ys, bias, b0, b1, s.wide[wk], s.xpack)
		}
		return
	}
	if useTile && len(xs) >= tileRows {
		for b0 := i0; b0 < i1; b0 += blockRows(4 * cols) {
			b1 := min(b0+blockRows(4*cols), i1)
			gemmF32(p, cols, ys, xs, bias, b0, b1, p.f32[b0*cols:b1*cols], b0)
		}
		return
	}
	rowsF32(p, cols, ys, xs, bias, i0, i1, p.f32[i0*cols:i1*cols], i0)
}

// rowsF32 computes stored rows [i0, i1) of p, whose float32 values w hold from stored
// row base on, with the one-row kernels, input rows in blocks of rowBlock.
func rowsF32(p *matPart, cols int, ys, xs [][]float32, bias []float32, i0, i1 int, w []float32, base int) {
	n := len(xs)
	wr := func(i int) []float32 { return w[(i-base)*cols : (i-base+1)*cols] }
	for r0 := 0; r0 < n; r0 += rowBlock {
		r1 := min(r0+rowBlock, n)
		i := i0
		for ; i+4 <= i1; i += 4 {
			w0, w1, w2, w3 := wr(i), wr(i+1), wr(i+2), wr(i+3)
			r := r0
			for ; r+2 <= r1; r += 2 {
				a0, a1, a2, a3, c0, c1, c2, c3 := dot2x4(xs[r][:cols], xs[r+1][:cols], w0, w1, w2, w3)
				store4(p, ys[r], bias, i, [4]float32{a0, a1, a2, a3})
				store4(p, ys[r+1], bias, i, [4]float32{c0, c1, c2, c3})
			}
			if r < r1 {
				a0, a1, a2, a3 := dot1x4(xs[r][:cols], w0, w1, w2, w3)
				store4(p, ys[r], bias, i, [4]float32{a0, a1, a2, a3})
			}
		}
		for ; i < i1; i++ {
			wi := wr(i)
			for r := r0; r < r1; r++ {
				store1(p, ys[r], bias, i, dot(xs[r][:cols], wi))
			}
		}
	}
}

// gemmF32 computes stored rows [i0, i1) of p (float32 values w from stored row base on)
// for every input row with the register tile; the input rows and weight rows left over
// by whole tiles go through the one-row kernels, which compute the same sums.
func gemmF32(p *matPart, cols int, ys, xs [][]float32, bias []float32, i0, i1 int, w []float32, base int) {
	n := len(xs)
	wr := func(i int) []float32 { return w[(i-base)*cols : (i-base+1)*cols] }
	nt := n / tileRows * tileRows
	var xp [tileRows]*float32
	var wp [tileCols]*float32
	var out [tileRows * tileCols]float32
	for r := 0; r < nt; r += tileRows {
		for k := range tileRows {
			xp[k] = &xs[r+k][:cols][0]
		}
		i := i0
		for ; i+tileCols <= i1; i += tileCols {
			for k := range tileCols {
				wp[k] = &wr(i + k)[0]
			}
			tileF32(&xp, &wp, cols, &out)
			for k := range tileRows {
				y := ys[r+k]
				for c := range tileCols {
					store1(p, y, bias, i+c, out[k*tileCols+c])
				}
			}
		}
		if i < i1 {
			rowsF32(p, cols, ys[r:r+tileRows], xs[r:r+tileRows], bias, i, i1, w, base)
		}
	}
	if nt < n {
		rowsF32(p, cols, ys[nt:], xs[nt:], bias, i0, i1, w, base)
	}
}

// mul16 computes the outputs of 16-bit part p's stored rows [i0, i1) on worker wk. A
// prompt step widens a block of weight rows into the worker's scratch and runs the
// float32 kernels on it; a decode step widens each weight in registers as it is read
// (assembly), or, in pure Go, widens the block too. Widening is exact, so the sums are
// those of the same weights stored in float32.
func mul16(p *matPart, cols int, ys, xs [][]float32, bias []float32, i0, i1 int, s *mulScratch, wk int) {
	if s.packed {
		nb := blockRows(4 * cols)
		for b0 := i0; b0 < i1; b0 += nb {
			b1 := min(b0+nb, i1)
			s.wide[wk] = packW(s.wide[wk], cols, b1-b0, func(i int) unsafe.Pointer {
				return unsafe.Pointer(&p.rowRaw(b0 + i)[0])
			}, unsafe.Pointer(&s.zeros[0]), 16, p.f == fmtBF16)
			gemmPacked(p, cols, ys, bias, b0, b1, s.wide[wk], s.xpack)
		}
		return
	}
	if useAVX2 && !(useTile && len(xs) >= tileRows) {
		bf := p.f == fmtBF16
		i := i0
		for ; i+4 <= i1; i += 4 {
			w := [4][]byte{p.rowRaw(i), p.rowRaw(i + 1), p.rowRaw(i + 2), p.rowRaw(i + 3)}
			for r, x := range xs {
				store4(p, ys[r], bias, i, dot4x16(x[:cols], &w, bf))
			}
		}
		for ; i < i1; i++ {
			w := [4][]byte{p.rowRaw(i), p.rowRaw(i), p.rowRaw(i), p.rowRaw(i)}
			for r, x := range xs {
				store1(p, ys[r], bias, i, dot4x16(x[:cols], &w, bf)[0])
			}
		}
		return
	}
	nb := blockRows(4 * cols)
	s.wide[wk] = grow(s.wide[wk], nb*cols)
	wide := s.wide[wk]
	for b0 := i0; b0 < i1; b0 += nb {
		b1 := min(b0+nb, i1)
		widen16(p, cols, b0, b1, wide)
		if useTile && len(xs) >= tileRows {
			gemmF32(p, cols, ys, xs, bias, b0, b1, wide, b0)
		} else {
			rowsF32(p, cols, ys, xs, bias, b0, b1, wide, b0)
		}
	}
}

// packW packs rows weight rows of cols values into dst for the register tile, 6 rows at
// a time ([⌈rows/6⌉][cols/8][6][8]), the last tile padded with zero rows; row(i) is row
// i's first value (float32, or 16-bit when bits is 16: bf says bfloat16). zero points at
// a row of zeros at least cols floats long.
func packW(dst []float32, cols, rows int, row func(i int) unsafe.Pointer, zero unsafe.Pointer, bits int, bf bool) []float32 {
	tiles := (rows + tileCols - 1) / tileCols
	dst = grow(dst, tiles*tileCols*cols)
	for t := range tiles {
		var src [6]*float32
		for k := range tileCols {
			if i := t*tileCols + k; i < rows {
				src[k] = (*float32)(row(i))
			} else {
				src[k] = (*float32)(zero)
			}
		}
		if bits == 16 {
			packRows16AVX2((*[6]*byte)(unsafe.Pointer(&src)), tileCols, cols, &dst[t*tileCols*cols], bf)
		} else {
			packRowsF32AVX2(&src, tileCols, cols, &dst[t*tileCols*cols])
		}
	}
	return dst
}

// gemmPacked computes stored rows [i0, i1) of p for every input row from the packed
// weight rows (packW) and input rows (mulScratch.packX), tile by tile; the padding's
// outputs are dropped.
func gemmPacked(p *matPart, cols int, ys [][]float32, bias []float32, i0, i1 int, wpack, xpack []float32) {
	n := len(ys)
	var out [tileRows * tileCols]float32
	for rt := 0; rt*tileRows < n; rt++ {
		xt := &xpack[rt*tileRows*cols]
		for ct := 0; i0+ct*tileCols < i1; ct++ {
			tilePackedF32AVX512(xt, &wpack[ct*tileCols*cols], cols, &out)
			for k := 0; k < tileRows && rt*tileRows+k < n; k++ {
				y := ys[rt*tileRows+k]
				for j := 0; j < tileCols && i0+ct*tileCols+j < i1; j++ {
					store1(p, y, bias, i0+ct*tileCols+j, out[k*tileCols+j])
				}
			}
		}
	}
}

// widen16 writes stored rows [i0, i1) of 16-bit part p into dst as float32.
func widen16(p *matPart, cols, i0, i1 int, dst []float32) {
	src := p.raw[i0*p.rowBytes : i1*p.rowBytes]
	dst = dst[:(i1-i0)*cols]
	if len(dst) == 0 {
		return
	}
	switch {
	case !useAVX2:
		widen16Go(src, dst, p.f == fmtBF16)
	case p.f == fmtBF16:
		widenBF16AVX2(&src[0], &dst[0], len(dst))
	default:
		widenF16AVX2(&src[0], &dst[0], len(dst))
	}
}

// widenRow writes the halves (bf: bfloat16s) of src into dst as float32.
func widenRow(src []byte, dst []float32, bf bool) {
	if !useAVX2 || len(dst) == 0 {
		widen16Go(src, dst, bf)
		return
	}
	src = src[:2*len(dst)]
	if bf {
		widenBF16AVX2(&src[0], &dst[0], len(dst))
	} else {
		widenF16AVX2(&src[0], &dst[0], len(dst))
	}
}

// widen16Go writes the halves (bf: bfloat16s) of src into dst as float32.
func widen16Go(src []byte, dst []float32, bf bool) {
	src = src[:2*len(dst)]
	if bf {
		for k := range dst {
			dst[k] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*k:])) << 16)
		}
		return
	}
	for k := range dst {
		dst[k] = model.F16ToFloat32(binary.LittleEndian.Uint16(src[2*k:]))
	}
}

// dot4x16Go returns the dot products of x with four 16-bit rows, widened into a buffer
// and summed as dot1x4Go sums.
func dot4x16Go(x []float32, w *[4][]byte, bf bool) [4]float32 {
	n := len(x)
	var rows [4][]float32
	for k := range 4 {
		rows[k] = make([]float32, n)
		for i := range n {
			h := binary.LittleEndian.Uint16(w[k][2*i:])
			if bf {
				rows[k][i] = math.Float32frombits(uint32(h) << 16)
			} else {
				rows[k][i] = model.F16ToFloat32(h)
			}
		}
	}
	a, b, c, d := dot1x4Go(x, rows[0], rows[1], rows[2], rows[3])
	return [4]float32{a, b, c, d}
}

// prefetch is what the integer kernels prefetch ahead of rows i..i+3 of p read as quad
// gives them: in an interleaved group, 1 KB further along its one stream (the hardware's
// prefetchers alone fall behind the Q4_K kernel there); for rows stored whole, the same
// bytes of the row four further on (0, the rows themselves, past end).
func prefetch(p *matPart, i, end int) int {
	if i < p.ilv {
		return 1024
	}
	if i+8 > end {
		return 0
	}
	return 4 * p.rowBytes
}

// quantDot is the kernel mulQuant runs for a quantized part: the 8-bit inputs a8 for
// Q8_0 weights, a8K for Q4_K and Q6_K ones.
type quantDot struct {
	f   format
	a8  *act8
	a8K *act8K
}

// dot returns the dot products of input row r with the four weight rows w (step: the
// distance between one row's blocks; pf: what to prefetch).
func (k *quantDot) dot(r int, w *[4][]byte, pf, step int) [4]float32 {
	switch k.f {
	case fmtQ8:
		q, d := k.a8.row(r)
		return dot4Q8(q, d, w, pf, step)
	case fmtQ6K:
		q, d, bs16, _ := k.a8K.row(r)
		return dot4Q6K(q, d, bs16, w, pf, step)
	default:
		q, d, _, bs32 := k.a8K.row(r)
		return dot4Q4K(q, d, bs32, w, pf, step)
	}
}

// mulQuant computes the outputs of quantized part p's stored rows [i0, i1) for every
// input row, a block of weight rows at a time: four rows at once where quad allows, one
// at a time (the same kernel on a row four times over, so the same sums) where not.
func mulQuant(p *matPart, ys [][]float32, bias []float32, i0, i1 int, k quantDot) {
	k.f = p.f
	n := len(ys)
	nb := blockRows(p.rowBytes) / 4 * 4
	var own []byte // gathers a single interleaved row (rowCopy returns a row stored whole in place)
	for b0 := i0; b0 < i1; b0 += nb {
		b1 := min(b0+nb, i1)
		for r := range n {
			for i := b0; i < b1; {
				if i+4 <= b1 {
					if w, step, ok := p.quad(i); ok {
						store4(p, ys[r], bias, i, k.dot(r, &w, prefetch(p, i, i1), step))
						i += 4
						continue
					}
				}
				one := p.rowCopy(i, own)
				if i < p.ilv {
					own = one
				}
				w := [4][]byte{one, one, one, one}
				store1(p, ys[r], bias, i, k.dot(r, &w, 0, p.blockBytes)[0])
				i++
			}
		}
	}
}

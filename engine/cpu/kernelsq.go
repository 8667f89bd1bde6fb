package cpu

import (
	"encoding/binary"
	"math"

	"gollm/model"
)

// The integer kernels: a quantized weight row times an input row quantized to 8 bits
// (act8: Q8_0's blocks of 32 for Q8_0 weights; act8K: blocks of 256 with their 16-value
// sums for the k-quants, as llama.cpp's Q8_K). Each block's products are summed exactly
// in int32 — in eight lanes, lane l holding values 4l..4l+3 of each 32 — and each lane
// then added, scaled in float32 (a multiply and an add, each rounded, never fused), into
// one of eight float32 accumulators, which are reduced in a fixed order. The assembly
// kernels (kernels_amd64.s) compute exactly these sums, so they agree with the Go ones
// bit for bit, and a row's result never depends on the rows around it.

// act8 is a batch of input rows quantized to Q8_0 blocks: per 32 values an int8 each and
// a float32 scale d (value ≈ d·q).
type act8 struct {
	// cols is the row width.
	cols int
	// q holds the rows' values [n][cols]; d their scales [n][cols/32].
	q []int8
	d []float32
}

// quantize fills a with xs (each row cols wide, a multiple of 32).
func (a *act8) quantize(xs [][]float32, cols int) {
	n, nb := len(xs), cols/model.Q8Elems
	a.cols = cols
	a.q = grow(a.q, n*cols)
	a.d = grow(a.d, n*nb)
	parallelFor(n, 1, max(1, 16384/cols), func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			x := xs[r][:cols]
			for b := range nb {
				a.d[r*nb+b] = quantBlock8(x[b*32:(b+1)*32], a.q[r*cols+b*32:(r+1)*cols])
			}
		}
	})
}

// row is input row r's values and scales.
func (a *act8) row(r int) ([]int8, []float32) {
	nb := a.cols / model.Q8Elems
	return a.q[r*a.cols : (r+1)*a.cols], a.d[r*nb : (r+1)*nb]
}

// quantBlock8 writes x's values as int8 multiples of max|x|/127 (rounded, halves away
// from zero) into q and returns the scale.
func quantBlock8(x []float32, q []int8) float32 {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	q = q[:len(x)]
	for i, v := range x {
		q[i] = int8(math.Round(float64(v * id)))
	}
	return d
}

// act8K is a batch of input rows quantized for the k-quants: per 256 values an int8 each
// and a float32 scale, with the sums of each 16 values and of each 32 (the terms of the
// weights' offsets: Q6_K's −32, Q4_K's mins).
type act8K struct {
	// cols is the row width.
	cols int
	// q holds the values [n][cols]; d the scales [n][cols/256]; bs16 and bs32 the sums
	// of each 16 and each 32 values [n][cols/16], [n][cols/32].
	q          []int8
	d          []float32
	bs16, bs32 []int16
}

// quantize fills a with xs (each row cols wide, a multiple of 256).
func (a *act8K) quantize(xs [][]float32, cols int) {
	n, ns := len(xs), cols/model.KElems
	a.cols = cols
	a.q = grow(a.q, n*cols)
	a.d = grow(a.d, n*ns)
	a.bs16 = grow(a.bs16, n*cols/16)
	a.bs32 = grow(a.bs32, n*cols/32)
	parallelFor(n, 1, max(1, 16384/cols), func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			x := xs[r][:cols]
			q := a.q[r*cols : (r+1)*cols]
			for s := range ns {
				a.d[r*ns+s] = quantBlock8(x[s*256:(s+1)*256], q[s*256:])
			}
			for k := range cols / 16 {
				var sum int16
				for _, v := range q[k*16 : (k+1)*16] {
					sum += int16(v)
				}
				a.bs16[r*cols/16+k] = sum
			}
			for k := range cols / 32 {
				a.bs32[r*cols/32+k] = a.bs16[r*cols/16+2*k] + a.bs16[r*cols/16+2*k+1]
			}
		}
	})
}

// row is input row r's values, scales and sums.
func (a *act8K) row(r int) (q []int8, d []float32, bs16, bs32 []int16) {
	c, ns := a.cols, a.cols/model.KElems
	return a.q[r*c : (r+1)*c], a.d[r*ns : (r+1)*ns], a.bs16[r*c/16 : (r+1)*c/16], a.bs32[r*c/32 : (r+1)*c/32]
}

// grow returns s resized to n, reallocated only when too small.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// reduce8 sums eight lanes in the order the assembly does: the upper four onto the
// lower, then adjacent pairs, then the two halves.
func reduce8(a *[8]float32) float32 {
	t0, t1, t2, t3 := a[0]+a[4], a[1]+a[5], a[2]+a[6], a[3]+a[7]
	return (t0 + t1) + (t2 + t3)
}

// f16 decodes the little-endian half at b.
func f16(b []byte) float32 { return model.F16ToFloat32(binary.LittleEndian.Uint16(b)) }

// dotQ8Go returns the dot product of a Q8_0 weight row w with the input row (q, d).
func dotQ8Go(q []int8, d []float32, w []byte) float32 {
	var acc [8]float32
	for b, dx := range d {
		blk := w[b*model.Q8Bytes : (b+1)*model.Q8Bytes]
		s := f16(blk) * dx
		x := q[b*32 : b*32+32]
		for l := range 8 {
			var p int32
			for i := 4 * l; i < 4*l+4; i++ {
				p += int32(x[i]) * int32(int8(blk[2+i]))
			}
			acc[l] += float32(float32(p) * s)
		}
	}
	return reduce8(&acc)
}

// dotQ4KGo returns the dot product of a Q4_K weight row w with the input row (q, d,
// bs32): per super-block, d·dx·Σ_j sc_j·Σ q4·qx − dmin·dx·Σ_j m_j·Σ qx.
func dotQ4KGo(q []int8, d []float32, bs32 []int16, w []byte) float32 {
	var acc [8]float32
	var macc [4]float32 // lane k: mins 2k and 2k+1
	for s, dx := range d {
		blk := w[s*model.Q4KBytes : (s+1)*model.Q4KBytes]
		ds, dm := f16(blk)*dx, f16(blk[2:])*dx
		sc, m := model.Q4KScales(blk[4:16])
		qs := blk[16:]
		x := q[s*256 : s*256+256]
		var sumi [8]int32
		var summ [4]int32
		for j := range 8 {
			chunk := qs[j/2*32 : j/2*32+32]
			shift := uint(j%2) * 4
			for l := range 8 {
				var p int32
				for i := 4 * l; i < 4*l+4; i++ {
					p += int32(chunk[i]>>shift&0x0f) * int32(x[j*32+i])
				}
				sumi[l] += int32(sc[j]) * p
			}
			summ[j/2] += int32(m[j]) * int32(bs32[s*8+j])
		}
		for l := range 8 {
			acc[l] += float32(float32(sumi[l]) * ds)
		}
		for k := range 4 {
			macc[k] += float32(float32(summ[k]) * dm)
		}
	}
	return reduce8(&acc) - ((macc[0] + macc[1]) + (macc[2] + macc[3]))
}

// dotQ6KGo returns the dot product of a Q6_K weight row w with the input row (q, d,
// bs16): per super-block, d·dx·(Σ_k sc_k·Σ q6·qx − 32·Σ_k sc_k·Σ qx), the second term
// taken from lane 0 in integers.
func dotQ6KGo(q []int8, d []float32, bs16 []int16, w []byte) float32 {
	var acc [8]float32
	for s, dx := range d {
		blk := w[s*model.Q6KBytes : (s+1)*model.Q6KBytes]
		ds := f16(blk[208:]) * dx
		x := q[s*256 : s*256+256]
		var sumi [8]int32
		var corr int32
		for g := range 8 {
			for l := range 8 {
				sc := int32(int8(blk[192+2*g+l/4]))
				var p int32
				for i := 32*g + 4*l; i < 32*g+4*l+4; i++ {
					p += int32(model.Q6KValue(blk, i)) * int32(x[i])
				}
				sumi[l] += sc * p
			}
		}
		for k := range 16 {
			corr += int32(int8(blk[192+k])) * int32(bs16[s*16+k])
		}
		sumi[0] -= 32 * corr
		for l := range 8 {
			acc[l] += float32(float32(sumi[l]) * ds)
		}
	}
	return reduce8(&acc)
}

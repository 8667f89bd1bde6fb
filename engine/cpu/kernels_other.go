//go:build !amd64

package cpu

import "unsafe"

// useAVX2, useVNNI, useTile and useBF16 are false off amd64: the pure-Go loops run.
var useAVX2, useVNNI, useTile, useBF16 = false, false, false, false

// The assembly kernels are never called off amd64 (useAVX2 is false); these compute the
// same sums in plain Go so that the package compiles everywhere.

func dot4AVX2(x, w0, w1, w2, w3 *float32, n int, out *[4]float32) {
	xs := unsafe.Slice(x, n)
	ws := [4][]float32{unsafe.Slice(w0, n), unsafe.Slice(w1, n), unsafe.Slice(w2, n), unsafe.Slice(w3, n)}
	for j, w := range ws {
		var s float32
		for k, v := range xs {
			s += v * w[k]
		}
		out[j] = s
	}
}

func dot4F16AVX2(x *float32, w0, w1, w2, w3 *byte, n int, out *[4]float32) {
	*out = dot4x16Go(unsafe.Slice(x, n), &[4][]byte{unsafe.Slice(w0, 2*n), unsafe.Slice(w1, 2*n), unsafe.Slice(w2, 2*n), unsafe.Slice(w3, 2*n)}, false)
}

func dot4BF16AVX2(x *float32, w0, w1, w2, w3 *byte, n int, out *[4]float32) {
	*out = dot4x16Go(unsafe.Slice(x, n), &[4][]byte{unsafe.Slice(w0, 2*n), unsafe.Slice(w1, 2*n), unsafe.Slice(w2, 2*n), unsafe.Slice(w3, 2*n)}, true)
}

func tileF32AVX512(x *[4]*float32, w *[6]*float32, n int, out *[24]float32) {
	for r := range 4 {
		for j := range 6 {
			out[r*6+j] = dotGo(unsafe.Slice(x[r], n), unsafe.Slice(w[j], n))
		}
	}
}

func tilePackedF32AVX512(x, w *float32, n int, out *[24]float32) {
	xs, ws := unsafe.Slice(x, 4*n), unsafe.Slice(w, 6*n)
	for r := range 4 {
		for j := range 6 {
			var s float32
			for k := range n {
				s += xs[(k/8*4+r)*8+k%8] * ws[(k/8*6+j)*8+k%8]
			}
			out[r*6+j] = s
		}
	}
}

func packRowsF32AVX2(src *[6]*float32, rows, n int, dst *float32) {
	d := unsafe.Slice(dst, rows*n)
	for r := range rows {
		row := unsafe.Slice(src[r], n)
		for k := range n {
			d[(k/8*rows+r)*8+k%8] = row[k]
		}
	}
}

func packRows16AVX2(src *[6]*byte, rows, n int, dst *float32, bf bool) {
	d := unsafe.Slice(dst, rows*n)
	row := make([]float32, n)
	for r := range rows {
		widen16Go(unsafe.Slice(src[r], 2*n), row, bf)
		for k := range n {
			d[(k/8*rows+r)*8+k%8] = row[k]
		}
	}
}

func dot4Q8AVX2(q *int8, d *float32, nb int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int) {
	for j, w := range [4]*byte{w0, w1, w2, w3} {
		out[j] = dotQ8Go(unsafe.Slice(q, 32*nb), unsafe.Slice(d, nb), gatherBlocks(w, nb, 34, step))
	}
}

func dot4Q8VNNI(q *int8, d *float32, nb int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int) {
	dot4Q8AVX2(q, d, nb, w0, w1, w2, w3, out, pf, step)
}

func dot4Q4KAVX2(q *int8, d *float32, bs32 *int16, ns int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int) {
	for j, w := range [4]*byte{w0, w1, w2, w3} {
		out[j] = dotQ4KGo(unsafe.Slice(q, 256*ns), unsafe.Slice(d, ns), unsafe.Slice(bs32, 8*ns), gatherBlocks(w, ns, 144, step))
	}
}

func dot4Q6KAVX2(q *int8, d *float32, bs16 *int16, ns int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int) {
	for j, w := range [4]*byte{w0, w1, w2, w3} {
		out[j] = dotQ6KGo(unsafe.Slice(q, 256*ns), unsafe.Slice(d, ns), unsafe.Slice(bs16, 16*ns), gatherBlocks(w, ns, 210, step))
	}
}

func tilePackedBF16AVX512(x, w *uint16, n int, out *[24]float32) {
	xs, ws := unsafe.Slice(x, 4*n), unsafe.Slice(w, 6*n)
	var xr, wr [16]uint16
	var acc [24][8]float32
	for c := range n / 16 {
		for r := range 4 {
			copy(xr[:], xs[(c*4+r)*16:])
			for j := range 6 {
				copy(wr[:], ws[(c*6+j)*16:])
				dpBF16(&acc[r*6+j], &xr, &wr)
			}
		}
	}
	for k := range acc {
		out[k] = reduce8(&acc[k])
	}
}

func dot4BF16DP(x *uint16, xstep, n int, w0, w1, w2, w3 *byte, out *[4]float32) {
	xs := unsafe.Slice(x, (n/16-1)*xstep/2+16)
	var xr, wr [16]uint16
	for j, w := range [4]*byte{w0, w1, w2, w3} {
		ws := unsafe.Slice((*uint16)(unsafe.Pointer(w)), n)
		var acc [8]float32
		for c := range n / 16 {
			copy(xr[:], xs[c*xstep/2:])
			copy(wr[:], ws[c*16:])
			dpBF16(&acc, &xr, &wr)
		}
		out[j] = reduce8(&acc)
	}
}

func packRowsBF16AVX2(src *[6]*byte, n int, dst *uint16) {
	d := unsafe.Slice(dst, 6*n)
	for r := range 6 {
		row := unsafe.Slice((*uint16)(unsafe.Pointer(src[r])), n)
		for c := range n / 16 {
			copy(d[(c*6+r)*16:(c*6+r)*16+16], row[c*16:])
		}
	}
}

func widenF16AVX2(src *byte, dst *float32, n int) {
	widen16Go(unsafe.Slice(src, 2*n), unsafe.Slice(dst, n), false)
}

func widenBF16AVX2(src *byte, dst *float32, n int) {
	widen16Go(unsafe.Slice(src, 2*n), unsafe.Slice(dst, n), true)
}

func dot1AVX2(x, w *float32, n int) float32 {
	var out [4]float32
	dot4AVX2(x, w, w, w, w, n, &out)
	return out[0]
}

func axpyAVX2(y *float32, a float32, x *float32, n int) {
	axpyGo(unsafe.Slice(y, n), a, unsafe.Slice(x, n))
}

// gatherBlocks copies a row's nb blocks of size bytes, step bytes apart from w, into one
// slice.
func gatherBlocks(w *byte, nb, size, step int) []byte {
	src := unsafe.Slice(w, (nb-1)*step+size)
	out := make([]byte, 0, nb*size)
	for b := range nb {
		out = append(out, src[b*step:b*step+size]...)
	}
	return out
}

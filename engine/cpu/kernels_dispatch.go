package cpu

import "gollm/model"

// The kernels' entry points: the assembly where the CPU has it (useAVX2, useTile), else
// the pure-Go loops. The slices are checked to hold what the assembly reads.

// dot4x16 returns the dot products of x with four rows of len(x) halves (bf: bfloat16s).
func dot4x16(x []float32, w *[4][]byte, bf bool) [4]float32 {
	if !useAVX2 {
		return dot4x16Go(x, w, bf)
	}
	var out [4]float32
	n := len(x)
	if n == 0 {
		return out
	}
	w0, w1, w2, w3 := w[0][:2*n], w[1][:2*n], w[2][:2*n], w[3][:2*n]
	if bf {
		dot4BF16AVX2(&x[0], &w0[0], &w1[0], &w2[0], &w3[0], n, &out)
	} else {
		dot4F16AVX2(&x[0], &w0[0], &w1[0], &w2[0], &w3[0], n, &out)
	}
	return out
}

// tileF32 is the float register tile (useTile only; gemmF32 checks the rows' lengths).
func tileF32(x *[tileRows]*float32, w *[tileCols]*float32, n int, out *[tileRows * tileCols]float32) {
	tileF32AVX512(x, w, n, out)
}

// rowOf is a row's blocks of size bytes, step bytes apart from the start of w, in one
// slice: w itself when they are contiguous.
func rowOf(w []byte, nb, size, step int) []byte {
	if step == size {
		return w[:nb*size]
	}
	out := make([]byte, 0, nb*size)
	for b := range nb {
		out = append(out, w[b*step:b*step+size]...)
	}
	return out
}

// dot4Q8 returns dotQ8Go of four weight rows whose blocks lie step bytes apart (w[r]
// starts at row r's first block), prefetching pf bytes ahead of each block (matPart.pf).
func dot4Q8(q []int8, d []float32, w *[4][]byte, pf, step int) [4]float32 {
	var out [4]float32
	nb := len(d)
	if nb == 0 {
		return out
	}
	if !useAVX2 {
		for j := range 4 {
			out[j] = dotQ8Go(q, d, rowOf(w[j], nb, model.Q8Bytes, step))
		}
		return out
	}
	q = q[:nb*model.Q8Elems]
	n := (nb-1)*step + model.Q8Bytes
	w0, w1, w2, w3 := w[0][:n], w[1][:n], w[2][:n], w[3][:n]
	if useVNNI {
		dot4Q8VNNI(&q[0], &d[0], nb, &w0[0], &w1[0], &w2[0], &w3[0], &out, pf, step)
	} else {
		dot4Q8AVX2(&q[0], &d[0], nb, &w0[0], &w1[0], &w2[0], &w3[0], &out, pf, step)
	}
	return out
}

// dot4Q4K returns dotQ4KGo of four weight rows, laid out and prefetched as dot4Q8's.
func dot4Q4K(q []int8, d []float32, bs32 []int16, w *[4][]byte, pf, step int) [4]float32 {
	var out [4]float32
	ns := len(d)
	if ns == 0 {
		return out
	}
	if !useAVX2 {
		for j := range 4 {
			out[j] = dotQ4KGo(q, d, bs32, rowOf(w[j], ns, model.Q4KBytes, step))
		}
		return out
	}
	q, bs32 = q[:ns*model.KElems], bs32[:ns*8]
	n := (ns-1)*step + model.Q4KBytes
	w0, w1, w2, w3 := w[0][:n], w[1][:n], w[2][:n], w[3][:n]
	dot4Q4KAVX2(&q[0], &d[0], &bs32[0], ns, &w0[0], &w1[0], &w2[0], &w3[0], &out, pf, step)
	return out
}

// dot4Q6K returns dotQ6KGo of four weight rows, laid out and prefetched as dot4Q8's.
func dot4Q6K(q []int8, d []float32, bs16 []int16, w *[4][]byte, pf, step int) [4]float32 {
	var out [4]float32
	ns := len(d)
	if ns == 0 {
		return out
	}
	if !useAVX2 {
		for j := range 4 {
			out[j] = dotQ6KGo(q, d, bs16, rowOf(w[j], ns, model.Q6KBytes, step))
		}
		return out
	}
	q, bs16 = q[:ns*model.KElems], bs16[:ns*16]
	n := (ns-1)*step + model.Q6KBytes
	w0, w1, w2, w3 := w[0][:n], w[1][:n], w[2][:n], w[3][:n]
	dot4Q6KAVX2(&q[0], &d[0], &bs16[0], ns, &w0[0], &w1[0], &w2[0], &w3[0], &out, pf, step)
	return out
}

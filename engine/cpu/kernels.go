package cpu

import (
	"math"

	"gollm/engine"
	"gollm/model"
)

// The matmuls reduce to dot products of contiguous vectors. On amd64 with AVX2 and FMA
// they run an assembly kernel (kernels_amd64.s); elsewhere plain Go loops written so
// that the compiler keeps accumulators in registers and removes bounds checks. Within
// one path every output element is computed the same way, whichever kernel variant
// computes it, so a row's result never depends on which other rows share the batch:
// batched and unbatched runs are bit-identical.

// matmulMinWork is the number of multiply-adds below which a matmul runs on the
// calling goroutine: starting goroutines costs more than it saves.
const matmulMinWork = 1 << 15

// rowBlock is the number of input rows a matmul keeps hot in cache while it sweeps a
// worker's weight rows.
const rowBlock = 16

// matmul computes ys[r][j] = bias[j] + Σ_k xs[r][k]·wt[j][k] for every row r and
// every j < out, where wt is the weight matrix transposed, [out][in] row-major (so each
// output is a dot product of two contiguous vectors). bias may be nil.
func matmul(ys, xs [][]float32, wt []float32, in, out int, bias []float32) {
	f32Matrix(wt, out, in).mul(ys, xs, bias, &mulScratch{})
}

// dot returns Σ x[k]·w[k], as one output of dot1x4.
func dot(x, w []float32) float32 {
	if useAVX2 {
		n := len(x)
		if n == 0 {
			return 0
		}
		w = w[:n] // the assembly reads n values of each
		return dot1AVX2(&x[0], &w[0], n)
	}
	return dotGo(x, w)
}

// dot1x4 returns the dot products of x with w0..w3. Each output is computed the same
// way whichever kernel runs it, so results do not depend on how rows are grouped.
func dot1x4(x, w0, w1, w2, w3 []float32) (s0, s1, s2, s3 float32) {
	if !useAVX2 {
		return dot1x4Go(x, w0, w1, w2, w3)
	}
	n := len(x)
	if n == 0 {
		return 0, 0, 0, 0
	}
	// The re-slices check that every row holds n values before the assembly reads them.
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	var out [4]float32
	dot4AVX2(&x[0], &w0[0], &w1[0], &w2[0], &w3[0], n, &out)
	return out[0], out[1], out[2], out[3]
}

// dot2x4 returns the dot products of x0 and of x1 with w0..w3.
func dot2x4(x0, x1, w0, w1, w2, w3 []float32) (a0, a1, a2, a3, c0, c1, c2, c3 float32) {
	if !useAVX2 {
		return dot2x4Go(x0, x1, w0, w1, w2, w3)
	}
	a0, a1, a2, a3 = dot1x4(x0, w0, w1, w2, w3)
	c0, c1, c2, c3 = dot1x4(x1, w0, w1, w2, w3)
	return
}

// The pure-Go kernels sum each output in order, in one accumulator. They are not
// inlined: inside the large matmul loop the compiler runs out of registers and spills
// the loop index, which halves their speed.

// dotGo returns Σ x[k]·w[k], summed in order.
//
//go:noinline
func dotGo(x, w []float32) float32 {
	w = w[:len(x)]
	var s float32
	for k, v := range x {
		s += v * w[k]
	}
	return s
}

// dot1x4Go returns the dot products of x with w0..w3 (each summed in order).
//
//go:noinline
func dot1x4Go(x, w0, w1, w2, w3 []float32) (s0, s1, s2, s3 float32) {
	w0, w1, w2, w3 = w0[:len(x)], w1[:len(x)], w2[:len(x)], w3[:len(x)]
	for k, v := range x {
		s0 += v * w0[k]
		s1 += v * w1[k]
		s2 += v * w2[k]
		s3 += v * w3[k]
	}
	return
}

// dot2x4Go returns the dot products of x0 and of x1 with w0..w3, reading each weight
// once for both rows.
//
//go:noinline
func dot2x4Go(x0, x1, w0, w1, w2, w3 []float32) (a0, a1, a2, a3, c0, c1, c2, c3 float32) {
	x1 = x1[:len(x0)]
	w0, w1, w2, w3 = w0[:len(x0)], w1[:len(x0)], w2[:len(x0)], w3[:len(x0)]
	for k, u := range x0 {
		v := x1[k]
		p0, p1, p2, p3 := w0[k], w1[k], w2[k], w3[k]
		a0 += u * p0
		a1 += u * p1
		a2 += u * p2
		a3 += u * p3
		c0 += v * p0
		c1 += v * p1
		c2 += v * p2
		c3 += v * p3
	}
	return
}

// axpy adds a·x to y.
func axpy(y []float32, a float32, x []float32) {
	if useAVX2 && len(y) > 0 {
		x = x[:len(y)] // the assembly reads len(y) values of x
		axpyAVX2(&y[0], a, &x[0], len(y))
		return
	}
	axpyGo(y, a, x)
}

// axpyGo adds a·x to y in plain Go.
func axpyGo(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// layerNorm writes (x-mean)/sqrt(var+eps)·w + b into dst, with the biased variance as
// torch computes it. The statistics are accumulated in float64 so that they are exact
// to float32 precision.
func layerNorm(dst, x, w, b []float32, eps float32) {
	n := len(x)
	dst, w, b = dst[:n], w[:n], b[:n]
	var sum float64
	for _, v := range x {
		sum += float64(v)
	}
	mean := sum / float64(n)
	var ss float64
	for _, v := range x {
		d := float64(v) - mean
		ss += d * d
	}
	inv := 1 / math.Sqrt(ss/float64(n)+float64(eps))
	m, s := float32(mean), float32(inv)
	for i, v := range x {
		dst[i] = (v-m)*s*w[i] + b[i]
	}
}

// expFast is engine.ExpFast, which the sampler shares: e^x to within a few parts in 10^9.
func expFast(x float64) float64 { return engine.ExpFast(x) }

// tanhFast returns tanh(u) through expFast.
func tanhFast(u float64) float64 {
	if u > 20 {
		return 1
	}
	if u < -20 {
		return -1
	}
	return 1 - 2/(expFast(2*u)+1)
}

// activation is an MLP nonlinearity the engine computes.
type activation int

const (
	// actGeluTanh is gelu_new / gelu_pytorch_tanh: the tanh approximation GPT-2 uses.
	actGeluTanh activation = iota
	// actGeluErf is the exact erf gelu ("gelu").
	actGeluErf
	// actReLU is "relu".
	actReLU
	// actSiLU is x · sigmoid(x) ("silu"), the LLaMA family's.
	actSiLU
)

// activationOf maps the descriptor's activation to a kernel.
func activationOf(a model.Activation) activation {
	switch a {
	case model.ActGeluErf:
		return actGeluErf
	case model.ActReLU:
		return actReLU
	case model.ActSiLU:
		return actSiLU
	}
	return actGeluTanh
}

// of returns the activation of one value.
func (a activation) of(v float32) float32 {
	f := float64(v)
	switch a {
	case actGeluErf:
		return float32(0.5 * f * (1 + math.Erf(f/math.Sqrt2)))
	case actReLU:
		return max(v, 0)
	case actSiLU:
		return float32(f / (1 + expFast(-f)))
	}
	const c = 0.7978845608028654 // sqrt(2/pi)
	return float32(0.5 * f * (1 + tanhFast(c*(f+0.044715*f*f*f))))
}

// apply runs the activation over x in place.
func (a activation) apply(x []float32) {
	for i, v := range x {
		x[i] = a.of(v)
	}
}

// gatedApply writes act(gate[j]) · up[j] into dst (the gated MLP's hidden units).
func gatedApply(a activation, dst, gate, up []float32) {
	up = up[:len(gate)]
	dst = dst[:len(gate)]
	for j, g := range gate {
		dst[j] = a.of(g) * up[j]
	}
}

// rmsNorm writes x / sqrt(mean(x²) + eps) · w into dst, the mean of squares accumulated
// in float64 so that it is exact to float32 precision.
func rmsNorm(dst, x, w []float32, eps float32) {
	n := len(x)
	dst, w = dst[:n], w[:n]
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	s := float32(1 / math.Sqrt(ss/float64(n)+float64(eps)))
	for i, v := range x {
		dst[i] = w[i] * (v * s)
	}
}

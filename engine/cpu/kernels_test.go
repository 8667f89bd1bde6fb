package cpu

import (
	"gollm/model"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
)

// dot64 is the float64 reference dot product.
func dot64(x, w []float32) float64 {
	var s float64
	for i := range x {
		s += float64(x[i]) * float64(w[i])
	}
	return s
}

// sumAbs64 returns Σ|x[i]·w[i]|, the scale a float32 dot product's error is relative to.
func sumAbs64(x, w []float32) float64 {
	var s float64
	for i := range x {
		s += math.Abs(float64(x[i]) * float64(w[i]))
	}
	return s
}

func TestDotKernelsAgree(t *testing.T) {
	forEachKernelPath(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 1))
		// Lengths around the 8-wide blocks exercise the vector loop and the tail.
		for n := 0; n <= 70; n++ {
			x0, x1 := randomLogits(rng, n, 1), randomLogits(rng, n, 1)
			var w [4][]float32
			for j := range w {
				w[j] = randomLogits(rng, n+3, 1) // longer rows: only n values count
			}
			a := [4]float32{}
			a[0], a[1], a[2], a[3] = dot1x4(x0, w[0], w[1], w[2], w[3])
			var b, c [4]float32
			b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3] = dot2x4(x1, x0, w[0], w[1], w[2], w[3])
			for j := range w {
				want := dot64(x0, w[j][:n])
				if err := math.Abs(float64(a[j]) - want); err > 1e-6*(1+sumAbs64(x0, w[j][:n])) {
					t.Errorf("n=%d row %d: dot1x4 = %g, float64 reference %g", n, j, a[j], want)
				}
				if a[j] != c[j] {
					t.Errorf("n=%d row %d: dot1x4 gives %g but dot2x4's second row %g", n, j, a[j], c[j])
				}
				if d := dot(x1, w[j]); d != b[j] {
					t.Errorf("n=%d row %d: dot gives %g but dot2x4's first row %g", n, j, d, b[j])
				}
			}
		}
	})
}

func TestMatmulMatchesTheDefinition(t *testing.T) {
	forEachKernelPath(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(2, 2))
		for _, sz := range [][3]int{{1, 7, 5}, {5, 37, 13}, {33, 64, 130}, {3, 256, 1031}} {
			n, in, out := sz[0], sz[1], sz[2]
			var x, y buf
			x.resize(n, in)
			y.resize(n, out)
			copy(x.data, randomLogits(rng, n*in, 1))
			w := randomLogits(rng, in*out, 1) // [out][in], the canonical layout
			bias := randomLogits(rng, out, 1)
			matmul(y.rows, x.rows, w, in, out, bias)
			for r := range n {
				for j := range out {
					want := float64(bias[j])
					var scale float64
					for k := range in {
						p := float64(x.rows[r][k]) * float64(w[j*in+k])
						want += p
						scale += math.Abs(p)
					}
					if math.Abs(float64(y.rows[r][j])-want) > 1e-6*(1+scale) {
						t.Fatalf("%v: y[%d][%d] = %g, want %g", sz, r, j, y.rows[r][j], want)
					}
				}
			}
		}
	})
}

func TestParallelForCoversEveryIndexOnce(t *testing.T) {
	for _, tc := range []struct{ n, align, minChunk int }{{0, 1, 1}, {1, 4, 1}, {10, 1, 1}, {1001, 4, 3}, {64, 4, 100}} {
		var mu sync.Mutex
		seen := make([]int, tc.n)
		parallelFor(tc.n, tc.align, tc.minChunk, func(_, lo, hi int) {
			if lo%tc.align != 0 {
				t.Errorf("%+v: chunk starts at %d, not a multiple of %d", tc, lo, tc.align)
			}
			mu.Lock()
			defer mu.Unlock()
			for i := lo; i < hi; i++ {
				seen[i]++
			}
		})
		for i, c := range seen {
			if c != 1 {
				t.Fatalf("%+v: index %d visited %d times", tc, i, c)
			}
		}
	}
}

func TestExpFastIsAccurate(t *testing.T) {
	worst := 0.0
	for x := -708.0; x <= 709; x += 0.0137 {
		want := math.Exp(x)
		worst = max(worst, math.Abs(expFast(x)-want)/want)
	}
	if worst > 1e-8 {
		t.Errorf("expFast's worst relative error %.3g > 1e-8", worst)
	}
	for _, tc := range []struct{ x, want float64 }{
		{0, 1}, {math.Inf(-1), 0}, {-1000, 0}, {math.Inf(1), math.Inf(1)}, {1000, math.Inf(1)},
	} {
		if got := expFast(tc.x); got != tc.want {
			t.Errorf("expFast(%g) = %g, want %g", tc.x, got, tc.want)
		}
	}
	if !math.IsNaN(expFast(math.NaN())) {
		t.Error("expFast(NaN) is not NaN")
	}
	for u := -25.0; u <= 25; u += 0.001 {
		if got, want := tanhFast(u), math.Tanh(u); math.Abs(got-want) > 1e-8 {
			t.Fatalf("tanhFast(%g) = %g, want %g", u, got, want)
		}
	}
}

func TestActivationsMatchTheirDefinitions(t *testing.T) {
	xs := []float32{-6, -2, -0.5, 0, 0.3, 1, 3, 8}
	for _, tc := range []struct {
		name string
		act  model.Activation
		want func(x float64) float64
	}{
		{"gelu_new", model.ActGeluTanh, func(x float64) float64 {
			return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
		}},
		{"gelu", model.ActGeluErf, func(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }},
		{"relu", model.ActReLU, func(x float64) float64 { return max(x, 0) }},
		{"silu", model.ActSiLU, func(x float64) float64 { return x / (1 + math.Exp(-x)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			act := activationOf(tc.act)
			got := append([]float32(nil), xs...)
			act.apply(got)
			for i, x := range xs {
				if want := tc.want(float64(x)); math.Abs(float64(got[i])-want) > 1e-6*(1+math.Abs(want)) {
					t.Errorf("%s(%g) = %g, want %g", tc.name, x, got[i], want)
				}
			}
		})
	}
}

func TestLayerNormMatchesTheDefinition(t *testing.T) {
	x := []float32{1, 2, 3, 4, 10}
	w := []float32{1, 0.5, 2, 1, 1}
	b := []float32{0, 1, 0, -1, 0}
	got := make([]float32, len(x))
	layerNorm(got, x, w, b, 1e-5)
	mean, vari := 4.0, 0.0
	for _, v := range x {
		vari += (float64(v) - mean) * (float64(v) - mean)
	}
	vari /= float64(len(x))
	for i := range x {
		want := (float64(x[i])-mean)/math.Sqrt(vari+1e-5)*float64(w[i]) + float64(b[i])
		if math.Abs(float64(got[i])-want) > 1e-6 {
			t.Errorf("layerNorm[%d] = %g, want %g", i, got[i], want)
		}
	}
}

func TestRMSNormMatchesTheDefinition(t *testing.T) {
	x := []float32{1, -2, 3, 4, 10}
	w := []float32{1, 0.5, 2, 1, 1}
	got := make([]float32, len(x))
	rmsNorm(got, x, w, 1e-6)
	var ms float64
	for _, v := range x {
		ms += float64(v) * float64(v)
	}
	ms /= float64(len(x))
	for i := range x {
		want := float64(x[i]) / math.Sqrt(ms+1e-6) * float64(w[i])
		if math.Abs(float64(got[i])-want) > 1e-6 {
			t.Errorf("rmsNorm[%d] = %g, want %g", i, got[i], want)
		}
	}
}

func TestGatedActivationMultipliesTheUpProjection(t *testing.T) {
	gate, up := []float32{-1, 0.5, 2}, []float32{3, -4, 0.25}
	got := make([]float32, 3)
	gatedApply(actSiLU, got, gate, up)
	for i := range gate {
		g := float64(gate[i])
		want := g / (1 + math.Exp(-g)) * float64(up[i])
		if math.Abs(float64(got[i])-want) > 1e-6 {
			t.Errorf("gated[%d] = %g, want %g", i, got[i], want)
		}
	}
}

func TestAxpyAssemblyMatchesGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for n := 0; n <= 70; n++ {
		x, y := randomLogits(rng, n, 1), randomLogits(rng, n, 1)
		a := float32(rng.NormFloat64())
		want := append([]float32(nil), y...)
		axpyGo(want, a, x)
		got := append([]float32(nil), y...)
		axpy(got, a, x)
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("n=%d: axpy[%d] = %g, the Go loop %g", n, i, got[i], want[i])
			}
		}
	}
}

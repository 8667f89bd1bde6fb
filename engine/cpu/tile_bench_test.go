package cpu

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

// BenchmarkTileL1 times the register tile on operands that stay in L1 (4 input rows and 6
// weight rows of 256 floats): the kernel's own ceiling, in GFLOP/s of thread CPU time.
func BenchmarkTileL1(b *testing.B) {
	if !useTile {
		b.Skip("no AVX-512VL")
	}
	rng := rand.New(rand.NewPCG(1, 1))
	const k = 256
	var xp [4]*float32
	var wp [6]*float32
	for i := range xp {
		xp[i] = &randomLogits(rng, k, 1)[0]
	}
	for i := range wp {
		wp[i] = &randomLogits(rng, k, 1)[0]
	}
	var out [24]float32
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	best := time.Duration(1 << 62)
	for range b.N {
		t := threadTime()
		for range 1000 {
			tileF32AVX512(&xp, &wp, k, &out)
		}
		best = min(best, threadTime()-t)
	}
	b.ReportMetric(2*4*6*k*1000/best.Seconds()/1e9, "GFLOP/s")
}

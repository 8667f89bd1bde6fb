package engine

import "math"

// ExpFast returns e^x to within a few parts in 10^9, cheaper than math.Exp: sampling
// takes an exponential of every vocabulary entry, and gelu one of every MLP
// activation. It is exact enough for float32 results.
func ExpFast(x float64) float64 {
	if !(x >= -708) { // below the smallest normal result, -Inf, and NaN
		if x != x {
			return x
		}
		return 0
	}
	if x > 709 {
		return math.Inf(1)
	}
	// e^x = 2^k · e^y with k = round(x·log2 e) and y = x - k·ln 2 in [-0.347, 0.347].
	// Adding 1.5·2^52 rounds to an integer, which then sits in the low mantissa bits.
	const magic = 1.5 * (1 << 52)
	r := x*math.Log2E + magic
	k := int64(math.Float64bits(r) - math.Float64bits(magic))
	y := x - (r-magic)*math.Ln2
	// e^y from its Taylor series to y^7 (error below 6e-9), in Estrin's scheme so that
	// the multiplications do not wait on each other.
	y2 := y * y
	y4 := y2 * y2
	p := (1 + y) + y2*(1.0/2+y*(1.0/6)) + y4*((1.0/24+y*(1.0/120))+y2*(1.0/720+y*(1.0/5040)))
	return p * math.Float64frombits(uint64(k+1023)<<52)
}

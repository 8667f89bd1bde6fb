//go:build !amd64

package cpu

import "unsafe"

// useAVX2 is false off amd64: the pure-Go loops run.
var useAVX2 = false

// dot4AVX2 is never called off amd64 (useAVX2 is false); it computes the same sums in
// plain Go so that the package compiles everywhere.
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

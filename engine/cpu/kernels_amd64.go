package cpu

import xcpu "golang.org/x/sys/cpu"

// useAVX2 selects the AVX2/FMA dot-product kernel; the pure-Go loops run where the CPU
// lacks it. Tests flip it to check both paths.
var useAVX2 = xcpu.X86.HasAVX2 && xcpu.X86.HasFMA

// dot4AVX2 writes the dot products of x[:n] with w0..w3[:n] into out (kernels_amd64.s).
// Every pointer must be valid for n elements.
//
//go:noescape
func dot4AVX2(x, w0, w1, w2, w3 *float32, n int, out *[4]float32)

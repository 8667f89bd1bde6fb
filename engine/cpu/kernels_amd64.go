package cpu

import xcpu "golang.org/x/sys/cpu"

// useAVX2 selects the AVX2/FMA/F16C kernels (kernels_amd64.s, kernelsq_amd64.s); the
// pure-Go loops run where the CPU lacks them. Tests flip it to check both paths.
var useAVX2 = xcpu.X86.HasAVX2 && xcpu.X86.HasFMA && xcpu.X86.HasF16C

// useVNNI selects the Q8_0 kernel on AVX-512 VNNI's VPDPBUSD (the same integers as
// the AVX2 kernel's, so the same results).
var useVNNI = useAVX2 && xcpu.X86.HasAVX512VNNI && xcpu.X86.HasAVX512VL

// useTile selects the float register tile of prompt steps (tile_amd64.s), which needs
// AVX-512VL's 32 vector registers; without it prompt steps run the one-row kernels.
var useTile = useAVX2 && xcpu.X86.HasAVX512F && xcpu.X86.HasAVX512VL

// useBF16 selects, for bfloat16 weights, the kernels on AVX-512 BF16's VDPBF16PS over
// the inputs rounded to bfloat16 (gemmbf16.go's mulBF16), twice the float32 FMA's products
// an instruction.
var useBF16 = useTile && xcpu.X86.HasAVX512BF16

// tilePackedBF16AVX512 is the register tile on bfloat16 operands packed by 16: x
// [n/16][4][16], w [n/16][6][16], n a multiple of 16 (tilebf16_amd64.s).
//
//go:noescape
func tilePackedBF16AVX512(x, w *uint16, n int, out *[24]float32)

// dot4BF16DP writes dotBF16Go of x (n bfloat16s, its chunks of 16 xstep bytes apart)
// with rows w0..w3 into out (tilebf16_amd64.s).
//
//go:noescape
func dot4BF16DP(x *uint16, xstep, n int, w0, w1, w2, w3 *byte, out *[4]float32)

// packRowsBF16AVX2 interleaves 6 rows of n bfloat16s by 16 into dst [n/16][6][16].
//
//go:noescape
func packRowsBF16AVX2(src *[6]*byte, n int, dst *uint16)

// dot4AVX2 writes the dot products of x[:n] with w0..w3[:n] into out (kernels_amd64.s).
// Every pointer must be valid for n elements.
//
//go:noescape
func dot4AVX2(x, w0, w1, w2, w3 *float32, n int, out *[4]float32)

// dot4F16AVX2 and dot4BF16AVX2 are dot4AVX2 over rows of n halves or bfloat16s.
//
//go:noescape
func dot4F16AVX2(x *float32, w0, w1, w2, w3 *byte, n int, out *[4]float32)

//go:noescape
func dot4BF16AVX2(x *float32, w0, w1, w2, w3 *byte, n int, out *[4]float32)

// tileF32AVX512 writes out[r·6+j] = Σ_k x[r][k]·w[j][k] over n floats (tile_amd64.s).
//
//go:noescape
func tileF32AVX512(x *[4]*float32, w *[6]*float32, n int, out *[24]float32)

// tilePackedF32AVX512 is tileF32AVX512 on packed operands: x [n/8][4][8], w
// [n/8][6][8], n a multiple of 8 (tile_amd64.s).
//
//go:noescape
func tilePackedF32AVX512(x, w *float32, n int, out *[24]float32)

// packRowsF32AVX2 and packRows16AVX2 interleave rows rows of n values by 8 into dst
// [n/8][rows][8] (tile_amd64.s), the 16-bit ones widened.
//
//go:noescape
func packRowsF32AVX2(src *[6]*float32, rows, n int, dst *float32)

//go:noescape
func packRows16AVX2(src *[6]*byte, rows, n int, dst *float32, bf bool)

// dot4Q8AVX2, dot4Q4KAVX2 and dot4Q6KAVX2 are dotQ8Go, dotQ4KGo and dotQ6KGo of four
// weight rows whose blocks lie step bytes apart, prefetching pf bytes ahead of each
// (kernelsq_amd64.s).
//
//go:noescape
func dot4Q8AVX2(q *int8, d *float32, nb int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int)

//go:noescape
func dot4Q8VNNI(q *int8, d *float32, nb int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int)

//go:noescape
func dot4Q4KAVX2(q *int8, d *float32, bs32 *int16, ns int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int)

//go:noescape
func dot4Q6KAVX2(q *int8, d *float32, bs16 *int16, ns int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int)

// widenF16AVX2 and widenBF16AVX2 write n halves or bfloat16s at src as float32s.
//
//go:noescape
func widenF16AVX2(src *byte, dst *float32, n int)

//go:noescape
func widenBF16AVX2(src *byte, dst *float32, n int)

// dot1AVX2 is one output of dot4AVX2 (kernels_amd64.s).
//
//go:noescape
func dot1AVX2(x, w *float32, n int) float32

// axpyAVX2 adds a·x to y over n floats, rounding each product (kernels_amd64.s).
//
//go:noescape
func axpyAVX2(y *float32, a float32, x *float32, n int)

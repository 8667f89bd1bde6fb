#include "textflag.h"

// The bfloat16 kernels of prompt and decode steps on AVX-512 BF16 (gemm.go's mulBF16):
// VDPBF16PS adds to each float32 lane the products of its two pairs of bfloat16s, the
// odd one first, each addition rounded (dotBF16Go computes the same). Lane l of a
// 16-value chunk takes values 2l and 2l+1; the lanes are reduced as reduce8 does. Go's
// assembler has no VDPBF16PS: it is written as its EVEX bytes (ymm operands; the comment
// beside each gives the instruction in Go's operand order).

// func tilePackedBF16AVX512(x, w *uint16, n int, out *[24]float32)
//
// out[r·6+j] = Σ_k x[r][k]·w[j][k] for 4 input rows packed [n/16][4][16] and 6 weight
// rows packed [n/16][6][16], n a multiple of 16; each sum computed as dot4BF16DP computes
// one. Row r's accumulator for weight row j is Y(8+6r+j).
TEXT ·tilePackedBF16AVX512(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), R8
	MOVQ w+8(FP), R12
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
	VXORPS Y14, Y14, Y14
	VXORPS Y15, Y15, Y15
	VPXORD Y16, Y16, Y16
	VPXORD Y17, Y17, Y17
	VPXORD Y18, Y18, Y18
	VPXORD Y19, Y19, Y19
	VPXORD Y20, Y20, Y20
	VPXORD Y21, Y21, Y21
	VPXORD Y22, Y22, Y22
	VPXORD Y23, Y23, Y23
	VPXORD Y24, Y24, Y24
	VPXORD Y25, Y25, Y25
	VPXORD Y26, Y26, Y26
	VPXORD Y27, Y27, Y27
	VPXORD Y28, Y28, Y28
	VPXORD Y29, Y29, Y29
	VPXORD Y30, Y30, Y30
	VPXORD Y31, Y31, Y31

bftileloop:
	TESTQ CX, CX
	JZ    bftilereduce
	VMOVDQU 0(R8), Y0
	VMOVDQU 32(R8), Y1
	VMOVDQU 64(R8), Y2
	VMOVDQU 96(R8), Y3
	VMOVDQU 0(R12), Y4
	BYTE $0x62; BYTE $0x72; BYTE $0x7e; BYTE $0x28; BYTE $0x52; BYTE $0xc4 // VDPBF16PS Y4, Y0, Y8
	BYTE $0x62; BYTE $0x72; BYTE $0x76; BYTE $0x28; BYTE $0x52; BYTE $0xf4 // VDPBF16PS Y4, Y1, Y14
	BYTE $0x62; BYTE $0xe2; BYTE $0x6e; BYTE $0x28; BYTE $0x52; BYTE $0xe4 // VDPBF16PS Y4, Y2, Y20
	BYTE $0x62; BYTE $0x62; BYTE $0x66; BYTE $0x28; BYTE $0x52; BYTE $0xd4 // VDPBF16PS Y4, Y3, Y26
	VMOVDQU 32(R12), Y4
	BYTE $0x62; BYTE $0x72; BYTE $0x7e; BYTE $0x28; BYTE $0x52; BYTE $0xcc // VDPBF16PS Y4, Y0, Y9
	BYTE $0x62; BYTE $0x72; BYTE $0x76; BYTE $0x28; BYTE $0x52; BYTE $0xfc // VDPBF16PS Y4, Y1, Y15
	BYTE $0x62; BYTE $0xe2; BYTE $0x6e; BYTE $0x28; BYTE $0x52; BYTE $0xec // VDPBF16PS Y4, Y2, Y21
	BYTE $0x62; BYTE $0x62; BYTE $0x66; BYTE $0x28; BYTE $0x52; BYTE $0xdc // VDPBF16PS Y4, Y3, Y27
	VMOVDQU 64(R12), Y4
	BYTE $0x62; BYTE $0x72; BYTE $0x7e; BYTE $0x28; BYTE $0x52; BYTE $0xd4 // VDPBF16PS Y4, Y0, Y10
	BYTE $0x62; BYTE $0xe2; BYTE $0x76; BYTE $0x28; BYTE $0x52; BYTE $0xc4 // VDPBF16PS Y4, Y1, Y16
	BYTE $0x62; BYTE $0xe2; BYTE $0x6e; BYTE $0x28; BYTE $0x52; BYTE $0xf4 // VDPBF16PS Y4, Y2, Y22
	BYTE $0x62; BYTE $0x62; BYTE $0x66; BYTE $0x28; BYTE $0x52; BYTE $0xe4 // VDPBF16PS Y4, Y3, Y28
	VMOVDQU 96(R12), Y4
	BYTE $0x62; BYTE $0x72; BYTE $0x7e; BYTE $0x28; BYTE $0x52; BYTE $0xdc // VDPBF16PS Y4, Y0, Y11
	BYTE $0x62; BYTE $0xe2; BYTE $0x76; BYTE $0x28; BYTE $0x52; BYTE $0xcc // VDPBF16PS Y4, Y1, Y17
	BYTE $0x62; BYTE $0xe2; BYTE $0x6e; BYTE $0x28; BYTE $0x52; BYTE $0xfc // VDPBF16PS Y4, Y2, Y23
	BYTE $0x62; BYTE $0x62; BYTE $0x66; BYTE $0x28; BYTE $0x52; BYTE $0xec // VDPBF16PS Y4, Y3, Y29
	VMOVDQU 128(R12), Y4
	BYTE $0x62; BYTE $0x72; BYTE $0x7e; BYTE $0x28; BYTE $0x52; BYTE $0xe4 // VDPBF16PS Y4, Y0, Y12
	BYTE $0x62; BYTE $0xe2; BYTE $0x76; BYTE $0x28; BYTE $0x52; BYTE $0xd4 // VDPBF16PS Y4, Y1, Y18
	BYTE $0x62; BYTE $0x62; BYTE $0x6e; BYTE $0x28; BYTE $0x52; BYTE $0xc4 // VDPBF16PS Y4, Y2, Y24
	BYTE $0x62; BYTE $0x62; BYTE $0x66; BYTE $0x28; BYTE $0x52; BYTE $0xf4 // VDPBF16PS Y4, Y3, Y30
	VMOVDQU 160(R12), Y4
	BYTE $0x62; BYTE $0x72; BYTE $0x7e; BYTE $0x28; BYTE $0x52; BYTE $0xec // VDPBF16PS Y4, Y0, Y13
	BYTE $0x62; BYTE $0xe2; BYTE $0x76; BYTE $0x28; BYTE $0x52; BYTE $0xdc // VDPBF16PS Y4, Y1, Y19
	BYTE $0x62; BYTE $0x62; BYTE $0x6e; BYTE $0x28; BYTE $0x52; BYTE $0xcc // VDPBF16PS Y4, Y2, Y25
	BYTE $0x62; BYTE $0x62; BYTE $0x66; BYTE $0x28; BYTE $0x52; BYTE $0xfc // VDPBF16PS Y4, Y3, Y31
	ADDQ $128, R8
	ADDQ $192, R12
	DECQ CX
	JMP  bftileloop

// BFRED reduces accumulator A as reduce8 does and stores it at OFF(CX).
#define BFRED(A, OFF) \
	VMOVAPS      A, Y0; \
	VEXTRACTF128 $1, Y0, X1; \
	VADDPS       X1, X0, X0; \
	VHADDPS      X0, X0, X0; \
	VHADDPS      X0, X0, X0; \
	VMOVSS       X0, OFF(CX)

bftilereduce:
	MOVQ out+24(FP), CX
	BFRED(Y8, 0)
	BFRED(Y9, 4)
	BFRED(Y10, 8)
	BFRED(Y11, 12)
	BFRED(Y12, 16)
	BFRED(Y13, 20)
	BFRED(Y14, 24)
	BFRED(Y15, 28)
	BFRED(Y16, 32)
	BFRED(Y17, 36)
	BFRED(Y18, 40)
	BFRED(Y19, 44)
	BFRED(Y20, 48)
	BFRED(Y21, 52)
	BFRED(Y22, 56)
	BFRED(Y23, 60)
	BFRED(Y24, 64)
	BFRED(Y25, 68)
	BFRED(Y26, 72)
	BFRED(Y27, 76)
	BFRED(Y28, 80)
	BFRED(Y29, 84)
	BFRED(Y30, 88)
	BFRED(Y31, 92)
	VZEROUPPER
	RET

// func dot4BF16DP(x *uint16, xstep, n int, w0, w1, w2, w3 *byte, out *[4]float32)
//
// out[j] = dotBF16Go of the n bfloat16s of x against weight row wj, n a multiple of 16;
// x's chunks of 16 lie xstep bytes apart (its row in a tile-packed batch: 128).
TEXT ·dot4BF16DP(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), SI
	MOVQ xstep+8(FP), DX
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	MOVQ w0+24(FP), R8
	MOVQ w1+32(FP), R9
	MOVQ w2+40(FP), R10
	MOVQ w3+48(FP), R11
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	XORQ   AX, AX

bfdotloop:
	TESTQ CX, CX
	JZ    bfdotdone
	VMOVDQU (SI), Y0
	VMOVDQU (R8)(AX*1), Y4
	VMOVDQU (R9)(AX*1), Y5
	VMOVDQU (R10)(AX*1), Y6
	VMOVDQU (R11)(AX*1), Y7
	BYTE $0x62; BYTE $0x72; BYTE $0x7e; BYTE $0x28; BYTE $0x52; BYTE $0xc4 // VDPBF16PS Y4, Y0, Y8
	BYTE $0x62; BYTE $0x72; BYTE $0x7e; BYTE $0x28; BYTE $0x52; BYTE $0xcd // VDPBF16PS Y5, Y0, Y9
	BYTE $0x62; BYTE $0x72; BYTE $0x7e; BYTE $0x28; BYTE $0x52; BYTE $0xd6 // VDPBF16PS Y6, Y0, Y10
	BYTE $0x62; BYTE $0x72; BYTE $0x7e; BYTE $0x28; BYTE $0x52; BYTE $0xdf // VDPBF16PS Y7, Y0, Y11
	ADDQ DX, SI
	ADDQ $32, AX
	DECQ CX
	JMP  bfdotloop

bfdotdone:
	MOVQ out+56(FP), CX
	BFRED(Y8, 0)
	BFRED(Y9, 4)
	BFRED(Y10, 8)
	BFRED(Y11, 12)
	VZEROUPPER
	RET

// func packRowsBF16AVX2(src *[6]*byte, n int, dst *uint16)
//
// Interleaves 6 rows of n bfloat16s (n a multiple of 16) by 16 into dst [n/16][6][16].
TEXT ·packRowsBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ src+0(FP), AX
	MOVQ 0(AX), R8
	MOVQ 8(AX), R9
	MOVQ 16(AX), R10
	MOVQ 24(AX), R11
	MOVQ 32(AX), R12
	MOVQ 40(AX), R13
	MOVQ n+8(FP), CX
	SHRQ $4, CX
	MOVQ dst+16(FP), DI
	XORQ AX, AX

bfpackloop:
	TESTQ CX, CX
	JZ    bfpackdone
	VMOVDQU (R8)(AX*1), Y0
	VMOVDQU (R9)(AX*1), Y1
	VMOVDQU (R10)(AX*1), Y2
	VMOVDQU (R11)(AX*1), Y3
	VMOVDQU (R12)(AX*1), Y4
	VMOVDQU (R13)(AX*1), Y5
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	VMOVDQU Y4, 128(DI)
	VMOVDQU Y5, 160(DI)
	ADDQ $32, AX
	ADDQ $192, DI
	DECQ CX
	JMP  bfpackloop

bfpackdone:
	VZEROUPPER
	RET

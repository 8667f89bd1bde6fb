#include "textflag.h"

// func tileF32AVX512(x *[4]*float32, w *[6]*float32, n int, out *[24]float32)
//
// out[r·6+j] = Σ_k x[r][k]·w[j][k] for 4 input rows and 6 weight rows of n floats: the
// register tile of prompt steps. Each of the 24 sums is computed exactly as dot4AVX2
// computes one — eight lanes accumulating k ≡ lane (mod 8) by FMA over the first n&^7
// elements, the lanes reduced in the same order, then the tail added one element at a
// time — so a row's outputs do not depend on whether it went through the tile. The 24
// accumulators live in Y8–Y31, which AVX-512VL's EVEX encoding reaches with 256-bit
// operations.
TEXT ·tileF32AVX512(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), AX
	MOVQ 0(AX), R8
	MOVQ 8(AX), R9
	MOVQ 16(AX), R10
	MOVQ 24(AX), R11
	MOVQ w+8(FP), AX
	MOVQ 0(AX), R12
	MOVQ 8(AX), R13
	MOVQ 16(AX), R14
	MOVQ 24(AX), SI
	MOVQ 32(AX), DI
	MOVQ 40(AX), BX
	MOVQ n+16(FP), CX
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
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-8, DX

// COL multiplies weight row W into the column of accumulators A0..A3 (input rows 0..3).
#define COL(W, A0, A1, A2, A3) \
	VMOVUPS     (W)(AX*4), Y4; \
	VFMADD231PS Y4, Y0, A0; \
	VFMADD231PS Y4, Y1, A1; \
	VFMADD231PS Y4, Y2, A2; \
	VFMADD231PS Y4, Y3, A3

tileloop:
	CMPQ AX, DX
	JGE  tilereduce
	VMOVUPS (R8)(AX*4), Y0
	VMOVUPS (R9)(AX*4), Y1
	VMOVUPS (R10)(AX*4), Y2
	VMOVUPS (R11)(AX*4), Y3
	COL(R12, Y8, Y14, Y20, Y26)
	COL(R13, Y9, Y15, Y21, Y27)
	COL(R14, Y10, Y16, Y22, Y28)
	COL(SI, Y11, Y17, Y23, Y29)
	COL(DI, Y12, Y18, Y24, Y30)
	COL(BX, Y13, Y19, Y25, Y31)
	ADDQ $8, AX
	JMP  tileloop

// RED reduces accumulator A as dot4AVX2 does and stores it at OFF(CX).
#define RED(A, OFF) \
	VMOVAPS      A, Y0; \
	VEXTRACTF128 $1, Y0, X1; \
	VADDPS       X1, X0, X0; \
	VHADDPS      X0, X0, X0; \
	VHADDPS      X0, X0, X0; \
	VMOVSS       X0, OFF(CX)

tilereduce:
	MOVQ out+24(FP), CX
	RED(Y8, 0)
	RED(Y9, 4)
	RED(Y10, 8)
	RED(Y11, 12)
	RED(Y12, 16)
	RED(Y13, 20)
	RED(Y14, 24)
	RED(Y15, 28)
	RED(Y16, 32)
	RED(Y17, 36)
	RED(Y18, 40)
	RED(Y19, 44)
	RED(Y20, 48)
	RED(Y21, 52)
	RED(Y22, 56)
	RED(Y23, 60)
	RED(Y24, 64)
	RED(Y25, 68)
	RED(Y26, 72)
	RED(Y27, 76)
	RED(Y28, 80)
	RED(Y29, 84)
	RED(Y30, 88)
	RED(Y31, 92)
	MOVQ n+16(FP), DX

// TAIL adds x[r][k]·W[k] (x[r][k] in X0) to the stored sum at OFF.
#define TAIL(W, OFF) \
	VMOVSS      OFF(CX), X1; \
	VMOVSS      (W)(AX*4), X2; \
	VFMADD231SS X2, X0, X1; \
	VMOVSS      X1, OFF(CX)

tiletail:
	CMPQ AX, DX
	JGE  tiledone
	VMOVSS (R8)(AX*4), X0
	TAIL(R12, 0)
	TAIL(R13, 4)
	TAIL(R14, 8)
	TAIL(SI, 12)
	TAIL(DI, 16)
	TAIL(BX, 20)
	VMOVSS (R9)(AX*4), X0
	TAIL(R12, 24)
	TAIL(R13, 28)
	TAIL(R14, 32)
	TAIL(SI, 36)
	TAIL(DI, 40)
	TAIL(BX, 44)
	VMOVSS (R10)(AX*4), X0
	TAIL(R12, 48)
	TAIL(R13, 52)
	TAIL(R14, 56)
	TAIL(SI, 60)
	TAIL(DI, 64)
	TAIL(BX, 68)
	VMOVSS (R11)(AX*4), X0
	TAIL(R12, 72)
	TAIL(R13, 76)
	TAIL(R14, 80)
	TAIL(SI, 84)
	TAIL(DI, 88)
	TAIL(BX, 92)
	INCQ AX
	JMP  tiletail

tiledone:
	VZEROUPPER
	RET


// func tilePackedF32AVX512(x, w *float32, n int, out *[24]float32)
//
// tileF32AVX512 on packed operands: x holds 4 rows interleaved by 8 floats ([n/8][4][8]),
// w 6 rows the same way ([n/8][6][8]), n a multiple of 8 — two sequential streams where
// the rows were ten. The same FMAs in the same order, and the same reduction: the same
// bits.
TEXT ·tilePackedF32AVX512(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
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

// PCOL multiplies packed weight row OFF into the accumulators A0..A3.
#define PCOL(OFF, A0, A1, A2, A3) \
	VMOVUPS     OFF(DI), Y4; \
	VFMADD231PS Y4, Y0, A0; \
	VFMADD231PS Y4, Y1, A1; \
	VFMADD231PS Y4, Y2, A2; \
	VFMADD231PS Y4, Y3, A3

packloop:
	TESTQ CX, CX
	JZ    packreduce
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	PCOL(0, Y8, Y14, Y20, Y26)
	PCOL(32, Y9, Y15, Y21, Y27)
	PCOL(64, Y10, Y16, Y22, Y28)
	PCOL(96, Y11, Y17, Y23, Y29)
	PCOL(128, Y12, Y18, Y24, Y30)
	PCOL(160, Y13, Y19, Y25, Y31)
	ADDQ $128, SI
	ADDQ $192, DI
	DECQ CX
	JMP  packloop

packreduce:
	MOVQ out+24(FP), CX
	RED(Y8, 0)
	RED(Y9, 4)
	RED(Y10, 8)
	RED(Y11, 12)
	RED(Y12, 16)
	RED(Y13, 20)
	RED(Y14, 24)
	RED(Y15, 28)
	RED(Y16, 32)
	RED(Y17, 36)
	RED(Y18, 40)
	RED(Y19, 44)
	RED(Y20, 48)
	RED(Y21, 52)
	RED(Y22, 56)
	RED(Y23, 60)
	RED(Y24, 64)
	RED(Y25, 68)
	RED(Y26, 72)
	RED(Y27, 76)
	RED(Y28, 80)
	RED(Y29, 84)
	RED(Y30, 88)
	RED(Y31, 92)
	VZEROUPPER
	RET

// func packRowsF32AVX2(src *[6]*float32, rows, n int, dst *float32)
//
// Interleaves rows rows of n floats (n a multiple of 8) by 8 into dst [n/8][rows][8]:
// the packed operand of tilePackedF32AVX512. A padding row points at zeros.
TEXT ·packRowsF32AVX2(SB), NOSPLIT, $0-32
	MOVQ src+0(FP), SI
	MOVQ rows+8(FP), R8
	MOVQ n+16(FP), CX
	MOVQ dst+24(FP), DI
	XORQ AX, AX // byte offset into each row

pf32k:
	MOVQ CX, DX
	SHLQ $2, DX
	CMPQ AX, DX
	JGE  pf32done
	XORQ R9, R9

pf32r:
	CMPQ R9, R8
	JGE  pf32next
	MOVQ    (SI)(R9*8), R10
	VMOVUPS (R10)(AX*1), Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, DI
	INCQ    R9
	JMP     pf32r

pf32next:
	ADDQ $32, AX
	JMP  pf32k

pf32done:
	VZEROUPPER
	RET

// func packRows16AVX2(src *[6]*byte, rows, n int, dst *float32, bf bool)
//
// packRowsF32AVX2 for rows of halves (bf: bfloat16s), widened as they are packed.
TEXT ·packRows16AVX2(SB), NOSPLIT, $0-33
	MOVQ src+0(FP), SI
	MOVQ rows+8(FP), R8
	MOVQ n+16(FP), CX
	MOVQ dst+24(FP), DI
	MOVBQZX bf+32(FP), R11
	XORQ AX, AX // byte offset into each row

p16k:
	MOVQ CX, DX
	SHLQ $1, DX
	CMPQ AX, DX
	JGE  p16done
	XORQ R9, R9

p16r:
	CMPQ R9, R8
	JGE  p16next
	MOVQ (SI)(R9*8), R10
	TESTQ R11, R11
	JNZ  p16bf
	VCVTPH2PS (R10)(AX*1), Y0
	JMP  p16store

p16bf:
	VPMOVZXWD (R10)(AX*1), Y0
	VPSLLD    $16, Y0, Y0

p16store:
	VMOVUPS Y0, (DI)
	ADDQ    $32, DI
	INCQ    R9
	JMP     p16r

p16next:
	ADDQ $16, AX
	JMP  p16k

p16done:
	VZEROUPPER
	RET

#include "textflag.h"

// The integer kernels of kernelsq.go in AVX2: four weight rows against one quantized
// input row. Products are summed exactly (VPMADDUBSW of unsigned by signed bytes into
// int16 pairs, which cannot saturate for these value ranges, then VPMADDWD into eight
// int32 lanes, lane l holding values 4l..4l+3 of each 32), lanes are scaled with a
// separate multiply and add, never fused, and reduced as reduce8 does: the same bits as
// the Go kernels. Each reads the four weight rows of a group, a row's blocks step bytes
// apart: the block's size for rows stored one after the other, four times it for rows
// interleaved block by block (matPart.ilv), which makes the group one sequential stream.
// pf is the distance to the bytes to prefetch as each block is read: for rows one after
// the other, the next group's same bytes (the hardware's prefetchers lose track of four
// short streams at a time).

// Shuffle masks of the k-quant kernels (VPSHUFB, within each 128-bit lane): q4scale<>+32j
// puts scale byte j in the low byte of every word, the high byte zero (Q4_K's unsigned
// scales, widened); q6scale<>+32g puts byte 2g (low lane) or 2g+1 (high lane) in the
// high byte of every word, the low byte zero, for VPSRAW $8 to sign-extend (Q6_K's).
DATA q4scale<>+0(SB)/8, $0x8000800080008000
DATA q4scale<>+8(SB)/8, $0x8000800080008000
DATA q4scale<>+16(SB)/8, $0x8000800080008000
DATA q4scale<>+24(SB)/8, $0x8000800080008000
DATA q4scale<>+32(SB)/8, $0x8001800180018001
DATA q4scale<>+40(SB)/8, $0x8001800180018001
DATA q4scale<>+48(SB)/8, $0x8001800180018001
DATA q4scale<>+56(SB)/8, $0x8001800180018001
DATA q4scale<>+64(SB)/8, $0x8002800280028002
DATA q4scale<>+72(SB)/8, $0x8002800280028002
DATA q4scale<>+80(SB)/8, $0x8002800280028002
DATA q4scale<>+88(SB)/8, $0x8002800280028002
DATA q4scale<>+96(SB)/8, $0x8003800380038003
DATA q4scale<>+104(SB)/8, $0x8003800380038003
DATA q4scale<>+112(SB)/8, $0x8003800380038003
DATA q4scale<>+120(SB)/8, $0x8003800380038003
DATA q4scale<>+128(SB)/8, $0x8004800480048004
DATA q4scale<>+136(SB)/8, $0x8004800480048004
DATA q4scale<>+144(SB)/8, $0x8004800480048004
DATA q4scale<>+152(SB)/8, $0x8004800480048004
DATA q4scale<>+160(SB)/8, $0x8005800580058005
DATA q4scale<>+168(SB)/8, $0x8005800580058005
DATA q4scale<>+176(SB)/8, $0x8005800580058005
DATA q4scale<>+184(SB)/8, $0x8005800580058005
DATA q4scale<>+192(SB)/8, $0x8006800680068006
DATA q4scale<>+200(SB)/8, $0x8006800680068006
DATA q4scale<>+208(SB)/8, $0x8006800680068006
DATA q4scale<>+216(SB)/8, $0x8006800680068006
DATA q4scale<>+224(SB)/8, $0x8007800780078007
DATA q4scale<>+232(SB)/8, $0x8007800780078007
DATA q4scale<>+240(SB)/8, $0x8007800780078007
DATA q4scale<>+248(SB)/8, $0x8007800780078007
GLOBL q4scale<>(SB), RODATA|NOPTR, $256

DATA q6scale<>+0(SB)/8, $0x0080008000800080
DATA q6scale<>+8(SB)/8, $0x0080008000800080
DATA q6scale<>+16(SB)/8, $0x0180018001800180
DATA q6scale<>+24(SB)/8, $0x0180018001800180
DATA q6scale<>+32(SB)/8, $0x0280028002800280
DATA q6scale<>+40(SB)/8, $0x0280028002800280
DATA q6scale<>+48(SB)/8, $0x0380038003800380
DATA q6scale<>+56(SB)/8, $0x0380038003800380
DATA q6scale<>+64(SB)/8, $0x0480048004800480
DATA q6scale<>+72(SB)/8, $0x0480048004800480
DATA q6scale<>+80(SB)/8, $0x0580058005800580
DATA q6scale<>+88(SB)/8, $0x0580058005800580
DATA q6scale<>+96(SB)/8, $0x0680068006800680
DATA q6scale<>+104(SB)/8, $0x0680068006800680
DATA q6scale<>+112(SB)/8, $0x0780078007800780
DATA q6scale<>+120(SB)/8, $0x0780078007800780
DATA q6scale<>+128(SB)/8, $0x0880088008800880
DATA q6scale<>+136(SB)/8, $0x0880088008800880
DATA q6scale<>+144(SB)/8, $0x0980098009800980
DATA q6scale<>+152(SB)/8, $0x0980098009800980
DATA q6scale<>+160(SB)/8, $0x0a800a800a800a80
DATA q6scale<>+168(SB)/8, $0x0a800a800a800a80
DATA q6scale<>+176(SB)/8, $0x0b800b800b800b80
DATA q6scale<>+184(SB)/8, $0x0b800b800b800b80
DATA q6scale<>+192(SB)/8, $0x0c800c800c800c80
DATA q6scale<>+200(SB)/8, $0x0c800c800c800c80
DATA q6scale<>+208(SB)/8, $0x0d800d800d800d80
DATA q6scale<>+216(SB)/8, $0x0d800d800d800d80
DATA q6scale<>+224(SB)/8, $0x0e800e800e800e80
DATA q6scale<>+232(SB)/8, $0x0e800e800e800e80
DATA q6scale<>+240(SB)/8, $0x0f800f800f800f80
DATA q6scale<>+248(SB)/8, $0x0f800f800f800f80
GLOBL q6scale<>(SB), RODATA|NOPTR, $256


// REDUCE8 reduces the eight float32 lanes of Y into the low lane of X (T a temporary).
#define REDUCE8(Y, X, T) \
	VEXTRACTF128 $1, Y, T; \
	VADDPS       T, X, X; \
	VHADDPS      X, X, X; \
	VHADDPS      X, X, X

// HALF loads the half at OFF(P), widens it to float32 in the low lane of X and
// multiplies it by the float32 at D (T a general-purpose temporary).
#define HALF(OFF, P, D, X, T) \
	MOVWLZX   OFF(P), T; \
	VMOVD     T, X; \
	VCVTPH2PS X, X; \
	VMULSS    D, X, X

// func dot4Q8AVX2(q *int8, d *float32, nb int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int)
//
// out[j] = dotQ8Go(q[:32nb], d[:nb], wj): Q8_0 weight rows against a Q8_0 input row.
// The input's signs move onto the weights (VPSIGNB) so that its magnitudes can be the
// unsigned operand.
TEXT ·dot4Q8AVX2(SB), NOSPLIT, $0-80
	MOVQ pf+64(FP), R13
	MOVQ q+0(FP), SI
	MOVQ d+8(FP), R12
	MOVQ nb+16(FP), CX
	MOVQ w0+24(FP), R8
	MOVQ w1+32(FP), R9
	MOVQ w2+40(FP), R10
	MOVQ w3+48(FP), R11
	VXORPS  Y0, Y0, Y0
	VXORPS  Y1, Y1, Y1
	VXORPS  Y2, Y2, Y2
	VXORPS  Y3, Y3, Y3
	VPCMPEQW Y15, Y15, Y15
	VPSRLW  $15, Y15, Y15 // int16 ones

// Q8ROW adds weight row P's block to accumulator A (the input in Y4, |input| in Y5).
#define Q8ROW(P, A) \
	PREFETCHT0 (P)(R13*1); \
	VMOVDQU    2(P), Y6; \
	VPSIGNB    Y4, Y6, Y6; \
	VPMADDUBSW Y6, Y5, Y6; \
	VPMADDWD   Y15, Y6, Y6; \
	VCVTDQ2PS  Y6, Y6; \
	HALF(0, P, (R12), X7, BX); \
	VBROADCASTSS X7, Y7; \
	VMULPS     Y7, Y6, Y6; \
	VADDPS     Y6, A, A; \
	ADDQ       step+72(FP), P

q8loop:
	TESTQ CX, CX
	JZ    q8done
	VMOVDQU (SI), Y4
	VPABSB  Y4, Y5
	Q8ROW(R8, Y0)
	Q8ROW(R9, Y1)
	Q8ROW(R10, Y2)
	Q8ROW(R11, Y3)
	ADDQ $32, SI
	ADDQ $4, R12
	DECQ CX
	JMP  q8loop

q8done:
	MOVQ out+56(FP), DI
	REDUCE8(Y0, X0, X4)
	REDUCE8(Y1, X1, X4)
	REDUCE8(Y2, X2, X4)
	REDUCE8(Y3, X3, X4)
	VMOVSS X0, 0(DI)
	VMOVSS X1, 4(DI)
	VMOVSS X2, 8(DI)
	VMOVSS X3, 12(DI)
	VZEROUPPER
	RET

// func dot4Q8VNNI(q *int8, d *float32, nb int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int)
//
// dot4Q8AVX2 with AVX-512 VNNI: VPDPBUSD sums each lane's four byte products in one
// instruction (VPMADDUBSW and VPMADDWD before); the integers, so the results, are the same.
TEXT ·dot4Q8VNNI(SB), NOSPLIT, $0-80
	MOVQ pf+64(FP), R13
	MOVQ q+0(FP), SI
	MOVQ d+8(FP), R12
	MOVQ nb+16(FP), CX
	MOVQ w0+24(FP), R8
	MOVQ w1+32(FP), R9
	MOVQ w2+40(FP), R10
	MOVQ w3+48(FP), R11
	VXORPS  Y0, Y0, Y0
	VXORPS  Y1, Y1, Y1
	VXORPS  Y2, Y2, Y2
	VXORPS  Y3, Y3, Y3

// Q8ROWV adds weight row P's block to accumulator A (the input in Y4, |input| in Y5).
#define Q8ROWV(P, A) \
	PREFETCHT0 (P)(R13*1); \
	VMOVDQU    2(P), Y6; \
	VPSIGNB    Y4, Y6, Y6; \
	VPXOR      Y8, Y8, Y8; \
	VPDPBUSD   Y6, Y5, Y8; \
	VCVTDQ2PS  Y8, Y8; \
	HALF(0, P, (R12), X7, BX); \
	VBROADCASTSS X7, Y7; \
	VMULPS     Y7, Y8, Y8; \
	VADDPS     Y8, A, A; \
	ADDQ       step+72(FP), P

q8vloop:
	TESTQ CX, CX
	JZ    q8vdone
	VMOVDQU (SI), Y4
	VPABSB  Y4, Y5
	Q8ROWV(R8, Y0)
	Q8ROWV(R9, Y1)
	Q8ROWV(R10, Y2)
	Q8ROWV(R11, Y3)
	ADDQ $32, SI
	ADDQ $4, R12
	DECQ CX
	JMP  q8vloop

q8vdone:
	MOVQ out+56(FP), DI
	REDUCE8(Y0, X0, X4)
	REDUCE8(Y1, X1, X4)
	REDUCE8(Y2, X2, X4)
	REDUCE8(Y3, X3, X4)
	VMOVSS X0, 0(DI)
	VMOVSS X1, 4(DI)
	VMOVSS X2, 8(DI)
	VMOVSS X3, 12(DI)
	VZEROUPPER
	RET

// func dot4Q4KAVX2(q *int8, d *float32, bs32 *int16, ns int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int)
//
// out[j] = dotQ4KGo(q[:256ns], d[:ns], bs32[:8ns], wj): Q4_K weight rows against a
// Q8_K input row. Each sub-block's int16 pairs are scaled by VPMADDWD with its scale.
TEXT ·dot4Q4KAVX2(SB), NOSPLIT, $0-88
	MOVQ q+0(FP), SI
	MOVQ d+8(FP), R12
	MOVQ bs32+16(FP), R13
	MOVQ ns+24(FP), CX
	MOVQ w0+32(FP), R8
	MOVQ w1+40(FP), R9
	MOVQ w2+48(FP), R10
	MOVQ w3+56(FP), R11
	VXORPS  Y0, Y0, Y0
	VXORPS  Y1, Y1, Y1
	VXORPS  Y2, Y2, Y2
	VXORPS  Y3, Y3, Y3
	VXORPS  X4, X4, X4
	VXORPS  X5, X5, X5
	VXORPS  X6, X6, X6
	VXORPS  X7, X7, X7
	MOVL    $0x0f0f0f0f, BX
	VMOVD   BX, X14
	VPBROADCASTD X14, Y14 // nibble mask

// Q4SUB adds sub-block pair c (qs bytes 16+32c of P: low nibbles sub-block 2c, high
// 2c+1) to the int32 lanes of Y8.
#define Q4SUB(P, C) \
	VMOVDQU       (16+32*C)(P), Y10; \
	VPAND         Y14, Y10, Y11; \
	VPSRLW        $4, Y10, Y10; \
	VPAND         Y14, Y10, Y10; \
	VPMADDUBSW    (64*C)(SI), Y11, Y11; \
	VPSHUFB       q4scale<>+(64*C)(SB), Y15, Y12; \
	VPMADDWD      Y12, Y11, Y11; \
	VPADDD        Y11, Y8, Y8; \
	VPMADDUBSW    (64*C+32)(SI), Y10, Y10; \
	VPSHUFB       q4scale<>+(64*C+32)(SB), Y15, Y12; \
	VPMADDWD      Y12, Y10, Y10; \
	VPADDD        Y10, Y8, Y8

// Q4ROW adds weight row P's super-block to accumulator A and the four lanes of min
// accumulator M. The scales and mins are unpacked in general-purpose registers with
// 32-bit masks (eight 6-bit values each, one per byte): the scale bytes go to both lanes
// of Y15, from which VPSHUFB widens each sub-block's; the mins, widened in X9, meet the
// inputs' 32-value sums in VPMADDWD's four lanes.
#define Q4ROW(P, A, M) \
	MOVQ      pf+72(FP), AX; \
	PREFETCHT0 (P)(AX*1); \
	PREFETCHT0 64(P)(AX*1); \
	PREFETCHT0 128(P)(AX*1); \
	MOVL      4(P), BX; \
	MOVL      8(P), DX; \
	MOVL      12(P), DI; \
	MOVL      BX, AX; \
	SHRL      $6, AX; \
	ANDL      $0x03030303, AX; \
	SHLL      $4, AX; \
	MOVL      DI, R14; \
	ANDL      $0x0f0f0f0f, R14; \
	ORL       AX, R14; \
	ANDL      $0x3f3f3f3f, BX; \
	SHLQ      $32, R14; \
	ORQ       R14, BX; \
	VMOVQ     BX, X15; \
	VPBROADCASTQ X15, Y15; \
	MOVL      DX, AX; \
	SHRL      $6, AX; \
	ANDL      $0x03030303, AX; \
	SHLL      $4, AX; \
	SHRL      $4, DI; \
	ANDL      $0x0f0f0f0f, DI; \
	ORL       AX, DI; \
	ANDL      $0x3f3f3f3f, DX; \
	SHLQ      $32, DI; \
	ORQ       DI, DX; \
	VMOVQ     DX, X9; \
	VPMOVZXBW X9, X9; \
	VPMADDWD  (R13), X9, X9; \
	VCVTDQ2PS X9, X9; \
	VPXOR     Y8, Y8, Y8; \
	Q4SUB(P, 0); \
	Q4SUB(P, 1); \
	Q4SUB(P, 2); \
	Q4SUB(P, 3); \
	VCVTDQ2PS Y8, Y8; \
	HALF(0, P, (R12), X13, BX); \
	VBROADCASTSS X13, Y13; \
	VMULPS    Y13, Y8, Y8; \
	VADDPS    Y8, A, A; \
	HALF(2, P, (R12), X13, BX); \
	VBROADCASTSS X13, X13; \
	VMULPS    X13, X9, X9; \
	VADDPS    X9, M, M; \
	ADDQ      step+80(FP), P

q4loop:
	TESTQ CX, CX
	JZ    q4done
	Q4ROW(R8, Y0, X4)
	Q4ROW(R9, Y1, X5)
	Q4ROW(R10, Y2, X6)
	Q4ROW(R11, Y3, X7)
	ADDQ $256, SI
	ADDQ $4, R12
	ADDQ $16, R13
	DECQ CX
	JMP  q4loop

q4done:
	MOVQ out+64(FP), DI
	REDUCE8(Y0, X0, X8)
	REDUCE8(Y1, X1, X8)
	REDUCE8(Y2, X2, X8)
	REDUCE8(Y3, X3, X8)
	VHADDPS X4, X4, X4
	VHADDPS X4, X4, X4
	VHADDPS X5, X5, X5
	VHADDPS X5, X5, X5
	VHADDPS X6, X6, X6
	VHADDPS X6, X6, X6
	VHADDPS X7, X7, X7
	VHADDPS X7, X7, X7
	VSUBSS X4, X0, X0
	VSUBSS X5, X1, X1
	VSUBSS X6, X2, X2
	VSUBSS X7, X3, X3
	VMOVSS X0, 0(DI)
	VMOVSS X1, 4(DI)
	VMOVSS X2, 8(DI)
	VMOVSS X3, 12(DI)
	VZEROUPPER
	RET

// func dot4Q6KAVX2(q *int8, d *float32, bs16 *int16, ns int, w0, w1, w2, w3 *byte, out *[4]float32, pf, step int)
//
// out[j] = dotQ6KGo(q[:256ns], d[:ns], bs16[:16ns], wj): Q6_K weight rows against a
// Q8_K input row. The 6-bit values are assembled from ql's nibbles and qh's bit pairs
// (word shifts, then byte masks: 0x0f for the low bits, 0x30 for the high ones in place);
// each 32 values span two 16-value sub-blocks, one per 128-bit lane, whose int8 scales
// (in both lanes of Y14) VPSHUFB and VPSRAW widen per lane. The −32 offset's term,
// 32·Σ sc·(sums of 16 inputs), leaves lane 0 before conversion.
TEXT ·dot4Q6KAVX2(SB), NOSPLIT, $0-88
	MOVQ pf+72(FP), DX
	MOVQ q+0(FP), SI
	MOVQ d+8(FP), R12
	MOVQ bs16+16(FP), R13
	MOVQ ns+24(FP), CX
	MOVQ w0+32(FP), R8
	MOVQ w1+40(FP), R9
	MOVQ w2+48(FP), R10
	MOVQ w3+56(FP), R11
	VXORPS  Y0, Y0, Y0
	VXORPS  Y1, Y1, Y1
	VXORPS  Y2, Y2, Y2
	VXORPS  Y3, Y3, Y3
	MOVL    $0x0f0f0f0f, BX
	VMOVD   BX, X4
	VPBROADCASTD X4, Y4 // low-bits mask
	MOVL    $0x30303030, BX
	VMOVD   BX, X5
	VPBROADCASTD X5, Y5 // high-bits mask

// Q6GRP adds the 32 values in VAL (unsigned 6-bit) times the input at QOFF(SI), scaled
// by sub-block scales 2G and 2G+1, to the int32 lanes of Y6.
#define Q6GRP(VAL, QOFF, G) \
	VPMADDUBSW QOFF(SI), VAL, VAL; \
	VPSHUFB    q6scale<>+(32*(G))(SB), Y14, Y7; \
	VPSRAW     $8, Y7, Y7; \
	VPMADDWD   Y7, VAL, VAL; \
	VPADDD     VAL, Y6, Y6

// Q6HALF adds the 128 values of half C of weight row P's super-block.
#define Q6HALF(P, C) \
	VMOVDQU (64*C)(P), Y8; \
	VMOVDQU (64*C+32)(P), Y10; \
	VMOVDQU (128+32*C)(P), Y11; \
	VPSLLW  $4, Y11, Y13; \
	VPAND   Y5, Y13, Y13; \
	VPAND   Y4, Y8, Y12; \
	VPOR    Y13, Y12, Y12; \
	Q6GRP(Y12, (128*C), 4*C); \
	VPSLLW  $2, Y11, Y13; \
	VPAND   Y5, Y13, Y13; \
	VPAND   Y4, Y10, Y12; \
	VPOR    Y13, Y12, Y12; \
	Q6GRP(Y12, (128*C+32), 4*C+1); \
	VPAND   Y5, Y11, Y13; \
	VPSRLW  $4, Y8, Y12; \
	VPAND   Y4, Y12, Y12; \
	VPOR    Y13, Y12, Y12; \
	Q6GRP(Y12, (128*C+64), 4*C+2); \
	VPSRLW  $2, Y11, Y13; \
	VPAND   Y5, Y13, Y13; \
	VPSRLW  $4, Y10, Y12; \
	VPAND   Y4, Y12, Y12; \
	VPOR    Y13, Y12, Y12; \
	Q6GRP(Y12, (128*C+96), 4*C+3)

// Q6ROW adds weight row P's super-block to accumulator A.
#define Q6ROW(P, A) \
	PREFETCHT0 (P)(DX*1); \
	PREFETCHT0 64(P)(DX*1); \
	PREFETCHT0 128(P)(DX*1); \
	PREFETCHT0 192(P)(DX*1); \
	VBROADCASTI128 192(P), Y14; \
	VPMOVSXBW    192(P), Y9; \
	VPMADDWD     (R13), Y9, Y9; \
	VEXTRACTI128 $1, Y9, X15; \
	VPADDD       X15, X9, X9; \
	VPSHUFD      $0x4e, X9, X15; \
	VPADDD       X15, X9, X9; \
	VPSHUFD      $0xb1, X9, X15; \
	VPADDD       X15, X9, X9; \
	VPSLLD       $5, X9, X9; \
	VPXOR        Y6, Y6, Y6; \
	Q6HALF(P, 0); \
	Q6HALF(P, 1); \
	VPXOR        X15, X15, X15; \
	VPBLENDD     $1, X9, X15, X15; \
	VPSUBD       Y15, Y6, Y6; \
	VCVTDQ2PS    Y6, Y6; \
	HALF(208, P, (R12), X13, BX); \
	VBROADCASTSS X13, Y13; \
	VMULPS       Y13, Y6, Y6; \
	VADDPS       Y6, A, A; \
	ADDQ         step+80(FP), P

q6loop:
	TESTQ CX, CX
	JZ    q6done
	Q6ROW(R8, Y0)
	Q6ROW(R9, Y1)
	Q6ROW(R10, Y2)
	Q6ROW(R11, Y3)
	ADDQ $256, SI
	ADDQ $4, R12
	ADDQ $32, R13
	DECQ CX
	JMP  q6loop

q6done:
	MOVQ out+64(FP), DI
	REDUCE8(Y0, X0, X8)
	REDUCE8(Y1, X1, X8)
	REDUCE8(Y2, X2, X8)
	REDUCE8(Y3, X3, X8)
	VMOVSS X0, 0(DI)
	VMOVSS X1, 4(DI)
	VMOVSS X2, 8(DI)
	VMOVSS X3, 12(DI)
	VZEROUPPER
	RET

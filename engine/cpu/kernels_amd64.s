#include "textflag.h"

// func dot4AVX2(x, w0, w1, w2, w3 *float32, n int, out *[4]float32)
//
// out[j] = Σ_k x[k]·wj[k]. Eight lanes accumulate k ≡ lane (mod 8) with FMA over the
// first n&^7 elements, the lanes are reduced in a fixed order, and the tail is added
// one element at a time, so a given (x, w) always gives the same bits.
TEXT ·dot4AVX2(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ w0+8(FP), R8
	MOVQ w1+16(FP), R9
	MOVQ w2+24(FP), R10
	MOVQ w3+32(FP), R11
	MOVQ n+40(FP), CX
	MOVQ out+48(FP), DI
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-8, DX

loop8:
	CMPQ AX, DX
	JGE  reduce
	VMOVUPS (SI)(AX*4), Y4
	VFMADD231PS (R8)(AX*4), Y4, Y0
	VFMADD231PS (R9)(AX*4), Y4, Y1
	VFMADD231PS (R10)(AX*4), Y4, Y2
	VFMADD231PS (R11)(AX*4), Y4, Y3
	ADDQ $8, AX
	JMP  loop8

reduce:
	VEXTRACTF128 $1, Y0, X4
	VADDPS       X4, X0, X0
	VHADDPS      X0, X0, X0
	VHADDPS      X0, X0, X0
	VEXTRACTF128 $1, Y1, X4
	VADDPS       X4, X1, X1
	VHADDPS      X1, X1, X1
	VHADDPS      X1, X1, X1
	VEXTRACTF128 $1, Y2, X4
	VADDPS       X4, X2, X2
	VHADDPS      X2, X2, X2
	VHADDPS      X2, X2, X2
	VEXTRACTF128 $1, Y3, X4
	VADDPS       X4, X3, X3
	VHADDPS      X3, X3, X3
	VHADDPS      X3, X3, X3

tail:
	CMPQ AX, CX
	JGE  done
	VMOVSS (SI)(AX*4), X4
	VFMADD231SS (R8)(AX*4), X4, X0
	VFMADD231SS (R9)(AX*4), X4, X1
	VFMADD231SS (R10)(AX*4), X4, X2
	VFMADD231SS (R11)(AX*4), X4, X3
	INCQ AX
	JMP  tail

done:
	VMOVSS X0, 0(DI)
	VMOVSS X1, 4(DI)
	VMOVSS X2, 8(DI)
	VMOVSS X3, 12(DI)
	VZEROUPPER
	RET

// func dot4F16AVX2(x *float32, w0, w1, w2, w3 *byte, n int, out *[4]float32)
//
// dot4AVX2 over IEEE half weight rows (n halves each), widened in registers: the same
// FMAs in the same order as on the rows widened to float32, so the same bits.
TEXT ·dot4F16AVX2(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ w0+8(FP), R8
	MOVQ w1+16(FP), R9
	MOVQ w2+24(FP), R10
	MOVQ w3+32(FP), R11
	MOVQ n+40(FP), CX
	MOVQ out+48(FP), DI
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-8, DX

f16loop8:
	CMPQ AX, DX
	JGE  f16reduce
	VMOVUPS     (SI)(AX*4), Y4
	VCVTPH2PS   (R8)(AX*2), Y5
	VFMADD231PS Y5, Y4, Y0
	VCVTPH2PS   (R9)(AX*2), Y6
	VFMADD231PS Y6, Y4, Y1
	VCVTPH2PS   (R10)(AX*2), Y7
	VFMADD231PS Y7, Y4, Y2
	VCVTPH2PS   (R11)(AX*2), Y8
	VFMADD231PS Y8, Y4, Y3
	ADDQ $8, AX
	JMP  f16loop8

f16reduce:
	VEXTRACTF128 $1, Y0, X4
	VADDPS       X4, X0, X0
	VHADDPS      X0, X0, X0
	VHADDPS      X0, X0, X0
	VEXTRACTF128 $1, Y1, X4
	VADDPS       X4, X1, X1
	VHADDPS      X1, X1, X1
	VHADDPS      X1, X1, X1
	VEXTRACTF128 $1, Y2, X4
	VADDPS       X4, X2, X2
	VHADDPS      X2, X2, X2
	VHADDPS      X2, X2, X2
	VEXTRACTF128 $1, Y3, X4
	VADDPS       X4, X3, X3
	VHADDPS      X3, X3, X3
	VHADDPS      X3, X3, X3

f16tail:
	CMPQ AX, CX
	JGE  f16done
	VMOVSS      (SI)(AX*4), X4
	MOVWLZX     (R8)(AX*2), BX
	VMOVD       BX, X5
	VCVTPH2PS   X5, X5
	VFMADD231SS X5, X4, X0
	MOVWLZX     (R9)(AX*2), BX
	VMOVD       BX, X5
	VCVTPH2PS   X5, X5
	VFMADD231SS X5, X4, X1
	MOVWLZX     (R10)(AX*2), BX
	VMOVD       BX, X5
	VCVTPH2PS   X5, X5
	VFMADD231SS X5, X4, X2
	MOVWLZX     (R11)(AX*2), BX
	VMOVD       BX, X5
	VCVTPH2PS   X5, X5
	VFMADD231SS X5, X4, X3
	INCQ AX
	JMP  f16tail

f16done:
	VMOVSS X0, 0(DI)
	VMOVSS X1, 4(DI)
	VMOVSS X2, 8(DI)
	VMOVSS X3, 12(DI)
	VZEROUPPER
	RET

// func dot4BF16AVX2(x *float32, w0, w1, w2, w3 *byte, n int, out *[4]float32)
//
// dot4AVX2 over bfloat16 weight rows, widened in registers (zero-extended and shifted
// into the high half of each float32).
TEXT ·dot4BF16AVX2(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ w0+8(FP), R8
	MOVQ w1+16(FP), R9
	MOVQ w2+24(FP), R10
	MOVQ w3+32(FP), R11
	MOVQ n+40(FP), CX
	MOVQ out+48(FP), DI
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-8, DX

bf16loop8:
	CMPQ AX, DX
	JGE  bf16reduce
	VMOVUPS     (SI)(AX*4), Y4
	VPMOVZXWD   (R8)(AX*2), Y5
	VPSLLD      $16, Y5, Y5
	VFMADD231PS Y5, Y4, Y0
	VPMOVZXWD   (R9)(AX*2), Y6
	VPSLLD      $16, Y6, Y6
	VFMADD231PS Y6, Y4, Y1
	VPMOVZXWD   (R10)(AX*2), Y7
	VPSLLD      $16, Y7, Y7
	VFMADD231PS Y7, Y4, Y2
	VPMOVZXWD   (R11)(AX*2), Y8
	VPSLLD      $16, Y8, Y8
	VFMADD231PS Y8, Y4, Y3
	ADDQ $8, AX
	JMP  bf16loop8

bf16reduce:
	VEXTRACTF128 $1, Y0, X4
	VADDPS       X4, X0, X0
	VHADDPS      X0, X0, X0
	VHADDPS      X0, X0, X0
	VEXTRACTF128 $1, Y1, X4
	VADDPS       X4, X1, X1
	VHADDPS      X1, X1, X1
	VHADDPS      X1, X1, X1
	VEXTRACTF128 $1, Y2, X4
	VADDPS       X4, X2, X2
	VHADDPS      X2, X2, X2
	VHADDPS      X2, X2, X2
	VEXTRACTF128 $1, Y3, X4
	VADDPS       X4, X3, X3
	VHADDPS      X3, X3, X3
	VHADDPS      X3, X3, X3

bf16tail:
	CMPQ AX, CX
	JGE  bf16done
	VMOVSS      (SI)(AX*4), X4
	MOVWLZX     (R8)(AX*2), BX
	SHLL        $16, BX
	VMOVD       BX, X5
	VFMADD231SS X5, X4, X0
	MOVWLZX     (R9)(AX*2), BX
	SHLL        $16, BX
	VMOVD       BX, X5
	VFMADD231SS X5, X4, X1
	MOVWLZX     (R10)(AX*2), BX
	SHLL        $16, BX
	VMOVD       BX, X5
	VFMADD231SS X5, X4, X2
	MOVWLZX     (R11)(AX*2), BX
	SHLL        $16, BX
	VMOVD       BX, X5
	VFMADD231SS X5, X4, X3
	INCQ AX
	JMP  bf16tail

bf16done:
	VMOVSS X0, 0(DI)
	VMOVSS X1, 4(DI)
	VMOVSS X2, 8(DI)
	VMOVSS X3, 12(DI)
	VZEROUPPER
	RET

// func widenF16AVX2(src *byte, dst *float32, n int)
//
// dst[i] = the IEEE half at src[2i], for n values (n a multiple of 8 for the vector
// loop; the rest one by one).
TEXT ·widenF16AVX2(SB), NOSPLIT, $0-24
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-32, DX

wf16loop32:
	CMPQ AX, DX
	JGE  wf16loop1
	VCVTPH2PS (SI)(AX*2), Y0
	VCVTPH2PS 16(SI)(AX*2), Y1
	VCVTPH2PS 32(SI)(AX*2), Y2
	VCVTPH2PS 48(SI)(AX*2), Y3
	VMOVUPS   Y0, (DI)(AX*4)
	VMOVUPS   Y1, 32(DI)(AX*4)
	VMOVUPS   Y2, 64(DI)(AX*4)
	VMOVUPS   Y3, 96(DI)(AX*4)
	ADDQ $32, AX
	JMP  wf16loop32

wf16loop1:
	CMPQ AX, CX
	JGE  wf16done
	MOVWLZX   (SI)(AX*2), BX
	VMOVD     BX, X0
	VCVTPH2PS X0, X0
	VMOVSS    X0, (DI)(AX*4)
	INCQ AX
	JMP  wf16loop1

wf16done:
	VZEROUPPER
	RET

// func widenBF16AVX2(src *byte, dst *float32, n int)
//
// dst[i] = the bfloat16 at src[2i], for n values.
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-16, DX

wbf16loop16:
	CMPQ AX, DX
	JGE  wbf16loop1
	VPMOVZXWD (SI)(AX*2), Y0
	VPMOVZXWD 16(SI)(AX*2), Y1
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VMOVUPS   Y0, (DI)(AX*4)
	VMOVUPS   Y1, 32(DI)(AX*4)
	ADDQ $16, AX
	JMP  wbf16loop16

wbf16loop1:
	CMPQ AX, CX
	JGE  wbf16done
	MOVWLZX (SI)(AX*2), BX
	SHLL    $16, BX
	MOVL    BX, (DI)(AX*4)
	INCQ AX
	JMP  wbf16loop1

wbf16done:
	VZEROUPPER
	RET

// func dot1AVX2(x, w *float32, n int) float32
//
// Σ x[k]·w[k] computed exactly as one output of dot4AVX2: eight FMA lanes over n&^7
// elements, reduced in the same order, then the tail one element at a time.
TEXT ·dot1AVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), R8
	MOVQ n+16(FP), CX
	VXORPS Y0, Y0, Y0
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-8, DX

d1loop8:
	CMPQ AX, DX
	JGE  d1reduce
	VMOVUPS     (SI)(AX*4), Y4
	VFMADD231PS (R8)(AX*4), Y4, Y0
	ADDQ $8, AX
	JMP  d1loop8

d1reduce:
	VEXTRACTF128 $1, Y0, X4
	VADDPS       X4, X0, X0
	VHADDPS      X0, X0, X0
	VHADDPS      X0, X0, X0

d1tail:
	CMPQ AX, CX
	JGE  d1done
	VMOVSS      (SI)(AX*4), X4
	VFMADD231SS (R8)(AX*4), X4, X0
	INCQ AX
	JMP  d1tail

d1done:
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func axpyAVX2(y *float32, a float32, x *float32, n int)
//
// y[i] += a·x[i], the product rounded before the add (as the Go loop computes it).
TEXT ·axpyAVX2(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), DI
	VBROADCASTSS a+8(FP), Y1
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-8, DX

axloop8:
	CMPQ AX, DX
	JGE  axtail
	VMULPS  (SI)(AX*4), Y1, Y2
	VADDPS  (DI)(AX*4), Y2, Y2
	VMOVUPS Y2, (DI)(AX*4)
	ADDQ $8, AX
	JMP  axloop8

axtail:
	CMPQ AX, CX
	JGE  axdone
	VMULSS (SI)(AX*4), X1, X2
	VADDSS (DI)(AX*4), X2, X2
	VMOVSS X2, (DI)(AX*4)
	INCQ AX
	JMP  axtail

axdone:
	VZEROUPPER
	RET

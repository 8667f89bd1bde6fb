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

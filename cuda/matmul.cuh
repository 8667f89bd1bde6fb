// matmul.cuh — GEMMs through cuBLAS: T inputs, fp32 accumulation and fp32 output. The
// projections of the Blas path run through LtGemms (blaslt.h), which falls back to the
// same cublasGemmEx call.
#pragma once
#include "common.cuh"

namespace gollm {

template <typename T> constexpr cudaDataType_t cuda_type();
template <> constexpr cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }
template <> constexpr cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }

// matmul_xw: y[n][out] (fp32) = x[n][in] (T) · w[in][out] (T), all row-major — the
// checkpoint's Conv1D layout. In cuBLAS's column-major terms this is yᵀ = wᵀ·xᵀ with no
// transposes: m = out, n = n, k = in.
template <typename T>
void matmul_xw(cublasHandle_t h, const T* x, const T* w, float* y, int n, int in, int out) {
  if (n == 0) return;
  const float one = 1.f, zero = 0.f;
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, out, n, in, &one, w, cuda_type<T>(),
                            out, x, cuda_type<T>(), in, &zero, y, CUDA_R_32F, out,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// matmul_xwt: y[n][ldy] (fp32; columns 0..out-1 written; ldy = out unless given) = x[n][in]
// (T) · w[out][in]ᵀ (T), row-major — the projections and the LM head: m = out, n = n,
// k = in, A transposed.
template <typename T>
void matmul_xwt(cublasHandle_t h, const T* x, const T* w, float* y, int n, int in, int out,
                int ldy = 0) {
  if (n == 0) return;
  const float one = 1.f, zero = 0.f;
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, cuda_type<T>(),
                            in, x, cuda_type<T>(), in, &zero, y, CUDA_R_32F, ldy > 0 ? ldy : out,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace gollm

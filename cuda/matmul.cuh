// matmul.cuh — cuBLAS's data type of T, for the GEMMs of the Blas path (blaslt.h: cuBLASLt,
// or cublasGemmEx as its fallback).
#pragma once
#include "common.cuh"

namespace gollm {

template <typename T> constexpr cudaDataType_t cuda_type();
template <> constexpr cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }
template <> constexpr cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }

}  // namespace gollm

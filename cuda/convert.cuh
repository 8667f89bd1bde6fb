// convert.cuh — checkpoint tensors (F32, F16 or BF16, as stored) to the engine's types.
#pragma once
#include "common.cuh"

namespace gollm {

__device__ __forceinline__ float load_any(const void* src, int dtype, int64_t i) {
  switch (dtype) {
    case GOLLM_DTYPE_F16: return __half2float(static_cast<const __half*>(src)[i]);
    case GOLLM_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(src)[i]);
    default: return static_cast<const float*>(src)[i];
  }
}

// convert_kernel: dst[i] = (D) src[i] for n elements; src holds elements of type dtype.
// Conversions go through fp32, which holds F16 and BF16 exactly.
template <typename D>
__global__ void convert_kernel(const void* __restrict__ src, int dtype, D* __restrict__ dst,
                               int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = from_f32<D>(load_any(src, dtype, i));
}

template <typename D>
void convert(const void* src, int dtype, D* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  int blocks = (int)std::min<int64_t>((n + 255) / 256, 8192);
  convert_kernel<D><<<blocks, 256, 0, stream>>>(src, dtype, dst, n);
  LAUNCH_CHECK("convert_kernel");
}

}  // namespace gollm

namespace gollm {

// convert_transpose_kernel: dst[c][r] = (D) src[r][c] for src [rows][cols] of type dtype,
// through 32×32 tiles in shared memory so that reads and writes are both coalesced.
// Block (32, 8); grid (ceil(cols/32), ceil(rows/32)).
template <typename D>
__global__ void convert_transpose_kernel(const void* __restrict__ src, int dtype,
                                         D* __restrict__ dst, int rows, int cols) {
  __shared__ float tile[32][33];
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  for (int k = threadIdx.y; k < 32; k += 8) {
    int r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = load_any(src, dtype, (int64_t)r * cols + c);
  }
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += 8) {
    int c = c0 + k, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[(int64_t)c * rows + r] = from_f32<D>(tile[threadIdx.x][k]);
  }
}

template <typename D>
void convert_transpose(const void* src, int dtype, D* dst, int rows, int cols,
                       cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  dim3 grid(ceil_div(cols, 32), ceil_div(rows, 32)), block(32, 8);
  convert_transpose_kernel<D><<<grid, block, 0, stream>>>(src, dtype, dst, rows, cols);
  LAUNCH_CHECK("convert_transpose_kernel");
}

}  // namespace gollm

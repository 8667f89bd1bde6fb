// layernorm.cuh — the norms (LayerNorm, RMSNorm) fused with the residual add.
#pragma once
#include "common.cuh"

namespace gollm {

// layernorm_row normalises the fp32 row in shared memory (hidden values) into out, with
// gamma [hidden] fp32 and beta [hidden] fp32 or null: LayerNorm, out = (x - mean) /
// sqrt(var + eps) * gamma + beta with the variance biased as torch's; or, when rms,
// RMSNorm, out = x / sqrt(mean(x²) + eps) * gamma. Called by every thread of the block.
template <typename T>
__device__ __forceinline__ void layernorm_row(const float* row, T* __restrict__ out,
                                              const float* __restrict__ gamma,
                                              const float* __restrict__ beta, int hidden,
                                              float eps, bool rms) {
  __shared__ float red[32];
  __syncthreads();
  float mean = 0.f;
  if (!rms) {
    float s = 0.f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) s += row[c];
    mean = block_sum(s, red) / hidden;
  }
  float v = 0.f;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float d = row[c] - mean;
    v += d * d;
  }
  float rstd = rsqrtf(block_sum(v, red) / hidden + eps);
  for (int c = threadIdx.x; c < hidden; c += blockDim.x)
    out[c] = from_f32<T>((row[c] - mean) * rstd * gamma[c] + (beta ? beta[c] : 0.f));
}

// residual_layernorm_kernel: one block per row r.
//   h:    [n][hidden] fp32 residual stream; h += a + bias
//   a:    [n][hidden] fp32, a projection's output (before its bias)
//   bias: [hidden] fp32, or null
//   xn:   [n][hidden] T = norm(h) with gamma [hidden] fp32 and beta [hidden] fp32 or null
//         (LayerNorm, or RMSNorm when rms)
// Dynamic shared memory: hidden floats.
template <typename T>
__global__ void residual_layernorm_kernel(float* __restrict__ h, const float* __restrict__ a,
                                          const float* __restrict__ bias, T* __restrict__ xn,
                                          const float* __restrict__ gamma,
                                          const float* __restrict__ beta, int hidden,
                                          float eps, bool rms) {
  extern __shared__ float row[];
  griddep_launch();
  griddep_wait();
  int64_t off = (int64_t)blockIdx.x * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float v = h[off + c] + a[off + c] + (bias ? bias[c] : 0.f);
    row[c] = v;
    h[off + c] = v;
  }
  layernorm_row(row, xn + off, gamma, beta, hidden, eps, rms);
}

// residual_layernorm4_kernel: the same for hidden % 4 == 0 up to 4 * 4 * 256, the row in
// registers (up to four float4 a thread, all loads issued together) instead of shared
// memory. One block of 256 threads per row.
constexpr int kLn4Max = 4;
template <typename T>
__global__ void __launch_bounds__(256) residual_layernorm4_kernel(
    float* __restrict__ h, const float* __restrict__ a, const float* __restrict__ bias,
    T* __restrict__ xn, const float* __restrict__ gamma, const float* __restrict__ beta,
    int hidden, float eps, bool rms) {
  __shared__ float red[32];
  griddep_launch();
  const int h4 = hidden / 4;
  const int64_t off = (int64_t)blockIdx.x * hidden;
  float4 bv[kLn4Max];
#pragma unroll
  for (int k = 0; k < kLn4Max; k++) {
    const int c = threadIdx.x + k * 256;
    if (c < h4) bv[k] = bias ? reinterpret_cast<const float4*>(bias)[c] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  griddep_wait();
  float4 x[kLn4Max];
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kLn4Max; k++) {
    const int c = threadIdx.x + k * 256;
    if (c < h4) {
      const float4 hv = reinterpret_cast<const float4*>(h + off)[c];
      const float4 av = reinterpret_cast<const float4*>(a + off)[c];
      x[k] = make_float4(hv.x + av.x + bv[k].x, hv.y + av.y + bv[k].y, hv.z + av.z + bv[k].z,
                         hv.w + av.w + bv[k].w);
      reinterpret_cast<float4*>(h + off)[c] = x[k];
      s += (x[k].x + x[k].y) + (x[k].z + x[k].w);
    }
  }
  const float mean = rms ? 0.f : block_sum(s, red) / hidden;
  float v = 0.f;
#pragma unroll
  for (int k = 0; k < kLn4Max; k++) {
    const int c = threadIdx.x + k * 256;
    if (c < h4) {
      const float dx = x[k].x - mean, dy = x[k].y - mean, dz = x[k].z - mean, dw = x[k].w - mean;
      v += (dx * dx + dy * dy) + (dz * dz + dw * dw);
    }
  }
  const float rstd = rsqrtf(block_sum(v, red) / hidden + eps);
#pragma unroll
  for (int k = 0; k < kLn4Max; k++) {
    const int c = threadIdx.x + k * 256;
    if (c < h4) {
      const float4 g = reinterpret_cast<const float4*>(gamma)[c];
      const float4 b = beta ? reinterpret_cast<const float4*>(beta)[c] : make_float4(0.f, 0.f, 0.f, 0.f);
      store4(xn + off + 4 * c, (x[k].x - mean) * rstd * g.x + b.x, (x[k].y - mean) * rstd * g.y + b.y,
             (x[k].z - mean) * rstd * g.z + b.z, (x[k].w - mean) * rstd * g.w + b.w);
    }
  }
}

template <typename T>
void residual_layernorm(float* h, const float* a, const float* bias, T* xn, const float* gamma,
                        const float* beta, int n, int hidden, float eps, bool rms,
                        Stream stream) {
  if (n == 0) return;
  if (hidden % 4 == 0 && hidden <= 4 * kLn4Max * 256) {
    launch("residual_layernorm4_kernel", residual_layernorm4_kernel<T>, n, 256, 0, stream, h, a,
           bias, xn, gamma, beta, hidden, eps, rms);
    return;
  }
  launch("residual_layernorm_kernel", residual_layernorm_kernel<T>, n, 256,
         hidden * sizeof(float), stream, h, a, bias, xn, gamma, beta, hidden, eps, rms);
}

// norm_rows_kernel: one block per row, xn = norm(h) — the norm where no residual add
// precedes it (tensor parallelism's embedding, normed after its all-reduce).
//   h: [n][hidden] fp32; xn: [n][hidden] T; gamma, beta as residual_layernorm_kernel's
// Dynamic shared memory: hidden floats.
template <typename T>
__global__ void norm_rows_kernel(const float* __restrict__ h, T* __restrict__ xn,
                                 const float* __restrict__ gamma, const float* __restrict__ beta,
                                 int hidden, float eps, bool rms) {
  extern __shared__ float row[];
  griddep_launch();
  griddep_wait();
  const int64_t off = (int64_t)blockIdx.x * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) row[c] = h[off + c];
  layernorm_row(row, xn + off, gamma, beta, hidden, eps, rms);
}

template <typename T>
void norm_rows(const float* h, T* xn, const float* gamma, const float* beta, int n, int hidden,
               float eps, bool rms, Stream stream) {
  if (n == 0) return;
  launch("norm_rows_kernel", norm_rows_kernel<T>, n, 256, hidden * sizeof(float), stream, h, xn,
         gamma, beta, hidden, eps, rms);
}

// gather_rows_kernel copies rows src[idx[i]] to dst[i]: src, dst [*][width] T.
template <typename T>
__global__ void gather_rows_kernel(const T* __restrict__ src, const int32_t* __restrict__ idx,
                                   T* __restrict__ dst, int width) {
  griddep_launch();
  griddep_wait();
  const T* s = src + (int64_t)idx[blockIdx.x] * width;
  T* d = dst + (int64_t)blockIdx.x * width;
  for (int c = threadIdx.x; c < width; c += blockDim.x) d[c] = s[c];
}

template <typename T>
void gather_rows(const T* src, const int32_t* idx, T* dst, int n, int width, Stream stream) {
  if (n == 0) return;
  launch("gather_rows_kernel", gather_rows_kernel<T>, n, 256, 0, stream, src, idx, dst, width);
}

// unpad_rows_kernel copies n rows of width floats from src [n][ld] to dst [n][width]: the
// LM head's logits, which cuBLAS writes with a row stride that keeps every row 16-byte
// aligned (lm_head_ld). Grid (ceil(width / 1024), n), 256 threads, 4 columns a thread.
__global__ void unpad_rows_kernel(const float* __restrict__ src, float* __restrict__ dst, int width,
                                  int ld) {
  griddep_launch();
  griddep_wait();
  const float* s = src + (int64_t)blockIdx.y * ld;
  float* d = dst + (int64_t)blockIdx.y * width;
  const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (c0 + 3 < width) {
    const float4 v = *reinterpret_cast<const float4*>(s + c0);
    d[c0] = v.x, d[c0 + 1] = v.y, d[c0 + 2] = v.z, d[c0 + 3] = v.w;
  } else {
    for (int c = c0; c < width; c++) d[c] = s[c];
  }
}

inline void unpad_rows(const float* src, float* dst, int n, int width, int ld, Stream stream) {
  if (n == 0) return;
  launch("unpad_rows_kernel", unpad_rows_kernel, dim3((width + 1023) / 1024, n), 256, 0, stream,
         src, dst, width, ld);
}

}  // namespace gollm

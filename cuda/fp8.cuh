// fp8.cuh — projections over FP8 weights: y [n][out] fp32 = x [n][in] (T) · Wᵀ, W stored
// float8_e4m3fn [out][in] (row stride in bytes, in a multiple of 16) with fp32 scales
// S [out][G], G = ceil(in / 128): weight (o, k) is W[o][k] · S[o][k / 128]. Every
// checkpoint's scales (one a tensor, a channel, or a block of 128·i × 128·j) are laid out
// so by the arena (weights.cu). Weight-only: the activations stay in T, the products and
// sums in fp32, each 128-column group's sum scaled once.
//
//   fp8_gemv_kernel  n ≤ 8 rows (decode): a warp two output rows, 16 weights a lane a
//                    load (16 bytes), decoded in registers; memory-bound, so half fp16's
//                    bytes is about half its time.
//   fp8_mma_kernel   more rows: tiles of 64 rows × 32 outputs, 128 columns a pass through
//                    shared memory (the next pass's loads in flight meanwhile), m16n8k16
//                    tensor-core products (the weights widened to T, exact: every e4m3
//                    value is a T value), each pass's sum scaled. Where the tiles are too
//                    few for the GPU (a decode batch of 64 rows) the column groups split
//                    over blockIdx.z into partial sums that fp8_sum_splits_kernel adds in
//                    order.
#pragma once

#include <cuda_fp8.h>

#include "common.cuh"
#include "sizes.h"

namespace gollm {

constexpr int kFp8GemvRows = 8;    // the most rows fp8_gemv_kernel takes
constexpr int kFp8GemvWarps = 8;   // warps a gemv block
constexpr int kFp8TileM = 64, kFp8TileN = 32;
constexpr int kFp8MaxSplits = 8;   // fp8_mma_kernel's most column-group splits

// fp8x2_to_float2 decodes two e4m3 bytes (the lower one first).
__device__ __forceinline__ float2 fp8x2_to_float2(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return __half22float2(__half2(h));
}

// fp8x2_to_t2 widens two e4m3 bytes to a pair of T in one 32-bit register, the lower
// byte in the lower half, as the mma fragments take them.
template <typename T>
__device__ __forceinline__ uint32_t fp8x2_to_t2(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  if constexpr (std::is_same<T, __half>::value) {
    uint32_t r;
    memcpy(&r, &h, 4);
    return r;
  } else {
    const float2 f = __half22float2(__half2(h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    uint32_t r;
    memcpy(&r, &b, 4);
    return r;
  }
}

// load16 widens x[0..16) to fp32.
template <typename T>
__device__ __forceinline__ void load16(float (&xf)[16], const T* __restrict__ x) {
  const uint4 u0 = __ldg(reinterpret_cast<const uint4*>(x));
  const uint4 u1 = __ldg(reinterpret_cast<const uint4*>(x) + 1);
  const T* a = reinterpret_cast<const T*>(&u0);
  const T* b = reinterpret_cast<const T*>(&u1);
#pragma unroll
  for (int i = 0; i < 8; i++) xf[i] = to_f32(a[i]), xf[8 + i] = to_f32(b[i]);
}

// decode16 widens 16 e4m3 bytes to fp32.
__device__ __forceinline__ void decode16(float (&wf)[16], uint4 v) {
  const uint16_t* p = reinterpret_cast<const uint16_t*>(&v);
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const float2 f = fp8x2_to_float2(p[i]);
    wf[2 * i] = f.x, wf[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ float dot16(const float (&a)[16], const float (&b)[16]) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 16; i++) s = fmaf(a[i], b[i], s);
  return s;
}

constexpr int kFp8GemvOuts = 2;  // output rows a warp of fp8_gemv_kernel

// fp8_gemv_kernel: grid ceil(out / 16), block 256, R ≥ n rows of x: warp i of a block
// computes outputs 2i, 2i + 1 of its 16 (kFp8GemvOuts a warp, so that each piece of x is
// loaded and widened once for two weight rows). Each lane reads 16 consecutive weights of
// both rows a load (a 128-column group holds eight lanes'), four loads a row in flight
// (128 bytes a lane), the first before the wait for the kernel before (the weights do not
// depend on it); weights are streamed past L1 (x stays there). The warp's sums meet by
// shuffles.
template <typename T, int R>
__global__ void __launch_bounds__(kFp8GemvWarps * 32)
    fp8_gemv_kernel(const T* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ s,
                    float* __restrict__ y, int n, int in, int out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int o0 = (blockIdx.x * kFp8GemvWarps + warp) * kFp8GemvOuts;
  if (o0 >= out) return;
  const bool two = o0 + 1 < out;  // the second row exists (else the first is read twice)
  const int G = (in + kFp8Group - 1) / kFp8Group;
  const uint8_t* w0 = w + (size_t)o0 * in;
  const uint8_t* w1 = two ? w0 + in : w0;
  const float* s0 = s + (size_t)o0 * G;
  const float* s1 = two ? s0 + G : s0;
  constexpr int kStride = 32 * 16;
  int k = lane * 16;
  uint4 wv[kFp8GemvOuts][4];
  auto fetch = [&]() {
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const bool in_row = k + u * kStride < in;
      wv[0][u] = in_row ? __ldcs(reinterpret_cast<const uint4*>(w0 + k + u * kStride)) : make_uint4(0, 0, 0, 0);
      wv[1][u] = in_row ? __ldcs(reinterpret_cast<const uint4*>(w1 + k + u * kStride)) : make_uint4(0, 0, 0, 0);
    }
  };
  fetch();
  griddep_wait();
  float acc[kFp8GemvOuts][R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[0][r] = 0.f, acc[1][r] = 0.f;
  while (k < in) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int kc = k + u * kStride;
      if (kc >= in) break;
      const float sc0 = __ldg(s0 + kc / kFp8Group), sc1 = __ldg(s1 + kc / kFp8Group);
      float wf0[16], wf1[16];
      decode16(wf0, wv[0][u]);
      decode16(wf1, wv[1][u]);
#pragma unroll
      for (int r = 0; r < R; r++) {
        if (r >= n) break;
        float xf[16];
        load16<T>(xf, x + (size_t)r * in + kc);
        acc[0][r] = fmaf(dot16(wf0, xf), sc0, acc[0][r]);
        acc[1][r] = fmaf(dot16(wf1, xf), sc1, acc[1][r]);
      }
    }
    k += 4 * kStride;
    if (k < in) fetch();
  }
#pragma unroll
  for (int j = 0; j < kFp8GemvOuts; j++)
#pragma unroll
    for (int r = 0; r < R; r++) {
      float v = acc[j][r];
#pragma unroll
      for (int d = 16; d > 0; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
      if (lane == 0 && r < n && (j == 0 || two)) y[(size_t)r * out + o0 + j] = v;
    }
}

// fp8_mma_kernel: grid (ceil(out / 32), ceil(n / 64)), block 128: warp i computes rows
// 16i…16i + 15 of the tile against its 32 outputs (four m16n8 tiles). Rows past n and
// columns past in are zero in shared memory; outputs past out are not written.
template <typename T>
__global__ void __launch_bounds__(128)
    fp8_mma_kernel(const T* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ s,
                   float* __restrict__ y, int n, int in, int out, int groups_per_split) {
  // Rows padded by 16 bytes: a warp's fragment loads meet distinct banks.
  __shared__ __align__(16) T xs[kFp8TileM][kFp8Group + 8];
  __shared__ __align__(16) uint8_t wsm[kFp8TileN][kFp8Group + 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int m0 = blockIdx.y * kFp8TileM, o0 = blockIdx.x * kFp8TileN;
  const int G = (in + kFp8Group - 1) / kFp8Group;
  // Split z of the column groups (blockIdx.z; one split: all of them) writes its own
  // [n][out] slice of y.
  const int g0 = blockIdx.z * groups_per_split, g1 = min(G, g0 + groups_per_split);
  y += (size_t)blockIdx.z * n * out;
  float acc[4][4] = {};
  griddep_wait();
  // The next pass's tiles are loaded into registers while this pass computes from shared
  // memory: 8 16-byte pieces of x and 2 of w a thread.
  constexpr int kXPieces = kFp8TileM * kFp8Group / 8 / 128, kWPieces = kFp8TileN * kFp8Group / 16 / 128;
  uint4 xr[kXPieces], wr[kWPieces];
  auto fetch = [&](int kb) {
    const int k0 = kb * kFp8Group;
#pragma unroll
    for (int j = 0; j < kXPieces; j++) {
      const int i = threadIdx.x + j * 128, r = i / (kFp8Group / 8), c = (i % (kFp8Group / 8)) * 8;
      xr[j] = m0 + r < n && k0 + c < in ? __ldg(reinterpret_cast<const uint4*>(x + (size_t)(m0 + r) * in + k0 + c))
                                        : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kWPieces; j++) {
      const int i = threadIdx.x + j * 128, r = i / (kFp8Group / 16), c = (i % (kFp8Group / 16)) * 16;
      wr[j] = o0 + r < out && k0 + c < in ? __ldg(reinterpret_cast<const uint4*>(w + (size_t)(o0 + r) * in + k0 + c))
                                          : make_uint4(0, 0, 0, 0);
    }
  };
  if (g0 < g1) fetch(g0);
  for (int kb = g0; kb < g1; kb++) {
#pragma unroll
    for (int j = 0; j < kXPieces; j++) {
      const int i = threadIdx.x + j * 128;
      *reinterpret_cast<uint4*>(&xs[i / (kFp8Group / 8)][(i % (kFp8Group / 8)) * 8]) = xr[j];
    }
#pragma unroll
    for (int j = 0; j < kWPieces; j++) {
      const int i = threadIdx.x + j * 128;
      *reinterpret_cast<uint4*>(&wsm[i / (kFp8Group / 16)][(i % (kFp8Group / 16)) * 16]) = wr[j];
    }
    __syncthreads();
    if (kb + 1 < g1) fetch(kb + 1);
    float part[4][4] = {};
#pragma unroll
    for (int kk = 0; kk < kFp8Group; kk += 16) {
      const int ar = warp * 16 + g, ac = kk + 2 * t;
      const uint32_t a0 = *reinterpret_cast<const uint32_t*>(&xs[ar][ac]);
      const uint32_t a1 = *reinterpret_cast<const uint32_t*>(&xs[ar + 8][ac]);
      const uint32_t a2 = *reinterpret_cast<const uint32_t*>(&xs[ar][ac + 8]);
      const uint32_t a3 = *reinterpret_cast<const uint32_t*>(&xs[ar + 8][ac + 8]);
#pragma unroll
      for (int nt = 0; nt < 4; nt++) {
        const uint8_t* bp = &wsm[nt * 8 + g][ac];
        const uint32_t b0 = fp8x2_to_t2<T>(*reinterpret_cast<const uint16_t*>(bp));
        const uint32_t b1 = fp8x2_to_t2<T>(*reinterpret_cast<const uint16_t*>(bp + 8));
        mma_16816<T>(part[nt], a0, a1, a2, a3, b0, b1);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
      for (int j = 0; j < 2; j++) {
        const int o = o0 + nt * 8 + 2 * t + j;
        const float sc = o < out ? __ldg(s + (size_t)o * G + kb) : 0.f;
        acc[nt][j] = fmaf(part[nt][j], sc, acc[nt][j]);
        acc[nt][j + 2] = fmaf(part[nt][j + 2], sc, acc[nt][j + 2]);
      }
    __syncthreads();
  }
  const int r0 = m0 + warp * 16 + g;
#pragma unroll
  for (int nt = 0; nt < 4; nt++)
#pragma unroll
    for (int j = 0; j < 2; j++) {
      const int o = o0 + nt * 8 + 2 * t + j;
      if (o >= out) continue;
      if (r0 < n) y[(size_t)r0 * out + o] = acc[nt][j];
      if (r0 + 8 < n) y[(size_t)(r0 + 8) * out + o] = acc[nt][j + 2];
    }
}

// fp8_sum_splits_kernel: y [n·out] = Σ_z part[z][n·out], the splits in order (the same
// sum whatever the schedule).
__global__ void fp8_sum_splits_kernel(const float* __restrict__ part, float* __restrict__ y, size_t count,
                                      int splits) {
  griddep_wait();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
    float v = 0.f;
    for (int z = 0; z < splits; z++) v += part[z * count + i];
    y[i] = v;
  }
}

// fp8_splits is how many column-group splits fp8_mma_kernel takes for a grid of tiles
// blocks over G groups: enough blocks for two a multiprocessor, each split four groups
// at the least, within the partials' room (part_floats) for n × out each.
inline int fp8_splits(int tiles, int G, int sms, size_t n_out, size_t part_floats) {
  int z = 1;
  while (z < kFp8MaxSplits && tiles * z < 2 * sms && G / (2 * z) >= 4 && (size_t)(2 * z) * n_out <= part_floats) z *= 2;
  return z;
}

// fp8_proj launches the projection of n rows (the file's comment); part (part_floats
// floats) takes the partial sums of a split launch.
template <typename T>
void fp8_proj(const T* x, const uint8_t* w, const float* s, float* y, int n, int in, int out, int sms,
              float* part, size_t part_floats, Stream st) {
  if (n <= 0) return;
  if (n <= kFp8GemvRows) {
    const int per = kFp8GemvWarps * kFp8GemvOuts;
    const int blocks = (out + per - 1) / per;
    const int threads = kFp8GemvWarps * 32;
    if (n == 1)
      launch("fp8_gemv_kernel", fp8_gemv_kernel<T, 1>, blocks, threads, 0, st, x, w, s, y, n, in, out);
    else if (n == 2)
      launch("fp8_gemv_kernel", fp8_gemv_kernel<T, 2>, blocks, threads, 0, st, x, w, s, y, n, in, out);
    else if (n <= 4)
      launch("fp8_gemv_kernel", fp8_gemv_kernel<T, 4>, blocks, threads, 0, st, x, w, s, y, n, in, out);
    else
      launch("fp8_gemv_kernel", fp8_gemv_kernel<T, 8>, blocks, threads, 0, st, x, w, s, y, n, in, out);
    return;
  }
  const int G = (in + kFp8Group - 1) / kFp8Group;
  const int gx = (out + kFp8TileN - 1) / kFp8TileN, gy = (n + kFp8TileM - 1) / kFp8TileM;
  const size_t n_out = (size_t)n * out;
  const int z = part ? fp8_splits(gx * gy, G, sms, n_out, part_floats) : 1;
  const int per = (G + z - 1) / z;
  if (z == 1) {
    launch("fp8_mma_kernel", fp8_mma_kernel<T>, dim3(gx, gy, 1), 128, 0, st, x, w, s, y, n, in, out, per);
    return;
  }
  launch("fp8_mma_kernel", fp8_mma_kernel<T>, dim3(gx, gy, z), 128, 0, st, x, w, s, part, n, in, out, per);
  const int blocks = (int)std::min<size_t>((n_out + 255) / 256, (size_t)sms * 8);
  launch("fp8_sum_splits_kernel", fp8_sum_splits_kernel, blocks, 256, 0, st, (const float*)part, y, n_out, z);
}

}  // namespace gollm

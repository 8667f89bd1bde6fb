// fp8lt.cuh — many-row FP8 projections on FP8 tensor cores through cuBLASLt's scaled FP8
// GEMMs (cuBLASLt ≥ 12.9, Hopper): y [m][out] fp32 = dequant(xq) · dequant(W)ᵀ, where
//   W   float8_e4m3fn [out][in] (the arena's, fp8.cuh) with its scales, in one of three
//       recipes (Fp8Lt::Mode, chosen a weight at set-up by fp8lt_blocks):
//       kRows    a scale a row (per-channel and per-tensor checkpoints, and quantization
//                fp8 at load): the activations get a scale a row too, and both apply
//                after the whole sum (OUTER_VEC_32F), the fastest;
//       kBlocks  a scale a 128×128 block (transformers' fine-grained FP8);
//       kGroups  rows within a block that differ along the row too (VEC128_32F);
//   xq  float8_e4m3fn [m][in], x quantized a row at a time — for kRows with the row's
//       amax / 448 (fp8_quant_row_kernel), else in 1×128 groups along in
//       (fp8_quant_rows_kernel), each group's amax / 448 (dynamic, fp32).
// In cuBLASLt's column-major terms the product is D [out × m] = Wᵀ·x: A = W (transposed,
// lda = in), B = xq (lda = in), D fp32 (ld = out), or, where this cuBLASLt has no fp32 D
// for the recipe, bf16 into a buffer that fp8_widen_kernel widens into y (the Blas path's
// epilogues read fp32).
// Scale layouts (cuBLASLt's, as PyTorch's _scaled_mm checks them):
//   kRows: A's [out], B's [m].
//   kBlocks: A's blocks [ceil(out/128)][round_up(ceil(in/128), 4)]: block (ob, kb) at
//     ob · round_up(Kb, 4) + kb — built at set-up from the arena's per-row scales;
//   kGroups: A's groups [ceil(in/128)][out], (o, kb) at kb · out + o, the arena's scales
//     transposed.
//   B's groups (kBlocks, kGroups) [ceil(in/128)][m]: group (r, kb) at kb · m + r.
// cuBLAS's docs ("128-element 1D and 128x128 2D block scaling", "outer vector scaling")
// allow D in fp32, bf16 or fp16; the heuristic needs both scale pointers set before it is
// asked (bench/fp8probe checks all this on a GPU, and times the recipes).
// Unlike fp8.cuh's weight-only kernels, this path rounds the activations to e4m3 (W8A8, as
// transformers' fine-grained FP8, vLLM and TensorRT-LLM do): every step of more than
// kFp8GemvRows rows whose shape has an algorithm takes it, whatever is faster, so that
// the numerics of a shape never hang on a timing. Each shape (rows m of gemm_rows' set,
// in, out) gets its algorithm at the warm-up: the heuristic's first candidates timed, the
// fastest kept, so that a graph capture meets a fixed algorithm and the engine's fixed
// workspace. Shapes the
// library has no algorithm for (an older cuBLASLt, another architecture, widths that are
// not multiples of 16) keep fp8.cuh's kernels; the first such shape is reported once on
// stderr.
#pragma once

#include <cublasLt.h>
#include <cuda_fp8.h>

#include <cstdio>
#include <map>
#include <tuple>
#include <vector>

#include "activation.cuh"
#include "common.cuh"
#include "fp8.cuh"
#include "internal.h"
#include "matmul.cuh"
#include "sizes.h"

namespace gollm {

constexpr float kFp8Max = 448.f;  // the largest finite e4m3 value
constexpr int kFp8LtCandidates = 4;  // heuristic candidates timed a shape

// fp8_store8 writes the e4m3 codes of v · inv (nearest, saturating) to dst (8 bytes,
// 8-byte aligned): both quantizations' codes come from it.
__device__ __forceinline__ void fp8_store8(const float (&v)[8], float inv, uint8_t* __restrict__ dst) {
  uint32_t w[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(v[4 * h] * inv, v[4 * h + 1] * inv), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(v[4 * h + 2] * inv, v[4 * h + 3] * inv), __NV_SATFINITE, __NV_E4M3);
    w[h] = (uint32_t)lo | ((uint32_t)hi << 16);
  }
  *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
}

// Both quantizing kernels give a warp two 128-column groups of a row: lane l takes
// columns k = 256·p + 8·l … + 7 of group pair p, lanes 0–15 group 2p, 16–31 group 2p + 1
// (16-byte loads of T; in is a multiple of 16, so a lane's 8 columns are all in the row or
// all past it). Grid ceil(m · ceil(G / 2) / 8) blocks of 256.
// fp8_quant_group8 quantizes a lane's 8 values v (zeros past the row's end or n) of row r:
// xq[r][k…k + 7] = v / s, and, from the group's first lane, s[g][m-major r] = amax / 448 of
// the group (1 where it is all zeros); g past G writes nothing.
__device__ __forceinline__ void fp8_quant_group8(const float (&v)[8], uint8_t* __restrict__ xq, float* __restrict__ s,
                                                 int r, int g, int G, int k, int m, int in, int lane) {
  float a = 0.f;
#pragma unroll
  for (int i = 0; i < 8; i++) a = fmaxf(a, fabsf(v[i]));
#pragma unroll
  for (int d = 8; d > 0; d /= 2) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, d));  // within the 16 lanes
  const float sc = a > 0.f ? a / kFp8Max : 1.f;
  const float inv = a > 0.f ? kFp8Max / a : 0.f;
  if (k < in) fp8_store8(v, inv, xq + (size_t)r * in + k);
  if ((lane & 15) == 0 && g < G) s[(size_t)g * m + r] = sc;
}

// fp8_widen8 widens 8 T (16 bytes) to fp32.
template <typename T>
__device__ __forceinline__ void fp8_widen8(const uint4& u, float (&v)[8]) {
  const T* p = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; i++) v[i] = to_f32(p[i]);
}

// fp8_quant_rows_kernel: xq [m][in] e4m3 = x / s, s [G][m] = amax / 448 of each 1×128
// group (1 where the group is all zeros), x [n][in] T. Rows n…m − 1 (gemm_rows' padding) are
// written as zeros, so that whatever the input buffer holds there cannot make the
// product's padding rows Inf or NaN. Layout: the comment above fp8_quant_group8.
// fp8_quant_groups is both grouped kernels' body: the thread's lane of its warp's
// (row, group pair), its 8 values from load(r, k, v) (rows under n, columns under in; zeros
// elsewhere), quantized by fp8_quant_group8.
template <typename Load>
__device__ __forceinline__ void fp8_quant_groups(Load load, uint8_t* __restrict__ xq, float* __restrict__ s, int n,
                                                 int m, int in) {
  const int G = (in + kFp8Group - 1) / kFp8Group, G2 = (G + 1) / 2;
  const int wid = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
  if (wid >= m * G2) return;
  const int r = wid / G2, gp = wid % G2;
  const int k = 2 * kFp8Group * gp + 8 * lane;
  float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (r < n && k < in) load(r, k, v);
  fp8_quant_group8(v, xq, s, r, 2 * gp + (lane >> 4), G, k, m, in, lane);
}

template <typename T>
__global__ void __launch_bounds__(256)
    fp8_quant_rows_kernel(const T* __restrict__ x, uint8_t* __restrict__ xq, float* __restrict__ s, int n,
                          int m, int in) {
  griddep_wait();
  fp8_quant_groups(
      [&](int r, int k, float(&v)[8]) { fp8_widen8<T>(*reinterpret_cast<const uint4*>(x + (size_t)r * in + k), v); },
      xq, s, n, m, in);
}

// fp8_gated8 computes gated_act_kernel's y = T(act(gate + bg) · (up + bu)) for columns
// k … k + 7 of row xr of the gate·up product ([2·in]: gates, then ups; X fp32 or T; bias
// [2·in] fp32 or null), widened back to fp32.
template <typename T, typename X>
__device__ __forceinline__ void fp8_gated8(const X* __restrict__ xr, const float* __restrict__ bias, int k, int in,
                                           int act, float (&v)[8]) {
  float gv[8], uv[8];
  if constexpr (std::is_same<X, float>::value) {
    const float4* gp4 = reinterpret_cast<const float4*>(xr + k);
    const float4* up4 = reinterpret_cast<const float4*>(xr + in + k);
    const float4 g0 = gp4[0], g1 = gp4[1], u0 = up4[0], u1 = up4[1];
    const float ga[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
    const float ua[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
    for (int i = 0; i < 8; i++) gv[i] = ga[i], uv[i] = ua[i];
  } else {
    fp8_widen8<X>(*reinterpret_cast<const uint4*>(xr + k), gv);
    fp8_widen8<X>(*reinterpret_cast<const uint4*>(xr + in + k), uv);
  }
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const float bg = bias ? bias[k + i] : 0.f, bu = bias ? bias[in + k + i] : 0.f;
    v[i] = to_f32(from_f32<T>(activate(gv[i] + bg, act) * (uv[i] + bu)));
  }
}

// fp8_gated_quant_kernel: the gated MLP's units quantized for the down projection in one
// pass — fp8_gated8's y for y [n][in] from the gate·up product x [n][2·in], then
// fp8_quant_rows_kernel's codes of y — bit for bit, for an fp32 x — without y going
// through memory. Grid and layout as fp8_quant_rows_kernel's (in a multiple of 16); rows
// n…m − 1 zeros.
template <typename T, typename X>
__global__ void __launch_bounds__(256)
    fp8_gated_quant_kernel(const X* __restrict__ x, const float* __restrict__ bias, uint8_t* __restrict__ xq,
                           float* __restrict__ s, int n, int m, int in, int act) {
  griddep_wait();
  fp8_quant_groups([&](int r, int k, float(&v)[8]) { fp8_gated8<T, X>(x + (size_t)r * 2 * in, bias, k, in, act, v); },
                   xq, s, n, m, in);
}

// Rowwise quantization, for weights with a scale a row (per-channel or per-tensor: the
// OUTER_VEC_32F recipe): a block of kFp8RowThreads a row r, a thread 8 columns at a time
// (k = 8·t + 8·kFp8RowThreads·i; in a multiple of 8), twice over the row — its amax, then
// its codes: xq [m][in] e4m3 = v · 448 / amax, s [m] = amax / 448 (1 for a row of zeros).
// Rows n…m − 1 are zeros, as the grouped kernels write them. load(k, v) fills v with
// columns k…k + 7 of row r (r < n).
constexpr int kFp8RowThreads = 256;

template <typename Load>
__device__ __forceinline__ void fp8_quant_row(Load load, uint8_t* __restrict__ xq, float* __restrict__ s, int r,
                                              int n, int in) {
  __shared__ float red[kFp8RowThreads / 32];
  const int t = threadIdx.x, lane = t % 32;
  float v[8], a = 0.f;
  if (r < n)
    for (int k = 8 * t; k < in; k += 8 * kFp8RowThreads) {
      load(k, v);
#pragma unroll
      for (int i = 0; i < 8; i++) a = fmaxf(a, fabsf(v[i]));
    }
#pragma unroll
  for (int d = 16; d > 0; d /= 2) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, d));
  if (lane == 0) red[t / 32] = a;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kFp8RowThreads / 32; w++) a = fmaxf(a, red[w]);
  const float inv = a > 0.f ? kFp8Max / a : 0.f;
  for (int k = 8 * t; k < in; k += 8 * kFp8RowThreads) {
    if (r < n) {
      load(k, v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; i++) v[i] = 0.f;
    }
    fp8_store8(v, inv, xq + (size_t)r * in + k);
  }
  if (t == 0) s[r] = a > 0.f ? a / kFp8Max : 1.f;
}

// fp8_quant_row_kernel: fp8_quant_row of x [n][in] T; grid m.
template <typename T>
__global__ void __launch_bounds__(kFp8RowThreads)
    fp8_quant_row_kernel(const T* __restrict__ x, uint8_t* __restrict__ xq, float* __restrict__ s, int n, int in) {
  griddep_wait();
  const int r = blockIdx.x;
  const T* xr = x + (size_t)r * in;
  fp8_quant_row([&](int k, float(&v)[8]) { fp8_widen8<T>(*reinterpret_cast<const uint4*>(xr + k), v); }, xq, s, r, n,
                in);
}

// fp8_gated_row_kernel: fp8_quant_row of fp8_gated8's units of the gate·up product x
// [n][2·in]; grid m.
template <typename T, typename X>
__global__ void __launch_bounds__(kFp8RowThreads)
    fp8_gated_row_kernel(const X* __restrict__ x, const float* __restrict__ bias, uint8_t* __restrict__ xq,
                         float* __restrict__ s, int n, int in, int act) {
  griddep_wait();
  const int r = blockIdx.x;
  const X* xr = x + (size_t)r * 2 * in;
  fp8_quant_row([&](int k, float(&v)[8]) { fp8_gated8<T, X>(xr, bias, k, in, act, v); }, xq, s, r, n, in);
}

// Fp8Lt is an engine's cuBLASLt state for its FP8 projections.
struct Fp8Lt {
  cublasLtHandle_t lt = nullptr;
  void* ws = nullptr;  // the engine's cuBLAS workspace (one stream: never in use twice at once)
  size_t ws_bytes = 0;
  DevMem xq, xs;  // quantized rows [NG][max in] and their scales [max G][NG]
  DevMem blk;     // every weight's block scales (the file's comment), one allocation
  DevMem yb;      // bf16 products [NG][widest out], where cuBLASLt takes no fp32 D (the warm-up allocates it)
  size_t yb_need = 0;  // its bytes
  int sms = 1;         // the device's multiprocessors
  // Scales is a weight's table for cuBLASLt: p null where it has none.
  enum Mode { kBlocks, kGroups, kRows };
  struct Scales {
    const float* p = nullptr;
    // kBlocks: BLK128x128_32F (128-row blocks share their scales); kGroups: VEC128_32F
    // (rows differ within a block and along the row); kRows: OUTER_VEC_32F, a scale a
    // row (per-channel or per-tensor weights), with the activations a scale a row too.
    Mode mode = kBlocks;
  };
  std::map<const float*, Scales> blocks;  // arena scales (Stage.ws) → their table
  // A shape's plan: use_lt false keeps fp8.cuh's kernels.
  struct Plan {
    bool use_lt = false;
    bool bf16 = false;   // D in bf16 (lt.yb), widened into y by fp8_widen_kernel
    bool tout = false;   // D in the compute type, straight into the caller's T rows
    bool found = false;  // the heuristic had an algorithm (use_lt false: none of them would run)
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int, int, int, int, bool>, Plan> plans;  // (m, in, out, Mode, D in T)
  bool reported = false;  // a shape without an algorithm was reported
  static void drop(Plan& p) {
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    p.d = p.b = p.a = nullptr, p.desc = nullptr;
  }
  ~Fp8Lt() {
    for (auto& kv : plans) drop(kv.second);
    if (lt) cublasLtDestroy(lt);
  }
};

// fp8lt_status wraps a cuBLASLt call whose failure means "no such algorithm here" rather
// than a broken step (descriptor set-up, the heuristic): false instead of an error.
inline bool fp8lt_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }

// fp8_widen_kernel: y [count] fp32 = yb [count] bf16 (grid-stride).
__global__ void fp8_widen_kernel(const __nv_bfloat16* __restrict__ yb, float* __restrict__ y, size_t count) {
  griddep_wait();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
    y[i] = __bfloat162float(yb[i]);
}

// fp8lt_describe builds shape (m, in, out)'s descriptors into p (D of type dt; A's scales
// in mode's layout, B's VEC128 groups or, for kRows, a scale a row as A's), with the
// scale pointers sa (A's table) and xs (B's) already set: cuBLASLt
// 13's heuristic refuses a block-scaled descriptor whose scale pointers are unset
// (CUBLAS_STATUS_INVALID_VALUE, "requires a custom pointer"), and fp8lt_run sets them again
// for each weight. false where this cuBLASLt does not know the attributes (older than block
// scaling).
inline bool fp8lt_describe(Fp8Lt::Plan& p, int m, int in, int out, const float* sa, const float* xs,
                           Fp8Lt::Mode mode, cudaDataType_t dt) {
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const bool rows = mode == Fp8Lt::kRows;
  const int32_t ma = rows                   ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                     : mode == Fp8Lt::kGroups ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                              : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                mb = rows ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  // Outer-vector scales apply after the whole sum, so the tensor cores may keep it
  // (FAST_ACCUM) rather than promote it to fp32 registers every few k-steps
  // (bench/results/2026-11-28-fp8recipes-h200.jsonl), as TensorRT-LLM's and vLLM's
  // per-tensor and rowwise FP8 GEMMs do. Block scales must be applied a 128-group at a
  // time, which the promotion does.
  const int8_t fast = rows ? 1 : 0;
  return fp8lt_ok(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
         fp8lt_ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast)) &&
         fp8lt_ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) &&
         fp8lt_ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) &&
         fp8lt_ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma)) &&
         fp8lt_ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb)) &&
         fp8lt_ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa)) &&
         fp8lt_ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs)) &&
         fp8lt_ok(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, in, out, in)) &&
         fp8lt_ok(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, in, m, in)) &&
         fp8lt_ok(cublasLtMatrixLayoutCreate(&p.d, dt, out, m, out));
}

// fp8lt_run enqueues plan p on (m rows of xq, weights w with blocks sa) into y (fp32, or T
// where p.tout).
inline void fp8lt_run(Fp8Lt& lt, const Fp8Lt::Plan& p, const cublasLtMatmulAlgo_t& algo, const uint8_t* w,
                      const float* sa, void* y, cudaStream_t st) {
  const void* xs = lt.xs.p;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs));
  const float one = 1.f, zero = 0.f;
  void* d = p.bf16 ? lt.yb.p : y;
  CUBLAS_CHECK(cublasLtMatmul(lt.lt, p.desc, &one, w, p.a, lt.xq.p, p.b, &zero, d, p.d, d, p.d, &algo, lt.ws,
                              lt.ws_bytes, st));
}

// fp8lt_widen enqueues the bf16 products' widening into y (plans with p.bf16).
inline void fp8lt_widen(Fp8Lt& lt, float* y, int m, int out, Stream st) {
  const size_t count = (size_t)m * out;
  const int blocks = (int)std::min<size_t>((count + 255) / 256, (size_t)lt.sms * 8);
  launch("fp8_widen_kernel", fp8_widen_kernel, blocks, 256, 0, st, (const __nv_bfloat16*)lt.yb.p, y, count);
}

// fp8_group_blocks is the grouped kernels' grid: a warp a row's group pair, 8 warps a block.
inline int fp8_group_blocks(int m, int in) {
  const int G2 = ((in + kFp8Group - 1) / kFp8Group + 1) / 2;
  return (int)(((size_t)m * G2 * 32 + 255) / 256);
}

// fp8lt_quant enqueues the quantization of x's n rows (padded to m) into lt.xq, lt.xs: a
// scale a row for mode kRows, else a 1×128 group.
template <typename T>
void fp8lt_quant(Fp8Lt& lt, const T* x, int n, int m, int in, Fp8Lt::Mode mode, Stream st) {
  if (mode == Fp8Lt::kRows) {
    launch("fp8_quant_row_kernel", fp8_quant_row_kernel<T>, m, kFp8RowThreads, 0, st, x, lt.xq.as<uint8_t>(),
           lt.xs.as<float>(), n, in);
    return;
  }
  launch("fp8_quant_rows_kernel", fp8_quant_rows_kernel<T>, fp8_group_blocks(m, in), 256, 0, st, x, lt.xq.as<uint8_t>(),
         lt.xs.as<float>(), n, m, in);
}

// fp8lt_gated_quant enqueues the gated units of the gate·up product x's n rows (padded to
// m; X fp32 or T), quantized into lt.xq, lt.xs for the down projection, whose weights'
// mode says how (fp8_gated_row_kernel for kRows, else fp8_gated_quant_kernel).
template <typename T, typename X>
void fp8lt_gated_quant(Fp8Lt& lt, const X* x, const float* bias, int n, int m, int in, int act, Fp8Lt::Mode mode,
                       Stream st) {
  if (mode == Fp8Lt::kRows) {
    launch("fp8_gated_row_kernel", fp8_gated_row_kernel<T, X>, m, kFp8RowThreads, 0, st, x, bias,
           lt.xq.as<uint8_t>(), lt.xs.as<float>(), n, in, act);
    return;
  }
  launch("fp8_gated_quant_kernel", fp8_gated_quant_kernel<T, X>, fp8_group_blocks(m, in), 256, 0, st, x, bias, lt.xq.as<uint8_t>(),
         lt.xs.as<float>(), n, m, in, act);
}

// fp8lt_plan returns shape (m, in, out)'s plan for weights whose table is sa (in mode's
// layout), choosing it on its first call: timed where
// timed (the warm-up), else the heuristic's first candidate (a shape met first inside a
// graph capture, where nothing may synchronize). w, sa: a weight of the shape to time on;
// x: rows to time on (the quantization is part of the cuBLASLt path's cost). fp8.cuh's
// kernels are not among the candidates: they keep the activations in T while this path
// rounds them to e4m3, so a shape's numerics would hang on a timing.
template <typename T>
const Fp8Lt::Plan& fp8lt_plan(Fp8Lt& lt, int m, int in, int out, const T* x, const uint8_t* w, const float* sa,
                              Fp8Lt::Mode mode, void* y, cudaStream_t st, bool timed, bool tout = false) {
  const auto key = std::make_tuple(m, in, out, (int)mode, tout);
  auto it = lt.plans.find(key);
  if (it != lt.plans.end()) return it->second;
  Fp8Lt::Plan& p = lt.plans[key];
  cublasLtMatmulHeuristicResult_t res[kFp8LtCandidates] = {};
  int found = 0;
  cublasStatus_t why = CUBLAS_STATUS_SUCCESS;  // the heuristic's status of the last try, for the report
  // cuBLASLt's block-scaled FP8 (cuBLAS docs, cublasLtMatmul and "128-element 1D and
  // 128x128 2D block scaling"): TN only on Hopper, compute 32F, scale type 32F, D fp32,
  // bf16 or fp16, M and N multiples of 4, 16-byte aligned operands: in a multiple of 16,
  // out of 4 (fp32 D) or 8 (bf16 D). A bf16 D is widened after (while the warm-up may still
  // allocate its buffer: not inside a capture).
  // D: fp32, else bf16 widened after; or, asked for tout, the compute type alone.
  for (int d = tout ? 2 : 0; d < (tout ? 3 : 2) && found <= 0; d++) {
    Fp8Lt::drop(p);
    p.bf16 = d == 1, p.tout = d == 2;
    if (p.bf16 && !lt.yb.p && !timed) break;
    const cudaDataType_t dt = d == 0 ? CUDA_R_32F : d == 1 ? CUDA_R_16BF : cuda_type<T>();
    if (in % 16 != 0 || out % (d > 0 ? 8 : 4) != 0 || m % 4 != 0 ||
        !fp8lt_describe(p, m, in, out, sa, lt.xs.as<float>(), mode, dt))
      continue;
    cublasLtMatmulPreference_t pref = nullptr;
    if (fp8lt_ok(cublasLtMatmulPreferenceCreate(&pref))) {
      const size_t wsb = lt.ws_bytes;
      why = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
      if (fp8lt_ok(why))
        why = cublasLtMatmulAlgoGetHeuristic(lt.lt, p.desc, p.a, p.b, p.d, p.d, pref, kFp8LtCandidates, res, &found);
      if (!fp8lt_ok(why)) found = 0;
      cublasLtMatmulPreferenceDestroy(pref);
    }
  }
  if (found > 0 && p.bf16 && !lt.yb.p) {
    try {
      lt.yb.alloc(lt.yb_need, "FP8 GEMM bf16 products");
    } catch (const Error&) {
      cudaGetLastError();  // no room beside the KV pool: the mma kernel instead
      found = 0;
    }
  }
  if (found <= 0) {
    if (tout) return p;  // the caller keeps the fp32 product
    if (!lt.reported) {
      lt.reported = true;
      std::fprintf(stderr,
                   "gollm: cuBLASLt has no block-scaled FP8 algorithm for %d rows × %d → %d (weights %s, "
                   "heuristic: %s); FP8 projections of such shapes keep gollm's own kernels\n",
                   m, in, out, mode == Fp8Lt::kRows ? "OUTER_VEC" : mode == Fp8Lt::kGroups ? "VEC128" : "BLK128x128", why == CUBLAS_STATUS_SUCCESS ? "no candidate" : cublas_name(why));
    }
    return p;
  }
  p.use_lt = p.found = true;
  p.algo = res[0].algo;
  if (!timed || found == 1) return p;
  // Time each candidate, a few runs each after one untimed run.
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  float best = 1e30f;
  int pick = -1;  // -1: every candidate refused to run (fp8.cuh's kernels then)
  constexpr int kReps = 5;
  try {
    for (int c = 0; c < found; c++) {
      auto once = [&]() {
        fp8lt_quant<T>(lt, x, m, m, in, mode, Stream(st, false));
        fp8lt_run(lt, p, res[c].algo, w, sa, y, st);
        if (p.bf16) fp8lt_widen(lt, static_cast<float*>(y), m, out, Stream(st, false));
      };
      try {
        once();
      } catch (const Error& err) {
        // A candidate cublasLtMatmul refuses (its status, returned at once) is left out; a
        // CUDA error is the engine's.
        if (err.code != GOLLM_ERR_CUBLAS) throw;
        continue;
      }
      CUDA_CHECK(cudaEventRecord(e0, st));
      for (int r = 0; r < kReps; r++) once();
      CUDA_CHECK(cudaEventRecord(e1, st));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0.f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (ms < best) best = ms, pick = c;
    }
  } catch (...) {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    throw;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (pick < 0)
    p.use_lt = false;
  else
    p.algo = res[pick].algo;
  return p;
}

// fp8lt_blocks builds the scale tables of the engine's FP8 weights (each Stage's w and w2
// with their scales ws, ws2 [rows][ceil(cols/128)]) into lt.blk, each table 16-byte
// aligned: a scale a row (kRows) for weights whose rows each have one, the fastest
// recipe; else 128×128 blocks (kBlocks) for those whose 128-row blocks share their
// scales; else the scales transposed into VEC128 groups (kGroups; rows a multiple of 4,
// as cuBLASLt's M; other weights keep fp8.cuh's kernels).
inline void fp8lt_blocks(Fp8Lt& lt, const std::vector<std::tuple<const float*, int, int>>& weights, cudaStream_t st) {
  std::vector<float> host, all;
  std::vector<std::tuple<const float*, size_t, Fp8Lt::Mode>> at;  // arena scales → offset in all, mode
  for (const auto& wt : weights) {
    const float* ws = std::get<0>(wt);
    const int rows = std::get<1>(wt), cols = std::get<2>(wt);
    if (!ws || lt.blocks.count(ws)) continue;
    const int G = (cols + kFp8Group - 1) / kFp8Group, G4 = (G + 3) / 4 * 4, RB = (rows + 127) / 128;
    host.resize((size_t)rows * G);
    CUDA_CHECK(cudaMemcpyAsync(host.data(), ws, host.size() * 4, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    bool by_row = true, by_block = true;
    for (int r = 0; r < rows; r++)
      for (int g = 0; g < G; g++) {
        const float v = host[(size_t)r * G + g];
        by_row = by_row && v == host[(size_t)r * G];
        by_block = by_block && v == host[(size_t)(r / 128 * 128) * G + g];
      }
    const Fp8Lt::Mode mode = by_row ? Fp8Lt::kRows : by_block ? Fp8Lt::kBlocks : Fp8Lt::kGroups;
    lt.blocks[ws] = Fp8Lt::Scales{};
    if (mode != Fp8Lt::kBlocks && rows % 4 != 0) continue;
    const size_t base = all.size();
    at.emplace_back(ws, base, mode);
    if (mode == Fp8Lt::kRows) {
      all.resize(base + (size_t)rows, 1.f);  // a multiple of 4
      for (int r = 0; r < rows; r++) all[base + r] = host[(size_t)r * G];
    } else if (mode == Fp8Lt::kBlocks) {
      all.resize(base + (size_t)RB * G4, 1.f);
      for (int b = 0; b < RB; b++)
        for (int g = 0; g < G; g++) all[base + (size_t)b * G4 + g] = host[(size_t)b * 128 * G + g];
    } else {
      all.resize(base + (size_t)G * rows, 1.f);  // G · rows: a multiple of 4
      for (int r = 0; r < rows; r++)
        for (int g = 0; g < G; g++) all[base + (size_t)g * rows + r] = host[(size_t)r * G + g];
    }
  }
  if (all.empty()) return;
  lt.blk.alloc(all.size() * 4, "FP8 weight scales (cuBLASLt)");
  CUDA_CHECK(cudaMemcpyAsync(lt.blk.p, all.data(), all.size() * 4, cudaMemcpyHostToDevice, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  for (const auto& a : at) lt.blocks[std::get<0>(a)] = Fp8Lt::Scales{lt.blk.as<float>() + std::get<1>(a), std::get<2>(a)};
}

}  // namespace gollm

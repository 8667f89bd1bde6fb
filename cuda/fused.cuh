// fused.cuh — the MLP of a decode-only step at small batch in one kernel: the MLP's norm
// → a slice of the inner units (gated or not) → their share of the down-projection, added
// to the residual stream. A layer of such a step is then four kernels (gemv.cuh's QKV with LayerNorm 1 and
// the KV write; decode attention; gemv's output projection; this).
//
// The blocks split the down-projection over its reduction (the inner units), so they add
// partial sums to the same residual entries. They do it in fixed point (fix_add into Z):
// integer addition is associative, so the result does not depend on the blocks' order,
// where fp32 atomics would make runs differ in the last bits. The residual stream is
// h + Z: readers take both (resid_at, the LayerNorm prologues), and the next layer's
// output projection, a single writer per entry, moves Z into h and zeroes it (gemv_store);
// the embedding kernel zeroes Z at the start of the step. The kernel copies its weights
// into shared memory (bulk copies on sm_90, else cp.async) before waiting for the
// previous kernel.
#pragma once
#include "attention.cuh"
#include "gemv.cuh"

namespace gollm {

// MlpArgs: the MLP of n rows, split over blocks of k inner units.
struct MlpArgs {
  const void* w_up;      // [inner][hidden] T, or gated [2·inner][hidden] (gate rows first)
  const float* b_up;     // [inner] or gated [2·inner], or null
  const void* w_down;    // [hidden][inner] T
  const float* b_down;   // [hidden], or null
  const float* gamma;    // the MLP's norm [hidden]
  const float* beta;     // [hidden], or null (RMSNorm)
  float eps;
  bool rms;              // RMSNorm instead of LayerNorm
  bool gated;            // act(gate) · up
  const float* h;             // residual stream [n][hidden] fp32 (Z is zero when mlp runs)
  unsigned long long* acc;    // Z [n][hidden], where the partial sums go
  int n, hidden, inner, act;
  int k;  // inner units per block, a multiple of 8
  bool bulk;  // stage the weights with bulk copies (sm_90)
};

inline size_t mlp_smem(int R, int hidden, int k, int elem, bool gated) {
  return align_up16((size_t)R * hidden * elem) + (gated ? 3 : 2) * (size_t)k * hidden * elem +
         (size_t)R * k * 4;
}

// mlp_kernel: grid ceil(inner / k), kGemvThreads threads. Block b owns inner units
// j0 = b*k … j0+kk-1: it stages W_up's rows j0… ([kk][hidden], contiguous; gated, also the
// up rows inner+j0…) and W_down's columns j0… ([hidden][k], a 16-byte multiple per row),
// then computes
//   a[r][j] = act(norm(x_r) · W_up[j] + b_up[j])      (a warp per unit, rounded to T)
//           or, gated, act(norm(x_r) · W_gate[j] + b_gate[j]) · (norm(x_r) · W_up[j] + b_up[j])
//   x_r[o] += Σ_j W_down[o][j] · a[r][j]  (+ b_down[o] in block 0)   (a thread per o)
// Dynamic shared memory: mlp_smem.
template <typename T, int R>
__global__ void __launch_bounds__(kGemvThreads) mlp_kernel(MlpArgs m) {
  using T2 = typename Pair<T>::type;
  extern __shared__ __align__(16) unsigned char mlp_sm[];
  griddep_launch();
  const int H = m.hidden, k = m.k, j0 = blockIdx.x * k;
  const int kk = min(k, m.inner - j0);
  T* xs = reinterpret_cast<T*>(mlp_sm);
  T* wu = reinterpret_cast<T*>(mlp_sm + align_up16((size_t)R * H * sizeof(T)));
  T* wd = wu + (size_t)k * H;
  T* wg = wd + (size_t)H * k;  // gated: the up rows (wu holds the gate's)
  float* act = reinterpret_cast<float*>(m.gated ? wg + (size_t)k * H : wd + (size_t)H * k);
  __shared__ uint64_t bar;
  const bool bulk = kBulk && m.bulk;
  if (bulk) {
    // W_up's slice is one range; W_down's is a row piece of kk units per output.
    if (threadIdx.x == 0) mbar_init(&bar);
    __syncthreads();
    const T* wdg = static_cast<const T*>(m.w_down) + j0;
    const unsigned row = kk * sizeof(T);
    if (threadIdx.x == 0) {
      mbar_expect_tx(&bar, (m.gated ? 3u : 2u) * H * row);
      bulk_copy(wu, static_cast<const T*>(m.w_up) + (size_t)j0 * H, H * row, &bar);
      if (m.gated)
        bulk_copy(wg, static_cast<const T*>(m.w_up) + (size_t)(m.inner + j0) * H, H * row, &bar);
    }
    for (int o = threadIdx.x; o < H; o += kGemvThreads)
      bulk_copy(wd + (size_t)o * k, wdg + (size_t)o * m.inner, row, &bar);
  } else {
    const char* src = static_cast<const char*>(m.w_up) + (size_t)j0 * H * sizeof(T);
    const int pieces = kk * H / 8;
    for (int i = threadIdx.x; i < pieces; i += kGemvThreads)
      cp_async16(reinterpret_cast<char*>(wu) + (size_t)i * 16, src + (size_t)i * 16);
    if (m.gated) {
      const char* usrc = static_cast<const char*>(m.w_up) + (size_t)(m.inner + j0) * H * sizeof(T);
      for (int i = threadIdx.x; i < pieces; i += kGemvThreads)
        cp_async16(reinterpret_cast<char*>(wg) + (size_t)i * 16, usrc + (size_t)i * 16);
    }
    const int per = kk / 8;
    const T* wdg = static_cast<const T*>(m.w_down) + j0;
    for (int i = threadIdx.x; i < H * per; i += kGemvThreads) {
      const int o = i / per, p = i % per;
      cp_async16(wd + (size_t)o * k + p * 8, wdg + (size_t)o * m.inner + p * 8);
    }
    cp_async_commit();
  }
  GemvArgs g{};
  g.n = m.n, g.in = H, g.h = m.h, g.gamma = m.gamma, g.beta = m.beta, g.eps = m.eps, g.rms = m.rms;
  const LnParams lp = gemv_ln_params<GEMV_IN_LN>(g);
  griddep_wait();
  gemv_input<T, R, GEMV_IN_LN>(g, lp, xs);
  if (bulk)
    mbar_wait(&bar, 0);
  else
    cp_async_wait<0>();
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n = m.n;
  const int chunks = H / 8;
  const uint4* xw = reinterpret_cast<const uint4*>(xs);
  for (int j = warp; j < kk; j += kGemvWarps) {
    float s[R], u[R];
#pragma unroll
    for (int r = 0; r < R; r++) s[r] = 0.f, u[r] = 0.f;
    const uint4* wr = reinterpret_cast<const uint4*>(wu + (size_t)j * H);
    const uint4* ur = reinterpret_cast<const uint4*>(wg + (size_t)j * H);
    for (int c = lane; c < chunks; c += 32) {
      const uint4 wv = wr[c];
#pragma unroll
      for (int r = 0; r < R; r++)
        if (r < n) dot8<T>(wv, xw[r * chunks + c], s[r]);
      if (m.gated) {
        const uint4 uv = ur[c];
#pragma unroll
        for (int r = 0; r < R; r++)
          if (r < n) dot8<T>(uv, xw[r * chunks + c], u[r]);
      }
    }
    float v = 0.f, w = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++) {
      s[r] = warp_sum(s[r]);
      if (m.gated) u[r] = warp_sum(u[r]);
      if (lane == r) v = s[r], w = u[r];
    }
    if (lane < n) {
      float a = activate(v + (m.b_up ? m.b_up[j0 + j] : 0.f), m.act);
      if (m.gated) a *= w + (m.b_up ? m.b_up[m.inner + j0 + j] : 0.f);
      act[lane * k + j] = to_f32(from_f32<T>(a));
    }
  }
  __syncthreads();
  for (int o = threadIdx.x; o < H; o += kGemvThreads) {
    float s[R];
#pragma unroll
    for (int r = 0; r < R; r++) s[r] = 0.f;
    const uint4* wr = reinterpret_cast<const uint4*>(wd + (size_t)o * k);
    for (int p = 0; p < kk / 8; p++) {
      const uint4 wv = wr[p];
      const T2* w2 = reinterpret_cast<const T2*>(&wv);
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float2 f = to_f32x2(w2[e]);
#pragma unroll
        for (int r = 0; r < R; r++) {
          if (r < n) {
            const float* ar = act + r * k + p * 8 + 2 * e;
            s[r] = fmaf(f.x, ar[0], s[r]);
            s[r] = fmaf(f.y, ar[1], s[r]);
          }
        }
      }
    }
    const float bias = blockIdx.x == 0 && m.b_down ? m.b_down[o] : 0.f;
#pragma unroll
    for (int r = 0; r < R; r++)
      if (r < n) fix_add(m.acc + (size_t)r * H + o, s[r] + bias);
  }
}

// mlp_slot is where the k for R rows (1, 2 or 4) is kept.
inline int mlp_slot(int R) { return R <= 1 ? 0 : R == 2 ? 1 : 2; }

// mlp_units picks k: about one block per multiprocessor, within the shared memory a block
// may have.
inline int mlp_units(int R, int hidden, int inner, int sms, int elem, size_t smem_max, bool gated) {
  int k = ((inner + sms - 1) / sms + 7) / 8 * 8;
  while (k > 8 && mlp_smem(R, hidden, k, elem, gated) > smem_max) k -= 8;
  return k;
}

template <typename T>
void mlp(const MlpArgs& m, int R, Stream stream) {
  const int blocks = (m.inner + m.k - 1) / m.k;
  const size_t smem = mlp_smem(R, m.hidden, m.k, sizeof(T), m.gated);
  switch (R) {
    case 1: launch("mlp_kernel", mlp_kernel<T, 1>, blocks, kGemvThreads, smem, stream, m); break;
    case 2: launch("mlp_kernel", mlp_kernel<T, 2>, blocks, kGemvThreads, smem, stream, m); break;
    default: launch("mlp_kernel", mlp_kernel<T, 4>, blocks, kGemvThreads, smem, stream, m); break;
  }
}

// fused_setup sizes mlp_kernel's blocks for a model and raises its dynamic shared memory
// limits; false if it cannot run on this device.
template <typename T>
bool fused_setup(int hidden, int inner, bool gated, int sms, int device, int (&mlp_k)[3]) {
  const auto attr = cudaFuncAttributeMaxDynamicSharedMemorySize;
  void (*kernels[3])(MlpArgs) = {mlp_kernel<T, 1>, mlp_kernel<T, 2>, mlp_kernel<T, 4>};
  for (int R = 1; R <= kFusedRows; R *= 2) {
    const int i = mlp_slot(R);
    const size_t mx = dynamic_smem_max(kernels[i], device);
    mlp_k[i] = mlp_units(R, hidden, inner, sms, sizeof(T), mx, gated);
    const size_t s = mlp_smem(R, hidden, mlp_k[i], sizeof(T), gated);
    if (s > mx) return false;
    // The limit is the process's, shared by every engine: set it to the device's most,
    // never to this model's need, or a smaller model loaded later would lower it under a
    // larger one (its launches then fail with an invalid argument).
    CUDA_CHECK(cudaFuncSetAttribute(kernels[i], attr, (int)mx));
  }
  return true;
}

}  // namespace gollm

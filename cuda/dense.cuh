// dense.cuh — the kernels Qwen3, Gemma 2 and 3 and Phi-3's longrope add to the LLaMA
// layer: the QKV epilogue with per-head query and key norms and longrope's frequency sets,
// the residual add of a post-normed branch, and soft-capped logits. (Soft-capped
// attention scores are the kCap variants of attention.cuh's CUDA-core context kernel and
// per-head decode kernel; the embedding scale the kScale variants of the embedding
// kernels.)
#pragma once
#include "attention.cuh"
#include "layernorm.cuh"

namespace gollm {

// qkv_extra_write_kernel: the QKV epilogue of qkv_rope_write_kernel with QkvExtra's
// additions, in transformers' order: bias, then each query head normed by q_gamma and each
// key head by k_gamma (x · rsqrt(mean(x²) + eps) · γ over the head, fp32), then the
// rotation of the first rope_dim dimensions (inv_freq, or long_freq where the row's
// sequence is longer than long_from after the step: pos + ntok of its DevSeq) with cos and
// sin times rope_scale, then the queries times scale written back and the keys and values
// into the pool. Grid (n, heads + 2 · kv_heads), kRopeThreads threads; head_dim ≤ 256 (the
// head in shared memory). inv_freq null: no rotation.
template <typename T>
__global__ void __launch_bounds__(kRopeThreads) qkv_extra_write_kernel(
    float* __restrict__ qkv, const float* __restrict__ bias, void* __restrict__ kv,
    const int32_t* __restrict__ row_pos, const int32_t* __restrict__ row_seq,
    const DevSeq* __restrict__ seqs, const int32_t* __restrict__ blocks, KVGeom g, int layer,
    float scale, const float* __restrict__ inv_freq, int rope_dim, QkvExtra x) {
  __shared__ float v[256];
  __shared__ float red[32];
  griddep_launch();
  const int r = blockIdx.x, h = blockIdx.y, D = g.head_dim, half = rope_dim / 2;
  const int pos = row_pos[r];
  const DevSeq sq = seqs[row_seq[r]];
  const int64_t base = g.at(blocks[sq.blk_off + pos / g.tokens_per_block], layer, 0, 0,
                            pos % g.tokens_per_block);
  const float* freq = x.long_freq && sq.pos + sq.ntok > x.long_from ? x.long_freq : inv_freq;
  griddep_wait();
  float* row = qkv + (int64_t)r * g.qkv_width();
  const int c0 = h * D;
  const bool query = h < g.heads, rotated = h < g.heads + g.kv_heads;
  for (int d = threadIdx.x; d < D; d += kRopeThreads) v[d] = row[c0 + d] + (bias ? bias[c0 + d] : 0.f);
  const float* gamma = !rotated ? nullptr : query ? x.q_gamma : x.k_gamma;
  if (gamma) {
    float ss = 0.f;
    for (int d = threadIdx.x; d < D; d += kRopeThreads) ss += v[d] * v[d];
    const float rstd = rsqrtf(block_sum(ss, red) / D + x.eps);
    for (int d = threadIdx.x; d < D; d += kRopeThreads) v[d] = v[d] * rstd * gamma[d];
  }
  __syncthreads();  // the rotation pairs dimensions other threads normed
  auto put = [&](int c, float val) {
    if (query)
      row[c] = val * scale;
    else
      kv_put<T>(kv, base + g.kv_col(c), val, g, rotated ? 0 : 1);
  };
  const bool rope = rotated && freq != nullptr;
  if (rope) {
    for (int i = threadIdx.x; i < half; i += kRopeThreads) {
      float sn, cs;
      sincosf(freq[i] * (float)pos, &sn, &cs);
      cs *= x.rope_scale, sn *= x.rope_scale;
      const float a = v[i], b = v[i + half];
      put(c0 + i, a * cs - b * sn);
      put(c0 + i + half, b * cs + a * sn);
    }
  }
  for (int d = (rope ? rope_dim : 0) + threadIdx.x; d < D; d += kRopeThreads) put(c0 + d, v[d]);
}

// qkv_extra_write is the QKV epilogue as a kernel of its own for a layer with QkvExtra's
// additions (qkv_kv_write's, otherwise).
template <typename T>
void qkv_extra_write(float* qkv, const float* bias, void* kv, const int32_t* row_pos,
                     const int32_t* row_seq, const DevSeq* seqs, const int32_t* blocks, KVGeom g,
                     int layer, int n, const float* inv_freq, int rope_dim, float scale,
                     const QkvExtra& x, Stream stream) {
  if (n == 0) return;
  launch("qkv_extra_write_kernel", qkv_extra_write_kernel<T>, dim3(n, g.heads + 2 * g.kv_heads),
         kRopeThreads, 0, stream, qkv, bias, kv, row_pos, row_seq, seqs, blocks, g, layer, scale,
         inv_freq, rope_dim, x);
}

// post_residual_norm_kernel: RESIDUAL after a POST_NORM, one block per row r.
//   a:    [n][hidden] fp32, the branch (before its bias); bias [hidden] fp32 or null
//   h:    [n][hidden] fp32; h += RMSNorm(a + bias) with pg [hidden] fp32 and post_eps
//   xn:   [n][hidden] T = norm(h), the next NORM, as residual_layernorm_kernel's; null
//         where nothing reads it (the few-row paths' gemv kernels norm h themselves)
// Dynamic shared memory: hidden floats.
template <typename T>
__global__ void post_residual_norm_kernel(float* __restrict__ h, const float* __restrict__ a,
                                          const float* __restrict__ bias,
                                          const float* __restrict__ pg, float post_eps,
                                          T* __restrict__ xn, const float* __restrict__ gamma,
                                          const float* __restrict__ beta, int hidden, float eps,
                                          bool rms) {
  extern __shared__ float row[];
  __shared__ float red[32];
  griddep_launch();
  griddep_wait();
  const int64_t off = (int64_t)blockIdx.x * hidden;
  float ss = 0.f;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    const float v = a[off + c] + (bias ? bias[c] : 0.f);
    row[c] = v;
    ss += v * v;
  }
  const float rstd = rsqrtf(block_sum(ss, red) / hidden + post_eps);
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    const float v = h[off + c] + row[c] * rstd * pg[c];
    row[c] = v;
    h[off + c] = v;
  }
  if (xn) layernorm_row(row, xn + off, gamma, beta, hidden, eps, rms);
}

// post_residual_norm4_kernel: post_residual_norm_kernel for hidden % 4 == 0 up to
// 4 · kPrn4Max · kPrn4Threads, the row in registers (up to kPrn4Max float4 a thread)
// instead of shared memory: the weights (bias, post-norm and norm gammas, beta) are
// loaded before the wait, the branch and h together after it, so a row costs one memory
// round trip and three block reductions rather than a round trip per strided pass. One
// block of kPrn4Threads threads per row.
constexpr int kPrn4Threads = 512;
constexpr int kPrn4Max = 4;
template <typename T>
__global__ void __launch_bounds__(kPrn4Threads) post_residual_norm4_kernel(
    float* __restrict__ h, const float* __restrict__ a, const float* __restrict__ bias,
    const float* __restrict__ pg, float post_eps, T* __restrict__ xn,
    const float* __restrict__ gamma, const float* __restrict__ beta, int hidden, float eps,
    bool rms) {
  __shared__ float red[32];
  griddep_launch();
  const int h4 = hidden / 4;
  const int64_t off = (int64_t)blockIdx.x * hidden;
  const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 bv[kPrn4Max], pv[kPrn4Max], gv[kPrn4Max], btv[kPrn4Max];
#pragma unroll
  for (int k = 0; k < kPrn4Max; k++) {
    const int c = threadIdx.x + k * kPrn4Threads;
    if (c < h4) {
      bv[k] = bias ? reinterpret_cast<const float4*>(bias)[c] : z;
      pv[k] = reinterpret_cast<const float4*>(pg)[c];
      gv[k] = reinterpret_cast<const float4*>(gamma)[c];
      btv[k] = beta ? reinterpret_cast<const float4*>(beta)[c] : z;
    }
  }
  griddep_wait();
  float4 x[kPrn4Max], hv[kPrn4Max];
#pragma unroll
  for (int k = 0; k < kPrn4Max; k++) {
    const int c = threadIdx.x + k * kPrn4Threads;
    if (c < h4) {
      x[k] = reinterpret_cast<const float4*>(a + off)[c];
      hv[k] = reinterpret_cast<const float4*>(h + off)[c];
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kPrn4Max; k++) {
    const int c = threadIdx.x + k * kPrn4Threads;
    if (c < h4) {
      x[k] = make_float4(x[k].x + bv[k].x, x[k].y + bv[k].y, x[k].z + bv[k].z, x[k].w + bv[k].w);
      ss += (x[k].x * x[k].x + x[k].y * x[k].y) + (x[k].z * x[k].z + x[k].w * x[k].w);
    }
  }
  const float prstd = rsqrtf(block_sum(ss, red) / hidden + post_eps);
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kPrn4Max; k++) {
    const int c = threadIdx.x + k * kPrn4Threads;
    if (c < h4) {
      x[k] = make_float4(hv[k].x + x[k].x * prstd * pv[k].x, hv[k].y + x[k].y * prstd * pv[k].y,
                         hv[k].z + x[k].z * prstd * pv[k].z, hv[k].w + x[k].w * prstd * pv[k].w);
      reinterpret_cast<float4*>(h + off)[c] = x[k];
      s += (x[k].x + x[k].y) + (x[k].z + x[k].w);
    }
  }
  if (!xn) return;
  const float mean = rms ? 0.f : block_sum(s, red) / hidden;
  float v = 0.f;
#pragma unroll
  for (int k = 0; k < kPrn4Max; k++) {
    const int c = threadIdx.x + k * kPrn4Threads;
    if (c < h4) {
      const float dx = x[k].x - mean, dy = x[k].y - mean, dz = x[k].z - mean, dw = x[k].w - mean;
      v += (dx * dx + dy * dy) + (dz * dz + dw * dw);
    }
  }
  const float rstd = rsqrtf(block_sum(v, red) / hidden + eps);
#pragma unroll
  for (int k = 0; k < kPrn4Max; k++) {
    const int c = threadIdx.x + k * kPrn4Threads;
    if (c < h4)
      store4(xn + off + 4 * c, (x[k].x - mean) * rstd * gv[k].x + btv[k].x,
             (x[k].y - mean) * rstd * gv[k].y + btv[k].y, (x[k].z - mean) * rstd * gv[k].z + btv[k].z,
             (x[k].w - mean) * rstd * gv[k].w + btv[k].w);
  }
}

// post_residual_norm4_fits says whether post_residual_norm4_kernel takes a row of hidden.
inline bool post_residual_norm4_fits(int hidden) {
  return hidden % 4 == 0 && hidden <= 4 * kPrn4Max * kPrn4Threads;
}

template <typename T>
void post_residual_norm(float* h, const float* a, const float* bias, const float* pg,
                        float post_eps, T* xn, const float* gamma, const float* beta, int n,
                        int hidden, float eps, bool rms, Stream stream) {
  if (n == 0) return;
  if (post_residual_norm4_fits(hidden)) {
    launch("post_residual_norm4_kernel", post_residual_norm4_kernel<T>, n, kPrn4Threads, 0, stream,
           h, a, bias, pg, post_eps, xn, gamma, beta, hidden, eps, rms);
    return;
  }
  launch("post_residual_norm_kernel", post_residual_norm_kernel<T>, n, 256,
         hidden * sizeof(float), stream, h, a, bias, pg, post_eps, xn, gamma, beta, hidden, eps,
         rms);
}

// softcap_kernel: x = cap · tanh(x / cap) over n floats (the LM head's logits), 4 a thread.
__global__ void softcap_kernel(float* __restrict__ x, int64_t n, float cap) {
  griddep_launch();
  griddep_wait();
  const int64_t i = 4 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x);
  for (int64_t k = i; k < min(n, i + 4); k++) x[k] = cap * tanhf(x[k] / cap);
}

inline void softcap(float* x, int64_t n, float cap, Stream stream) {
  if (n == 0) return;
  launch("softcap_kernel", softcap_kernel, (unsigned)((n + 1023) / 1024), 256, 0, stream, x, n, cap);
}

// attention_capped is ATTENTION for a layer whose scores are soft-capped: the prompt rows'
// tiles on the CUDA-core context kernel and the decode rows on the per-head decode kernel,
// each in its kCap variant (the tensor-core context kernels and the grouped decode kernel
// have none).
template <typename T, typename K>
void attention_capped(const float* qkv, T* att, const K* kv, const CtxTile* tiles,
                      const int32_t* dec_rows, const int32_t* row_pos, const int32_t* row_seq,
                      const DevSeq* seqs, const int32_t* blocks, KVGeom g, int layer, int window,
                      int ntiles, int rows, int splits, int max_len, float* partial,
                      float* part_ml, int* tickets, bool prefetch, float cap, Stream stream) {
  if (ntiles > 0)
    launch("attention_context_kernel", attention_context_kernel<T, K, true>, dim3(ntiles, g.heads),
           kCtxThreads, ctx_smem(g.head_dim), stream, qkv, att, kv, tiles, seqs, blocks, g, layer,
           window, cap);
  if (rows > 0)
    launch("attention_decode_kernel",
           !prefetch                       ? attention_decode_kernel<T, K, false, true>
           : decode_short_fits(g.head_dim) ? attention_decode_kernel<T, K, true, true, true>
                                           : attention_decode_kernel<T, K, true, true>,
           dim3(rows, g.heads, splits), kDecodeThreads, decode_smem(g.head_dim, max_len), stream, qkv,
           att, kv, dec_rows, row_pos, row_seq, seqs, blocks, g, layer, window, max_len, partial,
           part_ml, tickets, cap);
}

}  // namespace gollm

// embedding.cuh — token (+ learned position) embedding fused with layer 0's first norm.
#pragma once
#include "layernorm.cuh"

namespace gollm {

// embedding_layernorm_kernel: one block per token row r.
//   tokens, positions: [n] int32
//   wte: [vocab][hidden] T;  wpe: [max_positions][hidden] T, or null (rotary positions)
//   h:   [n][hidden] fp32, the residual stream, set to wte[token] (+ wpe[pos])
//   xn:  [n][hidden] T, norm(h) with gamma [hidden] fp32 and beta [hidden] fp32 or null
//        (LayerNorm, or RMSNorm when rms)
//   acc: [n][hidden] fixed-point additions to h (fused.cuh), zeroed; or null
//   kScale: the token's row times scale, both rounded to T first and the product after, as
//   transformers scales Gemma's embeddings in the model's type (embed_scale)
// Dynamic shared memory: hidden floats.
template <typename T, bool kScale = false>
__global__ void embedding_layernorm_kernel(const int32_t* __restrict__ tokens,
                                           const int32_t* __restrict__ positions,
                                           const T* __restrict__ wte, const T* __restrict__ wpe,
                                           float* __restrict__ h, T* __restrict__ xn,
                                           const float* __restrict__ gamma,
                                           const float* __restrict__ beta, int hidden, float eps,
                                           bool rms, unsigned long long* __restrict__ acc,
                                           float scale) {
  extern __shared__ float row[];
  griddep_launch();
  griddep_wait();
  int r = blockIdx.x;
  const T* te = wte + (int64_t)tokens[r] * hidden;
  const T* pe = wpe ? wpe + (int64_t)positions[r] * hidden : nullptr;
  float* hr = h + (int64_t)r * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float v = to_f32(te[c]);
    if constexpr (kScale) v = embed_scaled<T>(v, scale);
    v += pe ? to_f32(pe[c]) : 0.f;
    row[c] = v;
    hr[c] = v;
    if (acc) acc[(int64_t)r * hidden + c] = 0;
  }
  layernorm_row(row, xn + (int64_t)r * hidden, gamma, beta, hidden, eps, rms);
}

// embedding_layernorm launches the kernel, with the scale where scale > 0.
template <typename T>
void embedding_layernorm(const int32_t* tokens, const int32_t* positions, const T* wte,
                         const T* wpe, float* h, T* xn, const float* gamma, const float* beta,
                         int n, int hidden, float eps, bool rms, Stream stream,
                         unsigned long long* acc = nullptr, float scale = 0.f) {
  if (n == 0) return;
  launch("embedding_layernorm_kernel",
         scale > 0.f ? embedding_layernorm_kernel<T, true> : embedding_layernorm_kernel<T, false>, n,
         256, hidden * sizeof(float), stream, tokens, positions, wte, wpe, h, xn, gamma, beta, hidden,
         eps, rms, acc, scale);
}

// feed_tokens_kernel: a launched step's fed rows take their tokens from the previous
// step's sampling (gollm_step_in.feed), on the device, before the forward pass.
//   row_tok: [rows] int32, the step's token of each row (written)
//   sampled: [previous step's sequences] int32, what it sampled (-1, -2: none)
//   pairs:   [n][2] int32, (row, previous sequence)
// A token outside [0, vocab) — the previous step sampled nothing there, which its wait
// reports — becomes 0, so that the embedding never reads out of bounds.
__global__ void feed_tokens_kernel(int32_t* __restrict__ row_tok, const int32_t* __restrict__ sampled,
                                   const int32_t* __restrict__ pairs, int n, int vocab) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int t = sampled[pairs[2 * i + 1]];
  row_tok[pairs[2 * i]] = t >= 0 && t < vocab ? t : 0;
}

}  // namespace gollm

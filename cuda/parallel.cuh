// parallel.cuh — the kernels tensor parallelism adds: a rank's share of the token
// embedding (its vocabulary rows), and the join of the LM head's all-gathered rows into
// whole-vocabulary logits. The collectives themselves are NCCL's (comm.cu).
#pragma once
#include "common.cuh"

namespace gollm {

// embedding_shard_kernel: one block per token row r. h[r] = this rank's share of the
// token's embedding — wte[token - first] when the token is one of the rank's rows [first,
// first + rows), else zero — plus wpe[position] when wpe is given (rank 0 alone). The
// all-reduce that follows adds the ranks' shares: exactly one rank holds each token, so
// the sum is the embedding the model has on one GPU, to the bit.
//   tokens, positions: [n] int32; wte: [rows][hidden] T; wpe: [max_positions][hidden] T or
//   null; h: [n][hidden] fp32
//   kScale: the row times scale, as embedding_layernorm_kernel's
template <typename T, bool kScale = false>
__global__ void embedding_shard_kernel(const int32_t* __restrict__ tokens,
                                       const int32_t* __restrict__ positions,
                                       const T* __restrict__ wte, const T* __restrict__ wpe,
                                       float* __restrict__ h, int hidden, int first, int rows,
                                       float scale) {
  griddep_launch();
  griddep_wait();
  const int r = blockIdx.x;
  const int t = tokens[r] - first;
  const bool mine = t >= 0 && t < rows;
  const T* te = wte + (int64_t)(mine ? t : 0) * hidden;
  const T* pe = wpe ? wpe + (int64_t)positions[r] * hidden : nullptr;
  float* hr = h + (int64_t)r * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float v = mine ? to_f32(te[c]) : 0.f;
    if constexpr (kScale) v = embed_scaled<T>(v, scale);
    hr[c] = v + (pe ? to_f32(pe[c]) : 0.f);
  }
}

// embedding_shard launches the kernel, with the scale where scale > 0.
template <typename T>
void embedding_shard(const int32_t* tokens, const int32_t* positions, const T* wte, const T* wpe,
                     float* h, int n, int hidden, int first, int rows, Stream stream,
                     float scale = 0.f) {
  if (n == 0) return;
  launch("embedding_shard_kernel",
         scale > 0.f ? embedding_shard_kernel<T, true> : embedding_shard_kernel<T, false>, n, 256, 0,
         stream, tokens, positions, wte, wpe, h, hidden, first, rows, scale);
}

// join_vocab_kernel: grid (rows, ranks). Rank k's all-gathered logits of vocabulary rows
// [k·vr, (k+1)·vr) go to their columns of the whole-vocabulary rows; the last rank's rows
// past the vocabulary (its padding) are dropped.
//   gathered: [ranks][rows][vr] fp32; logits: [rows][vocab] fp32
__global__ void join_vocab_kernel(const float* __restrict__ gathered, float* __restrict__ logits,
                                  int rows, int vr, int vocab) {
  griddep_launch();
  griddep_wait();
  const int i = blockIdx.x, k = blockIdx.y;
  const float* src = gathered + ((int64_t)k * rows + i) * vr;
  float* dst = logits + (int64_t)i * vocab + (int64_t)k * vr;
  const int n = min(vr, vocab - k * vr);
  for (int j = threadIdx.x; j < n; j += blockDim.x) dst[j] = src[j];
}

inline void join_vocab(const float* gathered, float* logits, int rows, int vr, int vocab, int ranks,
                       Stream stream) {
  if (rows == 0) return;
  launch("join_vocab_kernel", join_vocab_kernel, dim3(rows, ranks), 256, 0, stream, gathered, logits,
         rows, vr, vocab);
}

}  // namespace gollm

// sizes.h — the launch shapes and limits that host code outside the kernels' files needs
// too (step planning, buffer sizing), so that it does not include the kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#ifdef __CUDACC__
#define GOLLM_HD __host__ __device__
#else
#define GOLLM_HD
#endif

namespace gollm {

// kFp8Group is the columns one scale of an FP8 weight covers in the arena (fp8.cuh).
constexpr int kFp8Group = 128;

// pow2_at_least is the smallest power of two not below v (1 for v <= 1): decode graphs'
// batch buckets and prompt graphs' padded counts.
inline int pow2_at_least(int v) {
  int b = 1;
  while (b < v) b <<= 1;
  return b;
}

// gemm_rows rounds a GEMM's row count up to one of a few sizes — 16, then eight a power-of-two
// octave, multiples of 16 — so that cuBLAS meets a bounded set of shapes. Its first call on
// a new shape costs milliseconds, and in-flight batching gives nearly every mixed
// prompt/decode step a new token count. The extra rows (at most an eighth) are computed
// from whatever the input buffer holds there and never read; buffers are sized for
// gemm_rows(max rows). create_engine's warm-up calls every size once.
inline int gemm_rows(int n) {
  if (n <= 16) return 16;
  int p = 16;
  while (p * 2 <= n) p *= 2;
  const int step = p / 8 > 16 ? p / 8 : 16;
  return (n + step - 1) / step * step;
}

// ctx_queries is the number of consecutive queries of one sequence a context-attention
// tile holds.
GOLLM_HD inline int ctx_queries(int head_dim) { return head_dim <= 128 ? 16 : 8; }

// kDecodeMinPart is the fewest positions a split of decode attention covers.
constexpr int kDecodeMinPart = 256;

// decode_splits chooses decode attention's splits per row and head: enough blocks for a
// few per SM.
inline int decode_splits(int rows, int heads, int sms, int max_len) {
  int want = (4 * sms + rows * heads - 1) / (rows * heads);
  int most = (max_len + kDecodeMinPart - 1) / kDecodeMinPart;
  return std::max(1, std::min({want, most, 16}));
}

// gqa_group is how many query heads a block of grouped decode attention holds for G heads
// per KV head: G rounded up to a power of two, at most kGqaMaxGroup (more take several
// blocks).
// GOLLM_GQA_GROUP (-D at build time) builds smaller groups to measure (bench/libab.sh).
// 8: bench/results/2026-11-27-inplace-h100.jsonl.
#ifndef GOLLM_GQA_GROUP
#define GOLLM_GQA_GROUP 8
#endif
constexpr int kGqaMaxGroup = GOLLM_GQA_GROUP;
inline int gqa_group(int G) { return G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : kGqaMaxGroup; }

// gqa_decode_fits says whether grouped decode attention (attention_decode_gqa) takes
// head_dim: its lanes split a row into 16-byte pieces, a power of two of them, 2 to 32.
inline bool gqa_decode_fits(int head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

// lm_head_ld is the row stride of the LM head's cuBLAS output for vocab rows: a multiple
// of 4 floats, so that every row is 16-byte aligned.
inline int lm_head_ld(int vocab) { return (vocab + 3) / 4 * 4; }

// kGemvMaxRows is the most token rows the gemv kernels take.
constexpr int kGemvMaxRows = 8;
// kFusedRows is the most token rows of a fused decode step (fused.cuh): each row
// multiplies its atomics.
constexpr int kFusedRows = 4;
// kGreedySplits is the most slices greedy sampling splits a row into; greedy_splits how
// many a step of count rows takes: about four blocks a multiprocessor in all, so that a
// batch of 64 is not 4,096 blocks of a few loads each.
// 4 a multiprocessor: bench/results/2026-11-26-latency-h100.jsonl.
constexpr int kGreedySplits = 64;
inline int greedy_splits(int count, int sms) {
  return std::max(1, std::min(kGreedySplits, (4 * sms + count - 1) / std::max(count, 1)));
}

// The tiled projections (tiled.cuh): steps of up to kTileMaxRows token rows beyond the
// streaming gemv's, on the tensor cores. A block holds kTileSlots · nt weight rows over a
// split of the reduction, streamed in stages of kTileChunks chunks of 32 columns.
constexpr int kTileSlots = 64;
constexpr int kTileMaxRows = 64;
constexpr int kTileChunks = 8;

// TileShape is how a tiled launch splits its work: tiles of kTileSlots · nt weight rows,
// each over splits parts of the reduction of kc chunks (the last may have fewer).
struct TileShape {
  int tiles, splits, kc, nt;
};

// tile_shape splits a projection reading wrows weight rows of in columns: tiles of 128
// rows where there are enough of them to fill a quarter of the blocks (each input row
// then serves twice the weights), else of 64; the reduction split until the launch has
// about blocks blocks — each block's stages are the bytes it has in flight, but each split
// adds its sums to the merge.
inline TileShape tile_shape(int64_t wrows, int in, int blocks) {
  const int chunks = in / 32;
  const int nt = (wrows + 2 * kTileSlots - 1) / (2 * kTileSlots) >= std::max(blocks / 4, 1) ? 2 : 1;
  const int tiles = (int)((wrows + kTileSlots * nt - 1) / (kTileSlots * nt));
  const int s = std::max(1, std::min((blocks + tiles - 1) / tiles, chunks));
  const int kc = (chunks + s - 1) / s;
  return TileShape{tiles, (chunks + kc - 1) / kc, kc, nt};
}

// tile_part_floats is the space a tiled launch of shape s needs for its splits' partial
// sums ([tile][split][kTileMaxRows][kTileSlots · nt] fp32).
inline size_t tile_part_floats(const TileShape& s) {
  return s.splits > 1 ? (size_t)s.tiles * s.splits * kTileMaxRows * kTileSlots * s.nt : 0;
}

// tiled_fits says whether the tiled kernels take n rows of a projection of width in.
inline bool tiled_fits(int n, int in) { return n >= 1 && n <= kTileMaxRows && in > 0 && in % 32 == 0; }

}  // namespace gollm

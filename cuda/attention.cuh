// attention.cuh — writing keys and values into the paged KV pool, and causal attention
// over it: a tiled kernel for prompt chunks (context phase) and a split-K kernel for one
// query per sequence (generation phase).
#pragma once
#include <mma.h>

#include "common.cuh"

namespace gollm {

// qkv_kv_write_kernel: the QKV GEMM's epilogue without rotary positions. Grid (n,
// ceil(qkv_width / 4 / 256)), 256 threads; a thread takes 4 consecutive elements of row
// blockIdx.x (16-byte loads and 8-byte pool stores: head_dim is a multiple of 8, which
// engine creation enforces, so the four never straddle a head or the q/k/v parts).
//   qkv:  [n][qkv_width] fp32 from the QKV GEMM, queries then keys then values; bias
//         [qkv_width] fp32 (or null) is added here, and the queries are scaled by the
//         attention's scale (1/sqrt(head_dim)) in place for the attention kernels.
//   keys and values go to the pool at the row's position: block blocks[seq.blk_off + pos/T],
//   slot pos%T, page geom.page(block, layer, 0|1, kv head), [slot][head_dim] within it —
//   in T, or as FP8 codes (kv_put4; 4-byte stores) where geom.fp8.
// The bias and the row's block-table lookups come before the wait for the GEMM.
template <typename T>
__global__ void qkv_kv_write_kernel(float* __restrict__ qkv, const float* __restrict__ bias,
                                    void* __restrict__ kv, const int32_t* __restrict__ row_pos,
                                    const int32_t* __restrict__ row_seq,
                                    const DevSeq* __restrict__ seqs,
                                    const int32_t* __restrict__ blocks, KVGeom g, int layer,
                                    float scale) {
  griddep_launch();
  const int r = blockIdx.x, width = g.qkv_width();
  const int c = 4 * (blockIdx.y * blockDim.x + threadIdx.x);
  if (c >= width) return;
  const float4 b = bias ? *reinterpret_cast<const float4*>(bias + c) : make_float4(0.f, 0.f, 0.f, 0.f);
  const int pos = row_pos[r];
  const int64_t block = blocks[seqs[row_seq[r]].blk_off + pos / g.tokens_per_block];
  griddep_wait();
  float4* rp = reinterpret_cast<float4*>(qkv + (int64_t)r * width + c);
  float4 v = *rp;
  v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
  if (c < g.q_width()) {
    *rp = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
    return;
  }
  kv_put4<T>(kv, g.at(block, layer, 0, 0, pos % g.tokens_per_block) + g.kv_col(c), v.x, v.y, v.z,
             v.w, g, g.kv_kind(c));
}

// qkv_rope_write_kernel: the QKV epilogue with rotary positions. Grid (n, heads + 2 ·
// kv_heads): a block of kRopeThreads threads per row blockIdx.x and head blockIdx.y of the
// QKV row (query heads, then key heads, then value heads), so that a decode row spreads
// over the GPU instead of one block walking the whole row. In a query or key head a thread
// takes a dimension pair (i, i + rope_dim/2) at a time (rotate_half's pairing), rotated by
// the angle inv_freq[i] · pos computed in fp32 as transformers does, then cos and sin;
// dimensions past rope_dim and the value heads pass unrotated.
//   qkv:  [n][qkv_width] fp32, bias [qkv_width] fp32 or null added first; the rotated,
//         scaled queries are written back in place; keys and values go to the pool as in
//         qkv_kv_write_kernel.
//   inv_freq: [rope_dim/2] fp32.
constexpr int kRopeThreads = 64;
template <typename T>
__global__ void __launch_bounds__(kRopeThreads) qkv_rope_write_kernel(
    float* __restrict__ qkv, const float* __restrict__ bias, void* __restrict__ kv,
    const int32_t* __restrict__ row_pos, const int32_t* __restrict__ row_seq,
    const DevSeq* __restrict__ seqs, const int32_t* __restrict__ blocks, KVGeom g, int layer,
    float scale, const float* __restrict__ inv_freq, int rope_dim) {
  griddep_launch();
  const int r = blockIdx.x, h = blockIdx.y, D = g.head_dim, half = rope_dim / 2;
  const int pos = row_pos[r];
  const int64_t base =
      g.at(blocks[seqs[row_seq[r]].blk_off + pos / g.tokens_per_block], layer, 0, 0,
           pos % g.tokens_per_block);
  griddep_wait();
  float* row = qkv + (int64_t)r * g.qkv_width();
  const int c0 = h * D;
  const bool query = h < g.heads, rotated = h < g.heads + g.kv_heads;
  auto put = [&](int c, float v) {
    if (query)
      row[c] = v * scale;
    else
      kv_put<T>(kv, base + g.kv_col(c), v, g, rotated ? 0 : 1);
  };
  if (rotated) {
    for (int i = threadIdx.x; i < half; i += kRopeThreads) {
      float a = row[c0 + i], b = row[c0 + i + half];
      if (bias) a += bias[c0 + i], b += bias[c0 + i + half];
      const float2 x = rotate_pair(a, b, inv_freq[i], pos);
      put(c0 + i, x.x);
      put(c0 + i + half, x.y);
    }
  }
  for (int d = (rotated ? rope_dim : 0) + threadIdx.x; d < D; d += kRopeThreads)
    put(c0 + d, row[c0 + d] + (bias ? bias[c0 + d] : 0.f));
}

// qkv_rope_heads_kernel: qkv_rope_write_kernel's arithmetic, bit for bit, for many rows.
// Grid (n, S): block (r, s) takes heads [s·hb, min((s + 1)·hb, H)) of row r, H = heads + 2 ·
// kv_heads, its row's position and pool slot looked up once. A thread takes four pairs
// (4j + t, 4j + t + rope_dim/2), t < 4, j = threadIdx.x mod Q, Q = rope_dim / 8, in every
// rotated head of the block threadIdx.x / Q, + blockDim.x / Q, …, so that it computes its
// eight sines and cosines once, before the wait; then the unrotated dimensions and value
// heads, four at a time. blockDim.x is a multiple of Q; 16-byte loads of qkv and bias
// (rope_dim a multiple of 8, head_dim of 4), 16-byte query and 8- or 4-byte pool stores.
template <typename T>
__global__ void __launch_bounds__(128) qkv_rope_heads_kernel(
    float* __restrict__ qkv, const float* __restrict__ bias, void* __restrict__ kv,
    const int32_t* __restrict__ row_pos, const int32_t* __restrict__ row_seq,
    const DevSeq* __restrict__ seqs, const int32_t* __restrict__ blocks, KVGeom g, int layer,
    float scale, const float* __restrict__ inv_freq, int rope_dim, int hb) {
  griddep_launch();
  const int r = blockIdx.x, D = g.head_dim, half = rope_dim / 2, Q = rope_dim / 8;
  const int H = g.heads + 2 * g.kv_heads, rot_end = g.heads + g.kv_heads;
  const int h0 = blockIdx.y * hb, h1 = min(h0 + hb, H);
  const int pos = row_pos[r];
  const int64_t base =
      g.at(blocks[seqs[row_seq[r]].blk_off + pos / g.tokens_per_block], layer, 0, 0,
           pos % g.tokens_per_block);
  const int j = threadIdx.x % Q, i0 = 4 * j;
  float cs[4], sn[4];
#pragma unroll
  for (int t = 0; t < 4; t++) sincosf(inv_freq[i0 + t] * (float)pos, &sn[t], &cs[t]);
  griddep_wait();
  float* row = qkv + (int64_t)r * g.qkv_width();
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  auto ld = [](const float* p) { return *reinterpret_cast<const float4*>(p); };
  // Rotated pairs of the block's query and key heads.
  const int r1 = min(h1, rot_end);
  for (int h = h0 + (int)threadIdx.x / Q; h < r1; h += blockDim.x / Q) {
    const int c = h * D + i0;
    float4 a = ld(row + c), b = ld(row + c + half);
    if (bias) {
      const float4 ba = ld(bias + c), bb = ld(bias + c + half);
      a.x += ba.x, a.y += ba.y, a.z += ba.z, a.w += ba.w;
      b.x += bb.x, b.y += bb.y, b.z += bb.z, b.w += bb.w;
    }
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
    float x0[4], x1[4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
      const float2 x = rotate_cs(av[t], bv[t], cs[t], sn[t]);
      x0[t] = x.x, x1[t] = x.y;
    }
    if (h < g.heads) {
      *reinterpret_cast<float4*>(row + c) = make_float4(x0[0] * scale, x0[1] * scale, x0[2] * scale, x0[3] * scale);
      *reinterpret_cast<float4*>(row + c + half) =
          make_float4(x1[0] * scale, x1[1] * scale, x1[2] * scale, x1[3] * scale);
    } else {
      kv_put4<T>(kv, base + g.kv_col(c), x0[0], x0[1], x0[2], x0[3], g, 0);
      kv_put4<T>(kv, base + g.kv_col(c + half), x1[0], x1[1], x1[2], x1[3], g, 0);
    }
  }
  // Four unrotated elements at a time: dimensions rope_dim… of rotated heads, then whole
  // value heads.
  const int qr = (D - rope_dim) / 4, qv = D / 4;
  const int nr = max(r1 - h0, 0), vr0 = max(h0, rot_end);
  const int units = nr * qr + max(h1 - vr0, 0) * qv;
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    int h, d;
    if (u < nr * qr)
      h = h0 + u / qr, d = rope_dim + 4 * (u % qr);
    else
      h = vr0 + (u - nr * qr) / qv, d = 4 * ((u - nr * qr) % qv);
    const int c = h * D + d;
    float4 v = ld(row + c);
    const float4 b = bias ? ld(bias + c) : zero;
    v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
    if (h < g.heads)
      *reinterpret_cast<float4*>(row + c) = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
    else
      kv_put4<T>(kv, base + g.kv_col(c), v.x, v.y, v.z, v.w, g, h < rot_end ? 0 : 1);
  }
}

// qkv_kv_write is the QKV epilogue as a kernel of its own: bias, queries times scale,
// rotary over rope_dim dimensions of each head where inv_freq is given, the KV write.
// Rows with rotary go a row (and share of its heads) a block where rope_dim allows the
// four-pair layout: one block a row and head spent most of its time looking the row up
// (bench/results/2026-11-28-ropeheads-h200.jsonl).
template <typename T>
void qkv_kv_write(float* qkv, const float* bias, void* kv, const int32_t* row_pos,
                  const int32_t* row_seq, const DevSeq* seqs, const int32_t* blocks, KVGeom g,
                  int layer, int n, const float* inv_freq, int rope_dim, float scale,
                  Stream stream) {
  if (n == 0) return;
  const int H = g.heads + 2 * g.kv_heads;
  // head_dim is a multiple of 8 up to 256 (weights.cu), so Q = rope_dim / 8 ≤ 32 divides
  // a block of at most 128 threads.
  if (inv_freq && rope_dim % 8 == 0) {
    // About a thousand blocks: few rows split their heads, many take them whole.
    const int S = std::min(H, std::max(1, (1024 + n - 1) / n)), hb = (H + S - 1) / S;
    const int Q = rope_dim / 8, threads = Q * std::max(1, 128 / Q);
    launch("qkv_rope_heads_kernel", qkv_rope_heads_kernel<T>, dim3(n, (H + hb - 1) / hb), threads, 0, stream, qkv,
           bias, kv, row_pos, row_seq, seqs, blocks, g, layer, scale, inv_freq, rope_dim, hb);
    return;
  }
  if (inv_freq) {
    launch("qkv_rope_write_kernel", qkv_rope_write_kernel<T>, dim3(n, H),
           kRopeThreads, 0, stream, qkv, bias, kv, row_pos, row_seq, seqs, blocks, g, layer, scale,
           inv_freq, rope_dim);
    return;
  }
  launch("qkv_kv_write_kernel", qkv_kv_write_kernel<T>, dim3(n, (g.qkv_width() / 4 + 255) / 256),
         256, 0, stream, qkv, bias, kv, row_pos, row_seq, seqs, blocks, g, layer, scale);
}

// Decode attention: one query row per sequence (its single new token), attending to the
// positions 0..pos of its sequence (the last window of them in a layer with a sliding
// window), through its query head's KV head. Grid (rows, heads, splits): a row of length len uses
// parts = min(splits, ceil(len / kDecodeMinPart)) of them (kDecodeShortPart in the kShort
// layout of small grids: decode_attend), each covering an equal share
// of its positions, so short rows take one block and long ones spread over the GPU;
// blocks past a row's parts exit at once. With one active
// part the block writes the output; with several, each writes its partial (max, sum,
// unnormalised output) and the last to finish (an atomic ticket per row and head) merges
// them, so no second launch is needed. Block: kDecodeThreads threads. Scores: a thread per
// key, reading the key in 16-byte pieces; values: a thread per (key group, 8 dimensions),
// so a warp reads whole value rows.
//   qkv:  [N][qkv_width] fp32, queries pre-scaled
//   att:  [N][heads·head_dim] T output
//   dec_rows: [rows] token row of each decode query
//   partial: [rows][heads][parts][head_dim] fp32; part_ml: [rows][heads][parts][2] fp32
//   tickets: [rows][heads] int, zero between launches (the merging block resets its own)
// head_dim % 8 == 0. Dynamic shared memory: decode_smem(head_dim, part_len).
// A part of up to kDecodeMinPart = kDecodeThreads positions costs one round of key loads
// (a key per thread) and one of value loads (kDecodeVUnroll rows per group of 8 lanes at
// head_dim 64), so rows up to 256 long take one block and no merge.
// 256 and 256: bench/results/2026-11-21-gpu-h100.jsonl.
constexpr int kDecodeThreads = 256;
constexpr int kDecodeVUnroll = 8;  // value rows a thread group has in flight
// The kShort layout's: the fewest positions a part covers, and the keys a group of lanes
// has in flight (kDecodeShortKeys · kDecodeThreads / (head_dim / 8) positions a round:
// head_dim 256, 32 — one part of kDecodeShortPart).
constexpr int kDecodeShortPart = 32;
constexpr int kDecodeShortKeys = 4;

// decode_short_fits says whether the kShort layout takes head_dim: its groups of
// head_dim/8 lanes must tile a warp (a power of two, at most 32 pieces).
inline bool decode_short_fits(int head_dim) {
  const int d8 = head_dim / 8;
  return head_dim % 8 == 0 && d8 >= 1 && d8 <= 32 && (d8 & (d8 - 1)) == 0;
}

// decode_smem: part_len is the most positions one block may cover (max_positions).
inline size_t decode_smem(int head_dim, int part_len, int threads = kDecodeThreads) {
  int groups = threads / (head_dim / 8);
  return sizeof(float) * (head_dim + part_len + (size_t)groups * head_dim);
}


// merge_parts is dimension d of one (row, head)'s decode attention from its active splits,
// the same merge for both decode kernels: split p left its unnormalised output in
// partial[(pi + p)·D + d] and its maximum and sum of exponentials in part_ml[(pi + p)·2],
// [… + 1] (pi: the (row, head)'s first split). Read through L2 (other blocks wrote them).
__device__ __forceinline__ float merge_parts(const float* partial, const float* part_ml, int64_t pi,
                                             int active, int D, int d) {
  float M = -INFINITY;
  for (int p = 0; p < active; p++) M = fmaxf(M, __ldcg(part_ml + (pi + p) * 2));
  float S = 0.f, O = 0.f;
  for (int p = 0; p < active; p++) {
    const float f = __expf(__ldcg(part_ml + (pi + p) * 2) - M);
    S += __ldcg(part_ml + (pi + p) * 2 + 1) * f;
    O += __ldcg(partial + (pi + p) * D + d) * f;
  }
  return O / S;
}

// decode_attend is the work of one (row i, head, part) of attention_decode_kernel, for
// any block size that is a multiple of head_dim/8; smem as decode_smem says for it.
// It waits for the previous kernel (griddep_wait) itself: the step's indices and the keys
// and values of the positions before the newest (written by earlier steps, not by the
// QKV kernel this one follows) are loaded before the wait, so their round trips overlap
// that kernel. Only the query and the newest position's key and value are read after.
// kPre turns that prefetch on: it pays for small grids (decode at small batch, where the
// kernel is all latency) and costs occupancy (its registers) for large ones. kCap
// soft-caps the scores at ±softcap (softcap·tanh(s/softcap), Gemma 2's). kShort (with
// kPre; decode_short_fits(head_dim)) adds the short layout for small grids, which a row
// takes where its parts then need at most two rounds of keys each: its positions split
// into parts of kDecodeShortPart or more (not kDecodeMinPart), and the keys are read as
// the values are, a group of head_dim/8 lanes a position (a 16-byte piece a lane, the dot
// product summed over the group by shuffles), so that a part's first round of keys loads
// in one round trip — before the wait, but for the newest — at any head_dim, where a
// thread a key pays a round trip for each 8 of its pieces (head_dim 256: four).
template <typename T, typename K, bool kPre, bool kCap, bool kShort = false>
__device__ void decode_attend(const float* __restrict__ qkv, T* __restrict__ att,
                              const K* __restrict__ kv, const int32_t* __restrict__ dec_rows,
                              const int32_t* __restrict__ row_pos,
                              const int32_t* __restrict__ row_seq,
                              const DevSeq* __restrict__ seqs, const int32_t* __restrict__ blocks,
                              KVGeom g, int layer, int window, int max_len,
                              float* __restrict__ partial, float* __restrict__ part_ml,
                              int* __restrict__ tickets, int i, int head, int part, int parts,
                              float* smem, float softcap) {
  using P = typename KVPiece<K>::type;  // 8 pool elements
  const int D = g.head_dim, D8 = D / 8;
  const int kvh = g.kv_head(head);
  const int r = dec_rows[i];
  const int len = row_pos[r] + 1;
  const int lo = window > 0 ? max(0, len - window) : 0;  // the first position attended
  const int groups = blockDim.x / D8;
  // kShort: the short layout where a part of it takes at most two rounds of keys (its
  // rounds are short: kDecodeShortKeys · groups positions); longer rows take the
  // thread-a-key layout, whose rounds are a block's worth of keys. The row's length
  // alone decides, so every block of a row and head agrees.
  bool brief = false;
  if constexpr (kShort) {
    const int n = len - lo, a = min(parts, (n + kDecodeShortPart - 1) / kDecodeShortPart);
    brief = (n + a - 1) / a <= 2 * kDecodeShortKeys * groups;
  }
  const int min_part = brief ? kDecodeShortPart : kDecodeMinPart;
  const int active = min(parts, (len - lo + min_part - 1) / min_part);
  if (part >= active) return;
  const int share = (len - lo + active - 1) / active;
  const int start = lo + part * share;
  const int end = min(len, start + share);
  const int32_t* table = blocks + seqs[row_seq[r]].blk_off;
  const int T_ = g.tokens_per_block;

  float* q = smem;            // [D]
  float* s = q + D;           // [part_len]
  float* red = s + max_len;   // [groups][D]
  __shared__ float stat[32];
  const int newest = len - 1;  // the position the previous kernel wrote
  // kv_row: position j's key (kind 0) or value (kind 1) for this head, in pieces of 8
  // elements (16 bytes of T, 8 of an FP8 pool).
  auto kv_row = [&](int kind, int64_t blk, int j) {
    return reinterpret_cast<const P*>(kv + g.at(blk, layer, kind, kvh, j % T_));
  };

  // Before the wait: this thread's first key (its first 8 pieces) and its value group's
  // first kDecodeVUnroll value pieces, where they are older than the newest position.
  const int jk = start + threadIdx.x;
  const bool kpre = kPre && !brief && jk < end && jk < newest;
  const int grp = threadIdx.x / D8, c = threadIdx.x % D8;
  P kfirst[8];
  if (kpre) {
    const P* k = kv_row(0, table[jk / T_], jk);
#pragma unroll
    for (int u = 0; u < 8; u++) kfirst[u] = k[min(u, D8 - 1)];
  }
  // kShort: the newest position's block, so that its key and value load right after the
  // wait, beside the query (one round trip for all three).
  const int64_t nblk = brief ? table[newest / T_] : 0;
  if (brief) {
    // This group's first kDecodeShortKeys keys, piece c (positions clamped as below).
#pragma unroll
    for (int u = 0; u < kDecodeShortKeys; u++) {
      const int j = min(start + grp + u * groups, end - 1);
      if (j < newest) kfirst[u] = kv_row(0, table[j / T_], j)[c];
    }
  }
  P vfirst[kDecodeVUnroll];
  if (kPre && grp < groups) {
#pragma unroll
    for (int u = 0; u < kDecodeVUnroll; u++) {
      const int j = min(start + grp + u * groups, end - 1);
      if (j < newest) vfirst[u] = kv_row(1, table[j / T_], j)[c];
    }
  }
  griddep_wait();
  if (brief) {
    // The first round's keys and values at the newest position (clamped positions past
    // it are the newest too), from the previous kernel.
#pragma unroll
    for (int u = 0; u < kDecodeShortKeys; u++)
      if (min(start + grp + u * groups, end - 1) >= newest) kfirst[u] = kv_row(0, nblk, newest)[c];
#pragma unroll
    for (int u = 0; u < kDecodeVUnroll; u++)
      if (min(start + grp + u * groups, end - 1) >= newest) vfirst[u] = kv_row(1, nblk, newest)[c];
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x)
    q[d] = kv_qscale<K>(qkv[(int64_t)r * g.qkv_width() + head * D + d], g);
  __syncthreads();

  // Each thread's key row is loaded in pieces of up to 8 16-byte loads issued together,
  // so a row costs one memory round trip instead of one per piece (head_dim 64: one).
  float mx = -INFINITY;
  if (brief) {
    // kDecodeShortKeys positions a group per round, every thread through the same rounds
    // (the shuffles need whole warps): loads clamped to the part's last position, scores
    // past it dropped.
    for (int j0 = start; j0 < end; j0 += kDecodeShortKeys * groups) {
      P kk[kDecodeShortKeys];
#pragma unroll
      for (int u = 0; u < kDecodeShortKeys; u++) {
        const int j = min(j0 + grp + u * groups, end - 1);
        if (j0 == start)
          kk[u] = kfirst[u];  // loaded before the wait (the newest: just after)
        else
          kk[u] = kv_row(0, table[j / T_], j)[c];
      }
      float qc[8];
#pragma unroll
      for (int e = 0; e < 8; e++) qc[e] = q[c * 8 + e];
#pragma unroll
      for (int u = 0; u < kDecodeShortKeys; u++) {
        float kf[8];
        kv_f32x8<K>(kk[u], kf);
        float acc = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) acc = fmaf(qc[e], kf[e], acc);
        for (int o = 1; o < D8; o <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if constexpr (kCap) acc = softcap * tanhf(acc / softcap);
        const int j = j0 + grp + u * groups;
        if (j < end) {
          if (c == 0) s[j - start] = acc;
          mx = fmaxf(mx, acc);
        }
      }
    }
  }
  for (int j = brief ? end : jk; j < end; j += blockDim.x) {
    const P* k = kv_row(0, table[j / T_], j);
    float acc = 0.f;
    for (int c0 = 0; c0 < D8; c0 += 8) {
      P kk[8];
      if (c0 == 0 && j == jk && kpre) {
#pragma unroll
        for (int u = 0; u < 8; u++) kk[u] = kfirst[u];
      } else {
#pragma unroll
        for (int u = 0; u < 8; u++) kk[u] = k[min(c0 + u, D8 - 1)];
      }
#pragma unroll
      for (int u = 0; u < 8; u++) {
        if (c0 + u >= D8) break;
        float kf[8];
        kv_f32x8<K>(kk[u], kf);
        const float* qc = q + (c0 + u) * 8;
#pragma unroll
        for (int e = 0; e < 8; e++) acc = fmaf(qc[e], kf[e], acc);
      }
    }
    if constexpr (kCap) acc = softcap * tanhf(acc / softcap);
    s[j - start] = acc;
    mx = fmaxf(mx, acc);
  }
  mx = block_max(mx, stat);
  float sum = 0.f;
  for (int j = threadIdx.x; j < end - start; j += blockDim.x) {
    float p = __expf(s[j] - mx);
    s[j] = p;
    sum += p;
  }
  sum = block_sum(sum, stat);  // its barriers also publish s

  float acc[8] = {};
  if (grp < groups) {
    // kDecodeVUnroll keys per group in flight: their block-table entries, then their value
    // pieces, are loaded together, so a group pays a round trip per kDecodeVUnroll keys.
    for (int j0 = start + grp; j0 < end; j0 += kDecodeVUnroll * groups) {
      // Indices clamped, so every load is issued unconditionally (no branch between
      // them): first the block-table entries, then the value pieces; keys past the end
      // weigh 0.
      P v8[kDecodeVUnroll];
      float p[kDecodeVUnroll];
      int64_t blk[kDecodeVUnroll];
#pragma unroll
      for (int u = 0; u < kDecodeVUnroll; u++) blk[u] = table[min(j0 + u * groups, end - 1) / T_];
#pragma unroll
      for (int u = 0; u < kDecodeVUnroll; u++) {
        const int j = min(j0 + u * groups, end - 1);
        if (kPre && j0 == start + grp && (brief || j < newest))
          v8[u] = vfirst[u];  // loaded before the wait
        else
          v8[u] = kv_row(1, blk[u], j)[c];
        p[u] = s[j - start];
        if (j0 + u * groups >= end) p[u] = 0.f;
      }
#pragma unroll
      for (int u = 0; u < kDecodeVUnroll; u++) {
        float vf[8];
        kv_f32x8<K>(v8[u], vf);
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] = fmaf(p[u], vf[e], acc[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < 8; e++) red[grp * D + c * 8 + e] = acc[e];
  }
  __syncthreads();
  T* out = att + (int64_t)r * g.q_width() + head * D;
  if (active == 1) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float o = 0.f;
      for (int w = 0; w < groups; w++) o += red[w * D + d];
      out[d] = from_f32<T>(kv_vscale<K>(o / sum, g));
    }
    return;
  }
  int64_t pi = ((int64_t)i * g.heads + head) * parts;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < groups; w++) o += red[w * D + d];
    partial[(pi + part) * D + d] = o;
  }
  if (threadIdx.x == 0) {
    part_ml[(pi + part) * 2] = mx;
    part_ml[(pi + part) * 2 + 1] = sum;
  }
  if (!last_block_of(tickets + (int64_t)i * g.heads + head, active)) return;
  for (int d = threadIdx.x; d < D; d += blockDim.x)
    out[d] = from_f32<T>(kv_vscale<K>(merge_parts(partial, part_ml, pi, active, D, d), g));
}

// Two blocks a multiprocessor (at most 128 registers a thread): decode_splits sizes a
// small step's grid at up to four blocks a multiprocessor, and at one block resident a
// batch-1 step's grid runs in two waves. Templated on the pool's type, the short layout
// otherwise took 171 registers.
template <typename T, typename K, bool kPre, bool kCap = false, bool kShort = false>
__global__ void __launch_bounds__(kDecodeThreads, 2) attention_decode_kernel(
    const float* __restrict__ qkv, T* __restrict__ att, const K* __restrict__ kv,
    const int32_t* __restrict__ dec_rows, const int32_t* __restrict__ row_pos,
    const int32_t* __restrict__ row_seq, const DevSeq* __restrict__ seqs,
    const int32_t* __restrict__ blocks, KVGeom g, int layer, int window, int max_len,
    float* __restrict__ partial, float* __restrict__ part_ml, int* __restrict__ tickets,
    float softcap) {
  extern __shared__ float smem[];
  griddep_launch();  // decode_attend waits for the previous kernel itself
  decode_attend<T, K, kPre, kCap, kShort>(qkv, att, kv, dec_rows, row_pos, row_seq, seqs, blocks, g, layer,
                               window, max_len, partial, part_ml, tickets, blockIdx.x, blockIdx.y,
                               blockIdx.z, gridDim.z, smem, softcap);
}

template <typename T, typename K>
void attention_decode(const float* qkv, T* att, const K* kv, const int32_t* dec_rows,
                      const int32_t* row_pos, const int32_t* row_seq, const DevSeq* seqs,
                      const int32_t* blocks, KVGeom g, int layer, int window, int rows,
                      int splits, int max_len, float* partial, float* part_ml, int* tickets,
                      bool prefetch, Stream stream) {
  if (rows == 0) return;
  dim3 grid(rows, g.heads, splits);
  auto k = !prefetch                       ? attention_decode_kernel<T, K, false>
           : decode_short_fits(g.head_dim) ? attention_decode_kernel<T, K, true, false, true>
                                           : attention_decode_kernel<T, K, true>;
  launch("attention_decode_kernel", k, grid, kDecodeThreads, decode_smem(g.head_dim, max_len),
         stream, qkv, att, kv, dec_rows, row_pos, row_seq, seqs, blocks, g, layer, window, max_len,
         partial, part_ml, tickets, 0.f);
}

// Grouped decode attention: the decode attention of attention_decode_kernel, with one
// block for all the query heads that share a KV head (up to GB of them; more take several
// blocks), so each key and value is read once per step rather than once per query head,
// and with a single pass over the positions (an online softmax per warp) in which a
// warp's keys and values are loaded together, so a chunk of 32 positions costs one
// memory round trip instead of the three dependent phases of the per-head kernel.
// Grid (rows, kv_heads · slices, parts), slices = ceil(G / GB) for G = heads / kv_heads;
// kGqaThreads threads. A row's positions split into min(cap, ceil(len / kGqaMinPart))
// equal parts — its length and the engine's cap alone decide them, not the grid —, block z
// taking parts z, z + parts, …; the parts are merged in order by the last block to finish,
// as attention_decode_kernel does (the same partial, part_ml and tickets arrays, cap parts
// a row and head). Warp w takes the chunks of 32
// positions w, w + kGqaWarps, …: lane l scores position j0 + l against the block's
// queries (each key read whole by its lane, D/8 16-byte pieces), then the warp reads the
// chunk's value rows, 32/(D/8) rows a load (lane l: row l / (D/8), piece l % (D/8)),
// weighting them by the probabilities it left in shared memory. The warps' (max, sum,
// output) are merged last. D is a power of two, 16…256 (256: a value row a load, a lane
// its 16-byte piece).
//   qkv: [N][qkv_width] fp32, queries pre-scaled; att: [N][heads·D] T.
// GOLLM_GQA_WARPS (-D at build time) builds other block sizes to measure (bench/libab.sh).
// 4 warps: bench/results/2026-11-27-inplace-h100.jsonl.
#ifndef GOLLM_GQA_WARPS
#define GOLLM_GQA_WARPS 4
#endif
constexpr int kGqaWarps = GOLLM_GQA_WARPS;
constexpr int kGqaThreads = 32 * kGqaWarps;
constexpr int kGqaMinPart = 32 * kGqaWarps;  // a chunk for every warp


// warp_merge merges W warps' online-softmax partials of head gg, dimension d — each
// warp's max wm, sum wl and output wo (a warp with no positions: max -inf, sum 0) — into
// (M, L, O) at their common max.
template <int W, int GB, int D>
__device__ __forceinline__ void warp_merge(const float (&wm)[W][GB], const float (&wl)[W][GB],
                                           const float (&wo)[W][GB][D], int gg, int d, float& M, float& L,
                                           float& O) {
  M = -INFINITY;
#pragma unroll
  for (int w = 0; w < W; w++) M = fmaxf(M, wm[w][gg]);
  L = 0.f, O = 0.f;
#pragma unroll
  for (int w = 0; w < W; w++) {
    const float f = __expf(wm[w][gg] - M);
    L += wl[w][gg] * f;
    O += wo[w][gg][d] * f;
  }
}

template <typename T, typename K, int D, int GB>
__global__ void __launch_bounds__(kGqaThreads) attention_decode_gqa_kernel(
    const float* __restrict__ qkv, T* __restrict__ att, const K* __restrict__ kv,
    const int32_t* __restrict__ dec_rows, const int32_t* __restrict__ row_pos,
    const int32_t* __restrict__ row_seq, const DevSeq* __restrict__ seqs,
    const int32_t* __restrict__ blocks, KVGeom g, int layer, int window,
    float* __restrict__ partial, float* __restrict__ part_ml, int* __restrict__ tickets, int cap) {
  using P = typename KVPiece<K>::type;        // 8 pool elements (16 bytes of T, 8 of FP8)
  constexpr int D8 = D / 8;                   // pieces of a key or value row
  constexpr int KPL = 32 / D8;                // value rows a warp reads per load
  constexpr int PB = D8 < 8 ? D8 : 8;         // pieces loaded together
  static_assert(!kv_is_fp8<K> || PB % 2 == 0, "an FP8 key row loads two pieces at a time");
  __shared__ __align__(16) float qs[GB][D];   // the block's queries (zeros past nh)
  __shared__ float ps[kGqaWarps][GB][32];     // a chunk's probabilities, per warp
  __shared__ float wm[kGqaWarps][GB], wl[kGqaWarps][GB];
  __shared__ float wo[kGqaWarps][GB][D];
  griddep_launch();
  const int i = blockIdx.x, parts = cap;
  const int G = g.heads / g.kv_heads, slices = (G + GB - 1) / GB;
  const int kvh = blockIdx.y / slices;
  const int h0 = kvh * G + (blockIdx.y % slices) * GB;  // the block's first query head
  const int nh = min(GB, kvh * G + G - h0);
  const int r = dec_rows[i];
  const int len = row_pos[r] + 1;
  const int lo = window > 0 ? max(0, len - window) : 0;
  // A row's parts follow its length and cap alone; block z takes parts z, z + gridDim.z, …
  const int active = min(parts, (len - lo + kGqaMinPart - 1) / kGqaMinPart);
  if ((int)blockIdx.z >= active) return;  // part 0 always runs, so the grid still waits below
  const int share = (len - lo + active - 1) / active;
  const int32_t* table = blocks + seqs[row_seq[r]].blk_off;
  const int TB = g.tokens_per_block;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int vrow = lane / D8, vc = lane % D8;
  // The first chunk's block-table entry (the step's inputs, not the previous kernel's).
  int64_t blk = table[min(lo + (int)blockIdx.z * share + warp * 32 + lane, min(len, lo + ((int)blockIdx.z + 1) * share) - 1) / TB];
  griddep_wait();
  for (int t = threadIdx.x; t < GB * D; t += kGqaThreads) {
    const int gg = t / D;
    qs[gg][t % D] = gg < nh ? kv_qscale<K>(qkv[(int64_t)r * g.qkv_width() + (int64_t)h0 * D + t], g) : 0.f;
  }
  __syncthreads();

  for (int part = blockIdx.z; part < active; part += gridDim.z) {
    const int start = lo + part * share, end = min(len, start + share);
    if (part != (int)blockIdx.z) blk = table[min(start + warp * 32 + lane, end - 1) / TB];
    float m[GB], l[GB], acc[GB][8];
#pragma unroll
    for (int gg = 0; gg < GB; gg++) {
      m[gg] = -INFINITY, l[gg] = 0.f;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[gg][e] = 0.f;
    }
    const int64_t kstride = g.at(0, layer, 1, kvh, 0) - g.at(0, layer, 0, kvh, 0);  // K → V
    for (int j0 = start + warp * 32; j0 < end; j0 += kGqaWarps * 32) {
      const int jk = min(j0 + lane, end - 1);
      const int64_t kbase = g.at(blk, layer, 0, kvh, jk % TB);
      // The next chunk's table entry, while this one's keys and values load.
      const int jn = j0 + kGqaWarps * 32;
      if (jn < end) blk = table[min(jn + lane, end - 1) / TB];
      // Value rows of this chunk: row vrow + KPL·u sits at lane (vrow + KPL·u)'s key slot.
      P vv[PB];
#pragma unroll
      for (int u = 0; u < PB; u++) {
        const int64_t vb = __shfl_sync(0xffffffffu, kbase, vrow + KPL * u);
        vv[u] = reinterpret_cast<const P*>(kv + vb + kstride)[vc];
      }
      float s[GB];
#pragma unroll
      for (int gg = 0; gg < GB; gg++) s[gg] = 0.f;
      const P* kp = reinterpret_cast<const P*>(kv + kbase);
#pragma unroll
      for (int c0 = 0; c0 < D8; c0 += PB) {
        P kk[PB];
        if constexpr (kv_is_fp8<K>) {
          // Two pieces of codes a 16-byte load (PB is even: D ≥ 16; a key row starts at a
          // multiple of D bytes).
#pragma unroll
          for (int u = 0; u < PB; u += 2) {
            const uint4 x = reinterpret_cast<const uint4*>(kp + c0 + u)[0];
            kk[u] = make_uint2(x.x, x.y), kk[u + 1] = make_uint2(x.z, x.w);
          }
        } else {
#pragma unroll
          for (int u = 0; u < PB; u++) kk[u] = kp[c0 + u];
        }
#pragma unroll
        for (int u = 0; u < PB; u++) {
          float kf[8];
          kv_f32x8<K>(kk[u], kf);
#pragma unroll
          for (int gg = 0; gg < GB; gg++) {
            const float4 qa = *reinterpret_cast<const float4*>(&qs[gg][(c0 + u) * 8]);
            const float4 qb = *reinterpret_cast<const float4*>(&qs[gg][(c0 + u) * 8 + 4]);
            s[gg] = fmaf(qa.x, kf[0], s[gg]);
            s[gg] = fmaf(qa.y, kf[1], s[gg]);
            s[gg] = fmaf(qa.z, kf[2], s[gg]);
            s[gg] = fmaf(qa.w, kf[3], s[gg]);
            s[gg] = fmaf(qb.x, kf[4], s[gg]);
            s[gg] = fmaf(qb.y, kf[5], s[gg]);
            s[gg] = fmaf(qb.z, kf[6], s[gg]);
            s[gg] = fmaf(qb.w, kf[7], s[gg]);
          }
        }
      }
      const bool valid = j0 + lane < end;
      float sc[GB];
#pragma unroll
      for (int gg = 0; gg < GB; gg++) {
        const float sv = valid ? s[gg] : -INFINITY;
        const float mn = fmaxf(m[gg], warp_max(sv));  // finite: the chunk has a position
        sc[gg] = __expf(m[gg] - mn);
        const float p = __expf(sv - mn);
        l[gg] = l[gg] * sc[gg] + p;  // this lane's share; added over the warp at the end
        m[gg] = mn;
        ps[warp][gg][lane] = p;
      }
      __syncwarp();
#pragma unroll
      for (int gg = 0; gg < GB; gg++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[gg][e] *= sc[gg];
#pragma unroll
      for (int u0 = 0; u0 < D8; u0 += PB) {
        if (u0 > 0) {
#pragma unroll
          for (int u = 0; u < PB; u++) {
            const int64_t vb = __shfl_sync(0xffffffffu, kbase, vrow + KPL * (u0 + u));
            vv[u] = reinterpret_cast<const P*>(kv + vb + kstride)[vc];
          }
        }
#pragma unroll
        for (int u = 0; u < PB; u++) {
          const int row = vrow + KPL * (u0 + u);  // past the end: probability 0
          float vf[8];
          kv_f32x8<K>(vv[u], vf);
#pragma unroll
          for (int gg = 0; gg < GB; gg++) {
            const float p = ps[warp][gg][row];
#pragma unroll
            for (int e = 0; e < 8; e++) acc[gg][e] = fmaf(p, vf[e], acc[gg][e]);
          }
        }
      }
      __syncwarp();  // ps is rewritten by the next chunk
    }
    // The warp's totals: sums over its lanes, outputs over the lanes that share a piece.
#pragma unroll
    for (int gg = 0; gg < GB; gg++) {
      l[gg] = warp_sum(l[gg]);
#pragma unroll
      for (int o = D8; o < 32; o <<= 1)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[gg][e] += __shfl_xor_sync(0xffffffffu, acc[gg][e], o);
    }
    if (lane < D8) {
#pragma unroll
      for (int gg = 0; gg < GB; gg++)
#pragma unroll
        for (int e = 0; e < 8; e++) wo[warp][gg][lane * 8 + e] = acc[gg][e];
    }
    if (lane == 0) {
#pragma unroll
      for (int gg = 0; gg < GB; gg++) wm[warp][gg] = m[gg], wl[warp][gg] = l[gg];
    }
    __syncthreads();
    // Merge the warps (a warp with no chunk holds max -inf, sum 0).
    for (int t = threadIdx.x; t < nh * D; t += kGqaThreads) {
      const int gg = t / D, d = t % D, head = h0 + gg;
      float M, L, O;
      warp_merge(wm, wl, wo, gg, d, M, L, O);
      if (active == 1) {
        att[(int64_t)r * g.q_width() + (int64_t)head * D + d] = from_f32<T>(kv_vscale<K>(O / L, g));
      } else {
        const int64_t pi = ((int64_t)i * g.heads + head) * parts + part;
        partial[pi * D + d] = O;
        if (d == 0) part_ml[pi * 2] = M, part_ml[pi * 2 + 1] = L;
      }
    }
    __syncthreads();  // wo, wm and wl are rewritten by the next part
  }  // parts
  if (active == 1) return;
  // One ticket per (row, block of heads); min(gridDim.z, active) blocks arrive.
  if (!last_block_of(tickets + (int64_t)i * g.heads + h0, min((int)gridDim.z, active))) return;
  for (int t = threadIdx.x; t < nh * D; t += kGqaThreads) {
    const int gg = t / D, d = t % D, head = h0 + gg;
    const int64_t pi = ((int64_t)i * g.heads + head) * parts;
    att[(int64_t)r * g.q_width() + (int64_t)head * D + d] =
        from_f32<T>(kv_vscale<K>(merge_parts(partial, part_ml, pi, active, D, d), g));
  }
}

template <typename T, typename K, int D>
void attention_decode_gqa_d(const float* qkv, T* att, const K* kv, const int32_t* dec_rows,
                            const int32_t* row_pos, const int32_t* row_seq, const DevSeq* seqs,
                            const int32_t* blocks, KVGeom g, int layer, int window, int rows,
                            int parts, int cap, float* partial, float* part_ml, int* tickets,
                            Stream stream) {
  const int G = g.heads / g.kv_heads, GB = gqa_group(G);
  const dim3 grid(rows, g.kv_heads * ((G + GB - 1) / GB), parts);
#define GOLLM_GQA_LAUNCH(gb)                                                                   \
  launch("attention_decode_gqa_kernel", attention_decode_gqa_kernel<T, K, D, gb>, grid,         \
         kGqaThreads, 0, stream, qkv, att, kv, dec_rows, row_pos, row_seq, seqs, blocks, g, \
         layer, window, partial, part_ml, tickets, cap)
  switch (GB) {
    case 1: GOLLM_GQA_LAUNCH(1); break;
    case 2: GOLLM_GQA_LAUNCH(2); break;
    case 4: GOLLM_GQA_LAUNCH(4); break;
    default: GOLLM_GQA_LAUNCH(kGqaMaxGroup); break;
  }
#undef GOLLM_GQA_LAUNCH
}

// attention_decode_gqa runs the grouped kernel for head_dim D (gqa_decode_fits).
template <typename T, typename K>
void attention_decode_gqa(const float* qkv, T* att, const K* kv, const int32_t* dec_rows,
                          const int32_t* row_pos, const int32_t* row_seq, const DevSeq* seqs,
                          const int32_t* blocks, KVGeom g, int layer, int window, int rows,
                          int parts, int cap, float* partial, float* part_ml, int* tickets,
                          Stream stream) {
  if (rows == 0) return;
  switch (g.head_dim) {
    case 16:
      attention_decode_gqa_d<T, K, 16>(qkv, att, kv, dec_rows, row_pos, row_seq, seqs, blocks, g,
                                    layer, window, rows, parts, cap, partial, part_ml, tickets, stream);
      break;
    case 32:
      attention_decode_gqa_d<T, K, 32>(qkv, att, kv, dec_rows, row_pos, row_seq, seqs, blocks, g,
                                    layer, window, rows, parts, cap, partial, part_ml, tickets, stream);
      break;
    case 64:
      attention_decode_gqa_d<T, K, 64>(qkv, att, kv, dec_rows, row_pos, row_seq, seqs, blocks, g,
                                    layer, window, rows, parts, cap, partial, part_ml, tickets, stream);
      break;
    case 128:
      attention_decode_gqa_d<T, K, 128>(qkv, att, kv, dec_rows, row_pos, row_seq, seqs, blocks, g,
                                     layer, window, rows, parts, cap, partial, part_ml, tickets, stream);
      break;
    default:
      attention_decode_gqa_d<T, K, 256>(qkv, att, kv, dec_rows, row_pos, row_seq, seqs, blocks, g,
                                     layer, window, rows, parts, cap, partial, part_ml, tickets, stream);
      break;
  }
}

// Tensor-core decode attention for many rows: attention_decode_gqa_kernel's result (one
// part a row), its dot products and weighted sums on mma.sync m16n8k16 with fp32
// accumulators. Grid (rows, kv_heads), kTcWarps warps; warp w takes the tiles of 16
// positions w, w + kTcWarps, … of its row's [lo, len). M is the operands' type: fp16 over an
// FP8 pool (its codes exact in fp16, the queries times the key scale rounded to fp16), else T.
// Each operand goes from memory straight into its fragment registers by permuting the MMA's
// k and n indices, which sum and label alike on both sides (lane (g, t) = (lane / 4, lane % 4)):
//   scores S[pos][head] = K[pos][·] · q[head][·]: A = the tile's keys (rows pos), B = the
//     G ≤ 8 query heads (columns; zeros past G). In k-step s lane t's k pairs (2t, 2t+1) and
//     (2t + 8, 2t + 9) stand for dimensions D/4·t + 4s + (0, 1) and (2, 3): a lane reads one
//     contiguous quarter of its two key rows and of its query head, 16-byte loads.
//   output O[head][d] = P[head][pos] · V[pos][d]: A = P (rows = heads, 8 of 16 used), B = the
//     tile's values, k = pos permuted by σ (2t, 2t + 1, 2t + 8, 2t + 9 → 2t, 2t + 8, 2t + 1,
//     2t + 9) so that lane (g, t)'s probabilities come whole from two lanes of the scores'
//     layout (four shuffles), n = d = D/8·n + j for n-tile j: a lane reads one contiguous
//     eighth of its four value rows, and ends holding head g's dimensions D/8·2t + j and
//     D/8·(2t + 1) + j.
// The online softmax runs in fp32 on the scores' layout (heads 2t, 2t + 1 a lane); each tile's
// rescale reaches the output's layout (head g a lane) by shuffle. The warps merge as in the
// grouped kernel.
//   qkv: [N][qkv_width] fp32, queries pre-scaled; att: [N][heads·D] T.
constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;

// tc_decode_fits says whether attention_decode_tc takes a layer: head_dim 64 or 128, at most
// 8 query heads a KV head.
inline bool tc_decode_fits(const KVGeom& g) {
  return (g.head_dim == 64 || g.head_dim == 128) && g.kv_heads > 0 && g.heads % g.kv_heads == 0 &&
         g.heads / g.kv_heads <= 8;
}

// tc_load loads NB bytes (a multiple of 8) at p into w, 16 bytes a load where they divide.
template <int NB>
__device__ __forceinline__ void tc_load(const void* p, uint32_t (&w)[NB / 4]) {
  if constexpr (NB % 16 == 0) {
#pragma unroll
    for (int i = 0; i < NB / 16; i++) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < NB / 8; i++) {
      const uint2 v = reinterpret_cast<const uint2*>(p)[i];
      w[2 * i] = v.x, w[2 * i + 1] = v.y;
    }
  }
}

// tc_fp8_pair widens two e4m3 codes (the low 16 bits of c, the lower byte first) to an M pair.
template <typename M>
__device__ __forceinline__ uint32_t tc_fp8_pair(uint32_t c) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(c & 0xffffu), __NV_E4M3);
  uint32_t r;
  if constexpr (std::is_same<M, __half>::value) {
    memcpy(&r, &h, 4);
  } else {
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(__half2(h)));
    memcpy(&r, &b, 4);
  }
  return r;
}

template <typename T, typename K, int D>
__global__ void __launch_bounds__(kTcThreads) attention_decode_tc_kernel(
    const float* __restrict__ qkv, T* __restrict__ att, const K* __restrict__ kv,
    const int32_t* __restrict__ dec_rows, const int32_t* __restrict__ row_pos,
    const int32_t* __restrict__ row_seq, const DevSeq* __restrict__ seqs,
    const int32_t* __restrict__ blocks, KVGeom g, int layer, int window) {
  using M = typename std::conditional<kv_is_fp8<K>, __half, T>::type;
  constexpr int QD = D / 4;                 // dimensions a lane takes of a key row and its query
  constexpr int S = D / 16;                 // k-steps of the scores
  constexpr int VD = D / 8;                 // dimensions a lane takes of a value row; n-tiles
  constexpr int KB = QD * (int)sizeof(K);   // bytes of them
  constexpr int VB = VD * (int)sizeof(K);
  __shared__ float wm[kTcWarps][8], wl[kTcWarps][8];
  __shared__ float wo[kTcWarps][8][D];
  griddep_launch();
  const int i = blockIdx.x, kvh = blockIdx.y;
  const int G = g.heads / g.kv_heads, h0 = kvh * G;
  const int r = dec_rows[i];
  const int len = row_pos[r] + 1;
  const int lo = window > 0 ? max(0, len - window) : 0;
  const int32_t* table = blocks + seqs[row_seq[r]].blk_off;
  const int TB = g.tokens_per_block;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int64_t kstride = g.at(0, layer, 1, kvh, 0) - g.at(0, layer, 0, kvh, 0);  // K → V
  // The pool element of position p's key row (clamped into the row: masked positions read
  // real memory and weigh zero).
  auto key_at = [&](int p) {
    p = min(p, len - 1);
    return g.at(table[p / TB], layer, 0, kvh, p % TB);
  };
  griddep_wait();
  // Query head gq's quarter as B fragments.
  uint32_t qb[S][2];
  {
    const float* qr = qkv + (int64_t)r * g.qkv_width() + (int64_t)(h0 + gq) * D + QD * tq;
#pragma unroll
    for (int s = 0; s < S; s++) {
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (gq < G) v = *reinterpret_cast<const float4*>(qr + 4 * s);
      qb[s][0] = pack2<M>(kv_qscale<K>(v.x, g), kv_qscale<K>(v.y, g));
      qb[s][1] = pack2<M>(kv_qscale<K>(v.z, g), kv_qscale<K>(v.w, g));
    }
  }
  float m2[2] = {-INFINITY, -INFINITY}, l2[2] = {0.f, 0.f};  // heads 2tq, 2tq + 1
  float o[VD][2];
#pragma unroll
  for (int j = 0; j < VD; j++) o[j][0] = o[j][1] = 0.f;
  const int src1 = 4 * (2 * tq) + (gq >> 1), src2 = src1 + 4;  // lanes (2tq, gq/2), (2tq + 1, gq/2)
  for (int p0 = lo + 16 * warp; p0 < len; p0 += 16 * kTcWarps) {
    // Keys at positions p0 + gq and p0 + gq + 8, quarter tq; values at p0 + σ: 2tq,
    // 2tq + 8, 2tq + 1, 2tq + 9, eighth gq.
    uint32_t ka[KB / 4], kb[KB / 4], va[VB / 4], vb[VB / 4], vc[VB / 4], vd[VB / 4];
    tc_load<KB>(kv + key_at(p0 + gq) + QD * tq, ka);
    tc_load<KB>(kv + key_at(p0 + gq + 8) + QD * tq, kb);
    tc_load<VB>(kv + key_at(p0 + 2 * tq) + kstride + VD * gq, va);
    tc_load<VB>(kv + key_at(p0 + 2 * tq + 8) + kstride + VD * gq, vb);
    tc_load<VB>(kv + key_at(p0 + 2 * tq + 1) + kstride + VD * gq, vc);
    tc_load<VB>(kv + key_at(p0 + 2 * tq + 9) + kstride + VD * gq, vd);
    float sc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < S; s++) {
      uint32_t a0, a1, a2, a3;
      if constexpr (kv_is_fp8<K>) {
        a0 = tc_fp8_pair<M>(ka[s]), a2 = tc_fp8_pair<M>(ka[s] >> 16);
        a1 = tc_fp8_pair<M>(kb[s]), a3 = tc_fp8_pair<M>(kb[s] >> 16);
      } else {
        a0 = ka[2 * s], a2 = ka[2 * s + 1], a1 = kb[2 * s], a3 = kb[2 * s + 1];
      }
      mma_16816<M>(sc, a0, a1, a2, a3, qb[s][0], qb[s][1]);
    }
    // sc: positions gq (0, 1) and gq + 8 (2, 3), heads 2tq (0, 2) and 2tq + 1 (1, 3).
    const bool va_ = p0 + gq < len, vb_ = p0 + gq + 8 < len;
    float pr[4], scale[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
      const float x = va_ ? sc[j] : -INFINITY, y = vb_ ? sc[2 + j] : -INFINITY;
      float mx = fmaxf(x, y);
#pragma unroll
      for (int d = 4; d < 32; d <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
      const float mn = fmaxf(m2[j], mx);  // finite: the tile has a position
      scale[j] = __expf(m2[j] - mn);
      pr[j] = __expf(x - mn), pr[2 + j] = __expf(y - mn);
      l2[j] = l2[j] * scale[j] + pr[j] + pr[2 + j];  // this lane's share; summed at the end
      m2[j] = mn;
    }
    // Head gq's rescale, from a lane holding it in the scores' layout.
    const float s0 = __shfl_sync(0xffffffffu, scale[0], gq >> 1), s1 = __shfl_sync(0xffffffffu, scale[1], gq >> 1);
    const float rs = (gq & 1) ? s1 : s0;
#pragma unroll
    for (int j = 0; j < VD; j++) o[j][0] *= rs, o[j][1] *= rs;
    // P's A fragment: head gq at positions (2tq, 2tq + 8) and (2tq + 1, 2tq + 9).
    const uint32_t h0p = pack2<M>(pr[0], pr[2]), h1p = pack2<M>(pr[1], pr[3]);
    const uint32_t x0 = __shfl_sync(0xffffffffu, h0p, src1), x1 = __shfl_sync(0xffffffffu, h1p, src1);
    const uint32_t y0 = __shfl_sync(0xffffffffu, h0p, src2), y1 = __shfl_sync(0xffffffffu, h1p, src2);
    const uint32_t pa0 = (gq & 1) ? x1 : x0, pa2 = (gq & 1) ? y1 : y0;
#pragma unroll
    for (int j = 0; j < VD; j++) {
      uint32_t b0, b1;
      if constexpr (kv_is_fp8<K>) {
        // Codes j of rows (σ(2t), σ(2t + 1)) and (σ(2t + 8), σ(2t + 9)).
        const int w = j / 4, sh = 8 * (j % 4);
        b0 = tc_fp8_pair<M>(((va[w] >> sh) & 0xffu) | ((vb[w] >> sh) & 0xffu) << 8);
        b1 = tc_fp8_pair<M>(((vc[w] >> sh) & 0xffu) | ((vd[w] >> sh) & 0xffu) << 8);
      } else {
        const int w = j / 2;
        const uint32_t sel = (j & 1) ? 0x7632u : 0x5410u;
        b0 = __byte_perm(va[w], vb[w], sel), b1 = __byte_perm(vc[w], vd[w], sel);
      }
      float c[4] = {o[j][0], o[j][1], 0.f, 0.f};
      mma_16816<M>(c, pa0, 0u, pa2, 0u, b0, b1);
      o[j][0] = c[0], o[j][1] = c[1];
    }
  }
  // The warp's totals: sums over the lanes of a head, then the block's merge.
#pragma unroll
  for (int j = 0; j < 2; j++)
#pragma unroll
    for (int d = 4; d < 32; d <<= 1) l2[j] += __shfl_xor_sync(0xffffffffu, l2[j], d);
  if (gq == 0) {
#pragma unroll
    for (int j = 0; j < 2; j++) wm[warp][2 * tq + j] = m2[j], wl[warp][2 * tq + j] = l2[j];
  }
  if (gq < G) {
#pragma unroll
    for (int j = 0; j < VD; j++) wo[warp][gq][VD * 2 * tq + j] = o[j][0], wo[warp][gq][VD * (2 * tq + 1) + j] = o[j][1];
  }
  __syncthreads();
  for (int t = threadIdx.x; t < G * D; t += kTcThreads) {
    const int gg = t / D, d = t % D;
    float Mx, L, O;
    warp_merge(wm, wl, wo, gg, d, Mx, L, O);
    att[(int64_t)r * g.q_width() + (int64_t)(h0 + gg) * D + d] = from_f32<T>(kv_vscale<K>(O / L, g));
  }
}

// attention_decode_tc runs the tensor-core decode kernel (tc_decode_fits; one part a row).
template <typename T, typename K>
void attention_decode_tc(const float* qkv, T* att, const K* kv, const int32_t* dec_rows, const int32_t* row_pos,
                         const int32_t* row_seq, const DevSeq* seqs, const int32_t* blocks, KVGeom g, int layer,
                         int window, int rows, Stream stream) {
  if (rows == 0) return;
  const dim3 grid(rows, g.kv_heads);
  if (g.head_dim == 64)
    launch("attention_decode_tc_kernel", attention_decode_tc_kernel<T, K, 64>, grid, kTcThreads, 0, stream, qkv,
           att, kv, dec_rows, row_pos, row_seq, seqs, blocks, g, layer, window);
  else
    launch("attention_decode_tc_kernel", attention_decode_tc_kernel<T, K, 128>, grid, kTcThreads, 0, stream, qkv,
           att, kv, dec_rows, row_pos, row_seq, seqs, blocks, g, layer, window);
}

constexpr int kCtxThreads = 256;
constexpr int kCtxKeys = 32;  // keys per shared-memory chunk: one per lane in the softmax


inline size_t ctx_smem(int head_dim) {
  int Q = ctx_queries(head_dim);
  return sizeof(float) * (size_t)Q * (head_dim + 1)      // queries
         + 2 * sizeof(uint16_t) * kCtxKeys * (head_dim + 2)  // keys, values
         + sizeof(float) * (size_t)Q * (kCtxKeys + 1)     // scores / probabilities
         + sizeof(float) * (size_t)Q * head_dim           // output accumulators
         + sizeof(float) * 3 * Q;                         // running max, sum, rescale
}

// attention_context_kernel: grid (tiles, heads). Causal attention of a tile's queries
// (positions pos0..pos0+n-1) over its sequence's positions 0..pos0+n-1 (a query at p sees
// p-window+1..p when window > 0), read from the pool through the head's KV head in chunks
// of kCtxKeys keys with an online softmax, so prompt chunks after the first see the keys
// of earlier ones.
//   qkv: [N][qkv_width] fp32, queries pre-scaled; att: [N][heads·head_dim] T output.
// Shared memory layout in ctx_smem; rows of keys and values are padded by one pair so
// that lanes reading different keys hit different banks. kCap soft-caps the scores at
// ±softcap, as decode_attend does. An FP8 pool's (K kv8) codes are staged as T (exact) and
// its scales folded into the fp32 scores (before the cap) and the output.
template <typename T, typename K, bool kCap = false>
__global__ void __launch_bounds__(kCtxThreads) attention_context_kernel(
    const float* __restrict__ qkv, T* __restrict__ att, const K* __restrict__ kv,
    const CtxTile* __restrict__ tiles, const DevSeq* __restrict__ seqs,
    const int32_t* __restrict__ blocks, KVGeom g, int layer, int window, float softcap) {
  extern __shared__ float smem[];
  griddep_launch();
  griddep_wait();
  const int D = g.head_dim, Q = ctx_queries(D), KD = D + 2;
  const CtxTile tile = tiles[blockIdx.x];
  const int head = blockIdx.y, kvh = g.kv_head(head);
  const int32_t* table = blocks + seqs[tile.seq].blk_off;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float* qs = smem;                                   // [Q][D+1]
  T* ks = reinterpret_cast<T*>(qs + Q * (D + 1));     // [kCtxKeys][D+2]
  T* vs = ks + kCtxKeys * KD;                         // [kCtxKeys][D+2]
  float* ss = reinterpret_cast<float*>(vs + kCtxKeys * KD);  // [Q][kCtxKeys+1]
  float* os = ss + Q * (kCtxKeys + 1);                // [Q][D]
  float* m = os + Q * D;                              // [Q]
  float* l = m + Q;                                   // [Q]
  float* al = l + Q;                                  // [Q]

  for (int idx = threadIdx.x; idx < Q * D; idx += blockDim.x) {
    int i = idx / D, d = idx % D;
    qs[i * (D + 1) + d] =
        i < tile.n ? qkv[(int64_t)(tile.row0 + i) * g.qkv_width() + head * D + d] : 0.f;
    os[idx] = 0.f;
  }
  for (int i = threadIdx.x; i < Q; i += blockDim.x) {
    m[i] = -INFINITY;
    l[i] = 0.f;
  }
  const int kend = tile.pos0 + tile.n;
  const int kstart = window > 0 ? max(0, tile.pos0 - window + 1) : 0;
  for (int c0 = kstart; c0 < kend; c0 += kCtxKeys) {
    const int kc = min(kCtxKeys, kend - c0);
    __syncthreads();  // the previous chunk's readers are done
    for (int idx = threadIdx.x; idx < kc * D; idx += blockDim.x) {
      const int j = idx / D, d = idx % D, kp = c0 + j;
      const int64_t blk = table[kp / g.tokens_per_block];
      const int slot = kp % g.tokens_per_block;
      ks[j * KD + d] = kv_widen<T>(kv[g.at(blk, layer, 0, kvh, slot) + d]);
      vs[j * KD + d] = kv_widen<T>(kv[g.at(blk, layer, 1, kvh, slot) + d]);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < Q * kCtxKeys; idx += blockDim.x) {
      int i = idx / kCtxKeys, j = idx % kCtxKeys;
      float sc = -INFINITY;
      if (i < tile.n && j < kc && c0 + j <= tile.pos0 + i &&
          (window <= 0 || c0 + j > tile.pos0 + i - window)) {
        // Four partial sums, so the loads and FMAs of one dot product overlap.
        float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
        const float* qi = qs + i * (D + 1);
        const T* kj = ks + j * KD;
        for (int d = 0; d < D; d += 4) {
          s0 = fmaf(qi[d], to_f32(kj[d]), s0);
          s1 = fmaf(qi[d + 1], to_f32(kj[d + 1]), s1);
          s2 = fmaf(qi[d + 2], to_f32(kj[d + 2]), s2);
          s3 = fmaf(qi[d + 3], to_f32(kj[d + 3]), s3);
        }
        sc = (s0 + s1) + (s2 + s3);
        if constexpr (kv_is_fp8<K>) sc *= g.kscale;
        if constexpr (kCap) sc = softcap * tanhf(sc / softcap);
      }
      ss[i * (kCtxKeys + 1) + j] = sc;
    }
    __syncthreads();
    // Online softmax: a warp per query row, a lane per key of the chunk.
    for (int i = warp; i < tile.n; i += kCtxThreads / 32) {
      float sc = ss[i * (kCtxKeys + 1) + lane];
      float mx = warp_max(sc);
      float mold = m[i];
      float mnew = fmaxf(mold, mx);
      float p = sc == -INFINITY ? 0.f : __expf(sc - mnew);
      float sum = warp_sum(p);
      ss[i * (kCtxKeys + 1) + lane] = p;
      __syncwarp();
      if (lane == 0) {
        float a = mold == -INFINITY ? 0.f : __expf(mold - mnew);
        al[i] = a;
        l[i] = l[i] * a + sum;
        m[i] = mnew;
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < tile.n * D; idx += blockDim.x) {
      int i = idx / D, d = idx % D;
      const float* pi = ss + i * (kCtxKeys + 1);
      float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
      int j = 0;
      for (; j + 4 <= kc; j += 4) {
        a0 = fmaf(pi[j], to_f32(vs[j * KD + d]), a0);
        a1 = fmaf(pi[j + 1], to_f32(vs[(j + 1) * KD + d]), a1);
        a2 = fmaf(pi[j + 2], to_f32(vs[(j + 2) * KD + d]), a2);
        a3 = fmaf(pi[j + 3], to_f32(vs[(j + 3) * KD + d]), a3);
      }
      for (; j < kc; j++) a0 = fmaf(pi[j], to_f32(vs[j * KD + d]), a0);
      os[idx] = os[idx] * al[i] + ((a0 + a1) + (a2 + a3));
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < tile.n * D; idx += blockDim.x) {
    int i = idx / D, d = idx % D;
    const float o = kv_is_fp8<K> ? os[idx] * g.vscale : os[idx];
    att[(int64_t)(tile.row0 + i) * g.q_width() + head * D + d] = from_f32<T>(o / l[i]);
  }
}

// attention_context_tc_kernel: the context attention of attention_context_kernel on the
// tensor cores (WMMA 16×16×16, fp32 accumulation), for head_dim % 16 == 0 up to 128.
// Grid (tiles, heads), kCtxTcThreads threads. A tile's 16 queries (zero rows past tile.n)
// meet its sequence's keys in chunks of kCtxTcKeys, double-buffered in shared memory by
// cp.async (the next chunk's copies in flight while this one is computed):
//   S = Q·Kᵀ [16][kCtxTcKeys] (a warp per 16 keys) → causal mask and online softmax (a
//   warp per query row) → P in T → P·V [16][D] (a warp per 16 dimensions) → the running
//   output rescaled and added in fp32.
// Shared rows are padded by 8 elements (16 bytes) so that WMMA's row loads spread over
// the banks; layout in ctx_tc_smem.
// An FP8 pool's chunks are copied (cp.async, double-buffered) as codes into a staging
// area [2][KC][D] bytes of keys, then of values, and widened to T (exact) into one buffer
// of keys and one of values before the chunk is computed; the key scale multiplies the
// fp32 scores, the value scale the output.
constexpr int kCtxTcThreads = 128;
constexpr int kCtxTcKeys = 64;

// ctx_tc_fits: WMMA's 16-wide steps, and the 16-query tiles the step plan makes.
inline bool ctx_tc_fits(int head_dim) { return head_dim % 16 == 0 && ctx_queries(head_dim) == 16; }

inline size_t ctx_tc_smem(int head_dim, bool fp8 = false) {
  const int DP = head_dim + 8, Q = 16, KC = kCtxTcKeys;
  return 2 * (size_t)Q * DP                 // queries (T)
         + (fp8 ? 2 * 2 * (size_t)KC * DP + 2 * 2 * (size_t)KC * head_dim  // one T buffer, staged codes
                : 2 * 2 * 2 * (size_t)KC * DP)                           // two T buffers
         + 4 * (size_t)Q * (KC + 4)         // scores (fp32)
         + 2 * (size_t)Q * (KC + 8)         // probabilities (T)
         + 4 * (size_t)Q * (head_dim + 4)   // this chunk's P·V (fp32)
         + 4 * (size_t)Q * head_dim         // running output (fp32)
         + 4 * 3 * (size_t)Q;               // running max, sum, rescale
}

// ctx_kv_load copies keys and values c0 … c0+keys-1 of a sequence (its block table) into
// kd and vd ([keys][D + 8], T), zeros past kend, and commits the copies as one group:
// thread t of nthreads takes 16-byte pieces t, t + nthreads, … Both context kernels' chunk
// copy (the mma.sync kernel's constants fold in where it is inlined).
template <typename T>
__device__ __forceinline__ void ctx_kv_load(const T* __restrict__ kv, const int32_t* table,
                                            KVGeom g, int layer, int kvh, int c0, int kend,
                                            int keys, int D, T* kd, T* vd, int t, int nthreads) {
  const int P = D / 8, DP = D + 8;  // P: pieces a row
  for (int idx = t; idx < keys * P; idx += nthreads) {
    const int j = idx / P, p = idx % P, kp = c0 + j;
    const bool ok = kp < kend;
    const int kq = ok ? kp : c0;  // a valid address; zero-filled
    const int64_t blk = table[kq / g.tokens_per_block];
    const int slot = kq % g.tokens_per_block;
    cp_async16_zfill(kd + j * DP + p * 8, kv + g.at(blk, layer, 0, kvh, slot) + p * 8, ok ? 16 : 0);
    cp_async16_zfill(vd + j * DP + p * 8, kv + g.at(blk, layer, 1, kvh, slot) + p * 8, ok ? 16 : 0);
  }
  cp_async_commit();
}

// ctx_kv_load8 is ctx_kv_load for an FP8 pool: the codes of keys and values c0 …
// c0+keys-1 into kd and vd ([keys][D] bytes; D % 16 == 0), 16-byte pieces, zeros past kend.
__device__ __forceinline__ void ctx_kv_load8(const kv8* __restrict__ kv, const int32_t* table,
                                             KVGeom g, int layer, int kvh, int c0, int kend,
                                             int keys, int D, uint8_t* kd, uint8_t* vd, int t,
                                             int nthreads) {
  const int P = D / 16;
  for (int idx = t; idx < keys * P; idx += nthreads) {
    const int j = idx / P, p = idx % P, kp = c0 + j;
    const bool ok = kp < kend;
    const int kq = ok ? kp : c0;
    const int64_t blk = table[kq / g.tokens_per_block];
    const int slot = kq % g.tokens_per_block;
    cp_async16_zfill(kd + j * D + p * 16, kv + g.at(blk, layer, 0, kvh, slot) + p * 16, ok ? 16 : 0);
    cp_async16_zfill(vd + j * D + p * 16, kv + g.at(blk, layer, 1, kvh, slot) + p * 16, ok ? 16 : 0);
  }
  cp_async_commit();
}

// ctx_kv_widen widens a staged FP8 chunk (kd8, vd8: [keys][D] codes) into kd and vd
// ([keys][D + 8] T): thread t of nthreads takes pieces of 8 t, t + nthreads, …
template <typename T>
__device__ __forceinline__ void ctx_kv_widen(const uint8_t* kd8, const uint8_t* vd8, int keys,
                                             int D, T* kd, T* vd, int t, int nthreads) {
  const int P = D / 8, DP = D + 8, n = keys * P;
  for (int idx = t; idx < 2 * n; idx += nthreads) {
    const int kind = idx >= n, i = idx - kind * n, j = i / P, p = i % P;
    const uint2 c = *reinterpret_cast<const uint2*>((kind ? vd8 : kd8) + j * D + p * 8);
    *reinterpret_cast<uint4*>((kind ? vd : kd) + j * DP + p * 8) = kv_widen8<T>(c);
  }
}

template <typename T, typename K>
__global__ void __launch_bounds__(kCtxTcThreads) attention_context_tc_kernel(
    const float* __restrict__ qkv, T* __restrict__ att, const K* __restrict__ kv,
    const CtxTile* __restrict__ tiles, const DevSeq* __restrict__ seqs,
    const int32_t* __restrict__ blocks, KVGeom g, int layer, int window) {
  namespace wm = nvcuda::wmma;
  extern __shared__ __align__(128) unsigned char ctx_tc_smem_buf[];
  griddep_launch();
  griddep_wait();
  constexpr int Q = 16, KC = kCtxTcKeys;
  constexpr bool F8 = kv_is_fp8<K>;
  constexpr int NB = F8 ? 1 : 2;  // T buffers: an FP8 chunk is widened into one
  const int D = g.head_dim, DP = D + 8;
  const CtxTile tile = tiles[blockIdx.x];
  const int head = blockIdx.y, kvh = g.kv_head(head);
  const int32_t* table = blocks + seqs[tile.seq].blk_off;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = kCtxTcThreads / 32;

  T* qs = reinterpret_cast<T*>(ctx_tc_smem_buf);  // [Q][DP]
  T* kbuf = qs + Q * DP;                           // [NB][KC][DP]
  T* vbuf = kbuf + NB * KC * DP;                   // [NB][KC][DP]
  uint8_t* k8 = reinterpret_cast<uint8_t*>(vbuf + NB * KC * DP);  // FP8: [2][KC][D] codes
  uint8_t* v8 = k8 + (F8 ? 2 * KC * D : 0);                        // FP8: [2][KC][D]
  float* ss = reinterpret_cast<float*>(v8 + (F8 ? 2 * KC * D : 0));  // [Q][KC+4]
  T* ps = reinterpret_cast<T*>(ss + Q * (KC + 4));           // [Q][KC+8]
  float* pv = reinterpret_cast<float*>(ps + Q * (KC + 8));   // [Q][D+4]
  float* os = pv + Q * (D + 4);                              // [Q][D]
  float* m = os + Q * D;
  float* l = m + Q;
  float* al = l + Q;

  const int kend = tile.pos0 + tile.n;
  const int kstart = window > 0 ? max(0, tile.pos0 - window + 1) : 0;
  const int nchunks = (kend - kstart + KC - 1) / KC;
  if constexpr (F8)
    ctx_kv_load8(kv, table, g, layer, kvh, kstart, kend, KC, D, k8, v8, threadIdx.x, blockDim.x);
  else
    ctx_kv_load<T>(kv, table, g, layer, kvh, kstart, kend, KC, D, kbuf, vbuf, threadIdx.x, blockDim.x);
  for (int idx = threadIdx.x; idx < Q * D; idx += blockDim.x) {
    const int i = idx / D, d = idx % D;
    qs[i * DP + d] = from_f32<T>(
        i < tile.n ? qkv[(int64_t)(tile.row0 + i) * g.qkv_width() + head * D + d] : 0.f);
    os[idx] = 0.f;
  }
  for (int i = threadIdx.x; i < Q; i += blockDim.x) {
    m[i] = -INFINITY;
    l[i] = 0.f;
  }
  for (int ch = 0; ch < nchunks; ch++) {
    const int c0 = kstart + ch * KC, kc = min(KC, kend - c0);
    T* ks = kbuf + (F8 ? 0 : (ch & 1) * KC * DP);
    T* vs = vbuf + (F8 ? 0 : (ch & 1) * KC * DP);
    if (ch + 1 < nchunks) {
      if constexpr (F8)
        ctx_kv_load8(kv, table, g, layer, kvh, c0 + KC, kend, KC, D, k8 + ((ch + 1) & 1) * KC * D,
                     v8 + ((ch + 1) & 1) * KC * D, threadIdx.x, blockDim.x);
      else
        ctx_kv_load<T>(kv, table, g, layer, kvh, c0 + KC, kend, KC, D, kbuf + ((ch + 1) & 1) * KC * DP,
                       vbuf + ((ch + 1) & 1) * KC * DP, threadIdx.x, blockDim.x);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this chunk's keys and values (and, first, the queries) are in
    if constexpr (F8) {
      ctx_kv_widen<T>(k8 + (ch & 1) * KC * D, v8 + (ch & 1) * KC * D, KC, D, ks, vs, threadIdx.x,
                      blockDim.x);
      __syncthreads();
    }
    // S = Q·Kᵀ: warp w takes keys 16w…16w+15.
    for (int f = warp; f < KC / 16; f += nwarps) {
      wm::fragment<wm::accumulator, 16, 16, 16, float> acc;
      wm::fill_fragment(acc, 0.f);
      for (int k = 0; k < D; k += 16) {
        wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> fa;
        wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::col_major> fb;
        wm::load_matrix_sync(fa, qs + k, DP);
        wm::load_matrix_sync(fb, ks + f * 16 * DP + k, DP);
        wm::mma_sync(acc, fa, fb, acc);
      }
      wm::store_matrix_sync(ss + f * 16, acc, KC + 4, wm::mem_row_major);
    }
    __syncthreads();
    // Online softmax: a warp per query row, two keys per lane.
    for (int i = warp; i < Q; i += nwarps) {
      float sc[KC / 32];
      float mx = -INFINITY;
#pragma unroll
      for (int u = 0; u < KC / 32; u++) {
        const int j = lane + 32 * u;
        const bool ok = i < tile.n && j < kc && c0 + j <= tile.pos0 + i &&
                        (window <= 0 || c0 + j > tile.pos0 + i - window);
        sc[u] = ok ? (F8 ? ss[i * (KC + 4) + j] * g.kscale : ss[i * (KC + 4) + j]) : -INFINITY;
        mx = fmaxf(mx, sc[u]);
      }
      mx = warp_max(mx);
      const float mold = m[i], mnew = fmaxf(mold, mx);
      float sum = 0.f;
#pragma unroll
      for (int u = 0; u < KC / 32; u++) {
        const float p = sc[u] == -INFINITY ? 0.f : __expf(sc[u] - mnew);
        sum += p;
        ps[i * (KC + 8) + lane + 32 * u] = from_f32<T>(p);
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float a = mold == -INFINITY ? 0.f : __expf(mold - mnew);
        al[i] = a;
        l[i] = l[i] * a + sum;
        m[i] = mnew;
      }
    }
    __syncthreads();
    // P·V: warp w takes dimensions 16w…16w+15 (and 16(w+4)… for wide heads).
    for (int f = warp; f < D / 16; f += nwarps) {
      wm::fragment<wm::accumulator, 16, 16, 16, float> acc;
      wm::fill_fragment(acc, 0.f);
#pragma unroll
      for (int k = 0; k < KC; k += 16) {
        wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> fa;
        wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major> fb;
        wm::load_matrix_sync(fa, ps + k, KC + 8);
        wm::load_matrix_sync(fb, vs + k * DP + f * 16, DP);
        wm::mma_sync(acc, fa, fb, acc);
      }
      wm::store_matrix_sync(pv + f * 16, acc, D + 4, wm::mem_row_major);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < Q * D; idx += blockDim.x) {
      const int i = idx / D, d = idx % D;
      os[idx] = os[idx] * al[i] + pv[i * (D + 4) + d];
    }
    // The next iteration's first barrier orders these before pv and the buffers are reused.
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < tile.n * D; idx += blockDim.x) {
    const int i = idx / D, d = idx % D;
    const float o = F8 ? os[idx] * g.vscale : os[idx];
    att[(int64_t)(tile.row0 + i) * g.q_width() + head * D + d] = from_f32<T>(o / l[i]);
  }
}

// attention_context_mma_kernel: the context attention of attention_context_kernel on the
// tensor cores through mma.sync (m16n8k16, fp32 accumulation), for head_dim D of 64, 80 or
// 128 (the sizes tests/gpu/check.py's models check; others keep the WMMA kernel): a warp
// per tile and head, FlashAttention-2's arrangement, so that nothing but the keys and
// values' staging leaves the warp's registers.
//   Grid (ceil(tiles / warps a block), heads), 32 · (warps a block) threads; warp w of block
//   b takes tile b · warps + w. Queries [16][D] are A fragments held in registers (rows past
//   tile.n zero); each chunk of KC keys and values [KC][D] (T, rows padded to D + 8 so that
//   ldmatrix's 8 rows hit distinct banks) is copied by the warp — or, where a block's four
//   tiles are of one sequence, once by the whole block for all four — (cp.async, the next
//   chunk in flight), S = Q·Kᵀ [16][KC] lands in accumulators (lane (g, t): rows g and
//   g + 8, keys 2t, 2t + 1 of each 8), is masked (causal, window, rows and keys past the
//   tile's) and softmaxed online per row (the quad of lanes that holds a row reduces its
//   max), P rounded to T becomes P·V's A fragment as it lies, and V's B fragments come from
//   ldmatrix.trans. The output [16][D] is rescaled in registers and divided by each row's
//   sum (the quad's partial sums added) at the end.
// An FP8 pool's chunks are staged as codes and widened into one T buffer, as the WMMA
// kernel's are; the key scale multiplies the scores, the value scale the output.
// Shared memory: CtxMma<D>::bytes(fp8) a warp ([2][KC][D + 8] keys, then values, T; FP8:
// [KC][D + 8] keys, values, then [2][KC][D] codes of keys, of values).
template <int D>
struct CtxMma {
  static constexpr int KC = D <= 64 ? 32 : 16;  // keys a chunk: 16-18 KB a warp
  static constexpr int DP = D + 8;
  static constexpr size_t warp_bytes = 2 * 2 * (size_t)KC * DP * 2;
  static constexpr size_t warp_bytes8 = 2 * (size_t)KC * DP * 2 + 2 * 2 * (size_t)KC * D;
  __host__ __device__ static constexpr size_t bytes(bool fp8) { return fp8 ? warp_bytes8 : warp_bytes; }
};

inline bool ctx_mma_fits(int head_dim) {
  return head_dim == 64 || head_dim == 80 || head_dim == 128;
}

// ctx_mma_chunk is one chunk of attention_context_mma_kernel for one warp: keys and values
// c0…c0+KC-1 (kb, vb: [KC][DP] in shared memory) against the tile's queries qa, masked for
// the tile (causal, its window, its rows), into the running row maxima mrow, partial row
// sums lrow (this lane's share) and outputs o. kScaled: the keys are FP8 codes, the scores
// times kscale.
template <typename T, int D, bool kScaled = false>
__device__ __forceinline__ void ctx_mma_chunk(const T* kb, const T* vb, int c0, const CtxTile& tile,
                                              int window, const uint32_t (&qa)[D / 16][4],
                                              float (&o)[D / 8][4], float (&mrow)[2],
                                              float (&lrow)[2], int lane, float kscale = 1.f) {
  constexpr int KC = CtxMma<D>::KC, DP = CtxMma<D>::DP, NT = KC / 8, DT = D / 8;
  const int gq = lane >> 2, tq = lane & 3;
  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: this lane's matrix and row
  const int kend = tile.pos0 + tile.n;
  // S = Q·Kᵀ: K's rows are B's columns; one ldmatrix.x4 gives two key octets' B fragments
  // for 16 dimensions.
  float s[NT][4];
#pragma unroll
  for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int k = 0; k < D / 16; k++) {
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t b[4];
      ldsm_x4(b, kb + (n * 8 + (mi >> 1) * 8 + mr) * DP + k * 16 + (mi & 1) * 8);
      mma_16816<T>(s[n], qa[k][0], qa[k][1], qa[k][2], qa[k][3], b[0], b[1]);
      mma_16816<T>(s[n + 1], qa[k][0], qa[k][1], qa[k][2], qa[k][3], b[2], b[3]);
    }
  }
  // Mask, then the online softmax of rows gq (e = 0, 1) and gq + 8 (e = 2, 3).
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < NT; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int r = gq + (e >> 1) * 8, kp = c0 + n * 8 + 2 * tq + (e & 1), qp = tile.pos0 + r;
      const bool ok = r < tile.n && kp < kend && kp <= qp && (window <= 0 || kp > qp - window);
      s[n][e] = ok ? (kScaled ? s[n][e] * kscale : s[n][e]) : -INFINITY;
      mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float mnew = fmaxf(mrow[r], mx[r]);
    const float a = mrow[r] == -INFINITY ? 0.f : __expf(mrow[r] - mnew);
    mrow[r] = mnew;
    lrow[r] *= a;
#pragma unroll
    for (int d = 0; d < DT; d++) o[d][2 * r] *= a, o[d][2 * r + 1] *= a;
  }
#pragma unroll
  for (int n = 0; n < NT; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const float p = s[n][e] == -INFINITY ? 0.f : __expf(s[n][e] - mrow[e >> 1]);
      s[n][e] = p;
      lrow[e >> 1] += p;
    }
  }
  // O += P·V: P's accumulators of key octets 2kk and 2kk + 1 are the A fragment of keys
  // 16kk…16kk+15; V's B fragments by ldmatrix.trans (two dimension octets a load).
#pragma unroll
  for (int kk = 0; kk < KC / 16; kk++) {
    const uint32_t p0 = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    const uint32_t p1 = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    const uint32_t p2 = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    const uint32_t p3 = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
    for (int d = 0; d < DT; d += 2) {
      uint32_t b[4];
      ldsm_x4_t(b, vb + (kk * 16 + (mi & 1) * 8 + mr) * DP + d * 8 + (mi >> 1) * 8);
      mma_16816<T>(o[d], p0, p1, p2, p3, b[0], b[1]);
      mma_16816<T>(o[d + 1], p0, p1, p2, p3, b[2], b[3]);
    }
  }
}

template <typename T, typename K, int D>
__global__ void __launch_bounds__(128) attention_context_mma_kernel(
    const float* __restrict__ qkv, T* __restrict__ att, const K* __restrict__ kv,
    const CtxTile* __restrict__ tiles, const DevSeq* __restrict__ seqs,
    const int32_t* __restrict__ blocks, KVGeom g, int layer, int window, int ntiles) {
  constexpr int KC = CtxMma<D>::KC, DP = CtxMma<D>::DP, DT = D / 8, W = 4;
  constexpr bool F8 = kv_is_fp8<K>;
  constexpr int NB = F8 ? 1 : 2;  // T buffers: an FP8 chunk is widened into one
  extern __shared__ __align__(128) unsigned char ctx_mma_smem_buf[];
  griddep_launch();
  griddep_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nw = blockDim.x >> 5, t0 = blockIdx.x * nw;
  const int ti = t0 + warp;
  // A block of four tiles of one sequence shares its keys and values: they are copied once
  // for all four warps (a quarter of the traffic from L2 on long prompts). Otherwise each
  // warp copies its own.
  bool shared = nw == W && t0 + W <= ntiles;
  int ks_all = 1 << 30, ke_all = 0;
  if (shared) {
    const int seq = tiles[t0].seq;
#pragma unroll
    for (int w = 0; w < W; w++) {
      const CtxTile tw = tiles[t0 + w];
      shared = shared && tw.seq == seq && tw.n > 0;
      ks_all = min(ks_all, window > 0 ? max(0, tw.pos0 - window + 1) : 0);
      ke_all = max(ke_all, tw.pos0 + tw.n);
    }
  }
  if (!shared && ti >= ntiles) return;
  const CtxTile tile = tiles[min(ti, ntiles - 1)];
  if (!shared && tile.n <= 0) return;  // a padding tile of a prompt graph
  const int head = blockIdx.y, kvh = g.kv_head(head);
  const int32_t* table = blocks + seqs[tile.seq].blk_off;
  const int gq = lane >> 2, tq = lane & 3;

  // The queries as A fragments: a0 row gq, a1 row gq + 8 (dims 2t, 2t + 1 of each 16), a2
  // and a3 the same rows' dims 2t + 8, 2t + 9.
  uint32_t qa[D / 16][4];
  {
    const int64_t Wq = g.qkv_width();
    const float* q0 = qkv + (int64_t)(tile.row0 + gq) * Wq + head * D + 2 * tq;
    const float* q1 = q0 + 8 * Wq;
    const bool r0 = gq < tile.n, r1 = gq + 8 < tile.n;
    const float2 z = make_float2(0.f, 0.f);
#pragma unroll
    for (int k = 0; k < D / 16; k++) {
      const float2 a = r0 ? *reinterpret_cast<const float2*>(q0 + 16 * k) : z;
      const float2 b = r1 ? *reinterpret_cast<const float2*>(q1 + 16 * k) : z;
      const float2 c = r0 ? *reinterpret_cast<const float2*>(q0 + 16 * k + 8) : z;
      const float2 d = r1 ? *reinterpret_cast<const float2*>(q1 + 16 * k + 8) : z;
      qa[k][0] = pack2<T>(a.x, a.y);
      qa[k][1] = pack2<T>(b.x, b.y);
      qa[k][2] = pack2<T>(c.x, c.y);
      qa[k][3] = pack2<T>(d.x, d.y);
    }
  }
  float o[DT][4];
#pragma unroll
  for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
  const int kend = tile.pos0 + tile.n;
  const int kstart = window > 0 ? max(0, tile.pos0 - window + 1) : 0;
  // The chunks walked: with shared keys and values the block's, which cover every warp's
  // keys and are copied by all its threads (a warp computes those that meet its own);
  // otherwise the warp's own, copied by its lanes into its own buffers. `shared` is the
  // same in every thread of the block, so the barrier below is too.
  // Chunks start at multiples of KC, so that a query's online softmax meets the same chunks
  // whichever tiles share its block and wherever its tile starts (batch and prefix
  // invariance under a sliding window; keys before a query's window weigh exactly zero).
  const int lo = (shared ? ks_all : kstart) / KC * KC, hi = shared ? ke_all : kend;
  // [NB][KC][DP] keys, then [NB][KC][DP] values (FP8: then [2][KC][D] codes of each): the
  // block's, or warp w's at w · CtxMma<D>::bytes(F8).
  T* kbuf = reinterpret_cast<T*>(ctx_mma_smem_buf + (shared ? 0 : (size_t)warp * CtxMma<D>::bytes(F8)));
  T* vbuf = kbuf + NB * KC * DP;
  uint8_t* k8 = reinterpret_cast<uint8_t*>(vbuf + NB * KC * DP);  // FP8 only
  uint8_t* v8 = k8 + 2 * KC * D;
  const int ct = shared ? (int)threadIdx.x : lane, cn = shared ? (int)blockDim.x : 32;
  auto sync = [shared] {
    if (shared)
      __syncthreads();
    else
      __syncwarp();
  };
  const int nch = (hi - lo + KC - 1) / KC;
  // load copies chunk c (keys from position c) into buffer b.
  auto load = [&](int c, int b) {
    if constexpr (F8)
      ctx_kv_load8(kv, table, g, layer, kvh, c, hi, KC, D, k8 + b * KC * D, v8 + b * KC * D, ct, cn);
    else
      ctx_kv_load<T>(kv, table, g, layer, kvh, c, hi, KC, D, kbuf + b * KC * DP, vbuf + b * KC * DP,
                     ct, cn);
  };
  if (nch > 0) load(lo, 0);
  for (int ch = 0; ch < nch; ch++) {
    const int c0 = lo + ch * KC;
    if (ch + 1 < nch) {
      load(c0 + KC, (ch + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    sync();  // every copier's pieces of this chunk are in
    if constexpr (F8) {
      ctx_kv_widen<T>(k8 + (ch & 1) * KC * D, v8 + (ch & 1) * KC * D, KC, D, kbuf, vbuf, ct, cn);
      sync();
    }
    const int b = F8 ? 0 : ch & 1;
    if (c0 < kend && c0 + KC > kstart)
      ctx_mma_chunk<T, D, F8>(kbuf + b * KC * DP, vbuf + b * KC * DP, c0, tile, window, qa, o,
                              mrow, lrow, lane, g.kscale);
    sync();  // this buffer's readers are done before the next chunk's copies
  }
  using T2 = typename std::conditional<std::is_same<T, __half>::value, __half2, __nv_bfloat162>::type;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float l = lrow[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = gq + 8 * r;
    if (row >= tile.n) continue;
    const float inv = l > 0.f ? (F8 ? g.vscale / l : 1.f / l) : 0.f;
    T* out = att + (int64_t)(tile.row0 + row) * g.q_width() + head * D + 2 * tq;
#pragma unroll
    for (int d = 0; d < DT; d++) {
      T2 v;
      v.x = from_f32<T>(o[d][2 * r] * inv);
      v.y = from_f32<T>(o[d][2 * r + 1] * inv);
      *reinterpret_cast<T2*>(out + d * 8) = v;
    }
  }
}

// ctx_mma_warps is how many tiles (warps) a block of attention_context_mma_kernel takes:
// four where the grid still fills the multiprocessors twice over, else one, so that a short
// prompt's few tiles spread over as many multiprocessors.
inline int ctx_mma_warps(int ntiles, int heads, int sms) {
  return (int64_t)ntiles * heads >= 8LL * sms ? 4 : 1;
}

template <typename T, typename K, int D>
void attention_context_mma(const float* qkv, T* att, const K* kv, const CtxTile* tiles,
                           const DevSeq* seqs, const int32_t* blocks, KVGeom g, int layer,
                           int window, int ntiles, int sms, Stream stream) {
  const int w = ctx_mma_warps(ntiles, g.heads, sms);
  launch("attention_context_mma_kernel", attention_context_mma_kernel<T, K, D>,
         dim3((ntiles + w - 1) / w, g.heads), 32 * w, w * CtxMma<D>::bytes(kv_is_fp8<K>), stream,
         qkv, att, kv, tiles, seqs, blocks, g, layer, window, ntiles);
}

template <typename T, typename K>
void attention_context(const float* qkv, T* att, const K* kv, const CtxTile* tiles,
                       const DevSeq* seqs, const int32_t* blocks, KVGeom g, int layer,
                       int window, int ntiles, bool mma, int sms, Stream stream) {
  if (ntiles == 0) return;
  if (mma && ctx_mma_fits(g.head_dim)) {
    switch (g.head_dim) {
      case 64:
        return attention_context_mma<T, K, 64>(qkv, att, kv, tiles, seqs, blocks, g, layer, window, ntiles, sms, stream);
      case 80:
        return attention_context_mma<T, K, 80>(qkv, att, kv, tiles, seqs, blocks, g, layer, window, ntiles, sms, stream);
      default:
        return attention_context_mma<T, K, 128>(qkv, att, kv, tiles, seqs, blocks, g, layer, window, ntiles, sms, stream);
    }
  }
  dim3 grid(ntiles, g.heads);
  if (ctx_tc_fits(g.head_dim)) {
    launch("attention_context_tc_kernel", attention_context_tc_kernel<T, K>, grid, kCtxTcThreads,
           ctx_tc_smem(g.head_dim, kv_is_fp8<K>), stream, qkv, att, kv, tiles, seqs, blocks, g, layer, window);
    return;
  }
  launch("attention_context_kernel", attention_context_kernel<T, K>, grid, kCtxThreads,
         ctx_smem(g.head_dim), stream, qkv, att, kv, tiles, seqs, blocks, g, layer, window, 0.f);
}

}  // namespace gollm

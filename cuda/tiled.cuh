// tiled.cuh — tensor-core projections for steps of up to 64 token rows that the streaming
// gemv does not take, with the gemv kernels' epilogues (bias, QKV scale and KV write,
// rotary, activation, gate·up) fused, so that one kernel replaces cuBLAS's GEMM, its
// split-K reduction and our epilogue kernel. A block streams a tile of weight rows and the
// input rows through shared memory (cp.async, stages of 256 columns, two in flight where a
// split has more), the weights before it waits for the previous kernel, and a split's
// last block merges the splits' sums and applies the epilogue.
//
// Beyond 16 rows, or on models wider than 1024, cuBLAS's kernels win (engine.cu's
// tiled_rows): a block's chain — input loads after the wait, the partial sums' stores,
// fence and ticket, the last block's merge and epilogue — is longer than theirs.
#pragma once
#include "gemv.cuh"

namespace gollm {

constexpr int kTileThreads = 256;  // 8 warps, each NT · 8 weight rows (mma's n)
constexpr int kTileStep = kTileChunks * 32;  // columns a stage holds
static_assert(kTileSlots == 8 * kTileThreads / 32, "a warp holds 8 weight rows an n-tile");

// tile_w_row is the weight row of slot s (0 … C-1, C = kTileSlots · NT) of tile t, or -1
// past the outputs: slots below C/2 of a GATED tile are the gate rows of C/2 units, the
// rest their up rows; slots below C/2 of a ROPE tile are the first rows of C/2 rotary pairs
// (RopeUnit), the rest their partners.
template <int OUT, int NT>
__device__ __forceinline__ int64_t tile_w_row(const GemvArgs& a, int t, int s) {
  constexpr int C = kTileSlots * NT, P = C / 2;
  if (OUT == GEMV_OUT_GATED) {
    const int64_t u = (int64_t)t * P + (s % P);
    return u >= a.out ? -1 : s < P ? u : a.out + u;
  }
  if (OUT == GEMV_OUT_ROPE) {
    const int64_t u = (int64_t)t * P + (s % P);
    if (u >= a.out / 2) return -1;
    const RopeUnit ru = rope_unit(a.geom, u);
    return s < P ? ru.c0 : ru.c1;
  }
  const int64_t o = (int64_t)t * C + s;
  return o < a.out ? o : -1;
}

// tile_xld is the row stride (elements) of a stage's rows in shared memory for kc chunks:
// the stage's columns, padded so that a row starts 64 bytes (mod 128) after the one before
// — the 8 rows × 4 lanes of a fragment load then hit distinct banks.
__host__ __device__ __forceinline__ int tile_xld(int kc) {
  const int c = kc < kTileChunks ? kc : kTileChunks;
  return c * 32 + (c & 1 ? 0 : 32);
}

// tile_smem is a launch's dynamic shared memory: two stages of M input rows and C weight
// rows, one where a split has a single stage (the sums, M × (C + 4) fp32, reuse it).
__host__ __device__ __forceinline__ size_t tile_smem(int M, int NT, int kc, int tsize) {
  const size_t st = (kc > kTileChunks ? 2 : 1) * (size_t)(M + kTileSlots * NT) * tile_xld(kc) * tsize;
  const size_t sums = (size_t)M * (kTileSlots * NT + 4) * 4;
  return st > sums ? st : sums;
}

// tiled_kernel: y = epilogue(x · Wᵀ) for the n ≤ MT·16 rows of x [n][in] T (GEMV_IN_T
// operands of GemvArgs) and W [out][in] T.
//
// Block b takes tile b / splits — C = kTileSlots · NT weight rows (tile_w_row) — over
// split b % splits of the reduction: kc chunks of 32 columns from split · kc, in stages of
// up to kTileChunks chunks, two in flight (cp.async; the first two stages' weights before
// griddep_wait, the input rows after). Warp w holds the NT n-tiles of slots (w·NT + j)·8 …
// +7 and all MT m-tiles of rows. Lane (g = lane/4, q = lane%4) reads 16 bytes of its slot's
// row and of rows g and g + 8 of each m-tile per chunk — columns 8q … 8q + 7 —, one
// shared-memory load each: the mma's k order is a permutation of the chunk's (in the first
// k16 step the lane's pairs (2q, 2q+1) and (2q+8, 2q+9) are columns 8q+0,1 and 8q+2,3, in
// the second 8q+4,5 and 8q+6,7), the same for both operands.
//
// With splits > 1 every block stores its [n][C] sums in part ([tile][split][kTileMaxRows][C]
// fp32) and the tile's last block (a ticket per tile, reset by it) adds them in split order
// — the result does not depend on which block finished last — and applies the epilogue.
// The epilogue's operands of a thread's slot (bias, rotary frequency) are loaded before
// the wait, the rows' positions and KV offsets into shared memory.
// Dynamic shared memory: tile_smem(MT·16, NT, kc, sizeof(T)).
template <typename T, int MT, int NT, int OUT>
__global__ void __launch_bounds__(kTileThreads) tiled_kernel(GemvArgs a, TileShape sh,
                                                             float* __restrict__ part,
                                                             int* __restrict__ tickets) {
  constexpr int M = MT * 16, C = kTileSlots * NT, P = C / 2, LD = C + 4;
  constexpr bool kPair = OUT == GEMV_OUT_GATED || OUT == GEMV_OUT_ROPE;
  constexpr bool kKV = OUT == GEMV_OUT_QKV || OUT == GEMV_OUT_ROPE;
  extern __shared__ __align__(16) unsigned char tile_sm[];
  __shared__ int64_t kvrow[kTileMaxRows];
  __shared__ int rowpos[kTileMaxRows];
  griddep_launch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int tile = blockIdx.x / sh.splits, split = blockIdx.x % sh.splits, n = a.n;
  const int c0 = split * sh.kc, nch = min(sh.kc, a.in / 32 - c0);
  const int steps = (nch + kTileChunks - 1) / kTileChunks, xld = tile_xld(sh.kc);
  // Stage k % 2: [M][xld] input rows, then [C][xld] weight rows.
  auto stage = [&](int k) { return reinterpret_cast<T*>(tile_sm) + (size_t)(k & 1) * (M + C) * xld; };
  // stage_w / stage_x copy step k's weight rows / input rows into stage k % 2: rows
  // [C][xld] after [M][xld], in 16-byte pieces — thread t the piece pc = t % 32 of rows
  // t / 32 + 8i, their addresses computed once (a loop over pieces with divisions was most
  // of a block's instructions) —, zeros past the outputs, n or the split.
  constexpr int RW = C / 8, RX = M / 8;  // rows a thread stages
  const int pc = threadIdx.x & 31, pr = threadIdx.x >> 5;
  const T* wrow[RW];
#pragma unroll
  for (int i = 0; i < RW; i++) {
    const int64_t row = tile_w_row<OUT, NT>(a, tile, pr + 8 * i);
    wrow[i] = row < 0 ? nullptr : static_cast<const T*>(a.w) + row * a.in + (int64_t)c0 * 32 + pc * 8;
  }
  // staged says whether this thread copies a piece of step k: pieces past the step's
  // chunks are neither copied nor read.
  auto staged = [&](int k) { return k < steps && pc < 4 * min(kTileChunks, nch - k * kTileChunks); };
  auto stage_w = [&](int k) {
    if (!staged(k)) return;
    T* dst = stage(k) + (size_t)(M + pr) * xld + pc * 8;
#pragma unroll
    for (int i = 0; i < RW; i++) {
      T* d = dst + (size_t)8 * i * xld;
      if (wrow[i])
        cp_async16(d, wrow[i] + k * kTileStep);
      else
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  };
  auto stage_x = [&](int k) {
    if (!staged(k)) return;
    T* dst = stage(k) + (size_t)pr * xld + pc * 8;
    const T* src = static_cast<const T*>(a.x) + (int64_t)pr * a.in + (int64_t)c0 * 32 + k * kTileStep + pc * 8;
#pragma unroll
    for (int i = 0; i < RX; i++) {
      T* d = dst + (size_t)8 * i * xld;
      if (pr + 8 * i < n)
        cp_async16(d, src + (int64_t)8 * i * a.in);
      else
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  };
  stage_w(0);
  stage_w(1);
  cp_async_commit();
  // The epilogue's per-slot operands: thread t finishes slot (or pair) es of rows er, er +
  // rstep, … (loaded now: weights, not results).
  constexpr int ES = kPair ? P : C, RSTEP = kTileThreads / ES;
  const int es = threadIdx.x % ES, er = threadIdx.x / ES;
  const int64_t eu = (int64_t)tile * ES + es;  // output, unit or pair
  float b0 = 0.f, b1 = 0.f, freq = 0.f;
  RopeUnit ru{};
  if (OUT == GEMV_OUT_ROPE) {
    if (eu < a.out / 2) {
      ru = rope_unit(a.geom, eu);
      if (a.bias) b0 = a.bias[ru.c0], b1 = a.bias[ru.c1];
      freq = a.inv_freq[ru.i];
    }
  } else if (OUT == GEMV_OUT_GATED) {
    if (a.bias && eu < a.out) b0 = a.bias[eu], b1 = a.bias[a.out + eu];
  } else if (a.bias && eu < a.out) {
    b0 = a.bias[eu];
  }
  if (kKV) {
    gemv_kv_rows(a, true, kvrow, nullptr, kTileMaxRows);
    if (threadIdx.x < n) rowpos[threadIdx.x] = a.row_pos[threadIdx.x];
  }
  griddep_wait();
  stage_x(0);
  cp_async_commit();
  stage_x(1);
  cp_async_commit();

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int j = 0; j < NT; j++) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
  for (int k = 0; k < steps; k++) {
    // Pending groups here: step k's input (and k+1's), or step k's and k+1's pieces.
    if (k + 1 < steps)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
    __syncthreads();
    const T* xs = stage(k);
    const T* ws = xs + (size_t)M * xld;
    const int ck = min(kTileChunks, nch - k * kTileChunks);
#pragma unroll
    for (int i = 0; i < kTileChunks; i++) {
      if (i < ck) {
        uint4 wv[NT];
#pragma unroll
        for (int j = 0; j < NT; j++)
          wv[j] = *reinterpret_cast<const uint4*>(ws + ((warp * NT + j) * 8 + g) * xld + i * 32 + q * 8);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          const T* r0 = xs + (mt * 16 + g) * xld + i * 32 + q * 8;
          const uint4 x0 = *reinterpret_cast<const uint4*>(r0);
          const uint4 x1 = *reinterpret_cast<const uint4*>(r0 + 8 * xld);
#pragma unroll
          for (int j = 0; j < NT; j++) {
            mma_16816<T>(acc[mt][j], x0.x, x1.x, x0.y, x1.y, wv[j].x, wv[j].y);
            mma_16816<T>(acc[mt][j], x0.z, x1.z, x0.w, x1.w, wv[j].z, wv[j].w);
          }
        }
      }
    }
    __syncthreads();  // stage k & 1 is free: step k + 2 goes there
    stage_w(k + 2);
    stage_x(k + 2);
    cp_async_commit();
  }

  float* ts = reinterpret_cast<float*>(tile_sm);  // the sums [M][LD], over the stages
  if (sh.splits == 1) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int j = 0; j < NT; j++) {
        const int r = mt * 16 + g, col = (warp * NT + j) * 8 + 2 * q;
        *reinterpret_cast<float2*>(ts + r * LD + col) = make_float2(acc[mt][j][0], acc[mt][j][1]);
        *reinterpret_cast<float2*>(ts + (r + 8) * LD + col) = make_float2(acc[mt][j][2], acc[mt][j][3]);
      }
  } else {
    float* mine = part + ((int64_t)tile * sh.splits + split) * kTileMaxRows * C;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int j = 0; j < NT; j++) {
        const int r = mt * 16 + g, col = (warp * NT + j) * 8 + 2 * q;
        if (r < n) *reinterpret_cast<float2*>(mine + r * C + col) = make_float2(acc[mt][j][0], acc[mt][j][1]);
        if (r + 8 < n)
          *reinterpret_cast<float2*>(mine + (r + 8) * C + col) = make_float2(acc[mt][j][2], acc[mt][j][3]);
      }
    if (!last_block_of(tickets + tile, sh.splits)) return;
    // Thread t sums float4 e = t + k·kTileThreads of the [n][C] sums over the splits, B
    // splits' loads in flight at once (one at a time, the merge was a chain of L2 round
    // trips).
    constexpr int E = M * C / 4 / kTileThreads, B = E >= 8 ? 2 : E >= 4 ? 4 : 8;
    const float4* base = reinterpret_cast<const float4*>(part) + (int64_t)tile * sh.splits * kTileMaxRows * C / 4;
    float4 s[E];
#pragma unroll
    for (int k = 0; k < E; k++) s[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int sp0 = 0; sp0 < sh.splits; sp0 += B) {
      float4 v[E][B];
#pragma unroll
      for (int k = 0; k < E; k++) {
        const int e = threadIdx.x + k * kTileThreads;
#pragma unroll
        for (int j = 0; j < B; j++)
          // L2, not L1: the other blocks' sums were written after this SM may have cached
          // the same addresses in an earlier launch.
          v[k][j] = e < n * (C / 4) && sp0 + j < sh.splits
                        ? __ldcg(base + (int64_t)(sp0 + j) * kTileMaxRows * C / 4 + e)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int k = 0; k < E; k++)
#pragma unroll
        for (int j = 0; j < B; j++)
          s[k].x += v[k][j].x, s[k].y += v[k][j].y, s[k].z += v[k][j].z, s[k].w += v[k][j].w;
    }
#pragma unroll
    for (int k = 0; k < E; k++) {
      const int e = threadIdx.x + k * kTileThreads;
      if (e < n * (C / 4)) *reinterpret_cast<float4*>(ts + e / (C / 4) * LD + e % (C / 4) * 4) = s[k];
    }
  }
  __syncthreads();

  // The epilogue: slot (or pair) es of rows er, er + RSTEP, … < n.
  if (OUT == GEMV_OUT_GATED) {
    if (eu < a.out)
      for (int r = er; r < n; r += RSTEP)
        gemv_gated_store<T>(a, r, (int)eu, ts[r * LD + es] + b0, ts[r * LD + P + es] + b1);
  } else if (OUT == GEMV_OUT_ROPE) {
    if (eu < a.out / 2)
      for (int r = er; r < n; r += RSTEP)
        gemv_rope_store<T>(a, ru, kvrow[r], r, ts[r * LD + es] + b0, ts[r * LD + P + es] + b1, freq,
                           rowpos[r]);
  } else if (eu < a.out) {
    for (int r = er; r < n; r += RSTEP) gemv_store<T, OUT>(a, kvrow, r, (int)eu, ts[r * LD + es] + b0);
  }
}

template <typename T, int MT, int NT, int OUT>
void tiled_launch(const GemvArgs& a, const TileShape& sh, float* part, int* tickets, Stream st) {
  launch("tiled_kernel", tiled_kernel<T, MT, NT, OUT>, sh.tiles * sh.splits, kTileThreads,
         tile_smem(MT * 16, NT, sh.kc, sizeof(T)), st, a, sh, part, tickets);
}

template <typename T, int NT, int OUT>
void tiled_launch_nt(const GemvArgs& a, const TileShape& sh, float* part, int* tickets, Stream st) {
  if (a.n <= 16)
    tiled_launch<T, 1, NT, OUT>(a, sh, part, tickets, st);
  else if (a.n <= 32)
    tiled_launch<T, 2, NT, OUT>(a, sh, part, tickets, st);
  else
    tiled_launch<T, 4, NT, OUT>(a, sh, part, tickets, st);
}

// tile_rows is how many weight rows a projection's outputs read (a GATED launch's out is
// its units: gate and up rows).
template <int OUT>
inline int64_t tile_rows(const GemvArgs& a) {
  return OUT == GEMV_OUT_GATED ? 2 * (int64_t)a.out : a.out;
}

// tiled_proj runs a projection of a.n rows (tiled_fits) with GEMV_IN_T operands; part and
// tickets as tile_part_floats and tile_shape size them (tickets zero between launches).
template <typename T, int OUT>
void tiled_proj(const GemvArgs& a, int blocks, float* part, int* tickets, Stream st) {
  const TileShape sh = tile_shape(tile_rows<OUT>(a), a.in, blocks);
  if (sh.nt == 2)
    tiled_launch_nt<T, 2, OUT>(a, sh, part, tickets, st);
  else
    tiled_launch_nt<T, 1, OUT>(a, sh, part, tickets, st);
}

// tiled_allow_smem lets every tiled kernel use the shared memory it needs (up to 216 KB).
template <typename T, int OUT>
void tiled_allow_smem_out(int device) {
  void (*ks[6])(GemvArgs, TileShape, float*, int*) = {
      tiled_kernel<T, 1, 1, OUT>, tiled_kernel<T, 2, 1, OUT>, tiled_kernel<T, 4, 1, OUT>,
      tiled_kernel<T, 1, 2, OUT>, tiled_kernel<T, 2, 2, OUT>, tiled_kernel<T, 4, 2, OUT>};
  for (auto k : ks) allow_dynamic_smem(k, device);
}

template <typename T>
void tiled_allow_smem(int device) {
  tiled_allow_smem_out<T, GEMV_OUT_F32>(device);
  tiled_allow_smem_out<T, GEMV_OUT_QKV>(device);
  tiled_allow_smem_out<T, GEMV_OUT_ROPE>(device);
  tiled_allow_smem_out<T, GEMV_OUT_GATED>(device);
  tiled_allow_smem_out<T, GEMV_OUT_ACT>(device);
}

}  // namespace gollm

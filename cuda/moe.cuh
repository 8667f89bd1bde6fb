// moe.cuh — the mixture-of-experts stage (forward.cu's moe dispatcher). A pass of up to
// kMoeChunk token rows, all on the device (graphs replay it):
//   1. moe_router_kernel: the router's logits (and the shared expert's gate); a pass of one
//      row is routed in the same kernel by its last block (moe_route_row);
//   2. moe_route_kernel, one block (passes of more rows): each row's softmax in fp32 and its
//      top-k experts, then the (row, expert) pairs sorted by expert — counts, first slots,
//      each pair's slot — and the tiles: each expert's slots in runs of at most R rows;
//   3. the experts' gate·up, then down projections, grouped: a block takes one tile (rows of
//      one expert) and reads only that expert's weights, by the rows an expert gets on
//      average (moe_path): one row, gemvs of a row a tile and the down projections with the
//      combination in one kernel (moe_down1_kernel); at most one, gemvs of up to kMoeRows
//      rows a tile (moe_gemv_kernel); at most kMoeRows, mma.sync over tiles of 16 rows (all
//      of an expert's rows, its weights streamed once through shared memory with the rows
//      beside them: moe_mma_kernel); more, tiles of kMoeTileRows. The shared expert's the
//      same way over every row;
//   4. moe_combine_kernel (passes of more than one row): each row's experts' outputs
//      weighted by its routing, in slot order, plus the gated shared expert's.
// Under expert parallelism a rank's weights hold experts [e0, e0 + el) of the E its router
// scores (MoeRoute): every row is routed over all E alike on every rank, but only the pairs
// of its own experts get slots and tiles (their pos; the others' pos is -1), so its sum is
// its experts' share of each row's, weighted as the whole top-k says; the tensor-parallel
// all-reduce after the stage adds the ranks'. A tile's expert is its index in the rank's
// weights (e − e0).
// A row's arithmetic does not depend on which rows share its tile or its expert's slots;
// the path does depend on the pass's rows, except under batch invariance (64-row tiles at
// every count).
#pragma once
#include "activation.cuh"
#include "common.cuh"
#include "gemv.cuh"
#include "internal.h"
#include "moe.h"

namespace gollm {

// MoeNorm is the RMSNorm a router kernel applies to the residual stream itself, where the
// step's few-row path left xn unwritten: x = h · rsqrt(mean(h²) + eps) · gamma in fp32, and
// the blocks of the first logit columns write it into xn (T) for the experts.
struct MoeNorm {
  const float* h;      // [n][H] fp32, or null: x is xn as it is
  const float* gamma;  // [H]
  float eps;
};

// MoeRoute is a pass's routing: what moe_route_kernel writes and the projections read.
struct MoeRoute {
  int* topi;       // [n·K]: pair p = row·K + k's expert, k-th most probable first
  float* topw;     // [n·K]: its weight
  float* sgate;    // [n]: sigmoid of the shared expert's gate logit (shared only)
  int* sorted;     // [n·K]: the row of each slot (pairs sorted by expert)
  int* pos;        // [n·K]: each pair's slot; -1 for a pair of an expert not held here
  int4* tiles;     // [moe_max_tiles(n·K, E, R)]: (held expert e − e0, first slot, rows, 0)
  int* ntiles;     // the tiles listed
  int e0, el;      // the experts whose weights are held: [e0, e0 + el) (all: 0, E)
};

// moe_route_row: a warp routes row r (logits lg [E + G] fp32, read past L1: another
// block of the router may have written them): the softmax of its E logits, its K most
// probable experts (the lower index first among equals; lane l holds experts l, l + 32, …)
// into rt.topi, rt.topw, their probabilities renormalised to sum to 1 when norm; with a
// shared expert rt.sgate[r] = sigmoid(logit E).
__device__ __forceinline__ void moe_route_row(const float* __restrict__ lg, int r, int E, int G, int K, int norm,
                                              const MoeRoute& rt) {
  const int lane = threadIdx.x & 31;
  float m = -INFINITY;
  for (int e = lane; e < E; e += 32) m = fmaxf(m, __ldcg(lg + e));
  m = warp_max(m);
  float s = 0.f;
  for (int e = lane; e < E; e += 32) s += expf(__ldcg(lg + e) - m);
  s = warp_sum(s);
  // taken marks this lane's experts already picked (expert lane + 32·i: bit i).
  unsigned taken[kMoeMaxExperts / 32 / 32] = {};
  float total = 0.f;
  int* ti = rt.topi + (int64_t)r * K;
  float* tw = rt.topw + (int64_t)r * K;
  for (int k = 0; k < K; k++) {
    float best = -1.f;
    int bi = E;
    for (int e = lane, i = 0; e < E; e += 32, i++) {
      if (taken[i >> 5] >> (i & 31) & 1) continue;
      const float p = expf(__ldcg(lg + e) - m) / s;
      if (p > best) best = p, bi = e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
    }
    // Probabilities that are not numbers pick no expert: take one anyway, so that every
    // pair names a real expert (the row's outputs are then no numbers either).
    bi = min(bi, E - 1);
    if ((bi & 31) == lane) taken[(bi >> 5) >> 5] |= 1u << ((bi >> 5) & 31);
    if (lane == 0) ti[k] = bi, tw[k] = best;
    total += best;
  }
  __syncwarp();
  if (norm)
    for (int k = lane; k < K; k += 32) tw[k] /= total;
  if (G && lane == 0) rt.sgate[r] = 1.f / (1.f + expf(-__ldcg(lg + E)));
}

// moe_one_row_tiles: warp 0 lists a one-row pass's pairs of held experts (distinct) as a
// tile each, in its routing order; pair k's slot is k (-1: an expert not held here).
__device__ __forceinline__ void moe_one_row_tiles(int K, const MoeRoute& rt) {
  const int lane = threadIdx.x & 31;
  __syncwarp();
  int listed = 0;
  for (int k0 = 0; k0 < K; k0 += 32) {
    const int k = k0 + lane, e = k < K ? rt.topi[k] - rt.e0 : -1;
    const bool held = k < K && e >= 0 && e < rt.el;
    const unsigned b = __ballot_sync(0xffffffffu, held);
    if (k < K) rt.sorted[k] = 0, rt.pos[k] = held ? k : -1;
    if (held) rt.tiles[listed + __popc(b & ((1u << lane) - 1))] = make_int4(e, k, 1, 0);
    listed += __popc(b);
  }
  if (lane == 0) *rt.ntiles = listed;
}

// moe_router_kernel: logits[r][j] = x[r] · W[j] fp32 [n][E + G], for the n rows of x
// [n][H] (xn in T, or the norm of h: MoeNorm) and the E + G rows of W: the router's [E][H],
// then with a shared expert (G = 1) its gate [H]. Grid (ceil((E + G) / 8), ceil(n /
// kMoeRows)), 256 threads: warp w the logit column blockIdx.x · 8 + w of rows blockIdx.y ·
// kMoeRows …, lanes along H in 8-column pieces (H % 8 == 0).
// ROUTE (a pass of one row: decode at batch 1) routes the row in the same kernel, in place
// of moe_route_kernel: the block that finishes last (done counts the finished blocks; it
// is zero between passes, and that block sets it back) takes its top K and lists its tiles.
template <typename T, bool NORM, bool ROUTE>
__global__ void __launch_bounds__(256) moe_router_kernel(T* __restrict__ x, MoeNorm nm, const T* __restrict__ router,
                                                         const T* __restrict__ gate, float* __restrict__ logits,
                                                         int n, int H, int E, int G, MoeRoute rt, int* done, int K,
                                                         int norm) {
  __shared__ float inv_rms[kMoeRows];
  __shared__ bool last;
  griddep_launch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int j = blockIdx.x * 8 + warp, r0 = blockIdx.y * kMoeRows;
  const T* w = j < E ? router + (int64_t)j * H : gate;
  griddep_wait();
  if (NORM) {
    // Warp w the mean square of row r0 + w (kMoeRows == 8 warps).
    const int r = r0 + warp;
    float ss = 0.f;
    if (r < n)
      for (int c = lane * 4; c < H; c += 128) {
        const float4 v = *reinterpret_cast<const float4*>(nm.h + (int64_t)r * H + c);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
    ss = warp_sum(ss);
    if (lane == 0) inv_rms[warp] = rsqrtf(ss / H + nm.eps);
    __syncthreads();
  }
  if (j < E + G) {
    float acc[kMoeRows];
#pragma unroll
    for (int r = 0; r < kMoeRows; r++) acc[r] = 0.f;
    for (int c = lane * 8; c < H; c += 256) {
      const uint4 wv = *reinterpret_cast<const uint4*>(w + c);
      float wf[8];
      to_f32x8<T>(wv, wf);
      float g[8];
      if (NORM) {
        const float4 g0 = *reinterpret_cast<const float4*>(nm.gamma + c), g1 = *reinterpret_cast<const float4*>(nm.gamma + c + 4);
        g[0] = g0.x, g[1] = g0.y, g[2] = g0.z, g[3] = g0.w, g[4] = g1.x, g[5] = g1.y, g[6] = g1.z, g[7] = g1.w;
      }
#pragma unroll
      for (int r = 0; r < kMoeRows; r++) {
        if (r0 + r >= n) continue;
        float xf[8];
        if (NORM) {
          const float* hr = nm.h + (int64_t)(r0 + r) * H + c;
          const float4 h0 = *reinterpret_cast<const float4*>(hr), h1 = *reinterpret_cast<const float4*>(hr + 4);
          const float s = inv_rms[r];
          xf[0] = h0.x * s * g[0], xf[1] = h0.y * s * g[1], xf[2] = h0.z * s * g[2], xf[3] = h0.w * s * g[3];
          xf[4] = h1.x * s * g[4], xf[5] = h1.y * s * g[5], xf[6] = h1.z * s * g[6], xf[7] = h1.w * s * g[7];
          if (blockIdx.x == 0 && warp == 0) {
            T* xo = x + (int64_t)(r0 + r) * H + c;
            store4<T>(xo, xf[0], xf[1], xf[2], xf[3]);
            store4<T>(xo + 4, xf[4], xf[5], xf[6], xf[7]);
          }
        } else {
          to_f32x8<T>(*reinterpret_cast<const uint4*>(x + (int64_t)(r0 + r) * H + c), xf);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) acc[r] = fmaf(wf[i], xf[i], acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kMoeRows; r++) {
      const float v = warp_sum(acc[r]);
      if (lane == 0 && r0 + r < n) logits[(int64_t)(r0 + r) * (E + G) + j] = v;
    }
  }
  if (!ROUTE) return;
  // Every block's logits out before its count; the last block's reads after it.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1) == (int)(gridDim.x * gridDim.y) - 1;
  __syncthreads();
  if (!last || warp != 0) return;
  __threadfence();
  moe_route_row(logits, 0, E, G, K, norm, rt);
  moe_one_row_tiles(K, rt);
  if (lane == 0) *done = 0;
}

// warp_scan_incl is the inclusive prefix sum of v over the warp's lanes.
__device__ __forceinline__ int warp_scan_incl(int v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  return v;
}

// block_scan2 turns a and b into their exclusive prefix sums over the block's threads in
// order, and gives their totals; sh holds 64 ints. Called by every thread.
__device__ __forceinline__ void block_scan2(int& a, int& b, int& ta, int& tb, int* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int ia = warp_scan_incl(a), ib = warp_scan_incl(b);
  __syncthreads();
  if (lane == 31) sh[warp] = ia, sh[32 + warp] = ib;
  __syncthreads();
  if (warp == 0) {
    const int sa = warp_scan_incl(lane < nw ? sh[lane] : 0), sb = warp_scan_incl(lane < nw ? sh[32 + lane] : 0);
    __syncwarp();
    sh[lane] = sa, sh[32 + lane] = sb;
  }
  __syncthreads();
  a = (warp ? sh[warp - 1] : 0) + ia - a;
  b = (warp ? sh[32 + warp - 1] : 0) + ib - b;
  ta = sh[nw - 1], tb = sh[32 + nw - 1];
}

// moe_route_kernel: one block of kMoeSortThreads threads (fewer for passes of few pairs) over
// a pass's n rows (logits
// [n][E + G] fp32). Warp w routes rows w, w + 32, …: the softmax of the row's E logits,
// its K most probable experts (the lower index first among equals; lane l holds experts
// l, l + 32, …), their probabilities renormalised to sum to 1 when norm; with a shared
// expert sgate[row] = sigmoid(logit E). Then the n·K pairs of held experts (rt.e0, rt.el;
// the others' pos -1) are counted by expert (their rank within it from shared-memory
// atomics, so a pair's slot among its expert's may vary from run to run — nothing computed
// depends on it), the counts scanned into first slots, pos and sorted filled, and each
// expert's slots listed in tiles of at most R rows; a single row's pairs are a tile each,
// in its routing order.
// Dynamic shared memory: 3·rt.el ints (counts, first slots, first tiles).
__global__ void __launch_bounds__(kMoeSortThreads) moe_route_kernel(const float* __restrict__ logits, int n, int E,
                                                                    int G, int K, int norm, int R, MoeRoute rt) {
  extern __shared__ int moe_sm[];
  __shared__ int scan[64];
  griddep_launch();
  const int EL = rt.el;
  int* cnt = moe_sm;
  int* first = moe_sm + EL;
  int* tfirst = moe_sm + 2 * EL;
  for (int e = threadIdx.x; e < EL; e += blockDim.x) cnt[e] = 0;
  const int warp = threadIdx.x >> 5;
  griddep_wait();
  for (int r = warp; r < n; r += blockDim.x / 32) moe_route_row(logits + (int64_t)r * (E + G), r, E, G, K, norm, rt);
  if (n == 1) {
    // One row (decode at batch 1): its experts are distinct, each pair a tile of its own.
    if (warp == 0) moe_one_row_tiles(K, rt);
    return;
  }
  __syncthreads();
  const int P = n * K;
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    const int e = rt.topi[p] - rt.e0;
    rt.pos[p] = e >= 0 && e < EL ? atomicAdd(&cnt[e], 1) : -1;
  }
  __syncthreads();
  // Thread t scans its run of held experts [e0, e1): first slots and first tiles.
  const int per = (EL + blockDim.x - 1) / blockDim.x, e0 = min(EL, (int)threadIdx.x * per), e1 = min(EL, e0 + per);
  int a = 0, b = 0, ta, tb;
  for (int e = e0; e < e1; e++) a += cnt[e], b += (cnt[e] + R - 1) / R;
  block_scan2(a, b, ta, tb, scan);
  for (int e = e0; e < e1; e++) {
    first[e] = a, tfirst[e] = b;
    a += cnt[e], b += (cnt[e] + R - 1) / R;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    if (rt.pos[p] < 0) continue;
    const int slot = first[rt.topi[p] - rt.e0] + rt.pos[p];
    rt.pos[p] = slot;
    rt.sorted[slot] = p / K;
  }
  for (int e = threadIdx.x; e < EL; e += blockDim.x)
    for (int t = 0; t * R < cnt[e]; t++)
      rt.tiles[tfirst[e] + t] = make_int4(e, first[e] + t * R, min(R, cnt[e] - t * R), 0);
  if (threadIdx.x == 0) *rt.ntiles = tb;
}

// MoeProj is one grouped projection of a pass: per tile, its expert's weights W_e = w +
// e · wstride ([2·units][in] gated: the gate's rows, then the up-projection's; else
// [units][in]) times the tile's input rows — x[sorted[slot]] with sorted, else x[slot] —
// into y[slot]: T(act(gate) · up) [·][units] gated, else fp32 [·][units].
struct MoeProj {
  const void* w;
  int64_t wstride;
  const void* x;
  const int* sorted;
  const int4* tiles;   // null: a dense pass, tile t rows t·R … of n (the shared expert)
  const int* ntiles;
  void* y;
  int in, units, act, n;
};

// moe_tile finds block b's tile: false when it has none.
__device__ __forceinline__ bool moe_tile(const MoeProj& a, int b, int R, int& e, int& s0, int& cnt) {
  if (a.tiles) {
    if (b >= *a.ntiles) return false;
    const int4 t = a.tiles[b];
    e = t.x, s0 = t.y, cnt = t.z;
    return true;
  }
  e = 0, s0 = b * R, cnt = min(R, a.n - s0);
  return cnt > 0;
}

// moe_gemv_kernel: a grouped projection (MoeProj) as gemvs, a block a tile of up to RT
// rows (kMoeRows, or 1 where every tile is one row: decode at batch 1) and 8·U units of it:
// warp w takes units (blockIdx.x · 8 + w) · U …, a unit one weight row (two gated: its
// gate's and its up's), lanes along in — 16-byte pieces when VEC (in % 8 == 0), else one
// element —, the tile's rows read from L1/L2 beside.
// Grid (ceil(units / (8·U)), tiles bound), 256 threads.
template <typename T, bool GATED, bool VEC, int RT>
__global__ void __launch_bounds__(256) moe_gemv_kernel(MoeProj a) {
  constexpr int U = GATED ? 2 : 4, RW = GATED ? 2 * U : U;
  griddep_launch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int u0 = (blockIdx.x * 8 + warp) * U;
  if (u0 >= a.units) return;
  griddep_wait();
  int e, s0, cnt;
  if (!moe_tile(a, blockIdx.y, RT, e, s0, cnt)) return;
  const T* W = static_cast<const T*>(a.w) + (int64_t)e * a.wstride;
  const T* wr[RW];
#pragma unroll
  for (int i = 0; i < U; i++) {
    const bool ok = u0 + i < a.units;
    wr[i] = ok ? W + (int64_t)(u0 + i) * a.in : nullptr;
    if (GATED) wr[U + i] = ok ? W + (int64_t)(a.units + u0 + i) * a.in : nullptr;
  }
  const T* xr[RT];
#pragma unroll
  for (int r = 0; r < RT; r++)
    xr[r] = r < cnt ? static_cast<const T*>(a.x) + (int64_t)(a.sorted ? a.sorted[s0 + r] : s0 + r) * a.in : nullptr;
  float acc[RW][RT];
#pragma unroll
  for (int i = 0; i < RW; i++)
#pragma unroll
    for (int r = 0; r < RT; r++) acc[i][r] = 0.f;
  if (VEC && RT == 1) {
    // One row: B pieces of every weight row in flight at once, their loads before their dots.
    constexpr int B = 4;
    for (int c0 = lane * 8; c0 < a.in; c0 += 256 * B) {
      uint4 wv[B][RW], xv[B];
#pragma unroll
      for (int u = 0; u < B; u++) {
        const int c = c0 + 256 * u;
        const bool ok = c < a.in;
        xv[u] = ok ? *reinterpret_cast<const uint4*>(xr[0] + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < RW; i++)
          wv[u][i] = ok && wr[i] ? __ldg(reinterpret_cast<const uint4*>(wr[i] + c)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < B; u++)
#pragma unroll
        for (int i = 0; i < RW; i++) dot8<T>(wv[u][i], xv[u], acc[i][0]);
    }
  } else if (VEC) {
#pragma unroll 2
    for (int c = lane * 8; c < a.in; c += 256) {
      uint4 wv[RW];
#pragma unroll
      for (int i = 0; i < RW; i++)
        wv[i] = wr[i] ? __ldg(reinterpret_cast<const uint4*>(wr[i] + c)) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int r = 0; r < RT; r++) {
        if (r < cnt) {
          const uint4 xv = *reinterpret_cast<const uint4*>(xr[r] + c);
#pragma unroll
          for (int i = 0; i < RW; i++) dot8<T>(wv[i], xv, acc[i][r]);
        }
      }
    }
  } else {
    for (int c = lane; c < a.in; c += 32) {
      float wv[RW];
#pragma unroll
      for (int i = 0; i < RW; i++) wv[i] = wr[i] ? to_f32(wr[i][c]) : 0.f;
#pragma unroll
      for (int r = 0; r < RT; r++) {
        if (r < cnt) {
          const float xv = to_f32(xr[r][c]);
#pragma unroll
          for (int i = 0; i < RW; i++) acc[i][r] = fmaf(wv[i], xv, acc[i][r]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RW; i++)
#pragma unroll
    for (int r = 0; r < RT; r++) acc[i][r] = warp_sum(acc[i][r]);
  // Lane l stores unit l / RT of row l % RT (U · RT ≤ 32).
  const int i = lane / RT, r = lane % RT;
  if (i >= U || r >= cnt || u0 + i >= a.units) return;
  float v = 0.f, up = 0.f;
#pragma unroll
  for (int ii = 0; ii < U; ii++)
#pragma unroll
    for (int rr = 0; rr < RT; rr++)
      if (ii == i && rr == r) {
        v = acc[ii][rr];
        if (GATED) up = acc[U + ii][rr];
      }
  const int64_t o = (int64_t)(s0 + r) * a.units + u0 + i;
  if (GATED)
    static_cast<T*>(a.y)[o] = from_f32<T>(activate(v, a.act) * up);
  else
    static_cast<float*>(a.y)[o] = v;
}

// moe_mma_kernel: a grouped projection (MoeProj) on the tensor cores, a block a tile of up
// to M = 16·WM·MT rows and 128 weight rows: gated, 64 units' gate and up rows, else 128
// output rows. Eight warps, WM along the rows × WN = 8 / WM along the weights: warp (wm, wn)
// holds rows M / WM · wm … (MT m16 tiles) and SW = 128 / WN weight slots from SW · wn (NT =
// SW / 8 n8 tiles); gated, a warp's slots are SW / 2 units' gate rows, then the same units'
// up rows, so that a thread holds a unit's gate and up sums in acc[·][j] and
// acc[·][j + NT / 2]. Two shapes: M = 64 (WM 2, MT 2: many rows an expert) and M = 16 (WM 1,
// MT 1: a few rows an expert, each expert's rows one tile, its weights read once). The
// reduction goes in steps of 32 columns through shared memory (cp.async, S stages; rows,
// weights and columns past the tile's zero-filled, in % 8 == 0), operands by ldmatrix; a
// row's sums do not depend on the tile's other rows.
// Grid (ceil(units / 64) gated, else ceil(units / 128); tiles bound), 256 threads.
constexpr int kMoeMmaK = 32;           // columns a stage holds
constexpr int kMoeMmaLd = kMoeMmaK + 8;  // a row's stride in shared memory (80 bytes: ldmatrix conflict-free)
template <typename T, bool GATED, int WM, int MT, int S>
__global__ void __launch_bounds__(256) moe_mma_kernel(MoeProj a) {
  constexpr int M = 16 * WM * MT, C = 128, WN = 8 / WM, SW = C / WN, NT = SW / 8;
  static_assert(NT % 2 == 0 && M <= 64 && S >= 2, "moe_mma_kernel shape");
  __shared__ __align__(16) T xs[S][M][kMoeMmaLd];
  __shared__ __align__(16) T ws[S][C][kMoeMmaLd];
  griddep_launch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp / WN, wn = warp % WN;
  const int g = lane >> 2, q = lane & 3;
  griddep_wait();
  int e, s0, cnt;
  if (!moe_tile(a, blockIdx.y, M, e, s0, cnt)) return;
  const T* W = static_cast<const T*>(a.w) + (int64_t)e * a.wstride;
  // Thread t stages piece t % 4 (8 columns) of x row t / 4 (t < 4·M) and of weight slots
  // t / 4 and t / 4 + 64.
  const int pc = threadIdx.x & 3, pr = threadIdx.x >> 2;
  const bool xrow = pr < M;
  const T* xsrc = xrow && pr < cnt
                      ? static_cast<const T*>(a.x) + (int64_t)(a.sorted ? a.sorted[s0 + pr] : s0 + pr) * a.in
                      : nullptr;
  const T* wsrc[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int slot = pr + 64 * h;
    int64_t row;
    if (GATED) {
      // Slot s of warp column wn = s / SW: unit SW / 2 · wn + s % (SW / 2) of the block's,
      // gate or up.
      const int64_t u = (int64_t)blockIdx.x * 64 + SW / 2 * (slot / SW) + slot % (SW / 2);
      row = u < a.units ? (slot % SW < SW / 2 ? u : a.units + u) : -1;
    } else {
      const int64_t o = (int64_t)blockIdx.x * C + slot;
      row = o < a.units ? o : -1;
    }
    wsrc[h] = row < 0 ? nullptr : W + row * a.in;
  }
  auto stage = [&](int k, int buf) {
    const int c = k * kMoeMmaK + pc * 8;
    const bool in = c < a.in;
    if (xrow)
      cp_async16_zfill(&xs[buf][pr][pc * 8], xsrc && in ? xsrc + c : static_cast<const T*>(a.x),
                       xsrc && in ? 16 : 0);
#pragma unroll
    for (int h = 0; h < 2; h++)
      cp_async16_zfill(&ws[buf][pr + 64 * h][pc * 8], wsrc[h] && in ? wsrc[h] + c : W, wsrc[h] && in ? 16 : 0);
  };
  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int j = 0; j < NT; j++) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
  const int steps = (a.in + kMoeMmaK - 1) / kMoeMmaK;
#pragma unroll
  for (int k = 0; k < S - 1; k++) {
    if (k < steps) stage(k, k);
    cp_async_commit();
  }
  for (int k = 0; k < steps; k++) {
    cp_async_wait<S - 2>();
    // Step k's stage is here for every thread, and every thread is done with step k − 1's
    // buffer, which step k + S − 1 takes.
    __syncthreads();
    if (k + S - 1 < steps) stage(k + S - 1, (k + S - 1) % S);
    cp_async_commit();
    const int b = k % S;
#pragma unroll
    for (int kk = 0; kk < kMoeMmaK; kk += 16) {
      uint32_t af[MT][4], bf[NT / 2][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
        ldsm_x4(af[mt], &xs[b][M / WM * wm + 16 * mt + (lane & 7) + ((lane >> 3) & 1) * 8][kk + (lane >> 4) * 8]);
#pragma unroll
      for (int jp = 0; jp < NT / 2; jp++)
        ldsm_x4(bf[jp], &ws[b][SW * wn + 16 * jp + (lane & 7) + (lane >> 4) * 8][kk + ((lane >> 3) & 1) * 8]);
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
          mma_16816<T>(acc[mt][j], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[j >> 1][(j & 1) * 2],
                       bf[j >> 1][(j & 1) * 2 + 1]);
    }
  }
  // acc[mt][j][h·2 + c]: row M / WM · wm + 16·mt + g + 8·h, slot SW·wn + 8·j + 2·q + c.
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = M / WM * wm + 16 * mt + g + 8 * h;
      if (r >= cnt) continue;
      const int64_t yrow = (int64_t)(s0 + r) * a.units;
#pragma unroll
      for (int c = 0; c < 2; c++) {
        if (GATED) {
#pragma unroll
          for (int j = 0; j < NT / 2; j++) {
            const int64_t u = (int64_t)blockIdx.x * 64 + SW / 2 * wn + 8 * j + 2 * q + c;
            if (u < a.units)
              static_cast<T*>(a.y)[yrow + u] =
                  from_f32<T>(activate(acc[mt][j][2 * h + c], a.act) * acc[mt][j + NT / 2][2 * h + c]);
          }
        } else {
#pragma unroll
          for (int j = 0; j < NT; j++) {
            const int64_t o = (int64_t)blockIdx.x * C + SW * wn + 8 * j + 2 * q + c;
            if (o < a.units) static_cast<float*>(a.y)[yrow + o] = acc[mt][j][2 * h + c];
          }
        }
      }
    }
}

// moe_down1_kernel: one row's down projections and their combination in one kernel, for a
// pass of a single row (decode at batch 1): out[o] (+)= Σ_k topw[k] · (W2_{topi[k] − e0}[o]
// · act[pos[k]]) (k in order, the pairs of held experts: pos[k] ≥ 0), plus sgate · (SW2[o] ·
// sact) with a shared expert (sw2 not null): W2 = w2 + e · H·MI [H][MI] (e a held expert's
// index), SW2 [H][SI], act [K][MI] and sact [SI] in T, out fp32
// [H], added to when add. Warp w of block b takes output column o = 8·b + w: lanes along
// the concatenation of its K (+1) weight rows in 16-byte pieces (MI % 8 == 0, SI % 8 == 0),
// each piece's dot weighted by its expert's routing weight into the lane's sum (then the
// shared expert's), then one warp sum — a fixed order, so that the result does not vary
// from run to run.
// Grid ceil(H / 8), 256 threads.
template <typename T>
__global__ void __launch_bounds__(256) moe_down1_kernel(const T* __restrict__ w2, const T* __restrict__ act,
                                                        const int* __restrict__ topi, const float* __restrict__ topw,
                                                        const int* __restrict__ pos, const T* __restrict__ sw2,
                                                        const T* __restrict__ sact, const float* __restrict__ sgate,
                                                        float* __restrict__ out, int H, int MI, int SI, int K,
                                                        int e0, int add) {
  griddep_launch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int o = blockIdx.x * 8 + warp;
  griddep_wait();
  __shared__ int se[kMoeMaxTopK], sp[kMoeMaxTopK];
  __shared__ float sw[kMoeMaxTopK];
  for (int k = threadIdx.x; k < K; k += blockDim.x) se[k] = topi[k] - e0, sp[k] = pos[k], sw[k] = topw[k];
  __syncthreads();
  if (o >= H) return;
  // Eight pieces a lane in flight at once: their loads first, then their dots.
  constexpr int B = 8;
  const int P = MI / 8, KP = K * P;
  float acc = 0.f;
  for (int i0 = lane; i0 < KP; i0 += 32 * B) {
    uint4 wv[B], xv[B];
    float rw[B];
#pragma unroll
    for (int u = 0; u < B; u++) {
      const int i = i0 + 32 * u, k = i / P;
      if (i < KP && sp[k] >= 0) {
        const int c = (i - k * P) * 8;
        wv[u] = __ldg(reinterpret_cast<const uint4*>(w2 + ((int64_t)se[k] * H + o) * MI + c));
        xv[u] = *reinterpret_cast<const uint4*>(act + (int64_t)sp[k] * MI + c);
        rw[u] = sw[k];
      } else {
        wv[u] = xv[u] = make_uint4(0, 0, 0, 0), rw[u] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < B; u++) {
      float d = 0.f;
      dot8<T>(wv[u], xv[u], d);
      acc = fmaf(rw[u], d, acc);
    }
  }
  if (sw2) {
    const float g = *sgate;
    for (int c = lane * 8; c < SI; c += 256) {
      float d = 0.f;
      dot8<T>(__ldg(reinterpret_cast<const uint4*>(sw2 + (int64_t)o * SI + c)), *reinterpret_cast<const uint4*>(sact + c),
              d);
      acc = fmaf(g, d, acc);
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) out[o] = add ? out[o] + acc : acc;
}

// moe_combine_kernel: out[r] = Σ_k topw[r·K + k] · y[pos[r·K + k]] (k in order, the pairs
// of held experts: pos ≥ 0), plus
// sgate[r] · sy[r] with a shared expert, for the pass's rows r: [n][H] fp32 added to out
// when add (the residual stream), else written (the branch). Grid n, 256 threads, four
// columns a thread (H % 4 == 0).
__global__ void __launch_bounds__(256) moe_combine_kernel(const float* __restrict__ topw, const int* __restrict__ pos,
                                                          const float* __restrict__ y, const float* __restrict__ sgate,
                                                          const float* __restrict__ sy, float* __restrict__ out, int H,
                                                          int K, int add) {
  griddep_launch();
  const int r = blockIdx.x;
  griddep_wait();
  for (int c = threadIdx.x * 4; c < H; c += 1024) {
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = 0; k < K; k++) {
      const int slot = pos[r * K + k];
      if (slot < 0) continue;
      const float w = topw[r * K + k];
      const float4 v = *reinterpret_cast<const float4*>(y + (int64_t)slot * H + c);
      s.x = fmaf(w, v.x, s.x), s.y = fmaf(w, v.y, s.y), s.z = fmaf(w, v.z, s.z), s.w = fmaf(w, v.w, s.w);
    }
    if (sy) {
      const float w = sgate[r];
      const float4 v = *reinterpret_cast<const float4*>(sy + (int64_t)r * H + c);
      s.x = fmaf(w, v.x, s.x), s.y = fmaf(w, v.y, s.y), s.z = fmaf(w, v.z, s.z), s.w = fmaf(w, v.w, s.w);
    }
    float4* o = reinterpret_cast<float4*>(out + (int64_t)r * H + c);
    if (add) {
      const float4 h = *o;
      s.x += h.x, s.y += h.y, s.z += h.z, s.w += h.w;
    }
    *o = s;
  }
}

// MoePath is how a pass's grouped projections run, by the rows its experts get.
enum class MoePath {
  Gemv1,  // one row (decode at batch 1): gemvs of one row a tile, the down projections and
          // the combination in one kernel (moe_down1_kernel)
  Gemv,   // at most one row an expert on average: gemvs of up to kMoeRows rows a tile
  Mma16,  // up to kMoeRows on average: the tensor cores, tiles of up to 16 rows
  Mma64,  // more: the tensor cores, tiles of up to kMoeTileRows rows
};

// MoePass is one pass of the stage: its rows' normed inputs, the stage's weights, the
// buffers, where the output goes.
template <typename T>
struct MoePass {
  T* x;                    // [n][H] the rows' normed inputs (written here with nm.h)
  MoeNorm nm;              // the norm the router applies to h, where xn is not written
  const Stage* s;          // the MOE stage (weights resolved)
  int n, H, E, K, MI, SI;  // rows, hidden, experts, top-k, expert and shared units
  float* logits;           // [n][E + 1]
  MoeRoute rt;
  T* act;                  // [n·K][MI]
  float* y;                // [n·K][H]
  T* sact;                 // [n][SI]
  float* sy;               // [n][H]
  float* out;              // [n][H]
  bool add;                // add into out (the residual stream) rather than write it
  bool invariant;          // batch invariance: the same path at every row count
};

// moe_path picks a pass's path. Under batch invariance the tensor cores' 64-row tiles at
// every row count (a row's arithmetic then does not depend on how many rows its experts
// get), where every width is a multiple of 8; otherwise by the rows an expert gets on
// average (each further tile of a gemv reads its expert's weights again; a 16-row tile
// holds all of an expert's rows at batch 64 of Qwen3-MoE's 128 experts top 8).
inline MoePath moe_path(int n, int E, int K, int H, int MI, int SI, bool invariant) {
  const bool mma_fits = H % 8 == 0 && MI % 8 == 0 && SI % 8 == 0;
  if (invariant) return mma_fits ? MoePath::Mma64 : MoePath::Gemv;
  if (n == 1) return MoePath::Gemv1;
  const int64_t pairs = (int64_t)n * K;
  if (!mma_fits || pairs <= E) return MoePath::Gemv;
  return pairs <= (int64_t)kMoeRows * E ? MoePath::Mma16 : MoePath::Mma64;
}

// moe_tile_rows is the most rows a tile of path holds (the routing kernel's R).
inline int moe_tile_rows(MoePath path) {
  switch (path) {
    case MoePath::Gemv1: return 1;
    case MoePath::Gemv: return kMoeRows;
    case MoePath::Mma16: return 16;
    default: return kMoeTileRows;
  }
}

// moe_project launches one grouped projection along path.
template <typename T, bool GATED>
void moe_project(const MoeProj& a, int tiles, MoePath path, Stream st) {
  const int units = a.units;
  const dim3 mgrid(ceil_div(units, GATED ? 64 : 128), tiles), ggrid(ceil_div(units, GATED ? 16 : 32), tiles);
  switch (path) {
    case MoePath::Mma64:
      launch("moe_mma_kernel", moe_mma_kernel<T, GATED, 2, 2, 3>, mgrid, 256, 0, st, a);
      return;
    case MoePath::Mma16:
      launch("moe_mma_kernel", moe_mma_kernel<T, GATED, 1, 1, 4>, mgrid, 256, 0, st, a);
      return;
    case MoePath::Gemv1:
      if (a.in % 8 == 0)
        launch("moe_gemv_kernel", moe_gemv_kernel<T, GATED, true, 1>, ggrid, 256, 0, st, a);
      else
        launch("moe_gemv_kernel", moe_gemv_kernel<T, GATED, false, 1>, ggrid, 256, 0, st, a);
      return;
    case MoePath::Gemv:
      if (a.in % 8 == 0)
        launch("moe_gemv_kernel", moe_gemv_kernel<T, GATED, true, kMoeRows>, ggrid, 256, 0, st, a);
      else
        launch("moe_gemv_kernel", moe_gemv_kernel<T, GATED, false, kMoeRows>, ggrid, 256, 0, st, a);
      return;
  }
}

// moe_allow_smem lets the routing kernel hold the counts of kMoeMaxExperts experts.
inline void moe_allow_smem(int device) { allow_dynamic_smem(moe_route_kernel, device); }

// moe_pass launches a pass (the file's comment). The tile bounds size the grids; the tiles
// a pass really has are on the device (blocks past them return at once).
template <typename T>
void moe_pass(const MoePass<T>& p, Stream st) {
  const Stage& s = *p.s;
  const int n = p.n, E = p.E, K = p.K, G = s.s.shared ? 1 : 0;
  const MoePath path = moe_path(n, E, K, p.H, p.MI, G ? p.SI : 0, p.invariant);
  const int R = moe_tile_rows(path);
  const dim3 rgrid(ceil_div(E + G, 8), ceil_div(n, kMoeRows));
  const T* router = static_cast<const T*>(s.router);
  const T* sgate = static_cast<const T*>(s.shared_gate);
  int* done = p.rt.ntiles + 1;
  const int norm = s.s.norm_topk;
  auto route = [&](auto kernel) {
    launch("moe_router_kernel", kernel, rgrid, 256, 0, st, p.x, p.nm, router, sgate, p.logits, n, p.H, E, G,
           p.rt, done, K, norm);
  };
  // One row is routed by the router's last block; more go through moe_route_kernel.
  if (n == 1) {
    p.nm.h ? route(moe_router_kernel<T, true, true>) : route(moe_router_kernel<T, false, true>);
  } else {
    p.nm.h ? route(moe_router_kernel<T, true, false>) : route(moe_router_kernel<T, false, false>);
    const int threads = n * K <= 256 && E <= 2048 ? 256 : kMoeSortThreads;
    launch("moe_route_kernel", moe_route_kernel, 1, threads, (size_t)3 * p.rt.el * sizeof(int), st,
           static_cast<const float*>(p.logits), n, E, G, K, norm, R, p.rt);
  }
  // One row's pairs are a tile each (moe_route_kernel).
  const int tiles = n == 1 ? K : moe_max_tiles(n * K, p.rt.el, R);
  MoeProj up{s.w, (int64_t)2 * p.MI * p.H, p.x, p.rt.sorted, p.rt.tiles, p.rt.ntiles, p.act, p.H, p.MI,
             s.s.activation, n * K};
  moe_project<T, true>(up, tiles, path, st);
  const int dense = ceil_div(n, R);
  if (G) {
    MoeProj sup{s.shared_w, 0, p.x, nullptr, nullptr, nullptr, p.sact, p.H, p.SI, s.s.activation, n};
    moe_project<T, true>(sup, dense, path, st);
  }
  if (path == MoePath::Gemv1 && p.MI % 8 == 0 && (!G || p.SI % 8 == 0)) {
    launch("moe_down1_kernel", moe_down1_kernel<T>, ceil_div(p.H, 8), 256, 0, st, static_cast<const T*>(s.w2),
           static_cast<const T*>(p.act), static_cast<const int*>(p.rt.topi), static_cast<const float*>(p.rt.topw),
           static_cast<const int*>(p.rt.pos), static_cast<const T*>(G ? s.shared_w2 : nullptr),
           static_cast<const T*>(p.sact), static_cast<const float*>(p.rt.sgate), p.out, p.H, p.MI, p.SI, K,
           p.rt.e0, (int)p.add);
    return;
  }
  MoeProj down{s.w2, (int64_t)p.H * p.MI, p.act, nullptr, p.rt.tiles, p.rt.ntiles, p.y, p.MI, p.H, 0, n * K};
  moe_project<T, false>(down, tiles, path, st);
  if (G) {
    MoeProj sdown{s.shared_w2, 0, p.sact, nullptr, nullptr, nullptr, p.sy, p.SI, p.H, 0, n};
    moe_project<T, false>(sdown, dense, path, st);
  }
  launch("moe_combine_kernel", moe_combine_kernel, n, 256, 0, st, static_cast<const float*>(p.rt.topw),
         static_cast<const int*>(p.rt.pos), static_cast<const float*>(p.y), static_cast<const float*>(p.rt.sgate),
         static_cast<const float*>(G ? p.sy : nullptr), p.out, p.H, K, (int)p.add);
}

}  // namespace gollm

// sampling.cuh — choosing each sequence's next token on the GPU, one block per sequence,
// with the CPU engine's semantics (engine/sampling.go): bias → repetition, presence and
// frequency penalties → masks (min length, bad words) → greedy, or temperature → top-k →
// top-p → a draw with the caller's uniform number, in the order (logit desc, id asc).
//
// Top-k, top-p and the draw all ask "which element of the sorted order is the first whose
// running total (of 1s, or of probabilities) crosses a threshold?". Instead of sorting, a
// radix select answers it: four 8-bit passes over an order-preserving integer key of the
// logit narrow it to one logit value, and a scan in id order settles ties.
#pragma once
#include "common.cuh"

namespace gollm {

constexpr int kSampleThreads = 512;
constexpr int kSampleWarps = kSampleThreads / 32;

// SampleScratch is the shared memory of sample_kernel.
struct SampleScratch {
  float hist[kSampleWarps][256];  // per-warp radix histograms
  double bins[256];               // histograms summed over warps
  double red[32];                 // reductions
  float fred[32];
  int ired[32];
  int ired2[32];
  int found;                      // search results
  uint32_t key;
  int id;
  double before;
};

// order_key maps a float to a uint32 that sorts the same way (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Limit restricts a search to the first elements of the sorted order: those with a
// larger key than key, or the same key and an id at most id.
struct Limit {
  bool on;
  uint32_t key;
  int id;
  __device__ __forceinline__ bool admits(uint32_t k, int i) const {
    return !on || k > key || (k == key && i <= id);
  }
};

// Weight is the quantity a search accumulates: 1 per element (count) or its unnormalised
// probability exp((w - mx) * scale).
struct Weight {
  bool mass;
  float mx, scale;
  __device__ __forceinline__ float of(float w) const {
    if (!mass) return 1.f;
    return w == -INFINITY ? 0.f : __expf((w - mx) * scale);
  }
};

__device__ __forceinline__ bool crosses(double x, double thr, bool inclusive) {
  return inclusive ? x >= thr : x > thr;
}

// block_exclusive_scan returns the sum of v over the threads before this one, and the
// block's total in *total.
__device__ __forceinline__ double block_exclusive_scan(double v, double* red, double* total) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  double incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    double u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  __syncthreads();
  if (lane == 31) red[warp] = incl;
  __syncthreads();
  double base = 0, tot = 0;
  for (int w = 0; w < nw; w++) {
    if (w < warp) base += red[w];
    tot += red[w];
  }
  *total = tot;
  return base + incl - v;
}

// find_in_id_order finds the first element, in id order, among those with admit(i),
// whose running weight (starting at before) crosses thr. Each thread scans a contiguous
// range, so one block scan places every range. Returns the id, or -1.
template <typename Admit>
__device__ int find_in_id_order(const float* w, int V, Admit admit, Weight wt, double before,
                                double thr, bool inclusive, SampleScratch& sm) {
  int per = (V + blockDim.x - 1) / blockDim.x;
  int lo = min(V, (int)threadIdx.x * per), hi = min(V, lo + per);
  double local = 0;
  for (int i = lo; i < hi; i++)
    if (admit(i)) local += wt.of(w[i]);
  double total;
  double excl = block_exclusive_scan(local, sm.red, &total);
  if (threadIdx.x == 0) sm.found = -1;
  __syncthreads();
  double run = before + excl;
  if (!crosses(run, thr, inclusive) && crosses(run + local, thr, inclusive)) {
    for (int i = lo; i < hi; i++) {
      if (!admit(i)) continue;
      run += wt.of(w[i]);
      if (crosses(run, thr, inclusive)) {
        sm.found = i;
        break;
      }
    }
  }
  __syncthreads();
  return sm.found;
}

// find_sorted finds the first element of the sorted order (logit desc, id asc), among
// those lim admits, whose running weight crosses thr. On success it returns true and sets
// sm.key and sm.id.
static __device__ bool find_sorted(const float* w, int V, Limit lim, Weight wt, double thr,
                            bool inclusive, SampleScratch& sm) {
  const int warp = threadIdx.x >> 5;
  uint32_t prefix = 0, mask = 0;
  double before = 0;
  for (int pass = 0; pass < 4; pass++) {
    const int shift = 24 - 8 * pass;
    for (int i = threadIdx.x; i < kSampleWarps * 256; i += blockDim.x)
      (&sm.hist[0][0])[i] = 0.f;
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      float x = w[i];
      uint32_t k = order_key(x);
      if ((k & mask) != prefix || !lim.admits(k, i)) continue;
      float v = wt.of(x);
      if (v > 0.f || !wt.mass) atomicAdd(&sm.hist[warp][(k >> shift) & 255], v);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      double s = 0;
      for (int q = 0; q < kSampleWarps; q++) s += sm.hist[q][b];
      sm.bins[b] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = -1;
      double run = before;
      for (int b = 255; b >= 0; b--) {
        if (crosses(run + sm.bins[b], thr, inclusive)) {
          chosen = b;
          break;
        }
        run += sm.bins[b];
      }
      sm.found = chosen;
      sm.before = run;
    }
    __syncthreads();
    if (sm.found < 0) return false;
    prefix |= (uint32_t)sm.found << shift;
    mask |= 0xFFu << shift;
    before = sm.before;
    __syncthreads();
  }
  const uint32_t key = prefix;
  int id = find_in_id_order(
      w, V, [&](int i) { return order_key(w[i]) == key && lim.admits(key, i); }, wt, before, thr,
      inclusive, sm);
  if (id < 0) return false;
  if (threadIdx.x == 0) {
    sm.key = key;
    sm.id = id;
  }
  __syncthreads();
  return true;
}

// min_p_limit narrows lim to the tokens min-p keeps: a probability at least min_p times
// the largest, (w - mx)·scale ≥ ln(min_p) — a prefix of the sorted order too, so the two
// limits meet at the shorter prefix.
__device__ __forceinline__ Limit min_p_limit(Limit lim, float mx, float scale, float min_p) {
  const float thr = mx + logf(min_p) / scale;
  const Limit mp{true, order_key(thr), 0x7fffffff};
  if (!lim.on || mp.key > lim.key) return mp;
  return lim;
}

// sum_weight returns the total weight of the elements lim admits.
static __device__ double sum_weight(const float* w, int V, Limit lim, Weight wt, SampleScratch& sm) {
  double s = 0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float x = w[i];
    if (lim.admits(order_key(x), i)) s += wt.of(x);
  }
  return block_sum(s, sm.red);
}

// first_max is the block's search of w [0, n) for its largest value (mx) and the first
// index holding it (returned): ids rise within a thread, so a thread's first wins its ties,
// and the lower index wins between threads. Every thread gets both.
__device__ __forceinline__ int first_max(const float* w, int n, SampleScratch& sm, float& mx) {
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float x = w[i];
    if (x > bv) bv = x, bi = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sm.fred[warp] = bv, sm.ired[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int q = 1; q < kSampleWarps; q++)
      if (sm.fred[q] > sm.fred[0] || (sm.fred[q] == sm.fred[0] && sm.ired[q] < sm.ired[0]))
        sm.fred[0] = sm.fred[q], sm.ired[0] = sm.ired[q];
  }
  __syncthreads();
  mx = sm.fred[0];
  return sm.ired[0];
}

// cut_draw draws from w [0, n) by weight mass (zall: the whole row's) inside sq's cuts, in
// turn: top-k where k < n (always where kKCuts: the caller knows it), top-p where useP,
// min-p; each cut's kept weight the next's total. The drawn index, or tok where the draw
// finds none.
template <bool kKCuts = false>
__device__ __forceinline__ int cut_draw(const float* w, int n, int k, bool useP, const DevSeq& sq, float mx,
                                        float scale, const Weight& mass, double zall, SampleScratch& sm,
                                        int tok) {
  const Limit all{false, 0u, 0};
  Limit lim = all;
  double z = zall;
  if (kKCuts || k < n) {
    const Weight count{false, 0.f, 1.f};
    if (find_sorted(w, n, all, count, (double)k, true, sm)) {
      lim = Limit{true, sm.key, sm.id};
      z = sum_weight(w, n, lim, mass, sm);
    }
  }
  if (useP && find_sorted(w, n, lim, mass, (double)sq.top_p * z, true, sm)) {
    lim = Limit{true, sm.key, sm.id};
    z = sum_weight(w, n, lim, mass, sm);
  }
  if (sq.min_p > 0.f) {
    lim = min_p_limit(lim, mx, scale, sq.min_p);
    z = sum_weight(w, n, lim, mass, sm);
  }
  return find_sorted(w, n, lim, mass, sq.uniform * z, false, sm) ? sm.id : tok;
}

constexpr int kGreedyThreads = 256;
constexpr int kGreedyUnroll = 8;

// greedy_combine folds the slice (m, id, z) — its first maximum m at id and the sum z of
// exp(w - m) — into (bv, bi, sum): the larger maximum (the lower id on ties) wins and the
// other sum is rescaled to it. Returns (bv, sum); bi is updated in place.
__device__ __forceinline__ float2 greedy_combine(float bv, int& bi, float sum, float m, int id,
                                                 float z) {
  if (m == -INFINITY) return make_float2(bv, sum);
  if (bv == -INFINITY) {
    bi = id;
    return make_float2(m, z);
  }
  if (m > bv || (m == bv && id < bi)) {
    bi = id;
    return make_float2(m, z + sum * __expf(bv - m));
  }
  return make_float2(bv, sum + z * __expf(m - bv));
}

// greedy_merge reduces (bv, bi, sum) over the warp with greedy_combine; every lane ends
// with the warp's result.
__device__ __forceinline__ void greedy_merge(float& bv, int& bi, float& sum) {
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    float os = __shfl_xor_sync(0xffffffffu, sum, o);
    float2 r = greedy_combine(bv, bi, sum, ov, oi, os);
    bv = r.x, sum = r.y;
  }
}

// sample_greedy_kernel: grid (entries, splits ≤ kGreedySplits). Block (e, g) finds the
// first maximum of its slice of the row and the sum of exp(w - its max); the last block of
// a row to finish (an atomic ticket, reset by it) merges the slices into the token and its
// log-probability, -log Σ exp(w - max) (last_block_of). Rows that are not greedy_fast exit
// at once, the whole block. A row with guided decoding's bitmask (allow_off) counts only
// the tokens it allows, as sample_kernel would after masking the rest.
//   logits: rows of V fp32 at a stride of ld floats (the LM head's padded rows, or V).
//   words: the step's input words (bit i%32 of words[allow_off + i/32] allows token i).
//   part: [entries][splits][3] fp32 scratch; tickets: [entries] int, zero between.
static __global__ void __launch_bounds__(kGreedyThreads) sample_greedy_kernel(
    const float* __restrict__ logits, const int32_t* __restrict__ samp_seq,
    const int32_t* __restrict__ samp_row, const DevSeq* __restrict__ seqs,
    const uint32_t* __restrict__ words, float* __restrict__ part, int* __restrict__ tickets,
    int32_t* __restrict__ out_tok, float* __restrict__ out_lp, int V, int64_t ld) {
  __shared__ float fred[32];
  __shared__ int ired[32];
  __shared__ float sred[32];
  griddep_launch();
  // The step's inputs before the wait (dependent loads that overlap the LM head).
  const int e = blockIdx.x, g = blockIdx.y, splits = gridDim.y;
  const int s = samp_seq[e];
  if (s < 0 || !greedy_fast(seqs[s])) return;
  const float* w = logits + (int64_t)samp_row[e] * ld;
  const uint32_t* allow = seqs[s].allow_off >= 0 ? words + seqs[s].allow_off : nullptr;
  griddep_wait();
  const int per = (V + splits - 1) / splits;
  const int lo = g * per, hi = min(V, lo + per);
  // One pass: each thread keeps its first maximum and the sum of exp(w - that maximum),
  // rescaled when the maximum grows; its loads are issued kGreedyUnroll at a time.
  float bv = -INFINITY, sum = 0.f;
  int bi = 0x7fffffff;
  for (int i0 = lo + threadIdx.x; i0 < hi; i0 += kGreedyUnroll * blockDim.x) {
    float x[kGreedyUnroll];
#pragma unroll
    for (int u = 0; u < kGreedyUnroll; u++) {
      const int i = i0 + u * blockDim.x;
      x[u] = w[min(i, hi - 1)];  // clamped: every load issued, none behind a branch
      if (i >= hi) x[u] = -INFINITY;
    }
    if (allow) {
#pragma unroll
      for (int u = 0; u < kGreedyUnroll; u++) {
        const int i = min(i0 + u * blockDim.x, hi - 1);
        if (!((allow[i >> 5] >> (i & 31)) & 1u)) x[u] = -INFINITY;
      }
    }
#pragma unroll
    for (int u = 0; u < kGreedyUnroll; u++) {
      if (x[u] == -INFINITY) continue;
      if (x[u] > bv) {
        sum = sum * __expf(bv - x[u]) + 1.f;  // exp(-inf) = 0 for the first
        bv = x[u];
        bi = i0 + u * blockDim.x;
      } else {
        sum += __expf(x[u] - bv);
      }
    }
  }
  greedy_merge(bv, bi, sum);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) {
    fred[warp] = bv;
    ired[warp] = bi;
    sred[warp] = sum;
  }
  __syncthreads();
  if (warp == 0) {
    bv = lane < nw ? fred[lane] : -INFINITY;
    bi = lane < nw ? ired[lane] : 0x7fffffff;
    sum = lane < nw ? sred[lane] : 0.f;
    greedy_merge(bv, bi, sum);
    if (lane == 0) {
      float* pp = part + ((int64_t)e * splits + g) * 3;
      pp[0] = bv;
      pp[1] = __int_as_float(bi);
      pp[2] = sum;
    }
  }
  if (!last_block_of(tickets + e, splits) || warp != 0) return;
  // The last block's first warp merges the slices, a lane per slice.
  const float* rp = part + (int64_t)e * splits * 3;
  bv = -INFINITY, bi = 0x7fffffff, sum = 0.f;
  for (int q = lane; q < splits; q += 32) {
    float m = __ldcg(rp + q * 3), z = __ldcg(rp + q * 3 + 2);
    int id = __float_as_int(__ldcg(rp + q * 3 + 1));
    float2 acc = greedy_combine(bv, bi, sum, m, id, z);
    bv = acc.x, sum = acc.y;
  }
  greedy_merge(bv, bi, sum);
  if (lane != 0) return;
  if (bv == -INFINITY) {
    out_tok[s] = -2;
    return;
  }
  out_tok[s] = bi;
  out_lp[s] = -logf(sum);
}

// sample_kernel: one block per entry e of the step's sampling list; rows that
// greedy_fast accepts are left to sample_greedy_kernel.
//   pen: (token, count) pairs at word sq.pen_off; masks at sq.mask_off; bias at sq.bias_off.
//   logits: [rows][V] fp32, row samp_row[e] belongs to sequence samp_seq[e]; modified.
//   retlog: [*][V] fp32, the biased logits of sequences with ret_row >= 0.
//   out_tok[seq], out_lp[seq]: the token (-1: none asked, -2: every token masked) and its
//   log-probability under the distribution it was drawn from.
static __global__ void __launch_bounds__(kSampleThreads) sample_kernel(
    float* __restrict__ logits, const int32_t* __restrict__ samp_seq,
    const int32_t* __restrict__ samp_row, const DevSeq* __restrict__ seqs,
    const int32_t* __restrict__ pen, const int32_t* __restrict__ masks, const float* __restrict__ bias,
    float* __restrict__ retlog, int32_t* __restrict__ out_tok, float* __restrict__ out_lp,
    int V) {
  __shared__ SampleScratch sm;
  griddep_launch();
  // The step's inputs before the wait (dependent loads that overlap the LM head).
  const int s = samp_seq[blockIdx.x];
  if (s < 0) return;  // padding of a graph bucket
  const DevSeq sq = seqs[s];
  if (greedy_fast(sq)) return;
  float* w = logits + (int64_t)samp_row[blockIdx.x] * V;
  griddep_wait();
  if (sq.bias_off >= 0) {
    const float* b = bias + sq.bias_off;
    for (int i = threadIdx.x; i < V; i += blockDim.x) w[i] += b[i];
  }
  if (sq.ret_row >= 0) {
    float* o = retlog + (int64_t)sq.ret_row * V;
    for (int i = threadIdx.x; i < V; i += blockDim.x) o[i] = w[i];
  }
  if (!(sq.flags & GOLLM_SEQ_SAMPLE)) {
    if (threadIdx.x == 0) out_tok[s] = -1;
    return;
  }
  __syncthreads();
  const bool useRep = sq.rep != 0.f && sq.rep != 1.f;
  if (useRep || sq.presence != 0.f || sq.frequency != 0.f) {
    for (int k = threadIdx.x; k < sq.pen_cnt; k += blockDim.x) {
      int t = pen[sq.pen_off + 2 * k];
      float l = w[t];
      if (useRep) l = l > 0.f ? l / sq.rep : l * sq.rep;
      l -= sq.presence + sq.frequency * (float)pen[sq.pen_off + 2 * k + 1];
      w[t] = l;
    }
    __syncthreads();
  }
  for (int k = threadIdx.x; k < sq.mask_cnt; k += blockDim.x) w[masks[sq.mask_off + k]] = -INFINITY;
  if (sq.allow_off >= 0) {
    // Guided decoding: every token whose bit is clear is masked.
    const uint32_t* allowed = reinterpret_cast<const uint32_t*>(masks) + sq.allow_off;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
      if (!((allowed[i >> 5] >> (i & 31)) & 1u)) w[i] = -INFINITY;
  }
  __syncthreads();

  float mx;
  const int best = first_max(w, V, sm, mx);
  if (mx == -INFINITY || best >= V) {
    if (threadIdx.x == 0) out_tok[s] = -2;
    return;
  }
  const bool greedy = sq.temperature == 0.f || sq.top_k == 1;
  const float scale = greedy ? 1.f : 1.f / sq.temperature;
  const Limit all{false, 0u, 0};
  const Weight mass{true, mx, scale};
  const double zall = sum_weight(w, V, all, mass, sm);
  int tok = best;
  if (!greedy) {
    int k = sq.top_k;
    if (k <= 0 || k > V) k = V;
    const bool useP = sq.top_p > 0.f && sq.top_p < 1.f;
    if (k == V && !useP && sq.min_p <= 0.f) {
      // No cut: the draw runs over the whole row in id order.
      int t = find_in_id_order(w, V, [](int) { return true; }, mass, 0.0, sq.uniform * zall,
                               false, sm);
      if (t >= 0) tok = t;
    } else {
      tok = cut_draw(w, V, k, useP, sq, mx, scale, mass, zall, sm, tok);
    }
  }
  if (threadIdx.x == 0) {
    out_tok[s] = tok;
    out_lp[s] = (float)((double)(w[tok] - mx) * scale - log(zall));
  }
}

// sample: greedy rows by sample_greedy_kernel, the others by sample_kernel (invariant:
// greedy rows split as a step of one row would split them). padded, when
// not null, holds the same logits at a row stride of lm_head_ld(V) (the LM head's output
// before unpad_rows); it is given only when every row is greedy, whose kernel then reads
// it in place of logits.
inline void sample(float* logits, const float* padded, const int32_t* samp_seq,
            const int32_t* samp_row, const DevSeq* seqs, const int32_t* pen, const int32_t* masks,
            const float* bias, float* retlog, int32_t* out_tok, float* out_lp, int count, int V,
            float* greedy_part, int* greedy_tickets, bool all_greedy, int sms, Stream stream,
            bool invariant = false) {
  if (count == 0) return;
  // Under batch invariance a row's slices (and so its log-probability's sum) are those of
  // a step of one row, whatever the count.
  const int splits = greedy_splits(invariant ? 1 : count, sms);
  launch("sample_greedy_kernel", sample_greedy_kernel, dim3(count, splits),
         kGreedyThreads, 0, stream, padded ? padded : logits, samp_seq, samp_row, seqs,
         reinterpret_cast<const uint32_t*>(masks), greedy_part, greedy_tickets, out_tok, out_lp, V,
         padded ? (int64_t)lm_head_ld(V) : (int64_t)V);
  if (all_greedy) return;  // sample_kernel would exit at once for every row
  launch("sample_kernel", sample_kernel, count, kSampleThreads, 0, stream, logits, samp_seq,
         samp_row, seqs, pen, masks, bias, retlog, out_tok, out_lp, V);
}

}  // namespace gollm

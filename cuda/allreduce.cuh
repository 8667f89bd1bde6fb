// allreduce.cuh — tensor parallelism's custom all-reduce (comm.h: PeerBufs), fused with the
// residual add and the norm after it. Included by allreduce.cu alone.
#pragma once
#include "common.cuh"
#include "comm.h"
#include "sampling.cuh"

namespace gollm {

// ArArgs is what a launch needs of the peer buffers, for the calling rank.
struct ArArgs {
  char* data[kArMaxRanks];       // each rank's [2][slot] payload (peers' through peer access)
  uint32_t* flags[kArMaxRanks];  // each rank's flags [kArMaxRanks][kArBlocks]
  uint32_t* flags2[kArMaxRanks]; // each rank's two-shot second flags, the same shape
  uint32_t* counter;             // this rank's epochs [kArBlocks]
  int* err;                      // this rank's error word (pinned host)
  int* abort;                    // the set's abort word (pinned host)
  unsigned long long timeout_ns;
  unsigned long long slot;       // bytes a parity slot
  int rank, n;
};

constexpr int kArThreads = 512;

// The flags cross GPUs: release stores and acquire loads at system scope (a peer's data
// written before its flag is seen after it), the payload read past L1 (__ldcg).
__device__ __forceinline__ uint32_t ar_ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void ar_st_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ar_clock_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Vectors of W = 16 / sizeof(P) payload elements: one 16-byte load or store.
template <typename P> struct ArVec { static constexpr int W = 16 / sizeof(P); };

template <typename P>
__device__ __forceinline__ void ar_store(P* dst, const float* v) {
  constexpr int W = ArVec<P>::W;
  alignas(16) P out[W];
#pragma unroll
  for (int i = 0; i < W; i++) out[i] = from_f32<P>(v[i]);
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out);
}

// ar_add adds the W payload elements packed in u to acc.
template <typename P>
__device__ __forceinline__ void ar_add(const uint4& u, float* acc) {
  constexpr int W = ArVec<P>::W;
  const P* p = reinterpret_cast<const P*>(&u);
#pragma unroll
  for (int i = 0; i < W; i++) acc[i] += to_f32(p[i]);
}

// ar_sum adds vector v of row j of every rank's payload (region off of each buffer) in
// rank order into acc, in fp32. Every rank's vector is loaded before any is added: the
// peers' loads cross NVLink together.
template <typename P>
__device__ __forceinline__ void ar_sum(const ArArgs& a, size_t off, int j, int hidden, int v, float* acc) {
  constexpr int W = ArVec<P>::W;
  uint4 raw[kArMaxRanks];
#pragma unroll
  for (int src = 0; src < kArMaxRanks; src++)
    if (src < a.n)
      raw[src] = __ldcg(reinterpret_cast<const uint4*>(reinterpret_cast<const P*>(a.data[src] + off) +
                                                       (int64_t)j * hidden + v * W));
#pragma unroll
  for (int i = 0; i < W; i++) acc[i] = 0.f;
#pragma unroll
  for (int src = 0; src < kArMaxRanks; src++)
    if (src < a.n) ar_add<P>(raw[src], acc);
}

// ar_wait spins until the flag reaches epoch (wrapping compare: a peer is at most one call
// ahead), checking the abort word and the clock every 256 polls; false, with the error word
// set, when the set was aborted or timeout_ns passed. A timeout sets the abort word too:
// the ranks' calls no longer pair up, and every later wait of the step (on any rank) ends
// at once instead of after its own timeout.
__device__ bool ar_wait(const ArArgs& a, const uint32_t* flag, uint32_t epoch, int peer) {
  if ((int)(ar_ld_acquire(flag) - epoch) >= 0) return true;
  const unsigned long long t0 = ar_clock_ns();
  for (unsigned k = 1;; k++) {
    if ((int)(ar_ld_acquire(flag) - epoch) >= 0) return true;
    if ((k & 255) != 0) continue;
    int code = 0;
    if (*reinterpret_cast<const volatile int*>(a.abort) != 0)
      code = kArAborted;
    else if (ar_clock_ns() - t0 > a.timeout_ns)
      code = kArTimedOut;
    if (code) {
      // A timeout's word wins over the aborts it causes (written before the abort word).
      volatile int* err = a.err;
      if (code == kArTimedOut || *err == 0) *err = code | (peer << 8);
      __threadfence_system();
      if (code == kArTimedOut) *reinterpret_cast<volatile int*>(a.abort) = 1;
      __threadfence_system();
      return false;
    }
  }
}

// ar_meet is block b's handshake with the peers on flags (ArArgs.flags, or flags2 for the
// two-shot's second): thread t < n raises this block's flag in rank t's memory, then waits
// for rank t's in this rank's. The release orders the block's stores (ordered before it by
// the barrier) before the flag; the acquire and the barrier after order the peers' stores
// before the block's loads. bad, the block's shared word (0 at the kernel's start), is set
// where a peer never came (ar_wait set the error word): the step fails.
__device__ __forceinline__ void ar_meet(const ArArgs& a, uint32_t* const* flags, int b, uint32_t epoch, int& bad) {
  __syncthreads();
  const int t = threadIdx.x;
  if (t < a.n && t != a.rank) {
    ar_st_release(flags[t] + a.rank * kArBlocks + b, epoch);
    if (!ar_wait(a, flags[a.rank] + t * kArBlocks + b, epoch, t)) bad = 1;
  }
  __syncthreads();
}

// ar_meet_first is ar_meet on ArArgs.flags, the block's epoch then recorded whether or not
// every peer came; false where one did not.
__device__ __forceinline__ bool ar_meet_first(const ArArgs& a, int b, uint32_t epoch, int& bad) {
  ar_meet(a, a.flags, b, epoch, bad);
  if (threadIdx.x == 0) a.counter[b] = epoch;
  return !bad;
}

// ar_put_rows writes block b's rows of part (rows b, b + G, …: the j-th of them at row j)
// into mine, the block's region of this rank's buffer, rounded to the payload type P.
template <typename P>
__device__ __forceinline__ void ar_put_rows(P* mine, const float* part, int n_rows, int hidden, int b, int G) {
  constexpr int W = ArVec<P>::W;
  const int nv = hidden / W;
  for (int r = b, j = 0; r < n_rows; r += G, j++) {
    const float* src = part + (int64_t)r * hidden;
    for (int v = threadIdx.x; v < nv; v += blockDim.x) {
      float x[W];
#pragma unroll
      for (int i = 0; i < W; i += 4) {
        const float4 q = *reinterpret_cast<const float4*>(src + v * W + i);
        x[i] = q.x, x[i + 1] = q.y, x[i + 2] = q.z, x[i + 3] = q.w;
      }
      ar_store<P>(mine + (int64_t)j * hidden + v * W, x);
    }
  }
}

// ar_residual is four elements of the new residual stream: (h + sum) + bias, or sum + bias
// without add. ar_norm_acc adds o's squares (RMSNorm) or values (LayerNorm) to s. Both
// round each operation (no contraction), so that the one-shot and two-shot kernels, which
// compute them in different places, agree to the bit.
__device__ __forceinline__ float4 ar_residual(const float* hr, const float* acc, const float* bias, bool add) {
  float4 o = make_float4(acc[0], acc[1], acc[2], acc[3]);
  if (add) {
    const float4 hv = *reinterpret_cast<const float4*>(hr);
    o = make_float4(__fadd_rn(hv.x, o.x), __fadd_rn(hv.y, o.y), __fadd_rn(hv.z, o.z), __fadd_rn(hv.w, o.w));
  }
  if (bias) {
    const float4 bv = *reinterpret_cast<const float4*>(bias);
    o = make_float4(__fadd_rn(o.x, bv.x), __fadd_rn(o.y, bv.y), __fadd_rn(o.z, bv.z), __fadd_rn(o.w, bv.w));
  }
  return o;
}
__device__ __forceinline__ float ar_norm_acc(float s, const float4& o, bool rms) {
  const float t = rms ? __fmaf_rn(o.w, o.w, __fmaf_rn(o.z, o.z, __fmaf_rn(o.y, o.y, __fmul_rn(o.x, o.x))))
                      : __fadd_rn(__fadd_rn(__fadd_rn(o.x, o.y), o.z), o.w);
  return __fadd_rn(s, t);
}

// ar_norm_row norms row hr ([hidden] fp32, written by this block) into xr, s being each
// thread's ar_norm_acc over its vectors: RMSNorm when rms, else LayerNorm with beta.
template <typename T>
__device__ __forceinline__ void ar_norm_row(const float* hr, T* xr, float s, const float* __restrict__ gamma,
                                            const float* __restrict__ beta, int hidden, float eps, bool rms,
                                            float* red) {
  float mean = 0.f, var;
  if (rms) {
    var = block_sum(s, red);
  } else {
    mean = block_sum(s, red) / hidden;
    float d2 = 0.f;
    for (int c = threadIdx.x * 4; c < hidden; c += blockDim.x * 4) {
      // The same threads own the same columns as above only when W == 4; read back
      // through L1 either way (this block wrote them).
      const float4 q = *reinterpret_cast<const float4*>(hr + c);
      const float dx = __fsub_rn(q.x, mean), dy = __fsub_rn(q.y, mean), dz = __fsub_rn(q.z, mean),
                  dw = __fsub_rn(q.w, mean);
      d2 = __fadd_rn(d2, __fmaf_rn(dw, dw, __fmaf_rn(dz, dz, __fmaf_rn(dy, dy, __fmul_rn(dx, dx)))));
    }
    var = block_sum(d2, red);
  }
  const float rstd = rsqrtf(var / hidden + eps);
  for (int c = threadIdx.x * 4; c < hidden; c += blockDim.x * 4) {
    const float4 q = *reinterpret_cast<const float4*>(hr + c);
    const float4 g = *reinterpret_cast<const float4*>(gamma + c);
    float4 be = make_float4(0.f, 0.f, 0.f, 0.f);
    if (beta) be = *reinterpret_cast<const float4*>(beta + c);
    store4<T>(xr + c, __fmaf_rn(__fmul_rn(__fsub_rn(q.x, mean), rstd), g.x, be.x),
              __fmaf_rn(__fmul_rn(__fsub_rn(q.y, mean), rstd), g.y, be.y),
              __fmaf_rn(__fmul_rn(__fsub_rn(q.z, mean), rstd), g.z, be.z),
              __fmaf_rn(__fmul_rn(__fsub_rn(q.w, mean), rstd), g.w, be.w));
  }
}

// ar_norm_kernel all-reduces part over the ranks and adds it to the residual stream, then
// norms it — every rank the same sums in the same order (rank 0 to n-1), so that their h
// and xn agree bit for bit whatever order the peers arrive in.
//   part:  [n_rows][hidden] fp32, this rank's partial sums (sent rounded to P)
//   h:     [n_rows][hidden] fp32; h = (h + Σ part) + bias when add, else Σ part
//   bias:  [hidden] fp32 or null
//   xn:    [n_rows][hidden] T = norm(h): RMSNorm when rms, else LayerNorm with beta
//          ([hidden] fp32 or null); gamma [hidden] fp32
// Grid: G = min(n_rows, kArBlocks) blocks of kArThreads; block b reduces rows b, b + G, …,
// which it stages in region b (slot / kArBlocks bytes) of its epoch's slot. hidden % 8 == 0.
// Under PDL it waits for the previous kernel before anything (the counter too: that kernel's
// completion is every earlier call's), then lets the next one launch, whose prologue then
// overlaps the wait for the peers.
template <typename T, typename P>
__global__ void __launch_bounds__(kArThreads)
    ar_norm_kernel(ArArgs a, const float* part, float* h, const float* __restrict__ bias,
                   T* __restrict__ xn, const float* __restrict__ gamma,
                   const float* __restrict__ beta, int n_rows, int hidden, float eps, bool rms,
                   bool add) {
  constexpr int W = ArVec<P>::W;
  __shared__ float red[32];
  __shared__ int bad;
  griddep_wait();
  griddep_launch();
  const int b = blockIdx.x, G = gridDim.x, nv = hidden / W;
  const uint32_t epoch = a.counter[b] + 1;
  const size_t off = (size_t)(epoch & 1) * a.slot + (size_t)b * (a.slot / kArBlocks);
  if (threadIdx.x == 0) bad = 0;
  ar_put_rows<P>(reinterpret_cast<P*>(a.data[a.rank] + off), part, n_rows, hidden, b, G);
  // A peer that never came fails the step (the host reads the error word); h stays.
  if (!ar_meet_first(a, b, epoch, bad)) return;
  for (int r = b, j = 0; r < n_rows; r += G, j++) {
    float* hr = h + (int64_t)r * hidden;
    float s = 0.f;
    for (int v = threadIdx.x; v < nv; v += blockDim.x) {
      float acc[W];
      ar_sum<P>(a, off, j, hidden, v, acc);
#pragma unroll
      for (int i = 0; i < W; i += 4) {
        const int c = v * W + i;
        const float4 o = ar_residual(hr + c, acc + i, bias ? bias + c : nullptr, add);
        *reinterpret_cast<float4*>(hr + c) = o;
        s = ar_norm_acc(s, o, rms);
      }
    }
    ar_norm_row<T>(hr, xn + (int64_t)r * hidden, s, gamma, beta, hidden, eps, rms, red);
  }
}

// ar_two_kernel is ar_norm_kernel in two shots, for mid-size payloads on 4 or more ranks:
// every rank reads 1/n of each peer's payload and sends back sums, where the one-shot reads
// all of every peer's. Same arguments and grid; block b takes rows b, b + G, … (j-th of them
// the block's row j). Each row's vectors split into n slices, rank s owning vectors
// [s·nv/n, (s+1)·nv/n) (nv = hidden / W):
//   1. the rank's rows, rounded to P, into its region (payload [rpb][hidden] P, rpb =
//      ceil(n_rows / G)); flag 1 up in every peer, wait for theirs;
//   2. its slice of each row summed over the ranks' payloads in rank order (fp32), then the
//      residual add and bias — the one-shot's operations, in its order — into its h and,
//      fp32, into its region's sums ([rpb][hidden] fp32, after the payload); flag 2 up, wait;
//   3. the peers' slices of h copied from their sums, then each row normed in full.
// The sums go back in fp32, not rounded to P, so that h and xn are the one-shot's to the bit
// (a row's results do not depend on which kernel its step's size chose), at 2(n-1)/n of a
// payload back against the (n-1) payloads the one-shot reads: a gain from 4 ranks on.
template <typename T, typename P>
__global__ void __launch_bounds__(kArThreads)
    ar_two_kernel(ArArgs a, const float* part, float* h, const float* __restrict__ bias,
                  T* __restrict__ xn, const float* __restrict__ gamma, const float* __restrict__ beta,
                  int n_rows, int hidden, float eps, bool rms, bool add) {
  constexpr int W = ArVec<P>::W;
  __shared__ float red[32];
  __shared__ int bad;
  griddep_wait();
  griddep_launch();
  const int b = blockIdx.x, G = gridDim.x, nv = hidden / W;
  const int rpb = (n_rows + G - 1) / G;
  const uint32_t epoch = a.counter[b] + 1;
  const size_t off = (size_t)(epoch & 1) * a.slot + (size_t)b * (a.slot / kArBlocks);
  const size_t off_sum = off + (size_t)rpb * hidden * sizeof(P);
  const int lo = (int)((int64_t)a.rank * nv / a.n), hi = (int)((int64_t)(a.rank + 1) * nv / a.n);
  if (threadIdx.x == 0) bad = 0;
  ar_put_rows<P>(reinterpret_cast<P*>(a.data[a.rank] + off), part, n_rows, hidden, b, G);
  // A peer that never came fails the step (the host reads the error word); h stays.
  if (!ar_meet_first(a, b, epoch, bad)) return;
  float* sums = reinterpret_cast<float*>(a.data[a.rank] + off_sum);
  for (int r = b, j = 0; r < n_rows; r += G, j++) {
    float* hr = h + (int64_t)r * hidden;
    for (int v = lo + threadIdx.x; v < hi; v += blockDim.x) {
      float acc[W];
      ar_sum<P>(a, off, j, hidden, v, acc);
#pragma unroll
      for (int i = 0; i < W; i += 4) {
        const int c = v * W + i;
        const float4 o = ar_residual(hr + c, acc + i, bias ? bias + c : nullptr, add);
        *reinterpret_cast<float4*>(hr + c) = o;
        *reinterpret_cast<float4*>(sums + (int64_t)j * hidden + c) = o;
      }
    }
  }
  // The same handshake on the second flags: the sums before the peers read them.
  ar_meet(a, a.flags2, b, epoch, bad);
  if (bad) return;
  for (int r = b, j = 0; r < n_rows; r += G, j++) {
    float* hr = h + (int64_t)r * hidden;
    // The peers' slices: vector v of the row comes from the rank whose slice holds it.
    for (int v = threadIdx.x; v < nv; v += blockDim.x) {
      if (v >= lo && v < hi) continue;
      int src = (int)(((int64_t)v * a.n + a.n - 1) / nv);  // a guess, corrected below
      while (src > 0 && (int64_t)src * nv / a.n > v) src--;
      while (src + 1 < a.n && (int64_t)(src + 1) * nv / a.n <= v) src++;
      const float* peer = reinterpret_cast<const float*>(a.data[src] + off_sum) + (int64_t)j * hidden + v * W;
#pragma unroll
      for (int i = 0; i < W; i += 4)
        *reinterpret_cast<float4*>(hr + v * W + i) = __ldcg(reinterpret_cast<const float4*>(peer + i));
    }
    __syncthreads();
    // The norm's sums over the same vectors a thread owns in ar_norm_kernel, in its order.
    float s = 0.f;
    for (int v = threadIdx.x; v < nv; v += blockDim.x)
#pragma unroll
      for (int i = 0; i < W; i += 4) s = ar_norm_acc(s, *reinterpret_cast<const float4*>(hr + v * W + i), rms);
    ar_norm_row<T>(hr, xn + (int64_t)r * hidden, s, gamma, beta, hidden, eps, rms, red);
  }
}

// ar_greedy_combine merges (m, i, z) — a maximum, its index and the sum of exp(w - m) over
// its part — into (bv, bi, sum); on equal maxima the lower index stays (the first maximum,
// as one GPU's greedy sampling picks it).
__device__ __forceinline__ void ar_greedy_combine(float& bv, int& bi, float& sum, float m, int i, float z) {
  if (m == -INFINITY) return;
  if (m > bv) {
    sum = sum * __expf(bv - m) + z;
    bv = m, bi = i;
  } else {
    sum += z * __expf(m - bv);
    if (m == bv) bi = min(bi, i);
  }
}

// ar_greedy_kernel samples plain greedy rows without gathering the vocabulary: each rank
// reduces its rows of the vocabulary to (maximum, first index of it, Σ exp(w - maximum)),
// the custom all-reduce's buffers carry those 16 bytes a row, and every rank merges them
// in rank order (vocabulary order) into the token and its log-probability, -log Σ — alike
// on every rank. For decode steps whose rows are all greedy_fast without guided decoding's
// mask (it reads none) and return no logits.
//   part: [rows][vr] fp32, this rank's LM head rows (vocabulary rows first..first+valid)
//   samp_seq, samp_row: entry e's sequence (< 0: padding) and its row of part
//   out_tok, out_lp: [sequences]; -2 where every logit is -inf
// Grid: G = min(entries, kArBlocks) blocks of kArThreads; block b takes entries b, b + G, ….
__global__ void __launch_bounds__(kArThreads)
    ar_greedy_kernel(ArArgs a, const float* __restrict__ part, const int32_t* __restrict__ samp_seq,
                     const int32_t* __restrict__ samp_row, int32_t* __restrict__ out_tok,
                     float* __restrict__ out_lp, int entries, int vr, int valid, int first) {
  __shared__ float fred[32], sred[32];
  __shared__ int ired[32];
  __shared__ int bad;
  const int b = blockIdx.x, G = gridDim.x;
  const uint32_t epoch = a.counter[b] + 1;
  const size_t off = (size_t)(epoch & 1) * a.slot + (size_t)b * (a.slot / kArBlocks);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (threadIdx.x == 0) bad = 0;
  float4* mine = reinterpret_cast<float4*>(a.data[a.rank] + off);
  for (int e = b, j = 0; e < entries; e += G, j++) {
    float bv = -INFINITY, sum = 0.f;
    int bi = 0x7fffffff;
    if (samp_seq[e] >= 0) {
      const float* w = part + (int64_t)samp_row[e] * vr;
      for (int i = threadIdx.x; i < valid; i += blockDim.x) ar_greedy_combine(bv, bi, sum, w[i], first + i, 1.f);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m = __shfl_xor_sync(0xffffffffu, bv, o), z = __shfl_xor_sync(0xffffffffu, sum, o);
      const int i = __shfl_xor_sync(0xffffffffu, bi, o);
      ar_greedy_combine(bv, bi, sum, m, i, z);
    }
    __syncthreads();  // the shared slots may still be read for the previous entry
    if (lane == 0) fred[warp] = bv, ired[warp] = bi, sred[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      bv = -INFINITY, bi = 0x7fffffff, sum = 0.f;
      for (int q = 0; q < nw; q++) ar_greedy_combine(bv, bi, sum, fred[q], ired[q], sred[q]);
      mine[j] = make_float4(bv, __int_as_float(bi), sum, 0.f);
    }
  }
  if (!ar_meet_first(a, b, epoch, bad)) return;
  // A thread an entry: the ranks' triples merged in rank order.
  const int t = threadIdx.x;
  for (int e = b + G * t, j = t; e < entries; e += G * blockDim.x, j += blockDim.x) {
    const int s = samp_seq[e];
    if (s < 0) continue;
    float bv = -INFINITY, sum = 0.f;
    int bi = 0x7fffffff;
    for (int src = 0; src < a.n; src++) {
      const float4 q = __ldcg(reinterpret_cast<const float4*>(a.data[src] + off) + j);
      ar_greedy_combine(bv, bi, sum, q.x, __float_as_int(q.y), q.z);
    }
    if (bv == -INFINITY) {
      out_tok[s] = -2;
      continue;
    }
    out_tok[s] = bi;
    out_lp[s] = -logf(sum);
  }
}


// ar_cand_kernel: the first half of sampling a decode step's rows without gathering the
// vocabulary, for steps whose rows are all cand_fast or plain greedy. Each rank reduces
// each row of its vocabulary shard to its first kTpCandK tokens in the sampling order
// (logit desc, id asc; all of them where the shard is smaller), in id order, with the
// shard's maximum m and Σ exp((w − m)·scale) (scale 1/temperature, 1 for greedy rows);
// the custom all-reduce's buffers carry those; every rank then lays the ranks' candidates
// out in rank order — global id order — as a compact row, and Σ over the whole vocabulary
// rescaled to the largest maximum (rank order, double). ar_cand_sample_kernel samples the
// compact rows as sample_kernel samples whole ones. The union holds every token top-k can
// keep (k ≤ kTpCandK), and top-p and min-p only cut inside it.
//   part: [rows][vr] fp32, this rank's LM head rows (vocabulary rows first..first+valid)
//   crow: [entries][n·kTpCandK] fp32 and cid: the same, int32: the compact rows and their
//         tokens (-1: padding, -inf); zfull: [entries] double
// Grid: G = min(entries, kArBlocks) blocks of kArThreads (= kSampleThreads); block b
// takes entries b, b + G, …, staging entry j of them at record j of its region.
constexpr int kTpCandK = 64;
static_assert(kArThreads == kSampleThreads, "ar_cand_kernel runs sampling.cuh's searches");
struct CandRecord {
  float val[kTpCandK];
  int32_t id[kTpCandK];
  float m;
  float pad_;
  double z;
};

__global__ void __launch_bounds__(kArThreads)
    ar_cand_kernel(ArArgs a, const float* __restrict__ part, const int32_t* __restrict__ samp_seq,
                   const int32_t* __restrict__ samp_row, const DevSeq* __restrict__ seqs,
                   float* __restrict__ crow, int32_t* __restrict__ cid, double* __restrict__ zfull,
                   int entries, int vr, int valid, int first) {
  __shared__ SampleScratch sm;
  __shared__ int bad;
  const int b = blockIdx.x, G = gridDim.x;
  const uint32_t epoch = a.counter[b] + 1;
  const size_t off = (size_t)(epoch & 1) * a.slot + (size_t)b * (a.slot / kArBlocks);
  if (threadIdx.x == 0) bad = 0;
  CandRecord* mine = reinterpret_cast<CandRecord*>(a.data[a.rank] + off);
  for (int e = b, j = 0; e < entries; e += G, j++) {
    CandRecord* rec = mine + j;
    const int s = samp_seq[e];
    int n_out = 0;
    if (s >= 0 && valid > 0) {
      const DevSeq sq = seqs[s];
      const bool greedy = sq.temperature == 0.f || sq.top_k == 1;
      const float scale = greedy ? 1.f : 1.f / sq.temperature;
      const float* w = part + (int64_t)samp_row[e] * vr;
      // The shard's maximum and its sum of exponentials.
      float m = -INFINITY;
      for (int i = threadIdx.x; i < valid; i += blockDim.x) m = fmaxf(m, w[i]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      __syncthreads();
      if ((threadIdx.x & 31) == 0) sm.fred[threadIdx.x >> 5] = m;
      __syncthreads();
      m = -INFINITY;
      for (int q = 0; q < kSampleWarps; q++) m = fmaxf(m, sm.fred[q]);
      const Weight mass{true, m, scale};
      const double z = m == -INFINITY ? 0.0 : sum_weight(w, valid, Limit{false, 0u, 0}, mass, sm);
      // The first kTpCandK in the sampling order, written in id order.
      Limit lim{false, 0u, 0};
      if (valid > kTpCandK && find_sorted(w, valid, lim, Weight{false, 0.f, 1.f}, (double)kTpCandK, true, sm))
        lim = Limit{true, sm.key, sm.id};
      const int per = (valid + blockDim.x - 1) / blockDim.x;
      const int lo = min(valid, (int)threadIdx.x * per), hi = min(valid, lo + per);
      int cnt = 0;
      for (int i = lo; i < hi; i++) cnt += lim.admits(order_key(w[i]), i);
      double total;
      int pos = (int)block_exclusive_scan((double)cnt, sm.red, &total);
      for (int i = lo; i < hi && pos < kTpCandK; i++)
        if (lim.admits(order_key(w[i]), i)) rec->val[pos] = w[i], rec->id[pos] = first + i, pos++;
      n_out = min((int)total, kTpCandK);
      if (threadIdx.x == 0) rec->m = m, rec->z = z;
    } else if (threadIdx.x == 0) {
      rec->m = -INFINITY, rec->z = 0.0;
    }
    for (int k = n_out + threadIdx.x; k < kTpCandK; k += blockDim.x) rec->val[k] = -INFINITY, rec->id[k] = -1;
    __syncthreads();
  }
  if (!ar_meet_first(a, b, epoch, bad)) return;
  const int nc = a.n * kTpCandK;
  for (int e = b, j = 0; e < entries; e += G, j++) {
    if (samp_seq[e] < 0) continue;
    for (int k = threadIdx.x; k < nc; k += blockDim.x) {
      const CandRecord* rec = reinterpret_cast<const CandRecord*>(a.data[k / kTpCandK] + off) + j;
      crow[(int64_t)e * nc + k] = __ldcg(&rec->val[k % kTpCandK]);
      cid[(int64_t)e * nc + k] = __ldcg(&rec->id[k % kTpCandK]);
    }
    if (threadIdx.x == 0) {
      const DevSeq sq = seqs[samp_seq[e]];
      const bool greedy = sq.temperature == 0.f || sq.top_k == 1;
      const float scale = greedy ? 1.f : 1.f / sq.temperature;  // as the ranks' sums took it
      float mx = -INFINITY;
      for (int src = 0; src < a.n; src++)
        mx = fmaxf(mx, __ldcg(&(reinterpret_cast<const CandRecord*>(a.data[src] + off) + j)->m));
      double z = 0.0;
      for (int src = 0; src < a.n; src++) {
        const CandRecord* rec = reinterpret_cast<const CandRecord*>(a.data[src] + off) + j;
        const float m = __ldcg(&rec->m);
        if (m != -INFINITY) z += exp((double)(m - mx) * (double)scale) * __ldcg(&rec->z);
      }
      zfull[e] = z;
    }
  }
}

// ar_cand_sample_kernel: sample_kernel's choice over the compact rows of ar_cand_kernel
// (nc = ranks · kTpCandK tokens a row, in id order), with the whole vocabulary's Σ (zfull)
// for the log-probability; the token is the compact row's id. One block an entry.
__global__ void __launch_bounds__(kSampleThreads)
    ar_cand_sample_kernel(const float* __restrict__ crow, const int32_t* __restrict__ cid,
                          const double* __restrict__ zfull, const int32_t* __restrict__ samp_seq,
                          const DevSeq* __restrict__ seqs, int32_t* __restrict__ out_tok,
                          float* __restrict__ out_lp, int nc, int V) {
  __shared__ SampleScratch sm;
  const int s = samp_seq[blockIdx.x];
  if (s < 0) return;
  const DevSeq sq = seqs[s];
  const float* w = crow + (int64_t)blockIdx.x * nc;
  const int32_t* ids = cid + (int64_t)blockIdx.x * nc;
  float mx;
  const int best = first_max(w, nc, sm, mx);
  if (mx == -INFINITY || best >= nc) {
    if (threadIdx.x == 0) out_tok[s] = -2;
    return;
  }
  const bool greedy = sq.temperature == 0.f || sq.top_k == 1;
  const float scale = greedy ? 1.f : 1.f / sq.temperature;
  const Weight mass{true, mx, scale};
  const double zall = zfull[blockIdx.x];
  int tok = best;
  if (!greedy) {
    // cand_fast: 1 < top_k ≤ kTpCandK < nc (two ranks or more), so top-k always cuts.
    tok = cut_draw<true>(w, nc, sq.top_k, sq.top_p > 0.f && sq.top_p < 1.f, sq, mx, scale, mass, zall, sm, tok);
  }
  if (threadIdx.x == 0) {
    out_tok[s] = ids[tok];
    out_lp[s] = (float)((double)(w[tok] - mx) * scale - log(zall));
  }
  (void)V;
}

}  // namespace gollm

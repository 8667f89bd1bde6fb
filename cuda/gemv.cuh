// gemv.cuh — the projections of steps with few token rows (decode at small batch), where
// a GEMM is a matrix-vector product bound by reading the weights once. One kernel does a
// whole projection with its neighbours fused: the norm before it (LayerNorm or RMSNorm,
// recomputed by each block from the fp32 residual stream, a few KB from L2) and the bias
// with the residual add, the activation, or the KV-cache write after it. Large models take
// the streaming kernel (gemv_stream_kernel), whose warps read their weight rows straight
// into registers.
#pragma once
#include "activation.cuh"
#include "common.cuh"
#include "fp8.cuh"

namespace gollm {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvUnroll = 4;  // 16-byte input loads a lane has in flight
constexpr int kGemvWideCols = 8192;  // the widest norm input held in registers (gemv_input)

inline __host__ __device__ size_t align_up16(size_t n) { return (n + 15) & ~(size_t)15; }

// What a gemv kernel reads as its input rows x [n][in].
enum GemvIn {
  GEMV_IN_LN = 0,  // norm(h[idx ? idx[r] : r]) with gamma, beta (LayerNorm; RMSNorm if rms)
  GEMV_IN_T = 1    // x [n][in] in T
};

// What it does with v = x·Wᵀ[o] + bias[o] for row r and output o.
enum GemvOut {
  GEMV_OUT_RESID = 0,  // h[r][o] += v                      (fp32 residual stream)
  GEMV_OUT_ACT = 1,    // y[r][o] = T(act(v))
  GEMV_OUT_F32 = 2,    // y[r][o] = v                        (fp32; the LM head)
  GEMV_OUT_QKV = 3,    // qkv[r][o] = v (queries scaled), keys and values also to the pool
  // y[r][o] = T(act(g + bg[o]) · (u + bu[o])): the gated MLP's units, g and u the products
  // with rows o and out + o of W [2·out][in] (gate, then up), bias [2·out] (bg, then bu).
  // gemv_stream_kernel only.
  GEMV_OUT_GATED = 4,
  // qkv[r][o] = rotary(v) · qscale for the queries, the keys rotated and the values to the
  // pool only; rotary pairs (i, i + head_dim/2) of every query and key head by the angle
  // inv_freq[i] · row_pos[r] (qkv_rope_write_kernel's arithmetic, rope_dim = head_dim).
  // gemv_stream_kernel only.
  GEMV_OUT_ROPE = 5
};

// Fixed-point residual additions: kernels whose blocks each add a partial sum to the
// same residual entries (split over the reduction) add llrint(v · 2^32) to an int64 with
// atomics. Integer addition is associative, so the result does not depend on the blocks'
// order (fp32 atomics would make each run differ in the last bits); 2^-32 resolution and a
// range of ±2^31 are far inside what a residual stream needs.
constexpr float kFixScale = 4294967296.f;  // 2^32
__device__ __forceinline__ float fix_value(long long q) { return __ll2float_rn(q) * (1.f / kFixScale); }
__device__ __forceinline__ void fix_add(unsigned long long* p, float v) {
  atomicAdd(p, static_cast<unsigned long long>(llrintf(v * kFixScale)));
}

// GemvArgs gathers a gemv launch's operands.
struct GemvArgs {
  const void* w;         // [out][in] T, row-major (transposed Conv1D weight); GATED [2·out][in]
  // FP8 weights (gemv_stream_kernel only): w holds float8_e4m3fn codes in the same layout,
  // ws their scales [rows of w][ceil(in / 128)] (fp8.cuh's layout); null for T weights.
  const float* ws;
  const float* bias;     // [out] fp32, or null; GATED [2·out]
  int n, in, out;        // rows, input width, output width
  // Input.
  const float* h;        // GEMV_IN_LN: residual stream [*][in]
  // GEMV_IN_LN: fixed-point additions to h ([*][in], units of 2^-32; see fix_add), or null
  // (read only with up to kFusedRows rows). GEMV_OUT_RESID: moved into hout, then zeroed.
  const unsigned long long* acc;
  const int32_t* idx;    // GEMV_IN_LN: row indices into h, or null for 0..n-1
  const float* gamma;    // GEMV_IN_LN: [in]
  const float* beta;     // GEMV_IN_LN: [in], or null (RMSNorm)
  float eps;             // GEMV_IN_LN: epsilon
  bool rms;              // GEMV_IN_LN: RMSNorm instead of LayerNorm
  const void* x;         // GEMV_IN_T: [n][in] T
  // Output.
  float* hout;           // GEMV_OUT_RESID: [n][out]
  void* y;               // GEMV_OUT_ACT / GATED: [n][out] T; GEMV_OUT_F32 / QKV: [n][out] fp32
  int act;               // GEMV_OUT_ACT / GATED: gollm_activation
  // GEMV_OUT_QKV: the KV pool (T, or FP8 codes where geom.fp8) and where each row's
  // position lives.
  void* kv;
  const int32_t* row_pos;
  const int32_t* row_seq;
  const DevSeq* seqs;
  const int32_t* blocks;
  KVGeom geom;
  int layer;
  float qscale;
  const float* inv_freq; // GEMV_OUT_ROPE: [head_dim / 2]
  bool bulk;             // stage the weights with bulk copies (sm_90)
};

// ld_f4_now loads 16 bytes where it stands: the compiler may not sink it into the branch
// of its first use, so a run of them is issued together.
__device__ __forceinline__ float4 ld_f4_now(const float4* p) {
  float4 v;
  asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p));
  return v;
}

template <typename T>
__device__ __forceinline__ void dot8(const uint4& w, const uint4& x, float& acc) {
  using T2 = typename Pair<T>::type;
  const T2* a = reinterpret_cast<const T2*>(&w);
  const T2* b = reinterpret_cast<const T2*>(&x);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float2 fa = to_f32x2(a[i]), fb = to_f32x2(b[i]);
    acc = fmaf(fa.x, fb.x, acc);
    acc = fmaf(fa.y, fb.y, acc);
  }
}

// gemv_store applies the output stage to v for row r, output o. kvrow (GEMV_OUT_QKV) is
// where row r's keys sit in the pool for head 0 (gemv_kv_rows).
template <typename T, int OUT>
__device__ __forceinline__ void gemv_store(const GemvArgs& a, const int64_t* kvrow, int r, int o,
                                           float v) {
  if (OUT == GEMV_OUT_RESID) {
    if (a.acc) {
      // The fused step's fixed-point additions (fused.cuh) move into h with this write.
      unsigned long long* z = const_cast<unsigned long long*>(a.acc) + (int64_t)r * a.out + o;
      v += fix_value(static_cast<long long>(*z));
      *z = 0;
    }
    a.hout[(int64_t)r * a.out + o] += v;
  } else if (OUT == GEMV_OUT_ACT) {
    static_cast<T*>(a.y)[(int64_t)r * a.out + o] = from_f32<T>(activate(v, a.act));
  } else if (OUT == GEMV_OUT_F32) {
    static_cast<float*>(a.y)[(int64_t)r * a.out + o] = v;
  } else if (OUT == GEMV_OUT_QKV) {
    float* qkv = static_cast<float*>(a.y) + (int64_t)r * a.out;
    if (o < a.geom.q_width()) {
      qkv[o] = v * a.qscale;
      return;
    }
    qkv[o] = v;
    kv_put<T>(a.kv, kvrow[r] + a.geom.kv_col(o), v, a.geom, a.geom.kv_kind(o));
  }
}

// gemv_kv_rows fills kvrow[r] (r < n) with the pool offset of row r's key for head 0 —
// page(block, layer, 0, 0) + slot·head_dim — and rows[r] with its residual-stream row. They
// come from the step's inputs alone, so the kernels load them before waiting for their
// predecessor (three dependent loads for the KV block). The caller syncs the block.
// rows may be null (the tiled kernels read no residual rows); cap is the arrays' length.
__device__ __forceinline__ void gemv_kv_rows(const GemvArgs& a, bool qkv, int64_t* kvrow,
                                             int64_t* rows, int cap = kGemvMaxRows) {
  const int r = threadIdx.x;
  if (r >= a.n || r >= cap) return;
  if (rows) rows[r] = a.idx ? a.idx[r] : r;
  if (!qkv) return;
  const int T_ = a.geom.tokens_per_block;
  const int pos = a.row_pos[r];
  const int64_t block = a.blocks[a.seqs[a.row_seq[r]].blk_off + pos / T_];
  kvrow[r] = a.geom.at(block, a.layer, 0, 0, pos % T_);
}

// RopeUnit is rotary unit u (GEMV_OUT_ROPE) of a QKV row: the pair of columns c0 = h·D + i
// and c1 = c0 + D/2 of head h = u / (D/2), i = u % (D/2).
struct RopeUnit {
  int h, i, c0, c1;
};
__device__ __forceinline__ RopeUnit rope_unit(const KVGeom& g, int64_t u) {
  const int half = g.head_dim / 2;
  const int h = (int)(u / half), i = (int)(u % half);
  return RopeUnit{h, i, h * 2 * half + i, h * 2 * half + i + half};
}

// gemv_rope_store finishes unit ru of row r — qkv_rope_write_kernel's arithmetic: x0 and x1
// are its columns with their biases, rotated by freq (inv_freq[ru.i]) · pos (the row's
// position) for query and key heads; queries scaled into y, keys and values to the pool
// at kvr (gemv_kv_rows' offset for the row).
template <typename T>
__device__ __forceinline__ void gemv_rope_store(const GemvArgs& a, const RopeUnit& ru, int64_t kvr,
                                                int r, float x0, float x1, float freq, int pos) {
  const KVGeom& g = a.geom;
  if (ru.h < g.heads + g.kv_heads) {
    const float2 y = rotate_pair(x0, x1, freq, pos);
    x0 = y.x, x1 = y.y;
  }
  if (ru.h < g.heads) {
    float* q = static_cast<float*>(a.y) + (int64_t)r * a.out;
    q[ru.c0] = x0 * a.qscale;
    q[ru.c1] = x1 * a.qscale;
  } else {
    const int kind = ru.h < g.heads + g.kv_heads ? 0 : 1;
    kv_put<T>(a.kv, kvr + g.kv_col(ru.c0), x0, g, kind);
    kv_put<T>(a.kv, kvr + g.kv_col(ru.c1), x1, g, kind);
  }
}

// gemv_gated_store finishes unit o (GEMV_OUT_GATED) of row r from its gate and up products
// with their biases: gated_act_kernel's formula.
template <typename T>
__device__ __forceinline__ void gemv_gated_store(const GemvArgs& a, int r, int o, float g, float v) {
  static_cast<T*>(a.y)[(int64_t)r * a.out + o] = from_f32<T>(activate(g, a.act) * v);
}

// GemvShape is how a gemv launch splits its outputs: a pass is opb consecutive weight
// rows (opb * in elements, contiguous in [out][in]), staged whole into shared memory; a
// block takes passes blockIdx.x, blockIdx.x + gridDim.x, … with nst stage buffers, so up
// to nst passes are in flight. wpo warps share a row when opb < kGemvWarps; each warp
// takes rpw rows when opb > kGemvWarps.
struct GemvShape {
  int opb, wpo, rpw, nst;
};
constexpr int kGemvMaxStages = 3;  // nst is 2 or 3

// gemv_stage issues the copies of pass k (if the block has one) into stage buffer buf and
// commits them as one group (an empty group past the last pass keeps the count uniform).
// With bars (bulk copies), thread 0 issues the pass as one copy counted on
// bars[k % s.nst] instead; rows past the output are then left as they are (never stored).
template <typename T>
__device__ __forceinline__ void gemv_stage(const GemvArgs& a, const GemvShape& s, int k,
                                           unsigned char* buf, uint64_t* bars) {
  const int64_t o0 = ((int64_t)blockIdx.x + (int64_t)k * gridDim.x) * s.opb;
  const int64_t rows = a.out - o0 < s.opb ? a.out - o0 : s.opb;
  const char* src = static_cast<const char*>(a.w) + o0 * a.in * (int64_t)sizeof(T);
  if (bars) {
    if (o0 < a.out && threadIdx.x == 0) {
      const unsigned bytes = (unsigned)(rows * a.in * (int64_t)sizeof(T));
      mbar_expect_tx(&bars[k % s.nst], bytes);
      bulk_copy(buf, src, bytes, &bars[k % s.nst]);
    }
    return;
  }
  if (o0 < a.out) {
    const int pieces = (int)(rows * a.in / 8);
    for (int i = threadIdx.x; i < pieces; i += kGemvThreads)
      cp_async16(buf + (size_t)i * 16, src + (size_t)i * 16);
  }
  cp_async_commit();
}

// cp_async_wait_rt waits until at most n (0…3) groups are pending; wait_group takes an
// immediate, so the run-time count is dispatched.
__device__ __forceinline__ void cp_async_wait_rt(int n) {
  if (n <= 0) cp_async_wait<0>();
  else if (n == 1) cp_async_wait<1>();
  else if (n == 2) cp_async_wait<2>();
  else cp_async_wait<3>();
}

// resid_at is the residual stream's value at (row, c): h plus the fixed-point additions.
__device__ __forceinline__ float resid_at(const GemvArgs& a, int64_t row, int c) {
  float v = a.h[row * a.in + c];
  if (a.acc) v += fix_value(static_cast<long long>(a.acc[row * a.in + c]));
  return v;
}

// LnParams is a thread's share of gamma and beta for the block-wide LayerNorm (rows up to
// kGemvThreads * 4 wide): loaded before the kernel waits for its predecessor.
struct LnParams {
  float4 g, b;
};

template <int IN>
__device__ __forceinline__ LnParams gemv_ln_params(const GemvArgs& a) {
  LnParams p{};
  if (IN == GEMV_IN_LN && a.in <= 4 * kGemvThreads) {
    const int in4 = a.in / 4, c = min((int)threadIdx.x, in4 - 1);
    p.g = reinterpret_cast<const float4*>(a.gamma)[c];
    p.b = a.beta ? reinterpret_cast<const float4*>(a.beta)[c] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  return p;
}

__device__ __forceinline__ longlong2 ld_ll2_now(const longlong2* p) {
  longlong2 v;
  asm volatile("ld.global.v2.s64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p));
  return v;
}

// block_sums adds each of the R values over the block; every thread gets the R totals.
template <int R>
__device__ __forceinline__ void block_sums(float (&v)[R], float (*red)[R]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < R; r++) v[r] = warp_sum(v[r]);
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; r++) red[warp][r] = v[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R; r++) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kGemvWarps; w++) t += red[w][r];
    v[r] = t;
  }
}

// gemv_input fills xs [R][in] T with the block's input rows: LayerNorm of the residual
// stream (GEMV_IN_LN; h plus acc where set; rows[r] is row r's index in h, or null for
// a.idx) or a copy of x (GEMV_IN_T). Ends with a barrier.
template <typename T, int R, int IN>
__device__ __forceinline__ void gemv_input(const GemvArgs& a, const LnParams& lp, T* xs,
                                           const int64_t* rows = nullptr) {
  const int in = a.in, n = a.n;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // row_of is input row r's row in h.
  auto row_of = [&](int r) -> int64_t { return rows ? rows[r] : a.idx ? a.idx[r] : r; };
  if (IN == GEMV_IN_LN) {
    if (in <= 4 * kGemvThreads) {
      // Block-wide: thread t holds columns 4t…4t+3 of every row in registers (all loads
      // issued together: one memory round trip), means and variances by two block sums,
      // then its gamma and beta (loaded before the wait).
      __shared__ float red[kGemvWarps][R];
      const int in4 = in / 4, c = min((int)threadIdx.x, in4 - 1);
      const bool mine = (int)threadIdx.x < in4;
      constexpr bool kAcc = R <= kFusedRows;
      float4 x[R];
      longlong2 q0[R], q1[R];
#pragma unroll
      for (int r = 0; r < R; r++) {
        if (r < n) {
          const int64_t row = row_of(r);
          x[r] = ld_f4_now(reinterpret_cast<const float4*>(a.h + row * in) + c);
          if (kAcc && a.acc) {
            const longlong2* q = reinterpret_cast<const longlong2*>(a.acc + row * in) + 2 * c;
            q0[r] = ld_ll2_now(q);
            q1[r] = ld_ll2_now(q + 1);
          }
        }
      }
      float s[R];
#pragma unroll
      for (int r = 0; r < R; r++) {
        if (kAcc && r < n && a.acc) {
          x[r].x += fix_value(q0[r].x);
          x[r].y += fix_value(q0[r].y);
          x[r].z += fix_value(q1[r].x);
          x[r].w += fix_value(q1[r].y);
        }
        s[r] = (r < n && mine && !a.rms) ? (x[r].x + x[r].y) + (x[r].z + x[r].w) : 0.f;
      }
      if (!a.rms) block_sums<R>(s, red);
      float mean[R], v[R];
#pragma unroll
      for (int r = 0; r < R; r++) {
        mean[r] = s[r] / in;
        const float dx = x[r].x - mean[r], dy = x[r].y - mean[r], dz = x[r].z - mean[r],
                    dw = x[r].w - mean[r];
        v[r] = (r < n && mine) ? (dx * dx + dy * dy) + (dz * dz + dw * dw) : 0.f;
      }
      block_sums<R>(v, red);
      if (mine) {
#pragma unroll
        for (int r = 0; r < R; r++) {
          if (r < n) {
            const float rstd = rsqrtf(v[r] / in + a.eps);
            T* xr = xs + r * in + 4 * c;
            xr[0] = from_f32<T>((x[r].x - mean[r]) * rstd * lp.g.x + lp.b.x);
            xr[1] = from_f32<T>((x[r].y - mean[r]) * rstd * lp.g.y + lp.b.y);
            xr[2] = from_f32<T>((x[r].z - mean[r]) * rstd * lp.g.z + lp.b.z);
            xr[3] = from_f32<T>((x[r].w - mean[r]) * rstd * lp.g.w + lp.b.w);
          }
        }
      }
    } else if (R > 1 && in <= 8 * kGemvThreads && !a.acc) {
      // Several wide rows up to 2,048: all of them at once, thread t holding columns
      // 4(t + 256v), v < 2, of every row — one memory round trip and one block sum (two for
      // LayerNorm) for all the rows, where a row at a time pays them per row.
      __shared__ float red[kGemvWarps][R];
      const int in4 = in / 4;
      float4 x[R][2];
#pragma unroll
      for (int r = 0; r < R; r++) {
        const float4* hr = reinterpret_cast<const float4*>(a.h + row_of(r < n ? r : 0) * in);
#pragma unroll
        for (int v = 0; v < 2; v++) {
          const int c = threadIdx.x + v * kGemvThreads;
          x[r][v] = r < n && c < in4 ? ld_f4_now(hr + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
      float s[R], q[R];
#pragma unroll
      for (int r = 0; r < R; r++)
        s[r] = (x[r][0].x + x[r][0].y) + (x[r][0].z + x[r][0].w) +
               ((x[r][1].x + x[r][1].y) + (x[r][1].z + x[r][1].w));
      if (!a.rms) block_sums<R>(s, red);
#pragma unroll
      for (int r = 0; r < R; r++) {
        const float mean = a.rms ? 0.f : s[r] / in;
        s[r] = mean;
        q[r] = 0.f;
#pragma unroll
        for (int v = 0; v < 2; v++) {
          if (threadIdx.x + v * kGemvThreads < in4) {
            const float dx = x[r][v].x - mean, dy = x[r][v].y - mean, dz = x[r][v].z - mean,
                        dw = x[r][v].w - mean;
            q[r] += (dx * dx + dy * dy) + (dz * dz + dw * dw);
          }
        }
      }
      block_sums<R>(q, red);
#pragma unroll
      for (int v = 0; v < 2; v++) {
        const int c = threadIdx.x + v * kGemvThreads;
        if (c >= in4) continue;
        const float4 g = reinterpret_cast<const float4*>(a.gamma)[c];
        const float4 bb =
            a.beta ? reinterpret_cast<const float4*>(a.beta)[c] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int r = 0; r < R; r++) {
          if (r >= n) continue;
          const float mean = s[r], rstd = rsqrtf(q[r] / in + a.eps);
          T* xr = xs + r * in + 4 * c;
          xr[0] = from_f32<T>((x[r][v].x - mean) * rstd * g.x + bb.x);
          xr[1] = from_f32<T>((x[r][v].y - mean) * rstd * g.y + bb.y);
          xr[2] = from_f32<T>((x[r][v].z - mean) * rstd * g.z + bb.z);
          xr[3] = from_f32<T>((x[r][v].w - mean) * rstd * g.w + bb.w);
        }
      }
    } else if (in <= kGemvWideCols && !a.acc) {
      // Wide rows (the streaming gemv's models, hidden up to 8192): a row at a time over
      // the whole block, thread t holding columns 4(t + 256v) in registers — every load of
      // the row issued together, one memory round trip — then the mean and the variance by
      // two block sums, as the path above does for narrow rows (rather than the
      // warp-a-row loop below, whose loads come one round trip at a time).
      __shared__ float red[kGemvWarps][1];
      constexpr int V = kGemvWideCols / (4 * kGemvThreads);
      const int in4 = in / 4;
      for (int r = 0; r < n && r < R; r++) {
        const float4* hr = reinterpret_cast<const float4*>(a.h + row_of(r) * in);
        float4 x[V];
#pragma unroll
        for (int v = 0; v < V; v++) {
          const int c = threadIdx.x + v * kGemvThreads;
          x[v] = c < in4 ? ld_f4_now(hr + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        float s[1] = {0.f};
        if (!a.rms) {
#pragma unroll
          for (int v = 0; v < V; v++) s[0] += (x[v].x + x[v].y) + (x[v].z + x[v].w);
          block_sums<1>(s, red);
        }
        const float mean = s[0] / in;
        float q[1] = {0.f};
#pragma unroll
        for (int v = 0; v < V; v++) {
          if (threadIdx.x + v * kGemvThreads < in4) {
            const float dx = x[v].x - mean, dy = x[v].y - mean, dz = x[v].z - mean,
                        dw = x[v].w - mean;
            q[0] += (dx * dx + dy * dy) + (dz * dz + dw * dw);
          }
        }
        block_sums<1>(q, red);
        const float rstd = rsqrtf(q[0] / in + a.eps);
#pragma unroll
        for (int v = 0; v < V; v++) {
          const int c = threadIdx.x + v * kGemvThreads;
          if (c < in4) {
            const float4 g = reinterpret_cast<const float4*>(a.gamma)[c];
            const float4 bb = a.beta ? reinterpret_cast<const float4*>(a.beta)[c]
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
            T* xr = xs + r * in + 4 * c;
            xr[0] = from_f32<T>((x[v].x - mean) * rstd * g.x + bb.x);
            xr[1] = from_f32<T>((x[v].y - mean) * rstd * g.y + bb.y);
            xr[2] = from_f32<T>((x[v].z - mean) * rstd * g.z + bb.z);
            xr[3] = from_f32<T>((x[v].w - mean) * rstd * g.w + bb.w);
          }
        }
      }
    } else {
      // Wider rows, or fixed-point additions: warp r takes row r's mean and variance with
      // shuffles alone (R <= kGemvWarps), so the prologue costs one block barrier instead
      // of two per row.
      __shared__ float stats[kGemvWarps][2];
      if (warp < n) {
        const int64_t row = row_of(warp);
        float s = 0.f;
        if (!a.rms)
          for (int c = lane; c < in; c += 32) s += resid_at(a, row, c);
        const float mean = warp_sum(s) / in;
        float v = 0.f;
        for (int c = lane; c < in; c += 32) {
          float d = resid_at(a, row, c) - mean;
          v += d * d;
        }
        v = warp_sum(v);
        if (lane == 0) {
          stats[warp][0] = mean;
          stats[warp][1] = rsqrtf(v / in + a.eps);
        }
      }
      __syncthreads();
      for (int r = 0; r < n; r++) {
        const int64_t row = row_of(r);
        const float mean = stats[r][0], rstd = stats[r][1];
        for (int c = threadIdx.x; c < in; c += blockDim.x)
          xs[r * in + c] = from_f32<T>((resid_at(a, row, c) - mean) * rstd * a.gamma[c] +
                                       (a.beta ? a.beta[c] : 0.f));
      }
    }
  } else {
    const uint4* src = static_cast<const uint4*>(a.x);
    uint4* dst = reinterpret_cast<uint4*>(xs);
    // Loads at clamped indices, issued kGemvUnroll at a time before their stores: a
    // bounds branch between them would make each wait for the one before.
    const int total = n * in / 8;
    for (int i0 = threadIdx.x; i0 < total; i0 += kGemvUnroll * blockDim.x) {
      uint4 v[kGemvUnroll];
#pragma unroll
      for (int u = 0; u < kGemvUnroll; u++) v[u] = src[min(i0 + u * (int)blockDim.x, total - 1)];
#pragma unroll
      for (int u = 0; u < kGemvUnroll; u++)
        if (i0 + u * (int)blockDim.x < total) dst[i0 + u * blockDim.x] = v[u];
    }
  }
  __syncthreads();
}

// gemv_pass computes the opb outputs of one staged pass (weights in wbuf, [opb][in] T)
// for the R input rows in xs, and stores them. RPW is s.rpw (rows per warp).
template <typename T, int R, int OUT, int RPW>
__device__ __forceinline__ void gemv_pass(const GemvArgs& a, const GemvShape& s, int64_t o0,
                                          const T* xs, const T* wbuf, float (*part_acc)[R],
                                          const int64_t* kvrow) {
  const int in = a.in, n = a.n;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = warp / s.wpo, part = warp % s.wpo;
  const int chunks = in / 8;
  float acc[RPW][R];
#pragma unroll
  for (int i = 0; i < RPW; i++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[i][r] = 0.f;
  const uint4* xw = reinterpret_cast<const uint4*>(xs);
  const uint4* ww = reinterpret_cast<const uint4*>(wbuf) + (int64_t)grp * RPW * chunks;
  for (int c = part * 32 + lane; c < chunks; c += 32 * s.wpo) {
    // The input pieces once per column, reused by the warp's RPW rows.
    uint4 xv[R];
#pragma unroll
    for (int r = 0; r < R; r++)
      if (r < n) xv[r] = xw[r * chunks + c];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
      const uint4 wv = ww[i * chunks + c];
#pragma unroll
      for (int r = 0; r < R; r++)
        if (r < n) dot8<T>(wv, xv[r], acc[i][r]);
    }
  }
#pragma unroll
  for (int i = 0; i < RPW; i++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[i][r] = warp_sum(acc[i][r]);
  if (s.wpo > 1) {
    // RPW is 1 here: the warps of a row add their partial sums.
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; r++) part_acc[warp][r] = acc[0][r];
    }
    __syncthreads();
    if (part == 0) {
#pragma unroll
      for (int r = 0; r < R; r++) {
        float t = 0.f;
        for (int p = 0; p < s.wpo; p++) t += part_acc[warp + p][r];
        acc[0][r] = t;
      }
    }
    if (part != 0) return;
  }
#pragma unroll
  for (int i = 0; i < RPW; i++) {
    const int64_t o = o0 + (int64_t)grp * RPW + i;
    if (o >= a.out) break;
    // Lane r finishes row r.
    float v = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++)
      if (lane == r) v = acc[i][r];
    if (lane < n) gemv_store<T, OUT>(a, kvrow, lane, (int)o, a.bias ? v + a.bias[o] : v);
  }
}

// gemv_kernel: blocks of kGemvThreads. The block's first passes of weight rows are copied
// into shared memory before it waits for the previous kernel (programmatic dependent
// launch), so the weight stream overlaps the kernels before it; later passes are copied
// while earlier ones are computed. Lanes read 16-byte pieces of a row from shared memory,
// and every input row reuses them.
// Dynamic shared memory: R * in elements of T (the input rows), then s.nst stage buffers
// of s.opb * in elements of T. in % 8 == 0.
template <typename T, int R, int IN, int OUT, int RPW>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvArgs a, GemvShape s) {
  static_assert(OUT != GEMV_OUT_GATED && OUT != GEMV_OUT_ROPE,
                "gated and rotary outputs take gemv_stream_kernel");
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  __shared__ float part_acc[kGemvWarps][R];
  __shared__ int64_t kvrow[kGemvMaxRows], rows[kGemvMaxRows];
  griddep_launch();
  T* xs = reinterpret_cast<T*>(gemv_smem);
  unsigned char* stages = gemv_smem + align_up16((size_t)R * a.in * sizeof(T));
  const size_t stage_bytes = (size_t)s.opb * a.in * sizeof(T);
  const int64_t passes_all = (a.out + s.opb - 1) / s.opb;
  const int np = (int)((passes_all - blockIdx.x + gridDim.x - 1) / gridDim.x);
  __shared__ uint64_t bar_mem[kGemvMaxStages];
  uint64_t* bars = kBulk && a.bulk ? bar_mem : nullptr;
  if (bars) {
    if (threadIdx.x < s.nst) mbar_init(&bars[threadIdx.x]);
    __syncthreads();
  }
  // The weights do not depend on the previous kernel.
  for (int k = 0; k < s.nst; k++) gemv_stage<T>(a, s, k, stages + k * stage_bytes, bars);
  const LnParams lp = gemv_ln_params<IN>(a);
  gemv_kv_rows(a, OUT == GEMV_OUT_QKV, kvrow, rows);
  __syncthreads();
  griddep_wait();
  gemv_input<T, R, IN>(a, lp, xs, rows);
  for (int k = 0; k < np; k++) {
    if (bars)
      mbar_wait(&bars[k % s.nst], (k / s.nst) & 1);  // the buffer's (k / nst)-th fill
    else
      cp_async_wait_rt(s.nst - 1);  // pass k's group has landed
    __syncthreads();
    const int64_t o0 = ((int64_t)blockIdx.x + (int64_t)k * gridDim.x) * s.opb;
    gemv_pass<T, R, OUT, RPW>(a, s, o0, xs,
                              reinterpret_cast<const T*>(stages + (k % s.nst) * stage_bytes),
                              part_acc, kvrow);
    __syncthreads();  // the buffer's readers are done
    gemv_stage<T>(a, s, k + s.nst, stages + (k % s.nst) * stage_bytes, bars);
  }
  cp_async_wait<0>();
}

// gemv_shape sizes a launch: passes of about kGemvStageBytes, at least one per
// multiprocessor where the outputs allow, rows of a pass a power of two.
constexpr int kGemvStageBytes = 24 * 1024;
inline GemvShape gemv_shape(int in, int64_t out, int elem, int sms) {
  int64_t cap = std::max<int64_t>(1, kGemvStageBytes / ((int64_t)in * elem));
  cap = std::min<int64_t>(cap, std::max<int64_t>(1, out / sms));
  int opb = 1;
  while (opb * 2 <= cap && opb * 2 <= 2 * kGemvWarps) opb *= 2;
  GemvShape s{};
  s.opb = opb;
  s.wpo = opb >= kGemvWarps ? 1 : kGemvWarps / opb;
  s.rpw = opb >= kGemvWarps ? opb / kGemvWarps : 1;
  s.nst = 2;
  return s;
}

inline int gemv_rows(int n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8; }

constexpr size_t kGemvMaxSmem = 200 * 1024;

inline size_t gemv_smem_bytes(int R, int in, const GemvShape& s, int elem) {
  return align_up16((size_t)R * in * elem) + (size_t)s.nst * s.opb * in * elem;
}

// gemv_fits says whether the gemv path can run n rows of width in.
inline bool gemv_fits(int n, int in) {
  return n >= 1 && n <= kGemvMaxRows && in % 8 == 0 && (size_t)gemv_rows(n) * in * 2 <= 64 * 1024;
}

template <typename T, int R, int IN, int OUT>
void gemv_launch(const GemvArgs& a, int sms, Stream stream) {
  GemvShape s = gemv_shape(a.in, a.out, (int)sizeof(T), sms);
  const int64_t passes = (a.out + s.opb - 1) / s.opb;
  // At most two blocks a multiprocessor, so that the next kernels' blocks find room to
  // start staging their weights; long outputs (the LM head) keep three passes in flight.
  const int64_t grid = std::min<int64_t>(passes, 2 * (int64_t)sms);
  if (passes > 2 * grid) s.nst = 3;
  while (s.nst > 2 && gemv_smem_bytes(R, a.in, s, sizeof(T)) > kGemvMaxSmem) s.nst--;
  const size_t smem = gemv_smem_bytes(R, a.in, s, sizeof(T));
  if (s.rpw >= 2)
    launch("gemv_kernel", gemv_kernel<T, R, IN, OUT, 2>, (int)grid, kGemvThreads, smem, stream,
           a, s);
  else
    launch("gemv_kernel", gemv_kernel<T, R, IN, OUT, 1>, (int)grid, kGemvThreads, smem, stream,
           a, s);
}

// gemv runs y = x·Wᵀ + bias with the fused input and output, choosing the row count R.
template <typename T, int IN, int OUT>
void gemv(const GemvArgs& a, int sms, Stream stream) {
  switch (gemv_rows(a.n)) {
    case 1: gemv_launch<T, 1, IN, OUT>(a, sms, stream); break;
    case 2: gemv_launch<T, 2, IN, OUT>(a, sms, stream); break;
    case 4: gemv_launch<T, 4, IN, OUT>(a, sms, stream); break;
    default: gemv_launch<T, 8, IN, OUT>(a, sms, stream); break;
  }
}

// gemv_allow_smem lets every gemv kernel use up to kGemvMaxSmem of dynamic shared memory,
// or what the device allows it.
template <typename T, int IN, int OUT, int RPW>
void gemv_allow_smem_rpw(int device) {
  void (*ks[4])(GemvArgs, GemvShape) = {gemv_kernel<T, 1, IN, OUT, RPW>, gemv_kernel<T, 2, IN, OUT, RPW>,
                                        gemv_kernel<T, 4, IN, OUT, RPW>, gemv_kernel<T, 8, IN, OUT, RPW>};
  for (auto k : ks) allow_dynamic_smem(k, device, kGemvMaxSmem);
}

template <typename T, int IN, int OUT>
void gemv_allow_smem_one(int device) {
  gemv_allow_smem_rpw<T, IN, OUT, 1>(device);
  gemv_allow_smem_rpw<T, IN, OUT, 2>(device);
}

template <typename T>
void gemv_allow_smem(int device) {
  gemv_allow_smem_one<T, GEMV_IN_LN, GEMV_OUT_QKV>(device);
  gemv_allow_smem_one<T, GEMV_IN_LN, GEMV_OUT_ACT>(device);
  gemv_allow_smem_one<T, GEMV_IN_LN, GEMV_OUT_F32>(device);
  gemv_allow_smem_one<T, GEMV_IN_T, GEMV_OUT_RESID>(device);
  gemv_allow_smem_one<T, GEMV_IN_T, GEMV_OUT_F32>(device);  // tensor-parallel branches
}

// Streaming gemv: the projections of steps of 1–4 rows (forward.cu's stream_rows),
// where a pass staged through shared memory (gemv_kernel) cannot keep enough bytes in
// flight to read the weights at the memory's rate. Each warp streams its own weight rows from
// global memory straight into registers, kGemvStreamUnroll 16-byte loads a row and two
// rows at a time, and only the input rows sit in shared memory.
// GOLLM_STREAM_UNROLL and GOLLM_STREAM_BLOCKS (-D at build time) build others to measure
// (bench/libab.sh). 8 loads at 2 blocks: bench/results/2026-11-27-inplace-h100.jsonl.
#ifndef GOLLM_STREAM_UNROLL
#define GOLLM_STREAM_UNROLL 8
#endif
#ifndef GOLLM_STREAM_BLOCKS
#define GOLLM_STREAM_BLOCKS 2
#endif
constexpr int kGemvStreamUnroll = GOLLM_STREAM_UNROLL;  // 16-byte chunks a lane loads of each row per step
constexpr int kGemvStreamBlocks = GOLLM_STREAM_BLOCKS;  // blocks a multiprocessor (__launch_bounds__)
constexpr size_t kGemvStreamMaxSmem = 96 * 1024;  // the input rows, R * in * sizeof(T)

// ld_stream16 loads 16 bytes read once (not kept in L1), or zeros where ok is false; the
// load is predicated, not branched around, so a run of them issues together.
__device__ __forceinline__ uint4 ld_stream16(const uint4* p, bool ok) {
  uint4 v;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %5, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  mov.b32 %1, 0;\n"
      "  mov.b32 %2, 0;\n"
      "  mov.b32 %3, 0;\n"
      "  @p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"((int)ok));
  return v;
}

// gemv_stream_load issues one step's loads of a row: chunks c0 + 32·i (i <
// kGemvStreamUnroll; c0 is the step's first chunk plus the lane) of row p, zeros past the
// row's chunks or where ok is false.
__device__ __forceinline__ void gemv_stream_load(uint4 (&wv)[kGemvStreamUnroll], const uint4* p,
                                                 bool ok, int c0, int chunks) {
#pragma unroll
  for (int i = 0; i < kGemvStreamUnroll; i++)
    wv[i] = ld_stream16(p + c0 + 32 * i, ok && c0 + 32 * i < chunks);
}

// gemv_stream_prefetch asks L2 for what gemv_stream_load would load, without registers.
__device__ __forceinline__ void gemv_stream_prefetch(const uint4* p, bool ok, int c0, int chunks) {
#pragma unroll
  for (int i = 0; i < kGemvStreamUnroll; i++)
    if (ok && c0 + 32 * i < chunks)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p + c0 + 32 * i));
}

// pair_barrier synchronizes warps 2p and 2p + 1 of the block (named barrier p + 1; 0 is
// __syncthreads').
__device__ __forceinline__ void pair_barrier(int p) {
  asm volatile("bar.sync %0, 64;" ::"r"(p + 1) : "memory");
}

// gemv_stream_units is how many units (gemv_stream_kernel) a launch's outputs make.
template <int OUT>
__host__ __device__ __forceinline__ int64_t gemv_stream_units(const GemvArgs& a) {
  return OUT == GEMV_OUT_GATED ? a.out : ((int64_t)a.out + 1) / 2;  // ROPE: out is even
}

// gemv_stream_kernel: blocks of kGemvThreads, each warp a unit of two weight rows at a
// time — rows 2u and 2u + 1 (the second absent where out is odd), or for GEMV_OUT_GATED
// the gate row u and the up row out + u — units u = global warp, + total warps, … of
// ceil(out / 2) (out for GATED). Lane l takes 16-byte chunks l + 32·k of a row (in / 8
// chunks, in % 8 == 0) in steps of kGemvStreamUnroll, so a lane has 2 · kGemvStreamUnroll
// loads in flight; a step's loads past the row's end are predicated off as zeros. The
// first step's loads are issued before waiting for the previous kernel (the weights do not
// depend on it), each later one as soon as the step before is computed, before the
// finished unit's sums and stores. The input rows' pieces come from shared memory and
// serve both rows. Rows r >= n of R are neither computed nor stored.
// KS = 2 splits each unit's reduction between the two warps of a pair (warps 2p and 2p + 1
// of a block; each its half of the chunks, in whole steps of 32), so that a projection with
// few outputs (the output and down projections: 384–1,024 units) has twice the warps
// streaming; the odd warp hands its sums to the even one through shared memory (a barrier
// of the pair's own), which adds them and finishes the unit.
// F8: the weights are e4m3 codes with a.ws's scales, so a 16-byte chunk holds 16 weights
// (in / 16 chunks a row, in % 16 == 0) against two chunks of the input row; a step's
// chunks span 4·U 128-column groups, whose scales lane g loads for both rows with the
// step's weights (group g of the step) and the lanes fetch by shuffle. Each chunk's sum is
// scaled once, in fp32, as fp8_gemv_kernel does.
// Dynamic shared memory: the input rows xs, [R][in] T.
template <typename T, int R, int IN, int OUT, int KS = 1, bool F8 = false>
__global__ void __launch_bounds__(kGemvThreads, kGemvStreamBlocks)
    gemv_stream_kernel(GemvArgs a) {
  static_assert(KS == 1 || KS == 2, "a unit's reduction is split one or two ways");
  constexpr int U = kGemvStreamUnroll;
  static_assert(!F8 || (4 * U <= 32 && kFp8Group == 128), "a step's scale groups, one a lane");
  constexpr bool kGated = OUT == GEMV_OUT_GATED;
  constexpr bool kRope = OUT == GEMV_OUT_ROPE;
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  __shared__ int64_t kvrow[kGemvMaxRows], rows[kGemvMaxRows];
  __shared__ float pair_sums[KS == 2 ? kGemvWarps / 2 : 1][2][R];
  griddep_launch();
  T* xs = reinterpret_cast<T*>(gemv_smem);
  const int n = a.n, lane = threadIdx.x & 31;
  // A row's chunks, and this warp's share of them, [kbeg, kend): all of them, or with KS = 2
  // the first or second share, in whole steps of 32.
  const int chunks = F8 ? a.in / 16 : a.in / 8;
  const int xchunks = a.in / 8;  // an input row's 16-byte pieces
  const int groups = (a.in + kFp8Group - 1) / kFp8Group;
  const int part = KS == 2 ? (threadIdx.x >> 5) & 1 : 0;
  const int share = (chunks + 63) / 64 * 32;
  const int kbeg = part * share;
  const int kend = KS == 2 && part == 0 ? min(share, chunks) : chunks;
  const int64_t units = gemv_stream_units<OUT>(a);
  const int64_t stride = (int64_t)gridDim.x * kGemvWarps / KS;
  const uint4* w = static_cast<const uint4*>(a.w);
  // The unit's rows: w0 and w1 point at their first chunk (w1 = w0 for an absent second).
  int64_t u = ((int64_t)blockIdx.x * kGemvWarps + (threadIdx.x >> 5)) / KS;
  const uint4 *w0 = nullptr, *w1 = nullptr;
  const float *s0 = nullptr, *s1 = nullptr;  // F8: the rows' scales
  bool has1 = false;
  auto rows_of = [&](int64_t unit) {
    int64_t r0, r1;
    if (kRope) {
      // A rotary unit is the pair of rows (i, i + D/2) of one head (query, key or value).
      const RopeUnit ru = rope_unit(a.geom, unit);
      has1 = true;
      r0 = ru.c0, r1 = ru.c1;
    } else {
      r0 = kGated ? unit : 2 * unit;
      has1 = kGated || r0 + 1 < a.out;
      r1 = has1 ? (kGated ? a.out + unit : r0 + 1) : r0;
    }
    w0 = w + r0 * chunks, w1 = w + r1 * chunks;
    if (F8) s0 = a.ws + r0 * groups, s1 = a.ws + r1 * groups;
  };
  uint4 wv[2][U];
  int k0 = kbeg;  // the step's first chunk (the same for the whole warp)
  float sv[2] = {0.f, 0.f};  // F8: the scales of this lane's group of the step, both rows
  // F8: row j's scales for the step at k0 (its groups k0 / 8 + lane for lanes < 4·U).
  auto load_scales = [&](int j) {
    if (F8) {
      const int g = k0 / 8 + lane;
      sv[j] = lane < 4 * U && g < groups && (j == 0 || has1) ? __ldg((j ? s1 : s0) + g) : 0.f;
    }
  };
  if (u < units) {
    rows_of(u);
    gemv_stream_load(wv[0], w0, true, k0 + lane, kend);
    gemv_stream_prefetch(w1, has1, k0 + lane, kend);
    load_scales(0), load_scales(1);
  }
  const LnParams lp = gemv_ln_params<IN>(a);
  gemv_kv_rows(a, OUT == GEMV_OUT_QKV || kRope, kvrow, rows);
  __syncthreads();
  griddep_wait();
  gemv_input<T, R, IN>(a, lp, xs, rows);
  if (u < units) gemv_stream_load(wv[1], w1, has1, k0 + lane, kend);
  const uint4* xw = reinterpret_cast<const uint4*>(xs);
  float acc[2][R];
#pragma unroll
  for (int j = 0; j < 2; j++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[j][r] = 0.f;
  while (u < units) {
#pragma unroll
    for (int i = 0; i < U; i++) {
      const int c = k0 + lane + 32 * i;
      if constexpr (F8) {
        // Chunk c's group is the step's (lane + 32i) / 8th: lane lane / 8 + 4i holds it.
        const float sc0 = __shfl_sync(0xffffffffu, sv[0], (lane >> 3) + 4 * i);
        const float sc1 = __shfl_sync(0xffffffffu, sv[1], (lane >> 3) + 4 * i);
        if (c < kend) {
          // Each half chunk's 8 weights decoded once for every input row.
          float d0[R], d1[R];
#pragma unroll
          for (int r = 0; r < R; r++) d0[r] = 0.f, d1[r] = 0.f;
#pragma unroll
          for (int hh = 0; hh < 2; hh++) {
            float wa[8], wb[8];
            const uint16_t* p0 = reinterpret_cast<const uint16_t*>(&wv[0][i]) + 4 * hh;
            const uint16_t* p1 = reinterpret_cast<const uint16_t*>(&wv[1][i]) + 4 * hh;
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const float2 fa = fp8x2_to_float2(p0[e]), fb = fp8x2_to_float2(p1[e]);
              wa[2 * e] = fa.x, wa[2 * e + 1] = fa.y, wb[2 * e] = fb.x, wb[2 * e + 1] = fb.y;
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
              if (r < n) {
                float x[8];
                to_f32x8<T>(xw[r * xchunks + 2 * c + hh], x);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                  d0[r] = fmaf(wa[e], x[e], d0[r]);
                  d1[r] = fmaf(wb[e], x[e], d1[r]);
                }
              }
            }
          }
#pragma unroll
          for (int r = 0; r < R; r++) {
            acc[0][r] = fmaf(d0[r], sc0, acc[0][r]);
            acc[1][r] = fmaf(d1[r], sc1, acc[1][r]);
          }
        }
      } else if (c < kend) {
        // The input pieces once per chunk, for both rows; each piece converted to fp32
        // once (the same products in the same order as dot8, with fewer conversions).
        uint4 xv[R];
#pragma unroll
        for (int r = 0; r < R; r++)
          if (r < n) xv[r] = xw[r * chunks + c];
        if constexpr (R == 1) {
          // One row: dot8 as it comes (converting once gained nothing here and cost the
          // TinyLlama shape 2% at batch 1).
          dot8<T>(wv[0][i], xv[0], acc[0][0]);
          dot8<T>(wv[1][i], xv[0], acc[1][0]);
        } else {
          float w0[8], w1[8];
          to_f32x8<T>(wv[0][i], w0);
          to_f32x8<T>(wv[1][i], w1);
#pragma unroll
          for (int r = 0; r < R; r++) {
            if (r < n) {
              float x[8];
              to_f32x8<T>(xv[r], x);
#pragma unroll
              for (int e = 0; e < 8; e++) {
                acc[0][r] = fmaf(w0[e], x[e], acc[0][r]);
                acc[1][r] = fmaf(w1[e], x[e], acc[1][r]);
              }
            }
          }
        }
      }
    }
    // The next step's loads go out before this unit's sums and stores (if it is done).
    const int64_t done = u;
    const bool had1 = has1, last = k0 + 32 * U >= kend;
    if (last) {
      u += stride;
      k0 = kbeg;
      if (u < units) rows_of(u);
    } else {
      k0 += 32 * U;
    }
    if (u < units) {
      gemv_stream_load(wv[0], w0, true, k0 + lane, kend);
      gemv_stream_load(wv[1], w1, has1, k0 + lane, kend);
      load_scales(0), load_scales(1);
    }
    if (!last) continue;
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
      for (int r = 0; r < R; r++) acc[j][r] = warp_sum(acc[j][r]);
    if constexpr (KS == 2) {
      // The odd warp's sums to the even one, which finishes the unit; the second barrier
      // keeps the odd warp from overwriting them for its next unit before they are read.
      const int pr = (threadIdx.x >> 5) >> 1;
      if (part == 1 && lane == 0) {
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
          for (int r = 0; r < R; r++) pair_sums[pr][j][r] = acc[j][r];
      }
      pair_barrier(pr);
      if (part == 0) {
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
          for (int r = 0; r < R; r++) acc[j][r] += pair_sums[pr][j][r];
      }
      pair_barrier(pr);
      if (part == 1) {
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
          for (int r = 0; r < R; r++) acc[j][r] = 0.f;
        continue;
      }
    }
    if constexpr (kRope) {
      // Lane r finishes row r's pair: qkv_rope_write_kernel's arithmetic.
      if (lane < n) {
        float x0 = 0.f, x1 = 0.f;
#pragma unroll
        for (int r = 0; r < R; r++)
          if (lane == r) x0 = acc[0][r], x1 = acc[1][r];
        const RopeUnit ru = rope_unit(a.geom, done);
        if (a.bias) x0 += a.bias[ru.c0], x1 += a.bias[ru.c1];
        gemv_rope_store<T>(a, ru, kvrow[lane], lane, x0, x1, a.inv_freq[ru.i], a.row_pos[lane]);
      }
    } else if constexpr (kGated) {
      // Lane r finishes row r: gated_act_kernel's formula.
      if (lane < n) {
        float g = 0.f, v = 0.f;
#pragma unroll
        for (int r = 0; r < R; r++)
          if (lane == r) g = acc[0][r], v = acc[1][r];
        if (a.bias) g += a.bias[done], v += a.bias[a.out + done];
        gemv_gated_store<T>(a, lane, (int)done, g, v);
      }
    } else {
      // Lanes 0… finish row r of output 2u, lanes 16… of output 2u + 1.
      const int j = lane >> 4, r = lane & 15;
      if (r < n && (j == 0 || had1)) {
        float v = 0.f;
#pragma unroll
        for (int rr = 0; rr < R; rr++)
          if (r == rr) v = j ? acc[1][rr] : acc[0][rr];
        const int o = (int)(2 * done + j);
        gemv_store<T, OUT>(a, kvrow, r, o, a.bias ? v + a.bias[o] : v);
      }
    }
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
      for (int r = 0; r < R; r++) acc[j][r] = 0.f;
  }
}

// gemv_stream_fits says whether the streaming gemv can run n rows of width in: its input
// rows fit kGemvStreamMaxSmem (fp16/bf16), so two blocks fit a multiprocessor.
inline bool gemv_stream_fits(int n, int in) {
  return n >= 1 && n <= 4 && in > 0 && in % 8 == 0 &&
         (size_t)gemv_rows(n) * in * 2 <= kGemvStreamMaxSmem;
}

// gemv_stream_split says whether a launch splits each unit's reduction between two warps
// (KS = 2): where its units fill at most half the warps the grid can hold and each half
// of a row is at least a step's worth (32 chunks). Only the projections into the residual
// stream take it (the output and down projections).
template <int IN, int OUT>
inline bool gemv_stream_split(const GemvArgs& a, int sms) {
  return IN == GEMV_IN_T && OUT == GEMV_OUT_RESID && a.in / (a.ws ? 16 : 8) >= 64 &&
         2 * gemv_stream_units<OUT>(a) <= (int64_t)kGemvStreamBlocks * sms * kGemvWarps;
}

template <typename T, int R, int IN, int OUT, bool F8>
void gemv_stream_launch(const GemvArgs& a, int sms, Stream stream) {
  // Every block resident at once (kGemvStreamBlocks a multiprocessor: 16 warps, each with
  // 16 loads of 512 bytes a warp in flight); the warps stride over the units.
  const int64_t units = gemv_stream_units<OUT>(a);
  if (units == 0) return;
  const size_t smem = align_up16((size_t)R * a.in * sizeof(T));
  if constexpr (IN == GEMV_IN_T && OUT == GEMV_OUT_RESID) {
    if (gemv_stream_split<IN, OUT>(a, sms)) {
      const int64_t grid = (2 * units + kGemvWarps - 1) / kGemvWarps;
      launch("gemv_stream_kernel", gemv_stream_kernel<T, R, IN, OUT, 2, F8>, (int)grid, kGemvThreads,
             smem, stream, a);
      return;
    }
  }
  const int64_t grid = std::min<int64_t>((units + kGemvWarps - 1) / kGemvWarps,
                                         (int64_t)kGemvStreamBlocks * sms);
  launch("gemv_stream_kernel", gemv_stream_kernel<T, R, IN, OUT, 1, F8>, (int)grid, kGemvThreads,
         smem, stream, a);
}

template <typename T, int R, int IN, int OUT>
void gemv_stream_launch(const GemvArgs& a, int sms, Stream stream) {
  if (a.ws)
    gemv_stream_launch<T, R, IN, OUT, true>(a, sms, stream);
  else
    gemv_stream_launch<T, R, IN, OUT, false>(a, sms, stream);
}

// gemv_stream is gemv for the rows gemv_stream_fits allows (n <= 4), and also takes
// GEMV_OUT_GATED.
template <typename T, int IN, int OUT>
void gemv_stream(const GemvArgs& a, int sms, Stream stream) {
  switch (gemv_rows(a.n)) {
    case 1: gemv_stream_launch<T, 1, IN, OUT>(a, sms, stream); break;
    case 2: gemv_stream_launch<T, 2, IN, OUT>(a, sms, stream); break;
    default: gemv_stream_launch<T, 4, IN, OUT>(a, sms, stream); break;
  }
}

// gemv_stream_allow_smem lets every streaming kernel gemv_stream launches use up to
// kGemvStreamMaxSmem of dynamic shared memory, or what the device allows it.
template <typename T, int IN, int OUT, int KS = 1>
void gemv_stream_allow_smem_one(int device) {
  void (*ks[6])(GemvArgs) = {gemv_stream_kernel<T, 1, IN, OUT, KS>,       gemv_stream_kernel<T, 2, IN, OUT, KS>,
                             gemv_stream_kernel<T, 4, IN, OUT, KS>,       gemv_stream_kernel<T, 1, IN, OUT, KS, true>,
                             gemv_stream_kernel<T, 2, IN, OUT, KS, true>, gemv_stream_kernel<T, 4, IN, OUT, KS, true>};
  for (auto k : ks) allow_dynamic_smem(k, device, kGemvStreamMaxSmem);
}

template <typename T>
void gemv_stream_allow_smem(int device) {
  gemv_stream_allow_smem_one<T, GEMV_IN_T, GEMV_OUT_RESID, 2>(device);
  gemv_stream_allow_smem_one<T, GEMV_IN_LN, GEMV_OUT_F32>(device);
  gemv_stream_allow_smem_one<T, GEMV_IN_LN, GEMV_OUT_QKV>(device);
  gemv_stream_allow_smem_one<T, GEMV_IN_LN, GEMV_OUT_GATED>(device);
  gemv_stream_allow_smem_one<T, GEMV_IN_LN, GEMV_OUT_ROPE>(device);
  gemv_stream_allow_smem_one<T, GEMV_IN_LN, GEMV_OUT_ACT>(device);
  gemv_stream_allow_smem_one<T, GEMV_IN_T, GEMV_OUT_RESID>(device);
  gemv_stream_allow_smem_one<T, GEMV_IN_T, GEMV_OUT_F32>(device);  // tensor-parallel branches
}

}  // namespace gollm

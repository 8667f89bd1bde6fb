// gemv.cuh — the projections of steps with few token rows (decode at small batch), where
// a GEMM is a matrix-vector product bound by reading the weights once. One kernel does a
// whole projection with its neighbours fused: the LayerNorm before it (recomputed by each
// block from the fp32 residual stream, a few KB from L2) and the bias with the residual
// add, the activation, or the KV-cache write after it. That leaves five launches a layer.
#pragma once
#include "activation.cuh"
#include "common.cuh"

namespace gollm {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvMaxRows = 8;
// LayerNorm prologue rows up to 32 lanes × kGemvLnVec float4 wide stay in registers.
constexpr int kGemvLnVec = 8;
constexpr int kGemvUnroll = 4;  // 16-byte weight loads a lane has in flight

// What a gemv kernel reads as its input rows x [n][in].
enum GemvIn {
  GEMV_IN_LN = 0,  // LayerNorm(h[idx ? idx[r] : r]) with gamma, beta; h fp32 [*][in]
  GEMV_IN_T = 1    // x [n][in] in T
};

// What it does with v = x·Wᵀ[o] + bias[o] for row r and output o.
enum GemvOut {
  GEMV_OUT_RESID = 0,  // h[r][o] += v                      (fp32 residual stream)
  GEMV_OUT_ACT = 1,    // y[r][o] = T(act(v))
  GEMV_OUT_F32 = 2,    // y[r][o] = v                        (fp32; the LM head)
  GEMV_OUT_QKV = 3     // qkv[r][o] = v (queries scaled), keys and values also to the pool
};

// GemvArgs gathers a gemv launch's operands.
struct GemvArgs {
  const void* w;         // [out][in] T, row-major (the transposed Conv1D weight)
  const float* bias;     // [out] fp32, or null
  int n, in, out;        // rows, input width, output width
  // Input.
  const float* h;        // GEMV_IN_LN: residual stream [*][in]
  const int32_t* idx;    // GEMV_IN_LN: row indices into h, or null for 0..n-1
  const float* gamma;    // GEMV_IN_LN: [in]
  const float* beta;     // GEMV_IN_LN: [in]
  float eps;             // GEMV_IN_LN: epsilon
  const void* x;         // GEMV_IN_T: [n][in] T
  // Output.
  float* hout;           // GEMV_OUT_RESID: [n][out]
  void* y;               // GEMV_OUT_ACT: [n][out] T; GEMV_OUT_F32 / GEMV_OUT_QKV: [n][out] fp32
  int act;               // GEMV_OUT_ACT: gollm_activation
  // GEMV_OUT_QKV: the KV pool and where each row's position lives.
  void* kv;
  const int32_t* row_pos;
  const int32_t* row_seq;
  const DevSeq* seqs;
  const int32_t* blocks;
  KVGeom geom;
  int layer;
  float qscale;
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

// gemv_store applies the output stage to v for row r, output o.
template <typename T, int OUT>
__device__ __forceinline__ void gemv_store(const GemvArgs& a, int r, int o, float v) {
  if (OUT == GEMV_OUT_RESID) {
    a.hout[(int64_t)r * a.out + o] += v;
  } else if (OUT == GEMV_OUT_ACT) {
    static_cast<T*>(a.y)[(int64_t)r * a.out + o] = from_f32<T>(activate(v, a.act));
  } else if (OUT == GEMV_OUT_F32) {
    static_cast<float*>(a.y)[(int64_t)r * a.out + o] = v;
  } else {  // GEMV_OUT_QKV
    const int hidden = a.geom.heads * a.geom.head_dim;
    float* qkv = static_cast<float*>(a.y) + (int64_t)r * a.out;
    if (o < hidden) {
      qkv[o] = v * a.qscale;
      return;
    }
    qkv[o] = v;
    const int pos = a.row_pos[r];
    const int64_t block = a.blocks[a.seqs[a.row_seq[r]].blk_off + pos / a.geom.tokens_per_block];
    const int kind = o < 2 * hidden ? 0 : 1;
    const int cc = o - (kind + 1) * hidden;
    const int head = cc / a.geom.head_dim, d = cc % a.geom.head_dim;
    static_cast<T*>(a.kv)[a.geom.page(block, a.layer, kind, head) +
                          (int64_t)(pos % a.geom.tokens_per_block) * a.geom.head_dim + d] =
        from_f32<T>(v);
  }
}

// gemv_prefetch pulls into L2 the weight rows this block will read in gemv_block.
template <typename T>
__device__ __forceinline__ void gemv_prefetch(const GemvArgs& a, int wpo) {
  const int opb = kGemvWarps / wpo;
  const char* wb = static_cast<const char*>(a.w);
  const int64_t row_bytes = (int64_t)a.in * sizeof(T);
  for (int64_t ob = (int64_t)blockIdx.x * opb; ob < a.out; ob += (int64_t)gridDim.x * opb) {
    const int64_t bytes = (a.out - ob < opb ? a.out - ob : opb) * row_bytes;
    for (int64_t b = threadIdx.x * 128; b < bytes; b += kGemvThreads * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(wb + ob * row_bytes + b));
  }
}

// gemv_block is one block's share of a gemv: its input rows into shared memory (smem,
// R * in elements of T), then outputs blockIdx.x*opb… in steps of gridDim.x*opb. It is
// the body of gemv_kernel and a phase of decode_step_kernel. Ends with a barrier, so the
// caller may reuse smem.
template <typename T, int R, int IN, int OUT>
__device__ void gemv_block(const GemvArgs& a, int wpo, unsigned char* smem) {
  T* xs = reinterpret_cast<T*>(smem);  // [R][in]
  __shared__ float part_acc[kGemvWarps][R];
  const int in = a.in, n = a.n;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int opb = kGemvWarps / wpo;  // outputs per block and pass
  if (IN == GEMV_IN_LN) {
    if (in <= 32 * 4 * kGemvLnVec) {
      // Warp r normalizes row r from registers: the row's loads, then gamma's and beta's,
      // are each issued together (two memory round trips), mean and variance by shuffles.
      if (warp < n) {
        const float4* hr =
            reinterpret_cast<const float4*>(a.h + (int64_t)(a.idx ? a.idx[warp] : warp) * in);
        const float4* g4 = reinterpret_cast<const float4*>(a.gamma);
        const float4* b4 = reinterpret_cast<const float4*>(a.beta);
        const int in4 = in / 4;
        float4 xv[kGemvLnVec], gv[kGemvLnVec], bv[kGemvLnVec];
#pragma unroll
        for (int u = 0; u < kGemvLnVec; u++) xv[u] = ld_f4_now(hr + min(lane + 32 * u, in4 - 1));
#pragma unroll
        for (int u = 0; u < kGemvLnVec; u++) gv[u] = ld_f4_now(g4 + min(lane + 32 * u, in4 - 1));
#pragma unroll
        for (int u = 0; u < kGemvLnVec; u++) bv[u] = ld_f4_now(b4 + min(lane + 32 * u, in4 - 1));
        float s = 0.f;
#pragma unroll
        for (int u = 0; u < kGemvLnVec; u++) {
          if (lane + 32 * u >= in4) xv[u] = make_float4(0.f, 0.f, 0.f, 0.f);
          s += (xv[u].x + xv[u].y) + (xv[u].z + xv[u].w);
        }
        const float mean = warp_sum(s) / in;
        float v = 0.f;
#pragma unroll
        for (int u = 0; u < kGemvLnVec; u++) {
          if (lane + 32 * u < in4) {
            const float dx = xv[u].x - mean, dy = xv[u].y - mean, dz = xv[u].z - mean,
                        dw = xv[u].w - mean;
            v += (dx * dx + dy * dy) + (dz * dz + dw * dw);
          }
        }
        const float rstd = rsqrtf(warp_sum(v) / in + a.eps);
        T* xr = xs + warp * in;
#pragma unroll
        for (int u = 0; u < kGemvLnVec; u++) {
          const int c = lane + 32 * u;
          const float4 gg = gv[u], bb = bv[u];
          if (c < in4) {
            xr[4 * c] = from_f32<T>((xv[u].x - mean) * rstd * gg.x + bb.x);
            xr[4 * c + 1] = from_f32<T>((xv[u].y - mean) * rstd * gg.y + bb.y);
            xr[4 * c + 2] = from_f32<T>((xv[u].z - mean) * rstd * gg.z + bb.z);
            xr[4 * c + 3] = from_f32<T>((xv[u].w - mean) * rstd * gg.w + bb.w);
          }
        }
      }
    } else {
      // Wide rows: warp r takes row r's mean and variance with shuffles alone (R <=
      // kGemvWarps), so the prologue costs one block barrier instead of two per row.
      __shared__ float stats[kGemvWarps][2];
      if (warp < n) {
        const float* hr = a.h + (int64_t)(a.idx ? a.idx[warp] : warp) * in;
        float s = 0.f;
        for (int c = lane; c < in; c += 32) s += hr[c];
        const float mean = warp_sum(s) / in;
        float v = 0.f;
        for (int c = lane; c < in; c += 32) {
          float d = hr[c] - mean;
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
        const float* hr = a.h + (int64_t)(a.idx ? a.idx[r] : r) * in;
        const float mean = stats[r][0], rstd = stats[r][1];
        for (int c = threadIdx.x; c < in; c += blockDim.x)
          xs[r * in + c] = from_f32<T>((hr[c] - mean) * rstd * a.gamma[c] + a.beta[c]);
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
  // wpo warps share an output, each taking every wpo-th 32-chunk stretch of its row, so
  // that long rows keep enough loads in flight.
  const int grp = warp / wpo, part = warp % wpo;
  const int chunks = in / 8;
  for (int ob = blockIdx.x * opb; ob < a.out; ob += gridDim.x * opb) {
    const int o = ob + grp;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    if (o < a.out) {
      const uint4* wrow =
          reinterpret_cast<const uint4*>(static_cast<const T*>(a.w) + (int64_t)o * in);
      // kGemvUnroll pieces per lane in flight together: loads at clamped indices, the
      // pieces past the row zeroed after loading (a bounds branch before each load would
      // serialize them; gemv_wpo keeps most rows to one such round).
      for (int c0 = part * 32 + lane; c0 < chunks; c0 += kGemvUnroll * 32 * wpo) {
        uint4 wv[kGemvUnroll];
#pragma unroll
        for (int u = 0; u < kGemvUnroll; u++)
          wv[u] = __ldg(wrow + min(c0 + u * 32 * wpo, chunks - 1));
#pragma unroll
        for (int u = 0; u < kGemvUnroll; u++) {
          const int c = min(c0 + u * 32 * wpo, chunks - 1);
          if (c0 + u * 32 * wpo >= chunks) wv[u] = make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int r = 0; r < R; r++) {
            if (r < n) dot8<T>(wv[u], reinterpret_cast<const uint4*>(xs + r * in)[c], acc[r]);
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
    if (wpo > 1) {
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) part_acc[warp][r] = acc[r];
      }
      __syncthreads();
      if (part == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
          float t = 0.f;
          for (int p = 0; p < wpo; p++) t += part_acc[warp + p][r];
          acc[r] = t;
        }
      }
      __syncthreads();
    }
    if (part != 0 || o >= a.out) continue;
    // Lane r finishes row r.
    float v = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++)
      if (lane == r) v = acc[r];
    if (lane < n) gemv_store<T, OUT>(a, lane, o, a.bias ? v + a.bias[o] : v);
  }
  __syncthreads();
}

// gemv_kernel: blocks of kGemvThreads; each warp group takes outputs in turn (grid-stride),
// its lanes reading W[o] in 16-byte pieces (coalesced), every input row reusing them.
// Dynamic shared memory: R * in elements of T (the input rows). in % 8 == 0.
template <typename T, int R, int IN, int OUT>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvArgs a, int wpo) {
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  griddep_launch();
  // The weights do not depend on the previous kernel: start pulling them into L2 before
  // waiting for it.
  gemv_prefetch<T>(a, wpo);
  griddep_wait();
  gemv_block<T, R, IN, OUT>(a, wpo, gemv_smem);
}

// gemv_wpo: warps per output, enough that each lane loads about three 16-byte pieces.
__host__ __device__ inline int gemv_wpo(int in) {
  int chunks = in / 8, wpo = 1;
  while (wpo < kGemvWarps && chunks / (32 * wpo * 2) >= 3) wpo *= 2;
  return wpo;
}

inline int gemv_rows(int n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8; }

// gemv_fits says whether the gemv path can run n rows of width in.
inline bool gemv_fits(int n, int in) {
  return n >= 1 && n <= kGemvMaxRows && in % 8 == 0 && (size_t)gemv_rows(n) * in * 2 <= 96 * 1024;
}

template <typename T, int R, int IN, int OUT>
void gemv_launch(const GemvArgs& a, Stream stream) {
  size_t smem = (size_t)R * a.in * sizeof(T);
  const int wpo = gemv_wpo(a.in);
  // Enough blocks to fill the GPU a few times over; warps loop over the rest. With many
  // rows each block's LayerNorm prologue costs more, so fewer blocks do more outputs.
  int cap = (IN == GEMV_IN_LN && R >= 4) ? 512 : 1024;
  int blocks = std::min(ceil_div(a.out, kGemvWarps / wpo), cap);
  launch("gemv_kernel", gemv_kernel<T, R, IN, OUT>, blocks, kGemvThreads, smem, stream, a, wpo);
}

// gemv runs y = x·Wᵀ + bias with the fused input and output, choosing the row count R.
template <typename T, int IN, int OUT>
void gemv(const GemvArgs& a, Stream stream) {
  switch (gemv_rows(a.n)) {
    case 1: gemv_launch<T, 1, IN, OUT>(a, stream); break;
    case 2: gemv_launch<T, 2, IN, OUT>(a, stream); break;
    case 4: gemv_launch<T, 4, IN, OUT>(a, stream); break;
    default: gemv_launch<T, 8, IN, OUT>(a, stream); break;
  }
}

// gemv_allow_smem lets every gemv kernel use up to 96 KB of dynamic shared memory.
template <typename T, int IN, int OUT>
void gemv_allow_smem_one() {
  const int s = 96 * 1024;
  CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<T, 1, IN, OUT>, cudaFuncAttributeMaxDynamicSharedMemorySize, s));
  CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<T, 2, IN, OUT>, cudaFuncAttributeMaxDynamicSharedMemorySize, s));
  CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<T, 4, IN, OUT>, cudaFuncAttributeMaxDynamicSharedMemorySize, s));
  CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<T, 8, IN, OUT>, cudaFuncAttributeMaxDynamicSharedMemorySize, s));
}

template <typename T>
void gemv_allow_smem() {
  gemv_allow_smem_one<T, GEMV_IN_LN, GEMV_OUT_QKV>();
  gemv_allow_smem_one<T, GEMV_IN_LN, GEMV_OUT_ACT>();
  gemv_allow_smem_one<T, GEMV_IN_LN, GEMV_OUT_F32>();
  gemv_allow_smem_one<T, GEMV_IN_T, GEMV_OUT_RESID>();
}

}  // namespace gollm

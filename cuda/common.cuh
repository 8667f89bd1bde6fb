// common.cuh — errors, element types and block reductions shared by gollm's kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "gollm.h"
#include "sizes.h"

namespace gollm {

// Error is thrown inside the library and turned into a gollm_status at the ABI boundary.
struct Error : std::runtime_error {
  int32_t code;  // a gollm_code
  Error(int32_t c, const std::string& msg) : std::runtime_error(msg), code(c) {}
};

inline void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  // The failure is reported here: take it off the thread's last error too, so that a
  // later launch check (another engine on this thread, say) is not blamed for it.
  cudaGetLastError();
  int32_t code = e == cudaErrorMemoryAllocation ? GOLLM_ERR_OUT_OF_MEMORY : GOLLM_ERR_CUDA;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s: %s (%s, %s:%d)", what, cudaGetErrorString(e),
                cudaGetErrorName(e), file, line);
  throw Error(code, buf);
}

inline const char* cublas_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

inline void check_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s: %s (%d, %s:%d)", what, cublas_name(s), (int)s, file,
                line);
  throw Error(s == CUBLAS_STATUS_ALLOC_FAILED ? GOLLM_ERR_OUT_OF_MEMORY : GOLLM_ERR_CUBLAS, buf);
}

#define CUDA_CHECK(x) ::gollm::check_cuda((x), #x, __FILE__, __LINE__)
#define CUBLAS_CHECK(x) ::gollm::check_cublas((x), #x, __FILE__, __LINE__)
// LAUNCH_CHECK reports a launch's configuration error at once (execution errors surface
// at the step's synchronisation).
#define LAUNCH_CHECK(name) ::gollm::check_cuda(cudaGetLastError(), name, __FILE__, __LINE__)

// Element conversions for the two compute types.
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// store4 converts four values to T (2-byte) and stores them with one 8-byte store; dst is
// 8-byte aligned.
template <typename T>
__device__ __forceinline__ void store4(T* dst, float a, float b, float c, float d) {
  alignas(8) T out[4] = {from_f32<T>(a), from_f32<T>(b), from_f32<T>(c), from_f32<T>(d)};
  *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(out);
}

// Pair conversions for 4-byte loads of two elements.
// embed_scaled is v (an embedding element, exact in T) times scale as transformers
// computes it in T: scale rounded to T, the product rounded to T (Gemma's embed_scale).
template <typename T>
__device__ __forceinline__ float embed_scaled(float v, float scale) {
  return to_f32(from_f32<T>(v * to_f32(from_f32<T>(scale))));
}

__device__ __forceinline__ float2 to_f32x2(__half2 x) { return __half22float2(x); }
__device__ __forceinline__ float2 to_f32x2(__nv_bfloat162 x) { return __bfloat1622float2(x); }
template <typename T> struct Pair;
template <> struct Pair<__half> { using type = __half2; };
template <> struct Pair<__nv_bfloat16> { using type = __nv_bfloat162; };

// to_f32x8 converts 8 packed T to fp32.
template <typename T>
__device__ __forceinline__ void to_f32x8(const uint4& v, float (&f)[8]) {
  using T2 = typename Pair<T>::type;
  const T2* p = reinterpret_cast<const T2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 q = to_f32x2(p[i]);
    f[2 * i] = q.x, f[2 * i + 1] = q.y;
  }
}

// rotate_cs rotates the pair (a, b) by the angle whose cosine and sine are cs and sn:
// (a·cos − b·sin, b·cos + a·sin). Every rotary kernel ends in it, so that they round alike.
__device__ __forceinline__ float2 rotate_cs(float a, float b, float cs, float sn) {
  return make_float2(a * cs - b * sn, b * cs + a * sn);
}

// rotate_pair is rotary's rotation of the pair (a, b) — dimensions i and i + rope_dim/2 of
// a query or key head (rotate_half's pairing) — by the angle freq · pos, computed in fp32 as
// transformers does.
__device__ __forceinline__ float2 rotate_pair(float a, float b, float freq, int pos) {
  float sn, cs;
  sincosf(freq * (float)pos, &sn, &cs);
  return rotate_cs(a, b, cs, sn);
}

// last_block_of counts the calling block's arrival on ticket, one of count blocks that
// split a piece of work after writing their shares to global memory, and says whether it
// came last; the last block then sees every share (read them with __ldcg: this SM's L1
// may hold older copies) and resets the ticket for the next launch (graphs replay it).
// Called by every thread of the block. The barrier orders the block's writes before
// thread 0's fence, which is cumulative — a grid barrier's pattern —, so one thread
// fences instead of every one (a fence in each thread stalled every warp).
__device__ __forceinline__ bool last_block_of(int* ticket, int count) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(ticket, 1) == count - 1;
    if (last) *ticket = 0;
    __threadfence();
  }
  __syncthreads();
  return last;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// block_sum returns the sum of v over the block to every thread. red needs 32 slots of T;
// blockDim.x is a multiple of 32.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* red) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // red may still be read by a previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : T(0);
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* red) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : -INFINITY;
  return warp_max(v);
}

inline int ceil_div(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

// Programmatic dependent launch (sm_90): a kernel lets the next one start launching as
// soon as all its blocks run (griddep_launch), and the next one waits for it to finish
// (griddep_wait) only when it needs its results, so launch latency and the next kernel's
// weight prefetch overlap the previous kernel's tail. Both are no-ops on older GPUs and
// for kernels launched without the attribute.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// smem_u32 is a shared-memory pointer as the 32-bit address PTX's shared operands take.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// cp.async (sm_80): 16 bytes from global memory into shared memory without passing
// through registers, cached in L2 only; groups of them are committed and waited on.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(smem)), "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// cp_async16_zfill copies src_bytes (0 or 16) and zero-fills the rest of the 16 bytes.
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Bulk copies (sm_90's TMA, cp.async.bulk): one instruction copies a contiguous range of
// global memory (16-byte aligned, a multiple of 16 bytes) into shared memory and reports
// its bytes to an mbarrier, which completes its phase once the expected bytes arrived and
// its one arrival (mbar_expect_tx) was made. A block then stages its weights with a few
// instructions instead of a 16-byte cp.async per thread and piece, whose issue alone took
// several µs a kernel. Callers keep cp.async where kBulk is false (older GPUs, or
// GOLLM_CUDA_BULK=0); on them these functions do nothing.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr bool kBulk = true;
#else
constexpr bool kBulk = false;
#endif

// mbar_init readies barrier bar for one arrival a phase; call from one thread, then
// __syncthreads before anyone uses it.
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // visible to the copy engine
#endif
}
// mbar_expect_tx is the phase's arrival, announcing bytes to come (from one thread).
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
#endif
}
// bulk_copy copies bytes from gmem to smem, counted on bar.
__device__ __forceinline__ void bulk_copy(void* smem, const void* gmem, unsigned bytes,
                                          uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
#endif
}
// mbar_wait waits for bar's phase of the given parity (0 for its first use) to complete.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
#endif
}

// Stream is where a launcher enqueues its kernel, and whether it may overlap the previous
// kernel (programmatic dependent launch).
struct Stream {
  cudaStream_t st = nullptr;
  bool pdl = false;
  Stream() = default;
  Stream(cudaStream_t s, bool p = false) : st(s), pdl(p) {}  // NOLINT: implicit on purpose
};

// launch enqueues kernel k with the PDL attribute when s.pdl is set.
template <typename... Params, typename... Args>
void launch(const char* name, void (*k)(Params...), dim3 grid, dim3 block, size_t smem,
            Stream s, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s.st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = s.pdl ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...), name, __FILE__, __LINE__);
}

// dynamic_smem_max is the most dynamic shared memory kernel k may be given on device:
// the per-block opt-in limit less its static shared memory.
template <typename K>
size_t dynamic_smem_max(K k, int device) {
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes fa{};
  CUDA_CHECK(cudaFuncGetAttributes(&fa, k));
  return optin > (int)fa.sharedSizeBytes ? (size_t)optin - fa.sharedSizeBytes : 0;
}

// allow_dynamic_smem raises kernel k's dynamic shared-memory limit to cap, or to what the
// device allows it where that is less.
template <typename K>
void allow_dynamic_smem(K k, int device, size_t cap = SIZE_MAX) {
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)std::min(cap, dynamic_smem_max(k, device))));
}

// mma_16816 is D += A·B for one m16n8k16 tensor-core tile (fp32 accumulators): a0…a3 the
// A fragment (rows g and g + 8, two k pairs each), b0, b1 the B fragment, in PTX's order.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// ldsm_x4 loads four 8×8 matrices of 16-bit elements from shared memory (ldmatrix): lanes
// 8i…8i+7 give matrix i's row addresses, and lane (g, t) = (lane / 4, lane % 4) receives
// row g's elements 2t and 2t + 1 of each in r[i]; ldsm_x4_t transposed (column g's rows 2t
// and 2t + 1).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// pack2 rounds a and b to T and packs them as an mma operand register (a in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  uint32_t r;
  if constexpr (std::is_same<T, __half>::value) {
    const __half2 h = __floats2half2_rn(a, b);
    memcpy(&r, &h, 4);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    memcpy(&r, &h, 4);
  }
  return r;
}

// DevSeq is a sequence's step descriptor as the kernels read it (built from gollm_seq).
struct DevSeq {
  int32_t blk_off;      // first entry of its block table in the step's block array
  int32_t pos;          // position of its first new token
  int32_t ntok;         // new tokens this step
  int32_t flags;        // gollm_seq_flag bits
  float temperature;    // 0: greedy
  int32_t top_k;        // 0: no limit
  float top_p;          // 0 or 1: no limit
  float rep;            // repetition penalty; 0 or 1: none
  float presence;       // presence penalty
  float frequency;      // frequency penalty
  int32_t pen_off;      // distinct history tokens and counts
  int32_t pen_cnt;
  int32_t mask_off;     // tokens to mask
  int32_t mask_cnt;
  int32_t bias_off;     // embedding bias, or -1
  int32_t ret_row;      // row of the returned-logits buffer, or -1
  double uniform;       // this step's draw in [0, 1)
  int32_t allow_off;    // guided decoding's bitmask of allowed tokens, or -1
  float min_p;          // min-p cut; 0: none
};

// greedy_fast says whether a sequence's token is a plain argmax of its raw logits, or of
// those guided decoding's bitmask allows: greedy, no bias, penalties or token masks, no
// logits returned. Those rows take sample_greedy_kernel.
__host__ __device__ __forceinline__ bool greedy_fast(const DevSeq& sq) {
  return (sq.flags & GOLLM_SEQ_SAMPLE) && (sq.temperature == 0.f || sq.top_k == 1) &&
         sq.bias_off < 0 && sq.pen_cnt == 0 && sq.mask_cnt == 0 && sq.ret_row < 0;
}

// CtxTile is up to ctx_queries(head_dim) consecutive new tokens of one sequence.
struct CtxTile {
  int32_t seq;   // sequence index
  int32_t row0;  // token row of its first query
  int32_t n;     // queries in the tile
  int32_t pos0;  // position of its first query
};

// QkvExtra is what the QKV epilogue adds to qkv_rope_write_kernel's: the per-head norms'
// weights (RMSNorm over head_dim, eps; null: none), longrope's long frequencies and the
// length past which a sequence takes them (long_freq null: one set), and the factor on
// cos and sin.
struct QkvExtra {
  const float* q_gamma = nullptr;   // [head_dim] fp32, the query heads'
  const float* k_gamma = nullptr;   // [head_dim] fp32, the key heads'
  float eps = 0.f;
  const float* long_freq = nullptr;  // [rope_dim/2] fp32
  int long_from = 0;                 // a sequence longer than this takes long_freq
  float rope_scale = 1.f;
};

// KVGeom locates a (block, layer, K|V, kv head) page of the pool, laid out
// [block][layer][2][kv_heads][tokens_per_block][head_dim] so that one head's keys within a
// block are contiguous (offsets in elements: two bytes, or one in an FP8 pool). Query head
// h reads KV head h / (heads / kv_heads). In an FP8 pool (fp8) it also carries the layer's
// key and value scales, which the dispatchers set for the layer they launch (layer_geom),
// so that graphs capture them with the launch.
struct KVGeom {
  int layers, heads, kv_heads, head_dim, tokens_per_block;
  int fp8 = 0;                          // nonzero: float8_e4m3fn codes (kv8)
  float kscale = 1.f, vscale = 1.f;     // the launch's layer's scales (fp8)
  __host__ __device__ __forceinline__ float scale(int kind) const { return kind ? vscale : kscale; }
  __host__ __device__ __forceinline__ int64_t page(int64_t block, int layer, int kind,
                                                   int head) const {
    return (block * layers + layer) * 2 * kv_heads * (int64_t)tokens_per_block * head_dim +
           head_off(kind, head);
  }
  // head_off is page(block, layer, kind, head) - page(block, layer, 0, 0).
  __host__ __device__ __forceinline__ int64_t head_off(int kind, int head) const {
    return ((int64_t)kind * kv_heads + head) * tokens_per_block * head_dim;
  }
  // at is where position slot's head_dim values start within page(block, layer, kind, head).
  __host__ __device__ __forceinline__ int64_t at(int64_t block, int layer, int kind, int head,
                                                 int slot) const {
    return page(block, layer, kind, head) + (int64_t)slot * head_dim;
  }
  // kv_head is the KV head query head h reads.
  __host__ __device__ __forceinline__ int kv_head(int h) const { return h / (heads / kv_heads); }
  // q_width and qkv_width are a QKV row's query part and whole width.
  __host__ __device__ __forceinline__ int q_width() const { return heads * head_dim; }
  __host__ __device__ __forceinline__ int qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
  // kv_col is where column c of a QKV row goes, for a key or value column (q_width <= c <
  // qkv_width), relative to at(block, layer, 0, 0, slot).
  __host__ __device__ __forceinline__ int64_t kv_col(int c) const {
    const int kvw = kv_heads * head_dim;
    const int cc = c - q_width();
    const int kind = cc < kvw ? 0 : 1;
    const int k = cc - kind * kvw;
    return head_off(kind, k / head_dim) + k % head_dim;
  }
  // kv_kind is 0 for a key column of a QKV row, 1 for a value column.
  __host__ __device__ __forceinline__ int kv_kind(int c) const {
    return c - q_width() < kv_heads * head_dim ? 0 : 1;
  }
};

// The KV pool's element types: the compute type T, or kv8 — float8_e4m3fn codes of x /
// scale (the layer's key or value scale), rounded to nearest even and saturated at ±448,
// as model.Float32ToE4M3 rounds them. The readers take 8 elements a piece (KVPiece: 16
// bytes of T, 8 of kv8) and widen them to fp32 (kv_f32x8: codes exactly); the scales fold
// into the sums — the query times the key scale (kv_qscale) before the dot products, the
// output times the value scale (kv_vscale) after the weighted sum —, so that no element
// pays a multiply. The writers go through kv_put.
using kv8 = __nv_fp8_e4m3;
template <typename K> struct KVPiece { using type = uint4; };
template <> struct KVPiece<kv8> { using type = uint2; };
template <typename K> constexpr bool kv_is_fp8 = std::is_same<K, kv8>::value;

// kv_encode is v's code in an FP8 pool of scale s.
__device__ __forceinline__ uint8_t kv_encode(float v, float s) {
  return (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(v, s), __NV_SATFINITE, __NV_E4M3);
}

// kv_decode2 widens two codes (the lower byte first) to fp32, exactly (every e4m3 value is
// an fp16 value).
__device__ __forceinline__ float2 kv_decode2(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return __half22float2(__half2(h));
}

// kv_f32x8 widens a piece of 8 pool elements to fp32, exactly (kv8: the codes' values).
template <typename K>
__device__ __forceinline__ void kv_f32x8(const typename KVPiece<K>::type& v, float (&f)[8]) {
  if constexpr (kv_is_fp8<K>) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(&v);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float2 q = kv_decode2(p[i]);
      f[2 * i] = q.x, f[2 * i + 1] = q.y;
    }
  } else {
    to_f32x8<K>(v, f);
  }
}

// kv_qscale is a query element as dot products with a pool's keys take it: times the
// layer's key scale in an FP8 pool, else as it is. kv_vscale is an output element of the
// weighted sum of a pool's values: times the value scale in an FP8 pool.
template <typename K>
__device__ __forceinline__ float kv_qscale(float q, const KVGeom& g) {
  if constexpr (kv_is_fp8<K>)
    return q * g.kscale;
  else
    return q;
}
template <typename K>
__device__ __forceinline__ float kv_vscale(float o, const KVGeom& g) {
  if constexpr (kv_is_fp8<K>)
    return o * g.vscale;
  else
    return o;
}

// kv_put stores v as element i of the pool kv: in T, or in an FP8 pool (g.fp8) as the code
// of v over the kind's scale (kind 0: keys, 1: values).
template <typename T>
__device__ __forceinline__ void kv_put(void* kv, int64_t i, float v, const KVGeom& g, int kind) {
  if (g.fp8)
    static_cast<uint8_t*>(kv)[i] = kv_encode(v, g.scale(kind));
  else
    static_cast<T*>(kv)[i] = from_f32<T>(v);
}

// kv_put4 stores four consecutive elements of one kind from i (8-byte aligned in T, 4 in
// an FP8 pool) with one store.
template <typename T>
__device__ __forceinline__ void kv_put4(void* kv, int64_t i, float a, float b, float c, float d,
                                        const KVGeom& g, int kind) {
  if (g.fp8) {
    const float s = g.scale(kind);
    const uint32_t w = (uint32_t)kv_encode(a, s) | (uint32_t)kv_encode(b, s) << 8 |
                       (uint32_t)kv_encode(c, s) << 16 | (uint32_t)kv_encode(d, s) << 24;
    *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(kv) + i) = w;
  } else {
    store4(static_cast<T*>(kv) + i, a, b, c, d);
  }
}

// kv_widen8 widens a piece of 8 FP8 codes to 8 T (exact), in one 16-byte word.
template <typename T>
__device__ __forceinline__ uint4 kv_widen8(const uint2& v) {
  const uint16_t* p = reinterpret_cast<const uint16_t*>(&v);
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(p[i]), __NV_E4M3);
    if constexpr (std::is_same<T, __half>::value) {
      memcpy(&r[i], &h, 4);
    } else {
      const float2 f = __half22float2(__half2(h));
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
      memcpy(&r[i], &b, 4);
    }
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// kv_widen is a pool element in T: T's as it is, kv8's code exactly (the scale is the
// tensor-core kernels' to fold into their fp32 sums).
template <typename T, typename K>
__device__ __forceinline__ T kv_widen(K x) {
  if constexpr (kv_is_fp8<K>)
    return from_f32<T>(__half2float(__half(__nv_cvt_fp8_to_halfraw(x.__x, __NV_E4M3))));
  else
    return x;
}

}  // namespace gollm

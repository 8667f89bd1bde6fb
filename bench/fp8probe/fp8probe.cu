// fp8probe — which of cuBLASLt's block-scaled FP8 GEMMs this GPU and library take, and
// whether they compute what gollm means (issue 34). One run, standalone (no gollm code):
//   nvcc -std=c++17 -O2 -gencode=arch=compute_90,code=sm_90 fp8probe.cu -o fp8probe
//        -Xlinker=/path/libcublasLt.so.13   (one line)
//   ./fp8probe [OUTDIR]   (tests/gpu/fp8probe.sh builds and runs it)
//
// The product is gollm's projection y [rows][out] = x · Wᵀ with x [rows][K] and
// W [out][K] e4m3, both row-major with K contiguous. In cuBLASLt's column-major terms:
//   WA: A = W (M = out), B = x (N = rows), D [out × rows] ld out = y itself (gollm's);
//   XA: A = x (M = rows), B = W (N = out), D [rows × out] ld rows = yᵀ (NVIDIA's sample's).
// Part 1 asks cublasLtMatmulAlgoGetHeuristic for every shape × row count under each
// assignment, transposes (the operand layouts follow them; only TN keeps the data above),
// scale modes (A, B) among VEC128_32F, BLK128x128_32F, and SCALAR_32F / OUTER_VEC_32F as
// controls, D fp32 or bf16, the scale pointers set before the query or not; a line per
// combination with any algorithm, the rest counted by status.
// Part 2 runs the TN combinations gollm could use on random e4m3 data with random scales
// (distinct per group and block, so that a misread scale layout shows) against a
// dequantized fp32 reference on sampled rows (relative L2), timed (median of 20), beside a
// bf16 cuBLASLt GEMM of the same shape. Full tables: OUTDIR/fp8probe-heuristic.tsv and
// OUTDIR/fp8probe-gemm.tsv.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "FAIL: %s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)
#define LK(x)                                                                                  \
  do {                                                                                         \
    cublasStatus_t s_ = (x);                                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
      std::fprintf(stderr, "FAIL: %s: %s (%s:%d)\n", #x, stname(s_), __FILE__, __LINE__);     \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

static const char* stname(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "NOT_SUPPORTED";
    default: return "UNKNOWN";
  }
}

constexpr int kScalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, kOuter = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
              kVec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, kBlk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
static const char* modename(int m) {
  return m == kScalar ? "SCALAR" : m == kOuter ? "OUTER" : m == kVec ? "VEC128" : m == kBlk ? "BLK128" : "?";
}
constexpr size_t kWs = 32u << 20;  // gollm's cuBLAS workspace

struct Shape {
  int K, N;  // in, out
};
static const Shape kShapes[] = {{4096, 6144}, {4096, 28672}, {14336, 4096}, {4096, 4096},
                                {256, 512},   {64, 128},     {64, 160},     {160, 64}};
static const int kRows[] = {16, 32, 48, 64, 128, 256, 512, 1024};

__host__ __device__ inline int cdiv(int a, int b) { return (a + b - 1) / b; }
static int rup(int a, int b) { return cdiv(a, b) * b; }

// A GEMM's description: dims in cuBLASLt's terms, operations, scale modes, D's type.
struct Desc {
  int M, N, K;
  cublasOperation_t ta, tb;
  int ma, mb;
  cudaDataType_t dt;
  bool fast = false;
};

struct Lt {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  ~Lt() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// build fills l for q; sa, sb: the scale pointers (null: left unset). Returns the first
// failing status.
static cublasStatus_t build(Lt& l, const Desc& q, const void* sa, const void* sb, cudaDataType_t ab = CUDA_R_8F_E4M3) {
  cublasStatus_t s;
#define TRY(x)                                          \
  if ((s = (x)) != CUBLAS_STATUS_SUCCESS) return s;
  TRY(cublasLtMatmulDescCreate(&l.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  TRY(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSA, &q.ta, sizeof q.ta));
  TRY(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSB, &q.tb, sizeof q.tb));
  if (ab == CUDA_R_8F_E4M3) {
    const int32_t ma = q.ma, mb = q.mb;
    const int8_t fast = q.fast ? 1 : 0;
    TRY(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
    TRY(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
    TRY(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    if (sa) TRY(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    if (sb) TRY(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
  }
  const bool at = q.ta == CUBLAS_OP_T, bt = q.tb == CUBLAS_OP_T;
  TRY(cublasLtMatrixLayoutCreate(&l.a, ab, at ? q.K : q.M, at ? q.M : q.K, at ? q.K : q.M));
  TRY(cublasLtMatrixLayoutCreate(&l.b, ab, bt ? q.N : q.K, bt ? q.K : q.N, bt ? q.N : q.K));
  TRY(cublasLtMatrixLayoutCreate(&l.d, q.dt, q.M, q.N, q.M));
#undef TRY
  return CUBLAS_STATUS_SUCCESS;
}

static int heuristic(cublasLtHandle_t h, const Lt& l, cublasLtMatmulHeuristicResult_t* res, int n, cublasStatus_t* st) {
  cublasLtMatmulPreference_t pref = nullptr;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kWs;
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  int found = 0;
  *st = cublasLtMatmulAlgoGetHeuristic(h, l.op, l.a, l.b, l.d, l.d, pref, n, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  return *st == CUBLAS_STATUS_SUCCESS ? found : 0;
}

// ---- data on the device ----

__device__ __host__ inline uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}
// A value in [-1, 1) from (seed, index).
__device__ __host__ inline float unit(uint32_t seed, size_t i) {
  return (float)(hash32(seed * 0x9e3779b9U ^ hash32((uint32_t)i) ^ (uint32_t)(i >> 32)) >> 8) / 8388608.f - 1.f;
}

// fill_fp8: q [n] e4m3 = random values spread over e4m3's range (at most 448).
__global__ void fill_fp8(__nv_fp8_storage_t* q, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    q[i] = __nv_cvt_float_to_fp8(unit(seed, i) * 400.f, __NV_SATFINITE, __NV_E4M3);
}

// to_bf16: o [rows][K] = q [rows][K] · s (the row's scale of its 128-group), for the bf16
// baseline; s [rows][G] row-major.
__global__ void to_bf16(const __nv_fp8_storage_t* q, const float* s, __nv_bfloat16* o, int rows, int K) {
  const int G = cdiv(K, 128);
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)rows * K; i += (size_t)gridDim.x * blockDim.x) {
    const int r = (int)(i / K), k = (int)(i % K);
    o[i] = __float2bfloat16(__half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3))) * s[(size_t)r * G + k / 128]);
  }
}

// reference: ref [S][out] = Σ_k x[rows_s[i]][k]·sx[r][k/128] · w[o][k]·sw[o][k/128] for the
// sampled rows, a warp an output; sx [rows][G], sw [out][G] row-major (logical scales).
__global__ void reference(const __nv_fp8_storage_t* x, const float* sx, const __nv_fp8_storage_t* w, const float* sw,
                          const int* rows_s, int S, int K, int out, float* ref) {
  const int G = cdiv(K, 128);
  const size_t wid = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (wid >= (size_t)S * out) return;
  const int i = (int)(wid / out), o = (int)(wid % out), r = rows_s[i];
  float acc = 0.f;
  for (int k = lane; k < K; k += 32) {
    const float a = __half2float(__half(__nv_cvt_fp8_to_halfraw(x[(size_t)r * K + k], __NV_E4M3))) * sx[(size_t)r * G + k / 128];
    const float b = __half2float(__half(__nv_cvt_fp8_to_halfraw(w[(size_t)o * K + k], __NV_E4M3))) * sw[(size_t)o * G + k / 128];
    acc += a * b;
  }
  for (int d = 16; d > 0; d /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, d);
  if (lane == 0) ref[wid] = acc;
}

// gather: g [S][out] fp32 = the sampled rows of D (bf16 or fp32); WA: D[o + r·out], XA:
// D[r + o·rows].
__global__ void gather(const void* d, bool bf16, bool xa, const int* rows_s, int S, int rows, int out, float* g) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)S * out; i += (size_t)gridDim.x * blockDim.x) {
    const int s = (int)(i / out), o = (int)(i % out), r = rows_s[s];
    const size_t at = xa ? (size_t)r + (size_t)o * rows : (size_t)o + (size_t)r * out;
    g[i] = bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(d)[at]) : static_cast<const float*>(d)[at];
  }
}

// ---- scale tensors in cuBLASLt's layouts (cuBLAS docs, "Scaling factors layouts") ----

// pack_vec: VEC128_32F for an operand with P outer indices: [L][P], (i, g) at g·P + i.
static std::vector<float> pack_vec(const std::vector<float>& logical, int P, int L) {
  std::vector<float> v((size_t)L * P);
  for (int i = 0; i < P; i++)
    for (int g = 0; g < L; g++) v[(size_t)g * P + i] = logical[(size_t)i * L + g];
  return v;
}
// pack_blk: BLK128x128_32F: [ceil(P/128)][round_up(L, 4)], block (ib, g) at ib·L4 + g.
static std::vector<float> pack_blk(const std::vector<float>& blocks, int P, int L) {
  const int PB = cdiv(P, 128), L4 = rup(L, 4);
  std::vector<float> v((size_t)PB * L4, 0.f);
  for (int b = 0; b < PB; b++)
    for (int g = 0; g < L; g++) v[(size_t)b * L4 + g] = blocks[(size_t)b * L + g];
  return v;
}
// A random positive scale, distinct enough between neighbours: 2^(−3…3) · (1…2) / 448.
static float rscale(uint32_t seed, size_t i) {
  const uint32_t h = hash32(seed * 7919u + (uint32_t)i * 2654435761u + (uint32_t)(i >> 32));
  return std::ldexp(1.f + (h % 1000) / 1000.f, (int)((h >> 10) % 7) - 3) / 448.f;
}

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { CK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  Dev(const std::vector<T>& h) : Dev(h.size()) { CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

// median_us times f on stream: 3 untimed runs, then the median of reps timed ones, in µs.
template <typename F>
static float median_us(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, int reps, F&& f) {
  for (int i = 0; i < 3; i++) f();
  std::vector<float> t;
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(e0, stream));
    f();
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] * 1000.f;
}

// The combinations part 2 runs (all TN).
struct Combo {
  const char* name;
  bool xa;  // x is A
  int ma, mb;
  cudaDataType_t dt;
  const char* note;
};
static const Combo kCombos[] = {
    {"W=A:BLK x=B:VEC fp32", false, kBlk, kVec, CUDA_R_32F, "gollm's fp8lt.cuh"},
    {"W=A:BLK x=B:VEC bf16", false, kBlk, kVec, CUDA_R_16BF, "fp8lt.cuh's bf16 fallback"},
    {"W=A:VEC x=B:VEC fp32", false, kVec, kVec, CUDA_R_32F, "per-channel weights"},
    {"x=A:VEC W=B:BLK fp32", true, kVec, kBlk, CUDA_R_32F, "NVIDIA sample's order, D = yT"},
    {"x=A:VEC W=B:BLK bf16", true, kVec, kBlk, CUDA_R_16BF, "NVIDIA sample, D = yT"},
};

// ---- part 3 (--speed): scale recipes at max load's row counts ----
// Times the recipes the projections could take at 1,024 and 8,192 rows: fp8lt.cuh's
// block scaling (D fp32 and bf16), per-channel groups, per-row outer vectors (weights a
// scale an output row, x a scale a row: OUTER_VEC on both, D bf16/fp16/fp32, with and
// without FAST_ACCUM) and per-tensor scalars, beside bf16. Each the fastest of the
// heuristic's first 8 algorithms (median of 10). The outer-vector products are checked
// against a dequantized fp32 reference (relative L2 on 16 sampled rows).
struct SpeedCombo {
  const char* name;
  int ma, mb;
  cudaDataType_t dt;
  bool fast;
};
static const SpeedCombo kSpeed[] = {
    {"BLK/VEC fp32", kBlk, kVec, CUDA_R_32F, false},     {"BLK/VEC bf16", kBlk, kVec, CUDA_R_16BF, false},
    {"VEC/VEC bf16", kVec, kVec, CUDA_R_16BF, false},    {"OUTER bf16", kOuter, kOuter, CUDA_R_16BF, false},
    {"OUTER fp16", kOuter, kOuter, CUDA_R_16F, false},   {"OUTER fp32", kOuter, kOuter, CUDA_R_32F, false},
    {"OUTER bf16 fast", kOuter, kOuter, CUDA_R_16BF, true}, {"SCALAR bf16", kScalar, kScalar, CUDA_R_16BF, false},
    {"SCALAR bf16 fast", kScalar, kScalar, CUDA_R_16BF, true},
};

static void speed(cublasLtHandle_t h, void* ws, const std::string& outdir) {
  FILE* t = std::fopen((outdir + "/fp8probe-speed.tsv").c_str(), "w");
  if (t) std::fprintf(t, "combo\tK\tout\trows\tstatus\tus\ttflops\trel_l2\n");
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // fastest times l's n candidates on (A, B) into d: the best median in µs (-1: none ran),
  // its index in *pick.
  auto fastest = [&](const Lt& l, const cublasLtMatmulHeuristicResult_t* res, int n, const void* A, const void* B,
                     void* d, int* pick) {
    float best = -1;
    const float one = 1.f, zero = 0.f;
    for (int a = 0; a < n; a++) {
      if (cublasLtMatmul(h, l.op, &one, A, l.a, B, l.b, &zero, d, l.d, d, l.d, &res[a].algo, ws, kWs, stream) !=
          CUBLAS_STATUS_SUCCESS)
        continue;
      const float us = median_us(stream, e0, e1, 10, [&] {
        LK(cublasLtMatmul(h, l.op, &one, A, l.a, B, l.b, &zero, d, l.d, d, l.d, &res[a].algo, ws, kWs, stream));
      });
      if (best < 0 || us < best) best = us, *pick = a;
    }
    return best;
  };
  const int kSpeedRows[] = {1024, 8192};
  std::printf("\n== part 3: scale recipes at max load's row counts (us, TFLOP/s; rel L2 for OUTER) ==\n");
  for (int si = 0; si < 4; si++) {
    const int K = kShapes[si].K, out = kShapes[si].N, L = cdiv(K, 128), OB = cdiv(out, 128);
    const int maxrows = 8192;
    Dev<__nv_fp8_storage_t> w((size_t)out * K), x((size_t)maxrows * K);
    fill_fp8<<<1024, 256>>>(w.p, w.n, 11u + K + out);
    fill_fp8<<<1024, 256>>>(x.p, x.n, 23u + K);
    CK(cudaGetLastError());
    // Per-row scales (outer vectors), and the same expanded over groups for the reference.
    std::vector<float> sw(out), sx(maxrows), swg((size_t)out * L), sxg((size_t)maxrows * L);
    for (int o = 0; o < out; o++) sw[o] = rscale(5, o);
    for (int r = 0; r < maxrows; r++) sx[r] = rscale(6, r);
    for (int o = 0; o < out; o++)
      for (int g = 0; g < L; g++) swg[(size_t)o * L + g] = sw[o];
    for (int r = 0; r < maxrows; r++)
      for (int g = 0; g < L; g++) sxg[(size_t)r * L + g] = sx[r];
    Dev<float> d_sw(sw), d_sx(sx), d_swg(swg), d_sxg(sxg);
    std::vector<float> blk((size_t)OB * L, 1.f / 448.f);
    Dev<float> d_blk(pack_blk(blk, out, L)), d_wvec((size_t)L * out), d_xvec((size_t)L * maxrows), one_s(1);
    const float onef = 1.f;
    CK(cudaMemcpy(one_s.p, &onef, 4, cudaMemcpyHostToDevice));
    std::vector<float> fill((size_t)L * std::max(maxrows, out), 1.f / 448.f);
    CK(cudaMemcpy(d_xvec.p, fill.data(), (size_t)L * maxrows * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_wvec.p, fill.data(), (size_t)L * out * 4, cudaMemcpyHostToDevice));
    Dev<float> d((size_t)maxrows * out);
    Dev<__nv_bfloat16> wb((size_t)out * K), xb((size_t)maxrows * K);
    for (int rows : kSpeedRows) {
      std::string line;
      // bf16 baseline.
      {
        Desc q{out, rows, K, CUBLAS_OP_T, CUBLAS_OP_N, kScalar, kScalar, CUDA_R_16BF};
        Lt l;
        cublasStatus_t st = build(l, q, nullptr, nullptr, CUDA_R_16BF);
        cublasLtMatmulHeuristicResult_t res[8];
        int n = st == CUBLAS_STATUS_SUCCESS ? heuristic(h, l, res, 8, &st) : 0;
        int pick = -1;
        const float best = fastest(l, res, n, wb.p, xb.p, d.p, &pick);
        char buf[64];
        std::snprintf(buf, sizeof buf, " bf16 %.0f/%.0f", best, best > 0 ? 2.0 * rows * out * (double)K / (best * 1e6) : 0.0);
        line += buf;
        if (t) std::fprintf(t, "bf16\t%d\t%d\t%d\t%s\t%.1f\t%.1f\t-1\n", K, out, rows, n ? "ok" : "none", best,
                            best > 0 ? 2.0 * rows * out * (double)K / (best * 1e6) : 0.0);
      }
      for (const SpeedCombo& c : kSpeed) {
        const void* sa = c.ma == kOuter ? (const void*)d_sw.p : c.ma == kBlk ? (const void*)d_blk.p : c.ma == kVec ? (const void*)d_wvec.p : one_s.p;
        const void* sb = c.mb == kOuter ? (const void*)d_sx.p : c.mb == kVec ? (const void*)d_xvec.p : one_s.p;
        Desc q{out, rows, K, CUBLAS_OP_T, CUBLAS_OP_N, c.ma, c.mb, c.dt, c.fast};
        Lt l;
        cublasStatus_t st = build(l, q, sa, sb);
        cublasLtMatmulHeuristicResult_t res[8];
        int n = st == CUBLAS_STATUS_SUCCESS ? heuristic(h, l, res, 8, &st) : 0;
        int besta = -1;
        const float best = fastest(l, res, n, w.p, x.p, d.p, &besta);
        double rel = -1;
        if (besta >= 0 && c.ma == kOuter) {
          const float one = 1.f, zero = 0.f;
          LK(cublasLtMatmul(h, l.op, &one, w.p, l.a, x.p, l.b, &zero, d.p, l.d, d.p, l.d, &res[besta].algo, ws, kWs, stream));
          const int S = 16;
          std::vector<int> rs;
          for (int i = 0; i < S; i++) rs.push_back((int)((long)i * (rows - 1) / (S - 1)));
          Dev<int> d_rs(rs);
          Dev<float> ref((size_t)S * out), got((size_t)S * out);
          const size_t warps = (size_t)S * out;
          reference<<<(unsigned)((warps * 32 + 255) / 256), 256, 0, stream>>>(x.p, d_sxg.p, w.p, d_swg.p, d_rs.p, S, K, out, ref.p);
          if (c.dt == CUDA_R_16F) {
            // Widen fp16 D through gather's bf16 path is wrong: read it on the host instead.
            std::vector<__half> hd((size_t)rows * out);
            CK(cudaMemcpyAsync(hd.data(), d.p, hd.size() * 2, cudaMemcpyDeviceToHost, stream));
            CK(cudaStreamSynchronize(stream));
            std::vector<float> hr(warps);
            CK(cudaMemcpy(hr.data(), ref.p, warps * 4, cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            for (int i = 0; i < S; i++)
              for (int o = 0; o < out; o++) {
                const double g = __half2float(hd[(size_t)rs[i] * out + o]), r = hr[(size_t)i * out + o];
                num += (g - r) * (g - r), den += r * r;
              }
            rel = std::sqrt(num / std::max(den, 1e-30));
          } else {
            gather<<<256, 256, 0, stream>>>(d.p, c.dt == CUDA_R_16BF, false, d_rs.p, S, rows, out, got.p);
            std::vector<float> hr(warps), hg(warps);
            CK(cudaStreamSynchronize(stream));
            CK(cudaMemcpy(hr.data(), ref.p, warps * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hg.data(), got.p, warps * 4, cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            for (size_t i = 0; i < warps; i++) num += ((double)hg[i] - hr[i]) * ((double)hg[i] - hr[i]), den += (double)hr[i] * hr[i];
            rel = std::sqrt(num / std::max(den, 1e-30));
          }
        }
        const double tf = best > 0 ? 2.0 * rows * out * (double)K / (best * 1e6) : 0.0;
        char buf[96];
        if (best > 0)
          std::snprintf(buf, sizeof buf, " | %s %.0f/%.0f%s", c.name, best, tf, rel >= 0 ? (rel < 1e-2 ? "" : " WRONG") : "");
        else
          std::snprintf(buf, sizeof buf, " | %s %s", c.name, st != CUBLAS_STATUS_SUCCESS ? stname(st) : "none");
        line += buf;
        if (t) std::fprintf(t, "%s\t%d\t%d\t%d\t%s\t%.1f\t%.1f\t%.3g\n", c.name, K, out, rows, best > 0 ? "ok" : "none", best, tf, rel);
      }
      std::printf("%5d->%-5d rows %d (us/TFLOPs):%s\n", K, out, rows, line.c_str());
      std::fflush(stdout);
    }
  }
  if (t) std::fclose(t);
}

int main(int argc, char** argv) {
  const std::string outdir = argc > 1 ? argv[1] : ".";
  const bool speed_only = argc > 2 && std::string(argv[2]) == "--speed";
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  int drv = 0, rt = 0;
  CK(cudaDriverGetVersion(&drv));
  CK(cudaRuntimeGetVersion(&rt));
  std::printf("device %s sm_%d%d, driver %d, runtime %d, cuBLASLt %zu (headers %d)\n", prop.name, prop.major, prop.minor,
              drv, rt, cublasLtGetVersion(), CUBLAS_VERSION);
  cublasLtHandle_t h;
  LK(cublasLtCreate(&h));
  void* ws = nullptr;
  CK(cudaMalloc(&ws, kWs));
  // Stand-in scale tensors for the heuristic: big enough for any mode of any shape here.
  Dev<float> dummy((size_t)4 << 20);
  CK(cudaMemset(dummy.p, 0, dummy.n * sizeof(float)));
  if (speed_only) {
    speed(h, ws, outdir);
    return 0;
  }

  // ---- part 1: the heuristic ----
  FILE* th = std::fopen((outdir + "/fp8probe-heuristic.tsv").c_str(), "w");
  if (th) std::fprintf(th, "assign\tta\ttb\tma\tmb\tD\tptrs\tK\tout\trows\tstatus\talgos\n");
  const cublasOperation_t ops[2] = {CUBLAS_OP_N, CUBLAS_OP_T};
  const std::pair<int, int> modes[] = {{kVec, kVec}, {kVec, kBlk}, {kBlk, kVec}, {kBlk, kBlk}, {kScalar, kScalar}, {kOuter, kOuter}};
  const cudaDataType_t dts[2] = {CUDA_R_32F, CUDA_R_16BF};
  const int total = (int)(sizeof kShapes / sizeof kShapes[0]) * (int)(sizeof kRows / sizeof kRows[0]);
  std::map<std::string, int> none;  // combinations without any algorithm, by status seen
  std::map<std::string, std::string> seen;  // combination → "ok/total; first refusal"
  std::printf("\n== part 1: cublasLtMatmulAlgoGetHeuristic over %d shapes x rows (combinations with any algorithm) ==\n", total);
  for (int xa = 0; xa < 2; xa++)
    for (auto ta : ops)
      for (auto tb : ops)
        for (const auto& mm : modes)
          for (auto dt : dts)
            for (int ptrs = 0; ptrs < 2; ptrs++) {
              int ok = 0, algos_min = 1 << 30;
              std::map<std::string, int> refused;
              std::string first;
              for (const Shape& sh : kShapes)
                for (int rows : kRows) {
                  Desc q{xa ? rows : sh.N, xa ? sh.N : rows, sh.K, ta, tb, mm.first, mm.second, dt};
                  Lt l;
                  cublasStatus_t st = build(l, q, ptrs ? dummy.p : nullptr, ptrs ? dummy.p : nullptr);
                  int n = 0;
                  cublasLtMatmulHeuristicResult_t res[8];
                  if (st == CUBLAS_STATUS_SUCCESS) n = heuristic(h, l, res, 8, &st);
                  const std::string why = st != CUBLAS_STATUS_SUCCESS ? stname(st) : n == 0 ? "no algorithm" : "ok";
                  if (th)
                    std::fprintf(th, "%s\t%c\t%c\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\n", xa ? "x=A" : "W=A", ta == CUBLAS_OP_T ? 'T' : 'N',
                                 tb == CUBLAS_OP_T ? 'T' : 'N', modename(mm.first), modename(mm.second),
                                 dt == CUDA_R_32F ? "fp32" : "bf16", ptrs, sh.K, sh.N, rows, why.c_str(), n);
                  if (n > 0) {
                    ok++;
                    algos_min = std::min(algos_min, n);
                  } else {
                    refused[why]++;
                    if (first.empty()) first = std::to_string(rows) + "x" + std::to_string(sh.K) + "->" + std::to_string(sh.N) + " " + why;
                  }
                }
              char key[160];
              std::snprintf(key, sizeof key, "%s %c%c A:%-6s B:%-6s %s ptrs=%d", xa ? "x=A" : "W=A", ta == CUBLAS_OP_T ? 'T' : 'N',
                            tb == CUBLAS_OP_T ? 'T' : 'N', modename(mm.first), modename(mm.second),
                            dt == CUDA_R_32F ? "fp32" : "bf16", ptrs);
              seen[key] = std::to_string(ok) + "/" + std::to_string(total) + " shapes" + (first.empty() ? "" : "; first refused: " + first);
              if (ok == 0) {
                none[refused.begin()->first]++;
                continue;
              }
              std::printf("%s: %d/%d shapes (>= %d algos)%s%s\n", key, ok, total, algos_min, ok < total ? "; first refused: " : "",
                          ok < total ? first.c_str() : "");
            }
  for (const auto& kv : none) std::printf("combinations with no algorithm for any shape, status %s: %d\n", kv.first.c_str(), kv.second);
  // FAST_ACCUM on gollm's combination.
  {
    int ok = 0;
    for (const Shape& sh : kShapes)
      for (int rows : kRows) {
        Desc q{sh.N, rows, sh.K, CUBLAS_OP_T, CUBLAS_OP_N, kBlk, kVec, CUDA_R_32F, true};
        Lt l;
        cublasStatus_t st = build(l, q, dummy.p, dummy.p);
        cublasLtMatmulHeuristicResult_t res[1];
        if (st == CUBLAS_STATUS_SUCCESS && heuristic(h, l, res, 1, &st) > 0) ok++;
      }
    std::printf("W=A TN A:BLK128 B:VEC128 fp32 ptrs=1 FAST_ACCUM=1: %d/%d shapes\n", ok, total);
  }
  if (th) std::fclose(th);

  // ---- part 2: the GEMMs, checked and timed ----
  std::printf("\n== part 2: TN GEMMs against a dequantized fp32 reference (rel L2 on sampled rows; us = median of 20) ==\n");
  FILE* tg = std::fopen((outdir + "/fp8probe-gemm.tsv").c_str(), "w");
  if (tg) std::fprintf(tg, "combo\tK\tout\trows\tstatus\talgos\trel_l2\tus\ttflops\tbf16_us\n");
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  const int maxrows = kRows[sizeof kRows / sizeof kRows[0] - 1];
  std::map<std::string, std::pair<int, double>> verdict;  // combo → (shapes passing, worst rel L2)
  std::map<std::string, int> tried;
  auto timeit = [&](auto&& f) { return median_us(stream, e0, e1, 20, f); };
  for (const Shape& sh : kShapes) {
    const int K = sh.K, out = sh.N, L = cdiv(K, 128), OB = cdiv(out, 128);
    Dev<__nv_fp8_storage_t> w((size_t)out * K), x((size_t)maxrows * K);
    fill_fp8<<<1024, 256>>>(w.p, w.n, 11u + K + out);
    fill_fp8<<<1024, 256>>>(x.p, x.n, 23u + K);
    CK(cudaGetLastError());
    // Logical scales: x per (row, group); W per (128-row block, group), and per (row, group)
    // for the VEC128 weight.
    std::vector<float> sx((size_t)maxrows * L), sblk((size_t)OB * L), swrow_blk((size_t)out * L), swrow((size_t)out * L);
    for (size_t i = 0; i < sx.size(); i++) sx[i] = rscale(1, i);
    for (size_t i = 0; i < sblk.size(); i++) sblk[i] = rscale(2, i);
    for (int o = 0; o < out; o++)
      for (int g = 0; g < L; g++) {
        swrow_blk[(size_t)o * L + g] = sblk[(size_t)(o / 128) * L + g];
        swrow[(size_t)o * L + g] = rscale(3, (size_t)o * L + g);
      }
    Dev<float> d_swrow_blk(swrow_blk), d_swrow(swrow), d_sx(sx);
    Dev<float> d_wblk(pack_blk(sblk, out, L)), d_wvec(pack_vec(swrow, out, L));
    Dev<float> d((size_t)maxrows * out);  // D, fp32 or bf16
    // bf16 baseline operands (the same dequantized values).
    Dev<__nv_bfloat16> wb((size_t)out * K), xb((size_t)maxrows * K);
    to_bf16<<<1024, 256>>>(w.p, d_swrow_blk.p, wb.p, out, K);
    to_bf16<<<1024, 256>>>(x.p, d_sx.p, xb.p, maxrows, K);
    CK(cudaGetLastError());
    std::string line[sizeof kCombos / sizeof kCombos[0]], base;
    for (int rows : kRows) {
      // Sampled rows: up to 16, spread, the last included.
      std::vector<int> rs;
      const int S = std::min(rows, 16);
      for (int i = 0; i < S; i++) rs.push_back((int)((long)i * (rows - 1) / std::max(S - 1, 1)));
      Dev<int> d_rs(rs);
      // x's VEC128 scales for this row count ([L][rows]).
      std::vector<float> sxr(sx.begin(), sx.begin() + (size_t)rows * L);
      Dev<float> d_xvec(pack_vec(sxr, rows, L));
      Dev<float> ref_blk((size_t)S * out), ref_row((size_t)S * out), got((size_t)S * out);
      const size_t warps = (size_t)S * out;
      reference<<<(unsigned)((warps * 32 + 255) / 256), 256>>>(x.p, d_sx.p, w.p, d_swrow_blk.p, d_rs.p, S, K, out, ref_blk.p);
      reference<<<(unsigned)((warps * 32 + 255) / 256), 256>>>(x.p, d_sx.p, w.p, d_swrow.p, d_rs.p, S, K, out, ref_row.p);
      CK(cudaGetLastError());
      std::vector<float> hb(warps), hr(warps), hg(warps);
      CK(cudaMemcpy(hb.data(), ref_blk.p, warps * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hr.data(), ref_row.p, warps * 4, cudaMemcpyDeviceToHost));
      // bf16 baseline: W=A TN, D fp32.
      float bf16_us = -1;
      {
        Desc q{out, rows, K, CUBLAS_OP_T, CUBLAS_OP_N, kScalar, kScalar, CUDA_R_32F};
        Lt l;
        cublasStatus_t st = build(l, q, nullptr, nullptr, CUDA_R_16BF);
        cublasLtMatmulHeuristicResult_t res[1];
        if (st == CUBLAS_STATUS_SUCCESS && heuristic(h, l, res, 1, &st) > 0) {
          const float one = 1.f, zero = 0.f;
          bf16_us = timeit([&] {
            LK(cublasLtMatmul(h, l.op, &one, wb.p, l.a, xb.p, l.b, &zero, d.p, l.d, d.p, l.d, &res[0].algo, ws, kWs, stream));
          });
        }
      }
      for (size_t c = 0; c < sizeof kCombos / sizeof kCombos[0]; c++) {
        const Combo& cb = kCombos[c];
        const bool wvec = cb.xa ? cb.mb == kVec : cb.ma == kVec;
        const float* wscale = wvec ? d_wvec.p : d_wblk.p;
        const float* sa = cb.xa ? d_xvec.p : wscale;
        const float* sb = cb.xa ? wscale : d_xvec.p;
        Desc q{cb.xa ? rows : out, cb.xa ? out : rows, K, CUBLAS_OP_T, CUBLAS_OP_N, cb.ma, cb.mb, cb.dt};
        Lt l;
        cublasStatus_t st = build(l, q, sa, sb);
        cublasLtMatmulHeuristicResult_t res[8];
        int n = 0;
        if (st == CUBLAS_STATUS_SUCCESS) n = heuristic(h, l, res, 8, &st);
        tried[cb.name]++;
        double rel = -1;
        float us = -1;
        std::string status = st != CUBLAS_STATUS_SUCCESS ? stname(st) : n == 0 ? "no algorithm" : "ok";
        if (n > 0) {
          const float one = 1.f, zero = 0.f;
          const void* A = cb.xa ? (const void*)x.p : (const void*)w.p;
          const void* B = cb.xa ? (const void*)w.p : (const void*)x.p;
          int used = -1;
          for (int a = 0; a < n && used < 0; a++) {
            st = cublasLtMatmul(h, l.op, &one, A, l.a, B, l.b, &zero, d.p, l.d, d.p, l.d, &res[a].algo, ws, kWs, stream);
            if (st == CUBLAS_STATUS_SUCCESS) used = a;
          }
          CK(cudaStreamSynchronize(stream));
          if (used < 0) {
            status = std::string("matmul ") + stname(st);
          } else {
            gather<<<256, 256, 0, stream>>>(d.p, cb.dt == CUDA_R_16BF, cb.xa, d_rs.p, S, rows, out, got.p);
            CK(cudaGetLastError());
            CK(cudaMemcpyAsync(hg.data(), got.p, warps * 4, cudaMemcpyDeviceToHost, stream));
            CK(cudaStreamSynchronize(stream));
            const std::vector<float>& ref = wvec ? hr : hb;
            double num = 0, den = 0;
            bool finite = true;
            for (size_t i = 0; i < warps; i++) {
              finite = finite && std::isfinite(hg[i]);
              num += ((double)hg[i] - ref[i]) * ((double)hg[i] - ref[i]);
              den += (double)ref[i] * ref[i];
            }
            rel = finite ? std::sqrt(num / std::max(den, 1e-30)) : INFINITY;
            us = timeit([&] {
              LK(cublasLtMatmul(h, l.op, &one, A, l.a, B, l.b, &zero, d.p, l.d, d.p, l.d, &res[used].algo, ws, kWs, stream));
            });
            const double tol = cb.dt == CUDA_R_16BF ? 1e-2 : 1e-3;
            auto& v = verdict[cb.name];
            if (rel <= tol) v.first++;
            v.second = std::max(v.second, rel);
            status = rel <= tol ? "ok" : "WRONG";
          }
        }
        char buf[96];
        if (rel >= 0)
          std::snprintf(buf, sizeof buf, " %d:%s%.0e/%.0f", rows, status == "ok" ? "" : "WRONG ", rel, us);
        else
          std::snprintf(buf, sizeof buf, " %d:%s", rows, status.c_str());
        line[c] += buf;
        if (tg)
          std::fprintf(tg, "%s\t%d\t%d\t%d\t%s\t%d\t%.3g\t%.1f\t%.1f\t%.1f\n", cb.name, K, out, rows, status.c_str(), n, rel, us,
                       us > 0 ? 2.0 * rows * out * (double)K / (us * 1e6) : 0.0, bf16_us);
      }
      char buf[48];
      std::snprintf(buf, sizeof buf, " %d:%.0f", rows, bf16_us);
      base += buf;
    }
    std::printf("%5d->%-5d bf16 cuBLASLt (rows:us):%s\n", K, out, base.c_str());
    for (size_t c = 0; c < sizeof kCombos / sizeof kCombos[0]; c++)
      std::printf("%5d->%-5d %s (rows:relL2/us):%s\n", K, out, kCombos[c].name, line[c].c_str());
  }
  if (tg) std::fclose(tg);

  std::printf("\n== verdict (rel L2 within 1e-3 for fp32 D, 1e-2 for bf16 D) ==\n");
  for (const char* k : {"W=A TN A:BLK128 B:VEC128 fp32 ptrs=0", "W=A TN A:BLK128 B:VEC128 fp32 ptrs=1",
                        "W=A TN A:BLK128 B:VEC128 bf16 ptrs=0", "W=A TN A:BLK128 B:VEC128 bf16 ptrs=1"})
    std::printf("heuristic, %s: %s\n", k, seen[k].c_str());
  for (const Combo& cb : kCombos) {
    const auto v = verdict[cb.name];
    std::printf("%-22s (%s): %d/%d shapes x rows correct, worst rel L2 %.2g\n", cb.name, cb.note, v.first, tried[cb.name],
                v.second);
  }
  cudaFree(ws);
  cublasLtDestroy(h);
  return 0;
}

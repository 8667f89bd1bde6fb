// gemmbench — the projections' GEMMs at decode batch sizes (issue 18): cuBLAS's
// cublasGemmEx as the engine calls it (matmul.cuh: T inputs, fp32 output) against every
// algorithm cuBLASLt's heuristic offers for the same shape, with fp32 output and with
// output in T. Each figure is one GEMM's time inside a CUDA graph of back-to-back calls
// (no launch gaps), one call on each of enough copies of the weights that they come from
// memory, not L2 — as in a step, where each layer's weights are read once.
//
//   nvcc -std=c++17 -O2 -arch=sm_90 -I../../cuda -o gemmbench gemmbench.cu -lcublasLt -lcublas
//   ./gemmbench [rows...]      (default 16 32 64 128)
//
// Also the engine's own tiled tensor-core kernel (cuda/tiled.cuh, fp32 output: GEMV_OUT_F32)
// at 1, 2 and 3 blocks a multiprocessor (GOLLM_CUDA_TILE_BLOCKS).
//
// One JSON object a line: shape, rows, variant (gemmex, lt_first, lt_best, lt_first_t,
// lt_best_t, tiledN), us, tbps (weight bytes / time), and for lt_best the index of the
// algorithm in the heuristic's list.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tiled.cuh"

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)
#define BK(x)                                                                        \
  do {                                                                               \
    cublasStatus_t s_ = (x);                                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
      std::fprintf(stderr, "%s:%d: cublas status %d\n", __FILE__, __LINE__, (int)s_); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

struct Shape {
  const char* name;
  int in, out;
};

// The projections of the benchmark models (bench/gpu_peers.py's shapes).
const Shape kShapes[] = {
    {"gpt2_qkv", 768, 2304},         {"gpt2_out", 768, 768},
    {"gpt2_up", 768, 3072},          {"gpt2_down", 3072, 768},
    {"gpt350_qkv", 1024, 3072},      {"gpt350_up", 1024, 4096},
    {"gpt350_down", 4096, 1024},     {"tinyllama_qkv", 2048, 2560},
    {"tinyllama_out", 2048, 2048},   {"tinyllama_gateup", 2048, 11264},
    {"tinyllama_down", 5632, 2048},
};

constexpr int kReplays = 20;    // graph replays timed

// fill_random fills n halves at p with values in [-1, 1) from a fixed seed: BENCH.md's
// "never time on zeros" (tensor cores draw less power, and may clock higher, on zeros).
void fill_random(__half* p, size_t n, unsigned seed) {
  std::vector<__half> h(n);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    h[i] = __float2half((float)(seed >> 8) / (float)(1u << 23) - 1.f);
  }
  CK(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
}
constexpr size_t kWs = 32u << 20;

// time_graph captures calls calls of f(i) and returns the median replay's µs per call.
template <typename F>
float time_graph(cudaStream_t st, int calls, F f) {
  cudaGraph_t g;
  cudaGraphExec_t ex;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; i++) f(i);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ex, g, 0));
  CK(cudaGraphLaunch(ex, st));
  CK(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ts;
  for (int r = 0; r < kReplays; r++) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ex, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1e3f / calls);
  }
  std::sort(ts.begin(), ts.end());
  CK(cudaGraphExecDestroy(ex));
  CK(cudaGraphDestroy(g));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ts[ts.size() / 2];
}

int main(int argc, char** argv) {
  std::vector<int> rows;
  for (int i = 1; i < argc; i++) rows.push_back(std::atoi(argv[i]));
  if (rows.empty()) rows = {16, 32, 64, 128};
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  gollm::tiled_allow_smem<__half>(0);
  cublasHandle_t blas;
  BK(cublasCreate(&blas));
  BK(cublasSetStream(blas, st));
  cublasLtHandle_t lt;
  BK(cublasLtCreate(&lt));
  void* ws;
  CK(cudaMalloc(&ws, kWs));
  BK(cublasSetWorkspace(blas, ws, kWs));
  for (const Shape& s : kShapes) {
    const size_t wbytes = (size_t)s.in * s.out * 2;
    // Copies of the weights, at least 160 MB in all, each called once a graph: L2 (50 MB)
    // holds none of them when its turn comes.
    const int copies = (int)std::max<size_t>(2, (160u << 20) / wbytes + 1);
    std::vector<__half*> w(copies);
    for (int i = 0; i < copies; i++) {
      CK(cudaMalloc(&w[i], wbytes));
      fill_random(w[i], wbytes / 2, 7u + i);
    }
    for (int M : rows) {
      __half* x;
      float* y;
      __half* yt;
      CK(cudaMalloc(&x, (size_t)M * s.in * 2));
      fill_random(x, (size_t)M * s.in, 1u);
      CK(cudaMalloc(&y, (size_t)M * s.out * 4));
      CK(cudaMalloc(&yt, (size_t)M * s.out * 2));
      auto emit = [&](const char* variant, float us, int algo) {
        std::printf("{\"shape\":\"%s\",\"rows\":%d,\"variant\":\"%s\",\"us\":%.2f,\"tbps\":%.2f", s.name,
                    M, variant, us, wbytes / (us * 1e-6) / 1e12);
        if (algo >= 0) std::printf(",\"algo\":%d", algo);
        std::printf("}\n");
      };
      const float one = 1.f, zero = 0.f;
      float us = time_graph(st, copies, [&](int i) {
        BK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.out, M, s.in, &one, w[i % copies],
                        CUDA_R_16F, s.in, x, CUDA_R_16F, s.in, &zero, y, CUDA_R_32F, s.out,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      emit("gemmex", us, -1);
      for (int outT = 0; outT < 2; outT++) {
        const cudaDataType_t ct = outT ? CUDA_R_16F : CUDA_R_32F;
        void* out = outT ? (void*)yt : (void*)y;
        cublasLtMatmulDesc_t op;
        BK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        BK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        BK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        cublasLtMatrixLayout_t A, B, C;
        BK(cublasLtMatrixLayoutCreate(&A, CUDA_R_16F, s.in, s.out, s.in));
        BK(cublasLtMatrixLayoutCreate(&B, CUDA_R_16F, s.in, M, s.in));
        BK(cublasLtMatrixLayoutCreate(&C, ct, s.out, M, s.out));
        cublasLtMatmulPreference_t pref;
        BK(cublasLtMatmulPreferenceCreate(&pref));
        size_t wsz = kWs;
        BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz,
                                                sizeof wsz));
        cublasLtMatmulHeuristicResult_t res[32];
        int n = 0;
        BK(cublasLtMatmulAlgoGetHeuristic(lt, op, A, B, C, C, pref, 32, res, &n));
        float best = 1e30f, first = 0.f;
        int besti = -1;
        for (int k = 0; k < n; k++) {
          if (res[k].state != CUBLAS_STATUS_SUCCESS) continue;
          bool ok = true;
          float t = time_graph(st, copies, [&](int i) {
            cublasStatus_t r = cublasLtMatmul(lt, op, &one, w[i % copies], A, x, B, &zero, out, C,
                                              out, C, &res[k].algo, ws, kWs, st);
            if (r != CUBLAS_STATUS_SUCCESS) ok = false;
          });
          if (!ok) continue;
          if (k == 0) first = t;
          if (t < best) best = t, besti = k;
        }
        // Only what ran: the heuristic's first algorithm, and the best of those that did.
        if (first > 0.f) emit(outT ? "lt_first_t" : "lt_first", first, 0);
        if (besti >= 0) emit(outT ? "lt_best_t" : "lt_best", best, besti);
        BK(cublasLtMatmulPreferenceDestroy(pref));
        BK(cublasLtMatrixLayoutDestroy(A));
        BK(cublasLtMatrixLayoutDestroy(B));
        BK(cublasLtMatrixLayoutDestroy(C));
        BK(cublasLtMatmulDescDestroy(op));
      }
      // The tiled kernel: its splits' sums and per-tile tickets as engine.cu sizes them.
      for (int tb = 1; tb <= 3; tb++) {
        if (M > gollm::kTileMaxRows || !gollm::tiled_fits(M, s.in)) break;
        const gollm::TileShape sh = gollm::tile_shape(s.out, s.in, tb * sms);
        float* part = nullptr;
        int* tickets = nullptr;
        CK(cudaMalloc(&part, std::max<size_t>(4, gollm::tile_part_floats(sh) * 4)));
        CK(cudaMalloc(&tickets, (size_t)sh.tiles * 4));
        CK(cudaMemset(tickets, 0, (size_t)sh.tiles * 4));
        gollm::GemvArgs a{};
        a.n = M, a.in = s.in, a.out = s.out, a.x = x, a.y = y;
        float t = time_graph(st, copies, [&](int i) {
          a.w = w[i % copies];
          gollm::tiled_proj<__half, gollm::GEMV_OUT_F32>(a, tb * sms, part, tickets, gollm::Stream(st, false));
        });
        char name[16];
        std::snprintf(name, sizeof name, "tiled%d", tb);
        emit(name, t, -1);
        CK(cudaFree(part));
        CK(cudaFree(tickets));
      }
      CK(cudaFree(x));
      CK(cudaFree(y));
      CK(cudaFree(yt));
    }
    for (auto p : w) CK(cudaFree(p));
  }
  return 0;
}

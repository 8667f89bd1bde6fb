// blaslt.h — the Blas path's projections through cuBLASLt, an algorithm chosen per shape.
//
// A shape (element type, rows, in, out, output row stride, the operands' alignment) gets
// its algorithm once: where the engine is tuning (its warm-up, outside stream capture),
// cuBLASLt's heuristic offers up to kLtCandidates algorithms and each, with
// cublasGemmEx's default beside them, is timed a few times on the real operands; the
// fastest is kept. The choice is the process's for that device and shape, so that
// engines of one process (the models of a server, the ranks of one GPU) compute a shape
// alike and tune it once. Shapes met outside tuning, or once the tuning budget is spent,
// take the heuristic's first algorithm without timing (host work only, so capture may meet
// them). Every run uses the engine's one workspace, a fixed pointer inside graphs too.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <map>
#include <memory>
#include <vector>

namespace gollm {

// kLtCandidates is how many of cuBLASLt's heuristic algorithms the tuning times for a
// shape of up to kLtWideRows rows (the decode buckets, where the choice matters most and
// each run is short), kLtCandidatesWide for taller ones (compute-bound, costly to time).
constexpr int kLtCandidates = 16, kLtCandidatesWide = 4, kLtWideRows = 1024;

// LtEntry is one shape's descriptors and its chosen algorithm (or cublasGemmEx).
struct LtEntry {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool gemmex = false;  // cublasGemmEx's default was the fastest (or cuBLASLt has none)
  LtEntry() = default;
  LtEntry(const LtEntry&) = delete;
  LtEntry& operator=(const LtEntry&) = delete;
  ~LtEntry();
};

// LtGemms runs an engine's projection GEMMs: y [n][ldy] fp32 = x [n][in] · w [out][in]ᵀ
// (x and w of one 2-byte type, row-major; fp32 accumulation).
class LtGemms {
 public:
  LtGemms() = default;
  LtGemms(const LtGemms&) = delete;
  LtGemms& operator=(const LtGemms&) = delete;
  ~LtGemms();
  // init binds the handles to stream st and the workspace ws (ws_bytes, 256-byte aligned);
  // off: every GEMM through cublasGemmEx's default algorithm, as before cuBLASLt.
  void init(int device, cublasHandle_t blas, cudaStream_t st, void* ws, size_t ws_bytes, bool off);
  // xwt runs one GEMM (type: CUDA_R_16F or CUDA_R_16BF; ldy 0: out).
  void xwt(cudaDataType_t type, const void* x, const void* w, float* y, int n, int in, int out,
           int ldy = 0);

  bool tune = false;             // time the candidates of shapes met while set (warm-up)
  // tune_w, where set, holds weights of the next GEMM's shape (every layer's), which the
  // timed runs take in turn: a step reads each layer's from memory, not from L2.
  std::vector<const void*> tune_w;
  float tune_budget_ms = 4000;   // tuning's wall time at most; later shapes untimed
  int tuned = 0;                 // shapes this engine timed
  float tune_ms = 0;             // the wall time it spent timing them
  bool off = false;

 private:
  using Key = std::array<int, 7>;  // device, type, n, in, out, ldy, alignment
  const LtEntry& entry(const Key& k, const void* x, const void* w, float* y);
  void choose(LtEntry& en, const Key& k, const void* x, const void* w, float* y);
  cublasStatus_t run(const LtEntry& en, const Key& k, const void* x, const void* w, float* y,
                     bool gemmex, const cublasLtMatmulAlgo_t* algo);

  int device_ = 0;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t st_ = nullptr;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  cudaEvent_t ev_[2] = {nullptr, nullptr};
  std::map<Key, std::unique_ptr<LtEntry>> entries_;
};

}  // namespace gollm

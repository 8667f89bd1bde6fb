// blaslt.cu — LtGemms (blaslt.h): the Blas path's GEMMs on cuBLASLt, timed per shape.
#include <chrono>
#include <mutex>

#include "blaslt.h"
#include "common.cuh"

namespace gollm {

namespace {

// Choice is a shape's algorithm, kept for the process (blaslt.h says why).
struct Choice {
  bool gemmex = false;
  cublasLtMatmulAlgo_t algo{};
};

std::mutex choices_mu;
std::map<std::array<int, 7>, Choice>& choices() {
  static auto* m = new std::map<std::array<int, 7>, Choice>;  // never destroyed: used at exit
  return *m;
}

// Pref is a matmul preference, destroyed with its scope.
struct Pref {
  cublasLtMatmulPreference_t p = nullptr;
  ~Pref() {
    if (p) cublasLtMatmulPreferenceDestroy(p);
  }
};

}  // namespace

LtEntry::~LtEntry() {
  if (op) cublasLtMatmulDescDestroy(op);
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (c) cublasLtMatrixLayoutDestroy(c);
}

LtGemms::~LtGemms() {
  entries_.clear();
  for (cudaEvent_t& e : ev_)
    if (e) cudaEventDestroy(e);
  if (lt_) cublasLtDestroy(lt_);
}

void LtGemms::init(int device, cublasHandle_t blas, cudaStream_t st, void* ws, size_t ws_bytes,
                   bool off_) {
  device_ = device, blas_ = blas, st_ = st, ws_ = ws, ws_bytes_ = ws_bytes, off = off_;
  if (off) return;
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  for (cudaEvent_t& e : ev_) CUDA_CHECK(cudaEventCreate(&e));
}

cublasStatus_t LtGemms::run(const LtEntry& en, const Key& k, const void* x, const void* w,
                            float* y, bool gemmex, const cublasLtMatmulAlgo_t* algo) {
  const float one = 1.f, zero = 0.f;
  const int n = k[2], in = k[3], out = k[4], ldy = k[5];
  const cudaDataType_t t = (cudaDataType_t)k[1];
  if (gemmex)
    return cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, t, in, x, t, in,
                        &zero, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return cublasLtMatmul(lt_, en.op, &one, w, en.a, x, en.b, &zero, y, en.c, y, en.c, algo, ws_,
                        ws_bytes_, st_);
}

void LtGemms::choose(LtEntry& en, const Key& k, const void* x, const void* w, float* y) {
  {
    std::lock_guard<std::mutex> g(choices_mu);
    auto it = choices().find(k);
    if (it != choices().end()) {
      en.gemmex = it->second.gemmex, en.algo = it->second.algo;
      return;
    }
  }
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(st_, &cap));
  const bool timing = tune && cap == cudaStreamCaptureStatusNone && tune_ms < tune_budget_ms;
  Pref pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
  const uint64_t wsb = ws_bytes_;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &wsb, sizeof wsb));
  const uint32_t align = (uint32_t)k[6];
  for (auto a : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                 CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, a, &align, sizeof align));
  cublasLtMatmulHeuristicResult_t res[kLtCandidates] = {};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt_, en.op, en.a, en.b, en.c, en.c, pref.p,
                                                           !timing ? 1 : k[2] <= kLtWideRows ? kLtCandidates : kLtCandidatesWide,
                                                           res, &found);
  // NOT_SUPPORTED: cuBLASLt has no algorithm for the shape; cublasGemmEx runs it.
  if (hs != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(hs);
  int ok = 0;
  for (int i = 0; i < found; i++)
    if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= ws_bytes_) res[ok++] = res[i];
  en.gemmex = ok == 0;
  if (ok > 0) en.algo = res[0].algo;
  if (!timing) return;  // untimed: not kept for the process, a later warm-up times it

  const auto t0 = std::chrono::steady_clock::now();
  // time returns one run's mean milliseconds for candidate i (-1: cublasGemmEx), or a
  // negative value where it fails to launch.
  size_t turn = 0;
  auto next_w = [&]() { return tune_w.empty() ? w : tune_w[turn++ % tune_w.size()]; };
  auto time = [&](int i) -> float {
    const bool gx = i < 0;
    const cublasLtMatmulAlgo_t* al = gx ? nullptr : &res[i].algo;
    if (run(en, k, x, w, y, gx, al) != CUBLAS_STATUS_SUCCESS) return -1.f;  // untimed first run
    CUDA_CHECK(cudaEventRecord(ev_[0], st_));
    if (run(en, k, x, next_w(), y, gx, al) != CUBLAS_STATUS_SUCCESS) return -1.f;
    CUDA_CHECK(cudaEventRecord(ev_[1], st_));
    CUDA_CHECK(cudaEventSynchronize(ev_[1]));
    float one = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&one, ev_[0], ev_[1]));
    // About half a millisecond of repetitions, 2 to 10.
    const int reps = std::max(2, std::min(10, (int)(0.5f / std::max(one, 1e-3f))));
    CUDA_CHECK(cudaEventRecord(ev_[0], st_));
    for (int r = 0; r < reps; r++)
      if (run(en, k, x, next_w(), y, gx, al) != CUBLAS_STATUS_SUCCESS) return -1.f;
    CUDA_CHECK(cudaEventRecord(ev_[1], st_));
    CUDA_CHECK(cudaEventSynchronize(ev_[1]));
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev_[0], ev_[1]));
    return ms / reps;
  };
  float best = time(-1);
  if (best < 0) {
    CUBLAS_CHECK(run(en, k, x, w, y, true, nullptr));  // its failure, reported
    best = 3.4e38f;
  }
  en.gemmex = true;
  for (int i = 0; i < ok; i++) {
    const float ms = time(i);
    if (ms >= 0 && ms < best) best = ms, en.gemmex = false, en.algo = res[i].algo;
  }
  tuned++;
  tune_ms += std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> g(choices_mu);
  choices()[k] = Choice{en.gemmex, en.algo};
}

const LtEntry& LtGemms::entry(const Key& k, const void* x, const void* w, float* y) {
  auto it = entries_.find(k);
  if (it != entries_.end()) return *it->second;
  auto en = std::make_unique<LtEntry>();
  const cudaDataType_t t = (cudaDataType_t)k[1];
  const int n = k[2], in = k[3], out = k[4], ldy = k[5];
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&en->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(en->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(en->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  // Column-major, as cuBLAS sees the row-major operands: A = w stored in × out (used
  // transposed), B = x stored in × n, C = D = y stored out × n with stride ldy.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&en->a, t, in, out, in));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&en->b, t, in, n, in));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&en->c, CUDA_R_32F, out, n, ldy));
  choose(*en, k, x, w, y);
  return *entries_.emplace(k, std::move(en)).first->second;
}

void LtGemms::xwt(cudaDataType_t type, const void* x, const void* w, float* y, int n, int in,
                  int out, int ldy) {
  if (n == 0) return;
  if (ldy <= 0) ldy = out;
  const float one = 1.f, zero = 0.f;
  if (off) {
    CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, type, in, x,
                              type, in, &zero, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    return;
  }
  // The operands' common alignment, up to 256 bytes: an algorithm chosen for aligned
  // pointers may not run on others.
  const uintptr_t bits = (uintptr_t)x | (uintptr_t)w | (uintptr_t)y | (uintptr_t)256;
  const Key k{device_, (int)type, n, in, out, ldy, (int)(bits & (~bits + 1))};
  const LtEntry& en = entry(k, x, w, y);
  CUBLAS_CHECK(run(en, k, x, w, y, en.gemmex, &en.algo));
}

}  // namespace gollm

// gollm.cu — the engine behind gollm.h: shared weights, the paged KV pool, one forward
// pass and sampling per step, CUDA graphs for decode-only steps, and the C ABI, which
// turns every error into a gollm_status.
#include <algorithm>
#include <cstdarg>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "activation.cuh"
#include "attention.cuh"
#include "common.cuh"
#include "convert.cuh"
#include "embedding.cuh"
#include "fused.cuh"
#include "gemv.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "sampling.cuh"

using namespace gollm;

namespace {

// DeviceGuard makes dev current for the calling thread for one ABI call.
struct DeviceGuard {
  explicit DeviceGuard(int dev) { CUDA_CHECK(cudaSetDevice(dev)); }
};

// DevMem is a device allocation freed with its owner.
struct DevMem {
  void* p = nullptr;
  size_t bytes = 0;
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() { reset(); }
  void alloc(size_t n, const char* what) {
    reset();
    if (n == 0) return;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      p = nullptr;
      char buf[256];
      std::snprintf(buf, sizeof buf, "allocate %zu bytes of device memory for %s: %s", n, what,
                    cudaGetErrorString(e));
      throw Error(GOLLM_ERR_OUT_OF_MEMORY, buf);
    }
    bytes = n;
  }
  void reset() {
    if (p) cudaFree(p);
    p = nullptr;
    bytes = 0;
  }
  template <typename T> T* as() const { return static_cast<T*>(p); }
};

// HostMem is a pinned host allocation, so that copies are asynchronous and capturable.
struct HostMem {
  void* p = nullptr;
  size_t bytes = 0;
  HostMem() = default;
  HostMem(const HostMem&) = delete;
  HostMem& operator=(const HostMem&) = delete;
  ~HostMem() { reset(); }
  void alloc(size_t n, const char* what) {
    reset();
    if (n == 0) return;
    cudaError_t e = cudaHostAlloc(&p, n, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      p = nullptr;
      char buf[256];
      std::snprintf(buf, sizeof buf, "allocate %zu bytes of pinned host memory for %s: %s", n,
                    what, cudaGetErrorString(e));
      throw Error(GOLLM_ERR_OUT_OF_MEMORY, buf);
    }
    bytes = n;
  }
  void reset() {
    if (p) cudaFreeHost(p);
    p = nullptr;
    bytes = 0;
  }
  template <typename T> T* as() const { return static_cast<T*>(p); }
};

size_t align_up(size_t n, size_t a = 256) { return (n + a - 1) / a * a; }

size_t dtype_size(int dtype) { return dtype == GOLLM_DTYPE_F32 ? 4 : 2; }

[[noreturn]] void invalid(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void invalid(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  throw Error(GOLLM_ERR_INVALID_ARGUMENT, buf);
}

// LayerW points at one layer's weights in the arena. Matrices are in the compute type,
// the rest fp32.
struct LayerW {
  float *ln1_w, *ln1_b;
  void* attn_w;  // [3*hidden][hidden] (transposed from the checkpoint, as every matrix here)
  float* attn_b;
  void* proj_w;  // [hidden][hidden]ᵀ
  float* proj_b;
  float *ln2_w, *ln2_b;
  void* fc_w;  // [inner][hidden]
  float* fc_b;
  void* mlp_w;  // [hidden][inner]
  float* mlp_b;
};

}  // namespace

// gollm_weights: one device arena holding every weight, shared by engines (refcounted).
struct gollm_weights {
  std::atomic<int> refs{1};   // engines and the creator
  int device = 0;             // CUDA ordinal
  int dtype = GOLLM_DTYPE_F16;  // compute type
  gollm_model_config cfg{};   // hyperparameters
  DevMem arena;               // all weights
  void* wte = nullptr;        // [vocab][hidden]
  void* wpe = nullptr;        // [max_positions][hidden]
  float* lnf_w = nullptr;     // [hidden]
  float* lnf_b = nullptr;     // [hidden]
  std::vector<LayerW> layers; // per layer
};

namespace {

// Offsets of one step's inputs in the device input buffer, in bytes. The arrays whose
// sizes depend only on the counts come first, so a graph bucket always finds them at the
// same places; block tables, penalties, masks and biases follow and are addressed by word
// offsets stored in DevSeq.
struct Layout {
  size_t row_tok, row_pos, row_seq, dec_rows, tiles, seqs, lrow_src, samp_seq, samp_row;
  size_t var;    // start of the variable part
  size_t total;  // bytes used
};

// Chunk is one pass of the LM head over at most max_logit_rows rows.
struct Chunk {
  int first, count;         // rows of the logit-row list
  int samp_first, samp_count;  // entries of the sampling list
  int ret_count;            // returned-logits rows
};

// CopyOut is a D2H copy into the logits staging buffer.
struct CopyOut {
  int chunk;        // after which chunk's LM head
  bool from_ret;    // from the returned-logits buffer, else from the logits buffer
  int row;          // first row in that buffer
  int rows;         // rows
  int64_t dst;      // float offset in the caller's logits
};

// Plan is one step, checked and laid out on the host.
struct Plan {
  int n = 0, s = 0;  // tokens and sequences (padded in graph mode)
  std::vector<int32_t> row_tok, row_pos, row_seq, dec_rows, lrow_src, samp_seq, samp_row;
  std::vector<CtxTile> tiles;
  std::vector<DevSeq> seqs;
  std::vector<int32_t> words;  // the variable part, in 4-byte words
  std::vector<Chunk> chunks;
  std::vector<CopyOut> copies;
  int max_len = 0;             // longest sequence after the step
  bool decode_only = false;    // every sequence: one token, sampled, no logits returned
  bool all_greedy = false;     // every sequence sampled by sample_greedy_kernel alone
};

}  // namespace

// gollm_engine: everything one model instance needs besides the weights.
struct gollm_engine {
  gollm_weights* w = nullptr;   // shared weights (one reference held)
  int device = 0;               // CUDA ordinal
  cudaStream_t stream = nullptr;  // all work of the engine
  cublasHandle_t blas = nullptr;  // bound to stream
  DevMem blas_ws;               // cuBLAS workspace, fixed so that capture allocates nothing
  KVGeom geom{};                // pool geometry
  int num_blocks = 0;           // usable KV blocks; block num_blocks is the padding block
  DevMem kv;                    // the pool
  int max_tokens = 0, max_seqs = 0, max_logit_rows = 0;  // step limits
  int sms = 1;                  // multiprocessors, for sizing grids
  int max_parts = 1;            // decode attention: most splits of one row
  bool graphs = true;           // replay CUDA graphs for decode-only steps
  bool pdl = false;             // programmatic dependent launch (sm_90 and later)
  bool bulk = false;            // gemv and MLP weights staged by bulk copies (sm_90 and later)
  bool fused = true;            // decode-only steps of up to kFusedRows rows: fused.cuh's MLP
  // Most rows on the gemv path (GOLLM_CUDA_GEMV_ROWS). Past 4 rows cuBLAS's padded GEMMs
  // win (H200, decode ms/token at 8 rows: GPT-2 0.65 gemv vs 0.60-0.62, GPT-350M 1.49 vs
  // 1.21-1.23); at 4 and fewer the gemv kernels do (GPT-350M 1.10 vs 1.20).
  int gemv_rows_max = kFusedRows;
  int mlp_k[3] = {};            // mlp_kernel's units per block for 1, 2 and 4 rows
  DevMem acc;                   // fixed-point residual additions of fused steps
  DevMem h, xn, qkv, att, tmp, fc, fch, xf, logits, retlog;  // activations
  DevMem partial, part_ml, tickets;  // decode attention split-K
  DevMem greedy_part, greedy_tickets;  // greedy sampling split over the vocabulary
  DevMem din;                   // step inputs
  HostMem hin;                  // step inputs, staged
  DevMem dtok, dlp;             // sampled tokens and log-probabilities
  HostMem htok, hlp;            // the same, on the host
  HostMem hlog;                 // returned logits, staged
  std::map<int, cudaGraphExec_t> graph_execs;  // decode graphs by batch bucket (×2, +1: all greedy)
  gollm_engine_info info{};     // as reported at creation
  Plan plan;                    // reused between steps
};

namespace {

void fill_status(gollm_status* st, int32_t code, const char* msg) {
  if (!st) return;
  st->code = code;
  std::snprintf(st->message, sizeof st->message, "%s", msg);
}

// guarded runs f, turning exceptions into a status.
template <typename F>
int32_t guarded(gollm_status* st, F&& f) {
  try {
    f();
    fill_status(st, GOLLM_OK, "");
    return GOLLM_OK;
  } catch (const Error& e) {
    fill_status(st, e.code, e.what());
    return e.code;
  } catch (const std::bad_alloc&) {
    fill_status(st, GOLLM_ERR_OUT_OF_MEMORY, "host memory exhausted");
    return GOLLM_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    fill_status(st, GOLLM_ERR_INTERNAL, e.what());
    return GOLLM_ERR_INTERNAL;
  } catch (...) {
    fill_status(st, GOLLM_ERR_INTERNAL, "unknown C++ exception");
    return GOLLM_ERR_INTERNAL;
  }
}

void check_config(const gollm_model_config& c) {
  if (c.vocab_size < 1 || c.max_positions < 1 || c.hidden < 1 || c.layers < 1 || c.heads < 1 ||
      c.inner < 1)
    invalid("config: vocab_size=%d, max_positions=%d, hidden=%d, layers=%d, heads=%d, inner=%d "
            "must all be at least 1",
            c.vocab_size, c.max_positions, c.hidden, c.layers, c.heads, c.inner);
  if (c.head_dim * c.heads != c.hidden)
    invalid("config: head_dim %d × heads %d is not hidden %d", c.head_dim, c.heads, c.hidden);
  if (c.head_dim % 8 != 0 || c.head_dim > 256)
    invalid("config: head_dim %d must be a multiple of 8 and at most 256", c.head_dim);
  if (!(c.layer_norm_eps > 0.f))
    invalid("config: layer_norm_eps %g must be positive", c.layer_norm_eps);
  if (c.activation < GOLLM_ACT_GELU_TANH || c.activation > GOLLM_ACT_RELU)
    invalid("config: activation %d is not a gollm_activation", c.activation);
  if (c.hidden > 12288) invalid("config: hidden %d exceeds 12288", c.hidden);
  if (c.max_positions > 8192) invalid("config: max_positions %d exceeds 8192", c.max_positions);
}

// upload copies a host tensor onto the device, converted to dst's type.
// Matrices named with rows > 0 are [rows][want/rows] in the checkpoint (Conv1D's
// [in][out]) and are stored transposed, [out][in], the layout of the gemv kernels and of
// cuBLAS's "TN" products.
void upload(const gollm_tensor& t, const char* name, int64_t want, bool matrix, int dtype,
            void* dst, DevMem& staging, cudaStream_t stream, int rows = 0) {
  if (!t.data) invalid("tensor %s: no data", name);
  if (t.numel != want) invalid("tensor %s: %lld elements, the config implies %lld", name,
                               (long long)t.numel, (long long)want);
  if (t.dtype < GOLLM_DTYPE_F32 || t.dtype > GOLLM_DTYPE_BF16)
    invalid("tensor %s: dtype %d is not F32, F16 or BF16", name, t.dtype);
  size_t bytes = (size_t)want * dtype_size(t.dtype);
  if (staging.bytes < bytes) staging.alloc(bytes, "weight staging");
  CUDA_CHECK(cudaMemcpyAsync(staging.p, t.data, bytes, cudaMemcpyHostToDevice, stream));
  if (!matrix)
    convert<float>(staging.p, t.dtype, static_cast<float*>(dst), want, stream);
  else if (rows > 0 && dtype == GOLLM_DTYPE_BF16)
    convert_transpose<__nv_bfloat16>(staging.p, t.dtype, static_cast<__nv_bfloat16*>(dst), rows,
                                     (int)(want / rows), stream);
  else if (rows > 0)
    convert_transpose<__half>(staging.p, t.dtype, static_cast<__half*>(dst), rows,
                              (int)(want / rows), stream);
  else if (dtype == GOLLM_DTYPE_BF16)
    convert<__nv_bfloat16>(staging.p, t.dtype, static_cast<__nv_bfloat16*>(dst), want, stream);
  else
    convert<__half>(staging.p, t.dtype, static_cast<__half*>(dst), want, stream);
  // The staging buffer is reused by the next tensor; the host data may be unmapped.
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

void create_weights(const gollm_weights_params* p, gollm_weights** out) {
  if (!p || !out) invalid("gollm_weights_create: params and out must not be NULL");
  const gollm_model_config& c = p->config;
  check_config(c);
  if (p->dtype != GOLLM_DTYPE_F16 && p->dtype != GOLLM_DTYPE_BF16)
    invalid("dtype %d: the engine computes in F16 (1) or BF16 (2)", p->dtype);
  if (!p->layers) invalid("layers: NULL");
  DeviceGuard dg(p->device);
  std::unique_ptr<gollm_weights> w(new gollm_weights);
  w->device = p->device;
  w->dtype = p->dtype;
  w->cfg = c;
  const int64_t H = c.hidden, I = c.inner, V = c.vocab_size, P = c.max_positions;
  const size_t es = 2;
  // Arena layout: matrices in the compute type, vectors in fp32, each 256-byte aligned.
  size_t off = 0;
  auto take = [&](int64_t n, size_t elem) {
    size_t o = off;
    off = align_up(off + (size_t)n * elem);
    return o;
  };
  size_t o_wte = take(V * H, es), o_wpe = take(P * H, es), o_lnfw = take(H, 4),
         o_lnfb = take(H, 4);
  struct LayerOff {
    size_t t[GOLLM_LAYER_TENSORS];
  };
  const int64_t sizes[GOLLM_LAYER_TENSORS] = {H, H, H * 3 * H, 3 * H, H * H, H,
                                              H, H, H * I,     I,     I * H, H};
  const bool matrix[GOLLM_LAYER_TENSORS] = {false, false, true,  false, true, false,
                                            false, false, true,  false, true, false};
  static const char* names[GOLLM_LAYER_TENSORS] = {
      "ln_1.weight",      "ln_1.bias",      "attn.c_attn.weight", "attn.c_attn.bias",
      "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",    "ln_2.bias",
      "mlp.c_fc.weight",  "mlp.c_fc.bias",  "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  std::vector<LayerOff> loff(c.layers);
  for (int l = 0; l < c.layers; l++)
    for (int k = 0; k < GOLLM_LAYER_TENSORS; k++) loff[l].t[k] = take(sizes[k], matrix[k] ? es : 4);
  w->arena.alloc(off, "weights");
  char* base = w->arena.as<char>();
  w->wte = base + o_wte;
  w->wpe = base + o_wpe;
  w->lnf_w = reinterpret_cast<float*>(base + o_lnfw);
  w->lnf_b = reinterpret_cast<float*>(base + o_lnfb);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> sguard(
      stream, [](cudaStream_t s) { cudaStreamDestroy(s); });
  DevMem staging;
  upload(p->wte, "wte.weight", V * H, true, p->dtype, w->wte, staging, stream);
  upload(p->wpe, "wpe.weight", P * H, true, p->dtype, w->wpe, staging, stream);
  upload(p->lnf_w, "ln_f.weight", H, false, p->dtype, w->lnf_w, staging, stream);
  upload(p->lnf_b, "ln_f.bias", H, false, p->dtype, w->lnf_b, staging, stream);
  w->layers.resize(c.layers);
  for (int l = 0; l < c.layers; l++) {
    void* ptr[GOLLM_LAYER_TENSORS];
    for (int k = 0; k < GOLLM_LAYER_TENSORS; k++) {
      ptr[k] = base + loff[l].t[k];
      char name[64];
      std::snprintf(name, sizeof name, "h.%d.%s", l, names[k]);
      // Every layer matrix has `in` rows: hidden, except the MLP's output projection.
      int rows = !matrix[k] ? 0 : k == GOLLM_MLP_W ? c.inner : c.hidden;
      upload(p->layers[l * GOLLM_LAYER_TENSORS + k], name, sizes[k], matrix[k], p->dtype, ptr[k],
             staging, stream, rows);
    }
    LayerW& L = w->layers[l];
    L.ln1_w = (float*)ptr[GOLLM_LN1_W];
    L.ln1_b = (float*)ptr[GOLLM_LN1_B];
    L.attn_w = ptr[GOLLM_ATTN_W];
    L.attn_b = (float*)ptr[GOLLM_ATTN_B];
    L.proj_w = ptr[GOLLM_PROJ_W];
    L.proj_b = (float*)ptr[GOLLM_PROJ_B];
    L.ln2_w = (float*)ptr[GOLLM_LN2_W];
    L.ln2_b = (float*)ptr[GOLLM_LN2_B];
    L.fc_w = ptr[GOLLM_FC_W];
    L.fc_b = (float*)ptr[GOLLM_FC_B];
    L.mlp_w = ptr[GOLLM_MLP_W];
    L.mlp_b = (float*)ptr[GOLLM_MLP_B];
  }
  *out = w.release();
}

void release_weights(gollm_weights* w) {
  if (w && w->refs.fetch_sub(1) == 1) {
    cudaSetDevice(w->device);
    delete w;
  }
}

void destroy_engine(gollm_engine* e) {
  if (!e) return;
  cudaSetDevice(e->device);
  if (e->stream) cudaStreamSynchronize(e->stream);
  for (auto& g : e->graph_execs) cudaGraphExecDestroy(g.second);
  if (e->blas) cublasDestroy(e->blas);
  gollm_weights* w = e->w;
  cudaStream_t s = e->stream;
  delete e;  // frees the buffers before the stream goes
  if (s) cudaStreamDestroy(s);
  release_weights(w);
}

void warmup(gollm_engine* e, gollm_engine_info& inf);

void create_engine(gollm_weights* w, const gollm_engine_params* p, gollm_engine** out,
                   gollm_engine_info* info) {
  if (!w || !p || !out) invalid("gollm_engine_create: weights, params and out must not be NULL");
  if (p->tokens_per_block < 1) invalid("tokens_per_block %d must be at least 1", p->tokens_per_block);
  if (p->num_blocks < 0) invalid("num_blocks %d must not be negative", p->num_blocks);
  if (p->num_blocks == 0 && !(p->kv_free_fraction > 0.f && p->kv_free_fraction <= 1.f))
    invalid("kv_free_fraction %g must be in (0, 1] when num_blocks is 0", p->kv_free_fraction);
  if (p->max_tokens < 1 || p->max_seqs < 1 || p->max_logit_rows < 1)
    invalid("max_tokens %d, max_seqs %d and max_logit_rows %d must be at least 1", p->max_tokens,
            p->max_seqs, p->max_logit_rows);
  DeviceGuard dg(w->device);
  const gollm_model_config& c = w->cfg;
  std::unique_ptr<gollm_engine, void (*)(gollm_engine*)> e(new gollm_engine, destroy_engine);
  w->refs.fetch_add(1);
  e->w = w;
  e->device = w->device;
  e->graphs = p->cuda_graphs != 0;
  e->max_tokens = p->max_tokens;
  e->max_seqs = p->max_seqs;
  e->max_logit_rows = std::max(p->max_logit_rows, p->max_seqs);
  e->geom = KVGeom{c.layers, c.heads, c.head_dim, p->tokens_per_block};
  e->max_parts = 16;
  {
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, w->device));
    e->sms = std::max(1, sms);
    int major = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, w->device));
    // off(name): the variable turns a default-on feature off by starting with '0'.
    auto off = [](const char* name) {
      const char* v = std::getenv(name);
      return v && v[0] == '0';
    };
    e->pdl = major >= 9 && !off("GOLLM_CUDA_PDL");
    // GOLLM_CUDA_BULK=0: the gemv and MLP kernels stage weights with cp.async instead.
    e->bulk = major >= 9 && !off("GOLLM_CUDA_BULK");
    // GOLLM_CUDA_FUSED=0: decode steps take the five-kernel gemv layer instead.
    e->fused = !off("GOLLM_CUDA_FUSED") && c.hidden % 8 == 0 && c.inner % 8 == 0;
    // GOLLM_CUDA_GEMV_ROWS=n (0..kGemvMaxRows): steps of more rows take cuBLAS instead.
    if (const char* genv = std::getenv("GOLLM_CUDA_GEMV_ROWS"))
      e->gemv_rows_max = std::clamp(std::atoi(genv), 0, kGemvMaxRows);
  }
  CUDA_CHECK(cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&e->blas));
  CUBLAS_CHECK(cublasSetStream(e->blas, e->stream));
  const size_t ws = 32u << 20;
  e->blas_ws.alloc(ws, "cuBLAS workspace");
  CUBLAS_CHECK(cublasSetWorkspace(e->blas, e->blas_ws.p, ws));
  CUBLAS_CHECK(cublasSetMathMode(e->blas, CUBLAS_DEFAULT_MATH));

  const size_t N = e->max_tokens, S = e->max_seqs, R = e->max_logit_rows;
  const size_t H = c.hidden, I = c.inner, V = c.vocab_size;
  // GEMM operands hold gemm_rows(max) rows: cuBLAS runs on padded row counts.
  const size_t NG = gemm_rows((int)N), RG = gemm_rows((int)R);
  e->h.alloc(N * H * 4, "residual stream");
  e->xn.alloc(NG * H * 2, "LayerNorm output");
  e->qkv.alloc(NG * 3 * H * 4, "QKV");
  e->att.alloc(NG * H * 2, "attention output");
  e->tmp.alloc(NG * H * 4, "projection output");
  e->fc.alloc(NG * I * 4, "MLP inner");
  e->fch.alloc(NG * I * 2, "MLP activation");
  e->xf.alloc(RG * H * 2, "LM head input");
  e->logits.alloc(RG * V * 4, "logits");
  e->retlog.alloc(R * V * 4, "returned logits");
  const size_t dec = std::min(N, S);
  e->partial.alloc(dec * c.heads * e->max_parts * c.head_dim * 4, "attention partials");
  e->part_ml.alloc(dec * c.heads * e->max_parts * 2 * 4, "attention partial stats");
  e->tickets.alloc(dec * c.heads * 4, "attention tickets");
  e->acc.alloc((size_t)kFusedRows * H * 8, "residual additions");
  CUDA_CHECK(cudaMemsetAsync(e->tickets.p, 0, e->tickets.bytes, e->stream));
  e->greedy_part.alloc(R * kGreedySplits * 3 * 4, "greedy sampling partials");
  e->greedy_tickets.alloc(R * 4, "greedy sampling tickets");
  CUDA_CHECK(cudaMemsetAsync(e->greedy_tickets.p, 0, e->greedy_tickets.bytes, e->stream));
  const size_t in_bytes = 4u << 20;
  e->din.alloc(in_bytes, "step inputs");
  e->hin.alloc(in_bytes, "step inputs (host)");
  e->dtok.alloc(S * 4, "sampled tokens");
  e->dlp.alloc(S * 4, "log-probabilities");
  e->htok.alloc(S * 4, "sampled tokens (host)");
  e->hlp.alloc(S * 4, "log-probabilities (host)");
  // Kernels that need more than 48 KB of shared memory must say so.
  if (w->dtype == GOLLM_DTYPE_BF16) {
    gemv_allow_smem<__nv_bfloat16>(e->device);
  } else {
    gemv_allow_smem<__half>(e->device);
  }
  if (e->fused)
    e->fused = w->dtype == GOLLM_DTYPE_BF16
                   ? fused_setup<__nv_bfloat16>(c.hidden, c.inner, e->sms, e->device, e->mlp_k)
                   : fused_setup<__half>(c.hidden, c.inner, e->sms, e->device, e->mlp_k);
  if (ctx_tc_fits(c.head_dim)) {
    const int ts = (int)ctx_tc_smem(c.head_dim);
    if (w->dtype == GOLLM_DTYPE_BF16)
      CUDA_CHECK(cudaFuncSetAttribute(attention_context_tc_kernel<__nv_bfloat16>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, ts));
    else
      CUDA_CHECK(cudaFuncSetAttribute(attention_context_tc_kernel<__half>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, ts));
  }
  size_t cs = ctx_smem(c.head_dim);
  if (cs > 48 * 1024) {
    if (w->dtype == GOLLM_DTYPE_BF16)
      CUDA_CHECK(cudaFuncSetAttribute(attention_context_kernel<__nv_bfloat16>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cs));
    else
      CUDA_CHECK(cudaFuncSetAttribute(attention_context_kernel<__half>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cs));
  }
  size_t scratch = e->h.bytes + e->xn.bytes + e->qkv.bytes + e->att.bytes + e->tmp.bytes +
                   e->fc.bytes + e->fch.bytes + e->xf.bytes + e->logits.bytes + e->retlog.bytes +
                   e->partial.bytes + e->part_ml.bytes + e->tickets.bytes + e->din.bytes +
                   e->dtok.bytes + e->dlp.bytes + e->blas_ws.bytes + e->acc.bytes;

  const size_t block_bytes = (size_t)p->tokens_per_block * c.layers * 2 * c.heads * c.head_dim * 2;
  int64_t nb = p->num_blocks;
  if (nb == 0) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    nb = (int64_t)((double)free_b * p->kv_free_fraction / (double)block_bytes) - 1;
    if (nb < 1) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "KV pool: %.0f%% of the %zu free bytes holds no block of %zu bytes",
                    p->kv_free_fraction * 100, free_b, block_bytes);
      throw Error(GOLLM_ERR_OUT_OF_MEMORY, buf);
    }
    nb = std::min<int64_t>(nb, 1 << 30);
  }
  e->num_blocks = (int)nb;
  e->kv.alloc((size_t)(nb + 1) * block_bytes, "KV pool");  // + the padding block

  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, e->device));
  gollm_engine_info& inf = e->info;
  inf.num_blocks = e->num_blocks;
  inf.tokens_per_block = p->tokens_per_block;
  inf.weight_bytes = (int64_t)w->arena.bytes;
  inf.kv_bytes = (int64_t)e->kv.bytes;
  inf.scratch_bytes = (int64_t)scratch;
  std::snprintf(inf.device_name, sizeof inf.device_name, "%s", prop.name);
  CUDA_CHECK(cudaStreamSynchronize(e->stream));
  if (p->warmup) warmup(e.get(), inf);
  if (info) *info = inf;
  *out = e.release();
}

// build_plan checks a step descriptor against the engine and lays it out. In graph mode
// (bucket > 0) the step is padded to bucket sequences of one token each.
void build_plan(gollm_engine* e, const gollm_step_in* in, int64_t logits_len, Plan& pl) {
  const gollm_model_config& c = e->w->cfg;
  const int T = e->geom.tokens_per_block, V = c.vocab_size;
  if (in->num_seqs < 0 || in->num_tokens < 0 || in->num_block_ids < 0 || in->num_penalties < 0 ||
      in->num_masks < 0 || in->num_bias < 0)
    invalid("step: negative array length");
  if (in->num_seqs > 0 && !in->seqs) invalid("step: seqs is NULL");
  if (in->num_seqs > e->max_seqs)
    invalid("step: %d sequences exceed the engine's max_seqs %d", in->num_seqs, e->max_seqs);
  auto need = [](bool ok, const char* name) {
    if (!ok) invalid("step: %s is NULL", name);
  };
  need(in->num_tokens == 0 || in->tokens, "tokens");
  need(in->num_block_ids == 0 || in->block_ids, "block_ids");
  need(in->num_penalties == 0 || (in->penalty_tokens && in->penalty_counts), "penalty arrays");
  need(in->num_masks == 0 || in->mask_tokens, "mask_tokens");
  need(in->num_bias == 0 || in->bias, "bias");

  pl = Plan{};
  pl.s = in->num_seqs;
  pl.seqs.resize(pl.s);
  pl.words.clear();
  bool decode_only = pl.s > 0;
  int64_t n = 0;
  for (int s = 0; s < pl.s; s++) {
    const gollm_seq& q = in->seqs[s];
    if (q.token_count < 1) invalid("sequence %d: token_count %d must be at least 1", s, q.token_count);
    if (q.token_offset < 0 || (int64_t)q.token_offset + q.token_count > in->num_tokens)
      invalid("sequence %d: tokens [%d, +%d) outside the %d tokens", s, q.token_offset,
              q.token_count, in->num_tokens);
    if (q.pos < 0 || (int64_t)q.pos + q.token_count > c.max_positions)
      invalid("sequence %d: positions [%d, %lld) outside the model's %d", s, q.pos,
              (long long)q.pos + q.token_count, c.max_positions);
    int64_t end = (int64_t)q.pos + q.token_count;
    int64_t nblk = (end + T - 1) / T;
    if (q.block_count < nblk || q.block_offset < 0 ||
        (int64_t)q.block_offset + q.block_count > in->num_block_ids)
      invalid("sequence %d: block table [%d, +%d) of %d ids does not cover %lld positions", s,
              q.block_offset, q.block_count, in->num_block_ids, (long long)end);
    for (int64_t b = 0; b < nblk; b++) {
      int32_t id = in->block_ids[q.block_offset + b];
      if (id < 0 || id >= e->num_blocks)
        invalid("sequence %d: block %d outside the pool [0, %d)", s, id, e->num_blocks);
    }
    for (int i = 0; i < q.token_count; i++) {
      int32_t t = in->tokens[q.token_offset + i];
      if (t < 0 || t >= V) invalid("sequence %d: token %d outside the vocabulary [0, %d)", s, t, V);
    }
    const bool sample = q.flags & GOLLM_SEQ_SAMPLE;
    const bool ret = q.flags & GOLLM_SEQ_RETURN_LOGITS;
    const bool ctx = q.flags & GOLLM_SEQ_CONTEXT_LOGITS;
    if (sample) {
      if (q.penalty_count < 0 || q.penalty_offset < 0 ||
          (int64_t)q.penalty_offset + q.penalty_count > in->num_penalties)
        invalid("sequence %d: penalties outside their array", s);
      if (q.mask_count < 0 || q.mask_offset < 0 ||
          (int64_t)q.mask_offset + q.mask_count > in->num_masks)
        invalid("sequence %d: masks outside their array", s);
      for (int k = 0; k < q.penalty_count; k++) {
        int32_t t = in->penalty_tokens[q.penalty_offset + k];
        if (t < 0 || t >= V) invalid("sequence %d: penalty token %d outside the vocabulary", s, t);
      }
      for (int k = 0; k < q.mask_count; k++) {
        int32_t t = in->mask_tokens[q.mask_offset + k];
        if (t < 0 || t >= V) invalid("sequence %d: masked token %d outside the vocabulary", s, t);
      }
      if (!(q.temperature >= 0.f) || !(q.uniform >= 0.0 && q.uniform < 1.0))
        invalid("sequence %d: temperature %g or uniform %g out of range", s, q.temperature,
                q.uniform);
    }
    if ((sample || ret) && q.bias_offset >= 0 && (int64_t)q.bias_offset + V > in->num_bias)
      invalid("sequence %d: bias [%d, +%d) outside the %lld biases", s, q.bias_offset, V,
              (long long)in->num_bias);
    int64_t want = (ctx ? (int64_t)q.token_count * V : 0) + (ret ? V : 0);
    if (want > 0 && (q.logits_offset < 0 || !in->seqs || q.logits_offset + want > logits_len))
      invalid("sequence %d: its %lld logits at offset %lld exceed the output's %lld", s,
              (long long)want, (long long)q.logits_offset, (long long)logits_len);
    n += q.token_count;
    pl.max_len = std::max<int>(pl.max_len, (int)end);
    if (q.token_count != 1 || !sample || ret || ctx) decode_only = false;
  }
  if (n > e->max_tokens)
    invalid("step: %lld tokens exceed the engine's max_tokens %d", (long long)n, e->max_tokens);
  pl.n = (int)n;
  pl.decode_only = decode_only;
}

// fill_plan lays out the rows, attention work, LM-head chunks and the variable inputs.
// bucket > 0 pads a decode-only step to bucket sequences (graph mode).
void fill_plan(gollm_engine* e, const gollm_step_in* in, int bucket, Plan& pl) {
  const gollm_model_config& c = e->w->cfg;
  const int V = c.vocab_size, R = e->max_logit_rows;
  const int S = bucket > 0 ? bucket : pl.s;
  const int Q = ctx_queries(c.head_dim);
  pl.row_tok.clear();
  pl.row_pos.clear();
  pl.row_seq.clear();
  pl.dec_rows.clear();
  pl.tiles.clear();
  pl.lrow_src.clear();
  pl.samp_seq.clear();
  pl.samp_row.clear();
  pl.chunks.clear();
  pl.copies.clear();
  pl.words.clear();
  pl.seqs.assign(S, DevSeq{});
  for (DevSeq& d : pl.seqs) d.ret_row = -1;
  // Rows.
  std::vector<int> last_lrow(S, -1);
  std::vector<std::pair<int, int64_t>> ctx_rows;  // (logit row, dst offset) of context rows
  int row = 0;
  for (int s = 0; s < pl.s; s++) {
    const gollm_seq& q = in->seqs[s];
    for (int i = 0; i < q.token_count; i++) {
      pl.row_tok.push_back(in->tokens[q.token_offset + i]);
      pl.row_pos.push_back(q.pos + i);
      pl.row_seq.push_back(s);
    }
    if (q.token_count == 1) {
      pl.dec_rows.push_back(row);
    } else {
      for (int i = 0; i < q.token_count; i += Q)
        pl.tiles.push_back(CtxTile{s, row + i, std::min(Q, q.token_count - i), q.pos + i});
    }
    if (q.flags & GOLLM_SEQ_CONTEXT_LOGITS) {
      for (int i = 0; i < q.token_count; i++) {
        ctx_rows.push_back({(int)pl.lrow_src.size(), q.logits_offset + (int64_t)i * V});
        pl.lrow_src.push_back(row + i);
      }
      last_lrow[s] = (int)pl.lrow_src.size() - 1;
    } else if (q.flags & (GOLLM_SEQ_SAMPLE | GOLLM_SEQ_RETURN_LOGITS)) {
      pl.lrow_src.push_back(row + q.token_count - 1);
      last_lrow[s] = (int)pl.lrow_src.size() - 1;
    }
    row += q.token_count;
  }
  // Padding of a graph bucket: one token at position 0 in the padding block, no logits
  // read back, no sampling.
  for (int s = pl.s; s < S; s++) {
    pl.row_tok.push_back(0);
    pl.row_pos.push_back(0);
    pl.row_seq.push_back(s);
    pl.dec_rows.push_back(row);
    last_lrow[s] = (int)pl.lrow_src.size();
    pl.lrow_src.push_back(row);
    row++;
  }
  const int L = (int)pl.lrow_src.size();
  // Chunks of the LM head, and the sampling entries and copies of each.
  for (int first = 0, ci = 0; first < L; first += R, ci++) {
    Chunk ch{first, std::min(R, L - first), (int)pl.samp_seq.size(), 0, 0};
    for (int s = 0; s < S; s++) {
      int lr = last_lrow[s];
      if (lr < 0 || lr < first || lr >= first + ch.count) continue;
      pl.samp_seq.push_back(s < pl.s ? s : -1);
      pl.samp_row.push_back(lr - first);
      if (s < pl.s && (in->seqs[s].flags & GOLLM_SEQ_RETURN_LOGITS)) {
        const gollm_seq& q = in->seqs[s];
        int64_t dst = q.logits_offset +
                      ((q.flags & GOLLM_SEQ_CONTEXT_LOGITS) ? (int64_t)q.token_count * V : 0);
        pl.copies.push_back(CopyOut{ci, true, ch.ret_count, 1, dst});
        pl.seqs[s].ret_row = ch.ret_count++;
      }
    }
    ch.samp_count = (int)pl.samp_seq.size() - ch.samp_first;
    // Context rows of this chunk, merged into runs of consecutive rows.
    for (const auto& cr : ctx_rows) {
      int lr = cr.first;
      if (lr < first || lr >= first + ch.count) continue;
      if (!pl.copies.empty()) {
        CopyOut& prev = pl.copies.back();
        if (!prev.from_ret && prev.chunk == ci && prev.row + prev.rows == lr - first &&
            prev.dst + (int64_t)prev.rows * V == cr.second) {
          prev.rows++;
          continue;
        }
      }
      pl.copies.push_back(CopyOut{ci, false, lr - first, 1, cr.second});
    }
    pl.chunks.push_back(ch);
  }
  pl.n = row;
}

// layout_fixed sizes the fixed part of the device inputs for a plan's counts.
Layout layout_fixed(const Plan& pl) {
  Layout L{};
  size_t o = 0;
  auto take = [&](size_t bytes) {
    size_t r = o;
    o = align_up(o + bytes);
    return r;
  };
  L.row_tok = take(pl.row_tok.size() * 4);
  L.row_pos = take(pl.row_pos.size() * 4);
  L.row_seq = take(pl.row_seq.size() * 4);
  L.dec_rows = take(pl.dec_rows.size() * 4);
  L.tiles = take(pl.tiles.size() * sizeof(CtxTile));
  L.seqs = take(pl.seqs.size() * sizeof(DevSeq));
  L.lrow_src = take(pl.lrow_src.size() * 4);
  L.samp_seq = take(pl.samp_seq.size() * 4);
  L.samp_row = take(pl.samp_row.size() * 4);
  L.var = o;
  L.total = o;
  return L;
}

// fill_var writes the sequences' descriptors and the variable part (block tables,
// penalty pairs, masks, biases) at word offsets from the buffer's start.
void fill_var(gollm_engine* e, const gollm_step_in* in, Plan& pl, Layout& L) {
  const int V = e->w->cfg.vocab_size;
  const int64_t base = (int64_t)(L.var / 4);
  auto& W = pl.words;
  W.clear();
  // The padding block's id, for the padding sequences of a graph bucket.
  const int64_t pad_word = base + (int64_t)W.size();
  W.push_back(e->num_blocks);
  for (int s = 0; s < (int)pl.seqs.size(); s++) {
    DevSeq& d = pl.seqs[s];
    int keep_ret = s < pl.s ? d.ret_row : -1;
    d = DevSeq{};
    d.ret_row = keep_ret;
    d.bias_off = -1;
    if (s >= pl.s) {
      d.blk_off = (int32_t)pad_word;
      d.ntok = 1;
      continue;
    }
    const gollm_seq& q = in->seqs[s];
    d.pos = q.pos;
    d.ntok = q.token_count;
    d.flags = q.flags;
    d.temperature = q.temperature;
    d.top_k = q.top_k;
    d.top_p = q.top_p;
    d.rep = q.repetition_penalty;
    d.presence = q.presence_penalty;
    d.frequency = q.frequency_penalty;
    d.uniform = q.uniform;
    d.blk_off = (int32_t)(base + (int64_t)W.size());
    W.insert(W.end(), in->block_ids + q.block_offset, in->block_ids + q.block_offset + q.block_count);
    if (q.flags & GOLLM_SEQ_SAMPLE) {
      d.pen_off = (int32_t)(base + (int64_t)W.size());
      d.pen_cnt = q.penalty_count;
      for (int k = 0; k < q.penalty_count; k++) {
        W.push_back(in->penalty_tokens[q.penalty_offset + k]);
        W.push_back(in->penalty_counts[q.penalty_offset + k]);
      }
      d.mask_off = (int32_t)(base + (int64_t)W.size());
      d.mask_cnt = q.mask_count;
      W.insert(W.end(), in->mask_tokens + q.mask_offset, in->mask_tokens + q.mask_offset + q.mask_count);
    }
    if ((q.flags & (GOLLM_SEQ_SAMPLE | GOLLM_SEQ_RETURN_LOGITS)) && q.bias_offset >= 0) {
      d.bias_off = (int32_t)(base + (int64_t)W.size());
      const float* b = in->bias + q.bias_offset;
      size_t at = W.size();
      W.resize(at + V);
      std::memcpy(W.data() + at, b, (size_t)V * 4);
    }
  }
  if ((base + (int64_t)W.size()) > INT32_MAX) invalid("step: inputs exceed 2^31 words");
  L.total = L.var + W.size() * 4;
}

// ensure_inputs grows the input buffers to hold bytes; graphs that captured the old
// address are dropped.
void ensure_inputs(gollm_engine* e, size_t bytes) {
  if (bytes <= e->din.bytes) return;
  size_t n = align_up(std::max(bytes, e->din.bytes * 2), 1 << 20);
  CUDA_CHECK(cudaStreamSynchronize(e->stream));
  e->din.alloc(n, "step inputs");
  e->hin.alloc(n, "step inputs (host)");
  for (auto& g : e->graph_execs) cudaGraphExecDestroy(g.second);
  e->graph_execs.clear();
}

// stage writes the plan into the pinned input buffer.
void stage(gollm_engine* e, const Plan& pl, const Layout& L) {
  char* h = e->hin.as<char>();
  auto put = [&](size_t off, const void* src, size_t bytes) {
    if (bytes) std::memcpy(h + off, src, bytes);
  };
  put(L.row_tok, pl.row_tok.data(), pl.row_tok.size() * 4);
  put(L.row_pos, pl.row_pos.data(), pl.row_pos.size() * 4);
  put(L.row_seq, pl.row_seq.data(), pl.row_seq.size() * 4);
  put(L.dec_rows, pl.dec_rows.data(), pl.dec_rows.size() * 4);
  put(L.tiles, pl.tiles.data(), pl.tiles.size() * sizeof(CtxTile));
  put(L.seqs, pl.seqs.data(), pl.seqs.size() * sizeof(DevSeq));
  put(L.lrow_src, pl.lrow_src.data(), pl.lrow_src.size() * 4);
  put(L.samp_seq, pl.samp_seq.data(), pl.samp_seq.size() * 4);
  put(L.samp_row, pl.samp_row.data(), pl.samp_row.size() * 4);
  put(L.var, pl.words.data(), pl.words.size() * 4);
}

// A step's cuBLAS calls on the engine's buffers, for m rows (gemm_rows of the step's): a
// layer's QKV, output projection, MLP up and MLP down, and the LM head over xf. forward
// and the warm-up both make them, so the warm-up meets exactly a step's shapes.
template <typename T>
void gemm_qkv(gollm_engine* e, const LayerW& lw, int m) {
  const int H = e->w->cfg.hidden;
  matmul_xwt<T>(e->blas, e->xn.as<T>(), static_cast<const T*>(lw.attn_w), e->qkv.as<float>(), m, H, 3 * H);
}
template <typename T>
void gemm_proj(gollm_engine* e, const LayerW& lw, int m) {
  const int H = e->w->cfg.hidden;
  matmul_xwt<T>(e->blas, e->att.as<T>(), static_cast<const T*>(lw.proj_w), e->tmp.as<float>(), m, H, H);
}
template <typename T>
void gemm_up(gollm_engine* e, const LayerW& lw, int m) {
  const int H = e->w->cfg.hidden, I = e->w->cfg.inner;
  matmul_xwt<T>(e->blas, e->xn.as<T>(), static_cast<const T*>(lw.fc_w), e->fc.as<float>(), m, H, I);
}
template <typename T>
void gemm_down(gollm_engine* e, const LayerW& lw, int m) {
  const int H = e->w->cfg.hidden, I = e->w->cfg.inner;
  matmul_xwt<T>(e->blas, e->fch.as<T>(), static_cast<const T*>(lw.mlp_w), e->tmp.as<float>(), m, I, H);
}
template <typename T>
void gemm_lm_head(gollm_engine* e, int m) {
  const int H = e->w->cfg.hidden, V = e->w->cfg.vocab_size;
  matmul_xwt<T>(e->blas, e->xf.as<T>(), static_cast<const T*>(e->w->wte), e->logits.as<float>(), m, H, V);
}

// forward enqueues the whole step on the engine's stream: the layers, then per chunk the
// LM head, the sampling and (eager mode) the logits copies. In graph mode it is captured.
template <typename T>
void forward(gollm_engine* e, const Plan& pl, const Layout& L, int parts, bool capture) {
  gollm_weights* w = e->w;
  const gollm_model_config& c = w->cfg;
  const int N = pl.n, H = c.hidden, I = c.inner, V = c.vocab_size;
  const int NG = gemm_rows(N);  // cuBLAS's row count (the rows past N are never read)
  const float eps = c.layer_norm_eps;
  // Kernels after the first may overlap their predecessor's tail (sm_90).
  const Stream st0(e->stream, false), st(e->stream, e->pdl);
  char* din = e->din.as<char>();
  auto I32 = [&](size_t off) { return reinterpret_cast<const int32_t*>(din + off); };
  const int32_t* words = reinterpret_cast<const int32_t*>(din);
  const DevSeq* seqs = reinterpret_cast<const DevSeq*>(din + L.seqs);
  const CtxTile* tiles = reinterpret_cast<const CtxTile*>(din + L.tiles);
  float* h = e->h.as<float>();
  T* xn = e->xn.as<T>();
  float* qkv = e->qkv.as<float>();
  T* att = e->att.as<T>();
  float* tmp = e->tmp.as<float>();
  float* fc = e->fc.as<float>();
  T* fch = e->fch.as<T>();
  T* kv = e->kv.as<T>();

  // Few rows: fused gemv kernels reading the weights once (decode at small batch).
  const bool small = N <= e->gemv_rows_max && gemv_fits(N, H) && gemv_fits(N, I) && pl.chunks.size() <= 1 &&
                     (pl.chunks.empty() || pl.chunks[0].count <= kGemvMaxRows);
  // Decode-only steps of few rows: four kernels a layer, the MLP in one (fused.cuh) with
  // the residual stream's additions in fixed point.
  const bool fused = small && e->fused && pl.tiles.empty() && (int)pl.dec_rows.size() == N &&
                     N <= kFusedRows;
  unsigned long long* acc = fused ? e->acc.as<unsigned long long>() : nullptr;
  embedding_layernorm<T>(I32(L.row_tok), I32(L.row_pos), static_cast<const T*>(w->wte),
                         static_cast<const T*>(w->wpe), h, xn, w->layers[0].ln1_w,
                         w->layers[0].ln1_b, N, H, eps, st0, acc);
  // gemv_args holds what every gemv of the step shares: n rows over the residual stream.
  auto gemv_args = [&](int n) {
    GemvArgs a{};
    a.bulk = e->bulk, a.n = n, a.h = h, a.eps = eps, a.acc = acc;
    return a;
  };
  for (int l = 0; l < c.layers; l++) {
    const LayerW& lw = w->layers[l];
    if (small) {
      GemvArgs a = gemv_args(N);
      // QKV with LayerNorm 1 before and the KV write after.
      a.w = lw.attn_w, a.bias = lw.attn_b, a.in = H, a.out = 3 * H;
      a.gamma = lw.ln1_w, a.beta = lw.ln1_b;
      a.y = qkv, a.kv = kv, a.row_pos = I32(L.row_pos), a.row_seq = I32(L.row_seq);
      a.seqs = seqs, a.blocks = words, a.geom = e->geom, a.layer = l;
      a.qscale = 1.f / sqrtf((float)c.head_dim);
      gemv<T, GEMV_IN_LN, GEMV_OUT_QKV>(a, e->sms, st);
    } else {
      gemm_qkv<T>(e, lw, NG);
      qkv_kv_write<T>(qkv, lw.attn_b, kv, I32(L.row_pos), I32(L.row_seq), seqs, words, e->geom,
                      l, N, st);
    }
    attention_context<T>(qkv, att, kv, tiles, seqs, words, e->geom, l, (int)pl.tiles.size(), st);
    attention_decode<T>(qkv, att, kv, I32(L.dec_rows), I32(L.row_pos), I32(L.row_seq), seqs,
                        words, e->geom, l, (int)pl.dec_rows.size(), parts, c.max_positions,
                        e->partial.as<float>(), e->part_ml.as<float>(), e->tickets.as<int>(),
                        small, st);
    const bool last = l + 1 == c.layers;
    if (small) {
      GemvArgs a = gemv_args(N);
      // Attention output projection, added to the residual stream; in a fused step its
      // single writer per entry also moves the last MLP's fixed-point additions into h.
      a.w = lw.proj_w, a.bias = lw.proj_b, a.in = H, a.out = H, a.x = att, a.hout = h;
      gemv<T, GEMV_IN_T, GEMV_OUT_RESID>(a, e->sms, st);
      if (fused) {
        MlpArgs m{};
        m.bulk = e->bulk;
        m.w_up = lw.fc_w, m.b_up = lw.fc_b, m.w_down = lw.mlp_w, m.b_down = lw.mlp_b;
        m.gamma = lw.ln2_w, m.beta = lw.ln2_b, m.eps = eps, m.h = h, m.acc = acc;
        m.n = N, m.hidden = H, m.inner = I, m.act = c.activation;
        const int R = gemv_rows(N);
        m.k = e->mlp_k[mlp_slot(R)];
        mlp<T>(m, R, st);
        continue;
      }
      // MLP up-projection with LayerNorm 2 before and the activation after.
      a.w = lw.fc_w, a.bias = lw.fc_b, a.in = H, a.out = I, a.gamma = lw.ln2_w,
      a.beta = lw.ln2_b, a.y = fch, a.act = c.activation;
      gemv<T, GEMV_IN_LN, GEMV_OUT_ACT>(a, e->sms, st);
      // MLP down-projection, added to the residual stream.
      a.w = lw.mlp_w, a.bias = lw.mlp_b, a.in = I, a.out = H, a.x = fch, a.hout = h;
      gemv<T, GEMV_IN_T, GEMV_OUT_RESID>(a, e->sms, st);
      continue;
    }
    gemm_proj<T>(e, lw, NG);
    residual_layernorm<T>(h, tmp, lw.proj_b, xn, lw.ln2_w, lw.ln2_b, N, H, eps, st);
    gemm_up<T>(e, lw, NG);
    bias_act<T>(fc, lw.fc_b, fch, N, I, c.activation, st);
    gemm_down<T>(e, lw, NG);
    const LayerW& nx = last ? lw : w->layers[l + 1];
    residual_layernorm<T>(h, tmp, lw.mlp_b, xn, last ? w->lnf_w : nx.ln1_w,
                          last ? w->lnf_b : nx.ln1_b, N, H, eps, st);
  }
  float* logits = e->logits.as<float>();
  float* retlog = e->retlog.as<float>();
  float* hlog = e->hlog.as<float>();
  for (size_t ci = 0; ci < pl.chunks.size(); ci++) {
    const Chunk& ch = pl.chunks[ci];
    if (small) {
      // The final LayerNorm is fused into the LM head's gemv.
      GemvArgs a = gemv_args(ch.count);
      a.idx = I32(L.lrow_src) + ch.first;
      a.gamma = w->lnf_w, a.beta = w->lnf_b, a.w = w->wte, a.in = H, a.out = V, a.y = logits;
      gemv<T, GEMV_IN_LN, GEMV_OUT_F32>(a, e->sms, st);
    } else {
      gather_rows<T>(xn, I32(L.lrow_src) + ch.first, e->xf.as<T>(), ch.count, H, st);
      gemm_lm_head<T>(e, gemm_rows(ch.count));
    }
    if (!capture) {
      for (const CopyOut& cp : pl.copies)
        if (cp.chunk == (int)ci && !cp.from_ret)
          CUDA_CHECK(cudaMemcpyAsync(hlog + cp.dst, logits + (int64_t)cp.row * V,
                                     (size_t)cp.rows * V * 4, cudaMemcpyDeviceToHost, st.st));
    }
    sample(logits, I32(L.samp_seq) + ch.samp_first, I32(L.samp_row) + ch.samp_first, seqs, words,
           words, reinterpret_cast<const float*>(din), retlog, e->dtok.as<int32_t>(),
           e->dlp.as<float>(), ch.samp_count, V, e->greedy_part.as<float>(),
           e->greedy_tickets.as<int>(), pl.all_greedy, st);
    if (!capture) {
      for (const CopyOut& cp : pl.copies)
        if (cp.chunk == (int)ci && cp.from_ret)
          CUDA_CHECK(cudaMemcpyAsync(hlog + cp.dst, retlog + (int64_t)cp.row * V,
                                     (size_t)cp.rows * V * 4, cudaMemcpyDeviceToHost, st.st));
    }
  }
}

void run_forward(gollm_engine* e, const Plan& pl, const Layout& L, int parts, bool capture) {
  if (e->w->dtype == GOLLM_DTYPE_BF16)
    forward<__nv_bfloat16>(e, pl, L, parts, capture);
  else
    forward<__half>(e, pl, L, parts, capture);
}

int bucket_for(gollm_engine* e, int s) {
  int b = 1;
  while (b < s) b <<= 1;
  return std::min(b, e->max_seqs);
}

void step(gollm_engine* e, const gollm_step_in* in, gollm_step_out* out) {
  if (!e || !in || !out) invalid("gollm_step: engine, in and out must not be NULL");
  if (in->num_seqs > 0 && (!out->tokens || !out->log_probs))
    invalid("gollm_step: out.tokens and out.log_probs must not be NULL");
  DeviceGuard dg(e->device);
  Plan& pl = e->plan;
  build_plan(e, in, out->logits ? out->logits_len : 0, pl);
  if (pl.s == 0) return;
  const int bucket = e->graphs && pl.decode_only ? bucket_for(e, pl.s) : 0;
  const bool use_graph = bucket > 0 && bucket <= e->max_tokens;
  fill_plan(e, in, use_graph ? bucket : 0, pl);
  Layout L = layout_fixed(pl);
  fill_var(e, in, pl, L);
  // Steps whose rows are all plain greedy skip the general sampling kernel's launch.
  pl.all_greedy = true;
  for (int s = 0; s < pl.s; s++) pl.all_greedy = pl.all_greedy && greedy_fast(pl.seqs[s]);
  // fill_var ran after the descriptors were sized; the layout's fixed part is unchanged.
  ensure_inputs(e, L.total);
  // Returned logits are staged in pinned memory.
  int64_t log_need = 0;
  for (const CopyOut& cp : pl.copies)
    log_need = std::max<int64_t>(log_need, cp.dst + (int64_t)cp.rows * e->w->cfg.vocab_size);
  if ((size_t)log_need * 4 > e->hlog.bytes) e->hlog.alloc(align_up((size_t)log_need * 4, 1 << 20), "logits (host)");
  stage(e, pl, L);
  CUDA_CHECK(cudaMemcpyAsync(e->din.p, e->hin.p, L.total, cudaMemcpyHostToDevice, e->stream));
  if (use_graph) {
    const int key = bucket * 2 + (pl.all_greedy ? 1 : 0);
    auto it = e->graph_execs.find(key);
    if (it == e->graph_execs.end()) {
      // Replays see other lengths: size the splits for the longest possible row.
      const int splits = decode_splits(bucket, e->w->cfg.heads, e->sms, e->w->cfg.max_positions);
      cudaGraphExec_t ex = nullptr;
      cudaGraph_t g = nullptr;
      CUDA_CHECK(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeThreadLocal));
      try {
        run_forward(e, pl, L, splits, true);
      } catch (...) {
        cudaStreamEndCapture(e->stream, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        throw;
      }
      cudaError_t err = cudaStreamEndCapture(e->stream, &g);
      if (err == cudaSuccess) err = cudaGraphInstantiate(&ex, g, 0);
      if (g) cudaGraphDestroy(g);
      CUDA_CHECK(err);
      it = e->graph_execs.emplace(key, ex).first;
    }
    CUDA_CHECK(cudaGraphLaunch(it->second, e->stream));
  } else {
    int parts = decode_splits(std::max<int>(1, (int)pl.dec_rows.size()), e->w->cfg.heads, e->sms,
                              pl.max_len);
    run_forward(e, pl, L, parts, false);
  }
  CUDA_CHECK(cudaMemcpyAsync(e->htok.p, e->dtok.p, (size_t)pl.s * 4, cudaMemcpyDeviceToHost, e->stream));
  CUDA_CHECK(cudaMemcpyAsync(e->hlp.p, e->dlp.p, (size_t)pl.s * 4, cudaMemcpyDeviceToHost, e->stream));
  CUDA_CHECK(cudaStreamSynchronize(e->stream));
  const int32_t* tok = e->htok.as<int32_t>();
  const float* lp = e->hlp.as<float>();
  for (int s = 0; s < pl.s; s++) {
    const bool sample = in->seqs[s].flags & GOLLM_SEQ_SAMPLE;
    if (sample && tok[s] == -2) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "sequence %d: every token is masked (bad words, min length and bias leave "
                    "no choice)", s);
      throw Error(GOLLM_ERR_ALL_MASKED, buf);
    }
    out->tokens[s] = sample ? tok[s] : -1;
    out->log_probs[s] = sample ? lp[s] : 0.f;
  }
  const int V = e->w->cfg.vocab_size;
  for (const CopyOut& cp : pl.copies)
    std::memcpy(out->logits + cp.dst, e->hlog.as<float>() + cp.dst, (size_t)cp.rows * V * 4);
}

// warmup_gemms calls cuBLAS once on every padded row count a step can use (layer 0's four
// GEMMs, the LM head), so that no step of a served model pays a shape's first call.
template <typename T>
int warmup_gemms(gollm_engine* e) {
  const LayerW& lw = e->w->layers[0];
  // Inputs zeroed: the calls compute on them.
  CUDA_CHECK(cudaMemsetAsync(e->xn.p, 0, e->xn.bytes, e->stream));
  CUDA_CHECK(cudaMemsetAsync(e->att.p, 0, e->att.bytes, e->stream));
  CUDA_CHECK(cudaMemsetAsync(e->fch.p, 0, e->fch.bytes, e->stream));
  CUDA_CHECK(cudaMemsetAsync(e->xf.p, 0, e->xf.bytes, e->stream));
  int shapes = 0;
  const int top = gemm_rows(e->max_tokens);
  for (int m = 16; m <= top; m = gemm_rows(m + 1)) {
    gemm_qkv<T>(e, lw, m);
    gemm_proj<T>(e, lw, m);
    gemm_up<T>(e, lw, m);
    gemm_down<T>(e, lw, m);
    shapes += 4;
  }
  const int rtop = gemm_rows(e->max_logit_rows);
  for (int m = 16; m <= rtop; m = gemm_rows(m + 1)) {
    gemm_lm_head<T>(e, m);
    shapes++;
  }
  return shapes;
}

// warmup readies a new engine for serving: every cuBLAS shape once, one prompt step and
// one sampled step (the first launch of each kernel loads it), and the decode graph of
// every batch bucket, greedy and sampled. Its steps use KV block 0 at position 0 onwards;
// nothing has been stored in the pool yet.
void warmup(gollm_engine* e, gollm_engine_info& inf) {
  const auto t0 = std::chrono::steady_clock::now();
  DeviceGuard dg(e->device);
  const gollm_model_config& c = e->w->cfg;
  inf.warmup_gemm_shapes =
      e->w->dtype == GOLLM_DTYPE_BF16 ? warmup_gemms<__nv_bfloat16>(e) : warmup_gemms<__half>(e);
  const int T = e->geom.tokens_per_block;
  std::vector<gollm_seq> seqs;
  std::vector<int32_t> tokens, blocks;
  std::vector<int32_t> otok(e->max_seqs);
  std::vector<float> olp(e->max_seqs);
  // run: b sequences of k tokens from position 0, greedy or sampled at temperature 1.
  auto run = [&](int b, int k, bool greedy) {
    const int nblk = (k + T - 1) / T;
    seqs.assign(b, gollm_seq{});
    tokens.assign((size_t)b * k, 0);
    blocks.assign(nblk, 0);
    for (int i = 0; i < nblk; i++) blocks[i] = i;
    for (int s = 0; s < b; s++) {
      gollm_seq& q = seqs[s];
      q.token_offset = s * k, q.token_count = k;
      q.block_offset = 0, q.block_count = nblk;
      q.flags = GOLLM_SEQ_SAMPLE;
      q.temperature = greedy ? 0.f : 1.f;
      q.bias_offset = -1;
      q.uniform = 0.5;
    }
    gollm_step_in in{};
    in.num_seqs = b, in.seqs = seqs.data();
    in.num_tokens = (int32_t)tokens.size(), in.tokens = tokens.data();
    in.num_block_ids = nblk, in.block_ids = blocks.data();
    gollm_step_out o{};
    o.tokens = otok.data(), o.log_probs = olp.data();
    step(e, &in, &o);
  };
  // A prompt through cuBLAS (more than kGemvMaxRows tokens) where the limits allow.
  const int k = std::min({16, e->max_tokens, c.max_positions, T * e->num_blocks});
  run(1, k, false);
  const int top = std::min(e->max_seqs, e->max_tokens);
  for (int b = 1;; b = std::min(2 * b, top)) {
    run(b, 1, true);
    run(b, 1, false);
    if (b == top) break;
  }
  inf.warmup_graphs = (int32_t)e->graph_execs.size();
  inf.warmup_ms = std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

extern "C" {

int32_t gollm_abi_version(void) { return GOLLM_ABI_VERSION; }

int32_t gollm_device_count(int32_t* count, gollm_status* status) {
  return guarded(status, [&] {
    if (!count) invalid("gollm_device_count: count is NULL");
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    *count = n;
  });
}

int32_t gollm_weights_create(const gollm_weights_params* params, gollm_weights** out,
                             gollm_status* status) {
  return guarded(status, [&] { create_weights(params, out); });
}

void gollm_weights_release(gollm_weights* w) {
  try {
    release_weights(w);
  } catch (...) {
  }
}

int32_t gollm_engine_create(gollm_weights* w, const gollm_engine_params* params,
                            gollm_engine** out, gollm_engine_info* info, gollm_status* status) {
  return guarded(status, [&] { create_engine(w, params, out, info); });
}

int32_t gollm_step(gollm_engine* e, const gollm_step_in* in, gollm_step_out* out,
                   gollm_status* status) {
  return guarded(status, [&] { step(e, in, out); });
}

void gollm_engine_destroy(gollm_engine* e) {
  try {
    destroy_engine(e);
  } catch (...) {
  }
}

}  // extern "C"

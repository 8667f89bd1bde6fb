// internal.h — what the engine's files share: device and pinned memory, the weights and
// engine objects behind gollm.h's handles, the step plan, and the functions each file
// gives the others. The kernels themselves are included by forward.cu alone (and
// convert.cuh by weights.cu), so each kernel is compiled, registered and configured once.
//
//   weights.cu  the weight arena, the upload of role-tagged tensors, the recipe checked
//               and its stages' weights resolved
//   engine.cu   engine creation (buffers, the KV pool, the tuning) and destruction
//   plan.cu     checking a step's descriptor and laying out its device inputs
//   forward.cu  every kernel launch: the walk over the recipe with a dispatcher a stage,
//               sampling, the warm-up GEMMs
//   step.cu     one step end to end, CUDA graphs (capture and replay) and the warm-up
//   faults.cu   injected failures (gollm_faults), the reset after a failed step, device info
//   comm.cu     tensor parallelism: NCCL (dlopen), the communicators, a step's collectives
//   api.cu      the C ABI: each entry point turns exceptions into a gollm_status
#pragma once

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "blaslt.h"
#include "comm.h"
#include "common.cuh"
#include "gollm.h"
#include "moe.h"
#include "sizes.h"

namespace gollm {

// DevMem is a device allocation freed with its owner.
struct DevMem {
  void* p = nullptr;
  size_t bytes = 0;
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() { reset(); }
  void alloc(size_t n, const char* what);
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
  void alloc(size_t n, const char* what);
  void reset() {
    if (p) cudaFreeHost(p);
    p = nullptr;
    bytes = 0;
  }
  template <typename T> T* as() const { return static_cast<T*>(p); }
  void swap(HostMem& o) {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
  }
};

// MoeBufs are the mixture-of-experts stage's buffers (moe.cuh), for passes of up to chunk
// token rows routed to top_k experts each (P = chunk · top_k pairs); empty without experts.
struct MoeBufs {
  int chunk = 0;
  DevMem logits;             // [chunk][experts + 1] fp32: the router's, then the shared gate's
  DevMem topi, topw, sgate;  // [P] int32, [P] fp32, [chunk] fp32
  DevMem sorted, pos;        // [P] int32: a slot's row, a pair's slot
  DevMem tiles, ntiles;      // [moe_max_tiles] int4, [2] int32 (count, router blocks done)
  DevMem act, y;             // [P][moe_inner] T, [P][hidden] fp32
  DevMem sact, sy;           // the shared expert's: [chunk][shared_inner] T, [chunk][hidden] fp32
  size_t bytes() const {
    return logits.bytes + topi.bytes + topw.bytes + sgate.bytes + sorted.bytes + pos.bytes + tiles.bytes +
           ntiles.bytes + act.bytes + y.bytes + sact.bytes + sy.bytes;
  }
};

// DeviceGuard makes dev current for the calling thread for one ABI call.
struct DeviceGuard {
  explicit DeviceGuard(int dev) { CUDA_CHECK(cudaSetDevice(dev)); }
};

inline size_t align_up(size_t n, size_t a = 256) { return (n + a - 1) / a * a; }

// invalid throws GOLLM_ERR_INVALID_ARGUMENT with a printf-style message.
[[noreturn]] void invalid(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Stage is a stage of the recipe (gollm_stage) with what it reads resolved: its weights
// in the arena (matrices [out][in] in the compute type, vectors fp32; an absent bias, or
// LayerNorm's bias under RMSNorm, null), and for QKV and KV_WRITE the epilogue values of
// the stages around them, so that whichever kernel writes the keys applies them.
struct Stage {
  gollm_stage s{};
  const float* gamma = nullptr;  // NORM, POST_NORM: weight [hidden]; QK_NORM: Q_NORM's
  const float* beta = nullptr;   // NORM: LayerNorm's bias [hidden]; QK_NORM: K_NORM
  const void* w = nullptr;       // QKV [qkv][hidden], OUT [hidden][att], MLP's UP [up][hidden],
                                 // LM_HEAD [vocab rows][hidden] (padded: lm_head_ld), MOE's
                                 // EXPERT_UP [experts][2·moe_inner][hidden]
  const float* b = nullptr;      // their biases
  const void* w2 = nullptr;      // MLP's DOWN [hidden][inner], MOE's EXPERT_DOWN
                                 // [experts][hidden][moe_inner]
  const float* b2 = nullptr;     // its bias [hidden]
  const float* ws = nullptr;     // FP8 weights (gollm_weights.fp8): w's scales [rows][ceil(cols/128)]
  const float* ws2 = nullptr;    // and w2's
  const void* router = nullptr;       // MOE: ROUTER [experts][hidden]
  const void* shared_w = nullptr;     // MOE: SHARED_UP [2·shared_inner][hidden], or null
  const void* shared_w2 = nullptr;    // MOE: SHARED_DOWN [hidden][shared_inner]
  const void* shared_gate = nullptr;  // MOE: SHARED_GATE [hidden]
  const float* inv_freq = nullptr;  // QKV, KV_WRITE: the layer's rotary frequencies
                                    // [rope_dim/2] on the device, or null (no rotary)
  int rope_dim = 0;                 // QKV, KV_WRITE: the rotated dimensions of a head
  float qscale = 0.f;               // QKV, KV_WRITE: the layer's attention scale
  bool extra = false;               // QKV, KV_WRITE: the layer has q/k norms or a longrope
  QkvExtra qkx;                     // rotary (qkv_extra_write does their epilogue)
  const Stage* next = nullptr;      // EMBED, RESIDUAL: the NORM after it, which its kernel
                                    // computes too
  const Stage* post = nullptr;      // OUT, MLP, MOE: the POST_NORM after it, or null
};

// FailStep is gollm_faults' failing step: the engine's step that fails (0: none), and
// whether it loses the context (a trapping kernel) rather than failing one call, or fails
// early (before any of the step's work is enqueued: a tensor-parallel rank's peers then
// wait for collectives that do not come); rank is the tensor-parallel rank that fails
// (-1: every one).
struct FailStep {
  int step = 0;
  bool lost = false;
  bool early = false;
  int rank = -1;
};

// AllocFault makes the device allocations the calling thread makes while it lives fail as
// out of memory where their purpose contains text (gollm_faults.fail_alloc; null or empty:
// none), so that weights, engine and step allocations can be failed on purpose.
struct AllocFault {
  explicit AllocFault(const char* text);
  ~AllocFault();
  AllocFault(const AllocFault&) = delete;
  AllocFault& operator=(const AllocFault&) = delete;
  const char* prev;
};

// Shape of one model: the sizes every file derives from gollm_model_config.
struct Dims {
  int H, V, P, L;        // hidden, vocabulary, positions, layers
  int heads, kv_heads, D;
  int I, up;             // MLP units, and the first projection's width (2·I when gated)
  int qkv, att;          // QKV and attention-output widths
  explicit Dims(const gollm_model_config& c)
      : H(c.hidden), V(c.vocab_size), P(c.max_positions), L(c.layers), heads(c.heads),
        kv_heads(c.kv_heads), D(c.head_dim), I(c.inner), up(c.gated_mlp ? 2 * c.inner : c.inner),
        qkv((c.heads + 2 * c.kv_heads) * c.head_dim), att(c.heads * c.head_dim) {}
};

// role_shape is a role's [rows, cols] under c (cols 1 for vectors), or false when the
// architecture has no such role (model.Config.Shape in Go); layer_role_shape the same in a
// layer whose MLP is (sparse) or is not the experts (model.Config.LayerShape).
bool role_shape(const gollm_model_config& c, int role, int64_t& rows, int64_t& cols);
bool layer_role_shape(const gollm_model_config& c, bool sparse, int role, int64_t& rows, int64_t& cols);

// held_experts is how many experts' weights a share holds: local_experts under expert
// parallelism (from expert_first), else every expert.
inline int held_experts(const gollm_model_config& c) { return c.local_experts > 0 ? c.local_experts : c.experts; }

}  // namespace gollm

// gollm_weights: one device arena holding every weight, shared by engines (refcounted).
struct gollm_weights {
  std::atomic<int> refs{1};    // engines and the creator
  int device = 0;              // CUDA ordinal
  int dtype = GOLLM_DTYPE_F16; // compute type
  bool fp8 = false;            // QKV, OUT, UP, DOWN are float8_e4m3fn with scales (fp8.cuh)
  gollm_model_config cfg{};    // the architecture
  gollm::DevMem arena;         // all weights
  const void* embed = nullptr;     // [vocab][hidden]
  const void* pos = nullptr;       // [max_positions][hidden], or null (rotary)
  const void* lm_head = nullptr;   // [vocab][hidden]: embed when tied
  std::vector<gollm::Stage> recipe;   // the forward pass, checked, weights resolved
};

namespace gollm {

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
  int first, count;            // rows of the logit-row list
  int samp_first, samp_count;  // entries of the sampling list
  int ret_count;               // returned-logits rows
};

// CopyOut is a D2H copy into the logits staging buffer.
struct CopyOut {
  int chunk;        // after which chunk's LM head
  bool from_ret;    // from the returned-logits buffer, else from the logits buffer
  int row;          // first row in that buffer
  int rows;         // rows
  int64_t dst;      // float offset in the caller's logits
};

// PromptPad is the counts a step on the many-rows path is padded to so that it replays
// a prompt graph (plan.cu's prompt_pad): token rows, sequences (the last ones padding),
// attention tiles, decode rows and logit rows.
struct PromptPad {
  int rows = 0, seqs = 0, tiles = 0, decs = 0, lrows = 0;
};

// PromptKey names a prompt graph: its padded counts and whether every row is plain
// greedy (no general sampling kernel).
struct PromptKey {
  PromptPad pad;
  bool all_greedy = false;
  bool operator<(const PromptKey& o) const {
    return std::tie(pad.rows, pad.seqs, pad.tiles, pad.decs, pad.lrows, all_greedy) <
           std::tie(o.pad.rows, o.pad.seqs, o.pad.tiles, o.pad.decs, o.pad.lrows, o.all_greedy);
  }
};

// PromptGraph is a captured prompt graph and the step that last replayed it.
struct PromptGraph {
  cudaGraphExec_t exec = nullptr;
  int64_t used = 0;
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
  // Tensor parallelism: every sequence plain greedy without guided decoding's mask, or
  // tp_cand_row (the LM head then samples from the ranks' candidates: tp_greedy where
  // all_greedy too, else tp_sample).
  bool all_cand = false;
  bool late = false;           // the sampling waits for gollm_supply_allowed (not enqueued)
  bool chained = false;        // a GOLLM_SEQ_CHAINED sequence: attention after every KV write
};

}  // namespace gollm

namespace gollm {

// Launched is a step launched and not waited for: where its results land and what its
// wait needs.
struct Launched {
  cudaEvent_t done = nullptr;           // recorded after its results' copies
  int s = 0;                            // sequences
  std::vector<char> sample;             // [s]: the sequence samples
  std::vector<CopyOut> copies;          // returned logits, into its hlog
  int64_t logits_len = 0;               // floats the caller's logits must hold
  const void* hin = nullptr;            // its staging (pinned)
  const int32_t* htok = nullptr;
  const float* hlp = nullptr;
  const float* hlog = nullptr;
  // A launch with late_allowed until gollm_supply_allowed: what its sampling needs.
  bool late = false;
  size_t seqs_off = 0;   // its descriptors in the input buffers
  size_t late_off = 0;   // the masks' words in the input buffers
  int64_t late_cap = 0;  // the most words they may take
  size_t samp_seq = 0, samp_row = 0;  // the sampling list in the input buffers
  int samp_count = 0;
  bool all_greedy = false;
  bool padded = false;  // the logits are the LM head's padded rows (late_padded)
};

}  // namespace gollm

namespace gollm {
struct Fp8Lt;  // fp8lt.cuh: cuBLASLt's FP8 GEMMs
}  // namespace gollm
// Fp8LtFree deletes an engine's Fp8Lt (forward.cu, where the type is complete).
struct Fp8LtFree {
  void operator()(gollm::Fp8Lt* lt) const;
};

// gollm_engine: everything one model instance needs besides the weights.
struct gollm_engine {
  gollm_weights* w = nullptr;     // shared weights (one reference held)
  int device = 0;                 // CUDA ordinal
  cudaStream_t stream = nullptr;  // all work of the engine
  cublasHandle_t blas = nullptr;  // bound to stream
  gollm::DevMem blas_ws;          // cuBLAS workspace, fixed so that capture allocates nothing
  gollm::LtGemms gemms;           // the Blas path's GEMMs (cuBLASLt, algorithms per shape)
  gollm::KVGeom geom{};           // pool geometry (scales 1: layer_geom gives a layer's)
  int num_blocks = 0;             // usable KV blocks; block num_blocks is the padding block
  gollm::DevMem kv;               // the pool
  bool kv_fp8 = false;            // the pool holds float8_e4m3fn codes (gollm::kv8)
  std::vector<float> kv_scales;   // FP8: [layers][2] key and value scales
  int max_tokens = 0, max_seqs = 0, max_logit_rows = 0;  // step limits
  int max_len = 0;                // longest sequence served (max_seq_len)
  int sms = 1;                    // multiprocessors, for sizing grids
  int max_parts = 1;              // decode attention: most splits of one row
  bool graphs = true;             // replay CUDA graphs for decode-only steps
  bool pdl = false;               // programmatic dependent launch (sm_90 and later)
  bool bulk = false;              // gemv and MLP weights staged by bulk copies (sm_90 and later)
  bool fused = true;              // decode-only steps of up to kFusedRows rows: fused.cuh's MLP
  bool grouped = true;            // decode attention by KV head (attention_decode_gqa)
  bool invariant = true;          // batch invariance: one projection kernel (tiled) and fixed
                                  // decode-attention splits at every row count
  bool stream_gemv = true;        // few-row steps: gemv_stream
  bool tiled = true;              // steps of up to tiled_rows rows: tiled.cuh's projections
  bool ctx_mma = true;            // context attention by attention_context_mma_kernel
  int tile_blocks = 0;            // the blocks a tiled launch aims at (tile_shape)
  size_t tile_smem = 0;           // the tiled kernels' dynamic shared memory limit
  int tiled_rows = 0;             // the most token rows on the tiled path
  int decode_parts = 0;           // decode attention's splits at every size (0: decode_splits)
#ifdef GOLLM_MEASURE
  int skip = 0;                   // stage kinds left out of every step (gollm_tuning.skip)
#endif
  // gollm_tuning.skip's bit for tensor parallelism's all-reduces (GOLLM_MEASURE builds):
  // NCCL's are left out and the custom one adds and norms the rank's own share alone, so
  // that a step's time without them says what the communication costs.
  static constexpr int kSkipAllReduce = 1 << 30;
  int gemv_rows_max = gollm::kFusedRows;  // most rows on the staged gemv (engine.cu)
  int mlp_k[3] = {};              // mlp_kernel's units per block for 1, 2 and 4 rows
  gollm::DevMem acc;              // fixed-point residual additions of fused steps
  gollm::DevMem fp8_part;         // FP8 projections' split partial sums (fp8.cuh), FP8 models only
  std::unique_ptr<gollm::Fp8Lt, Fp8LtFree> fp8lt;  // many-row FP8 GEMMs by cuBLASLt (fp8lt.cuh), or null
  gollm::DevMem h, xn, qkv, att, tmp, fc, fch, xf, logits, retlog;  // activations
  gollm::DevMem logits_pad;  // the LM head's output rows, 16-byte aligned, where vocab % 4 != 0
  gollm::DevMem partial, part_ml, tickets;      // decode attention split-K
  gollm::DevMem tile_part, tile_tickets;        // the tiled projections' split sums
  gollm::DevMem greedy_part, greedy_tickets;    // greedy sampling split over the vocabulary
  gollm::DevMem din;              // step inputs
  gollm::HostMem hin;             // step inputs, staged
  gollm::DevMem dtok, dlp;        // sampled tokens and log-probabilities
  gollm::HostMem htok, hlp;       // the same, on the host
  gollm::HostMem hlog;            // returned logits, staged
  // The staging of the step launched before the current one (hin, htok, hlp, hlog
  // alternate with these at every launch, so that a launched step's copies never share
  // host memory with the next one's).
  gollm::HostMem alt_hin, alt_htok, alt_hlp, alt_hlog;
  gollm::Launched launched[2];    // launched steps not waited for, oldest at launched_head
  int launched_head = 0, launched_count = 0;
  std::map<int, cudaGraphExec_t> graph_execs;  // decode graphs by batch bucket (×2, +1: all greedy; ×2, +1: late_allowed; ×2, +1: chained; ×2, +1: all_cand)
  // late_padded says the last late step's LM head left its rows padded (lm_head's
  // keep_padded) for the sampling gollm_supply_allowed enqueues; late_padded_keys the
  // same for each late decode graph, captured or replayed.
  bool late_padded = false;
  std::map<int, bool> late_padded_keys;
  // Prompt graphs (steps on the many-rows path, replayed where their padded counts
  // recur): on unless gollm_tuning turns them off; a key is captured the second time it is
  // seen (prompt_seen, cleared when it grows past its bound), at most kPromptGraphs are
  // kept, the least recently replayed (PromptGraph.used: the step) dropped, and captures past
  // the first kPromptGraphs wait for replays (step.cu).
  bool prompt_graphs = false;
  std::map<gollm::PromptKey, gollm::PromptGraph> prompt_execs;
  std::map<gollm::PromptKey, int> prompt_seen;
  int64_t prompt_captures = 0, prompt_replays = 0;
  gollm_engine_info info{};       // as reported at creation
  gollm::Plan plan;               // reused between steps
  gollm::FailStep fail;           // the step gollm_faults makes fail
  std::string fail_alloc;         // gollm_faults.fail_alloc, for the steps' allocations
  int64_t steps = 0;              // gollm_step calls so far (the warm-up's not counted)
  // The whole vocabulary: tokens, returned logits and sampling. Under tensor parallelism
  // w->cfg.vocab_size is this rank's rows of the embedding and LM head; else the same.
  int vocab = 0;
  // Tensor parallelism (tp_size > 1): the communicators (a reference held) and this
  // engine's rank. Its steps all-reduce the embedding and each layer's two row-parallel
  // projections, and all-gather the LM head's rows into tp_gather ([tp_size][R][vocab
  // rows]), joined into tp_logits ([R][vocab]); every rank samples the same tokens.
  gollm_comm* comm = nullptr;
  int tp_rank = 0, tp_size = 1;
  gollm::DevMem tp_gather, tp_logits;
  // The custom all-reduce (allreduce.cu): on where the communicators have peer buffers and
  // the tuning leaves it on, for payloads up to ar_bytes; a peer's flag waited for up to
  // ar_timeout_ns.
  bool ar = false;
  bool tp_cands = false;  // decode steps sample from the ranks' candidates (tp_greedy, tp_sample)
  size_t ar_bytes = 0;
  size_t ar_two_bytes = 0;  // payloads from this size on take the two-shot (0: none)
  unsigned long long ar_timeout_ns = 0;
  gollm::MoeBufs moe;             // the mixture-of-experts stage's buffers (moe.cu)
};

namespace gollm {

// layer_geom is the pool's geometry with layer's key and value scales (an FP8 pool's), as
// the kernels that write or read that layer's keys and values take it.
inline KVGeom layer_geom(const gollm_engine* e, int layer) {
  KVGeom g = e->geom;
  if (e->kv_fp8) {
    g.fp8 = 1;
    g.kscale = e->kv_scales[2 * (size_t)layer];
    g.vscale = e->kv_scales[2 * (size_t)layer + 1];
  }
  return g;
}

// kv_elem_bytes is the bytes of one element of e's pool.
inline size_t kv_elem_bytes(const gollm_engine* e) { return e->kv_fp8 ? 1 : 2; }

}  // namespace gollm

namespace gollm {

// weights.cu
void create_weights(const gollm_weights_params* p, gollm_weights** out);
// check_recipe refuses a recipe the forward pass cannot walk, naming the stage.
void check_recipe(const gollm_weights_params* p);
void release_weights(gollm_weights* w);

// engine.cu
void create_engine(gollm_weights* w, const gollm_engine_params* p, gollm_engine** out,
                   gollm_engine_info* info);
void destroy_engine(gollm_engine* e);

// moe.cu: create_moe sizes the mixture-of-experts stage's buffers (none without a MOE
// stage) and turns the fused MLP off for such a model; it returns their bytes.
size_t create_moe(gollm_engine* e);
// drop_graphs destroys the engine's decode graphs (through its communicator's registry
// when it has one).
void drop_graphs(gollm_engine* e);

// plan.cu
void build_plan(gollm_engine* e, const gollm_step_in* in, int64_t logits_len, Plan& pl);
bool prompt_pad(const gollm_engine* e, const gollm_step_in* in, const Plan& pl, PromptPad& pp);
void fill_plan(gollm_engine* e, const gollm_step_in* in, int bucket, const PromptPad* pp,
               Plan& pl);
Layout layout_fixed(const Plan& pl);
void fill_var(gollm_engine* e, const gollm_step_in* in, Plan& pl, Layout& L);
void ensure_inputs(gollm_engine* e, size_t bytes);
void stage(gollm_engine* e, const Plan& pl, const Layout& L);

// forward.cu
void run_forward(gollm_engine* e, const Plan& pl, const Layout& L, int parts, bool capture);
int attention_splits(const gollm_engine* e, int rows, int max_len);
int warmup_gemms(gollm_engine* e);
// forward.cu: create_fp8lt sets up cuBLASLt's FP8 GEMMs for an FP8 model on Hopper (none
// elsewhere, nor where off: GOLLM_TUNING_NO_BLASLT), returning the bytes it allocated.
size_t create_fp8lt(gollm_engine* e, bool off);
// feed_tokens writes the fed rows' tokens (n (row, previous sequence) pairs at pairs_off
// of the device inputs) from the previous step's sampled tokens.
void feed_tokens(gollm_engine* e, const Layout& L, size_t pairs_off, int n);
// sample_late enqueues the sampling of launch l (late_allowed) over the logits its forward
// pass left, its inputs uploaded.
void sample_late(gollm_engine* e, const Launched& l);
void setup_kernels(gollm_engine* e);
// residual_norm is the residual add and RMSNorm a step without the custom all-reduce runs
// after NCCL's (residual_layernorm), for gollm_allreduce_bench.
template <typename T>
void residual_norm(float* h, const float* a, const float* bias, T* xn, const float* gamma, int n,
                   int hidden, float eps, cudaStream_t st);

// step.cu
// step runs one step; inject makes it fail after its forward pass is enqueued (faults.cu).
void step(gollm_engine* e, const gollm_step_in* in, gollm_step_out* out, bool inject = false);
// launch enqueues a step (gollm_launch); wait_step waits for the oldest (gollm_wait);
// drop_launched forgets every launched step (after a failure).
void launch(gollm_engine* e, const gollm_step_in* in, int64_t logits_len, bool inject = false);
void wait_step(gollm_engine* e, gollm_step_out* out);
void drop_launched(gollm_engine* e);
// supply_allowed completes a launch with late_allowed (gollm_supply_allowed).
void supply_allowed(gollm_engine* e, const int32_t* offsets, int32_t num_seqs,
                    const uint32_t* allowed, int64_t num_allowed);
void warmup(gollm_engine* e, gollm_engine_info& inf);

// comm.cu: a step's collectives on the engine's stream (each holds the communicators'
// guard and fails with GOLLM_ERR_NCCL once they were aborted), the replay of a graph that
// holds collectives, and the check after a step's wait (aborted, or NCCL's asynchronous
// error).
void tp_all_reduce(gollm_engine* e, float* buf, size_t count, const char* what, int layer);
void tp_all_gather(gollm_engine* e, const float* send, float* recv, size_t count);
void tp_graph_launch(gollm_engine* e, cudaGraphExec_t g);
void tp_check(gollm_engine* e);

// allreduce.cu: ar_fits says whether the engine's custom all-reduce takes rows x hidden of
// psize-byte payload (within allreduce_bytes counted at 2 bytes an element); tp_reduce_norm
// enqueues it (allreduce.cuh's ar_norm_kernel, or ar_two_kernel from ar_two_bytes on: h =
// (h + Σ part) + bias, or Σ part without add, and xn its norm; the payload fp32 with f32,
// else T); ar_error words a rank's error word; allreduce_bench is gollm_allreduce_bench.
bool ar_fits(const gollm_engine* e, int rows, int hidden, size_t psize);
template <typename T>
void tp_reduce_norm(gollm_engine* e, const float* part, float* h, const float* bias, T* xn,
                    const float* gamma, const float* beta, int rows, int hidden, float eps,
                    bool rms, bool add, bool f32);
// tp_greedy samples a decode step's plain greedy rows from each rank's LM head rows (part,
// [entries' rows][vr]) without gathering them (allreduce.cuh's ar_greedy_kernel).
void tp_greedy(gollm_engine* e, const float* part, const int32_t* samp_seq, const int32_t* samp_row,
               int entries, int vr);
// tp_cand_row says whether a sequence's row may be sampled from the ranks' candidates
// (sampled, 1 < top_k ≤ 64, nothing that reads the whole row: bias, penalties, masks,
// guided decoding, returned logits); tp_cand_fits whether a step of entries rows may;
// tp_sample samples such a decode step (allreduce.cuh's ar_cand_kernel and
// ar_cand_sample_kernel), greedy rows among them too.
bool tp_cand_row(const DevSeq& sq);
bool tp_cand_fits(const gollm_engine* e, int entries);
void tp_sample(gollm_engine* e, const float* part, const int32_t* samp_seq, const int32_t* samp_row,
               const DevSeq* seqs, int entries, int vr);
std::string ar_error(const PeerBufs& p, int rank, int word, unsigned long long timeout_ns);
void allreduce_bench(gollm_comm* c, const gollm_allreduce_params* p, gollm_allreduce_result* out);

// faults.cu
FailStep fail_step_of(const gollm_faults& f);
// fail_this_step says whether the engine's current step is the one its gollm_faults make
// fail.
bool fail_this_step(const gollm_engine* e);
void maybe_fail_alloc(size_t n, const char* what);
[[noreturn]] void inject_step_fault(gollm_engine* e);
void reset_engine(gollm_engine* e);
void device_info(int32_t device, gollm_device_info* out);

}  // namespace gollm

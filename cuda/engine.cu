// engine.cu — creating an engine on shared weights (stream, cuBLAS, scratch buffers sized
// for the step limits, the paged KV pool, the kernels' shared-memory limits, the warm-up)
// and destroying it.
#include <cmath>
#include <exception>
#include <memory>

#include "internal.h"

namespace gollm {

void drop_graphs(gollm_engine* e) {
  std::vector<cudaGraphExec_t> gs;
  for (auto& g : e->graph_execs) gs.push_back(g.second);
  for (auto& g : e->prompt_execs) gs.push_back(g.second.exec);
  e->graph_execs.clear();
  e->prompt_execs.clear();
  std::exception_ptr first;
  for (cudaGraphExec_t g : gs) {
    try {
      // A tensor-parallel engine's are the communicator's too (an abort destroys them).
      if (e->comm)
        comm_graph_drop(e->comm, g);
      else
        CUDA_CHECK(cudaGraphExecDestroy(g));
    } catch (const Error&) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void destroy_engine(gollm_engine* e) {
  if (!e) return;
  cudaSetDevice(e->device);
  if (e->stream) cudaStreamSynchronize(e->stream);
  try {
    drop_graphs(e);
  } catch (const Error&) {
    cudaGetLastError();  // destroying: nothing to report to
  }
  for (auto& l : e->launched)
    if (l.done) cudaEventDestroy(l.done);
  if (e->blas) cublasDestroy(e->blas);
  gollm_weights* w = e->w;
  gollm_comm* comm = e->comm;
  cudaStream_t s = e->stream;
  delete e;  // frees the buffers before the stream goes
  if (s) cudaStreamDestroy(s);
  release_weights(w);
  release_comm(comm);
}

namespace {

// Arrival tells the other ranks, when this rank's creation fails before it proposed its
// KV pool's size, not to wait for it.
struct Arrival {
  gollm_comm* c = nullptr;
  int rank = 0;
  bool done = false;
  ~Arrival() {
    if (c && !done) comm_abandon(c, rank);
  }
};

// check_tuning refuses a gollm_tuning field out of its range, naming it.
void check_tuning(const gollm_tuning& t) {
  if (t.gemv_rows < -1 || t.gemv_rows > kGemvMaxRows)
    invalid("tuning.gemv_rows %d must be -1 or in [0, %d]", t.gemv_rows, kGemvMaxRows);
  if (t.tiled_rows < -1 || t.tiled_rows > kTileMaxRows)
    invalid("tuning.tiled_rows %d must be -1 or in [0, %d]", t.tiled_rows, kTileMaxRows);
  if (t.tile_blocks < 0 || t.tile_blocks > 4)
    invalid("tuning.tile_blocks %d must be in [0, 4]", t.tile_blocks);
  if (t.decode_parts < 0 || t.decode_parts > 16)
    invalid("tuning.decode_parts %d must be in [0, 16]", t.decode_parts);
  if (t.allreduce_bytes < 0 || (size_t)t.allreduce_bytes > kArMaxBytes)
    invalid("tuning.allreduce_bytes %d must be in [0, %zu]", t.allreduce_bytes, kArMaxBytes);
  if (t.allreduce_two_bytes > 0 && (size_t)t.allreduce_two_bytes > kArMaxBytes)
    invalid("tuning.allreduce_two_bytes %d must be at most %zu (negative: never)", t.allreduce_two_bytes, kArMaxBytes);
  if (t.allreduce_timeout_ms < 0 || t.allreduce_timeout_ms > 600000)
    invalid("tuning.allreduce_timeout_ms %d must be in [0, 600000]", t.allreduce_timeout_ms);
#ifndef GOLLM_MEASURE
  if (t.skip != 0)
    invalid("tuning.skip %d: this library was built without GOLLM_MEASURE, which leaving stages "
            "out needs",
            t.skip);
#endif
}

}  // namespace

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
  const gollm_model_config& c = w->cfg;
  if (p->max_seq_len < 0 || p->max_seq_len > c.max_positions || p->max_seq_len > 32768)
    invalid("max_seq_len %d must be in [0, min(max_positions %d, 32768)]", p->max_seq_len,
            c.max_positions);
  check_tuning(p->tuning);
  if (p->kv_dtype != 0 && p->kv_dtype != w->dtype && p->kv_dtype != GOLLM_DTYPE_F8E4M3)
    invalid("kv_dtype %d must be 0 or the weights' dtype %d (the compute type) or "
            "GOLLM_DTYPE_F8E4M3 (%d)",
            p->kv_dtype, w->dtype, GOLLM_DTYPE_F8E4M3);
  if (p->kv_dtype == GOLLM_DTYPE_F8E4M3 && p->kv_scales)
    for (int i = 0; i < 2 * c.layers; i++) {
      const float v = p->kv_scales[i];
      if (!(v > 0.f) || !std::isfinite(v))
        invalid("kv_scales[%d] (layer %d's %s scale) %g is not a finite positive number", i, i / 2,
                i % 2 ? "value" : "key", v);
    }
  if (p->mem_budget < 0) invalid("mem_budget %lld must not be negative", (long long)p->mem_budget);
  gollm_comm* comm = p->comm;
  if (comm) {
    const int n = comm->n;
    if (p->tp_rank < 0 || p->tp_rank >= n)
      invalid("tp_rank %d outside the communicator's %d ranks", p->tp_rank, n);
    if (comm->devices[p->tp_rank] != w->device)
      invalid("tensor parallel rank %d: the weights are on device %d, the communicator's rank %d on "
              "device %d",
              p->tp_rank, w->device, p->tp_rank, comm->devices[p->tp_rank]);
    if (p->tp_vocab < 1 || (p->tp_vocab + n - 1) / n != c.vocab_size)
      invalid("tensor parallel rank %d: a vocabulary of %d over %d ranks is %d rows a rank, but the "
              "weights hold %d",
              p->tp_rank, p->tp_vocab, n, p->tp_vocab > 0 ? (p->tp_vocab + n - 1) / n : 0, c.vocab_size);
  } else if (p->tp_rank != 0 || (p->tp_vocab != 0 && p->tp_vocab != c.vocab_size)) {
    invalid("tp_rank %d and tp_vocab %d need a communicator (comm is NULL)", p->tp_rank, p->tp_vocab);
  }
  // A share of the experts alone would sum only its own experts into every MoE layer.
  if (held_experts(c) != c.experts && !(comm && comm->n > 1))
    invalid("config: local_experts %d of %d experts needs a communicator of 2 or more ranks",
            c.local_experts, c.experts);
  const FailStep fail = fail_step_of(p->faults);
  AllocFault af(p->faults.fail_alloc);
  DeviceGuard dg(w->device);
  const Dims d(c);
  std::unique_ptr<gollm_engine, void (*)(gollm_engine*)> e(new gollm_engine, destroy_engine);
  // Once the rank is claimed, a failure before the KV pool's agreement lets the other
  // ranks go (destroyed before e, which may hold the last reference to comm).
  Arrival arrival;
  w->refs.fetch_add(1);
  e->w = w;
  e->device = w->device;
  e->vocab = comm ? p->tp_vocab : c.vocab_size;
  if (comm) {
    comm_claim(comm, p->tp_rank);
    comm->refs.fetch_add(1);
    e->comm = comm;
    e->tp_rank = p->tp_rank;
    e->tp_size = comm->n;
    arrival.c = comm;
    arrival.rank = p->tp_rank;
  }
  const bool tp = e->tp_size > 1;
  const gollm_tuning& tn = p->tuning;
  e->graphs = p->cuda_graphs != 0;
  // Prompt graphs, on one GPU (NCCL sets up a collective's size on its first use, which a
  // capture must not do; the decode graphs' warm-up runs each size once first).
  e->prompt_graphs = e->graphs && !comm && !(tn.off & GOLLM_TUNING_NO_PROMPT_GRAPHS);
  e->fail = fail;
  if (p->faults.fail_alloc) e->fail_alloc = p->faults.fail_alloc;
  e->max_tokens = p->max_tokens;
  e->max_seqs = p->max_seqs;
  e->max_logit_rows = std::max(p->max_logit_rows, p->max_seqs);
  e->max_len = p->max_seq_len > 0 ? p->max_seq_len : std::min(c.max_positions, 8192);
  e->geom = KVGeom{c.layers, c.heads, c.kv_heads, c.head_dim, p->tokens_per_block};
  if (p->kv_dtype == GOLLM_DTYPE_F8E4M3) {
    // Scales by value: each layer's pair travels in its launches' KVGeom (layer_geom), so
    // graphs capture them; nothing on the device.
    e->kv_fp8 = true;
    e->kv_scales.assign(2 * (size_t)c.layers, 1.f);
    if (p->kv_scales) e->kv_scales.assign(p->kv_scales, p->kv_scales + 2 * (size_t)c.layers);
  }
  e->max_parts = 16;
  {
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, w->device));
    e->sms = std::max(1, sms);
    int major = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, w->device));
    e->pdl = major >= 9 && !(tn.off & GOLLM_TUNING_NO_PDL);
    e->bulk = major >= 9 && !(tn.off & GOLLM_TUNING_NO_BULK);
    e->grouped = !(tn.off & GOLLM_TUNING_NO_GROUPED) && gqa_decode_fits(c.head_dim);
    // The few-row kernels serve tensor-parallel ranks too: their projections into the
    // residual width then write fp32 outputs that the all-reduce adds (forward.cu). The
    // fused MLP adds into the residual stream itself, which a rank's share must not.
    e->stream_gemv = !(tn.off & GOLLM_TUNING_NO_STREAM);
    // The tiled projections win over cuBLAS on narrow models only, up to 16 rows
    // (bench/results/2026-11-26-tiled-h100.jsonl).
    e->tiled_rows = tn.tiled_rows >= 0 ? tn.tiled_rows : c.hidden <= 1024 ? 16 : 0;
    e->tile_blocks = (tn.tile_blocks > 0 ? tn.tile_blocks : 1) * e->sms;
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, w->device));
    // Less the tiled kernel's static shared memory (its rows' KV offsets and positions,
    // the ticket's flag), with room to spare.
    e->tile_smem = optin > 2048 ? (size_t)optin - 2048 : 0;
    e->decode_parts = tn.decode_parts;
    e->ctx_mma = !(tn.off & GOLLM_TUNING_NO_CTX_MMA);
#ifdef GOLLM_MEASURE
    e->skip = tn.skip;
#endif
    // Batch invariance takes the tiled projections for every step: widths whose rows are
    // not whole chunks of 32 columns (odd test shapes) cannot, nor FP8 weights, whose gemv
    // and tensor-core kernels (fp8.cuh) part by row count; those run without it.
    bool dense = false;  // a dense MLP layer (the experts' widths are the MoE kernels')
    for (const Stage& s : w->recipe) dense = dense || s.s.kind == GOLLM_STAGE_MLP;
    const bool widths = tiled_fits(1, c.hidden) && (!dense || tiled_fits(1, c.inner)) &&
                        tiled_fits(1, c.heads * c.head_dim);
    e->invariant =
        !(tn.off & GOLLM_TUNING_NO_INVARIANT) && !(tn.off & GOLLM_TUNING_NO_TILED) && widths && !w->fp8;
    if (e->invariant) e->tiled_rows = kTileMaxRows;
    e->tiled = !(tn.off & GOLLM_TUNING_NO_TILED) && e->tiled_rows > 0 && widths;
    e->fused = !tp && !(tn.off & GOLLM_TUNING_NO_FUSED) && c.hidden % 8 == 0 && c.inner % 8 == 0;
    // Every rank decides alike (the same tuning and shapes), so that the ranks' custom
    // all-reduces pair up.
    e->ar = tp && comm->peer && !(tn.off & GOLLM_TUNING_NO_CUSTOM_AR) && c.hidden % 8 == 0;
    e->ar_bytes = tn.allreduce_bytes > 0 ? (size_t)tn.allreduce_bytes : kArDefaultBytes;
    // The two-shot only where tuning asks for it: the one-shot measured faster at every
    // payload up to 8 MiB at 2 and 4 ranks (bench/results/2026-11-28-tp-h200x4.jsonl).
    e->ar_two_bytes = tn.allreduce_two_bytes > 0 ? (size_t)tn.allreduce_two_bytes : 0;
    e->tp_cands = e->ar && !(tn.off & GOLLM_TUNING_NO_TP_CANDIDATES);
    e->ar_timeout_ns = (unsigned long long)(tn.allreduce_timeout_ms > 0 ? tn.allreduce_timeout_ms : kArTimeoutMs) * 1000000ull;
    // The staged gemv wins over cuBLAS on narrow models only, up to 4 rows
    // (bench/results/2026-11-21-gpu-h200.jsonl); wider ones take the streaming gemv.
    e->gemv_rows_max = tn.gemv_rows >= 0 ? tn.gemv_rows : c.hidden <= 1024 ? kFusedRows : 0;
  }
  CUDA_CHECK(cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&e->blas));
  CUBLAS_CHECK(cublasSetStream(e->blas, e->stream));
  const size_t ws = 32u << 20;
  e->blas_ws.alloc(ws, "cuBLAS workspace");
  CUBLAS_CHECK(cublasSetWorkspace(e->blas, e->blas_ws.p, ws));
  CUBLAS_CHECK(cublasSetMathMode(e->blas, CUBLAS_DEFAULT_MATH));
  e->gemms.init(e->device, e->blas, e->stream, e->blas_ws.p, ws,
                (p->tuning.off & GOLLM_TUNING_NO_BLASLT) != 0);

  const size_t N = e->max_tokens, S = e->max_seqs, R = e->max_logit_rows;
  // GEMM operands hold gemm_rows(max) rows: cuBLAS runs on padded row counts.
  const size_t NG = gemm_rows((int)N), RG = gemm_rows((int)R);
  e->h.alloc(N * d.H * 4, "residual stream");
  e->xn.alloc(NG * d.H * 2, "norm output");
  e->qkv.alloc(NG * d.qkv * 4, "QKV");
  e->att.alloc(NG * d.att * 2, "attention output");
  e->tmp.alloc(NG * d.H * 4, "projection output");
  e->fc.alloc(NG * d.up * 4, "MLP inner");
  e->fch.alloc(NG * d.I * 2, "MLP activation");
  e->xf.alloc(RG * d.H * 2, "LM head input");
  // d.V is this rank's LM-head rows under tensor parallelism (else the vocabulary).
  e->logits.alloc(RG * d.V * 4, "logits");
  if (lm_head_ld(d.V) != d.V) e->logits_pad.alloc(RG * lm_head_ld(d.V) * 4, "logits (aligned rows)");
  e->retlog.alloc(R * (size_t)e->vocab * 4, "returned logits");
  if (tp) {
    e->tp_gather.alloc((size_t)e->tp_size * R * d.V * 4, "gathered logits (tensor parallel)");
    e->tp_logits.alloc(R * (size_t)e->vocab * 4, "joined logits (tensor parallel)");
  }
  const size_t dec = std::min(N, S);
  e->partial.alloc(dec * c.heads * e->max_parts * c.head_dim * 4, "attention partials");
  e->part_ml.alloc(dec * c.heads * e->max_parts * 2 * 4, "attention partial stats");
  e->tickets.alloc(dec * c.heads * 4, "attention tickets");
  e->acc.alloc((size_t)kFusedRows * d.H * 8, "residual additions");
  // FP8 projections split their columns where a step's row tiles are few: partial sums of
  // up to 8 splits of 64 rows of the widest projection (fp8.cuh's fp8_splits fits them in).
  if (w->fp8)
    e->fp8_part.alloc((size_t)8 * std::min<size_t>(NG, 64) * std::max<size_t>({(size_t)d.qkv, (size_t)d.up, (size_t)d.H}) * 4,
                      "FP8 split partial sums");
  CUDA_CHECK(cudaMemsetAsync(e->tickets.p, 0, e->tickets.bytes, e->stream));
  if (e->tiled) {
    // The tiled projections: QKV, output, gate and up, down (their weight rows, columns),
    // and under batch invariance the LM head.
    const int64_t rows[5] = {d.qkv, d.H, d.up, d.H, e->invariant ? (int64_t)d.V : 0};
    const int cols[5] = {d.H, d.att, d.H, d.I, d.H};
    size_t pf = 0;
    int tiles = 1;
    for (int i = 0; i < 5; i++) {
      if (rows[i] <= 0 || !tiled_fits(1, cols[i])) continue;  // a projection no step runs tiled
      const TileShape s = tile_shape(rows[i], cols[i], e->tile_blocks);
      pf = std::max(pf, tile_part_floats(s));
      // Tiles of 64 weight rows where a device's shared memory takes no wider ones.
      tiles = std::max(tiles, (int)((rows[i] + kTileSlots - 1) / kTileSlots));
    }
    if (pf) e->tile_part.alloc(pf * 4, "tiled projections' partial sums");
    e->tile_tickets.alloc((size_t)tiles * 4, "tiled projections' tickets");
    CUDA_CHECK(cudaMemsetAsync(e->tile_tickets.p, 0, e->tile_tickets.bytes, e->stream));
  }
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
  e->alt_hin.alloc(in_bytes, "step inputs (host)");
  e->alt_htok.alloc(S * 4, "sampled tokens (host)");
  e->alt_hlp.alloc(S * 4, "log-probabilities (host)");
  const size_t moe_bytes = create_moe(e.get()) +
                           create_fp8lt(e.get(), (p->tuning.off & GOLLM_TUNING_NO_BLASLT) != 0);
  setup_kernels(e.get());
  size_t scratch = moe_bytes + e->h.bytes + e->xn.bytes + e->qkv.bytes + e->att.bytes + e->tmp.bytes +
                   e->fc.bytes + e->fch.bytes + e->xf.bytes + e->logits.bytes +
                   e->logits_pad.bytes + e->retlog.bytes +
                   e->partial.bytes + e->part_ml.bytes + e->tickets.bytes + e->din.bytes +
                   e->tile_part.bytes + e->tile_tickets.bytes +
                   e->dtok.bytes + e->dlp.bytes + e->blas_ws.bytes + e->acc.bytes + e->fp8_part.bytes +
                   e->tp_gather.bytes + e->tp_logits.bytes;

  // A block holds, for every layer, the keys and values of the KV heads only: two bytes
  // an element, one in an FP8 pool (twice the blocks from the same memory).
  const size_t block_bytes =
      (size_t)p->tokens_per_block * c.layers * 2 * c.kv_heads * c.head_dim * kv_elem_bytes(e.get());
  int64_t nb = p->num_blocks;
  if (nb == 0 && p->mem_budget > 0) {
    // gpu_memory_utilization: the pool gets what the scratch leaves of the budget.
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const int64_t left = p->mem_budget - (int64_t)scratch;
    nb = left / (int64_t)block_bytes - 1;
    char buf[384];
    if (nb < 1) {
      std::snprintf(buf, sizeof buf,
                    "KV pool: a budget of %lld bytes less %zu bytes of scratch buffers holds no "
                    "block of %zu bytes",
                    (long long)p->mem_budget, scratch, block_bytes);
      throw Error(GOLLM_ERR_OUT_OF_MEMORY, buf);
    }
    nb = std::min<int64_t>(nb, 1 << 30);
    if ((size_t)(nb + 1) * block_bytes > free_b) {
      std::snprintf(buf, sizeof buf,
                    "KV pool: %zu bytes (a budget of %lld bytes less %zu bytes of scratch) but "
                    "%zu bytes are free on device %d",
                    (size_t)(nb + 1) * block_bytes, (long long)p->mem_budget, scratch, free_b,
                    w->device);
      throw Error(GOLLM_ERR_OUT_OF_MEMORY, buf);
    }
  } else if (nb == 0) {
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
  if (comm) {
    // One block table serves every rank: each pool gets the fewest blocks any rank can
    // hold (a rank holds its KV heads' share of every block).
    nb = comm_agree_min(comm, p->tp_rank, nb);
    arrival.done = true;
  }
  e->num_blocks = (int)nb;
  e->kv.alloc((size_t)(nb + 1) * block_bytes, "KV pool");  // + the padding block
  // No rank starts the warm-up's collectives while another still allocates (step.cu's
  // launch says why).
  if (tp) comm_barrier(comm, p->tp_rank);

  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, e->device));
  gollm_engine_info& inf = e->info;
  inf.num_blocks = e->num_blocks;
  inf.tokens_per_block = p->tokens_per_block;
  inf.weight_bytes = (int64_t)w->arena.bytes;
  inf.kv_bytes = (int64_t)e->kv.bytes;
  inf.scratch_bytes = (int64_t)scratch;
  inf.max_seq_len = e->max_len;
  std::snprintf(inf.device_name, sizeof inf.device_name, "%s", prop.name);
  CUDA_CHECK(cudaStreamSynchronize(e->stream));
  if (p->warmup) warmup(e.get(), inf);
  if (info) *info = inf;
  *out = e.release();
}

}  // namespace gollm

// forward.cu — the forward pass of one step, driven by the architecture descriptor, and
// every other kernel launch (sampling, the warm-up's GEMMs, the kernels' set-up). The one
// file that includes the kernels: each is compiled, registered and given its shared-memory
// limit here alone.
//
// A layer is: norm → QKV projection (+ bias) → rotary on queries and keys where the model
// has it → keys and values into the paged pool → causal attention (through each query
// head's KV head, within the layer's sliding window) → output projection (+ bias) into the
// residual stream → norm → MLP (act(up), or act(gate) · up) → down projection into the
// residual stream. Few rows take the gemv kernels with their neighbours fused; decode steps
// of up to kFusedRows rows take the one-kernel MLP; the rest take cuBLAS.
//
// Under tensor parallelism (a rank's share of the weights: its heads, MLP units and
// vocabulary rows) every step takes the cuBLAS path, and the rank all-reduces (NCCL, on
// the step's stream, inside the decode graphs too) the fp32 outputs of its row-parallel
// projections — the embedding's lookups, each layer's attention output and MLP output —
// before the residual add and norm that follow them run unchanged on every rank; the LM
// head's rows are all-gathered and joined into whole-vocabulary logits, which every rank
// samples alike.
#include "activation.cuh"
#include "attention.cuh"
#include "embedding.cuh"
#include "fused.cuh"
#include "gemv.cuh"
#include "internal.h"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "parallel.cuh"
#include "sampling.cuh"
#include "tiled.cuh"

namespace gollm {

namespace {

// A step's cuBLAS calls on the engine's buffers, for m rows (gemm_rows of the step's): a
// layer's QKV, output projection, MLP up and MLP down, and the LM head over xf. forward
// and the warm-up both make them, so the warm-up meets exactly a step's shapes.
template <typename T>
void gemm_qkv(gollm_engine* e, const LayerW& lw, int m) {
  const Dims d(e->w->cfg);
  matmul_xwt<T>(e->blas, e->xn.as<T>(), static_cast<const T*>(lw.qkv_w), e->qkv.as<float>(), m, d.H, d.qkv);
}
template <typename T>
void gemm_proj(gollm_engine* e, const LayerW& lw, int m) {
  const Dims d(e->w->cfg);
  matmul_xwt<T>(e->blas, e->att.as<T>(), static_cast<const T*>(lw.out_w), e->tmp.as<float>(), m, d.att, d.H);
}
template <typename T>
void gemm_up(gollm_engine* e, const LayerW& lw, int m) {
  const Dims d(e->w->cfg);
  matmul_xwt<T>(e->blas, e->xn.as<T>(), static_cast<const T*>(lw.up_w), e->fc.as<float>(), m, d.H, d.up);
}
template <typename T>
void gemm_down(gollm_engine* e, const LayerW& lw, int m) {
  const Dims d(e->w->cfg);
  matmul_xwt<T>(e->blas, e->fch.as<T>(), static_cast<const T*>(lw.down_w), e->tmp.as<float>(), m, d.I, d.H);
}
// The LM head's GEMM runs over lm_head_ld(V) rows of weights (zero past V): where V is not
// a multiple of 4 (GPT-2's 50,257) cuBLAS otherwise takes a slow kernel (H100, GPT-2 b64:
// 107 µs, 0.9 TB/s). Its output rows then go to logits_pad, and unpad_rows moves them into
// logits.
template <typename T>
void gemm_lm_head(gollm_engine* e, int m) {
  const Dims d(e->w->cfg);
  float* y = e->logits_pad.p ? e->logits_pad.as<float>() : e->logits.as<float>();
  matmul_xwt<T>(e->blas, e->xf.as<T>(), static_cast<const T*>(e->w->lm_head), y, m, d.H,
                lm_head_ld(d.V));
}

// stream_rows is the most rows a step takes the streaming gemv for, on a model of hidden
// width H — where it beat the other paths on an H100, alternating in one lease: 1 row (GPT-2
// 0.31 -> 0.28 ms/token, GPT-350M b1 i128 o8 6.7 -> 5.5 ms, the TinyLlama shape 1.43 -> 1.08,
// Llama-2-7B 6.34 -> 5.14, against the staged gemv or cuBLAS), 2 rows (TinyLlama 1.38 ->
// 1.16, Llama-2-7B 5.89 -> 5.36), and 4 rows of a narrow model (GPT-2 0.46 -> 0.42); wide
// models at 4 rows stay on cuBLAS (TinyLlama 1.40 against 1.45 streamed).
inline int stream_rows(int H) { return H <= 1024 ? 4 : 2; }

// gemv_any runs a few-row projection on the streaming gemv or the staged one.
template <typename T, int IN, int OUT>
void gemv_any(const GemvArgs& a, int sms, bool streamed, Stream st) {
  if (streamed)
    gemv_stream<T, IN, OUT>(a, sms, st);
  else
    gemv<T, IN, OUT>(a, sms, st);
}

// GOLLM_CUDA_SKIP's bits: the kernels a step leaves out, so that a step's time without
// them says what they cost in place (in a graph, with their neighbours' overlap), which
// ncu's serialized figures do not. The results are wrong; for measuring alone.
constexpr int kSkipQKV = 1, kSkipAttn = 2, kSkipOut = 4, kSkipUp = 8, kSkipDown = 16,
              kSkipNorm = 32, kSkipHead = 64, kSkipSample = 128, kSkipKV = 256, kSkipAct = 512;

// forward enqueues the whole step on the engine's stream: the layers, then per chunk the
// LM head, the sampling and (eager mode) the logits copies. In graph mode it is captured.
template <typename T>
void forward(gollm_engine* e, const Plan& pl, const Layout& L, int parts, bool capture) {
  gollm_weights* w = e->w;
  const gollm_model_config& c = w->cfg;
  const Dims d(c);
  // V is the whole vocabulary (logits, sampling); VR the LM head's rows on this GPU (this
  // rank's under tensor parallelism, else V).
  const int N = pl.n, H = d.H, V = e->vocab, VR = d.V;
  const bool tp = e->tp_size > 1;
  const int NG = gemm_rows(N);  // cuBLAS's row count (the rows past N are never read)
  const float eps = c.norm_eps;
  const bool rms = c.norm == GOLLM_NORM_RMS;
  const float* inv_freq = c.positions == GOLLM_POS_ROTARY ? w->inv_freq : nullptr;
  // Kernels after the first may overlap their predecessor's tail (sm_90); not a kernel
  // after a collective (stc), whose kernels are NCCL's own: nothing of it to overlap.
  const Stream st0(e->stream, false), st(e->stream, e->pdl);
  const Stream stc = e->tp_size > 1 ? st0 : st;
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

  // Few rows: gemv kernels with their neighbours fused, reading the weights once (decode at
  // small batch). Up to stream_rows(H) rows take the streaming gemv, whose warps read their
  // weight rows straight into registers; the rest of the few-row steps keep the staged gemv
  // and one-kernel MLP (narrow models, hidden up to 1024; their passes through shared
  // memory keep too few bytes in flight for wider ones) or cuBLAS.
  auto chunks_ok = [&] {
    return pl.chunks.size() <= 1 && (pl.chunks.empty() || pl.chunks[0].count <= kGemvMaxRows);
  };
  const bool streamed = e->stream_gemv && N <= stream_rows(H) && gemv_stream_fits(N, H) &&
                        gemv_stream_fits(N, d.I) && gemv_stream_fits(N, d.att) && chunks_ok();
  const bool small = streamed || (!tp && N <= e->gemv_rows_max && gemv_fits(N, H) &&
                                  gemv_fits(N, d.I) && gemv_fits(N, d.att) && chunks_ok());
  // Decode-only steps of few rows: four kernels a layer (five with rotary), the MLP in one
  // (fused.cuh) with the residual stream's additions in fixed point.
  const bool fused = small && !streamed && e->fused && pl.tiles.empty() &&
                     (int)pl.dec_rows.size() == N &&
                     N <= kFusedRows;
  unsigned long long* acc = fused ? e->acc.as<unsigned long long>() : nullptr;
  // Steps of up to tiled_rows rows that the gemv kernels do not take (engine.cu: 16 on
  // models up to 1024 wide): the tiled projections (tensor cores, epilogues fused)
  // instead of cuBLAS.
  const bool tiled = !small && e->tiled && N <= e->tiled_rows && tiled_fits(N, H);
  float* tpart = e->tile_part.as<float>();
  int* ttick = e->tile_tickets.as<int>();
  const bool few_dec = (int)pl.dec_rows.size() <= kFusedRows;
  auto on = [&](int bit) { return (e->skip & bit) == 0; };
  if (tp) {
    // Each rank looks its vocabulary rows up (rank 0 adds the positions); the all-reduce
    // adds the shares, then layer 0's norm.
    embedding_shard<T>(I32(L.row_tok), I32(L.row_pos), static_cast<const T*>(w->embed),
                       e->tp_rank == 0 ? static_cast<const T*>(w->pos) : nullptr, h, N, H,
                       e->tp_rank * VR, VR, st0);
    tp_all_reduce(e, h, (size_t)N * H, "the embedding", -1);
    norm_rows<T>(h, xn, w->layers[0].norm1_w, w->layers[0].norm1_b, N, H, eps, rms, st0);
  } else {
    embedding_layernorm<T>(I32(L.row_tok), I32(L.row_pos), static_cast<const T*>(w->embed),
                           static_cast<const T*>(w->pos), h, xn, w->layers[0].norm1_w,
                           w->layers[0].norm1_b, N, H, eps, rms, st0, acc);
  }
  // gemv_args holds what every gemv of the step shares: n rows over the residual stream.
  auto gemv_args = [&](int n) {
    GemvArgs a{};
    a.bulk = e->bulk, a.n = n, a.h = h, a.eps = eps, a.rms = rms, a.acc = acc;
    return a;
  };
  // qkv_args is layer l's QKV projection over the step's rows with what its epilogues
  // write to: the queries, keys and values, the query scale, the rotary frequencies
  // (GEMV_OUT_F32 reads none of the KV part).
  auto qkv_args = [&](int l, const LayerW& lw) {
    GemvArgs a = gemv_args(N);
    a.w = lw.qkv_w, a.bias = lw.qkv_b, a.in = H, a.out = d.qkv, a.y = qkv;
    a.kv = kv, a.row_pos = I32(L.row_pos), a.row_seq = I32(L.row_seq);
    a.seqs = seqs, a.blocks = words, a.geom = e->geom, a.layer = l;
    a.qscale = 1.f / sqrtf((float)c.head_dim), a.inv_freq = inv_freq;
    return a;
  };
  // kv_write adds bias (or nothing) to layer l's QKV rows, scales the queries, rotates and
  // writes keys and values to the pool: the QKV epilogue as a kernel of its own.
  auto kv_write = [&](int l, const float* bias) {
    if (on(kSkipKV))
      qkv_kv_write<T>(qkv, bias, kv, I32(L.row_pos), I32(L.row_seq), seqs, words, e->geom, l, N,
                      inv_freq, c.rope_dim, st);
  };
  // Rotary over the whole head fits the streaming gemv's and the tiled kernel's epilogue.
  const bool rope_epilogue = inv_freq && c.rope_dim == c.head_dim;
  for (int l = 0; l < c.layers; l++) {
    const LayerW& lw = w->layers[l];
    const int window = c.sliding_window > 0 && l >= c.window_from_layer ? c.sliding_window : 0;
    if (!on(kSkipQKV)) {
    } else if (small) {
      // QKV with the attention norm before; without rotary positions the KV write after,
      // with them qkv_kv_write rotates and writes (the bias is added here) — or, with
      // rotary over the whole head, the streaming gemv does both itself.
      GemvArgs a = qkv_args(l, lw);
      a.gamma = lw.norm1_w, a.beta = lw.norm1_b;
      if (rope_epilogue && streamed) {
        gemv_stream<T, GEMV_IN_LN, GEMV_OUT_ROPE>(a, e->sms, st);
      } else if (inv_freq) {
        gemv_any<T, GEMV_IN_LN, GEMV_OUT_F32>(a, e->sms, streamed, st);
        kv_write(l, nullptr);
      } else {
        gemv_any<T, GEMV_IN_LN, GEMV_OUT_QKV>(a, e->sms, streamed, st);
      }
    } else if (tiled) {
      // As the small path's QKV, over xn (the norm the kernel before wrote).
      GemvArgs a = qkv_args(l, lw);
      a.x = xn;
      if (rope_epilogue) {
        tiled_proj<T, GEMV_OUT_ROPE>(a, e->tile_blocks, tpart, ttick, st);
      } else if (inv_freq) {
        tiled_proj<T, GEMV_OUT_F32>(a, e->tile_blocks, tpart, ttick, st);
        kv_write(l, nullptr);
      } else {
        tiled_proj<T, GEMV_OUT_QKV>(a, e->tile_blocks, tpart, ttick, st);
      }
    } else {
      gemm_qkv<T>(e, lw, NG);
      kv_write(l, lw.qkv_b);
    }
    attention_context<T>(qkv, att, kv, tiles, seqs, words, e->geom, l, window,
                         (int)pl.tiles.size(), e->ctx_mma, e->sms, st);
    // Decode attention: steps of few decode rows keep the per-head kernel with its loads
    // before the wait (tiny grids: all latency); more rows read each KV head once for all
    // its query heads.
    if (!on(kSkipAttn)) {
    } else if (e->grouped && !few_dec)
      attention_decode_gqa<T>(qkv, att, kv, I32(L.dec_rows), I32(L.row_pos), I32(L.row_seq),
                              seqs, words, e->geom, l, window, (int)pl.dec_rows.size(), parts,
                              e->partial.as<float>(), e->part_ml.as<float>(),
                              e->tickets.as<int>(), st);
    else
      attention_decode<T>(qkv, att, kv, I32(L.dec_rows), I32(L.row_pos), I32(L.row_seq), seqs,
                          words, e->geom, l, window, (int)pl.dec_rows.size(), parts, e->max_len,
                          e->partial.as<float>(), e->part_ml.as<float>(), e->tickets.as<int>(),
                          small || few_dec, st);
    const bool last = l + 1 == c.layers;
    if (small) {
      GemvArgs a = gemv_args(N);
      // Attention output projection, added to the residual stream; in a fused step its
      // single writer per entry also moves the last MLP's fixed-point additions into h.
      a.w = lw.out_w, a.bias = lw.out_b, a.in = d.att, a.out = H, a.x = att, a.hout = h;
      if (on(kSkipOut)) gemv_any<T, GEMV_IN_T, GEMV_OUT_RESID>(a, e->sms, streamed, st);
      if (fused) {
        MlpArgs m{};
        m.bulk = e->bulk;
        m.w_up = lw.up_w, m.b_up = lw.up_b, m.w_down = lw.down_w, m.b_down = lw.down_b;
        m.gamma = lw.norm2_w, m.beta = lw.norm2_b, m.eps = eps, m.rms = rms, m.h = h, m.acc = acc;
        m.n = N, m.hidden = H, m.inner = d.I, m.act = c.activation, m.gated = c.gated_mlp != 0;
        const int R = gemv_rows(N);
        m.k = e->mlp_k[mlp_slot(R)];
        if (on(kSkipUp)) mlp<T>(m, R, st);
        continue;
      }
      // MLP up-projection with the MLP norm before and the activation after (a gated MLP
      // takes its gate and up outputs in fp32, then gated_act).
      a.w = lw.up_w, a.bias = lw.up_b, a.in = H, a.out = d.up, a.gamma = lw.norm2_w,
      a.beta = lw.norm2_b, a.act = c.activation;
      if (!on(kSkipUp)) {
      } else if (c.gated_mlp && streamed) {
        // Gate and up rows in one kernel, act(gate) · up stored (a.out: the units).
        a.y = fch, a.out = d.I;
        gemv_stream<T, GEMV_IN_LN, GEMV_OUT_GATED>(a, e->sms, st);
      } else if (c.gated_mlp) {
        a.y = fc;
        gemv<T, GEMV_IN_LN, GEMV_OUT_F32>(a, e->sms, st);
        gated_act<T>(fc, nullptr, fch, N, d.I, c.activation, st);
      } else {
        a.y = fch;
        gemv_any<T, GEMV_IN_LN, GEMV_OUT_ACT>(a, e->sms, streamed, st);
      }
      // MLP down-projection, added to the residual stream.
      a = gemv_args(N);
      a.w = lw.down_w, a.bias = lw.down_b, a.in = d.I, a.out = H, a.x = fch, a.hout = h;
      if (on(kSkipDown)) gemv_any<T, GEMV_IN_T, GEMV_OUT_RESID>(a, e->sms, streamed, st);
      continue;
    }
    // Output projection into tmp, then the residual add and the MLP norm; the MLP's first
    // projection and its activation (or gate · up); the down projection into tmp, then the
    // residual add and the next norm. The tiled kernels add their biases and apply the
    // activation themselves; cuBLAS's GEMMs leave both to the kernels after them.
    // into_tmp runs a projection into the residual stream's width: tiled (with its bias),
    // or cuBLAS's GEMM (gemm) and, under tensor parallelism, the all-reduce of its shares.
    auto into_tmp = [&](const void* wt, const float* bias, int in, const T* x, auto gemm,
                        const char* what) {
      if (tiled) {
        GemvArgs a = gemv_args(N);
        a.w = wt, a.bias = bias, a.in = in, a.out = H, a.x = x, a.y = tmp;
        tiled_proj<T, GEMV_OUT_F32>(a, e->tile_blocks, tpart, ttick, st);
        return;
      }
      gemm();
      if (tp) tp_all_reduce(e, tmp, (size_t)N * H, what, l);
    };
    if (on(kSkipOut))
      into_tmp(lw.out_w, lw.out_b, d.att, att, [&] { gemm_proj<T>(e, lw, NG); }, "the attention output");
    if (on(kSkipNorm))
      residual_layernorm<T>(h, tmp, tiled ? nullptr : lw.out_b, xn, lw.norm2_w, lw.norm2_b, N, H,
                            eps, rms, stc);
    if (!on(kSkipUp)) {
    } else if (tiled) {
      GemvArgs a = gemv_args(N);
      a.w = lw.up_w, a.bias = lw.up_b, a.in = H, a.out = d.I, a.x = xn, a.y = fch, a.act = c.activation;
      if (c.gated_mlp)
        tiled_proj<T, GEMV_OUT_GATED>(a, e->tile_blocks, tpart, ttick, st);
      else
        tiled_proj<T, GEMV_OUT_ACT>(a, e->tile_blocks, tpart, ttick, st);
    } else {
      gemm_up<T>(e, lw, NG);
      if (!on(kSkipAct)) {
      } else if (c.gated_mlp) {
        gated_act<T>(fc, lw.up_b, fch, N, d.I, c.activation, st);
      } else {
        bias_act<T>(fc, lw.up_b, fch, N, d.I, c.activation, st);
      }
    }
    if (on(kSkipDown))
      into_tmp(lw.down_w, lw.down_b, d.I, fch, [&] { gemm_down<T>(e, lw, NG); }, "the MLP output");
    const LayerW& nx = last ? lw : w->layers[l + 1];
    if (on(kSkipNorm))
      residual_layernorm<T>(h, tmp, tiled ? nullptr : lw.down_b, xn, last ? w->final_w : nx.norm1_w,
                            last ? w->final_b : nx.norm1_b, N, H, eps, rms, stc);
  }
  // The LM head writes part ([rows][VR]); the whole-vocabulary logits are part itself on
  // one GPU, else the join of every rank's part.
  float* part = e->logits.as<float>();
  float* logits = tp ? e->tp_logits.as<float>() : part;
  float* retlog = e->retlog.as<float>();
  float* hlog = e->hlog.as<float>();
  for (size_t ci = 0; ci < pl.chunks.size(); ci++) {
    const Chunk& ch = pl.chunks[ci];
    const float* padded = nullptr;  // the LM head's padded rows, when sampling reads them
    if (!on(kSkipHead)) {
    } else if (small) {
      // The final norm is fused into the LM head's gemv.
      GemvArgs a = gemv_args(ch.count);
      a.idx = I32(L.lrow_src) + ch.first;
      a.gamma = w->final_w, a.beta = w->final_b, a.w = w->lm_head, a.in = H, a.out = VR, a.y = part;
      gemv_any<T, GEMV_IN_LN, GEMV_OUT_F32>(a, e->sms, streamed, st);
    } else {
      gather_rows<T>(xn, I32(L.lrow_src) + ch.first, e->xf.as<T>(), ch.count, H, st);
      gemm_lm_head<T>(e, gemm_rows(ch.count));
      // Greedy sampling reads the padded rows where it is all that reads them (one GPU, no
      // logits copied back): unpad_rows' copy (GPT-2 b64: 12.9 MB, 9.7 µs) is then not made.
      bool keep_padded = e->logits_pad.p && pl.all_greedy && !tp;
      for (const CopyOut& cp : pl.copies)
        if (cp.chunk == (int)ci && !cp.from_ret) keep_padded = false;
      if (keep_padded)
        padded = e->logits_pad.as<float>();
      else if (e->logits_pad.p)
        unpad_rows(e->logits_pad.as<float>(), part, ch.count, VR, lm_head_ld(VR), st);
    }
    if (tp) {
      tp_all_gather(e, part, e->tp_gather.as<float>(), (size_t)ch.count * VR);
      join_vocab(e->tp_gather.as<float>(), logits, ch.count, VR, V, e->tp_size, st0);
    }
    if (!capture) {
      for (const CopyOut& cp : pl.copies)
        if (cp.chunk == (int)ci && !cp.from_ret)
          CUDA_CHECK(cudaMemcpyAsync(hlog + cp.dst, logits + (int64_t)cp.row * V,
                                     (size_t)cp.rows * V * 4, cudaMemcpyDeviceToHost, st.st));
    }
    if (on(kSkipSample))
      sample(logits, padded, I32(L.samp_seq) + ch.samp_first, I32(L.samp_row) + ch.samp_first, seqs,
           words, words, reinterpret_cast<const float*>(din), retlog, e->dtok.as<int32_t>(),
           e->dlp.as<float>(), ch.samp_count, V, e->greedy_part.as<float>(),
           e->greedy_tickets.as<int>(), pl.all_greedy, e->sms, st);
    if (!capture) {
      for (const CopyOut& cp : pl.copies)
        if (cp.chunk == (int)ci && cp.from_ret)
          CUDA_CHECK(cudaMemcpyAsync(hlog + cp.dst, retlog + (int64_t)cp.row * V,
                                     (size_t)cp.rows * V * 4, cudaMemcpyDeviceToHost, st.st));
    }
  }
}

// warmup_gemms_t calls cuBLAS once on every padded row count a step can use (layer 0's
// four GEMMs, the LM head), so that no step of a served model pays a shape's first call.
template <typename T>
int warmup_gemms_t(gollm_engine* e) {
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

// allow_smem_max raises kernel k's dynamic shared-memory limit to all the device allows
// it. The limit belongs to the process, not to an engine: engines of different models
// (other head sizes, hidden sizes, lengths) share it, so it is set to the device's most,
// the same value whichever engine sets it, never to one model's need — a smaller model
// loaded after a larger one would lower the limit under it, and the larger one's
// launches would fail with an invalid argument.
template <typename K>
void allow_smem_max(K k, int device) {
  allow_dynamic_smem(k, device);
}

// setup_kernels_t raises the dynamic shared-memory limits of the kernels that may need
// more than 48 KB and sizes the fused MLP for the model (turning it off where it cannot
// run).
template <typename T>
void setup_kernels_t(gollm_engine* e) {
  const gollm_model_config& c = e->w->cfg;
  gemv_allow_smem<T>(e->device);
  if (e->stream_gemv) gemv_stream_allow_smem<T>(e->device);
  if (e->tiled) tiled_allow_smem<T>(e->device);
  if (e->fused)
    e->fused = fused_setup<T>(c.hidden, c.inner, c.gated_mlp != 0, e->sms, e->device, e->mlp_k);
  allow_smem_max(attention_context_tc_kernel<T>, e->device);
  allow_smem_max(attention_context_mma_kernel<T, 64>, e->device);
  allow_smem_max(attention_context_mma_kernel<T, 80>, e->device);
  allow_smem_max(attention_context_mma_kernel<T, 128>, e->device);
  allow_smem_max(attention_context_kernel<T>, e->device);
  // Decode attention holds a row's scores: what it needs follows the longest sequence.
  const size_t ds = decode_smem(c.head_dim, e->max_len);
  if (ds > dynamic_smem_max(attention_decode_kernel<T, true>, e->device))
    invalid("max_seq_len %d: decode attention needs %zu bytes of shared memory, more than the "
            "device allows a block",
            e->max_len, ds);
  allow_smem_max(attention_decode_kernel<T, true>, e->device);
  allow_smem_max(attention_decode_kernel<T, false>, e->device);
}

}  // namespace

void run_forward(gollm_engine* e, const Plan& pl, const Layout& L, int parts, bool capture) {
  if (e->w->dtype == GOLLM_DTYPE_BF16)
    forward<__nv_bfloat16>(e, pl, L, parts, capture);
  else
    forward<__half>(e, pl, L, parts, capture);
}

int warmup_gemms(gollm_engine* e) {
  return e->w->dtype == GOLLM_DTYPE_BF16 ? warmup_gemms_t<__nv_bfloat16>(e) : warmup_gemms_t<__half>(e);
}

void feed_tokens(gollm_engine* e, const Layout& L, size_t pairs_off, int n) {
  if (n == 0) return;
  char* din = e->din.as<char>();
  launch("feed_tokens_kernel", feed_tokens_kernel, (n + 127) / 128, 128, 0, Stream(e->stream, false),
         reinterpret_cast<int32_t*>(din + L.row_tok), e->dtok.as<const int32_t>(),
         reinterpret_cast<const int32_t*>(din + pairs_off), n, e->vocab);
}

void setup_kernels(gollm_engine* e) {
  if (e->w->dtype == GOLLM_DTYPE_BF16)
    setup_kernels_t<__nv_bfloat16>(e);
  else
    setup_kernels_t<__half>(e);
}

}  // namespace gollm

// forward.cu — the forward pass of one step, a walk over the model's recipe with one
// dispatcher a stage, and every other kernel launch (sampling, the warm-up's GEMMs, the
// kernels' set-up). The one file that includes the kernels: each is compiled, registered
// and given its shared-memory limit here alone.
//
// Under batch invariance (the default; cuda/README.md) every step takes the Tiled path,
// the LM head too, so that a row's arithmetic never depends on the rows beside it.
// Without it a step's rows decide its path, which every projection dispatcher follows:
//   Stream  1–2 rows (up to 4 on models up to 1024 wide): the streaming gemv, its input norm
//           and its epilogue (bias, activation, gate·up, QKV's rotary and KV write, the
//           residual add) in the kernel; FP8 weights too;
//   Gemv    up to gemv_rows_max rows (4 on models up to 1024 wide): the staged gemv, the same
//           fusions but gate·up and rotary, which follow as kernels of their own; a
//           decode-only step's MLP in one kernel (fused.cuh);
//   Tiled   up to tiled_rows rows (16 on models up to 1024 wide): tensor-core projections
//           over the norm the kernel before wrote, epilogues as the streaming gemv's but
//           for the residual add;
//   Blas    the rest, and FP8 weights off the Stream path: cuBLASLt's GEMMs in fp32, the
//           algorithm timed per shape by the warm-up (blaslt.h), or the FP8 kernels
//           (proj), each followed by its epilogue's kernel.
// A projection whose kernel lacks the epilogue a stage after it needs writes fp32 and
// leaves that stage its own kernel (the rotary and KV write: qkv_kv_write; gate·up:
// gated_act; the residual add: residual_layernorm, which also computes the next norm).
//
// Under tensor parallelism (a rank's share of the weights: its heads, MLP units and
// vocabulary rows) the same paths run, except that a projection into the residual width
// writes its fp32 partial sums without bias, which the rank all-reduces (NCCL, on the
// step's stream, inside the decode graphs too) before the residual add, bias and norm
// that follow run unchanged on every rank; the fused MLP, which adds into the residual
// stream itself, does not run. The embedding's lookups are all-reduced too, and the LM
// head's rows all-gathered and joined into whole-vocabulary logits, which every rank
// samples alike.
//
// The dense families' stages (dense.cuh) keep to the same rules: QK_NORM and a longrope
// ROTARY are applied by the QKV epilogue's own kernel (qkv_extra_write), as a partial
// rotary is; a POST_NORM makes its branch's projection write fp32 to tmp, which RESIDUAL
// norms before the add (post_residual_norm), and keeps the fused MLP off; soft-capped
// attention takes the kernels with the cap (attention_capped), a soft-capped LM head a
// kernel over its logits.
#include "activation.cuh"
#include "attention.cuh"
#include "dense.cuh"
#include "embedding.cuh"
#include "fp8.cuh"
#include "fp8lt.cuh"
#include "fused.cuh"
#include "gemv.cuh"
#include "internal.h"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "moe.cuh"
#include "parallel.cuh"
#include "sampling.cuh"
#include "tiled.cuh"

namespace gollm {

namespace {

// gemm is a projection's cuBLAS GEMM over m rows (gemm_rows of the step's; the rows past
// the step's are never read): y [m][out] fp32 = x [m][in] · w [out][in]ᵀ, on cuBLASLt with
// the algorithm chosen for the shape (blaslt.h). The dispatchers and the warm-up both call
// it, so that the warm-up meets, and times, exactly a step's shapes.
template <typename T>
void gemm(gollm_engine* e, const void* x, const void* w, float* y, int m, int in, int out) {
  e->gemms.xwt(cuda_type<T>(), x, w, y, m, in, out);
}

// fp8lt_table is cuBLASLt's scale table of the FP8 weight whose scales are ws, or null
// where the engine has no cuBLASLt FP8 path or the weight no table there.
inline const Fp8Lt::Scales* fp8lt_table(gollm_engine* e, const float* ws) {
  if (!ws || !e->fp8lt) return nullptr;
  const auto b = e->fp8lt->blocks.find(ws);
  return b != e->fp8lt->blocks.end() && b->second.p ? &b->second : nullptr;
}

// fp8lt_takes says whether proj runs an FP8 weight (scales ws) over n rows on cuBLASLt's
// W8A8 GEMM: many rows, a scale table there, and an algorithm for the shape (with its
// product in T where tout).
template <typename T>
bool fp8lt_takes(gollm_engine* e, const void* x, const void* w, const float* ws, void* y, int n, int in, int out,
                 Stream st, bool tout = false) {
  const Fp8Lt::Scales* t = n > kFp8GemvRows ? fp8lt_table(e, ws) : nullptr;
  return t && fp8lt_plan<T>(*e->fp8lt, gemm_rows(n), in, out, static_cast<const T*>(x),
                            static_cast<const uint8_t*>(w), t->p, t->mode, y, st.st, false, tout)
                  .use_lt;
}

// proj is a projection stage's GEMM in the format of its weights: the FP8 kernels over the
// step's n rows where the weights are FP8 (scales ws), else cuBLAS over gemm_rows(n).
// quantized: x's rows are already in the FP8 GEMM's input (fp8lt_gated_quant; only where
// fp8lt_takes). tout: y [m][out] in T rather than fp32 where cuBLASLt's FP8 GEMM has the
// shape so (fp8lt_takes with tout); true where it wrote T.
template <typename T>
bool proj(gollm_engine* e, const void* x, const void* w, const float* ws, float* y, int n, int in,
          int out, Stream st, bool quantized = false, bool tout = false) {
  if (!ws) {
    gemm<T>(e, x, w, y, gemm_rows(n), in, out);
    return false;
  }
  // Many rows: FP8 tensor cores through cuBLASLt (fp8lt.cuh) where the weight has a scale
  // table there and the shape has an algorithm that beat the kernels below at the warm-up.
  if (const Fp8Lt::Scales* t = n > kFp8GemvRows ? fp8lt_table(e, ws) : nullptr) {
    Fp8Lt& lt = *e->fp8lt;
    const int m = gemm_rows(n);
    const T* xt = static_cast<const T*>(x);
    const uint8_t* wq = static_cast<const uint8_t*>(w);
    const Fp8Lt::Plan* p = &fp8lt_plan<T>(lt, m, in, out, xt, wq, t->p, t->mode, y, st.st, false);
    if (tout) {
      const Fp8Lt::Plan& pt = fp8lt_plan<T>(lt, m, in, out, xt, wq, t->p, t->mode, y, st.st, false, true);
      if (pt.use_lt) p = &pt;
    }
    if (p->use_lt) {
      if (!quantized) fp8lt_quant<T>(lt, xt, n, m, in, t->mode, st);
      fp8lt_run(lt, *p, p->algo, wq, t->p, y, st.st);
      if (p->bf16) fp8lt_widen(lt, y, m, out, st);
      return p->tout;
    }
  }
  fp8_proj<T>(static_cast<const T*>(x), static_cast<const uint8_t*>(w), ws, y, n, in, out, e->sms,
              e->fp8_part.as<float>(), e->fp8_part.bytes / 4, st);
  return false;
}

// fp8lt_warm chooses shape (m, in, out)'s FP8 GEMM at the warm-up (fp8lt.cuh's
// fp8lt_plan, timed) on weight w with scales ws and input rows x; true where cuBLASLt has
// an algorithm for it (counted in the warm-up's GEMM shapes).
template <typename T>
bool fp8lt_warm(gollm_engine* e, const void* x, const void* w, const float* ws, float* y, int m, int in, int out,
                bool tout = false) {
  const Fp8Lt::Scales* t = fp8lt_table(e, ws);
  return t && fp8lt_plan<T>(*e->fp8lt, m, in, out, static_cast<const T*>(x), static_cast<const uint8_t*>(w), t->p,
                            t->mode, y, e->stream, true, tout)
                  .found;
}

// The LM head's GEMM runs over lm_head_ld(V) rows of weights (zero past V), so that cuBLAS
// never meets an odd vocabulary such as GPT-2's 50,257, for which it takes a slow kernel.
// Its output rows then go to logits_pad, and unpad_rows moves them into logits.
template <typename T>
void gemm_lm_head(gollm_engine* e, int m) {
  const Dims d(e->w->cfg);
  float* y = e->logits_pad.p ? e->logits_pad.as<float>() : e->logits.as<float>();
  e->gemms.xwt(cuda_type<T>(), e->xf.p, e->w->lm_head, y, m, d.H, lm_head_ld(d.V));
}

// stream_rows is the most rows a step takes the streaming gemv for, on a model of hidden
// width H (bench/results/2026-11-26-gpu-h100.jsonl).
inline int stream_rows(int H) { return H <= 1024 ? 4 : 2; }

// Path is how a step's projections run (the file's comment).
enum class Path { Stream, Gemv, Tiled, Blas };

// Flow is a step as the walk goes: its operands, the path its rows take, and what the
// stages walked leave for the next — the last norm, whether its output is in xn, whether
// the QKV kernel wrote the keys, where the branch is.
template <typename T>
struct Flow {
  gollm_engine* e;
  const Plan& pl;
  const Layout& L;
  const Dims d;
  const int N, NG, parts;
  const bool tp;
  Path path = Path::Blas;
  bool fused = false;    // a decode-only step's MLP in one kernel
  bool few_dec = false;  // few decode rows: decode attention a block per query head
  const Stream st0, st, stc;  // no PDL; PDL; after a collective (NCCL's kernels: none)
  char* din;
  const int32_t* words;
  const DevSeq* seqs;
  const CtxTile* tiles;
  float* h;
  T* xn;
  float* qkv;
  T* att;
  float* tmp;
  float* fc;
  T* fch;
  void* kv;  // the pool: T, or FP8 codes (e->kv_fp8)
  unsigned long long* acc = nullptr;  // the fused MLP's fixed-point additions to h
  const Stage* norm = nullptr;        // the last NORM walked: what reads x reads its norm of h
  const Stage* post = nullptr;        // a POST_NORM walked since the branch: RESIDUAL's
  bool kv_written = true;             // the QKV kernel applied its epilogue
  const float* qkv_bias = nullptr;    // the QKV bias, where the KV write must add it
  bool branch_in_h = false;           // the branch's projection added it to h
  const float* branch_bias = nullptr; // tmp holds the branch without this bias
  bool ar_pending = false;            // tmp is a rank's share: RESIDUAL's kernel all-reduces it

  Flow(gollm_engine* e_, const Plan& pl_, const Layout& L_, int parts_)
      : e(e_), pl(pl_), L(L_), d(e_->w->cfg), N(pl_.n), NG(gemm_rows(pl_.n)), parts(parts_),
        tp(e_->tp_size > 1), st0(e_->stream, false), st(e_->stream, e_->pdl),
        stc(e_->tp_size > 1 ? st0 : st), din(e_->din.as<char>()),
        words(reinterpret_cast<const int32_t*>(din)),
        seqs(reinterpret_cast<const DevSeq*>(din + L_.seqs)),
        tiles(reinterpret_cast<const CtxTile*>(din + L_.tiles)), h(e_->h.as<float>()),
        xn(e_->xn.as<T>()), qkv(e_->qkv.as<float>()), att(e_->att.as<T>()),
        tmp(e_->tmp.as<float>()), fc(e_->fc.as<float>()), fch(e_->fch.as<T>()), kv(e_->kv.p) {
    const int H = d.H;
    const bool chunks_ok =
        pl.chunks.size() <= 1 && (pl.chunks.empty() || pl.chunks[0].count <= kGemvMaxRows);
    const bool streamed = e->stream_gemv && N <= stream_rows(H) && gemv_stream_fits(N, H) &&
                          gemv_stream_fits(N, d.I) && gemv_stream_fits(N, d.att) && chunks_ok;
    const bool staged = N <= e->gemv_rows_max && gemv_fits(N, H) && gemv_fits(N, d.I) &&
                        gemv_fits(N, d.att) && chunks_ok;
    if (e->invariant)
      path = Path::Tiled;  // every row count: one kernel's arithmetic (tiled.cuh)
    else if (streamed)
      path = Path::Stream;
    else if (staged)
      path = Path::Gemv;
    else if (e->tiled && N <= e->tiled_rows && tiled_fits(N, H))
      path = Path::Tiled;
    // FP8 weights stream like T's (every FP8 width is a multiple of 16); on the other paths
    // they take their own kernels (proj), which write fp32 as cuBLAS does: the Blas path's
    // epilogue kernels follow them.
    if (e->w->fp8 && path != Path::Stream) path = Path::Blas;
    fused = path == Path::Gemv && e->fused && pl.tiles.empty() && (int)pl.dec_rows.size() == N &&
            N <= kFusedRows;
    if (fused) acc = e->acc.as<unsigned long long>();
    few_dec = !e->invariant && (int)pl.dec_rows.size() <= kFusedRows;
    // Under batch invariance a decode row's positions split by its length alone, into at
    // most cap parts (the engine's one-row split count); the step's rows only decide how
    // many blocks share a row's parts (decode_cap).
    cap = e->invariant ? attention_splits(e, 1, e->max_len) : parts;
  }
  int cap;  // decode attention: the most parts a row's positions split into
  bool small() const { return path == Path::Stream || path == Path::Gemv; }
  const int32_t* I32(size_t off) const { return reinterpret_cast<const int32_t*>(din + off); }
  // args holds what every gemv and tiled launch of the step shares: n rows over the
  // residual stream, its input normed by the last norm walked.
  GemvArgs args(int n) const {
    GemvArgs a{};
    a.bulk = e->bulk, a.n = n, a.h = h, a.acc = acc;
    if (norm) {
      a.gamma = norm->gamma, a.beta = norm->beta, a.eps = norm->s.eps;
      a.rms = norm->s.norm == GOLLM_NORM_RMS;
    }
    return a;
  }
};

// gemv_any runs a few-row projection on the path's gemv kernel.
template <typename T, int IN, int OUT>
void gemv_any(const Flow<T>& f, const GemvArgs& a) {
  if (f.path == Path::Stream)
    gemv_stream<T, IN, OUT>(a, f.e->sms, f.st);
  else
    gemv<T, IN, OUT>(a, f.e->sms, f.st);
}

// EMBED, with the NORM after it in the same kernel (one GPU), or after the all-reduce that
// adds the ranks' lookups — each rank looks its vocabulary rows up, rank 0 adding the
// positions.
template <typename T>
void embed(Flow<T>& f, const Stage& s) {
  gollm_engine* e = f.e;
  const gollm_weights* w = e->w;
  const Stage& nx = *s.next;
  const bool rms = nx.s.norm == GOLLM_NORM_RMS;
  const int VR = f.d.V;
  if (f.tp) {
    // The custom all-reduce sums the lookups in fp32 (one rank's is nonzero: exact) into h
    // and norms them in the same kernel.
    const bool custom = ar_fits(e, f.N, f.d.H, 4);
    float* look = custom ? f.tmp : f.h;
    embedding_shard<T>(f.I32(f.L.row_tok), f.I32(f.L.row_pos), static_cast<const T*>(w->embed),
                       e->tp_rank == 0 ? static_cast<const T*>(w->pos) : nullptr, look, f.N, f.d.H,
                       e->tp_rank * VR, VR, f.st0, s.s.scale);
    if (custom) {
      tp_reduce_norm<T>(e, look, f.h, nullptr, f.xn, nx.gamma, nx.beta, f.N, f.d.H, nx.s.eps, rms,
                        false, true);
    } else {
      tp_all_reduce(e, f.h, (size_t)f.N * f.d.H, "the embedding", -1);
      norm_rows<T>(f.h, f.xn, nx.gamma, nx.beta, f.N, f.d.H, nx.s.eps, rms, f.st0);
    }
  } else {
    embedding_layernorm<T>(f.I32(f.L.row_tok), f.I32(f.L.row_pos), static_cast<const T*>(w->embed),
                           static_cast<const T*>(w->pos), f.h, f.xn, nx.gamma, nx.beta, f.N, f.d.H,
                           nx.s.eps, rms, f.st0, f.acc, s.s.scale);
  }
  f.norm = &nx;
}

// NORM: computed by the kernel before it where that kernel does (EMBED, RESIDUAL), by the
// gemv kernels that read it on the few-row paths, else by norm_rows into xn.
template <typename T>
void norm(Flow<T>& f, const Stage& s) {
  if (f.norm == &s) return;
  f.norm = &s;
  if (!f.small())
    norm_rows<T>(f.h, f.xn, s.gamma, s.beta, f.N, f.d.H, s.s.eps, s.s.norm == GOLLM_NORM_RMS, f.st);
}

// QKV, with the bias, the query scale, the layer's rotary and the KV write in its
// kernel's epilogue where the kernel has them: the streaming gemv and the tiled kernel
// rotate whole heads, the gemv kernels write keys and values; otherwise — a partial rotary,
// q/k norms, longrope — it writes fp32 and KV_WRITE's kernel does the rest.
template <typename T>
void qkv(Flow<T>& f, const Stage& s) {
  gollm_engine* e = f.e;
  GemvArgs a = f.args(f.N);
  a.w = s.w, a.ws = s.ws, a.bias = s.b, a.in = f.d.H, a.out = f.d.qkv, a.y = f.qkv;
  a.kv = f.kv, a.row_pos = f.I32(f.L.row_pos), a.row_seq = f.I32(f.L.row_seq);
  a.seqs = f.seqs, a.blocks = f.words, a.geom = layer_geom(e, s.s.layer), a.layer = s.s.layer;
  a.qscale = s.qscale, a.inv_freq = s.inv_freq;
  // whole: the streaming and tiled kernels' rotary epilogue serves; apart: the epilogue
  // needs KV_WRITE's kernel on the paths that lack it (rotary on the staged gemv) and on
  // every path for a partial rotary, q/k norms or longrope (Stage.extra).
  const bool rope = s.inv_freq != nullptr, apart = rope || s.extra;
  const bool whole = rope && !s.extra && s.rope_dim == f.d.D;
  f.kv_written = true, f.qkv_bias = nullptr;
  switch (f.path) {
    case Path::Stream:
    case Path::Gemv:
      if (whole && f.path == Path::Stream) {
        gemv_stream<T, GEMV_IN_LN, GEMV_OUT_ROPE>(a, e->sms, f.st);
      } else if (apart) {
        gemv_any<T, GEMV_IN_LN, GEMV_OUT_F32>(f, a);
        f.kv_written = false;
      } else {
        gemv_any<T, GEMV_IN_LN, GEMV_OUT_QKV>(f, a);
      }
      break;
    case Path::Tiled:
      a.x = f.xn;
      if (whole) {
        tiled_proj<T, GEMV_OUT_ROPE>(a, e->tile_blocks, e->tile_smem, e->tile_part.as<float>(), e->tile_tickets.as<int>(), f.st);
      } else if (apart) {
        tiled_proj<T, GEMV_OUT_F32>(a, e->tile_blocks, e->tile_smem, e->tile_part.as<float>(), e->tile_tickets.as<int>(), f.st);
        f.kv_written = false;
      } else {
        tiled_proj<T, GEMV_OUT_QKV>(a, e->tile_blocks, e->tile_smem, e->tile_part.as<float>(), e->tile_tickets.as<int>(), f.st);
      }
      break;
    case Path::Blas:
      proj<T>(e, f.xn, s.w, s.ws, f.qkv, f.N, f.d.H, f.d.qkv, f.st);
      f.kv_written = false, f.qkv_bias = s.b;
      break;
  }
}

// KV_WRITE (and ROTARY's rotation): the QKV epilogue as a kernel of its own, where the QKV
// kernel did not apply it.
template <typename T>
void kv_write(Flow<T>& f, const Stage& s) {
  if (f.kv_written) return;
  const KVGeom g = layer_geom(f.e, s.s.layer);
  if (s.extra)
    qkv_extra_write<T>(f.qkv, f.qkv_bias, f.kv, f.I32(f.L.row_pos), f.I32(f.L.row_seq), f.seqs,
                       f.words, g, s.s.layer, f.N, s.inv_freq, s.rope_dim, s.qscale, s.qkx, f.st);
  else
    qkv_kv_write<T>(f.qkv, f.qkv_bias, f.kv, f.I32(f.L.row_pos), f.I32(f.L.row_seq), f.seqs,
                    f.words, g, s.s.layer, f.N, s.inv_freq, s.rope_dim, s.qscale, f.st);
  f.kv_written = true;
}

// ATTENTION: the prompt rows' tiles, then the decode rows — steps of few decode rows keep
// the per-head kernel with its loads before the wait (tiny grids: all latency); more read
// each KV head once for all its query heads. K is the pool's element type.
template <typename T, typename K>
void attention_k(Flow<T>& f, const Stage& s) {
  gollm_engine* e = f.e;
  const K* kv = static_cast<const K*>(f.kv);
  const int l = s.s.layer, window = s.s.window, rows = (int)f.pl.dec_rows.size();
  const KVGeom g = layer_geom(e, l);
  // Chained decode rows read keys and values other rows of the step write, which the
  // kernels load before their dependent-launch wait: they start after the writes instead.
  const Stream& st = f.pl.chained ? f.st0 : f.st;
  // The per-head kernel's grid is its split count: under invariance the fixed one.
  if (s.s.softcap > 0.f) {
    attention_capped<T, K>(f.qkv, f.att, kv, f.tiles, f.I32(f.L.dec_rows), f.I32(f.L.row_pos),
                        f.I32(f.L.row_seq), f.seqs, f.words, g, l, window,
                        (int)f.pl.tiles.size(), rows, f.cap, e->max_len, e->partial.as<float>(),
                        e->part_ml.as<float>(), e->tickets.as<int>(), f.small() || f.few_dec,
                        s.s.softcap, st);
    return;
  }
  attention_context<T, K>(f.qkv, f.att, kv, f.tiles, f.seqs, f.words, g, l, window,
                       (int)f.pl.tiles.size(), e->ctx_mma, e->sms, st);
  // Many rows, one part each: the tensor-core kernel (not under invariance, whose one
  // kernel at every batch is the grouped one).
  if (e->grouped && !f.few_dec && !e->invariant && std::min(f.parts, f.cap) == 1 && tc_decode_fits(g))
    attention_decode_tc<T, K>(f.qkv, f.att, kv, f.I32(f.L.dec_rows), f.I32(f.L.row_pos), f.I32(f.L.row_seq),
                              f.seqs, f.words, g, l, window, rows, st);
  else if (e->grouped && !f.few_dec)
    attention_decode_gqa<T, K>(f.qkv, f.att, kv, f.I32(f.L.dec_rows), f.I32(f.L.row_pos),
                            f.I32(f.L.row_seq), f.seqs, f.words, g, l, window, rows,
                            std::min(f.parts, f.cap), f.cap, e->partial.as<float>(),
                            e->part_ml.as<float>(), e->tickets.as<int>(), st);
  else
    attention_decode<T, K>(f.qkv, f.att, kv, f.I32(f.L.dec_rows), f.I32(f.L.row_pos), f.I32(f.L.row_seq),
                        f.seqs, f.words, g, l, window, rows, f.cap, e->max_len,
                        e->partial.as<float>(), e->part_ml.as<float>(), e->tickets.as<int>(),
                        f.small() || f.few_dec, st);
}

template <typename T>
void attention(Flow<T>& f, const Stage& s) {
  if (f.e->kv_fp8)
    attention_k<T, kv8>(f, s);
  else
    attention_k<T, T>(f, s);
}

// tp_share leaves a rank's share of the branch in tmp to RESIDUAL's custom all-reduce
// (fused with the residual add and the next norm), or all-reduces it with NCCL in fp32
// where the custom one does not take it: a POST_NORM between (its norm needs the whole
// sum first), payloads past the custom one's size, GPUs without peer access.
template <typename T>
void tp_share(Flow<T>& f, const char* what, int layer, bool post) {
  if (!post && ar_fits(f.e, f.N, f.d.H, sizeof(T)))
    f.ar_pending = true;
  else
    tp_all_reduce(f.e, f.tmp, (size_t)f.N * f.d.H, what, layer);
}

// branch projects x ([N][in] T) into the residual width — OUT, and the MLP's down
// projection —: the branch RESIDUAL adds. On one GPU a gemv adds it (with its bias) to h
// itself, unless a POST_NORM follows (post); otherwise it goes to tmp, with its bias from
// the tiled kernel or left to the residual add. A tensor-parallel rank's share is
// all-reduced there, its bias (the whole one, on every rank) left for after.
template <typename T>
void branch(Flow<T>& f, const void* w, const float* ws, const float* bias, int in, const T* x,
            const char* what, int layer, bool post, bool quantized = false) {
  gollm_engine* e = f.e;
  GemvArgs a = f.args(f.N);
  a.w = w, a.ws = ws, a.in = in, a.out = f.d.H, a.x = x, a.y = f.tmp;
  switch (f.path) {
    case Path::Stream:
    case Path::Gemv:
      if (!f.tp && !post) {
        a.bias = bias, a.hout = f.h;
        gemv_any<T, GEMV_IN_T, GEMV_OUT_RESID>(f, a);
        f.branch_in_h = true;
        return;
      }
      gemv_any<T, GEMV_IN_T, GEMV_OUT_F32>(f, a);
      break;
    case Path::Tiled:
      a.bias = f.tp ? nullptr : bias;
      tiled_proj<T, GEMV_OUT_F32>(a, e->tile_blocks, e->tile_smem, e->tile_part.as<float>(), e->tile_tickets.as<int>(), f.st);
      if (!f.tp) bias = nullptr;
      break;
    case Path::Blas:
      proj<T>(e, x, w, ws, f.tmp, f.N, in, f.d.H, f.st, quantized);
      break;
  }
  if (f.tp) tp_share(f, what, layer, post);
  f.branch_bias = bias;
}

// MLP: one kernel on a fused step (adding to h in fixed point); else the first projection
// with its activation — gate·up in the streaming and tiled kernels' epilogue, gated_act
// after the others —, then the down projection as the branch.
template <typename T>
void mlp(Flow<T>& f, const Stage& s) {
  gollm_engine* e = f.e;
  const int act = s.s.activation;
  const bool gated = s.s.gated != 0;
  if (f.fused) {
    MlpArgs m{};
    m.bulk = e->bulk;
    m.w_up = s.w, m.b_up = s.b, m.w_down = s.w2, m.b_down = s.b2;
    m.gamma = f.norm->gamma, m.beta = f.norm->beta, m.eps = f.norm->s.eps;
    m.rms = f.norm->s.norm == GOLLM_NORM_RMS, m.h = f.h, m.acc = f.acc;
    m.n = f.N, m.hidden = f.d.H, m.inner = f.d.I, m.act = act, m.gated = gated;
    const int R = gemv_rows(f.N);
    m.k = e->mlp_k[mlp_slot(R)];
    mlp<T>(m, R, f.st);
    f.branch_in_h = true;
    return;
  }
  GemvArgs a = f.args(f.N);
  a.w = s.w, a.ws = s.ws, a.bias = s.b, a.in = f.d.H, a.out = f.d.up, a.act = act;
  switch (f.path) {
    case Path::Stream:
    case Path::Gemv:
      if (gated && f.path == Path::Stream) {
        a.y = f.fch, a.out = f.d.I;
        gemv_stream<T, GEMV_IN_LN, GEMV_OUT_GATED>(a, e->sms, f.st);
      } else if (gated) {
        a.y = f.fc;
        gemv<T, GEMV_IN_LN, GEMV_OUT_F32>(a, e->sms, f.st);
        gated_act<T>(f.fc, nullptr, f.fch, f.N, f.d.I, act, f.st);
      } else {
        a.y = f.fch;
        gemv_any<T, GEMV_IN_LN, GEMV_OUT_ACT>(f, a);
      }
      break;
    case Path::Tiled:
      a.out = f.d.I, a.x = f.xn, a.y = f.fch;
      if (gated)
        tiled_proj<T, GEMV_OUT_GATED>(a, e->tile_blocks, e->tile_smem, e->tile_part.as<float>(), e->tile_tickets.as<int>(), f.st);
      else
        tiled_proj<T, GEMV_OUT_ACT>(a, e->tile_blocks, e->tile_smem, e->tile_part.as<float>(), e->tile_tickets.as<int>(), f.st);
      break;
    case Path::Blas:
      // Where the down projection quantizes its input for cuBLASLt, the gate·up product
      // comes in T (half the bytes of fp32, where cuBLASLt has the shape so) and the gated
      // units go straight into that input: their T rows never pass through memory.
      if (gated && f.d.I % 16 == 0 && fp8lt_takes<T>(e, f.fch, s.w2, s.ws2, f.tmp, f.N, f.d.I, f.d.H, f.st)) {
        Fp8Lt& lt = *e->fp8lt;
        const int m = gemm_rows(f.N);
        const Fp8Lt::Mode mode = fp8lt_table(e, s.ws2)->mode;
        if (proj<T>(e, f.xn, s.w, s.ws, f.fc, f.N, f.d.H, f.d.up, f.st, false, true))
          fp8lt_gated_quant<T>(lt, reinterpret_cast<const T*>(f.fc), s.b, f.N, m, f.d.I, act, mode, f.st);
        else
          fp8lt_gated_quant<T>(lt, static_cast<const float*>(f.fc), s.b, f.N, m, f.d.I, act, mode, f.st);
        branch(f, s.w2, s.ws2, s.b2, f.d.I, f.fch, "the MLP output", s.s.layer, s.post != nullptr, true);
        return;
      }
      proj<T>(e, f.xn, s.w, s.ws, f.fc, f.N, f.d.H, f.d.up, f.st);
      if (gated)
        gated_act<T>(f.fc, s.b, f.fch, f.N, f.d.I, act, f.st);
      else
        bias_act<T>(f.fc, s.b, f.fch, f.N, f.d.I, act, f.st);
      break;
  }
  branch(f, s.w2, s.ws2, s.b2, f.d.I, f.fch, "the MLP output", s.s.layer, s.post != nullptr);
}

// MOE: the mixture of experts on x (moe.cuh), in passes of up to the engine's chunk of
// rows. On one GPU's few-row paths each pass adds its sum to h (RESIDUAL then does
// nothing) unless a POST_NORM follows; otherwise it goes to tmp, all-reduced under tensor
// parallelism, for RESIDUAL.
// The few-row paths norm inside their gemv kernels and leave xn unwritten: the router's
// kernel norms h itself and writes xn for the experts (an RMSNorm: every MoE family's).
// Under expert parallelism the rank's weights hold experts [expert_first, + local_experts):
// its pass sums their pairs alone, and the all-reduce adds the ranks' (tp_share).
template <typename T>
void moe(Flow<T>& f, const Stage& s) {
  gollm_engine* e = f.e;
  const gollm_model_config& c = e->w->cfg;
  const Stage& nm = *f.norm;
  const bool rms = nm.s.norm == GOLLM_NORM_RMS;
  if (f.small() && !rms) norm_rows<T>(f.h, f.xn, nm.gamma, nm.beta, f.N, f.d.H, nm.s.eps, false, f.st);
  const bool into_h = f.small() && !f.tp && !s.post;
  MoeBufs& m = e->moe;
  MoePass<T> p{};
  p.s = &s, p.H = f.d.H, p.E = c.experts, p.K = s.s.top_k, p.MI = c.moe_inner, p.SI = c.shared_inner;
  p.logits = m.logits.as<float>();
  p.rt = MoeRoute{m.topi.as<int>(), m.topw.as<float>(), m.sgate.as<float>(), m.sorted.as<int>(),
                  m.pos.as<int>(),  m.tiles.as<int4>(), m.ntiles.as<int>(),  c.expert_first,
                  held_experts(c)};
  p.act = m.act.as<T>(), p.y = m.y.as<float>(), p.sact = m.sact.as<T>(), p.sy = m.sy.as<float>();
  p.add = into_h;
  p.invariant = e->invariant;  // moe_path: each pass picks its kernels by its rows
  for (int r0 = 0; r0 < f.N; r0 += m.chunk) {
    p.n = std::min(m.chunk, f.N - r0);
    p.x = f.xn + (int64_t)r0 * f.d.H;
    if (f.small() && rms) p.nm = MoeNorm{f.h + (int64_t)r0 * f.d.H, nm.gamma, nm.s.eps};
    p.out = (into_h ? f.h : f.tmp) + (int64_t)r0 * f.d.H;
    moe_pass<T>(p, f.st);
  }
  if (into_h) {
    f.branch_in_h = true;
    return;
  }
  if (f.tp) tp_share(f, "the experts' output", s.s.layer, s.post != nullptr);
  f.branch_bias = nullptr;
}

// RESIDUAL: h += the branch (with its bias, where its projection left it), and the NORM
// after it in the same kernel — unless the branch's projection added it already. A
// tensor-parallel rank's share left in tmp is all-reduced by that kernel too.
template <typename T>
void residual(Flow<T>& f, const Stage& s) {
  if (f.branch_in_h) {
    f.branch_in_h = false;
    return;
  }
  const Stage& nx = *s.next;
  if (f.ar_pending) {
    f.ar_pending = false;
    tp_reduce_norm<T>(f.e, f.tmp, f.h, f.branch_bias, f.xn, nx.gamma, nx.beta, f.N, f.d.H,
                      nx.s.eps, nx.s.norm == GOLLM_NORM_RMS, true, false);
    f.norm = &nx;
    return;
  }
  if (const Stage* p = f.post) {
    // The few-row paths' kernels norm h themselves: no xn to write.
    post_residual_norm<T>(f.h, f.tmp, f.branch_bias, p->gamma, p->s.eps, f.small() ? nullptr : f.xn,
                          nx.gamma, nx.beta, f.N, f.d.H, nx.s.eps, nx.s.norm == GOLLM_NORM_RMS, f.stc);
    f.post = nullptr;
    f.norm = &nx;
    return;
  }
  residual_layernorm<T>(f.h, f.tmp, f.branch_bias, f.xn, nx.gamma, nx.beta, f.N, f.d.H, nx.s.eps,
                        nx.s.norm == GOLLM_NORM_RMS, f.stc);
  f.norm = &nx;
}

// LM_HEAD, per chunk of logit rows: the head (a gemv with the final norm on the few-row
// paths, else cuBLAS over the normed rows gathered), the gather and join of the ranks'
// vocabulary rows (or, on a tensor-parallel decode step of plain greedy rows or rows with
// top-k up to 64, the ranks' candidates merged), the sampling, and (eager mode) the logits
// copies.
template <typename T>
void lm_head(Flow<T>& f, const Stage& s, bool capture) {
  gollm_engine* e = f.e;
  const Plan& pl = f.pl;
  const int V = e->vocab, VR = f.d.V, H = f.d.H;
  // The LM head writes part ([rows][VR]); the whole-vocabulary logits are part itself on
  // one GPU, else the join of every rank's part.
  float* part = e->logits.as<float>();
  float* logits = f.tp ? e->tp_logits.as<float>() : part;
  float* retlog = e->retlog.as<float>();
  float* hlog = e->hlog.as<float>();
  // A tensor-parallel decode step of plain greedy rows (no logits returned: every rank
  // decides alike) samples from the ranks' candidates instead of the joined logits.
  // Guided decoding's masks keep the gather (ar_greedy_kernel reads none).
  const bool candidates = f.tp && pl.all_cand && pl.decode_only && pl.all_greedy && !(s.s.softcap > 0.f);
  // Sampled rows too, from each rank's first 64 (tp_sample).
  const bool sampled = f.tp && pl.all_cand && pl.decode_only && !pl.all_greedy && !(s.s.softcap > 0.f);
  for (size_t ci = 0; ci < pl.chunks.size(); ci++) {
    const Chunk& ch = pl.chunks[ci];
    const float* padded = nullptr;  // the LM head's padded rows, when sampling reads them
    if (f.small()) {
      GemvArgs a = f.args(ch.count);
      a.idx = f.I32(f.L.lrow_src) + ch.first;
      a.w = s.w, a.in = H, a.out = VR, a.y = part;
      gemv_any<T, GEMV_IN_LN, GEMV_OUT_F32>(f, a);
    } else if (e->invariant) {
      // The head's rows gathered, then the tiled kernel into this rank's logits.
      gather_rows<T>(f.xn, f.I32(f.L.lrow_src) + ch.first, e->xf.as<T>(), ch.count, H, f.st);
      GemvArgs a{};
      a.bulk = e->bulk, a.n = ch.count, a.w = s.w, a.in = H, a.out = VR, a.x = e->xf.as<T>(), a.y = part;
      tiled_proj<T, GEMV_OUT_F32>(a, e->tile_blocks, e->tile_smem, e->tile_part.as<float>(), e->tile_tickets.as<int>(), f.st);
    } else {
      gather_rows<T>(f.xn, f.I32(f.L.lrow_src) + ch.first, e->xf.as<T>(), ch.count, H, f.st);
      gemm_lm_head<T>(e, gemm_rows(ch.count));
      // Greedy sampling reads the padded rows where it is all that reads them (one GPU, no
      // logits copied back), which saves unpad_rows' copy.
      bool keep_padded = e->logits_pad.p && pl.all_greedy && !f.tp && !(s.s.softcap > 0.f);
      for (const CopyOut& cp : pl.copies)
        if (cp.chunk == (int)ci && !cp.from_ret) keep_padded = false;
      if (keep_padded)
        padded = e->logits_pad.as<float>();
      else if (e->logits_pad.p)
        unpad_rows(e->logits_pad.as<float>(), part, ch.count, VR, lm_head_ld(VR), f.st);
    }
    if (candidates) {
      // Each rank's maximum, its index and its sum of exponentials, merged: no logits leave
      // a rank.
      tp_greedy(e, part, f.I32(f.L.samp_seq) + ch.samp_first, f.I32(f.L.samp_row) + ch.samp_first,
                ch.samp_count, VR);
      continue;
    }
    if (sampled && tp_cand_fits(e, ch.samp_count)) {
      tp_sample(e, part, f.I32(f.L.samp_seq) + ch.samp_first, f.I32(f.L.samp_row) + ch.samp_first, f.seqs,
                ch.samp_count, VR);
      continue;
    }
    if (f.tp) {
      tp_all_gather(e, part, e->tp_gather.as<float>(), (size_t)ch.count * VR);
      join_vocab(e->tp_gather.as<float>(), logits, ch.count, VR, V, e->tp_size, f.st0);
    }
    if (s.s.softcap > 0.f) softcap(logits, (int64_t)ch.count * V, s.s.softcap, f.st);
    if (!capture) {
      for (const CopyOut& cp : pl.copies)
        if (cp.chunk == (int)ci && !cp.from_ret)
          CUDA_CHECK(cudaMemcpyAsync(hlog + cp.dst, logits + (int64_t)cp.row * V,
                                     (size_t)cp.rows * V * 4, cudaMemcpyDeviceToHost, f.st.st));
    }
    // A late step samples when its masks come (sample_late), from the logits left here.
    if (pl.late) e->late_padded = padded != nullptr;
    if (!pl.late)
      sample(logits, padded, f.I32(f.L.samp_seq) + ch.samp_first, f.I32(f.L.samp_row) + ch.samp_first,
             f.seqs, f.words, f.words, reinterpret_cast<const float*>(f.din), retlog,
             e->dtok.as<int32_t>(), e->dlp.as<float>(), ch.samp_count, V, e->greedy_part.as<float>(),
             e->greedy_tickets.as<int>(), pl.all_greedy, e->sms, f.st, e->invariant);
    if (!capture) {
      for (const CopyOut& cp : pl.copies)
        if (cp.chunk == (int)ci && cp.from_ret)
          CUDA_CHECK(cudaMemcpyAsync(hlog + cp.dst, retlog + (int64_t)cp.row * V,
                                     (size_t)cp.rows * V * 4, cudaMemcpyDeviceToHost, f.st.st));
    }
  }
}

// forward enqueues the whole step on the engine's stream, walking the recipe (checked at
// weights creation: weights.cu's check_recipe): each stage's dispatcher picks its kernel
// by the step's path, or finds its work done by a neighbour's kernel. In graph mode it is
// captured.
template <typename T>
void forward(gollm_engine* e, const Plan& pl, const Layout& L, int parts, bool capture) {
  Flow<T> f(e, pl, L, parts);
  for (const Stage& s : e->w->recipe) {
#ifdef GOLLM_MEASURE
    if (e->skip >> s.s.kind & 1) continue;
#endif
    switch (s.s.kind) {
      case GOLLM_STAGE_EMBED: embed(f, s); break;
      case GOLLM_STAGE_NORM: norm(f, s); break;
      case GOLLM_STAGE_QKV: qkv(f, s); break;
      case GOLLM_STAGE_ROTARY: break;  // applied by the kernel that writes the keys
      case GOLLM_STAGE_KV_WRITE: kv_write(f, s); break;
      case GOLLM_STAGE_ATTENTION: attention(f, s); break;
      case GOLLM_STAGE_OUT:
        branch(f, s.w, s.ws, s.b, f.d.att, f.att, "the attention output", s.s.layer, s.post != nullptr);
        break;
      case GOLLM_STAGE_MLP: mlp(f, s); break;
      case GOLLM_STAGE_RESIDUAL: residual(f, s); break;
      case GOLLM_STAGE_LM_HEAD: lm_head(f, s, capture); break;
      case GOLLM_STAGE_QK_NORM: break;  // applied by the kernel that writes the keys
      case GOLLM_STAGE_POST_NORM: f.post = &s; break;
      case GOLLM_STAGE_MOE: moe(f, s); break;
    }
  }
}

// warmup_gemms_t calls cuBLAS once on every padded row count a step can use (layer 0's
// QKV and output GEMMs, the first dense MLP's two — none where every MLP is experts —,
// the LM head), so that no step of a served model pays a shape's first call, and times
// each shape's cuBLASLt candidates on the real weights (blaslt.h) as it goes.
template <typename T>
int warmup_gemms_t(gollm_engine* e) {
  struct Tuning {  // tuning ends with the warm-up's GEMMs, thrown out of or not
    LtGemms& g;
    explicit Tuning(LtGemms& g_) : g(g_) { g.tune = true; }
    ~Tuning() { g.tune = false, g.tune_w.clear(); }
  } tuning(e->gemms);
  const Dims d(e->w->cfg);
  const Stage *qkv = nullptr, *out = nullptr, *mlp = nullptr;
  // Every layer's weights of each projection, which the tuning's timed runs take in turn.
  std::vector<const void*> qkv_w, out_w, up_w, down_w;
  for (const Stage& s : e->w->recipe) {
    if (s.s.kind == GOLLM_STAGE_QKV) qkv_w.push_back(s.w);
    if (s.s.kind == GOLLM_STAGE_OUT) out_w.push_back(s.w);
    if (s.s.kind == GOLLM_STAGE_MLP) up_w.push_back(s.w), down_w.push_back(s.w2);
    if (s.s.kind == GOLLM_STAGE_MLP && !mlp) mlp = &s;
    if (s.s.layer != 0) continue;
    if (s.s.kind == GOLLM_STAGE_QKV) qkv = &s;
    if (s.s.kind == GOLLM_STAGE_OUT) out = &s;
  }
  LtGemms& g = e->gemms;
  // Inputs zeroed: the calls compute on them.
  CUDA_CHECK(cudaMemsetAsync(e->xn.p, 0, e->xn.bytes, e->stream));
  CUDA_CHECK(cudaMemsetAsync(e->att.p, 0, e->att.bytes, e->stream));
  CUDA_CHECK(cudaMemsetAsync(e->fch.p, 0, e->fch.bytes, e->stream));
  CUDA_CHECK(cudaMemsetAsync(e->xf.p, 0, e->xf.bytes, e->stream));
  int shapes = 0;
  // FP8 projections: no cuBLAS, but cuBLASLt's FP8 GEMMs above the gemv's rows, each
  // shape's algorithm chosen here.
  if (e->w->fp8 && e->fp8lt) {
    for (int m = gemm_rows(kFp8GemvRows + 1); m <= gemm_rows(e->max_tokens); m = gemm_rows(m + 1)) {
      shapes += fp8lt_warm<T>(e, e->xn.p, qkv->w, qkv->ws, e->qkv.as<float>(), m, d.H, d.qkv);
      shapes += fp8lt_warm<T>(e, e->att.p, out->w, out->ws, e->tmp.as<float>(), m, d.att, d.H);
      if (!mlp) continue;
      shapes += fp8lt_warm<T>(e, e->xn.p, mlp->w, mlp->ws, e->fc.as<float>(), m, d.H, d.up);
      if (mlp->s.gated) fp8lt_warm<T>(e, e->xn.p, mlp->w, mlp->ws, e->fc.as<float>(), m, d.H, d.up, true);
      shapes += fp8lt_warm<T>(e, e->fch.p, mlp->w2, mlp->ws2, e->tmp.as<float>(), m, d.I, d.H);
    }
  }
  const int top = e->w->fp8 ? 0 : gemm_rows(e->max_tokens);  // FP8 projections: no cuBLAS
  const int rtop = gemm_rows(e->max_logit_rows);
  // Fewest rows first, the LM head's among them: the tuning's budget goes to the decode
  // buckets before the long prompt chunks.
  for (int m = 16; m <= std::max(top, rtop); m = gemm_rows(m + 1)) {
    g.tune_w.clear();
    if (m <= rtop) gemm_lm_head<T>(e, m), shapes++;
    if (m > top) continue;
    g.tune_w = qkv_w;
    gemm<T>(e, e->xn.p, qkv->w, e->qkv.as<float>(), m, d.H, d.qkv);
    g.tune_w = out_w;
    gemm<T>(e, e->att.p, out->w, e->tmp.as<float>(), m, d.att, d.H);
    shapes += 2;
    if (!mlp) continue;
    g.tune_w = up_w;
    gemm<T>(e, e->xn.p, mlp->w, e->fc.as<float>(), m, d.H, d.up);
    g.tune_w = down_w;
    gemm<T>(e, e->fch.p, mlp->w2, e->tmp.as<float>(), m, d.I, d.H);
    shapes += 2;
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

// setup_attention raises the attention kernels' dynamic shared-memory limits, for a pool
// of element type K.
template <typename T, typename K>
void setup_attention(gollm_engine* e) {
  const gollm_model_config& c = e->w->cfg;
  allow_smem_max(attention_context_tc_kernel<T, K>, e->device);
  allow_smem_max(attention_context_mma_kernel<T, K, 64>, e->device);
  allow_smem_max(attention_context_mma_kernel<T, K, 80>, e->device);
  allow_smem_max(attention_context_mma_kernel<T, K, 128>, e->device);
  allow_smem_max(attention_context_kernel<T, K>, e->device);
  // Decode attention holds a row's scores: what it needs follows the longest sequence.
  const size_t ds = decode_smem(c.head_dim, e->max_len);
  if (ds > dynamic_smem_max(attention_decode_kernel<T, K, true>, e->device))
    invalid("max_seq_len %d: decode attention needs %zu bytes of shared memory, more than the "
            "device allows a block",
            e->max_len, ds);
  allow_smem_max(attention_decode_kernel<T, K, true>, e->device);
  allow_smem_max(attention_decode_kernel<T, K, false>, e->device);
  allow_smem_max(attention_decode_kernel<T, K, true, false, true>, e->device);
  // The soft-capped variants (dense.cuh's attention_capped), for the models that take them.
  bool capped = false;
  for (const Stage& s : e->w->recipe) capped = capped || (s.s.kind == GOLLM_STAGE_ATTENTION && s.s.softcap > 0.f);
  if (capped) {
    allow_smem_max(attention_context_kernel<T, K, true>, e->device);
    allow_smem_max(attention_decode_kernel<T, K, true, true>, e->device);
    allow_smem_max(attention_decode_kernel<T, K, false, true>, e->device);
    allow_smem_max(attention_decode_kernel<T, K, true, true, true>, e->device);
  }
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
  // The fused MLP adds to h itself: a post-normed MLP output cannot take it.
  if (e->fused)
    e->fused = !c.post_norms && fused_setup<T>(c.hidden, c.inner, c.gated_mlp != 0, e->sms, e->device, e->mlp_k);
  if (e->moe.chunk > 0) moe_allow_smem(e->device);
  if (e->kv_fp8)
    setup_attention<T, kv8>(e);
  else
    setup_attention<T, T>(e);
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

size_t create_fp8lt(gollm_engine* e, bool off) {
  const gollm_weights* w = e->w;
  if (!w->fp8 || off) return 0;
  int major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, e->device));
  // Block-scaled FP8 matmuls: cuBLASLt 12.9 and later, on Hopper.
  if (major != 9 || cublasLtGetVersion() < 120900) {
    std::fprintf(stderr, "gollm: cuBLASLt %zu on sm_%d0 has no block-scaled FP8 GEMMs; FP8 projections keep gollm's own kernels\n",
                 cublasLtGetVersion(), major);
    return 0;
  }
  e->fp8lt.reset(new Fp8Lt);
  Fp8Lt& lt = *e->fp8lt;
  CUBLAS_CHECK(cublasLtCreate(&lt.lt));
  lt.ws = e->blas_ws.p, lt.ws_bytes = e->blas_ws.bytes, lt.sms = e->sms;
  const Dims d(w->cfg);
  const size_t NG = gemm_rows(e->max_tokens);
  const size_t K = std::max({d.H, d.att, d.I}), G = (K + kFp8Group - 1) / kFp8Group;
  lt.xq.alloc(NG * K, "FP8 quantized activations");
  lt.xs.alloc(G * NG * 4, "FP8 activation scales");
  lt.yb_need = NG * std::max({d.qkv, d.up, d.H}) * 2;
  std::vector<std::tuple<const float*, int, int>> ws;
  for (const Stage& s : w->recipe) {
    if (s.s.kind == GOLLM_STAGE_QKV) ws.emplace_back(s.ws, d.qkv, d.H);
    if (s.s.kind == GOLLM_STAGE_OUT) ws.emplace_back(s.ws, d.H, d.att);
    if (s.s.kind == GOLLM_STAGE_MLP) {
      ws.emplace_back(s.ws, d.up, d.H);
      ws.emplace_back(s.ws2, d.H, d.I);
    }
  }
  fp8lt_blocks(lt, ws, e->stream);
  return lt.xq.bytes + lt.xs.bytes + lt.blk.bytes;
}

void feed_tokens(gollm_engine* e, const Layout& L, size_t pairs_off, int n) {
  if (n == 0) return;
  char* din = e->din.as<char>();
  launch("feed_tokens_kernel", feed_tokens_kernel, (n + 127) / 128, 128, 0, Stream(e->stream, false),
         reinterpret_cast<int32_t*>(din + L.row_tok), e->dtok.as<const int32_t>(),
         reinterpret_cast<const int32_t*>(din + pairs_off), n, e->vocab);
}

void sample_late(gollm_engine* e, const Launched& l) {
  // One GPU, one chunk, no logits returned (launch checks): the LM head's rows are in
  // e->logits, or padded in e->logits_pad (l.padded), the inputs at the launch's offsets
  // of din.
  const char* din = e->din.as<char>();
  const int32_t* words = reinterpret_cast<const int32_t*>(din);
  sample(e->logits.as<float>(), l.padded ? e->logits_pad.as<float>() : nullptr,
         reinterpret_cast<const int32_t*>(din + l.samp_seq),
         reinterpret_cast<const int32_t*>(din + l.samp_row),
         reinterpret_cast<const DevSeq*>(din + l.seqs_off), words, words,
         reinterpret_cast<const float*>(din), e->retlog.as<float>(), e->dtok.as<int32_t>(),
         e->dlp.as<float>(), l.samp_count, e->vocab, e->greedy_part.as<float>(),
         e->greedy_tickets.as<int>(), l.all_greedy, e->sms, Stream(e->stream, false));
}

void setup_kernels(gollm_engine* e) {
  if (e->w->dtype == GOLLM_DTYPE_BF16)
    setup_kernels_t<__nv_bfloat16>(e);
  else
    setup_kernels_t<__half>(e);
}

}  // namespace gollm

namespace gollm {

template <typename T>
void residual_norm(float* h, const float* a, const float* bias, T* xn, const float* gamma, int n,
                   int hidden, float eps, cudaStream_t st) {
  residual_layernorm<T>(h, a, bias, xn, gamma, nullptr, n, hidden, eps, true, Stream(st, false));
}
template void residual_norm<__half>(float*, const float*, const float*, __half*, const float*, int,
                                    int, float, cudaStream_t);
template void residual_norm<__nv_bfloat16>(float*, const float*, const float*, __nv_bfloat16*,
                                           const float*, int, int, float, cudaStream_t);

}  // namespace gollm

void Fp8LtFree::operator()(gollm::Fp8Lt* lt) const { delete lt; }

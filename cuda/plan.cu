// plan.cu — one step's descriptor checked against the engine (every offset, token and
// block id, before anything touches the GPU) and laid out: token rows, attention tiles and
// decode rows, LM-head chunks, sampling entries, logits copies, and the device input
// buffer (fixed part, then block tables, penalties, masks and biases by word offset).
#include <cstring>

#include "internal.h"

namespace gollm {

// build_plan checks a step descriptor against the engine and lays it out. In graph mode
// (bucket > 0) the step is padded to bucket sequences of one token each.
void build_plan(gollm_engine* e, const gollm_step_in* in, int64_t logits_len, Plan& pl) {
  const int T = e->geom.tokens_per_block, V = e->vocab;
  if (in->num_seqs < 0 || in->num_tokens < 0 || in->num_block_ids < 0 || in->num_penalties < 0 ||
      in->num_masks < 0 || in->num_bias < 0 || in->num_allowed < 0)
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
  need(in->num_allowed == 0 || in->allowed || in->late_allowed, "allowed");

  pl = Plan{};
  pl.s = in->num_seqs;
  pl.seqs.resize(pl.s);
  pl.words.clear();
  bool decode_only = pl.s > 0;
  bool chained = false;
  int64_t n = 0;
  for (int s = 0; s < pl.s; s++) {
    const gollm_seq& q = in->seqs[s];
    if (q.token_count < 1) invalid("sequence %d: token_count %d must be at least 1", s, q.token_count);
    if (q.token_offset < 0 || (int64_t)q.token_offset + q.token_count > in->num_tokens)
      invalid("sequence %d: tokens [%d, +%d) outside the %d tokens", s, q.token_offset,
              q.token_count, in->num_tokens);
    if (q.pos < 0 || (int64_t)q.pos + q.token_count > e->max_len)
      invalid("sequence %d: positions [%d, %lld) outside the engine's %d", s, q.pos,
              (long long)q.pos + q.token_count, e->max_len);
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
      if (in->late_allowed && q.allowed_offset != -1)
        invalid("sequence %d: allowed_offset %d in a launch whose masks come later (late_allowed)",
                s, q.allowed_offset);
      if (q.allowed_offset < -1 ||
          q.allowed_offset >= 0 && (int64_t)q.allowed_offset + (V + 31) / 32 > in->num_allowed)
        invalid("sequence %d: allowed tokens [%d, +%d words) outside the %lld words", s,
                q.allowed_offset, (V + 31) / 32, (long long)in->num_allowed);
      if (!(q.min_p >= 0.f && q.min_p <= 1.f)) invalid("sequence %d: min_p %g out of [0, 1]", s, q.min_p);
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
    if (q.flags & GOLLM_SEQ_CHAINED) chained = true;
    n += q.token_count;
    pl.max_len = std::max<int>(pl.max_len, (int)end);
    if (q.token_count != 1 || !sample || ret || ctx) decode_only = false;
  }
  if (n > e->max_tokens)
    invalid("step: %lld tokens exceed the engine's max_tokens %d", (long long)n, e->max_tokens);
  pl.n = (int)n;
  pl.decode_only = decode_only;
  pl.chained = chained;
}

// prompt_pad says whether a step that is not decode-only can replay a prompt graph, and
// to what counts it is padded: token rows to gemm_rows' sizes (cuBLAS's own row counts),
// attention tiles, decode rows and logit rows to powers of two, and the sequences to one
// more than the step's, rounded up to a power of two (sequence pl.s is the padding
// sequence, at position 0 of the padding block). A step qualifies when it takes cuBLAS's
// path (more rows than the gemv and tiled kernels take), returns no logits (the copies
// are eager), runs on one GPU, and every padded count fits the engine's buffers.
bool prompt_pad(const gollm_engine* e, const gollm_step_in* in, const Plan& pl, PromptPad& pp) {
  if (!e->prompt_graphs || pl.decode_only || pl.s == 0 || e->tp_size > 1) return false;
  const int n = pl.n;
  if (n <= std::max({kGemvMaxRows, e->tiled ? e->tiled_rows : 0, 4})) return false;
  const int Q = ctx_queries(e->w->cfg.head_dim);
  int tiles = 0, decs = 0, lrows = 0;
  for (int s = 0; s < pl.s; s++) {
    const gollm_seq& q = in->seqs[s];
    if (q.flags & (GOLLM_SEQ_RETURN_LOGITS | GOLLM_SEQ_CONTEXT_LOGITS)) return false;
    if (q.token_count == 1)
      decs++;
    else
      tiles += (q.token_count + Q - 1) / Q;
    if (q.flags & GOLLM_SEQ_SAMPLE) lrows++;
  }
  auto pow2 = [](int v) { return v == 0 ? 0 : pow2_at_least(v); };  // none stays none
  pp.decs = pow2(decs);
  pp.tiles = pow2(tiles);
  pp.lrows = pow2(lrows);
  pp.seqs = pow2(pl.s + 1);
  // Padding decode rows attend from a padding row of their own.
  pp.rows = gemm_rows(n + (pp.decs > decs ? 1 : 0));
  // h holds max_tokens rows; decode attention's splits min(max_tokens, max_seqs) rows;
  // the LM head max_logit_rows in one chunk.
  return pp.rows <= e->max_tokens && pp.decs <= std::min(e->max_tokens, e->max_seqs) &&
         pp.lrows <= e->max_logit_rows && pp.tiles <= (1 << 20);
}

namespace {

// pad_prompt_rows pads the rows of a plan (row of them so far) to pp's counts: padding
// rows (token 0 at position 0 of the padding sequence, pl.s), decode rows on the first
// padding row, and empty attention tiles.
void pad_prompt_rows(const PromptPad& pp, Plan& pl, int& row) {
  const int first = row;
  for (; row < pp.rows; row++) {
    pl.row_tok.push_back(0);
    pl.row_pos.push_back(0);
    pl.row_seq.push_back(pl.s);
  }
  while ((int)pl.dec_rows.size() < pp.decs) pl.dec_rows.push_back(first);
  while ((int)pl.tiles.size() < pp.tiles) pl.tiles.push_back(CtxTile{pl.s, 0, 0, 0});
}

// pad_prompt_lrows pads the logit rows, in the LM head's single chunk, to pp's count:
// row 0 again, which no sampling entry reads.
void pad_prompt_lrows(const PromptPad& pp, Plan& pl) {
  if (pp.lrows == 0) return;
  Chunk& ch = pl.chunks.at(0);
  for (int r = (int)pl.lrow_src.size(); r < pp.lrows; r++) {
    pl.lrow_src.push_back(0);
    pl.samp_seq.push_back(-1);
    pl.samp_row.push_back(r);
  }
  ch.count = pp.lrows;
  ch.samp_count = pp.lrows;
}

}  // namespace

// fill_plan lays out the rows, attention work, LM-head chunks and the variable inputs.
// bucket > 0 pads a decode-only step to bucket sequences (a decode graph); pp, where
// given, pads a step on the many-rows path to a prompt graph's counts.
void fill_plan(gollm_engine* e, const gollm_step_in* in, int bucket, const PromptPad* pp,
               Plan& pl) {
  const gollm_model_config& c = e->w->cfg;
  const int V = e->vocab, R = e->max_logit_rows;
  const int S = bucket > 0 ? bucket : pp ? pp->seqs : pl.s;
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
  if (pp) pad_prompt_rows(*pp, pl, row);
  // Padding of a decode graph's bucket: one token at position 0 in the padding block, no
  // logits read back, no sampling.
  for (int s = pl.s; s < S && !pp; s++) {
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
  if (pp) pad_prompt_lrows(*pp, pl);
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
  const int V = e->vocab;
  const int64_t base = (int64_t)(L.var / 4);
  auto& W = pl.words;
  W.clear();
  // The padding block's id, for the padding sequences of a graph bucket.
  const int64_t pad_word = base + (int64_t)W.size();
  W.push_back(e->num_blocks);
  // allow_at: each distinct allowed_offset's words in W (absolute word index).
  std::vector<std::pair<int32_t, int32_t>> allow_at;
  for (int s = 0; s < (int)pl.seqs.size(); s++) {
    DevSeq& d = pl.seqs[s];
    int keep_ret = s < pl.s ? d.ret_row : -1;
    d = DevSeq{};
    d.ret_row = keep_ret;
    d.bias_off = -1;
    d.allow_off = -1;
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
      d.min_p = q.min_p;
      if (q.allowed_offset >= 0) {
        // Rows given the same words (one constraint state's mask) share one copy.
        d.allow_off = -1;
        for (const auto& a : allow_at)
          if (a.first == q.allowed_offset) d.allow_off = a.second;
        if (d.allow_off < 0) {
          d.allow_off = (int32_t)(base + (int64_t)W.size());
          allow_at.emplace_back(q.allowed_offset, d.allow_off);
          const int words = (V + 31) / 32;
          size_t at = W.size();
          W.resize(at + words);
          std::memcpy(W.data() + at, in->allowed + q.allowed_offset, (size_t)words * 4);
        }
      }
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
  if (bytes > e->din.bytes) {
    size_t n = align_up(std::max(bytes, e->din.bytes * 2), 1 << 20);
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    e->din.alloc(n, "step inputs");
    drop_graphs(e);
  }
  // The current staging is no launched step's (launch), and may have stayed smaller than
  // din while the other one grew.
  if (bytes > e->hin.bytes) e->hin.alloc(e->din.bytes, "step inputs (host)");
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

}  // namespace gollm

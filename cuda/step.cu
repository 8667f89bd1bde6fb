// step.cu — one step end to end: the plan, the inputs staged and copied in one transfer,
// the forward pass run eagerly or replayed from a CUDA graph — a decode-only step's batch
// bucket's (captured on first use or in the warm-up), or a prompt step's padded shape's
// (captured when the shape recurs) —, the results copied back; and the warm-up a new
// engine runs before it serves.
#include <chrono>
#include <cstring>

#include "internal.h"

namespace gollm {

// attention_splits is how many ways decode attention splits each row's positions for a
// step of rows decode rows up to max_len long: gollm_tuning.decode_parts where set, else
// decode_splits. Under batch invariance forward() caps a row's parts at a step of one
// row's count.
int attention_splits(const gollm_engine* e, int rows, int max_len) {
  return e->decode_parts > 0 ? e->decode_parts
                             : decode_splits(std::max(1, rows), e->w->cfg.heads, e->sms, max_len);
}

namespace {

int bucket_for(gollm_engine* e, int s) { return std::min(pow2_at_least(s), e->max_seqs); }

// copy_blocks runs a step's KV block copies (beams that diverge inside a shared block get
// a copy of it before writing there): one device-to-device copy per block, queued on the
// engine's stream ahead of the step's own work, which is stream-ordered after them. They
// are not part of any captured graph. Every id is checked before the first copy.
void copy_blocks(gollm_engine* e, const gollm_step_in* in) {
  const int n = in->num_block_copies;
  if (n == 0) return;
  if (n < 0 || !in->block_copies) invalid("step: %d block copies, block_copies %s", n,
                                          in->block_copies ? "given" : "NULL");
  for (int i = 0; i < 2 * n; i++) {
    const int32_t id = in->block_copies[i];
    if (id < 0 || id >= e->num_blocks)
      invalid("step: block copy %d: block %d outside the pool [0, %d)", i / 2, id, e->num_blocks);
  }
  // A block is page(1, 0, 0, 0) elements of 2 bytes (fp16 or bf16) or 1 (FP8), as
  // engine.cu sizes it.
  const size_t bytes = (size_t)e->geom.page(1, 0, 0, 0) * kv_elem_bytes(e);
  char* kv = static_cast<char*>(e->kv.p);
  for (int i = 0; i < n; i++) {
    const size_t src = (size_t)in->block_copies[2 * i], dst = (size_t)in->block_copies[2 * i + 1];
    CUDA_CHECK(cudaMemcpyAsync(kv + dst * bytes, kv + src * bytes, bytes, cudaMemcpyDeviceToDevice,
                               e->stream));
  }
}

// check_feed validates a launch's fed sequences against the step launched before it
// and returns how many there are.
int check_feed(gollm_engine* e, const gollm_step_in* in) {
  if (!in->feed) return 0;
  if (e->launched_count != 1)
    invalid("gollm_launch: fed sequences need the previous step launched and not waited for "
            "(%d are)", e->launched_count);
  const Launched& prev = e->launched[e->launched_head];
  int n = 0;
  for (int s = 0; s < in->num_seqs; s++) {
    const int32_t f = in->feed[s];
    if (f < 0) continue;
    if (f >= prev.s || !prev.sample[f])
      invalid("sequence %d: feed %d names no sampling sequence of the %d of the previous step", s,
              f, prev.s);
    if (in->seqs[s].token_count != 1)
      invalid("sequence %d: a fed sequence has one new token, not %d", s, in->seqs[s].token_count);
    n++;
  }
  return n;
}

// swap_staging makes the other set of pinned staging buffers the current one.
void swap_staging(gollm_engine* e) {
  e->hin.swap(e->alt_hin);
  e->htok.swap(e->alt_htok);
  e->hlp.swap(e->alt_hlp);
  e->hlog.swap(e->alt_hlog);
}


// kPromptGraphs is the most prompt graphs an engine keeps; kPromptSeen bounds the keys
// remembered as seen once. Past its first kPromptGraphs captures an engine captures again
// only while its replays outnumber its captures kPromptReplays to one: a capture and its
// instantiation cost a few eager steps' host time, which traffic whose padded counts
// rarely recur would pay at every step.
constexpr int kPromptGraphs = 64;
constexpr size_t kPromptSeen = 4096;
constexpr int64_t kPromptReplays = 4;

// capture_graph captures the forward pass of plan pl (laid out as L, decode attention in
// splits) and instantiates it.
cudaGraphExec_t capture_graph(gollm_engine* e, const Plan& pl, const Layout& L, int splits) {
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
  if (e->comm) comm_graph_add(e->comm, e->device, ex);
  return ex;
}

// prompt_graph is the prompt graph of key, captured now where the key was seen before
// (the least recently replayed one dropped when kPromptGraphs are held), or null: the
// step then runs eagerly, on the same padded plan.
cudaGraphExec_t prompt_graph(gollm_engine* e, const PromptKey& key, const Plan& pl,
                             const Layout& L, int splits) {
  auto it = e->prompt_execs.find(key);
  if (it != e->prompt_execs.end()) {
    it->second.used = e->steps;
    e->prompt_replays++;
    return it->second.exec;
  }
  if (e->prompt_seen.size() >= kPromptSeen) e->prompt_seen.clear();
  if (e->prompt_seen[key]++ == 0) return nullptr;
  if (e->prompt_captures >= kPromptGraphs && e->prompt_captures * kPromptReplays > e->prompt_replays)
    return nullptr;
  if ((int)e->prompt_execs.size() >= kPromptGraphs) {
    auto old = e->prompt_execs.begin();
    for (auto u = e->prompt_execs.begin(); u != e->prompt_execs.end(); ++u)
      if (u->second.used < old->second.used) old = u;
    // A replay of it may still run.
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    cudaGraphExec_t ex = old->second.exec;
    e->prompt_execs.erase(old);
    CUDA_CHECK(cudaGraphExecDestroy(ex));
  }
  cudaGraphExec_t ex = capture_graph(e, pl, L, splits);
  e->prompt_execs.emplace(key, PromptGraph{ex, e->steps});
  e->prompt_captures++;
  return ex;
}

}  // namespace

void launch(gollm_engine* e, const gollm_step_in* in, int64_t logits_len, bool inject) {
  if (!e || !in) invalid("gollm_launch: engine and in must not be NULL");
  if (e->launched_count >= 2) invalid("gollm_launch: two steps are launched and not waited for");
  DeviceGuard dg(e->device);
  if (e->comm) tp_check(e);
  if (inject && e->fail.early) inject_step_fault(e);  // before any of the step's work
  if (e->launched_count > 0 && e->launched[(e->launched_head + e->launched_count - 1) % 2].late)
    invalid("gollm_launch: the launch before waits for its masks (gollm_supply_allowed)");
  const bool late = in->late_allowed != 0;
  if (late && (e->tp_size > 1 || in->num_allowed > INT32_MAX))
    invalid("gollm_launch: late_allowed needs one GPU and at most 2^31 words");
  const int nfeed = check_feed(e, in);
  // This step's staging must not be the one a launched step still copies through.
  if (e->launched_count == 1 && e->launched[e->launched_head].hin == e->hin.p) swap_staging(e);
  copy_blocks(e, in);
  Plan& pl = e->plan;
  build_plan(e, in, logits_len, pl);
  pl.late = late;
  const int bucket = e->graphs && pl.decode_only ? bucket_for(e, pl.s) : 0;
  const bool use_graph = pl.s > 0 && bucket > 0 && bucket <= e->max_tokens;
  // A step on the many-rows path is padded to its prompt graph's counts whether or not
  // the graph is replayed this time, so that its results do not depend on that.
  PromptPad pp;
  const bool padded = !use_graph && prompt_pad(e, in, pl, pp);
  if (late && pl.s == 0) invalid("gollm_launch: late_allowed on an empty step");
  Launched& l = e->launched[(e->launched_head + e->launched_count) % 2];
  l.late = false;
  if (pl.s > 0) {
    fill_plan(e, in, use_graph ? bucket : 0, padded ? &pp : nullptr, pl);
    // The sampling of a late step reads the one chunk's logits its LM head leaves.
    if (late && (!pl.copies.empty() || pl.chunks.size() != 1))
      invalid("gollm_launch: late_allowed with logits returned");
    Layout L = layout_fixed(pl);
    fill_var(e, in, pl, L);
    // The fed rows' (row, previous sequence) pairs follow the variable part.
    const size_t pairs_off = align_up(L.total);
    if (nfeed > 0) L.total = pairs_off + (size_t)nfeed * 8;
    // A late launch's masks come after the rest, uploaded by gollm_supply_allowed.
    const size_t upload = L.total;
    const size_t late_off = align_up(L.total);
    if (late) {
      L.total = late_off + (size_t)in->num_allowed * 4;
      if (L.total / 4 > INT32_MAX) invalid("step: inputs exceed 2^31 words");
    }
    // Steps whose rows are all plain greedy skip the general sampling kernel's launch.
    pl.all_greedy = true;
    for (int s = 0; s < pl.s; s++) pl.all_greedy = pl.all_greedy && greedy_fast(pl.seqs[s]);
    pl.all_cand = e->tp_cands && !late;
    for (int s = 0; s < pl.s && pl.all_cand; s++)
      pl.all_cand = (greedy_fast(pl.seqs[s]) && pl.seqs[s].allow_off < 0) || tp_cand_row(pl.seqs[s]);
    // fill_var ran after the descriptors were sized; the layout's fixed part is unchanged.
    bool grew = L.total > e->din.bytes || L.total > e->hin.bytes;
    ensure_inputs(e, L.total);
    // Returned logits are staged in pinned memory.
    int64_t log_need = 0;
    for (const CopyOut& cp : pl.copies)
      log_need = std::max<int64_t>(log_need, cp.dst + (int64_t)cp.rows * e->vocab);
    if ((size_t)log_need * 4 > e->hlog.bytes) {
      e->hlog.alloc(align_up((size_t)log_need * 4, 1 << 20), "logits (host)");
      grew = true;
    }
    if (e->tp_size > 1) {
      // Every rank computes the same logits and tokens; rank 0 alone copies logits back
      // (the caller reads its results only), though every rank sizes the same buffers.
      if (e->tp_rank > 0) pl.copies.clear();
      // Freeing and allocating device or pinned memory may wait for work on the GPUs: a
      // rank doing it while another has this step's collectives waiting for it would
      // wait forever. The ranks grow their buffers at the same steps (the same inputs);
      // none enqueues this step's work before every one has.
      if (grew) comm_barrier(e->comm, e->tp_rank);
    }
    stage(e, pl, L);
    if (nfeed > 0) {
      int32_t* pairs = reinterpret_cast<int32_t*>(e->hin.as<char>() + pairs_off);
      for (int s = 0, row = 0, k = 0; s < pl.s; row += in->seqs[s].token_count, s++)
        if (in->feed[s] >= 0) pairs[2 * k] = row, pairs[2 * k + 1] = in->feed[s], k++;
    }
    CUDA_CHECK(cudaMemcpyAsync(e->din.p, e->hin.p, upload, cudaMemcpyHostToDevice, e->stream));
    // The previous step's sampled tokens are still in dtok: this step samples after this.
    feed_tokens(e, L, pairs_off, nfeed);
    if (use_graph) {
      // Chained rows (a sequence's proposals) replay a graph whose attention waits for
      // every row's keys and values (forward.cu); all_cand rows one that samples from the
      // ranks' candidates.
      const int key = (((bucket * 2 + (pl.all_greedy ? 1 : 0)) * 2 + (late ? 1 : 0)) * 2 +
                       (pl.chained ? 1 : 0)) * 2 +
                      (pl.all_cand ? 1 : 0);
      auto it = e->graph_execs.find(key);
      if (it == e->graph_execs.end()) {
        // Replays see other lengths: size the splits for the longest possible row.
        cudaGraphExec_t g = capture_graph(e, pl, L, attention_splits(e, bucket, e->max_len));
        it = e->graph_execs.emplace(key, g).first;
        if (late) e->late_padded_keys[key] = e->late_padded;  // set by the capture
        // Instantiating may allocate: as for the buffers above, no rank replays the new
        // graph's collectives before every rank has instantiated its own.
        if (e->tp_size > 1) comm_barrier(e->comm, e->tp_rank);
      }
      cudaGraphExec_t ex = it->second;
      if (late) e->late_padded = e->late_padded_keys.at(key);
      if (e->comm)
        tp_graph_launch(e, ex);  // its collectives: not after an abort
      else
        CUDA_CHECK(cudaGraphLaunch(ex, e->stream));
    } else if (padded && !late) {
      const int splits = attention_splits(e, pp.decs, e->max_len);
      cudaGraphExec_t ex =
          pl.chained ? nullptr : prompt_graph(e, PromptKey{pp, pl.all_greedy}, pl, L, splits);
      if (ex)
        CUDA_CHECK(cudaGraphLaunch(ex, e->stream));
      else
        run_forward(e, pl, L, splits, false);
    } else {
      run_forward(e, pl, L, attention_splits(e, (int)pl.dec_rows.size(), pl.max_len), false);
    }
    // With the forward pass enqueued and running: the injected fault (gollm_faults).
    if (inject && !e->fail.early) inject_step_fault(e);
    if (late) {
      l.late = true;
      l.seqs_off = L.seqs;
      l.late_off = late_off, l.late_cap = in->num_allowed;
      l.samp_seq = L.samp_seq + (size_t)pl.chunks[0].samp_first * 4;
      l.samp_row = L.samp_row + (size_t)pl.chunks[0].samp_first * 4;
      l.samp_count = pl.chunks[0].samp_count;
      l.all_greedy = pl.all_greedy;
      l.padded = e->late_padded;
    } else {
      CUDA_CHECK(cudaMemcpyAsync(e->htok.p, e->dtok.p, (size_t)pl.s * 4, cudaMemcpyDeviceToHost, e->stream));
      CUDA_CHECK(cudaMemcpyAsync(e->hlp.p, e->dlp.p, (size_t)pl.s * 4, cudaMemcpyDeviceToHost, e->stream));
    }
  }
  if (!l.done) CUDA_CHECK(cudaEventCreateWithFlags(&l.done, cudaEventDisableTiming));
  if (!l.late) CUDA_CHECK(cudaEventRecord(l.done, e->stream));
  l.s = pl.s;
  l.sample.resize(pl.s);
  for (int s = 0; s < pl.s; s++) l.sample[s] = (in->seqs[s].flags & GOLLM_SEQ_SAMPLE) != 0;
  l.copies = pl.copies;
  l.logits_len = logits_len;
  l.hin = e->hin.p;
  l.htok = e->htok.as<int32_t>();
  l.hlp = e->hlp.as<float>();
  l.hlog = e->hlog.as<float>();
  e->launched_count++;
}

void wait_step(gollm_engine* e, gollm_step_out* out) {
  if (!e || !out) invalid("gollm_wait: engine and out must not be NULL");
  if (e->launched_count == 0) invalid("gollm_wait: no step is launched");
  DeviceGuard dg(e->device);
  Launched& l = e->launched[e->launched_head];
  if (l.late) invalid("gollm_wait: the step waits for its masks (gollm_supply_allowed)");
  // Whatever happens below, this step is no longer waited for.
  e->launched_head = (e->launched_head + 1) % 2;
  e->launched_count--;
  if (l.s > 0 && (!out->tokens || !out->log_probs))
    invalid("gollm_wait: out.tokens and out.log_probs must not be NULL");
  if (!l.copies.empty() && (!out->logits || out->logits_len < l.logits_len))
    invalid("gollm_wait: out.logits holds %lld floats, the step was launched for %lld",
            (long long)out->logits_len, (long long)l.logits_len);
  CUDA_CHECK(cudaEventSynchronize(l.done));
  // An abort lets a rank's collectives return without their results.
  if (e->comm) tp_check(e);
  for (int s = 0; s < l.s; s++) {
    const bool sample = l.sample[s];
    // -2 (every token masked) goes out as it is: that sequence fails, not the step.
    out->tokens[s] = sample ? l.htok[s] : -1;
    out->log_probs[s] = sample ? l.hlp[s] : 0.f;
  }
  const int V = e->vocab;
  for (const CopyOut& cp : l.copies)
    std::memcpy(out->logits + cp.dst, l.hlog + cp.dst, (size_t)cp.rows * V * 4);
}

void drop_launched(gollm_engine* e) {
  e->launched_head = 0;
  e->launched_count = 0;
  for (Launched& l : e->launched) l.late = false;
}

void supply_allowed(gollm_engine* e, const int32_t* offsets, int32_t num_seqs,
                    const uint32_t* allowed, int64_t num_allowed) {
  if (!e) invalid("gollm_supply_allowed: engine is NULL");
  if (e->launched_count == 0) invalid("gollm_supply_allowed: no step is launched");
  Launched& l = e->launched[(e->launched_head + e->launched_count - 1) % 2];
  if (!l.late) invalid("gollm_supply_allowed: the latest launch was not made with late_allowed");
  if (num_seqs != l.s) invalid("gollm_supply_allowed: %d offsets for a step of %d sequences", num_seqs, l.s);
  if (num_allowed < 0 || num_allowed > l.late_cap)
    invalid("gollm_supply_allowed: %lld words; the launch has room for %lld", (long long)num_allowed,
            (long long)l.late_cap);
  if (num_seqs > 0 && !offsets) invalid("gollm_supply_allowed: offsets is NULL");
  if (num_allowed > 0 && !allowed) invalid("gollm_supply_allowed: allowed is NULL");
  const int words = (e->vocab + 31) / 32;
  for (int s = 0; s < num_seqs; s++)
    if (offsets[s] < -1 || offsets[s] >= 0 && (int64_t)offsets[s] + words > num_allowed)
      invalid("gollm_supply_allowed: sequence %d: allowed tokens [%d, +%d words) outside the %lld words",
              s, offsets[s], words, (long long)num_allowed);
  DeviceGuard dg(e->device);
  // The launch's own staging still holds its descriptors: only the masks' offsets change,
  // which nothing before the sampling reads.
  char* h = static_cast<char*>(const_cast<void*>(l.hin));
  DevSeq* d = reinterpret_cast<DevSeq*>(h + l.seqs_off);
  const int32_t base = (int32_t)(l.late_off / 4);
  for (int s = 0; s < num_seqs; s++) d[s].allow_off = offsets[s] < 0 ? -1 : base + offsets[s];
  if (num_allowed > 0) std::memcpy(h + l.late_off, allowed, (size_t)num_allowed * 4);
  char* din = e->din.as<char>();
  CUDA_CHECK(cudaMemcpyAsync(din + l.seqs_off, h + l.seqs_off, (size_t)num_seqs * sizeof(DevSeq),
                             cudaMemcpyHostToDevice, e->stream));
  if (num_allowed > 0)
    CUDA_CHECK(cudaMemcpyAsync(din + l.late_off, h + l.late_off, (size_t)num_allowed * 4,
                               cudaMemcpyHostToDevice, e->stream));
  sample_late(e, l);
  CUDA_CHECK(cudaMemcpyAsync(const_cast<int32_t*>(l.htok), e->dtok.p, (size_t)l.s * 4,
                             cudaMemcpyDeviceToHost, e->stream));
  CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(l.hlp), e->dlp.p, (size_t)l.s * 4,
                             cudaMemcpyDeviceToHost, e->stream));
  CUDA_CHECK(cudaEventRecord(l.done, e->stream));
  l.late = false;
}

void step(gollm_engine* e, const gollm_step_in* in, gollm_step_out* out, bool inject) {
  if (!e || !in || !out) invalid("gollm_step: engine, in and out must not be NULL");
  if (in->num_seqs > 0 && (!out->tokens || !out->log_probs))
    invalid("gollm_step: out.tokens and out.log_probs must not be NULL");
  if (e->launched_count > 0)
    invalid("gollm_step: %d launched steps are not waited for", e->launched_count);
  if (in->feed) invalid("gollm_step: fed sequences need gollm_launch");
  if (in->late_allowed) invalid("gollm_step: late_allowed needs gollm_launch");
  // A rank past 0 of a tensor-parallel engine returns no logits but checks the step
  // against the same length as rank 0.
  launch(e, in, out->logits || e->tp_rank > 0 ? out->logits_len : 0, inject);
  wait_step(e, out);
}

// warmup readies a new engine for serving: every cuBLAS shape once, one prompt step and
// one sampled step (the first launch of each kernel loads it), the decode graph of every
// batch bucket, greedy and sampled, and those of chained rows up to 32. Its steps use KV
// block 0 at position 0 onwards; nothing has been stored in the pool yet.
void warmup(gollm_engine* e, gollm_engine_info& inf) {
  const auto t0 = std::chrono::steady_clock::now();
  DeviceGuard dg(e->device);
  inf.warmup_gemm_shapes = warmup_gemms(e);
  inf.warmup_gemm_tuned = e->gemms.tuned;
  inf.warmup_gemm_tune_ms = e->gemms.tune_ms;
  const int T = e->geom.tokens_per_block;
  std::vector<gollm_seq> seqs;
  std::vector<int32_t> tokens, blocks;
  std::vector<int32_t> otok(e->max_seqs);
  std::vector<float> olp(e->max_seqs);
  // run: b sequences of k tokens from position 0, greedy or sampled at temperature 1;
  // chained, b rows of one token at positions 0..b-1 over one block table (a sequence's
  // proposals verified in rows, GOLLM_SEQ_CHAINED).
  auto run = [&](int b, int k, bool greedy, bool chained = false) {
    const int nblk = ((chained ? b : k) + T - 1) / T;
    seqs.assign(b, gollm_seq{});
    tokens.assign((size_t)b * k, 0);
    blocks.assign(nblk, 0);
    for (int i = 0; i < nblk; i++) blocks[i] = i;
    for (int s = 0; s < b; s++) {
      gollm_seq& q = seqs[s];
      q.token_offset = s * k, q.token_count = k;
      q.block_offset = 0, q.block_count = chained ? s / T + 1 : nblk;
      q.pos = chained ? s : 0;
      q.flags = GOLLM_SEQ_SAMPLE | (chained ? GOLLM_SEQ_CHAINED : 0);
      q.temperature = greedy ? 0.f : 1.f;
      q.bias_offset = -1, q.allowed_offset = -1;
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
  const int k = std::min({16, e->max_tokens, e->max_len, T * e->num_blocks});
  run(1, k, false);
  const int top = std::min(e->max_seqs, e->max_tokens);
  if (e->tp_size > 1 && e->graphs) {
    // Every decode bucket's collectives once eagerly before any is captured: NCCL sets up
    // what an operation's size needs on its first use, which a capture must not do.
    e->graphs = false;
    for (int b = 1;; b = std::min(2 * b, top)) {
      run(b, 1, true);
      if (b == top) break;
    }
    e->graphs = true;
  }
  for (int b = 1;; b = std::min(2 * b, top)) {
    run(b, 1, true);
    run(b, 1, false);
    if (b == top) break;
  }
  // The buckets a step with proposals verified in rows takes (rows of up to
  // engine.MaxDraftTokens+1 each, in the batch manager's default budget of 32): their
  // graphs wait for the KV writes before attention, a key of their own.
  const int chained_top = std::min({top, 32, e->max_len, T * e->num_blocks});
  for (int b = 2; e->graphs && e->tp_size == 1 && b <= chained_top; b *= 2) {
    run(b, 1, true, true);
    run(b, 1, false, true);
  }
  inf.warmup_graphs = (int32_t)e->graph_execs.size();
  inf.warmup_ms = std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace gollm

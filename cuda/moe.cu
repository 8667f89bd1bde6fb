// moe.cu — the mixture-of-experts stage's buffers, sized for passes of up to kMoeChunk
// token rows (the step's rows go through the stage in passes; moe.cuh).
#include "internal.h"

namespace gollm {

size_t create_moe(gollm_engine* e) {
  const gollm_model_config& c = e->w->cfg;
  int K = 0;
  for (const Stage& s : e->w->recipe)
    if (s.s.kind == GOLLM_STAGE_MOE) K = std::max(K, s.s.top_k);
  if (K == 0) return 0;
  // The fused MLP leaves its sum in fixed point for the next output projection to move
  // into the residual stream; a MOE stage reads the stream before that.
  e->fused = false;
  MoeBufs& m = e->moe;
  m.chunk = std::min(e->max_tokens, kMoeChunk);
  const size_t n = m.chunk, P = n * K, E = c.experts;
  m.logits.alloc(n * (E + 1) * 4, "router logits");
  m.topi.alloc(P * 4, "routed experts");
  m.topw.alloc(P * 4, "routing weights");
  m.sgate.alloc(n * 4, "shared expert gates");
  m.sorted.alloc(P * 4, "rows sorted by expert");
  m.pos.alloc(P * 4, "routed slots");
  m.tiles.alloc((size_t)moe_max_tiles((int)P, (int)E, kMoeRows) * sizeof(int4), "expert tiles");
  // The tile count, then the router's finished blocks (moe_router_kernel's ROUTE: zero
  // between passes), zeroed on the stream the router runs on: the engine's stream does not
  // wait for the legacy one.
  m.ntiles.alloc(8, "expert tile count");
  CUDA_CHECK(cudaMemsetAsync(m.ntiles.p, 0, 8, e->stream));
  m.act.alloc(P * c.moe_inner * 2, "expert activations");
  m.y.alloc(P * c.hidden * 4, "expert outputs");
  if (c.shared_inner > 0) {
    m.sact.alloc(n * c.shared_inner * 2, "shared expert activations");
    m.sy.alloc(n * c.hidden * 4, "shared expert outputs");
  }
  return m.bytes();
}

}  // namespace gollm

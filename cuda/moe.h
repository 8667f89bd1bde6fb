// moe.h — the limits and launch shapes of the mixture-of-experts stage (moe.cuh's kernels,
// moe.cu's buffers, weights.cu's checks).
#pragma once

#include <algorithm>
#include <cstdint>

namespace gollm {

// kMoeMaxExperts is the most experts a layer has (model.maxExperts in Go); kMoeMaxTopK the
// most a token goes to.
constexpr int kMoeMaxExperts = 4096;
constexpr int kMoeMaxTopK = 64;
// kMoeRows is the most token rows one block of the grouped gemv takes (a tile: rows of one
// expert), and of the router's.
constexpr int kMoeRows = 8;
// kMoeChunk is the most token rows one pass of the stage routes: the buffers of a pass
// hold top_k rows of the experts' outputs a token row.
constexpr int kMoeChunk = 1024;
// kMoeSortThreads is the routing and sorting kernel's block (one block a pass).
constexpr int kMoeSortThreads = 1024;
// kMoeTileRows is the most token rows a tile of the tensor-core grouped GEMM takes (steps
// whose experts get more than kMoeRows rows on average).
constexpr int kMoeTileRows = 64;

// moe_max_tiles bounds the tiles a pass of pairs (token, expert) pairs over experts
// experts lists when each expert's pairs go in runs of rows: every run full but one an
// expert, and at most min(experts, pairs) experts routed to.
inline int moe_max_tiles(int pairs, int experts, int rows) {
  return (pairs + rows - 1) / rows + std::min(experts, pairs);
}

}  // namespace gollm

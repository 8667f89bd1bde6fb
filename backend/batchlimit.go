package main

import (
	"fmt"

	"gollm/engine"
)

// batchLimit is the most sequences an instance's iterations run: max_batch_size, unless
// the KV pool has fewer blocks than that. Every running sequence holds at least one
// block, so such a pool could never run max_batch_size sequences; the limit is then the
// block count, and reason says why for the log. The load goes on rather than failing:
// max_batch_size is the model's (Triton's, for every instance on every GPU) while the pool
// is sized per instance from the memory it finds free, so the same config must serve on
// a smaller GPU, and the batch manager admits only what the pool holds in any case.
func batchLimit(maxBatch int, info engine.Info) (limit int, reason string) {
	if info.NumBlocks <= 0 || maxBatch <= info.NumBlocks {
		return maxBatch, ""
	}
	return info.NumBlocks, fmt.Sprintf("max_batch_size %d is more sequences than the KV pool's %d blocks of %d tokens can hold (each running sequence holds a block at least); an iteration runs at most %d — give the pool more tokens (max_tokens_in_paged_kv_cache, kv_cache_free_gpu_mem_fraction, gpu_memory_utilization) or lower max_batch_size",
		maxBatch, info.NumBlocks, info.TokensPerBlock, info.NumBlocks)
}

package main

import (
	"strings"
	"testing"

	"gollm/engine"
)

func TestBatchLimit(t *testing.T) {
	if n, why := batchLimit(256, engine.Info{NumBlocks: 4096, TokensPerBlock: 64}); n != 256 || why != "" {
		t.Errorf("a pool of 4096 blocks: limit %d (%q), want 256 and no reason", n, why)
	}
	if n, why := batchLimit(256, engine.Info{NumBlocks: 256, TokensPerBlock: 64}); n != 256 || why != "" {
		t.Errorf("a pool of exactly 256 blocks: limit %d (%q), want 256", n, why)
	}
	n, why := batchLimit(1024, engine.Info{NumBlocks: 300, TokensPerBlock: 16})
	if n != 300 {
		t.Errorf("a pool of 300 blocks under max_batch_size 1024: limit %d, want 300", n)
	}
	for _, want := range []string{"max_batch_size 1024", "300 blocks of 16 tokens", "max_tokens_in_paged_kv_cache"} {
		if !strings.Contains(why, want) {
			t.Errorf("reason %q does not say %q", why, want)
		}
	}
}

package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"gollm/engine"
	"gollm/engine/enginetest"
)

// fewRowModels are the post-normed families (Gemma 2 with its soft-capped scores, Gemma
// 3) as fixtures (head_dim 16) and widened to Gemma-3-4B's row and head (hidden 2560,
// head_dim 256, grouped queries), with a sliding and a global layer.
var fewRowModels = []invariantModel{
	{fixture: "gemma3-tiny"},
	{fixture: "gemma2-tiny"},
	{fixture: "gemma3-tiny", wide: map[string]any{"hidden_size": 2560, "num_attention_heads": 8,
		"num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 2048, "num_hidden_layers": 2,
		"layer_types": []string{"sliding_attention", "full_attention"}, "sliding_window": 64,
		"query_pre_attn_scalar": 256, "max_position_embeddings": 1024, "vocab_size": 4096}},
	{fixture: "gemma2-tiny", wide: map[string]any{"hidden_size": 2560, "num_attention_heads": 8,
		"num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 2048, "num_hidden_layers": 2,
		"layer_types": []string{"sliding_attention", "full_attention"}, "sliding_window": 64,
		"query_pre_attn_scalar": 256, "max_position_embeddings": 1024, "vocab_size": 4096}},
}

// TestGPUFewRowDecodeMatchesTheInvariantPath checks the kernels of a one-row decode step
// of a post-normed model — the post-norm, residual add and next norm in registers
// (post_residual_norm4_kernel) and decode attention's short layout (a row's positions in
// parts of 32, keys read a lane group a position, the parts merged by the last block) —
// against the batch-invariant engine's (the tiled projections and, for decode attention,
// the grouped kernel — Gemma 3's heads of 256 too — or, for Gemma 2's soft-capped scores,
// the per-head kernel's thread-a-key layout, parts of 256), in fp16 and bf16: a prompt, then one
// sequence decoded greedily to 120 positions (the fixtures) or 300 (the widened models:
// two rounds of keys a part at head_dim 256 past 128 positions, the thread-a-key layout
// with its loads before the wait past 256), both engines fed the same tokens, with
// decode attention split up to 4 ways (gollm_tuning.decode_parts). Every decode step's
// logits agree within 2e-2 (fp16) or 0.1 (bf16) relative L2 — rounding of two paths,
// where a lost part or a wrong merge errs by far more.
func TestGPUFewRowDecodeMatchesTheInvariantPath(t *testing.T) {
	for _, m := range fewRowModels {
		for _, dtype := range []string{"float16", "bfloat16"} {
			t.Run(m.name()+" "+dtype, func(t *testing.T) { fewRowMatches(t, m, dtype) })
		}
	}
}

func fewRowMatches(t *testing.T, m invariantModel, dtype string) {
	prompt, total := 20, 120
	if m.wide != nil {
		prompt, total = 40, 300
	}
	open := func(invariant bool) *Engine {
		ck := m.open(t)
		defer ck.Close()
		o := Options{NumBlocks: 48, TokensPerBlock: 8, MaxTokens: 64, MaxSeqs: 4, DType: dtype,
			BatchInvariant: invariant, Tuning: Tuning{DecodeParts: 4}}
		o.Library = builtLibrary(t)
		e, err := New(ck, o)
		if err != nil {
			t.Skipf("no GPU engine here: %v", err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	few, inv := open(false), open(true)
	V := few.Info().VocabSize
	rng := rand.New(rand.NewPCG(11, uint64(len(dtype))))
	toks := make([]int32, prompt)
	for i := range toks {
		toks[i] = int32(1 + rng.IntN(V-1))
	}
	blocks := make([]int32, (total+7)/8)
	for i := range blocks {
		blocks[i] = int32(len(blocks) - 1 - i) // out of order: the block table is read
	}
	seq := engine.Sequence{ID: 1, Tokens: toks, Blocks: blocks, Sample: true, History: toks}
	bar := map[string]float64{"float16": 2e-2, "bfloat16": 0.1}[dtype]
	worst := 0.0
	for k := 0; seq.Pos+len(seq.Tokens) < total; k++ {
		a, err := few.Step(&engine.Batch{Seqs: []engine.Sequence{seq}})
		if err != nil {
			t.Fatalf("step %d (one-row engine): %v", k, err)
		}
		b, err := inv.Step(&engine.Batch{Seqs: []engine.Sequence{seq}})
		if err != nil {
			t.Fatalf("step %d (invariant engine): %v", k, err)
		}
		if k > 0 {
			what := fmt.Sprintf("decode step %d (%d positions)", k, seq.Pos+1)
			if len(a[0].Logits) != V || len(b[0].Logits) != V {
				t.Fatalf("%s: %d and %d logits, want %d", what, len(a[0].Logits), len(b[0].Logits), V)
			}
			err := enginetest.RelL2(a[0].Logits, b[0].Logits)
			worst = max(worst, err)
			if err > bar {
				t.Errorf("%s: relative L2 %.3g between the paths > %.3g", what, err, bar)
			}
		}
		next := a[0].Token
		seq.Pos += len(seq.Tokens)
		seq.History = append(seq.History, next)
		seq.Tokens, seq.NumGenerated, seq.ReturnLogits = []int32{next}, k+1, true
	}
	t.Logf("worst relative L2 over %d positions: %.3g", total, worst)
}

package cuda

import (
	"fmt"
	"testing"

	"gollm/engine"
	"gollm/engine/cpu"
)

// tcDecodeModels are LLaMA shapes whose decode attention the tensor-core kernel takes
// (attention_decode_tc: head_dim 64 or 128, up to 8 query heads a KV head): 4 and 8 query
// heads a KV head and one (multi-head), random weights.
var tcDecodeModels = []struct {
	name string
	m    invariantModel
}{
	{"G4-D128", invariantModel{fixture: "llama-tiny", wide: map[string]any{"hidden_size": 256, "num_attention_heads": 8,
		"num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 256}}},
	{"G8-D64", invariantModel{fixture: "llama-tiny", wide: map[string]any{"hidden_size": 256, "num_attention_heads": 8,
		"num_key_value_heads": 1, "head_dim": 64, "intermediate_size": 256}}},
	{"G1-D128", invariantModel{fixture: "llama-tiny", wide: map[string]any{"hidden_size": 256, "num_attention_heads": 2,
		"num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 256}}},
}

// TestGPUTensorCoreDecodeMatchesCPU: decode steps of 160 rows, one part a row, on the
// tensor-core kernel — prompts of 20 to 60 tokens over blocks of 8 positions, so that a
// tile of 16 spans blocks and rows end inside a tile — against the CPU engine, in fp16 and
// bf16, over a pool in the compute type (against the float32 CPU engine, the families'
// bars) and an FP8 one (against the CPU's FP8 pool of the same scales, kvFP8Run's bars).
func TestGPUTensorCoreDecodeMatchesCPU(t *testing.T) {
	const n, perBlock, blocksPer = 160, 8, 16
	for _, tm := range tcDecodeModels {
		for _, pool := range []string{"auto", "fp8"} {
			for _, dtype := range []string{"float16", "bfloat16"} {
				t.Run(fmt.Sprintf("%s/%s/%s", tm.name, pool, dtype), func(t *testing.T) {
					ck := tm.m.open(t)
					defer ck.Close()
					o := Options{DType: dtype, NumBlocks: n * blocksPer, TokensPerBlock: perBlock, MaxTokens: 8192,
						MaxSeqs: 256, Tuning: Tuning{DecodeParts: 1}, Library: gpuLibrary(t)}
					ks, vs := kvTestScales(t, ck)
					if pool == "fp8" {
						o.KVDType, o.KScales, o.VScales = engine.KVFP8, ks, vs
					}
					g, err := New(ck, o)
					if err != nil {
						t.Fatal(err)
					}
					defer g.Close()
					c8, c32 := cpuKVEngines(t, ck, ks, vs, n*blocksPer, perBlock)
					r := &kvFP8Run{g: g, c8: c8, c32: c32, dtype: dtype}
					if pool == "auto" {
						// The float32 CPU engine twice: the reference, and the "FP8 pool" whose
						// distance from it (zero) widens no bar.
						m, err := ck.Float32Weights()
						if err != nil {
							t.Fatal(err)
						}
						ref, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: n * blocksPer, TokensPerBlock: perBlock})
						if err != nil {
							t.Fatal(err)
						}
						defer ref.Close()
						r.c8 = ref
					}
					r.steps(t, randomSeqs(n, 20, 60, blocksPer, ck.Config.VocabSize, 5), 8, false)
					r.judge(t)
				})
			}
		}
	}
}

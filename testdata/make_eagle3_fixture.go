//go:build ignore

// make_eagle3_fixture writes testdata/eagle3-tiny: an EAGLE-3 head with random weights
// in the published checkpoint format (model/eagle3.go lists the tensors), for the
// llama-tiny fixture as its target. Run from the repository root:
//
//	go run testdata/make_eagle3_fixture.go
package main

import (
	"encoding/binary"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"gollm/model"
)

func main() {
	const (
		H, heads, kvHeads, D, inner = 64, 4, 2, 16, 128
		vocab, draftVocab           = 1000, 256
	)
	dir := filepath.Join("testdata", "eagle3-tiny")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Fatal(err)
	}
	cfg := `{
  "architectures": ["LlamaForCausalLMEagle3"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 64,
  "intermediate_size": 128,
  "max_position_embeddings": 128,
  "model_type": "llama",
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "num_hidden_layers": 1,
  "pad_token_id": 0,
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "use_cache": true,
  "vocab_size": 1000,
  "draft_vocab_size": 256,
  "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 1]}
}
`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		log.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(36, 3))
	normal := func(n int, mean, std float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(mean + std*rng.NormFloat64())
		}
		return x
	}
	var ts []*model.Tensor
	add := func(name string, shape []int, v []float32) {
		t, err := model.NewFloatTensor(name, "F16", shape, v)
		if err != nil {
			log.Fatal(err)
		}
		ts = append(ts, t)
	}
	add("fc.weight", []int{H, 3 * H}, normal(H*3*H, 0, 0.1))
	add("midlayer.input_layernorm.weight", []int{H}, normal(H, 1, 0.1))
	add("midlayer.hidden_norm.weight", []int{H}, normal(H, 1, 0.1))
	add("midlayer.post_attention_layernorm.weight", []int{H}, normal(H, 1, 0.1))
	add("norm.weight", []int{H}, normal(H, 1, 0.1))
	add("midlayer.self_attn.q_proj.weight", []int{heads * D, 2 * H}, normal(heads*D*2*H, 0, 0.15))
	add("midlayer.self_attn.k_proj.weight", []int{kvHeads * D, 2 * H}, normal(kvHeads*D*2*H, 0, 0.15))
	add("midlayer.self_attn.v_proj.weight", []int{kvHeads * D, 2 * H}, normal(kvHeads*D*2*H, 0, 0.15))
	add("midlayer.self_attn.o_proj.weight", []int{H, heads * D}, normal(H*heads*D, 0, 0.1))
	add("midlayer.mlp.gate_proj.weight", []int{inner, H}, normal(inner*H, 0, 0.1))
	add("midlayer.mlp.up_proj.weight", []int{inner, H}, normal(inner*H, 0, 0.1))
	add("midlayer.mlp.down_proj.weight", []int{H, inner}, normal(H*inner, 0, 0.1))
	add("lm_head.weight", []int{draftVocab, H}, normal(draftVocab*H, 0, 0.3))
	// The draft vocabulary: 256 of the target's tokens, ascending; d2t holds their
	// offsets (target id = d + d2t[d]) and t2d marks them, as the releases store them.
	used := rng.Perm(vocab)[:draftVocab]
	slices.Sort(used)
	d2t := make([]byte, 8*draftVocab)
	t2d := make([]byte, vocab)
	for d, t := range used {
		binary.LittleEndian.PutUint64(d2t[8*d:], uint64(int64(t-d)))
		t2d[t] = 1
	}
	ts = append(ts, &model.Tensor{Name: "d2t", DType: "I64", Shape: []int{draftVocab}, Data: d2t},
		&model.Tensor{Name: "t2d", DType: "BOOL", Shape: []int{vocab}, Data: t2d})
	if err := model.WriteSafetensors(filepath.Join(dir, "model.safetensors"), ts, map[string]string{"format": "pt"}); err != nil {
		log.Fatal(err)
	}
}

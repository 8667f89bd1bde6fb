package tests

// A checkpoint far larger than the machine (issue 32, finding 4): a consistent
// LLaMA-70B-shaped checkpoint (80 layers of width 8192, bf16, 138 GB of sparse
// safetensors data) used to load until the kernel's OOM killer ended tritonserver and
// every other model with it. Its load must be refused before anything is allocated,
// naming the sizes, with the server up and the other models serving.

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
)

// hugeLlama writes a LLaMA checkpoint of the given shape into dir whose
// model.safetensors holds a real header and a data region of zeros that takes no disk
// (a sparse file): Open maps it and checks every tensor's shape without reading it.
func hugeLlama(t *testing.T, dir string, layers, hidden, heads, kvHeads, inner, vocab int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	hd := hidden / heads
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "hidden_act": "silu",
		"hidden_size": hidden, "intermediate_size": inner, "num_hidden_layers": layers,
		"num_attention_heads": heads, "num_key_value_heads": kvHeads, "vocab_size": vocab,
		"max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
		"tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	type entry struct {
		DType   string  `json:"dtype"`
		Shape   []int64 `json:"shape"`
		Offsets []int64 `json:"data_offsets"`
	}
	header := map[string]entry{}
	var off int64
	add := func(name string, shape ...int64) {
		n := int64(2)
		for _, d := range shape {
			n *= d
		}
		header[name] = entry{"BF16", shape, []int64{off, off + n}}
		off += n
	}
	H, Q, KV, I, V := int64(hidden), int64(heads*hd), int64(kvHeads*hd), int64(inner), int64(vocab)
	add("model.embed_tokens.weight", V, H)
	for l := range layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"input_layernorm.weight", H)
		add(p+"self_attn.q_proj.weight", Q, H)
		add(p+"self_attn.k_proj.weight", KV, H)
		add(p+"self_attn.v_proj.weight", KV, H)
		add(p+"self_attn.o_proj.weight", H, Q)
		add(p+"post_attention_layernorm.weight", H)
		add(p+"mlp.gate_proj.weight", I, H)
		add(p+"mlp.up_proj.weight", I, H)
		add(p+"mlp.down_proj.weight", H, I)
	}
	add("model.norm.weight", H)
	add("lm_head.weight", V, H)
	hb, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(binary.LittleEndian.AppendUint64(nil, uint64(len(hb))), hb...)); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(8 + int64(len(hb)) + off); err != nil {
		t.Fatal(err)
	}
}

func TestHugeCheckpointRefusedBeforeItLoads(t *testing.T) {
	ck := demoCheckpoint(t)
	dir := filepath.Join(t.TempDir(), "huge")
	// Llama-2-70B's shape: 69 billion parameters, 138 GB in bfloat16 as stored.
	hugeLlama(t, dir, 80, 8192, 64, 8, 28672, 32000)
	const huge = "huge"
	s := harness.Start(t, harness.Options{Models: []harness.Model{{}, {Name: huge, Checkpoint: dir}},
		Flags: []string{"--model-control-mode=explicit", "--load-model=" + modelName}})
	c := s.Client(t)
	ctx := testContext(t, 5*time.Minute)
	const n = 8
	want := greedyTokens(t, ck.dir, tokenPrompt, n)
	serve := func(id string) {
		t.Helper()
		res, err := streamInfer(ctx, c, inferRequest(modelName, id, tokenInputs(tokenPrompt, n, true)))
		if err != nil || res.errMsg != "" || !slices.Equal(res.tokens, want) {
			t.Fatalf("request %s: tokens %v, %v, error %q; want %v", id, res.tokens, err, res.errMsg, want)
		}
	}
	serve("before")
	before, err := s.RSS()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: huge})
	took := time.Since(start)
	if err == nil {
		t.Fatalf("the 69B-parameter checkpoint loaded in %v; want a refused load", took)
	}
	for _, w := range []string{"not enough memory for a KIND_CPU instance", "the weights (cpu_weight_format auto: 128.", "may take", "MemAvailable"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("load: %v; want it to say %q", err, w)
		}
	}
	t.Logf("refused in %v: %v", took.Round(time.Millisecond), err)
	if live, err := c.ServerLive(ctx, &kserve.ServerLiveRequest{}); err != nil || !live.GetLive() {
		t.Fatalf("the server is not live after the refused load: %v, %v", live, err)
	}
	serve("after")
	after, err := s.RSS()
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	t.Logf("RSS %d MiB before the refused load, %d MiB after", before/mib, after/mib)
	if after-before > 64*mib {
		t.Errorf("RSS grew by %d MiB over a refused load; want at most 64 MiB", (after-before)/mib)
	}
}

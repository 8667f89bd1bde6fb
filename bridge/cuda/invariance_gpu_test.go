package cuda

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"gollm/engine"
	"gollm/model"
)

// invariantModel is a checkpoint for the invariance tests: a fixture as it is, or its
// config.json with the fields in wide changed and random weights (model.OpenRandom), so
// that the shapes take the kernels' wide paths — hidden 2048 and more, the reduction split
// over several blocks, the grouped decode attention, the experts' tensor-core passes.
type invariantModel struct {
	fixture string
	wide    map[string]any
}

func (m invariantModel) name() string {
	if m.wide == nil {
		return m.fixture
	}
	return m.fixture + "-wide"
}

// open opens the checkpoint (the caller closes it).
func (m invariantModel) open(t *testing.T) *model.Checkpoint {
	t.Helper()
	dir := filepath.Join("..", "..", "testdata", m.fixture)
	if m.wide == nil {
		c, err := model.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	for k, v := range m.wide {
		cfg[k] = v
	}
	out := t.TempDir()
	raw, _ = json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(out, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := model.OpenRandom(out, 7, 4<<30)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// invariantModels: GPT-2, a LLaMA with grouped queries, a dense family with q/k norms
// (Qwen3) and a mixture of experts (Mixtral), as fixtures and widened.
var invariantModels = []invariantModel{
	{fixture: "gpt2-tiny"},
	{fixture: "llama-tiny"},
	{fixture: "qwen3-tiny"},
	{fixture: "mixtral-tiny"},
	{fixture: "gpt2-tiny", wide: map[string]any{"n_embd": 2048, "n_head": 16, "n_layer": 2, "n_positions": 1024}},
	{fixture: "llama-tiny", wide: map[string]any{"hidden_size": 2048, "num_attention_heads": 32,
		"num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 5632, "num_hidden_layers": 2,
		"max_position_embeddings": 2048, "vocab_size": 4096}},
	{fixture: "qwen3-tiny", wide: map[string]any{"hidden_size": 2048, "num_attention_heads": 16,
		"num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144, "num_hidden_layers": 2,
		"layer_types": []string{"full_attention", "full_attention"}, "max_position_embeddings": 2048}},
	{fixture: "mixtral-tiny", wide: map[string]any{"hidden_size": 1024, "num_attention_heads": 16,
		"num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 512, "num_hidden_layers": 2,
		"max_position_embeddings": 2048}},
}

// invSeq is one sequence of an invariance test: its prompt and blocks.
type invSeq struct {
	id     uint64
	prompt []int32
	blocks []int32
}

// sameBits says where two logit rows first differ in their bits (-1: nowhere).
func sameBits(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// runInv runs seqs together: one prompt step (target's context logits returned), then
// decodes greedy steps, every sequence fed its own token; it returns the target's logits:
// its prompt's context logits first, then each decode step's.
func runInv(t *testing.T, e *Engine, seqs []invSeq, target, decodes int) [][]float32 {
	t.Helper()
	batch := make([]engine.Sequence, len(seqs))
	for i, s := range seqs {
		batch[i] = engine.Sequence{ID: s.id, Tokens: s.prompt, History: s.prompt, Blocks: s.blocks,
			Sample: true, ContextLogits: i == target}
	}
	outs, err := e.Step(&engine.Batch{Seqs: batch})
	if err != nil {
		t.Fatalf("prompt step of %d: %v", len(seqs), err)
	}
	got := [][]float32{outs[target].ContextLogits}
	for k := range decodes {
		for i := range batch {
			s := &batch[i]
			s.Pos += len(s.Tokens)
			s.Tokens = []int32{outs[i].Token}
			s.History = append(append([]int32(nil), s.History...), outs[i].Token)
			s.NumGenerated = k + 1
			s.ContextLogits = false
			s.ReturnLogits = i == target
		}
		if outs, err = e.Step(&engine.Batch{Seqs: batch}); err != nil {
			t.Fatalf("decode step %d of %d: %v", k, len(seqs), err)
		}
		got = append(got, outs[target].Logits)
	}
	return got
}

// TestGPUBatchInvariance runs a sequence alone, then at the start, middle and end of
// batches of 2, 7 and 64 others (prompts of other lengths, so that every step's row count
// differs — the batch of 64's prompt step holds about 2,000 rows), in fp16 and bf16, on
// every invariantModels checkpoint: its prompt's logits at every position and its logits
// at three decode steps must be bitwise the same as alone. Then its prompt in chunks of
// 9, 14 and the rest (context logits) must give the whole prompt's logits bitwise. The
// widened models' sequence is 300 tokens long, so that decode attention splits it.
func TestGPUBatchInvariance(t *testing.T) {
	for _, m := range invariantModels {
		for _, dtype := range []string{"float16", "bfloat16"} {
			t.Run(m.name()+"/"+dtype, func(t *testing.T) {
				testInvariance(t, m, dtype)
			})
		}
	}
}

func testInvariance(t *testing.T, m invariantModel, dtype string) {
	const perBlock, decodes, most, per = 16, 3, 64, 24 // per: blocks a sequence
	// The widened models' target is long enough that decode attention splits its
	// positions (cap > 1: 128 positions a part on the grouped kernel, 256 on the other).
	length, maxLen := 37, 128
	if m.wide != nil {
		length, maxLen = 300, 384
	}
	ckpt := m.open(t)
	defer ckpt.Close()
	path := os.Getenv("GOLLM_CUDA_LIB")
	if path == "" {
		path, _ = filepath.Abs(filepath.Join("..", "..", "build", LibraryName))
	}
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not built", path)
	}
	e, err := New(ckpt, Options{DType: dtype, NumBlocks: (most + 2) * per, TokensPerBlock: perBlock,
		MaxTokens: 4096, MaxSeqs: most + 1, MaxSeqLen: maxLen, BatchInvariant: true, Library: path})
	if err != nil {
		t.Skipf("no GPU engine here: %v", err)
	}
	defer func() { _ = e.Close() }()
	vocab := e.Info().VocabSize
	rng := rand.New(rand.NewPCG(39, 39))
	// The sequence in slot i holds blocks per·i … per·i + per-1.
	table := func(slot int) []int32 {
		var b []int32
		for j := range per {
			b = append(b, int32(per*slot+j))
		}
		return b
	}
	mk := func(id uint64, slot, n int) invSeq {
		s := invSeq{id: id, blocks: table(slot)}
		for range n {
			s.prompt = append(s.prompt, int32(rng.IntN(vocab)))
		}
		return s
	}
	target := mk(1, 0, length)
	alone := runInv(t, e, []invSeq{target}, 0, decodes)
	if len(alone[0]) != len(target.prompt)*vocab {
		t.Fatalf("alone: %d context logits, want %d", len(alone[0]), len(target.prompt)*vocab)
	}
	compare := func(what string, got [][]float32) {
		t.Helper()
		for k := range alone {
			if i := sameBits(alone[k], got[k]); i >= 0 {
				step := "the prompt"
				if k > 0 {
					step = fmt.Sprintf("decode step %d", k)
				}
				v := float32(math.NaN())
				if i < len(got[k]) {
					v = got[k][i]
				}
				t.Errorf("%s, %s: logit %d is %g, alone %g", what, step, i, v, alone[k][i])
				return
			}
		}
	}
	for _, b := range []int{2, 7, most} {
		for _, at := range []int{0, b / 2, b - 1} {
			seqs := make([]invSeq, b)
			for i := range seqs {
				if i == at {
					seqs[i] = target
					seqs[i].blocks = table(i + 1)
					continue
				}
				seqs[i] = mk(uint64(100+i), i+1, 5+rng.IntN(40))
			}
			compare(fmt.Sprintf("batch of %d, at %d", b, at), runInv(t, e, seqs, at, decodes))
		}
	}
	// Chunked prefill: 9, 14, then the rest, each chunk's context logits against the whole
	// prompt's rows.
	pos := 0
	for _, n := range []int{9, 14, length - 23} {
		s := engine.Sequence{ID: 1, Tokens: target.prompt[pos : pos+n], Pos: pos,
			History: target.prompt[:pos+n], Blocks: target.blocks, Sample: pos+n == len(target.prompt),
			ContextLogits: true}
		outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{s}})
		if err != nil {
			t.Fatalf("chunk at %d: %v", pos, err)
		}
		want := alone[0][pos*vocab : (pos+n)*vocab]
		if i := sameBits(want, outs[0].ContextLogits); i >= 0 {
			t.Errorf("chunk of %d at %d: logit %d (position %d) differs from the whole prompt's", n, pos, i,
				pos+i/vocab)
		}
		pos += n
	}
}

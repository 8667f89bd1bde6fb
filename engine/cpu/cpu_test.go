package cpu

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gollm/engine"
	"gollm/model"
)

// goldenTolerance is the largest relative L2 error allowed against transformers.
const goldenTolerance = 1e-4

// bf16Tolerance is the largest relative L2 error allowed the bfloat16 kernels, which round
// the inputs of a product to bfloat16 (8 significant bits), against the float32 ones on
// the tiny random fixtures, whose logits amplify it most (gpt2-tiny: 0.012; the austen
// demo's: 0.0013, TestGGUFLogitsMatchTheSafetensorsForm) — the quantized formats' bound.
const bf16Tolerance = 0.03

// fixtures are the checkpoints of testdata/ with transformers' golden outputs.
var fixtures = []struct {
	// dir is the checkpoint folder, golden the reference file, both in testdata/.
	dir, golden string
}{
	{"gpt2-tiny", "gpt2-tiny-golden.safetensors"},
	{"gpt2-tiny-sharded", "gpt2-tiny-golden.safetensors"},
	{"llama-tiny", "llama-tiny-golden.safetensors"},
	{"llama3-tiny", "llama3-tiny-golden.safetensors"},
	{"qwen2-tiny", "qwen2-tiny-golden.safetensors"},
	{"mistral-tiny", "mistral-tiny-golden.safetensors"},
	{"phi3-tiny", "phi3-tiny-golden.safetensors"},
	{"qwen3-tiny", "qwen3-tiny-golden.safetensors"},
	{"gemma2-tiny", "gemma2-tiny-golden.safetensors"},
	{"gemma3-tiny", "gemma3-tiny-golden.safetensors"},
	{"phi3-longrope-tiny", "phi3-longrope-tiny-golden.safetensors"},
	{"phi4mini-tiny", "phi4mini-tiny-golden.safetensors"},
	{"mixtral-tiny", "mixtral-tiny-golden.safetensors"},
	{"qwen2moe-tiny", "qwen2moe-tiny-golden.safetensors"},
	{"qwen3moe-tiny", "qwen3moe-tiny-golden.safetensors"},
	{"llama-fp8-tiny", "llama-fp8-tiny-golden.safetensors"},
	{"llama-fp8ct-tiny", "llama-fp8ct-tiny-golden.safetensors"},
}

func TestLogitsAndGreedyTokensMatchTransformers(t *testing.T) {
	for _, tc := range kernelPaths(t) {
		for _, fx := range fixtures {
			t.Run(fx.dir+" with "+tc.name, func(t *testing.T) {
				tc.use(t)
				g := loadGolden(t, "../../testdata/"+fx.golden)
				m := loadModel(t, "../../testdata/"+fx.dir)
				v := m.Config.VocabSize
				if len(g.promptLogits) != len(g.promptIDs)*v || len(g.decodeLogits) != len(g.greedy)*v {
					t.Fatalf("golden shapes do not fit vocab %d", v)
				}
				// 16 positions per block and a scrambled block table, so that attention
				// crosses block boundaries through non-contiguous blocks.
				e := newCPU(t, m, 12, 16)
				blocks := []int32{7, 2, 11, 0, 5, 9, 3, 1}
				worst := 0.0
				out := mustStep(t, e, Sequence{
					ID: 1, Tokens: g.promptIDs, Blocks: blocks, Sample: true,
					History: g.promptIDs, ContextLogits: true, ReturnLogits: true,
				})[0]
				for i := range g.promptIDs {
					err := relL2(out.ContextLogits[i*v:(i+1)*v], g.promptLogits[i*v:(i+1)*v])
					worst = max(worst, err)
					if err > goldenTolerance {
						t.Errorf("prompt position %d: relative L2 error %.3g > %g", i, err, goldenTolerance)
					}
				}
				history := slices.Clone(g.promptIDs)
				for step, want := range g.greedy {
					if out.Token != want {
						t.Fatalf("greedy token %d = %d, transformers chose %d", step, out.Token, want)
					}
					history = append(history, out.Token)
					out = mustStep(t, e, Sequence{
						ID: 1, Tokens: []int32{out.Token}, Pos: len(history) - 1, Blocks: blocks,
						Sample: true, History: history, NumGenerated: step + 1, ReturnLogits: true,
					})[0]
					err := relL2(out.Logits, g.decodeLogits[step*v:(step+1)*v])
					worst = max(worst, err)
					if err > goldenTolerance {
						t.Errorf("decode step %d: relative L2 error %.3g > %g", step, err, goldenTolerance)
					}
				}
				t.Logf("%s with %s: worst relative L2 error %.3g over %d prompt rows and %d decode steps", fx.dir, tc.name, worst, len(g.promptIDs), len(g.greedy))
			})
		}
	}
}

// smallGPT2 is the random model most engine tests run (vocab 300, 64 positions,
// hidden 64, 2 layers, 4 heads): big enough to have several heads, layers and blocks,
// small enough for -race.
func smallGPT2(seed uint64) *model.Float32 {
	return randomGPT2(300, 64, 64, 2, 4, seed)
}

// invarianceModel is a model the batch and chunking invariance tests run.
type invarianceModel struct {
	// name names it in subtest names.
	name string
	// m is shared by the engines whose outputs are compared.
	m *model.Float32
}

// invarianceModels are the small random GPT-2 and the LLaMA-shaped fixtures, whose
// rotary positions, grouped KV heads, QKV biases and sliding windows (Mistral's 8
// positions, Gemma's 6 and 5 on alternating layers, all shorter than the prompts below)
// each decide which cached positions a chunk or a batched row reads, and whose q/k norms,
// post-norms, soft-caps and longrope (Phi-4-mini's, within its original context) run on
// every row alike, and the mixtures of experts, whose rows are grouped by expert with
// whichever rows share the step.
func invarianceModels(t *testing.T) []invarianceModel {
	t.Helper()
	ms := []invarianceModel{{"gpt2 random", smallGPT2(1)}}
	for _, dir := range []string{"llama-tiny", "llama3-tiny", "qwen2-tiny", "mistral-tiny", "qwen3-tiny", "gemma2-tiny",
		"gemma3-tiny", "phi4mini-tiny", "mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny"} {
		ms = append(ms, invarianceModel{dir, loadModel(t, "../../testdata/"+dir)})
	}
	return ms
}

func TestChunkedPromptMatchesOneStep(t *testing.T) {
	models := invarianceModels(t)
	forEachKernelPath(t, func(t *testing.T) {
		for _, tc := range models {
			t.Run(tc.name, func(t *testing.T) { chunkedPromptMatchesOneStep(t, tc.m) })
		}
	})
}

func chunkedPromptMatchesOneStep(t *testing.T, m *model.Float32) {
	v := m.Config.VocabSize
	prompt := randomTokens(rand.New(rand.NewPCG(2, 2)), 13, v)
	if w := m.Config.SlidingWindow; w > 0 && w >= len(prompt)-4 {
		// The last chunk must read positions of the chunk before it and not of the first.
		t.Fatalf("sliding window %d: the prompt of %d does not outgrow it", w, len(prompt))
	}
	sampling := SamplingParams{Temperature: 0.9, TopK: 40, TopP: 0.95, Seed: 77}
	blocks := []int32{3, 6, 1, 4}

	whole := newCPU(t, m, 8, 4)
	one := mustStep(t, whole, Sequence{ID: 1, Tokens: prompt, Blocks: blocks, Sample: true,
		Sampling: sampling, History: prompt, ContextLogits: true})[0]

	chunked := newCPU(t, m, 8, 4)
	var ctx []float32
	var last Output
	for _, c := range [][2]int{{0, 5}, {5, 9}, {9, 13}} {
		final := c[1] == len(prompt)
		last = mustStep(t, chunked, Sequence{ID: 1, Tokens: prompt[c[0]:c[1]], Pos: c[0], Blocks: blocks,
			Sample: final, Sampling: sampling, History: prompt[:c[1]], ContextLogits: true})[0]
		ctx = append(ctx, last.ContextLogits...)
		if !final && last.Token != -1 {
			t.Errorf("chunk %v without Sample returned token %d, want -1", c, last.Token)
		}
	}
	if d := maxAbsDiff(ctx, one.ContextLogits); d > 1e-6 {
		t.Errorf("chunked context logits differ from one step by %g", d)
	}
	if last.Token != one.Token || last.LogProb != one.LogProb {
		t.Errorf("chunked prompt sampled %d (%g), one step sampled %d (%g)", last.Token, last.LogProb, one.Token, one.LogProb)
	}
	// The KV written chunk by chunk must serve later decode steps like the KV written at once.
	next := Sequence{ID: 1, Tokens: []int32{one.Token}, Pos: len(prompt), Blocks: blocks, Sample: true,
		Sampling: sampling, History: append(slices.Clone(prompt), one.Token), NumGenerated: 1, ReturnLogits: true}
	a, b := mustStep(t, whole, next)[0], mustStep(t, chunked, next)[0]
	if d := maxAbsDiff(a.Logits, b.Logits); d > 1e-6 || a.Token != b.Token {
		t.Errorf("decode after chunked prompt: logits differ by %g, tokens %d vs %d", d, b.Token, a.Token)
	}
}

func TestBatchMatchesEachSequenceAlone(t *testing.T) {
	models := invarianceModels(t)
	forEachKernelPath(t, func(t *testing.T) {
		for _, tc := range models {
			t.Run(tc.name, func(t *testing.T) { batchMatchesEachSequenceAlone(t, tc.m) })
		}
	})
}

func batchMatchesEachSequenceAlone(t *testing.T, m *model.Float32) {
	v := m.Config.VocabSize
	rng := rand.New(rand.NewPCG(3, 3))
	type plan struct {
		name   string
		prior  int // tokens already in the cache, written by an earlier step
		tokens int // new tokens this step
		sample bool
		blocks []int32
	}
	plans := []plan{
		{"a whole prompt", 0, 10, true, []int32{9, 3, 14}},
		{"a decode token after 7 cached", 7, 1, true, []int32{0, 12, 23}},
		{"a middle prompt chunk", 5, 4, false, []int32{15, 2, 8}},
		{"a decode token at position 0", 0, 1, true, []int32{5, 24}},
		{"a decode token deep in the sequence", 40, 1, true, []int32{1, 4, 6, 7, 10, 11, 13, 16, 17, 18, 19}},
		{"a final prompt chunk", 3, 6, true, []int32{20, 21, 22}},
	}
	type seqState struct {
		seq    Sequence
		primer *Sequence
	}
	states := make([]seqState, len(plans))
	for i, p := range plans {
		all := randomTokens(rng, p.prior+p.tokens, v)
		sp := SamplingParams{Temperature: 1.1, TopK: 50, TopP: 0.9, Seed: uint64(100 + i), RepetitionPenalty: 1.2}
		states[i].seq = Sequence{ID: uint64(i + 1), Tokens: all[p.prior:], Pos: p.prior, Blocks: p.blocks,
			Sample: p.sample, Sampling: sp, History: all, NumGenerated: i, ContextLogits: true, ReturnLogits: p.sample}
		if p.prior > 0 {
			states[i].primer = &Sequence{ID: uint64(i + 1), Tokens: all[:p.prior], Blocks: p.blocks}
		}
	}
	batched, alone := newCPU(t, m, 25, 4), newCPU(t, m, 25, 4)
	for _, s := range states {
		if s.primer != nil {
			mustStep(t, batched, *s.primer)
			mustStep(t, alone, *s.primer)
		}
	}
	var seqs []Sequence
	for _, s := range states {
		seqs = append(seqs, s.seq)
	}
	outs := mustStep(t, batched, seqs...)
	for i, p := range plans {
		t.Run(p.name, func(t *testing.T) {
			want := mustStep(t, alone, states[i].seq)[0]
			got := outs[i]
			if d := maxAbsDiff(got.ContextLogits, want.ContextLogits); d > 1e-6 {
				t.Errorf("context logits differ by %g", d)
			}
			if d := maxAbsDiff(got.Logits, want.Logits); p.sample && d > 1e-6 {
				t.Errorf("sampled-position logits differ by %g", d)
			}
			if got.Token != want.Token || got.LogProb != want.LogProb {
				t.Errorf("batched token %d (log-prob %g), alone %d (%g)", got.Token, got.LogProb, want.Token, want.LogProb)
			}
			if !p.sample && got.Token != -1 {
				t.Errorf("sequence without Sample got token %d, want -1", got.Token)
			}
		})
	}
	// A decode step of everything after the batched step reads the KV it wrote.
	for i := range seqs {
		seqs[i].Pos += len(seqs[i].Tokens)
		seqs[i].Tokens = []int32{int32(i)}
		seqs[i].Sample = true
		seqs[i].ContextLogits = false
	}
	outs = mustStep(t, batched, seqs...)
	for i := range seqs {
		want := mustStep(t, alone, seqs[i])[0]
		if d := maxAbsDiff(outs[i].Logits, want.Logits); outs[i].Token != want.Token || (seqs[i].ReturnLogits && d > 1e-6) {
			t.Errorf("%s, next step: batched token %d, alone %d", plans[i].name, outs[i].Token, want.Token)
		}
	}
}

func TestStepComputesOnlyTheLogitsItReturns(t *testing.T) {
	e := newCPU(t, smallGPT2(1), 4, 8)
	outs := mustStep(t, e,
		Sequence{ID: 1, Tokens: []int32{1, 2, 3}, Blocks: []int32{0}},
		Sequence{ID: 2, Tokens: []int32{4}, Blocks: []int32{1}, ReturnLogits: true},
		Sequence{ID: 3, Tokens: []int32{5, 6}, Blocks: []int32{2}, Sample: true},
	)
	if o := outs[0]; o.Token != -1 || o.Logits != nil || o.ContextLogits != nil {
		t.Errorf("prompt chunk without outputs: %+v", o)
	}
	if o := outs[1]; o.Token != -1 || len(o.Logits) != e.Info().VocabSize {
		t.Errorf("ReturnLogits without Sample: token %d, %d logits", o.Token, len(o.Logits))
	}
	if o := outs[2]; o.Token < 0 || o.Logits != nil || o.ContextLogits != nil {
		t.Errorf("Sample only: token %d, logits %v, context logits %v", o.Token, o.Logits != nil, o.ContextLogits != nil)
	}
}

func TestInfoDescribesModelAndPool(t *testing.T) {
	m := smallGPT2(1)
	e := newCPU(t, m, 10, 16)
	want := engine.Info{VocabSize: 300, MaxSeqLen: 64, Layers: 2, KVHeads: 4, HeadDim: 16,
		NumBlocks: 10, TokensPerBlock: 16, EndIDs: []int32{299}, MaxDraft: engine.MaxDraftTokens, Hidden: 64}
	if got := e.Info(); !reflect.DeepEqual(got, want) {
		t.Errorf("Info() = %+v, want %+v", got, want)
	}
	if got, want := len(e.kv), 10*16*2*2*4*16; got != want {
		t.Errorf("KV pool holds %d floats, want %d", got, want)
	}
}

func TestNewRejectsBadModelsAndPools(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(m *model.Float32, kv *KVConfig)
		want   string
	}{
		{"no blocks", func(_ *model.Float32, kv *KVConfig) { kv.NumBlocks = 0 }, "NumBlocks"},
		{"no tokens per block", func(_ *model.Float32, kv *KVConfig) { kv.TokensPerBlock = -1 }, "TokensPerBlock"},
		{"a pool too large", func(_ *model.Float32, kv *KVConfig) { kv.NumBlocks = 1 << 40 }, "exceeds"},
		{"a short tensor", func(m *model.Float32, _ *KVConfig) { m.Layers[1][model.RoleUpBias] = m.Layers[1][model.RoleUpBias][1:] }, "layer 1 up_bias has 255 values"},
		{"a short embedding", func(m *model.Float32, _ *KVConfig) { m.Model[model.RolePosEmbed] = m.Model[model.RolePosEmbed][:10] }, "pos_embed"},
		{"a missing layer", func(m *model.Float32, _ *KVConfig) { m.Layers = m.Layers[:1] }, "1 layers, its config 2"},
		{"a role the architecture lacks", func(m *model.Float32, _ *KVConfig) { m.Model[model.RoleLMHead] = m.Model[model.RoleEmbed] }, "lm_head is set"},
		{"kv heads not dividing heads", func(m *model.Float32, _ *KVConfig) { m.Config.KVHeads = 3 }, "kv_heads 3"},
		{"a zero epsilon", func(m *model.Float32, _ *KVConfig) { m.Config.NormEps = 0 }, "epsilon"},
		{"odd rotary dimensions", func(m *model.Float32, _ *KVConfig) {
			m.Config.Positions, m.Config.Rope = model.RotaryPositions, model.Rope{Theta: 1e4, Dim: 15}
		}, "rotary dimensions 15"},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			m := smallGPT2(1)
			kv := KVConfig{NumBlocks: 4, TokensPerBlock: 16}
			tc.mutate(m, &kv)
			e, err := NewFromModel(m, kv)
			if err == nil {
				e.Close()
				t.Fatalf("NewFromModel succeeded, want an error naming %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
		})
	}
	if _, err := NewFromModel(nil, KVConfig{NumBlocks: 1, TokensPerBlock: 1}); err == nil {
		t.Error("NewFromModel(nil) succeeded")
	}
}

func TestBadSequencesAreRejectedByName(t *testing.T) {
	m := smallGPT2(1) // vocab 300, 64 positions
	good := func() Sequence {
		return Sequence{ID: 42, Tokens: []int32{1, 2, 3}, Pos: 2, Blocks: []int32{0}, Sample: true,
			History: []int32{9, 9, 1, 2, 3}, Sampling: SamplingParams{Temperature: 1}}
	}
	for _, tc := range []struct {
		name   string
		mutate func(s *Sequence)
		want   string
	}{
		{"no new tokens", func(s *Sequence) { s.Tokens = nil }, "Tokens is empty"},
		{"a negative token", func(s *Sequence) { s.Tokens[1] = -1 }, "Tokens[1] = -1 is outside the vocabulary"},
		{"a token beyond the vocabulary", func(s *Sequence) { s.Tokens[2] = 300 }, "Tokens[2] = 300 is outside the vocabulary"},
		{"a negative position", func(s *Sequence) { s.Pos = -1 }, "Pos = -1 is negative"},
		{"a sequence past the maximum length", func(s *Sequence) { s.Pos = 62; s.Blocks = []int32{0, 1, 2, 3} }, "exceeds the model's maximum sequence length 64"},
		{"a block table too short", func(s *Sequence) { s.Pos = 15 }, "block table has 1 blocks"},
		{"a block id beyond the pool", func(s *Sequence) { s.Blocks = []int32{4} }, "Blocks[0] = 4 is outside the KV pool"},
		{"a negative block id", func(s *Sequence) { s.Blocks = []int32{-2} }, "Blocks[0] = -2 is outside the KV pool"},
		{"a block listed twice", func(s *Sequence) { s.Pos = 15; s.Blocks = []int32{1, 1} }, "lists KV block 1 twice"},
	} {
		t.Run("rejects "+tc.name, func(t *testing.T) {
			e := newCPU(t, m, 4, 16)
			// A good sequence first, so the rule is checked wherever the bad one sits.
			ok := Sequence{ID: 7, Tokens: []int32{4}, Blocks: []int32{3}, Sample: true}
			bad := good()
			tc.mutate(&bad)
			before := slices.Clone(e.kv)
			outs, err := e.Step(&Batch{Seqs: []Sequence{ok, bad}})
			if err == nil {
				t.Fatalf("Step succeeded (%d outputs), want an error with %q", len(outs), tc.want)
			}
			if !strings.Contains(err.Error(), "sequence 42") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q should name sequence 42 and %q", err, tc.want)
			}
			if !slices.Equal(before, e.kv) {
				t.Error("a rejected batch wrote into the KV pool")
			}
			if _, err := e.Step(&Batch{Seqs: []Sequence{good()}}); err != nil {
				t.Errorf("the engine does not serve after rejecting a batch: %v", err)
			}
		})
	}

	t.Run("rejects two sequences writing one block", func(t *testing.T) {
		e := newCPU(t, m, 4, 16)
		_, err := e.Step(&Batch{Seqs: []Sequence{
			{ID: 5, Tokens: []int32{1}, Pos: 16, Blocks: []int32{0, 2}},
			{ID: 42, Tokens: []int32{1}, Pos: 3, Blocks: []int32{2}},
		}})
		if err == nil || !strings.Contains(err.Error(), "sequence 42") || !strings.Contains(err.Error(), "sequence 5 also writes") {
			t.Errorf("err = %v, want sequence 42 writing a block sequence 5 writes", err)
		}
	})
	t.Run("allows two sequences reading one block", func(t *testing.T) {
		e := newCPU(t, m, 4, 4)
		mustStep(t, e, Sequence{ID: 1, Tokens: []int32{1, 2, 3, 4}, Blocks: []int32{0}})
		mustStep(t, e,
			Sequence{ID: 2, Tokens: []int32{5}, Pos: 4, Blocks: []int32{0, 1}, Sample: true},
			Sequence{ID: 3, Tokens: []int32{6}, Pos: 4, Blocks: []int32{0, 2}, Sample: true})
	})
	t.Run("rejects a nil batch", func(t *testing.T) {
		e := newCPU(t, m, 4, 16)
		if _, err := e.Step(nil); err == nil {
			t.Error("Step(nil) succeeded")
		}
	})
	t.Run("rejects a step after Close", func(t *testing.T) {
		e := newCPU(t, m, 4, 16)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Step(&Batch{Seqs: []Sequence{good()}}); err == nil || !strings.Contains(err.Error(), "closed") {
			t.Errorf("Step after Close: err = %v, want one saying the engine is closed", err)
		}
	})
	t.Run("accepts an empty batch", func(t *testing.T) {
		e := newCPU(t, m, 4, 16)
		outs, err := e.Step(&Batch{})
		if err != nil || len(outs) != 0 {
			t.Errorf("empty batch: %d outputs, err %v", len(outs), err)
		}
	})
}

func TestBlockCopiesForkASequence(t *testing.T) {
	m := smallGPT2(3)
	e := newCPU(t, m, 4, 4)
	// Six prompt tokens fill block 0 and half of block 1.
	mustStep(t, e, Sequence{ID: 1, Tokens: []int32{1, 2, 3, 4, 5, 6}, Blocks: []int32{0, 1}})
	// A fork continues in a copy of block 1; the original then continues in block 1.
	forkOut, err := e.Step(&Batch{
		Seqs:        []Sequence{{ID: 2, Tokens: []int32{7}, Pos: 6, Blocks: []int32{0, 2}, ReturnLogits: true}},
		BlockCopies: []BlockCopy{{Src: 1, Dst: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	orig := mustStep(t, e, Sequence{ID: 1, Tokens: []int32{7}, Pos: 6, Blocks: []int32{0, 1}, ReturnLogits: true})
	if !slices.Equal(forkOut[0].Logits, orig[0].Logits) {
		t.Error("the fork's logits in a copied block differ from the original's")
	}
	// Without the copy the fork reads an empty block 3 and must differ.
	blank := mustStep(t, e, Sequence{ID: 3, Tokens: []int32{7}, Pos: 6, Blocks: []int32{0, 3}, ReturnLogits: true})
	if slices.Equal(blank[0].Logits, orig[0].Logits) {
		t.Error("a sequence over an uncopied block gave the original's logits: the test shows nothing")
	}
}

func TestBadBlockCopiesAreRejected(t *testing.T) {
	m := smallGPT2(1)
	seq := Sequence{ID: 1, Tokens: []int32{1}, Blocks: []int32{0}}
	for _, tc := range []struct {
		name   string
		copies []BlockCopy
		seqs   []Sequence
		want   string
	}{
		{"a source outside the pool", []BlockCopy{{Src: 4, Dst: 1}}, []Sequence{seq}, "block 4 is outside the KV pool"},
		{"a negative destination", []BlockCopy{{Src: 1, Dst: -1}}, []Sequence{seq}, "block -1 is outside the KV pool"},
		{"a copy onto itself", []BlockCopy{{Src: 2, Dst: 2}}, []Sequence{seq}, "onto itself"},
		{"two copies onto one block", []BlockCopy{{Src: 1, Dst: 2}, {Src: 3, Dst: 2}}, []Sequence{seq}, "an earlier copy"},
		{"copies without sequences", []BlockCopy{{Src: 1, Dst: 2}}, nil, "without sequences"},
	} {
		t.Run("rejects "+tc.name, func(t *testing.T) {
			e := newCPU(t, m, 4, 16)
			before := slices.Clone(e.kv)
			if _, err := e.Step(&Batch{Seqs: tc.seqs, BlockCopies: tc.copies}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one with %q", err, tc.want)
			}
			if !slices.Equal(before, e.kv) {
				t.Error("a rejected batch changed the KV pool")
			}
		})
	}
}

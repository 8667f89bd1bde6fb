package cpu

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gollm/engine"
	"gollm/model"
)

// TestTensorParallelMatchesOneEngine runs the same batch — prompts of several lengths
// with their context logits, then greedy and sampled decode steps — on the whole model
// and split over 2 and 4 ranks, for GPT-2 (learned positions, fused transposed
// projections, biases), LLaMA (grouped-query attention, rotary, gated MLP), Qwen2 (one
// KV head held by every rank, QKV biases, a tied head), Phi-3 (a partial rotary factor;
// longrope, its sequences on both sides of the original context), Qwen3 (per-head q/k
// norms) and Gemma 2 and 3 (post-norms of the ranks' summed branches, soft-caps, the
// embedding scale), Mixtral, Qwen2-MoE and Qwen3-MoE (every expert, and the shared expert,
// split along its units; the router whole on every rank) — over as many ranks as their
// heads allow: the same tokens and
// log-probabilities, and logits within float32 rounding of a different summation order.
func TestTensorParallelMatchesOneEngine(t *testing.T) {
	for _, fixture := range []string{"gpt2-tiny", "llama-tiny", "qwen2-tiny", "phi3-tiny", "phi3-longrope-tiny",
		"qwen3-tiny", "gemma2-tiny", "gemma3-tiny", "mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny"} {
		ck, ws, kv, want := wholeModelRun(t, fixture)
		for _, n := range []int{2, 4} {
			if ck.Config.Heads%n != 0 {
				continue
			}
			tp, err := NewTensorParallel(&ck.Config, ws, n, kv)
			if err != nil {
				t.Fatalf("%s over %d: %v", fixture, n, err)
			}
			sameAsWhole(t, fixture, n, runTP(t, tp, 7), want)
			_ = tp.Close()
		}
		_ = ck.Close()
	}
}

// wholeModelRun opens a fixture and runs runTP's seven steps on one engine over the whole
// model: the checkpoint, its weights, the KV pool the ranks get too, and the outputs.
func wholeModelRun(t *testing.T, fixture string) (*model.Checkpoint, []model.Weight, engine.KVConfig, [][]engine.Output) {
	t.Helper()
	ck, err := model.Open(filepath.Join("..", "..", "testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	ws, err := ck.Weights()
	if err != nil {
		t.Fatal(err)
	}
	kv := engine.KVConfig{NumBlocks: 32, TokensPerBlock: 8}
	whole, err := ck.Float32Weights()
	if err != nil {
		t.Fatal(err)
	}
	one, err := NewFromModel(whole, kv)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	return ck, ws, kv, runTP(t, one, 7)
}

// sameAsWhole fails t unless the steps of fixture over n ranks gave the whole model's
// tokens, log-probabilities within 1e-4 and context logits within 1e-5 relative L2.
func sameAsWhole(t *testing.T, fixture string, n int, got, want [][]engine.Output) {
	t.Helper()
	for k := range want {
		for i := range want[k] {
			g, w := &got[k][i], &want[k][i]
			if g.Token != w.Token || math.Abs(float64(g.LogProb-w.LogProb)) > 1e-4 {
				t.Fatalf("%s over %d, step %d, sequence %d: token %d (%g), want %d (%g)", fixture, n, k, i, g.Token, g.LogProb, w.Token, w.LogProb)
			}
			if e := relL2(g.ContextLogits, w.ContextLogits); e > 1e-5 {
				t.Fatalf("%s over %d, step %d, sequence %d: context logits off by %.2e", fixture, n, k, i, e)
			}
		}
	}
}

// runTP runs three sequences through eng: their prompts (context logits asked) and
// steps decode steps, the first sequence greedy and the others sampled.
func runTP(t *testing.T, eng engine.Engine, steps int) [][]engine.Output {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	V := eng.Info().VocabSize
	seqs := make([]engine.Sequence, 3)
	for i := range seqs {
		p := make([]int32, 3+5*i)
		for j := range p {
			p[j] = int32(rng.IntN(V))
		}
		blocks := []int32{int32(10 * i), int32(10*i + 1), int32(10*i + 2), int32(10*i + 3)}
		sp := engine.SamplingParams{}
		if i > 0 {
			sp = engine.SamplingParams{Temperature: 1, TopK: 50, Seed: uint64(i)}
		}
		seqs[i] = engine.Sequence{ID: uint64(i + 1), Tokens: p, Blocks: blocks, Sample: true, Sampling: sp, History: p, ContextLogits: true}
	}
	var all [][]engine.Output
	for k := 0; k <= steps; k++ {
		outs, err := eng.Step(&engine.Batch{Seqs: seqs})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, outs)
		for i := range seqs {
			s := &seqs[i]
			s.Pos += len(s.Tokens)
			s.History = append(slices.Clone(s.History), outs[i].Token)
			s.Tokens = s.History[len(s.History)-1:]
			s.NumGenerated++
		}
	}
	return all
}

// TestExpertParallelMatchesOneEngine runs runTP's batch — three sequences' prompts with
// their context logits, then greedy and sampled decode steps — on the whole model and
// over 2 and 4 ranks with the experts spread whole (Mixtral's 8 experts top 2, renormalised;
// Qwen2-MoE's 8 without norm_topk_prob and its gated shared expert split along its
// units; Qwen3-MoE's 8 with norm_topk_prob, beside a dense layer): each rank holds its
// 8/n experts whole (and only those), and the steps give the same tokens and
// log-probabilities, and logits within float32 rounding of a different summation order,
// as the whole model.
func TestExpertParallelMatchesOneEngine(t *testing.T) {
	for _, fixture := range []string{"mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny"} {
		ck, ws, kv, want := wholeModelRun(t, fixture)
		m := ck.Config.MoE
		for _, n := range []int{2, 4} {
			ep, err := NewExpertParallel(&ck.Config, ws, n, kv)
			if err != nil {
				t.Fatalf("%s over %d: %v", fixture, n, err)
			}
			for r, e := range ep.ranks {
				first, held := e.w.cfg.MoE.Held()
				if first != r*m.Experts/n || held != m.Experts/n {
					t.Fatalf("%s over %d, rank %d: experts from %d, %d of them", fixture, n, r, first, held)
				}
				for li := range e.w.layers {
					if !ck.Config.Sparse(li) {
						continue
					}
					if got, want := len(e.w.layers[li].moe.up), held*2*m.Inner*ck.Config.Hidden; got != want {
						t.Fatalf("%s over %d, rank %d, layer %d: %d expert up weights, want %d (its experts whole)", fixture, n, r, li, got, want)
					}
				}
			}
			sameAsWhole(t, fixture, n, runTP(t, ep, 7), want)
			_ = ep.Close()
		}
		_ = ck.Close()
	}
}

// TestExpertParallelRefusals: expert parallelism of a model without experts, or over
// ranks its heads do not split, is refused naming what does not go.
func TestExpertParallelRefusals(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		n       int
		want    string
	}{
		{"llama-tiny", 2, "the model has no mixture of experts"},
		{"mixtral-tiny", 3, "does not divide the model's 4 attention heads"},
	} {
		ck, err := model.Open(filepath.Join("..", "..", "testdata", tc.fixture))
		if err != nil {
			t.Fatal(err)
		}
		ws, err := ck.Weights()
		if err != nil {
			t.Fatal(err)
		}
		if e, err := NewExpertParallel(&ck.Config, ws, tc.n, engine.KVConfig{NumBlocks: 8, TokensPerBlock: 8}); err == nil || !strings.Contains(err.Error(), tc.want) {
			if e != nil {
				_ = e.Close()
			}
			t.Errorf("%s over %d: %v, want an error containing %q", tc.fixture, tc.n, err, tc.want)
		}
		_ = ck.Close()
	}
}

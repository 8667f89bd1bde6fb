package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gollm/engine"
)

// TestGPUPromptGraphsGiveTheSameTokens runs prompt steps and mixed steps (new prompts
// beside decode rows), and prompts of many lengths alone, three times on an engine with CUDA graphs — eagerly on the padded
// plan, then captured and replayed, then replayed — and once on an engine without
// graphs: the three must agree exactly, and with the engine without graphs on every token
// (exactly on prompt steps, whose padding changes no kernel's shape that a real row sees;
// decode rows' attention is split for the longest sequence in a graph, so their
// log-probabilities may differ in the last bits).
func TestGPUPromptGraphsGiveTheSameTokens(t *testing.T) {
	for _, fixture := range []string{"gpt2-tiny", "llama-tiny"} {
		t.Run(fixture, func(t *testing.T) {
			const perBlock = 16
			graphs := gpuEngineOn(t, fixture, 64, perBlock)
			eager := gpuEngineWith(t, fixture, Options{NumBlocks: 64, TokensPerBlock: perBlock,
				MaxTokens: 256, MaxSeqs: 16, DisableCUDAGraphs: true})
			vocab := graphs.Info().VocabSize
			rng := rand.New(rand.NewPCG(17, 17))
			prompt := func(id, n, firstBlock int, sampled bool) engine.Sequence {
				s := engine.Sequence{ID: uint64(id), Sample: true}
				for range n {
					s.Tokens = append(s.Tokens, int32(rng.IntN(vocab)))
				}
				s.History = s.Tokens
				for b := range (n + 40 + perBlock - 1) / perBlock {
					s.Blocks = append(s.Blocks, int32(firstBlock+b))
				}
				if sampled {
					s.Sampling = engine.SamplingParams{Temperature: 0.9, TopK: 40, Seed: uint64(id) * 31}
				}
				return s
			}
			// Three prompts (20, 37 and 50 tokens: more rows than the gemv and tiled kernels
			// take), one sampled.
			first := []engine.Sequence{prompt(1, 20, 0, false), prompt(2, 37, 8, true), prompt(3, 50, 16, false)}
			// Then those three decode beside two new prompts.
			mixed := func(outs []engine.Output) []engine.Sequence {
				var b []engine.Sequence
				for i, s := range first {
					s.Pos = len(s.Tokens)
					s.Tokens = []int32{outs[i].Token}
					s.History = append(append([]int32(nil), s.History...), outs[i].Token)
					s.NumGenerated = 1
					b = append(b, s)
				}
				return append(b, prompt(4, 29, 24, true), prompt(5, 18, 32, false))
			}
			compare := func(what string, batch []engine.Sequence, exact bool) []engine.Output {
				want, err := eager.Step(&engine.Batch{Seqs: batch})
				if err != nil {
					t.Fatalf("%s without graphs: %v", what, err)
				}
				var runs [3][]engine.Output
				for k := range runs {
					if runs[k], err = graphs.Step(&engine.Batch{Seqs: batch}); err != nil {
						t.Fatalf("%s, run %d with graphs: %v", what, k, err)
					}
				}
				for i := range want {
					for k := range runs {
						g := runs[k][i]
						if g.Token != runs[0][i].Token || g.LogProb != runs[0][i].LogProb {
							t.Errorf("%s, sequence %d: run %d gave %d (%g), run 0 %d (%g)", what, i, k,
								g.Token, g.LogProb, runs[0][i].Token, runs[0][i].LogProb)
						}
					}
					g := runs[2][i]
					if g.Token != want[i].Token ||
						(exact && g.LogProb != want[i].LogProb) ||
						math.Abs(float64(g.LogProb-want[i].LogProb)) > 1e-3 {
						t.Errorf("%s, sequence %d: with graphs %d (%g), without %d (%g)", what, i,
							g.Token, g.LogProb, want[i].Token, want[i].LogProb)
					}
				}
				return want
			}
			outs := compare("prompt step", first, true)
			compare("mixed step", mixed(outs), false)
			// Prompts alone, of lengths whose padded shapes recur and differ: each replays
			// the graph of its own shape (as gollm-gpucheck's prompts run), never another's.
			for i, n := range []int{17, 32, 20, 33, 44, 48, 63, 65, 80, 100, 120, 47, 99, 121} {
				compare(fmt.Sprintf("prompt of %d tokens", n), []engine.Sequence{prompt(10+i, n, 40, i%3 == 0)}, true)
			}
		})
	}
}

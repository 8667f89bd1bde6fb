package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gollm/engine"
)

// TestGPUPromptGraphsGiveTheSameTokens runs prompt steps and mixed steps (new prompts
// beside decode rows), and prompts of many lengths alone, three times on an engine with
// CUDA graphs — eagerly on the padded plan, then captured and replayed, then replayed —
// and once on an engine without graphs: the three must agree exactly, and with the engine without graphs on every token
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

// TestGPUPromptGraphsPastTheirBounds runs more padded prompt shapes than an engine keeps
// graphs of (64), seven times over, on an engine with graphs and once on one without:
// every pass must give the same tokens — through the eager first sightings, the captures,
// the captures the budget holds back (past the first 64, until replays outnumber captures
// four to one), the replays, and the captures that drop the least recently replayed graph.
func TestGPUPromptGraphsPastTheirBounds(t *testing.T) {
	const perBlock = 16
	graphs := gpuEngineWith(t, "gpt2-tiny", Options{NumBlocks: 64, TokensPerBlock: perBlock, MaxTokens: 256, MaxSeqs: 16})
	eager := gpuEngineWith(t, "gpt2-tiny", Options{NumBlocks: 64, TokensPerBlock: perBlock, MaxTokens: 256,
		MaxSeqs: 16, DisableCUDAGraphs: true})
	vocab := graphs.Info().VocabSize
	rng := rand.New(rand.NewPCG(23, 23))
	pow2 := func(v int) int {
		b := 1
		for b < v {
			b <<= 1
		}
		return b
	}
	type shape struct {
		rows, seqs, tiles, lrows int
		greedy                   bool
	}
	seen := map[shape]bool{}
	var batches [][]engine.Sequence
	for try := 0; len(batches) < 80; try++ {
		if try == 100000 {
			t.Fatalf("%d shapes of prompt steps found, want 80", len(batches))
		}
		k := 1 + rng.IntN(8)
		var b []engine.Sequence
		rows, tiles, sampled, greedy := 0, 0, 0, true
		for i := range k {
			n := 17 + rng.IntN(24)
			if rows+n > 250 {
				break
			}
			s := engine.Sequence{ID: uint64(i + 1), Sample: i > 0 || rng.IntN(3) > 0}
			for range n {
				s.Tokens = append(s.Tokens, int32(rng.IntN(vocab)))
			}
			s.History = s.Tokens
			for j := range (n + perBlock - 1) / perBlock {
				s.Blocks = append(s.Blocks, int32(3*i+j))
			}
			if s.Sample && rng.IntN(2) == 0 {
				s.Sampling = engine.SamplingParams{Temperature: 0.8, TopK: 20, Seed: uint64(len(batches)*10 + i)}
				greedy = false
			}
			if s.Sample {
				sampled++
			} else {
				greedy = false // the library's plain-greedy steps sample every sequence
			}
			rows += n
			tiles += (n + 15) / 16
			b = append(b, s)
		}
		sh := shape{gemmRows(rows), pow2(len(b) + 1), pow2(tiles), pow2(sampled), greedy}
		if sampled == 0 {
			sh.lrows = 0
		}
		if !seen[sh] {
			seen[sh] = true
			batches = append(batches, b)
		}
	}
	want := make([][]engine.Output, len(batches))
	for i, b := range batches {
		var err error
		if want[i], err = eager.Step(&engine.Batch{Seqs: b}); err != nil {
			t.Fatalf("batch %d without graphs: %v", i, err)
		}
	}
	for pass := range 7 {
		for i, b := range batches {
			got, err := graphs.Step(&engine.Batch{Seqs: b})
			if err != nil {
				t.Fatalf("pass %d, batch %d: %v", pass, i, err)
			}
			for j := range want[i] {
				g, w := got[j], want[i][j]
				if g.Token != w.Token || math.Abs(float64(g.LogProb-w.LogProb)) > 1e-5 {
					t.Fatalf("pass %d, batch %d, sequence %d: with graphs %d (%g), without %d (%g)",
						pass, i, j, g.Token, g.LogProb, w.Token, w.LogProb)
				}
			}
		}
	}
}

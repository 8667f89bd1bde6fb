package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"gollm/engine"
	"gollm/engine/enginetest"
)

// moeGolden is a mixture-of-experts fixture's golden run (testdata/make_family_fixtures.py:
// transformers in float32): the prompt, its logits, the greedy tokens and their steps'
// logits. Along it the fixtures' router probabilities stay more than 1e-3 apart, so that
// rounding cannot send a token to other experts.
type moeGolden struct {
	prompt, greedy        []int32
	promptLogits, decoded []float32
}

func loadMoEGolden(t *testing.T, name string) moeGolden {
	t.Helper()
	ts, err := enginetest.ReadSafetensors(filepath.Join("..", "..", "testdata", name+"-golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	var g moeGolden
	for _, f := range []struct {
		name string
		i32  *[]int32
		f32  *[]float32
	}{{"prompt_ids", &g.prompt, nil}, {"greedy_tokens", &g.greedy, nil}, {"prompt_logits", nil, &g.promptLogits},
		{"decode_logits", nil, &g.decoded}} {
		tn, ok := ts[f.name]
		if !ok {
			t.Fatalf("%s: no %s", name, f.name)
		}
		if f.i32 != nil {
			*f.i32, err = tn.Int32()
		} else {
			*f.f32, err = tn.Float32()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// moeGPUFixtures are the mixture-of-experts fixtures the GPU tests run: Mixtral (8
// experts, top 2 renormalised; an expert width of 12, which the grouped projections take
// one element at a time), Qwen2-MoE (top 2 of 8 plain, a gated shared expert; widths of 8
// and 32, 16-byte loads and the tensor cores) and Qwen3-MoE (q/k norms, a dense first
// layer before a sparse one).
var moeGPUFixtures = []string{"mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny"}

// goldenRun runs g's prompt then its greedy tokens on e (one sequence among fillers:
// random prompts of 8 to 16 tokens, fill rows in all, beside it at the prompt step, one
// decode row each at the others) and returns its prompt logits and each step's logits and token.
func goldenRun(t *testing.T, e engine.Engine, g moeGolden, fill int) (prompt, steps []float32, tokens []int32) {
	t.Helper()
	V := e.Info().VocabSize
	blocks := func(first int) []int32 { return []int32{int32(first), int32(first + 1), int32(first + 2)} }
	seqs := []engine.Sequence{{ID: 1, Tokens: g.prompt, Blocks: blocks(0), Sample: true, ContextLogits: true,
		History: slices.Clone(g.prompt)}}
	rng := rand.New(rand.NewPCG(5, 5))
	for i := 0; fill > 0; i++ {
		n := min(fill, 8+rng.IntN(9))
		fill -= n
		p := make([]int32, n)
		for j := range p {
			p[j] = int32(rng.IntN(V))
		}
		seqs = append(seqs, engine.Sequence{ID: uint64(i + 2), Tokens: p, Blocks: blocks(3 * (i + 1)), Sample: true,
			History: slices.Clone(p)})
	}
	for k := 0; k <= len(g.greedy); k++ {
		outs, err := e.Step(&engine.Batch{Seqs: seqs})
		if err != nil {
			t.Fatalf("step %d: %v", k, err)
		}
		if k == 0 {
			prompt = outs[0].ContextLogits
		} else {
			steps = append(steps, outs[0].Logits...)
		}
		tokens = append(tokens, outs[0].Token)
		if k == len(g.greedy) {
			break
		}
		// Every sequence goes on with the golden token (the first) or its own.
		for i := range seqs {
			s := &seqs[i]
			next := outs[i].Token
			if i == 0 {
				next = g.greedy[k]
			}
			s.Pos += len(s.Tokens)
			s.Tokens = []int32{next}
			s.History = append(slices.Clone(s.History), next)
			s.NumGenerated++
			s.ContextLogits, s.ReturnLogits = false, i == 0
		}
	}
	if len(prompt) != len(g.prompt)*V || len(steps) != len(g.greedy)*V {
		t.Fatalf("%d prompt and %d step logits for %d and %d rows of %d", len(prompt), len(steps), len(g.prompt),
			len(g.greedy), V)
	}
	return prompt, steps, tokens
}

// TestGPUExpertsMatchTransformers runs the mixture-of-experts fixtures' golden prompt and
// greedy continuation on the GPU in float16 and bfloat16, alone (the few-row kernels: a
// gemv a routed expert) and beside filler sequences of 100 rows in all (the prompt step
// on the tensor-core grouped GEMMs where the widths allow, decode steps of 7 rows on the
// gemv): every logits row within moeRelL2 of transformers' float32, and every greedy token
// transformers' where its top two are further apart than six times the run's rms logit
// error (check.py's rule).
func TestGPUExpertsMatchTransformers(t *testing.T) {
	for _, name := range moeGPUFixtures {
		for _, dtype := range []string{"float16", "bfloat16"} {
			for _, fill := range []int{0, 100} {
				t.Run(fmt.Sprintf("%s/%s/fill%d", name, dtype, fill), func(t *testing.T) {
					e := gpuEngineWith(t, name, Options{DType: dtype, NumBlocks: 128, TokensPerBlock: 16, MaxTokens: 256,
						MaxSeqs: 64})
					g := loadMoEGolden(t, name)
					prompt, steps, tokens := goldenRun(t, e, g, fill)
					V := e.Info().VocabSize
					bar := map[string]float64{"float16": 1e-2, "bfloat16": 4e-2}[dtype]
					worst, rms := 0.0, 0.0
					check := func(what string, got, want []float32) {
						for r := 0; r+V <= len(want); r += V {
							e := relL2(got[r:r+V], want[r:r+V])
							worst = max(worst, e)
							if e > bar || math.IsNaN(e) {
								t.Errorf("%s row %d: relative L2 %.3g from transformers (bar %g)", what, r/V, e, bar)
							}
							var s float64
							for i := r; i < r+V; i++ {
								d := float64(got[i] - want[i])
								s += d * d
							}
							rms = max(rms, math.Sqrt(s/float64(V)))
						}
					}
					check("prompt", prompt, g.promptLogits)
					check("decode", steps, g.decoded)
					for k, tok := range tokens {
						want := []float32(nil)
						if k == 0 {
							want = g.promptLogits[(len(g.prompt)-1)*V : len(g.prompt)*V]
						} else {
							want = g.decoded[(k-1)*V : k*V]
						}
						if k < len(g.greedy) && tok != g.greedy[k] {
							top := slices.Clone(want)
							slices.Sort(top)
							if gap := float64(top[V-1] - top[V-2]); gap >= 6*rms {
								t.Errorf("step %d: token %d, transformers %d (top-2 gap %.3g, six rms errors %.3g)", k, tok,
									g.greedy[k], gap, 6*rms)
							}
						}
					}
					t.Logf("%s %s beside %d rows: worst relative L2 %.2e, rms logit error %.2e", name, dtype, fill, worst, rms)
				})
			}
		}
	}
}

// TestGPUExpertsAcrossGPUs runs the golden prompt and continuation split over 2 GPUs
// (each expert along its units; the TP-1 path of one rank on a machine of one GPU)
// beside one GPU: the logits agree within tpRelL2 and the tokens exactly (the ranks'
// partial sums add in another order, and the golden path's routes are far from ties).
func TestGPUExpertsAcrossGPUs(t *testing.T) {
	lib := tpLibrary(t, 1)
	n := tpRanks(lib)
	for _, name := range moeGPUFixtures {
		t.Run(fmt.Sprintf("%s/tp%d", name, n), func(t *testing.T) {
			dir := filepath.Join("..", "..", "testdata", name)
			opts := tpOptions(lib)
			g := loadMoEGolden(t, name)
			p1, s1, t1 := goldenRun(t, oneOn(t, dir, opts), g, 0)
			pn, sn, tn := goldenRun(t, tpOn(t, dir, n, opts), g, 0)
			if !slices.Equal(t1, tn) {
				t.Errorf("tokens %v over %d GPUs, %v on one", tn, n, t1)
			}
			V := len(g.promptLogits) / len(g.prompt)
			for _, pair := range [][2][]float32{{pn, p1}, {sn, s1}} {
				for r := 0; r+V <= len(pair[1]); r += V {
					if e := relL2(pair[0][r:r+V], pair[1][r:r+V]); e > tpRelL2 || math.IsNaN(e) {
						t.Errorf("logits row %d: relative L2 %.3g over %d GPUs from one GPU's", r/V, e, n)
					}
				}
			}
		})
	}
}

// TestGPUExpertsAtEveryRowCount runs prefixes of the fixtures' golden sequence (the prompt,
// then the greedy tokens: 30 tokens whose rows transformers gave) as the prompts of one
// step, so that the experts see one pass of 1 to 1,024 rows (each expert's rows the
// golden sequence's routes times the copies) and then two passes (1,100 rows): the
// one-row kernels, gemv tiles, the tensor cores' 16- and 64-row tiles, experts split over
// several tiles. Every row's logits within moeRelL2's bar of transformers' float32.
func TestGPUExpertsAtEveryRowCount(t *testing.T) {
	totals := []int{1, 2, 3, 5, 8, 9, 16, 17, 31, 33, 64, 65, 100, 128, 129, 256, 511, 1024, 1100}
	for _, name := range moeGPUFixtures {
		for _, dtype := range []string{"float16", "bfloat16"} {
			t.Run(name+"/"+dtype, func(t *testing.T) {
				e := gpuEngineWith(t, name, Options{DType: dtype, NumBlocks: 256, TokensPerBlock: 16, MaxTokens: 1200,
					MaxSeqs: 64})
				g := loadMoEGolden(t, name)
				V := e.Info().VocabSize
				full := append(slices.Clone(g.prompt), g.greedy...)
				want := append(slices.Clone(g.promptLogits), g.decoded...)
				L := len(full)
				bar := map[string]float64{"float16": 1e-2, "bfloat16": 4e-2}[dtype]
				for _, total := range totals {
					var seqs []engine.Sequence
					for left, i := total, 0; left > 0; i++ {
						n := min(left, L)
						left -= n
						seqs = append(seqs, engine.Sequence{ID: uint64(i + 1), Tokens: full[:n],
							Blocks: []int32{int32(2 * i), int32(2*i + 1)}, Sample: true, ContextLogits: true,
							History: slices.Clone(full[:n])})
					}
					outs, err := e.Step(&engine.Batch{Seqs: seqs})
					if err != nil {
						t.Fatalf("%d rows: %v", total, err)
					}
					worst := 0.0
					for i, s := range seqs {
						got := outs[i].ContextLogits
						if len(got) != len(s.Tokens)*V {
							t.Fatalf("%d rows: sequence %d has %d logits for %d rows", total, i, len(got), len(s.Tokens))
						}
						for r := range s.Tokens {
							d := relL2(got[r*V:(r+1)*V], want[r*V:(r+1)*V])
							worst = max(worst, d)
							if d > bar || math.IsNaN(d) {
								t.Errorf("%d rows: sequence %d row %d: relative L2 %.3g from transformers (bar %g)", total, i,
									r, d, bar)
							}
						}
					}
					t.Logf("%d rows (%d sequences): worst relative L2 %.2e", total, len(seqs), worst)
				}
			})
		}
	}
}

// TestGPUExpertParallelMatchesOneGPU runs the golden prompt and continuation with the
// experts spread whole over 2 GPUs (and 4 where the machine has them: Options.
// ExpertParallel, each rank E/N experts, only its own (token, expert) pairs computed, the
// shared expert split along its units) beside one GPU: alone (decode at batch 1: the
// router's one-row routing, the fused down projection and combination), beside a filler
// of 8 rows (decode steps of 2 rows: gemv tiles) and beside fillers of 100 rows (the
// routing kernel, the tensor-core grouped GEMMs, the combination; prompts in chunks of
// 40 rows). The golden sequence's logits agree within tpRelL2 and its tokens exactly, as
// TestGPUExpertsAcrossGPUs asks of tensor parallelism: a rank that computed another's
// pairs with its own weights, dropped its own, or renormalised over its local experts
// would be O(1) off. It skips with fewer than 2 GPUs.
func TestGPUExpertParallelMatchesOneGPU(t *testing.T) {
	lib := tpLibrary(t, 2)
	ranks := []int{2}
	if n, _ := DeviceCount(lib); n >= 4 {
		ranks = append(ranks, 4)
	}
	for _, name := range moeGPUFixtures {
		for _, n := range ranks {
			// The two engines of a fixture run its three batches (an engine keeps nothing of
			// a sequence but its KV blocks, which each run writes from position 0).
			t.Run(fmt.Sprintf("%s/ep%d", name, n), func(t *testing.T) {
				dir := filepath.Join("..", "..", "testdata", name)
				opts := tpOptions(lib)
				g := loadMoEGolden(t, name)
				one := oneOn(t, dir, opts)
				opts.ExpertParallel = true
				ep := tpOn(t, dir, n, opts)
				for _, fill := range []int{0, 8, 100} {
					t.Run(fmt.Sprintf("fill%d", fill), func(t *testing.T) {
						p1, s1, t1 := goldenRun(t, one, g, fill)
						pn, sn, tn := goldenRun(t, ep, g, fill)
						if !slices.Equal(t1, tn) {
							t.Errorf("tokens %v with the experts over %d GPUs, %v on one", tn, n, t1)
						}
						V := len(g.promptLogits) / len(g.prompt)
						worst := 0.0
						for _, pair := range [][2][]float32{{pn, p1}, {sn, s1}} {
							for r := 0; r+V <= len(pair[1]); r += V {
								e := relL2(pair[0][r:r+V], pair[1][r:r+V])
								worst = max(worst, e)
								if e > tpRelL2 || math.IsNaN(e) {
									t.Errorf("logits row %d: relative L2 %.3g with the experts over %d GPUs from one GPU's", r/V, e, n)
								}
							}
						}
						t.Logf("%s, experts over %d GPUs, beside %d rows: worst relative L2 %.2e from one GPU", name, n, fill, worst)
					})
				}
			})
		}
	}
}

package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gollm/model"
)

// TestBatchInvarianceBitwise runs a sequence alone, then at the start, middle and end of
// batches of 2, 7 and 64 (the others' prompts of other lengths), with each kernel path,
// on GPT-2, a LLaMA with grouped queries and a mixture of experts: its prompt's logits at
// every position and its logits at two decode steps must be bitwise those it gets alone
// (cuda/README.md's guarantee, which the CPU engine gives too).
func TestBatchInvarianceBitwise(t *testing.T) {
	models := []struct {
		name string
		m    func(t *testing.T) *model.Float32
	}{
		{"gpt2", func(*testing.T) *model.Float32 { return randomGPT2(300, 128, 64, 2, 4, 5) }},
		{"llama-tiny", func(t *testing.T) *model.Float32 { return loadModel(t, "../../testdata/llama-tiny") }},
		{"mixtral-tiny", func(t *testing.T) *model.Float32 { return loadModel(t, "../../testdata/mixtral-tiny") }},
	}
	for _, mm := range models {
		t.Run(mm.name, func(t *testing.T) {
			m := mm.m(t)
			forEachKernelPath(t, func(t *testing.T) { testCPUInvariance(t, m) })
		})
	}
}

func testCPUInvariance(t *testing.T, m *model.Float32) {
	const per, most, decodes = 4, 64, 2 // per: 4 blocks of 16 positions a sequence
	vocab := m.Config.VocabSize
	rng := rand.New(rand.NewPCG(39, 39))
	table := func(slot int) []int32 {
		var b []int32
		for j := range per {
			b = append(b, int32(per*slot+j))
		}
		return b
	}
	target := randomTokens(rng, 29, vocab)
	// run gives the sequence at index at of prompts (target's there) its context logits,
	// then its logits at each decode step, every sequence fed its own greedy token.
	e := newCPU(t, m, (most+1)*per, 16)
	run := func(prompts [][]int32, at int) [][]float32 {
		seqs := make([]Sequence, len(prompts))
		for i, p := range prompts {
			seqs[i] = Sequence{ID: uint64(i + 1), Tokens: p, History: p, Blocks: table(i), Sample: true,
				ContextLogits: i == at}
		}
		outs := mustStep(t, e, seqs...)
		got := [][]float32{outs[at].ContextLogits}
		for k := range decodes {
			for i := range seqs {
				s := &seqs[i]
				s.Pos += len(s.Tokens)
				s.Tokens = []int32{outs[i].Token}
				s.History = append(append([]int32(nil), s.History...), outs[i].Token)
				s.NumGenerated, s.ContextLogits, s.ReturnLogits = k+1, false, i == at
			}
			outs = mustStep(t, e, seqs...)
			got = append(got, outs[at].Logits)
		}
		return got
	}
	alone := run([][]int32{target}, 0)
	for _, b := range []int{2, 7, most} {
		for _, at := range []int{0, b / 2, b - 1} {
			prompts := make([][]int32, b)
			for i := range prompts {
				prompts[i] = randomTokens(rng, 3+rng.IntN(30), vocab)
			}
			prompts[at] = target
			got := run(prompts, at)
			for k := range alone {
				if len(got[k]) != len(alone[k]) {
					t.Fatalf("batch of %d at %d, step %d: %d logits, alone %d", b, at, k, len(got[k]), len(alone[k]))
				}
				for i := range alone[k] {
					if math.Float32bits(got[k][i]) != math.Float32bits(alone[k][i]) {
						what := "the prompt"
						if k > 0 {
							what = fmt.Sprintf("decode step %d", k)
						}
						t.Errorf("batch of %d at %d, %s: logit %d is %g, alone %g", b, at, what, i, got[k][i], alone[k][i])
						break
					}
				}
			}
		}
	}
}

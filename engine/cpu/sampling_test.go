package cpu

import (
	"slices"
	"testing"
)

func TestSampledTokensDoNotDependOnTheBatch(t *testing.T) {
	m := smallGPT2(4)
	e := newCPU(t, m, 16, 8)
	target := Sequence{ID: 9, Tokens: []int32{5, 6, 7}, Blocks: []int32{3}, Sample: true, History: []int32{5, 6, 7},
		Sampling: SamplingParams{Temperature: 1.3, TopP: 0.97, Seed: 555}, NumGenerated: 2}
	alone := mustStep(t, e, target)[0]
	for _, others := range [][]Sequence{
		{{ID: 1, Tokens: []int32{1}, Blocks: []int32{0}, Sample: true, Sampling: SamplingParams{Temperature: 1, Seed: 555}}},
		{
			{ID: 2, Tokens: []int32{8, 8, 8, 8}, Blocks: []int32{1}, Sample: true, Sampling: SamplingParams{Temperature: 0.5, Seed: 1}},
			{ID: 3, Tokens: []int32{2}, Blocks: []int32{2}, Sample: true},
		},
	} {
		outs := mustStep(t, e, append(slices.Clone(others), target)...)
		if got := outs[len(outs)-1]; got.Token != alone.Token || got.LogProb != alone.LogProb {
			t.Errorf("with %d other sequences: token %d (%g), alone %d (%g)", len(others), got.Token, got.LogProb, alone.Token, alone.LogProb)
		}
	}
}

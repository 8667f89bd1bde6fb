package cpu

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"gollm/engine"
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

// TestEveryTokenMaskedFailsTheSequenceAlone: a sequence whose bad words leave no token
// (here after its history, which admission cannot foresee) gets its own error; the other
// sequences of the step sample as they would alone; and under the overlap schedule a row
// fed from it fails the same way while its neighbours go on.
func TestEveryTokenMaskedFailsTheSequenceAlone(t *testing.T) {
	m := smallGPT2(4)
	e := newCPU(t, m, 16, 8)
	V := e.Info().VocabSize
	// Every token is bad after token 7.
	bad := make([][]int32, V)
	for i := range bad {
		bad[i] = []int32{7, int32(i)}
	}
	poisoned := Sequence{ID: 9, Tokens: []int32{5, 6, 7}, Blocks: []int32{3}, Sample: true, History: []int32{5, 6, 7},
		Sampling: SamplingParams{BadWords: bad}}
	other := Sequence{ID: 1, Tokens: []int32{1, 2}, Blocks: []int32{0}, Sample: true, History: []int32{1, 2},
		Sampling: SamplingParams{Temperature: 1, Seed: 3}}
	alone := mustStep(t, e, other)[0]
	outs := mustStep(t, e, other, poisoned)
	if outs[0].Err != nil || outs[0].Token != alone.Token || outs[0].LogProb != alone.LogProb {
		t.Errorf("the other sequence: %+v, alone %+v", outs[0], alone)
	}
	if !errors.Is(outs[1].Err, engine.ErrAllMasked) || outs[1].Token != -1 || !strings.Contains(outs[1].Err.Error(), "sequence 9") {
		t.Errorf("the poisoned sequence: token %d, error %v", outs[1].Token, outs[1].Err)
	}

	p := engine.NewSyncPipeline(e)
	if err := p.Launch(&Batch{Seqs: []Sequence{other, poisoned}}); err != nil {
		t.Fatal(err)
	}
	fedOther := Sequence{ID: 1, Tokens: []int32{0}, Pos: 2, Blocks: []int32{0}, Sample: true, History: []int32{1, 2, 0},
		Sampling: other.Sampling, NumGenerated: 1, Feed: 1}
	fedPoisoned := Sequence{ID: 9, Tokens: []int32{0}, Pos: 3, Blocks: []int32{3}, Sample: true, History: []int32{5, 6, 7, 0},
		Sampling: poisoned.Sampling, NumGenerated: 1, Feed: 2}
	if err := p.Launch(&Batch{Seqs: []Sequence{fedOther, fedPoisoned}}); err != nil {
		t.Fatal(err)
	}
	for step := range 2 {
		outs, err := p.Wait()
		if err != nil {
			t.Fatalf("launched step %d: %v", step, err)
		}
		if outs[0].Err != nil || outs[0].Token < 0 || !errors.Is(outs[1].Err, engine.ErrAllMasked) || outs[1].Token != -1 {
			t.Errorf("launched step %d: %+v", step, outs)
		}
	}
}

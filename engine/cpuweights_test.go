package engine

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"gollm/model"
)

// generation is what one run of generate produced.
type generation struct {
	// tokens are the sampled tokens, in order.
	tokens []int32
	// logits are the prompt's context logits, then each step's sampled-position logits.
	logits [][]float32
}

// generate runs a prompt and then decode steps on e, sampling with sp. It returns an
// error rather than failing the test, so that it can run on any goroutine.
func generate(e *CPU, prompt []int32, steps int, sp SamplingParams) (generation, error) {
	var g generation
	blocks := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	history := slices.Clone(prompt)
	seq := Sequence{ID: 1, Tokens: prompt, Blocks: blocks, Sample: true, Sampling: sp,
		History: history, ContextLogits: true, ReturnLogits: true}
	for i := 0; i <= steps; i++ {
		outs, err := e.Step(&Batch{Seqs: []Sequence{seq}})
		if err != nil {
			return g, fmt.Errorf("step %d: %w", i, err)
		}
		o := outs[0]
		if i == 0 {
			g.logits = append(g.logits, o.ContextLogits)
		}
		g.tokens = append(g.tokens, o.Token)
		g.logits = append(g.logits, o.Logits)
		history = append(history, o.Token)
		seq = Sequence{ID: 1, Tokens: []int32{o.Token}, Pos: len(history) - 1, Blocks: blocks, Sample: true,
			Sampling: sp, History: history, NumGenerated: i + 1, ReturnLogits: true}
	}
	return g, nil
}

func TestEnginesOnSharedWeightsStepConcurrently(t *testing.T) {
	m := smallGPT2(1)
	rng := rand.New(rand.NewPCG(4, 4))
	prompts := [][]int32{randomTokens(rng, 11, m.Config.VocabSize), randomTokens(rng, 5, m.Config.VocabSize)}
	params := []SamplingParams{{Temperature: 0.8, TopK: 30, Seed: 5}, {Temperature: 1.2, TopP: 0.9, Seed: 6}}
	const steps = 12

	// Each prompt alone, on an engine with its own weights.
	want := make([]generation, len(prompts))
	for i := range prompts {
		g, err := generate(newCPU(t, m, 8, 4), prompts[i], steps, params[i])
		if err != nil {
			t.Fatal(err)
		}
		want[i] = g
	}

	w, err := NewCPUWeights(m)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]generation, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i := range prompts {
		e, err := NewCPUFrom(w, KVConfig{NumBlocks: 8, TokensPerBlock: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = generate(e, prompts[i], steps, params[i])
		}()
	}
	wg.Wait()
	for i := range prompts {
		if errs[i] != nil {
			t.Fatalf("prompt %d: %v", i, errs[i])
		}
		if !slices.Equal(got[i].tokens, want[i].tokens) {
			t.Errorf("prompt %d on shared weights sampled %v, alone %v", i, got[i].tokens, want[i].tokens)
		}
		for j := range want[i].logits {
			if !slices.Equal(got[i].logits[j], want[i].logits[j]) {
				t.Errorf("prompt %d: logits %d on shared weights differ from alone by %g", i, j, maxAbsDiff(got[i].logits[j], want[i].logits[j]))
			}
		}
	}
	// Steps only read the weights: the transposed copies still equal fresh ones (and
	// -race reports any write racing the other engine's reads).
	fresh, err := NewCPUWeights(m)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(w, fresh) {
		t.Error("stepping engines changed their shared weights")
	}
}

func TestNewCPUWeightsNamesAMisshapenTensor(t *testing.T) {
	for _, tc := range []struct {
		mutate func(m *model.GPT2)
		want   string
	}{
		{func(m *model.GPT2) { m.Layers[0].AttnW = m.Layers[0].AttnW[:100] }, "tensor h.0.attn.c_attn.weight has 100 values, want 12288"},
		{func(m *model.GPT2) { m.Layers[1].MLPProjW = append(m.Layers[1].MLPProjW, 0) }, "tensor h.1.mlp.c_proj.weight has 16385 values, want 16384"},
		{func(m *model.GPT2) { m.LNFB = nil }, "tensor ln_f.bias has 0 values, want 64"},
	} {
		m := smallGPT2(1)
		tc.mutate(m)
		w, err := NewCPUWeights(m)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewCPUWeights = %p, %v; want an error with %q", w, err, tc.want)
		}
	}
	if _, err := NewCPUWeights(nil); err == nil {
		t.Error("NewCPUWeights(nil) succeeded")
	}
	if _, err := NewCPUFrom(nil, KVConfig{NumBlocks: 1, TokensPerBlock: 1}); err == nil {
		t.Error("NewCPUFrom(nil) succeeded")
	}
}

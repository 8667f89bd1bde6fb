package cpu

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"gollm/engine/enginetest"
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
func generate(e *Engine, prompt []int32, steps int, sp SamplingParams) (generation, error) {
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

	snapshot := enginetest.Random(m.Config, 1) // the same seed: equal to m
	if !reflect.DeepEqual(snapshot, m) {
		t.Fatal("the snapshot differs from the model")
	}
	w, err := NewWeights(m)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]generation, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i := range prompts {
		e, err := New(w, KVConfig{NumBlocks: 8, TokensPerBlock: 4})
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
	// Steps only read the weights, which are the model's own slices (and -race reports
	// any write racing the other engine's reads).
	if !reflect.DeepEqual(snapshot, m) {
		t.Error("stepping engines changed their shared weights")
	}
}

func TestNewWeightsNamesAMisshapenRole(t *testing.T) {
	for _, tc := range []struct {
		mutate func(m *model.Float32)
		want   string
	}{
		{func(m *model.Float32) { m.Layers[0][model.RoleQKV] = m.Layers[0][model.RoleQKV][:100] }, "layer 0 qkv has 100 values, want 192×64"},
		{func(m *model.Float32) { m.Layers[1][model.RoleDown] = append(m.Layers[1][model.RoleDown], 0) }, "layer 1 down has 16385 values, want 64×256"},
		{func(m *model.Float32) { m.Model[model.RoleFinalNormBias] = nil }, "final_norm_bias has 0 values, want 64×1"},
	} {
		m := smallGPT2(1)
		tc.mutate(m)
		w, err := NewWeights(m)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewWeights = %p, %v; want an error with %q", w, err, tc.want)
		}
	}
	if _, err := NewWeights(nil); err == nil {
		t.Error("NewWeights(nil) succeeded")
	}
	if _, err := New(nil, KVConfig{NumBlocks: 1, TokensPerBlock: 1}); err == nil {
		t.Error("New(nil) succeeded")
	}
}

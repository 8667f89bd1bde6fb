package executor

import (
	"math"
	"path/filepath"
	"slices"
	"testing"

	"gollm/batchmanager"
	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/engine/enginetest"
	"gollm/model"
)

// TestBeamSearchMatchesTransformers runs the batch manager's beam search on the CPU engine
// for every case transformers answered in float32 — four LLaMA-family checkpoints and
// GPT-2; no end token, an end token that finishes hypotheses early under transformers'
// early-stopping heuristic with length penalty 1, and early stopping with length
// penalty 0.5 — and wants the same beams in the same order, each with transformers' score.
func TestBeamSearchMatchesTransformers(t *testing.T) {
	cases, err := enginetest.LoadBeamGolden("../testdata/beam-golden.json")
	if err != nil {
		t.Fatal(err)
	}
	models := map[string]*model.Float32{}
	for _, c := range cases {
		t.Run(c.Name(), func(t *testing.T) {
			m := models[c.Model]
			if m == nil {
				if m, err = model.LoadFloat32(filepath.Join("..", "testdata", c.Model)); err != nil {
					t.Fatal(err)
				}
				models[c.Model] = m
			}
			eng, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: 64, TokensPerBlock: 8})
			if err != nil {
				t.Fatal(err)
			}
			ex, err := New(eng, Config{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ex.Shutdown()
				_ = eng.Close()
			})
			end := c.EndID
			id, err := ex.Enqueue(Request{InputIDs: c.Prompt, MaxNewTokens: c.MaxNewTokens, EndID: &end,
				BeamWidth: c.Beams, LengthPenalty: c.LengthPenalty, EarlyStopping: &c.EarlyStopping,
				Output: OutputConfig{ExcludeInputFromOutput: true}})
			if err != nil {
				t.Fatal(err)
			}
			rs := collect(t, ex, id)
			last := rs[len(rs)-1]
			if last.Err != nil {
				t.Fatal(last.Err)
			}
			beams := last.Result.Beams
			if len(beams) != len(c.Sequences) {
				t.Fatalf("%d beams, transformers returned %d", len(beams), len(c.Sequences))
			}
			for i, want := range c.Sequences {
				b := beams[i]
				got := b.Tokens
				if b.Finish == batchmanager.FinishedEndID {
					got = append(slices.Clone(got), c.EndID) // transformers keeps the end token
				}
				if !slices.Equal(got, want.Tokens) {
					t.Errorf("beam %d: tokens %v (score %.5f, %v), transformers %v (score %.5f)", i, got, b.Score, b.Finish, want.Tokens, want.Score)
					continue
				}
				if d := math.Abs(float64(b.Score) - want.Score); d > 1e-4 {
					t.Errorf("beam %d %v: score %.6f, transformers %.6f", i, got, b.Score, want.Score)
				}
			}
		})
	}
}

package cpu

import (
	"slices"
	"testing"

	"gollm/model"
)

// TestEachDenseStageCounts: each stage and stage value Qwen3, Gemma 2 and 3 and Phi-3's
// longrope add moves the fixtures' logits well past the golden tolerance when it is left
// out of the recipe (or set to what a LLaMA layer would have), so the golden tests
// (TestLogitsAndGreedyTokensMatchTransformers) check every one of them, stage by stage.
func TestEachDenseStageCounts(t *testing.T) {
	drop := func(kind model.StageKind) func(r model.Recipe) model.Recipe {
		return func(r model.Recipe) model.Recipe {
			return slices.DeleteFunc(r, func(s model.Stage) bool { return s.Kind == kind })
		}
	}
	edit := func(kind model.StageKind, f func(s *model.Stage)) func(r model.Recipe) model.Recipe {
		return func(r model.Recipe) model.Recipe {
			for i := range r {
				if r[i].Kind == kind {
					f(&r[i])
				}
			}
			return r
		}
	}
	for _, tc := range []struct {
		fixture, what string
		ablate        func(r model.Recipe) model.Recipe
	}{
		{"qwen3-tiny", "the q/k norms", drop(model.StageQKNorm)},
		{"gemma3-tiny", "the q/k norms", drop(model.StageQKNorm)},
		{"gemma2-tiny", "the post-norms", drop(model.StagePostNorm)},
		{"gemma2-tiny", "the embedding scale", edit(model.StageEmbed, func(s *model.Stage) { s.Scale = 0 })},
		{"gemma2-tiny", "the attention soft-cap", edit(model.StageAttention, func(s *model.Stage) { s.SoftCap = 0 })},
		{"gemma2-tiny", "the final soft-cap", edit(model.StageLMHead, func(s *model.Stage) { s.SoftCap = 0 })},
		{"gemma2-tiny", "query_pre_attn_scalar", edit(model.StageAttention, func(s *model.Stage) { s.Scale = model.AttentionScale(16) })},
		{"gemma2-tiny", "the sliding windows", edit(model.StageAttention, func(s *model.Stage) { s.Window = 0 })},
		{"gemma3-tiny", "the local rope", edit(model.StageRotary, func(s *model.Stage) {
			if s.Layer < 2 {
				s.Rope = model.Rope{Theta: 1e6, Dim: 16, Kind: model.RopeLinear, Factor: 2}
			}
		})},
		{"phi3-longrope-tiny", "the long factors", edit(model.StageRotary, func(s *model.Stage) { s.Rope.OriginalMaxPositions = 1 << 20 })},
		{"phi4mini-tiny", "the attention factor", edit(model.StageRotary, func(s *model.Stage) {
			l := *s.Rope.LongRope
			l.AttnFactor = 1
			s.Rope.LongRope = &l
		})},
	} {
		t.Run(tc.fixture+" without "+tc.what, func(t *testing.T) {
			g := loadGolden(t, "../../testdata/"+tc.fixture+"-golden.safetensors")
			m := loadModel(t, "../../testdata/"+tc.fixture)
			v := m.Config.VocabSize
			e := newCPU(t, m, 4, 16)
			e.recipe = tc.ablate(slices.Clone(e.recipe))
			e.freqs, e.longFreqs = ropeFreqs(e.recipe), longRopeFreqs(e.recipe)
			out := mustStep(t, e, Sequence{ID: 1, Tokens: g.promptIDs, Blocks: []int32{0, 1}, ContextLogits: true})[0]
			worst := 0.0
			for i := range g.promptIDs {
				worst = max(worst, relL2(out.ContextLogits[i*v:(i+1)*v], g.promptLogits[i*v:(i+1)*v]))
			}
			if worst < 100*goldenTolerance {
				t.Errorf("relative L2 error %.3g without %s: the fixture does not tell it from its absence", worst, tc.what)
			}
		})
	}
}

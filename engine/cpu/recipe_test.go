package cpu

import (
	"strings"
	"testing"

	"gollm/model"
)

// TestStepRunsTheRecipesRotary: phi3-tiny's recipe rotates 8 of each head's 16
// dimensions, and the engine's logits match transformers' (TestLogitsAndGreedyTokens…);
// the same engine with its rotary stages widened to the whole head parts from them — the
// partial rotary is the recipe's value, walked stage by stage, not a property of the
// checkpoint the engine reads elsewhere.
func TestStepRunsTheRecipesRotary(t *testing.T) {
	g := loadGolden(t, "../../testdata/phi3-tiny-golden.safetensors")
	m := loadModel(t, "../../testdata/phi3-tiny")
	v, D := m.Config.VocabSize, m.Config.HeadDim
	prompt := func(e *Engine) float64 {
		out := mustStep(t, e, Sequence{ID: 1, Tokens: g.promptIDs, Blocks: []int32{0, 1}, ContextLogits: true})[0]
		worst := 0.0
		for i := range g.promptIDs {
			worst = max(worst, relL2(out.ContextLogits[i*v:(i+1)*v], g.promptLogits[i*v:(i+1)*v]))
		}
		return worst
	}
	e := newCPU(t, m, 4, 16)
	rotary := 0
	for _, s := range e.recipe {
		if s.Kind == model.StageRotary {
			rotary++
			if s.Rope.Dim != D/2 {
				t.Fatalf("layer %d rotates %d of %d dimensions, want %d", s.Layer, s.Rope.Dim, D, D/2)
			}
		}
	}
	if rotary != m.Config.Layers {
		t.Fatalf("%d rotary stages for %d layers", rotary, m.Config.Layers)
	}
	if err := prompt(e); err > goldenTolerance {
		t.Fatalf("the recipe as derived: relative L2 error %.3g > %g", err, goldenTolerance)
	}
	whole := newCPU(t, m, 4, 16)
	for i := range whole.recipe {
		if whole.recipe[i].Kind == model.StageRotary {
			whole.recipe[i].Rope.Dim = D
		}
	}
	whole.freqs = ropeFreqs(whole.recipe)
	if err := prompt(whole); err < 1e-2 {
		t.Fatalf("rotating the whole head: relative L2 error %.3g, want the logits to part from transformers'", err)
	}
}

// TestCheckRecipeRefusesWhatIsNotImplemented: a stage value the engine does not compute
// fails engine creation naming the layer, rather than being run as something else.
func TestCheckRecipeRefusesWhatIsNotImplemented(t *testing.T) {
	m := loadModel(t, "../../testdata/llama-tiny")
	cfg := m.Config
	for _, tc := range []struct {
		name string
		edit func(s *model.Stage)
		want string
	}{
		{"a negative attention soft-cap", func(s *model.Stage) {
			if s.Kind == model.StageAttention && s.Layer == 1 {
				s.SoftCap = -50
			}
		}, "layer 1: soft-cap -50 must be positive"},
		{"a post-norm the weights lack", func(s *model.Stage) {
			if s.Kind == model.StageResidual && s.Layer == 0 {
				*s = model.Stage{Kind: model.StagePostNorm, Layer: 0, Weight: model.RolePostAttnNorm, Norm: model.RMSNorm, Eps: 1e-6}
			}
		}, "layer 0: a post_norm stage where the weights have no post_attn_norm"},
		{"an odd rotary width", func(s *model.Stage) {
			if s.Kind == model.StageRotary {
				s.Rope.Dim = 5
			}
		}, "layer 0: rotary dimensions 5"},
		{"an MLP kind the weights do not have", func(s *model.Stage) {
			if s.Kind == model.StageMLP {
				s.Gated = false
			}
		}, "layer 0: a gated MLP false"},
	} {
		r := cfg.Recipe()
		for i := range r {
			tc.edit(&r[i])
		}
		if err := checkRecipe(r, &cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if err := checkRecipe(cfg.Recipe(), &cfg); err != nil {
		t.Errorf("the derived recipe: %v", err)
	}
}

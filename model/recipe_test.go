package model

import (
	"encoding/json"
	"math"
	"slices"
	"testing"
)

// kinds lists a recipe's stage kinds in order.
func kinds(r Recipe) []StageKind {
	out := make([]StageKind, len(r))
	for i, s := range r {
		out[i] = s.Kind
	}
	return out
}

// TestRecipeOfEachFamily derives the recipe of every fixture's descriptor: the pre-norm
// layer in order (rotary only under rotary positions), the per-layer values (norm kind and
// epsilon, rotary dimensions and frequencies' settings, windows, the attention scale, the
// MLP kind) taken from the descriptor, and the model's own stages around the layers.
func TestRecipeOfEachFamily(t *testing.T) {
	layer := func(rotary bool) []StageKind {
		k := []StageKind{StageNorm, StageQKV}
		if rotary {
			k = append(k, StageRotary)
		}
		return append(k, StageKVWrite, StageAttention, StageOut, StageResidual, StageNorm, StageMLP, StageResidual)
	}
	for _, tc := range []struct {
		dir    string
		edit   func(map[string]any)
		rotary bool
	}{
		{dir: "../testdata/gpt2-tiny"},
		{dir: llamaTinyDir, rotary: true},
		{dir: "../testdata/mistral-tiny", rotary: true},
		{dir: "../testdata/qwen2-tiny", rotary: true, edit: func(m map[string]any) {
			m["use_sliding_window"], m["sliding_window"], m["max_window_layers"] = true, 8, 1
			m["layer_types"] = []string{"full_attention", "sliding_attention"}
		}},
		{dir: llamaTinyDir, rotary: true, edit: func(m map[string]any) {
			m["model_type"], m["partial_rotary_factor"], m["architectures"] = "phi3", 0.5, []string{"Phi3ForCausalLM"}
		}},
	} {
		m := fixtureConfig(t, tc.dir)
		if tc.edit != nil {
			tc.edit(m)
		}
		c := parsedConfig(t, m)
		t.Run(c.ModelType, func(t *testing.T) {
			r := c.Recipe()
			want := []StageKind{StageEmbed}
			for range c.Layers {
				want = append(want, layer(tc.rotary)...)
			}
			want = append(want, StageNorm, StageLMHead)
			if got := kinds(r); !slices.Equal(got, want) {
				t.Fatalf("stages %v, want %v", got, want)
			}
			if r[0].Layer != -1 || r[len(r)-1].Layer != -1 || r[len(r)-2].Layer != -1 || r[len(r)-2].Weight != RoleFinalNorm {
				t.Errorf("the model's own stages: %+v, %+v, %+v", r[0], r[len(r)-2], r[len(r)-1])
			}
			for l := range c.Layers {
				st := r.Layer(l)
				if len(st) != len(layer(tc.rotary)) {
					t.Fatalf("layer %d has %d stages", l, len(st))
				}
				norms := 0
				for _, s := range st {
					switch s.Kind {
					case StageNorm:
						want := []Role{RoleAttnNorm, RoleMLPNorm}[norms]
						norms++
						if s.Weight != want || s.Norm != c.Norm || s.Eps != c.NormEps {
							t.Errorf("layer %d norm %+v, want %s, %s, eps %g", l, s, want, c.Norm, c.NormEps)
						}
					case StageRotary:
						if s.Rope != c.Rope || s.Rope.Dim < 2 {
							t.Errorf("layer %d rotary %+v, want the descriptor's %+v", l, s.Rope, c.Rope)
						}
					case StageAttention:
						if s.Window != c.LayerWindow(l) || s.Scale != AttentionScale(c.HeadDim) || s.SoftCap != 0 {
							t.Errorf("layer %d attention: window %d scale %g softcap %g; want %d, %g, 0", l, s.Window, s.Scale,
								s.SoftCap, c.LayerWindow(l), AttentionScale(c.HeadDim))
						}
					case StageMLP:
						if s.Gated != c.GatedMLP || s.Act != c.Act {
							t.Errorf("layer %d MLP gated %v act %s, want %v %s", l, s.Gated, s.Act, c.GatedMLP, c.Act)
						}
					}
				}
			}
		})
	}
}

// TestRecipeCarriesPerLayerValues: a Qwen2 window from layer 1 on gives layer 0 full
// attention and layer 1 the window, and Phi-3's partial rotary factor rotates half of
// each head in every layer.
func TestRecipeCarriesPerLayerValues(t *testing.T) {
	m := fixtureConfig(t, "../testdata/qwen2-tiny")
	m["use_sliding_window"], m["sliding_window"], m["max_window_layers"] = true, 8, 1
	m["layer_types"] = []string{"full_attention", "sliding_attention"}
	qc := parsedConfig(t, m)
	r := qc.Recipe()
	var windows []int
	for _, s := range r {
		if s.Kind == StageAttention {
			windows = append(windows, s.Window)
		}
	}
	if !slices.Equal(windows, []int{0, 8}) {
		t.Errorf("attention windows %v, want [0 8]", windows)
	}
	m = fixtureConfig(t, llamaTinyDir)
	m["model_type"], m["partial_rotary_factor"] = "phi3", 0.5
	c := parsedConfig(t, m)
	for _, s := range c.Recipe() {
		if s.Kind == StageRotary && (s.Rope.Dim != c.HeadDim/2 || len(s.Rope.InvFreq()) != c.HeadDim/4) {
			t.Errorf("layer %d rotates %d of %d dimensions with %d frequencies; want half", s.Layer, s.Rope.Dim, c.HeadDim,
				len(s.Rope.InvFreq()))
		}
	}
}

// TestAttentionScale: the scale is 1/√d rounded as float32 arithmetic rounds it (sqrtf,
// then a float32 division), bit for bit.
func TestAttentionScale(t *testing.T) {
	for _, d := range []int{16, 32, 64, 80, 96, 128, 256} {
		want := float32(1) / float32(math.Sqrt(float64(d)))
		if got := AttentionScale(d); got != want || math.Abs(float64(got)-1/math.Sqrt(float64(d))) > 1e-7 {
			t.Errorf("AttentionScale(%d) = %g, want %g", d, got, want)
		}
	}
}

// parsedConfig parses a config.json map, failing the test on an error.
func parsedConfig(t *testing.T, m map[string]any) Config {
	t.Helper()
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	c, _, _, err := parseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

package model

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRecipeOfTheDenseFamilies derives the recipes of Qwen3's, Gemma 2's, Gemma 3's and
// the Phi fixtures' descriptors: the q/k norm between the QKV projection and the rotary,
// the post-norms before each residual add, and the per-layer values — Gemma 2's
// alternating windows and soft-caps, Gemma 3's local rope on its sliding layers, the
// embedding and query scales, longrope's rope on every rotary stage.
func TestRecipeOfTheDenseFamilies(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		layer   []StageKind
		check   func(t *testing.T, c *Config, r Recipe)
	}{
		{"qwen3-tiny", []StageKind{StageNorm, StageQKV, StageQKNorm, StageRotary, StageKVWrite, StageAttention, StageOut,
			StageResidual, StageNorm, StageMLP, StageResidual}, func(t *testing.T, c *Config, r Recipe) {
			for _, s := range r {
				if s.Kind == StageQKNorm && (s.Weight != RoleQNorm || s.Norm != RMSNorm || s.Eps != c.NormEps) {
					t.Errorf("layer %d q/k norm %+v", s.Layer, s)
				}
				if s.Kind == StageAttention && (s.Scale != AttentionScale(16) || s.SoftCap != 0 || s.Window != 0) {
					t.Errorf("layer %d attention %+v", s.Layer, s)
				}
			}
			if r[0].Scale != 0 || r[len(r)-1].SoftCap != 0 {
				t.Errorf("embedding %+v, LM head %+v: no scale or cap", r[0], r[len(r)-1])
			}
		}},
		{"gemma2-tiny", []StageKind{StageNorm, StageQKV, StageRotary, StageKVWrite, StageAttention, StageOut, StagePostNorm,
			StageResidual, StageNorm, StageMLP, StagePostNorm, StageResidual}, func(t *testing.T, c *Config, r Recipe) {
			var windows []int
			var posts []Role
			for _, s := range r {
				switch s.Kind {
				case StageAttention:
					windows = append(windows, s.Window)
					if s.Scale != float32(1/4.898979485566356) || s.SoftCap != 4 {
						t.Errorf("layer %d attention scale %g cap %g, want 24^-½ and 4", s.Layer, s.Scale, s.SoftCap)
					}
				case StagePostNorm:
					posts = append(posts, s.Weight)
				case StageMLP:
					if !s.Gated || s.Act != ActGeluTanh {
						t.Errorf("layer %d MLP %+v, want GeGLU with the tanh GELU", s.Layer, s)
					}
				}
			}
			if !slices.Equal(windows, []int{6, 0, 6}) {
				t.Errorf("windows %v, want [6 0 6]", windows)
			}
			if !slices.Equal(posts, []Role{RolePostAttnNorm, RolePostMLPNorm, RolePostAttnNorm, RolePostMLPNorm,
				RolePostAttnNorm, RolePostMLPNorm}) {
				t.Errorf("post-norms %v", posts)
			}
			if r[0].Scale != float32(5.656854249492381) || r[len(r)-1].SoftCap != 3 {
				t.Errorf("embedding scale %g, final soft-cap %g; want √32 and 3", r[0].Scale, r[len(r)-1].SoftCap)
			}
		}},
		{"gemma3-tiny", []StageKind{StageNorm, StageQKV, StageQKNorm, StageRotary, StageKVWrite, StageAttention, StageOut,
			StagePostNorm, StageResidual, StageNorm, StageMLP, StagePostNorm, StageResidual}, func(t *testing.T, c *Config, r Recipe) {
			local := Rope{Theta: 10000, Dim: 16, Factor: 1}
			global := Rope{Theta: 1e6, Dim: 16, Kind: RopeLinear, Factor: 2}
			var ropes []Rope
			var windows []int
			for _, s := range r {
				switch s.Kind {
				case StageRotary:
					ropes = append(ropes, s.Rope)
				case StageAttention:
					windows = append(windows, s.Window)
					if s.SoftCap != 0 {
						t.Errorf("layer %d soft-capped", s.Layer)
					}
				}
			}
			if !slices.Equal(ropes, []Rope{local, local, global}) || !slices.Equal(windows, []int{5, 5, 0}) {
				t.Errorf("ropes %+v windows %v; want local, local, global and [5 5 0]", ropes, windows)
			}
		}},
		{"phi4mini-tiny", []StageKind{StageNorm, StageQKV, StageRotary, StageKVWrite, StageAttention, StageOut,
			StageResidual, StageNorm, StageMLP, StageResidual}, func(t *testing.T, c *Config, r Recipe) {
			for _, s := range r {
				if s.Kind == StageRotary && (s.Rope.Kind != RopeLongRope || s.Rope.Dim != 12 || s.Rope.LongRope == nil ||
					s.Rope.UsesLong(64) || !s.Rope.UsesLong(65)) {
					t.Errorf("layer %d rotary %+v, want longrope over 12 dimensions, long past 64 positions", s.Layer, s.Rope)
				}
			}
		}},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			c, err := familyFixture(t, tc.fixture, nil)
			if err != nil {
				t.Fatal(err)
			}
			r := c.Recipe()
			want := []StageKind{StageEmbed}
			for range c.Layers {
				want = append(want, tc.layer...)
			}
			want = append(want, StageNorm, StageLMHead)
			if got := kinds(r); !slices.Equal(got, want) {
				t.Fatalf("stages %v\nwant %v", got, want)
			}
			tc.check(t, &c, r)
		})
	}
}

// TestGemmaNormsReadAsOnePlusW: every norm weight of the Gemma fixtures — input,
// pre-feedforward, both post-norms, the final norm, Gemma 3's q/k norms — reaches the
// engines as 1 + the stored vector in float32, the other roles as stored.
func TestGemmaNormsReadAsOnePlusW(t *testing.T) {
	for _, fixture := range []string{"gemma2-tiny", "gemma3-tiny"} {
		ck, err := Open(filepath.Join("../testdata", fixture))
		if err != nil {
			t.Fatal(err)
		}
		ws, err := ck.Weights()
		if err != nil {
			t.Fatal(err)
		}
		norms := 0
		for i := range ws {
			w := &ws[i]
			stored, err := ck.Tensor(strings.TrimSuffix(w.Parts[0].Tensor.Name, " + 1"))
			if err != nil {
				t.Fatal(err)
			}
			raw, err := stored.Float32()
			if err != nil {
				t.Fatal(err)
			}
			got, err := w.Float32()
			if err != nil {
				t.Fatal(err)
			}
			isNorm := w.Role.IsVector()
			for k, v := range raw {
				want := v
				if isNorm {
					want = 1 + v
				}
				if len(w.Parts) == 1 && got[k] != want {
					t.Fatalf("%s %s[%d] = %g, want %g", fixture, w, k, got[k], want)
				}
			}
			if isNorm {
				norms++
			}
		}
		c := &ck.Config
		want := 1 + c.Layers*4
		if c.QKNorm {
			want += 2 * c.Layers
		}
		if norms != want {
			t.Errorf("%s: %d norm weights, want %d", fixture, norms, want)
		}
		_ = ck.Close()
	}
}

// TestGemma3ImageTextCheckpoints: Gemma 3's image-text checkpoints (model_type gemma3)
// keep the language model's fields in text_config and its tensors under
// language_model.model. (transformers 4) or model.language_model. (transformers 5), beside
// a vision tower gollm leaves: both layouts load, with the text model's weights.
func TestGemma3ImageTextCheckpoints(t *testing.T) {
	src, err := Open("../testdata/gemma3-tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	text := fixtureConfig(t, "../testdata/gemma3-tiny")
	text["model_type"] = "gemma3_text"
	cfg := map[string]any{"model_type": "gemma3", "architectures": []string{"Gemma3ForConditionalGeneration"},
		"text_config": text, "vision_config": map[string]any{"model_type": "siglip_vision_model"},
		"eos_token_id": []int{1, 106}, "torch_dtype": "float32"}
	for _, prefix := range []string{"language_model.model.", "model.language_model."} {
		var tensors []*Tensor
		for _, name := range src.Names() {
			st, _ := src.Tensor(name)
			tensors = append(tensors, &Tensor{Name: prefix + strings.TrimPrefix(name, "model."), DType: st.DType,
				Shape: st.Shape, Data: st.Data})
		}
		// The vision tower's layers must not count as the text model's.
		vision := strings.Replace(prefix, "language_model", "vision_tower", 1) + "encoder.layers.7.mlp.fc1.weight"
		tensors = append(tensors, &Tensor{Name: vision, DType: "F32", Shape: []int{2, 2}, Data: make([]byte, 16)})
		dir := writeCheckpoint(t, cfg, tensors)
		ck, err := Open(dir)
		if err != nil {
			t.Fatalf("%s: %v", prefix, err)
		}
		ws, err := ck.Weights()
		if err != nil {
			t.Fatalf("%s: %v", prefix, err)
		}
		want, _ := src.Weights()
		if len(ws) != len(want) || ck.Config.Family != "gemma3" || !ck.Config.QKNorm || !ck.Config.SlidingLayers[0] {
			t.Errorf("%s: %d weights (want %d), config %+v", prefix, len(ws), len(want), ck.Config)
		}
		for i := range ws {
			a, _ := ws[i].Float32()
			b, _ := want[i].Float32()
			if !slices.Equal(a, b) {
				t.Errorf("%s: %s differs from the text checkpoint's", prefix, &ws[i])
			}
		}
		_ = ck.Close()
	}
}

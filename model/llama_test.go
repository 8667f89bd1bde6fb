package model

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
)

const llamaTinyDir = "../testdata/llama-tiny"

// llamaConfig is llama-tiny's config.json with edit applied, parsed.
func llamaConfig(t *testing.T, edit func(map[string]any)) (Config, error) {
	t.Helper()
	m := fixtureConfig(t, llamaTinyDir)
	if edit != nil {
		edit(m)
	}
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	c, _, _, err := parseConfig(raw)
	return c, err
}

// withRope replaces the rope settings by rope_theta and old-style rope_scaling (nil:
// none), as transformers 4 wrote them.
func withRope(theta float64, scaling map[string]any) func(map[string]any) {
	return func(m map[string]any) {
		delete(m, "rope_parameters")
		m["rope_theta"] = theta
		if scaling != nil {
			m["rope_scaling"] = scaling
		}
	}
}

// withRopeParameters replaces the rope settings by transformers 5's rope_parameters.
func withRopeParameters(params map[string]any) func(map[string]any) {
	return func(m map[string]any) { m["rope_parameters"] = params }
}

// withRopeAnd applies edit (nil: none), then sets field to v.
func withRopeAnd(edit func(map[string]any), field string, v any) func(map[string]any) {
	return func(m map[string]any) {
		if edit != nil {
			edit(m)
		}
		m[field] = v
	}
}

func TestRopeInvFreq(t *testing.T) {
	const theta, dim = 10000.0, 16
	base := Rope{Theta: theta, Dim: dim, Factor: 1}.InvFreq()
	if len(base) != dim/2 {
		t.Fatalf("%d frequencies for %d rotated dimensions, want %d", len(base), dim, dim/2)
	}
	t.Run("default: theta^(-2i/d)", func(t *testing.T) {
		for i, f := range base {
			want := math.Pow(theta, -float64(2*i)/dim)
			if math.Abs(float64(f)-want) > 1e-6*want {
				t.Errorf("inv_freq[%d] = %g, want %g", i, f, want)
			}
		}
	})
	t.Run("linear: every frequency divided by factor", func(t *testing.T) {
		for _, factor := range []float64{1, 2, 4, 8.5} {
			lin := Rope{Theta: theta, Dim: dim, Kind: RopeLinear, Factor: factor}.InvFreq()
			for i := range lin {
				// Exactly transformers' float32 inv_freq / factor, and within float32
				// rounding of the definition.
				if want := float32(float64(base[i]) / factor); lin[i] != want {
					t.Errorf("factor %g: inv_freq[%d] = %g, want default %g / factor = %g", factor, i, lin[i], base[i], want)
				}
				if def := math.Pow(theta, -float64(2*i)/dim) / factor; math.Abs(float64(lin[i])-def) > 1e-6*def {
					t.Errorf("factor %g: inv_freq[%d] = %g, want theta^(-2i/d)/factor = %g", factor, i, lin[i], def)
				}
			}
		}
	})
	t.Run("llama3: short wavelengths kept, long ones divided by factor", func(t *testing.T) {
		// Wavelengths 2π/inv_freq run from 2π to about 6e4 here; with an original context
		// of 64 and the band [64/4, 64/1], the first pair is kept and the last divided.
		r := Rope{Theta: theta, Dim: dim, Kind: RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}
		got := r.InvFreq()
		last := len(got) - 1
		if got[0] != base[0] {
			t.Errorf("inv_freq[0] = %g, want it kept at %g", got[0], base[0])
		}
		if want := float32(float64(base[last]) / 8); got[last] != want {
			t.Errorf("inv_freq[%d] = %g, want %g / 8 = %g", last, got[last], base[last], want)
		}
		for i := range got {
			if lo, hi := float64(base[i])/8, float64(base[i]); float64(got[i]) < lo*(1-1e-6) || float64(got[i]) > hi*(1+1e-6) {
				t.Errorf("inv_freq[%d] = %g outside [%g, %g]", i, got[i], lo, hi)
			}
		}
	})
}

func TestLlamaRopeConfigs(t *testing.T) {
	plain, err := llamaConfig(t, withRope(10000, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(map[string]any)
		want Rope
	}{
		{"no scaling", withRope(500000, nil), Rope{Theta: 500000, Dim: 16, Factor: 1}},
		{"linear in transformers 4's rope_scaling (type)", withRope(10000, map[string]any{"type": "linear", "factor": 4.0}),
			Rope{Theta: 10000, Dim: 16, Kind: RopeLinear, Factor: 4}},
		{"linear in rope_scaling (rope_type)", withRope(10000, map[string]any{"rope_type": "linear", "factor": 2.0}),
			Rope{Theta: 10000, Dim: 16, Kind: RopeLinear, Factor: 2}},
		{"linear in transformers 5's rope_parameters", withRopeParameters(map[string]any{"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}),
			Rope{Theta: 1e6, Dim: 16, Kind: RopeLinear, Factor: 2}},
		// Dynamic NTK changes the base only past max_position_embeddings, which gollm
		// never serves: it is the unscaled rotary embedding.
		{"dynamic in rope_scaling is the identity", withRope(10000, map[string]any{"type": "dynamic", "factor": 4.0}),
			Rope{Theta: 10000, Dim: 16, Factor: 1}},
		{"dynamic in rope_parameters is the identity", withRopeParameters(map[string]any{"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
			Rope{Theta: 10000, Dim: 16, Factor: 1}},
		// Phi-3's partial rotary factor: int(head_dim · factor) dimensions rotate, the
		// factor read beside the rope settings (transformers 4) or inside rope_parameters
		// (transformers 5).
		{"a partial rotary factor beside rope_theta", withRopeAnd(withRope(10000, nil), "partial_rotary_factor", 0.5),
			Rope{Theta: 10000, Dim: 8, Factor: 1}},
		{"a partial rotary factor inside rope_parameters", withRopeParameters(map[string]any{"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
			Rope{Theta: 10000, Dim: 4, Factor: 1}},
		{"a partial rotary factor that truncates, as transformers' int()", withRopeAnd(nil, "partial_rotary_factor", 0.4),
			Rope{Theta: 10000, Dim: 6, Factor: 1}},
		{"a partial rotary factor of 1", withRopeAnd(nil, "partial_rotary_factor", 1.0),
			Rope{Theta: 10000, Dim: 16, Factor: 1}},
		{"llama3 with its defaults", withRopeParameters(map[string]any{"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}),
			Rope{Theta: 500000, Dim: 16, Kind: RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := llamaConfig(t, tc.edit)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Rope, tc.want) {
				t.Errorf("rope %+v, want %+v", c.Rope, tc.want)
			}
		})
	}
	t.Run("dynamic gives the frequencies of no scaling", func(t *testing.T) {
		c, err := llamaConfig(t, withRope(10000, map[string]any{"type": "dynamic", "factor": 4.0}))
		if err != nil {
			t.Fatal(err)
		}
		got, want := c.Rope.InvFreq(), plain.Rope.InvFreq()
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("inv_freq[%d] = %g, unscaled %g", i, got[i], want[i])
			}
		}
	})
}

// TestUnsupportedLlamaOptionsFail loads llama-tiny (and a Qwen2 and a Mistral copy of it)
// with each option gollm does not implement, or a value out of range: the load fails
// naming the field.
func TestUnsupportedLlamaOptionsFail(t *testing.T) {
	set := func(field string, v any) func(map[string]any) {
		return func(m map[string]any) {
			if v == nil {
				delete(m, field)
			} else {
				m[field] = v
			}
		}
	}
	both := func(fs ...func(map[string]any)) func(map[string]any) {
		return func(m map[string]any) {
			for _, f := range fs {
				f(m)
			}
		}
	}
	for _, tc := range []struct {
		name string
		edit func(map[string]any)
		want []string
	}{
		{"yarn scaling in rope_parameters", withRopeParameters(map[string]any{"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}),
			[]string{"config.json", "field rope_parameters", `rope type "yarn" is not supported`, "linear, dynamic, llama3"}},
		{"longrope scaling in rope_scaling", withRope(10000, map[string]any{"type": "longrope", "long_factor": []float64{1}, "short_factor": []float64{1}}),
			[]string{"field rope_scaling", `rope type "longrope" is not supported`}},
		{"su scaling (Phi-3's old longrope name)", withRope(10000, map[string]any{"type": "su"}),
			[]string{"field rope_scaling", `rope type "su" is not supported`}},
		{"a partial rotary factor above 1", set("partial_rotary_factor", 1.5),
			[]string{"field partial_rotary_factor", "1.5 rotates 24 of head_dim 16", "(0, 1]"}},
		{"a partial rotary factor that rotates an odd number", withRopeParameters(map[string]any{"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.3125}),
			[]string{"field rope_parameters.partial_rotary_factor", "rotates 5 of head_dim 16", "even"}},
		{"a partial rotary factor of zero", set("partial_rotary_factor", 0.0),
			[]string{"field partial_rotary_factor", "rotates 0"}},
		{"a partial rotary factor that is not a number", set("partial_rotary_factor", "half"),
			[]string{"field partial_rotary_factor", "must be a number"}},
		{"linear scaling without a factor", withRopeParameters(map[string]any{"rope_type": "linear", "rope_theta": 10000.0}),
			[]string{"field rope_parameters.factor", "must be at least 1"}},
		{"linear scaling by less than 1", withRope(10000, map[string]any{"type": "linear", "factor": 0.5}),
			[]string{"field rope_scaling.factor", "0.5 must be at least 1"}},
		{"a factor that is not a number", withRope(10000, map[string]any{"type": "linear", "factor": "2"}),
			[]string{"field rope_scaling", "field factor", "must be a number"}},
		{"llama3 with high_freq_factor not above low_freq_factor", withRopeParameters(map[string]any{"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}),
			[]string{"field rope_parameters", "high_freq_factor", "must exceed low_freq_factor"}},
		{"a rope theta of zero", withRopeParameters(map[string]any{"rope_type": "default", "rope_theta": 0.0}),
			[]string{"field rope_parameters.rope_theta", "must be positive"}},
		{"a negative rope_theta beside rope_scaling", withRope(-1, nil),
			[]string{"field rope_theta", "must be positive"}},
		{"rope_parameters that is not an object", set("rope_parameters", "default"),
			[]string{"field rope_parameters", "must be an object"}},
		{"an unsupported activation", set("hidden_act", "relu2"),
			[]string{"field hidden_act", `"relu2" is not supported`}},
		{"heads that do not divide the width without head_dim", both(set("head_dim", nil), set("num_attention_heads", 5), set("num_key_value_heads", 5)),
			[]string{"field hidden_size", "not a multiple of num_attention_heads 5"}},
		{"KV heads that do not divide the heads", set("num_key_value_heads", 3),
			[]string{"field num_key_value_heads", "3 does not divide num_attention_heads 4"}},
		{"a missing intermediate_size", set("intermediate_size", nil),
			[]string{"field intermediate_size", "missing"}},
		{"a negative Mistral sliding window", both(set("model_type", "mistral"), set("sliding_window", -1)),
			[]string{"field sliding_window", "non-negative integer"}},
		{"Qwen2 layer_types of the wrong length", both(set("model_type", "qwen2"), set("use_sliding_window", true), set("sliding_window", 8),
			set("layer_types", []string{"sliding_attention"})),
			[]string{"field layer_types", "1 entries", "num_hidden_layers 2"}},
		{"Qwen2 sliding layers before full ones", both(set("model_type", "qwen2"), set("use_sliding_window", true), set("sliding_window", 8),
			set("layer_types", []string{"sliding_attention", "full_attention"})),
			[]string{"field layer_types", "full_attention after sliding_attention"}},
		{"Qwen2 with an unknown layer type", both(set("model_type", "qwen2"), set("use_sliding_window", true), set("sliding_window", 8),
			set("layer_types", []string{"full_attention", "chunked_attention"})),
			[]string{"field layer_types", `"chunked_attention"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fixtureConfig(t, llamaTinyDir)
			tc.edit(cfg)
			_, err := LoadFloat32(writeCheckpoint(t, cfg, fixtureTensors(t, llamaTinyDir)))
			if err == nil {
				t.Fatal("loaded without error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestQwen2SlidingWindowLayers reads Qwen2's window as transformers does: only with
// use_sliding_window, in the layers from max_window_layers on or those layer_types marks
// sliding_attention, and none when sliding_window is null.
func TestQwen2SlidingWindowLayers(t *testing.T) {
	qwen := func(fields map[string]any) func(map[string]any) {
		return func(m map[string]any) {
			m["model_type"] = "qwen2"
			for k, v := range fields {
				m[k] = v
			}
		}
	}
	for _, tc := range []struct {
		name       string
		fields     map[string]any
		window     int
		fromLayer  int
		windowedL1 bool
	}{
		{"off by default", map[string]any{"sliding_window": 8}, 0, 0, false},
		{"off without use_sliding_window, whatever layer_types says", map[string]any{"sliding_window": 8,
			"layer_types": []string{"sliding_attention", "sliding_attention"}}, 0, 0, false},
		{"on from max_window_layers", map[string]any{"use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1}, 8, 1, true},
		{"on past every layer with the default max_window_layers", map[string]any{"use_sliding_window": true, "sliding_window": 8}, 8, 28, false},
		{"layer_types decide over max_window_layers", map[string]any{"use_sliding_window": true, "sliding_window": 8, "max_window_layers": 0,
			"layer_types": []string{"full_attention", "sliding_attention"}}, 8, 1, true},
		{"layer_types of full attention only", map[string]any{"use_sliding_window": true, "sliding_window": 8, "max_window_layers": 0,
			"layer_types": []string{"full_attention", "full_attention"}}, 8, 2, false},
		// A context longer than Qwen2Config's default window of 4096, which must not stand
		// in for the null.
		{"a null window is none", map[string]any{"use_sliding_window": true, "sliding_window": nil, "max_window_layers": 0,
			"max_position_embeddings": 8192}, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := llamaConfig(t, qwen(tc.fields))
			if err != nil {
				t.Fatal(err)
			}
			if c.SlidingWindow != tc.window || (tc.window > 0 && c.WindowFromLayer != tc.fromLayer) {
				t.Errorf("window %d from layer %d, want %d from %d", c.SlidingWindow, c.WindowFromLayer, tc.window, tc.fromLayer)
			}
			if c.LayerWindow(0) != 0 || (c.LayerWindow(1) > 0) != tc.windowedL1 {
				t.Errorf("layer windows %d, %d; want layer 1 windowed: %v", c.LayerWindow(0), c.LayerWindow(1), tc.windowedL1)
			}
		})
	}
}

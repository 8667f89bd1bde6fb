package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// familyFixture parses testdata/<name>/config.json (edited by edit when not nil).
func familyFixture(t *testing.T, name string, edit func(map[string]any)) (Config, error) {
	t.Helper()
	m := fixtureConfig(t, filepath.Join("../testdata", name))
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

// roleTensors looks up the tensors a role names in st (with or without one of the
// family's base prefixes) and checks that they join into the role's canonical shape:
// rows summed over the parts, the same columns each. It returns the stored names found.
func roleTensors(st *stFile, f *family, parts []partName, rows, cols int, what string) ([]string, error) {
	var found []string
	sum := 0
	for _, p := range parts {
		name := p.name
		t, ok := st.tensors[name]
		for _, prefix := range f.prefixes() {
			if !ok {
				name = prefix + p.name
				t, ok = st.tensors[name]
			}
		}
		if !ok {
			return nil, fmt.Errorf("%s: tensor %s is missing", what, p.name)
		}
		r, c := 0, 1
		switch len(t.Shape) {
		case 1:
			r = t.Shape[0]
		case 2:
			r, c = t.Shape[0], t.Shape[1]
		default:
			return nil, fmt.Errorf("%s: tensor %s has shape %v", what, name, t.Shape)
		}
		if c != cols {
			return nil, fmt.Errorf("%s: tensor %s has %d columns, want %d", what, name, c, cols)
		}
		sum += r
		found = append(found, name)
	}
	if sum != rows {
		return nil, fmt.Errorf("%s: the parts %v join into %d rows, want %d", what, found, sum, rows)
	}
	return found, nil
}

// checkRoles maps every role of every layer onto the fixture's tensors: each role the
// descriptor says the layer has is there in its canonical shape, no role names a tensor
// the descriptor says is absent, and every stored tensor is some role's, exactly once.
func checkRoles(t *testing.T, dir string, c *Config, f *family) {
	t.Helper()
	st, err := openSafetensors(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	claimed := map[string]string{}
	claim := func(names []string, what string) {
		for _, n := range names {
			if prev, dup := claimed[n]; dup {
				t.Errorf("tensor %s is both %s and %s", n, prev, what)
			}
			claimed[n] = what
		}
	}
	for r := Role(0); r < NumRoles; r++ {
		layers := []int{-1}
		if r.PerLayer() {
			layers = make([]int, c.Layers)
			for l := range layers {
				layers[l] = l
			}
		}
		for _, l := range layers {
			what := fmt.Sprintf("%s of layer %d", r, l)
			rows, cols, present := c.Shape(r)
			if l >= 0 {
				rows, cols, present = c.LayerShape(r, l)
			}
			parts := f.names(c, r, l)
			if !present {
				if _, err := roleTensors(st, f, parts, 0, 0, what); len(parts) > 0 && err == nil {
					t.Errorf("%s is absent from the descriptor, but the checkpoint holds %v", what, parts)
				}
				continue
			}
			names, err := roleTensors(st, f, parts, rows, cols, what)
			if err != nil || len(parts) == 0 {
				t.Errorf("%s [%d][%d]: %v (names %v)", what, rows, cols, err, parts)
				continue
			}
			claim(names, what)
		}
	}
	var unclaimed []string
	for n := range st.tensors {
		if _, ok := claimed[n]; !ok {
			unclaimed = append(unclaimed, n)
		}
	}
	slices.Sort(unclaimed)
	if len(unclaimed) > 0 {
		t.Errorf("tensors no role names: %v", unclaimed)
	}
}

// familyFixtures are the fixtures of testdata/make_family_fixtures.py with what their
// config.json must read as.
var familyFixtures = []struct {
	name, family string
	cfg          Config
}{
	{"qwen3-tiny", "qwen3",
		Config{VocabSize: 256, MaxPositions: 128, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Inner: 64,
			Rope: Rope{Theta: 1e6, Dim: 16, Factor: 1}, Act: ActSiLU, TiedHead: true, BOSID: 1, EOSIDs: []int32{2},
			QKNorm: true}},
	{"gemma2-tiny", "gemma2",
		Config{VocabSize: 256, MaxPositions: 128, Hidden: 32, Layers: 3, Heads: 2, KVHeads: 1, HeadDim: 16, Inner: 64,
			Rope: Rope{Theta: 10000, Dim: 16, Factor: 1}, Act: ActGeluTanh, TiedHead: true, BOSID: 2, EOSIDs: []int32{1, 107},
			PostNorms: true, EmbedScale: math.Sqrt(32), QueryScale: 1 / math.Sqrt(24), AttnSoftcap: 4, FinalSoftcap: 3,
			SlidingLayers: []bool{true, false, true}, SlidingWindow: 6}},
	{"gemma3-tiny", "gemma3",
		Config{VocabSize: 256, MaxPositions: 128, Hidden: 32, Layers: 3, Heads: 2, KVHeads: 1, HeadDim: 16, Inner: 64,
			Rope: Rope{Theta: 1e6, Dim: 16, Kind: RopeLinear, Factor: 2}, Act: ActGeluTanh, TiedHead: true, BOSID: 2,
			EOSIDs: []int32{1, 106}, QKNorm: true, PostNorms: true, EmbedScale: math.Sqrt(32), QueryScale: 1 / math.Sqrt(20),
			SlidingLayers: []bool{true, true, false}, SlidingWindow: 5, LocalRope: Rope{Theta: 10000, Dim: 16, Factor: 1}}},
	{"phi3-longrope-tiny", "phi3",
		Config{VocabSize: 256, MaxPositions: 128, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, Inner: 64,
			Rope: Rope{Theta: 10000, Dim: 8, Factor: 1, Kind: RopeLongRope, OriginalMaxPositions: 8,
				LongRope: &LongRope{Short: []float64{1, 1.05, 1.1, 1.15}, Long: []float64{1, 10.0 / 3, 17.0 / 3, 8},
					AttnFactor: math.Sqrt(1 + math.Log(16)/math.Log(8))}},
			Act: ActSiLU, BOSID: 1, EOSIDs: []int32{2, 7}}},
	{"phi4mini-tiny", "phi3",
		Config{VocabSize: 256, MaxPositions: 128, Hidden: 32, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 16, Inner: 64,
			Rope: Rope{Theta: 10000, Dim: 12, Factor: 1, Kind: RopeLongRope, OriginalMaxPositions: 64,
				LongRope: &LongRope{Short: []float64{1, 1.05, 1.1, 1.15, 1.2, 1.25}, Long: []float64{1, 2.4, 3.8, 5.2, 6.6, 8},
					AttnFactor: math.Sqrt(1 + math.Log(2)/math.Log(64))}},
			Act: ActSiLU, TiedHead: true, BOSID: 1, EOSIDs: []int32{2, 7}}},
	{"mixtral-tiny", "mixtral",
		Config{VocabSize: 192, MaxPositions: 128, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, Inner: 12,
			Rope: Rope{Theta: 1e6, Dim: 8, Factor: 1}, Act: ActSiLU, BOSID: 1, EOSIDs: []int32{2},
			MoE: &MoE{Experts: 8, TopK: 2, Inner: 12, NormTopK: true, Sparse: []bool{true, true}}}},
	{"qwen2moe-tiny", "qwen2_moe",
		Config{VocabSize: 192, MaxPositions: 128, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, Inner: 64,
			Rope: Rope{Theta: 1e6, Dim: 8, Factor: 1}, Act: ActSiLU, QKVBias: true, BOSID: 1, EOSIDs: []int32{2},
			MoE: &MoE{Experts: 8, TopK: 2, Inner: 8, SharedInner: 32, Sparse: []bool{true, true}}}},
	{"qwen3moe-tiny", "qwen3_moe",
		Config{VocabSize: 256, MaxPositions: 128, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, Inner: 64,
			Rope: Rope{Theta: 1e6, Dim: 8, Factor: 1}, Act: ActSiLU, BOSID: 1, EOSIDs: []int32{2}, QKNorm: true,
			MoE: &MoE{Experts: 8, TopK: 2, Inner: 8, NormTopK: true, Sparse: []bool{false, true}}}},
}

// sameFloat says whether a and b agree to a few ulps (the fixtures' factors are decimal).
func sameFloat(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Max(1, math.Abs(b)) }

// sameLongRope compares longrope factors, floats to a few ulps.
func sameLongRope(a, b *LongRope) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.EqualFunc(a.Short, b.Short, sameFloat) && slices.EqualFunc(a.Long, b.Long, sameFloat) &&
		sameFloat(a.AttnFactor, b.AttnFactor)
}

// sameConfig compares descriptors, longrope's factors and the scales to a few ulps.
func sameConfig(a, b Config) bool {
	if !sameLongRope(a.Rope.LongRope, b.Rope.LongRope) || !sameFloat(a.EmbedScale, b.EmbedScale) ||
		!sameFloat(a.QueryScale, b.QueryScale) {
		return false
	}
	a.Rope.LongRope, b.Rope.LongRope = nil, nil
	a.EmbedScale, b.EmbedScale, a.QueryScale, b.QueryScale = 0, 0, 0, 0
	return reflect.DeepEqual(a, b)
}

// familyOfFixture returns the loader of a fixture's model_type.
func familyOfFixture(t *testing.T, modelType string) *family {
	t.Helper()
	for _, f := range families {
		if slices.Contains(f.modelTypes, modelType) {
			return f
		}
	}
	t.Fatalf("no loader for model_type %q", modelType)
	return nil
}

// TestFamiliesReadTheFixtures parses each fixture's config.json (as transformers 5 wrote
// it) into the descriptor (the MoE ones' experts too), and maps every role of every layer
// onto the checkpoint's tensors: each one present in its canonical shape — the experts'
// only in the sparse layers, the dense MLP's only in the others —, and no stored tensor
// left without a role.
func TestFamiliesReadTheFixtures(t *testing.T) {
	for _, fx := range familyFixtures {
		t.Run(fx.name, func(t *testing.T) {
			c, err := familyFixture(t, fx.name, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := fx.cfg
			want.Family, want.ModelType, want.DType = fx.family, c.ModelType, "float32"
			want.Norm, want.NormEps, want.Positions, want.GatedMLP = RMSNorm, c.NormEps, RotaryPositions, true
			if c.NormEps != 1e-6 && c.NormEps != 1e-5 {
				t.Errorf("NormEps %g", c.NormEps)
			}
			if !sameConfig(c, want) {
				t.Errorf("config\n got %+v\nwant %+v", c, want)
			}
			checkRoles(t, filepath.Join("../testdata", fx.name), &c, familyOfFixture(t, c.ModelType))
			g, err := LoadGeneration(filepath.Join("../testdata", fx.name), c.VocabSize)
			if err != nil {
				t.Fatal(err)
			}
			// The sampling defaults as the published checkpoints' generation_config.json
			// have them (Qwen3's and Gemma 3's; none for the others).
			wantGen := map[string]Generation{
				"qwen3-tiny":    {Sample: true, Temperature: 0.6, TopK: 20, TopP: 0.95},
				"qwen3moe-tiny": {Sample: true, Temperature: 0.6, TopK: 20, TopP: 0.95},
				"gemma3-tiny":   {Sample: true, TopK: 64, TopP: 0.95},
			}[fx.name]
			wantGen.EOSIDs = c.EOSIDs
			if !reflect.DeepEqual(g, wantGen) {
				t.Errorf("generation_config.json reads as %+v, want %+v", g, wantGen)
			}
			checkGolden(t, fx.name, c.VocabSize)
		})
	}
}

// checkGolden checks a fixture's golden file's shapes against its vocabulary: 14 prompt
// ids and their logits, 16 greedy tokens and their logits, ids inside the vocabulary.
func checkGolden(t *testing.T, name string, vocab int) {
	t.Helper()
	st, err := openSafetensors(filepath.Join("../testdata", name+"-golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	shape := func(n string) []int {
		if tn, ok := st.tensors[n]; ok {
			return tn.Shape
		}
		return nil
	}
	for n, want := range map[string][]int{"prompt_ids": {14}, "prompt_logits": {14, vocab}, "greedy_tokens": {16},
		"decode_logits": {16, vocab}} {
		if got := shape(n); !slices.Equal(got, want) {
			t.Errorf("%s: shape %v, want %v", n, got, want)
		}
	}
	for _, n := range []string{"prompt_ids", "greedy_tokens"} {
		ids, err := st.tensors[n].Int32()
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(ids, func(id int32) bool { return id < 0 || int(id) >= vocab }) {
			t.Errorf("%s %v: ids outside the vocabulary %d", n, ids, vocab)
		}
	}
}

// TestLongRopeFrequencies checks longrope's frequencies (Rope.InvFreq, LongInvFreq, and
// UsesLong's choice between them) against transformers 5.24's longrope initialiser on the
// two Phi fixtures' configs (its output, printed to the digits float32 holds): the short
// factors within the original context, the long ones beyond it.
func TestLongRopeFrequencies(t *testing.T) {
	for _, tc := range []struct {
		fixture    string
		seqLen     int
		want       []float64
		attnFactor float64
	}{
		{"phi3-longrope-tiny", 5, []float64{1.0, 0.095238097012043, 0.00909090880304575, 0.0008695652359165251}, 1.5275252316519468},
		{"phi3-longrope-tiny", 30, []float64{1.0, 0.030000001192092896, 0.0017647059867158532, 0.0001250000059371814}, 1.5275252316519468},
		{"phi4mini-tiny", 30, []float64{1.0, 0.20518426597118378, 0.042196255177259445, 0.008695651777088642,
			0.0017953618662431836, 0.00037132715806365013}, 1.0801234497346435},
	} {
		c, err := familyFixture(t, tc.fixture, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := c.Rope.InvFreq()
		if c.Rope.UsesLong(tc.seqLen) {
			got = c.Rope.LongInvFreq()
		}
		if len(got) != len(tc.want) {
			t.Fatalf("%s: %d frequencies, want %d", tc.fixture, len(got), len(tc.want))
		}
		for i, f := range got {
			if float64(f) != tc.want[i] {
				t.Errorf("%s at %d positions: inv_freq[%d] = %.17g, transformers %.17g", tc.fixture, tc.seqLen, i, f, tc.want[i])
			}
		}
		if math.Abs(c.Rope.LongRope.AttnFactor-tc.attnFactor) > 1e-15 || c.Rope.CosSinScale() != float32(tc.attnFactor) {
			t.Errorf("%s: attention factor %.17g, transformers %.17g", tc.fixture, c.Rope.LongRope.AttnFactor, tc.attnFactor)
		}
	}
}

// TestFamiliesRefuseBadFields loads each fixture's config with an option the
// engines are not to run, or a value out of range: the parse fails naming the field.
func TestFamiliesRefuseBadFields(t *testing.T) {
	set := func(kv ...any) func(map[string]any) {
		return func(m map[string]any) {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i+1] == nil {
					delete(m, kv[i].(string))
				} else {
					m[kv[i].(string)] = kv[i+1]
				}
			}
		}
	}
	rope := func(params map[string]any) func(map[string]any) {
		return func(m map[string]any) {
			p := m["rope_parameters"].(map[string]any)
			for k, v := range params {
				if v == nil {
					delete(p, k)
				} else {
					p[k] = v
				}
			}
		}
	}
	for _, tc := range []struct {
		fixture, name string
		edit          func(map[string]any)
		want          []string
	}{
		{"qwen3-tiny", "yarn scaling", rope(map[string]any{"rope_type": "yarn", "factor": 4.0}),
			[]string{"field rope_parameters", `rope type "yarn" is not supported`}},
		{"qwen3-tiny", "an activation the engines lack", set("hidden_act", "relu2"),
			[]string{"field hidden_act", `"relu2" is not supported`}},
		{"qwen3-tiny", "sliding layers of an unknown kind", set("use_sliding_window", true, "sliding_window", 4,
			"layer_types", []string{"full_attention", "chunked_attention"}),
			[]string{"field layer_types", `layer 1: "chunked_attention"`}},
		{"qwen3-tiny", "layer_types of the wrong length", set("use_sliding_window", true, "sliding_window", 4,
			"layer_types", []string{"full_attention"}),
			[]string{"field layer_types", "1 entries for num_hidden_layers 2"}},
		{"qwen3-tiny", "KV heads that do not divide the heads", set("num_key_value_heads", 3),
			[]string{"field num_key_value_heads", "3 does not divide num_attention_heads 4"}},
		{"gemma2-tiny", "a GELU gollm lacks", set("hidden_activation", "gelu_accurate"),
			[]string{"field hidden_activation", `"gelu_accurate" is not supported`}},
		{"gemma2-tiny", "a negative soft-cap", set("attn_logit_softcapping", -1.0),
			[]string{"field attn_logit_softcapping", "must be positive and finite"}},
		{"gemma2-tiny", "a zero final soft-cap", set("final_logit_softcapping", 0.0),
			[]string{"field final_logit_softcapping", "must be positive and finite"}},
		{"gemma2-tiny", "a query_pre_attn_scalar of zero", set("query_pre_attn_scalar", 0),
			[]string{"field query_pre_attn_scalar", "must be positive and finite"}},
		{"gemma2-tiny", "bidirectional attention", set("use_bidirectional_attention", true),
			[]string{"field use_bidirectional_attention", "true is not supported"}},
		{"gemma2-tiny", "sliding layers without a window length", set("sliding_window", -3),
			[]string{"field sliding_window", "non-negative integer"}},
		{"gemma3-tiny", "a global rope the engines lack", func(m map[string]any) {
			m["rope_parameters"].(map[string]any)["full_attention"] = map[string]any{"rope_type": "yarn", "factor": 8.0, "rope_theta": 1e6}
		}, []string{"field rope_parameters.full_attention", `rope type "yarn" is not supported`}},
		{"gemma3-tiny", "a local rope base of zero", func(m map[string]any) {
			m["rope_parameters"].(map[string]any)["sliding_attention"] = map[string]any{"rope_type": "default", "rope_theta": 0.0}
		}, []string{"field rope_parameters.sliding_attention.rope_theta", "must be positive"}},
		{"gemma3-tiny", "a sliding_window_pattern of zero", set("layer_types", nil, "sliding_window_pattern", 0),
			[]string{"field sliding_window_pattern", "must be a positive integer"}},
		{"gemma3-tiny", "transformers 4's rope_local_base_freq negative", set("rope_parameters", nil, "rope_theta", 1e6,
			"rope_local_base_freq", -1.0), []string{"field rope_local_base_freq", "must be positive and finite"}},
		{"phi3-longrope-tiny", "a rope type Phi-3 has not", rope(map[string]any{"rope_type": "llama3"}),
			[]string{"field rope_parameters", `rope type "llama3" is not supported (supported: default, longrope, su)`}},
		{"phi3-longrope-tiny", "too few long factors", rope(map[string]any{"long_factor": []float64{1, 2}}),
			[]string{"field rope_parameters.long_factor", "must be a list of 4 numbers"}},
		{"phi3-longrope-tiny", "a zero short factor", rope(map[string]any{"short_factor": []float64{1, 0, 1, 1}}),
			[]string{"field rope_parameters.short_factor", "[1] = 0: must be positive"}},
		{"phi3-longrope-tiny", "no long factors", rope(map[string]any{"long_factor": nil}),
			[]string{"field rope_parameters.long_factor", "must be a list of 4 numbers"}},
		{"phi3-longrope-tiny", "a partial rotary factor above 1", rope(map[string]any{"partial_rotary_factor": 1.5}),
			[]string{"field partial_rotary_factor", "must be in (0, 1]"}},
		{"phi4mini-tiny", "a partial rotary factor rotating an odd count", rope(map[string]any{"partial_rotary_factor": 0.6875}),
			[]string{"field partial_rotary_factor", "rotates 11 dimensions"}},
		{"phi3-longrope-tiny", "a negative attention factor", rope(map[string]any{"attention_factor": -2.0}),
			[]string{"field rope_parameters", "field attention_factor", "must be positive"}},
		{"mixtral-tiny", "more experts a token than experts", set("num_experts_per_tok", 9),
			[]string{"field num_experts_per_tok", "9 is outside [1, num_local_experts 8]"}},
		{"mixtral-tiny", "no experts", set("num_local_experts", 0),
			[]string{"field num_local_experts", "must be a positive integer"}},
		{"mixtral-tiny", "an absurd expert count", set("num_local_experts", 1<<20),
			[]string{"field num_local_experts", "outside [1, 4096]"}},
		{"mixtral-tiny", "both expert counts, differing", set("num_experts", 4),
			[]string{"field num_local_experts", "8 differs from num_experts 4"}},
		{"qwen2moe-tiny", "a sparse step of zero", set("decoder_sparse_step", 0),
			[]string{"field decoder_sparse_step", "must be a positive integer"}},
		{"qwen2moe-tiny", "a dense layer past the last", set("mlp_only_layers", []int{2}),
			[]string{"field mlp_only_layers", "2 is not a distinct layer index below num_hidden_layers 2"}},
		{"qwen2moe-tiny", "a dense layer twice", set("mlp_only_layers", []int{0, 0}),
			[]string{"field mlp_only_layers", "0 is not a distinct layer index"}},
		{"qwen2moe-tiny", "a negative shared expert", set("shared_expert_intermediate_size", -8),
			[]string{"field shared_expert_intermediate_size", "non-negative integer"}},
		{"qwen3moe-tiny", "an absurd expert width", set("moe_intermediate_size", 1<<30),
			[]string{"field moe_intermediate_size", "outside [1, 262144]"}},
		{"qwen3moe-tiny", "top-k of zero", set("num_experts_per_tok", 0),
			[]string{"field num_experts_per_tok", "must be a positive integer"}},
	} {
		t.Run(tc.fixture+": "+tc.name, func(t *testing.T) {
			_, err := familyFixture(t, tc.fixture, tc.edit)
			if err == nil {
				t.Fatal("parsed without error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestFamiliesReadPublishedConfigs parses configs laid out as the published
// checkpoints' config.json (transformers 4's fields: rope_theta, rope_scaling,
// rope_local_base_freq, sliding_window_pattern, num_experts, Gemma 3's image-text
// text_config holding only what differs from the defaults), checking what each
// family's defaults and old spellings give. Phi-4-mini's 48 long and short factors are
// stand-ins of the right count.
func TestFamiliesReadPublishedConfigs(t *testing.T) {
	factors := func(v float64) []float64 {
		f := make([]float64, 48)
		for i := range f {
			f[i] = v + float64(i)/10
		}
		return f
	}
	phi4Rope, _ := json.Marshal(map[string]any{"type": "longrope", "short_factor": factors(1), "long_factor": factors(2)})
	alternate := func(n, pattern int) []bool {
		s := make([]bool, n)
		for l := range s {
			s[l] = (l+1)%pattern != 0
		}
		return s
	}
	all := func(n int) []bool {
		s := make([]bool, n)
		for l := range s {
			s[l] = true
		}
		return s
	}
	for _, tc := range []struct {
		name, config string
		check        func(t *testing.T, c Config)
	}{
		{"Qwen3-8B", `{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
			"eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
			"max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32,
			"num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
			"rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
			"use_sliding_window": false, "vocab_size": 151936}`,
			func(t *testing.T, c Config) {
				if c.HeadDim != 128 || c.AttnWidth() != 4096 || c.Rope.Theta != 1e6 || c.TiedHead || !c.QKNorm ||
					c.SlidingWindow != 0 || c.PostNorms || c.MoE != nil {
					t.Errorf("%+v", c)
				}
			}},
		{"Qwen3-30B-A3B", `{"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
			"decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
			"intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
			"model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
			"num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
			"output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
			"router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
			"use_sliding_window": false, "vocab_size": 151936}`,
			func(t *testing.T, c Config) {
				want := MoE{Experts: 128, TopK: 8, Inner: 768, NormTopK: true, Sparse: all(48)}
				if c.HeadDim != 128 || c.AttnWidth() != 4096 || !c.QKNorm || c.MoE == nil || !reflect.DeepEqual(*c.MoE, want) {
					t.Errorf("%+v (moe %+v)", c, c.MoE)
				}
			}},
		{"gemma-2-2b-it", `{"architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attn_logit_softcapping": 50.0,
			"bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 107], "final_logit_softcapping": 30.0,
			"head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
			"intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
			"num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
			"rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32", "vocab_size": 256000}`,
			func(t *testing.T, c Config) {
				if !c.TiedHead || c.Act != ActGeluTanh || c.Rope.Theta != 10000 || !c.PostNorms || c.QKNorm ||
					c.EmbedScale != 48 || c.QueryScale != 1.0/16 || c.AttnSoftcap != 50 || c.FinalSoftcap != 30 ||
					!slices.Equal(c.SlidingLayers, alternate(26, 2)) || c.SlidingWindow != 4096 || c.LocalRope.Dim != 0 ||
					c.LayerWindow(0) != 4096 || c.LayerWindow(1) != 0 {
					t.Errorf("%+v", c)
				}
			}},
		{"gemma-3-1b-it", `{"architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attn_logit_softcapping": null,
			"bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106], "final_logit_softcapping": null,
			"head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
			"max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
			"num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
			"rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512,
			"sliding_window_pattern": 6, "torch_dtype": "bfloat16", "vocab_size": 262144}`,
			func(t *testing.T, c Config) {
				if c.Rope != (Rope{Theta: 1e6, Dim: 256, Factor: 1}) || !slices.Equal(c.EOSIDs, []int32{1, 106}) ||
					!c.QKNorm || !c.PostNorms || c.EmbedScale != math.Sqrt(1152) || c.QueryScale != 1.0/16 ||
					c.AttnSoftcap != 0 || c.FinalSoftcap != 0 || !slices.Equal(c.SlidingLayers, alternate(26, 6)) ||
					c.SlidingWindow != 512 || c.LocalRope != (Rope{Theta: 10000, Dim: 256, Factor: 1}) ||
					c.LayerRope(0) != c.LocalRope || c.LayerRope(5) != c.Rope {
					t.Errorf("%+v", c)
				}
			}},
		{"gemma-3-4b-it (image-text)", `{"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
			"eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144, "mm_tokens_per_image": 256,
			"model_type": "gemma3", "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
			"num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
			"torch_dtype": "bfloat16", "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}}`,
			func(t *testing.T, c Config) {
				if c.VocabSize != 262208 || c.Heads != 8 || c.KVHeads != 4 || c.HeadDim != 256 || c.BOSID != 2 ||
					c.Rope != (Rope{Theta: 1e6, Dim: 256, Kind: RopeLinear, Factor: 8}) || !c.QKNorm || !c.PostNorms ||
					c.EmbedScale != math.Sqrt(2560) || c.QueryScale != 1.0/16 || !slices.Equal(c.SlidingLayers, alternate(34, 6)) ||
					c.SlidingWindow != 1024 || c.LocalRope != (Rope{Theta: 10000, Dim: 256, Factor: 1}) || c.Family != "gemma3" {
					t.Errorf("%+v", c)
				}
			}},
		{"Phi-3-mini-4k-instruct", `{"architectures": ["Phi3ForCausalLM"], "attention_bias": false, "bos_token_id": 1,
			"embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192,
			"max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32,
			"num_key_value_heads": 32, "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0,
			"rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0, "sliding_window": 2047,
			"tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32064}`,
			func(t *testing.T, c Config) {
				// Nothing beyond the LLaMA descriptor.
				if c.SlidingWindow != 2047 || c.WindowFromLayer != 0 || c.Rope != (Rope{Theta: 10000, Dim: 96, Factor: 1}) {
					t.Errorf("%+v", c)
				}
			}},
		{"Phi-4-mini-instruct", `{"architectures": ["Phi3ForCausalLM"], "attention_bias": false, "bos_token_id": 199999,
			"eos_token_id": 199999, "full_attn_mod": 1, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192,
			"interpolate_factor": 1, "lm_head_bias": false, "max_position_embeddings": 131072, "mlp_bias": false,
			"model_type": "phi3", "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
			"original_max_position_embeddings": 4096, "pad_token_id": 199999, "partial_rotary_factor": 0.75,
			"rms_norm_eps": 1e-05, "rope_scaling": ` + string(phi4Rope) + `, "rope_theta": 10000.0, "sliding_window": 262144,
			"tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 200064}`,
			func(t *testing.T, c Config) {
				want := &LongRope{Short: factors(1), Long: factors(2), AttnFactor: math.Sqrt(1 + math.Log(32)/math.Log(4096))}
				if c.HeadDim != 128 || c.Rope.Dim != 96 || c.SlidingWindow != 0 || !c.TiedHead || c.Rope.Kind != RopeLongRope ||
					c.Rope.OriginalMaxPositions != 4096 || !sameLongRope(c.Rope.LongRope, want) {
					t.Errorf("%+v %+v", c, c.Rope.LongRope)
				}
			}},
		{"Mixtral-8x7B-Instruct-v0.1", `{"architectures": ["MixtralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
			"hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
			"model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
			"num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false, "rms_norm_eps": 1e-05,
			"rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
			"torch_dtype": "bfloat16", "vocab_size": 32000}`,
			func(t *testing.T, c Config) {
				want := MoE{Experts: 8, TopK: 2, Inner: 14336, NormTopK: true, Sparse: all(32)}
				if c.SlidingWindow != 0 || c.HeadDim != 128 || c.MoE == nil || !reflect.DeepEqual(*c.MoE, want) {
					t.Errorf("%+v (moe %+v)", c, c.MoE)
				}
			}},
		{"Qwen1.5-MoE-A2.7B", `{"architectures": ["Qwen2MoeForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151643,
			"hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632, "max_position_embeddings": 8192,
			"max_window_layers": 21, "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24,
			"num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
			"tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936,
			"decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
			"num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": false, "output_router_logits": false}`,
			func(t *testing.T, c Config) {
				want := MoE{Experts: 60, TopK: 4, Inner: 1408, SharedInner: 5632, Sparse: all(24)}
				if !c.QKVBias || c.OutBias || c.MoE == nil || !reflect.DeepEqual(*c.MoE, want) {
					t.Errorf("%+v (moe %+v)", c, c.MoE)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _, err := parseConfig([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

// FuzzParseFamilies mutates the new families' fixture configs and parses them: never a
// panic, an allocation beyond what the bytes justify, or an accepted config whose
// per-layer fields disagree with its layer count; every refusal names a field.
func FuzzParseFamilies(f *testing.F) {
	for _, fx := range familyFixtures {
		raw, err := os.ReadFile(filepath.Join("../testdata", fx.name, "config.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	for _, bomb := range []string{`{"model_type": "gemma2", "num_hidden_layers": 100000000000}`,
		`{"model_type": "qwen3_moe", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1000000000000, "num_attention_heads": 1}`,
		`{"model_type": "gemma3", "text_config": {"num_hidden_layers": 4000000000, "sliding_window_pattern": 1}}`,
		`{"model_type": "mixtral", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 1, "num_local_experts": 1000000000}`,
		`{"model_type": "phi3", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 1, "rope_scaling": {"type": "longrope", "short_factor": [1e308, 1e308], "long_factor": [1, 1]}}`} {
		f.Add([]byte(bomb))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		c, _, _, err := parseConfig(raw)
		runtime.ReadMemStats(&after)
		if grown := after.TotalAlloc - before.TotalAlloc; grown > 64<<20+uint64(len(raw))*64 {
			t.Fatalf("parsing %d bytes allocated %d bytes", len(raw), grown)
		}
		if err != nil {
			if !strings.Contains(err.Error(), "field ") && !strings.Contains(err.Error(), "invalid JSON") {
				t.Fatalf("error %q names no field", err)
			}
			return
		}
		if c.SlidingLayers != nil && len(c.SlidingLayers) != c.Layers || c.MoE != nil && len(c.MoE.Sparse) != c.Layers {
			t.Fatalf("per-layer fields of %d layers for %d layers", len(c.SlidingLayers), c.Layers)
		}
		if l := c.Rope.LongRope; l != nil && (len(l.Short) != c.Rope.Dim/2 || len(l.Long) != c.Rope.Dim/2) {
			t.Fatalf("longrope factors %d/%d for %d rotated pairs", len(l.Short), len(l.Long), c.Rope.Dim/2)
		}
		_ = c.Recipe()
	})
}

package model

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// moeFixtures are the registered mixture-of-experts fixtures with what their config.json
// must read as.
var moeFixtures = []struct {
	name string
	fam  *family
	cfg  Config
}{
	{"mixtral-tiny", mixtralFamily,
		Config{Family: "mixtral", ModelType: "mixtral", VocabSize: 192, MaxPositions: 128, Hidden: 32, Layers: 2, Heads: 4,
			KVHeads: 2, HeadDim: 8, Inner: 12, Norm: RMSNorm, NormEps: 1e-5, Positions: RotaryPositions,
			Rope: Rope{Theta: 1e6, Dim: 8, Factor: 1}, GatedMLP: true, Act: ActSiLU, BOSID: 1, EOSIDs: []int32{2},
			DType: "float32", MoE: &MoE{Experts: 8, TopK: 2, Inner: 12, NormTopK: true, Sparse: []bool{true, true}}}},
	{"qwen2moe-tiny", qwen2MoEFamily,
		Config{Family: "qwen2_moe", ModelType: "qwen2_moe", VocabSize: 192, MaxPositions: 128, Hidden: 32, Layers: 2,
			Heads: 4, KVHeads: 2, HeadDim: 8, Inner: 64, Norm: RMSNorm, NormEps: 1e-6, Positions: RotaryPositions,
			Rope: Rope{Theta: 1e6, Dim: 8, Factor: 1}, QKVBias: true, GatedMLP: true, Act: ActSiLU, BOSID: 1,
			EOSIDs: []int32{2}, DType: "float32",
			MoE: &MoE{Experts: 8, TopK: 2, Inner: 8, SharedInner: 32, Sparse: []bool{true, true}}}},
}

// TestMoEFamiliesReadTheFixtures opens the Mixtral and Qwen2-MoE fixtures (as transformers
// 5 wrote them): the descriptor with its experts, every role of every layer mapped onto
// the checkpoint's tensors — the router and each expert's projections joined in expert
// order, no dense MLP in a sparse layer — with no stored tensor left over, and the
// weights resolved in the shapes the descriptor implies.
func TestMoEFamiliesReadTheFixtures(t *testing.T) {
	for _, fx := range moeFixtures {
		t.Run(fx.name, func(t *testing.T) {
			dir := filepath.Join("../testdata", fx.name)
			ck, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if !reflect.DeepEqual(ck.Config, fx.cfg) {
				t.Errorf("config\n got %+v (moe %+v)\nwant %+v (moe %+v)", ck.Config, ck.Config.MoE, fx.cfg, fx.cfg.MoE)
			}
			c := ck.Config
			checkRoles(t, dir, &c, &Features{}, &pendingFamily{family: *fx.fam,
				extraNames: func(*Config, *Features, newRole, int) []partName { return nil }})
			ws, err := ck.Weights()
			if err != nil {
				t.Fatal(err)
			}
			m := c.MoE
			got := map[string][2]int{}
			for _, w := range ws {
				if w.Layer >= 0 {
					got[fmt.Sprintf("%d %s", w.Layer, w.Role)] = [2]int{w.Rows, w.Cols}
				}
			}
			for l := range c.Layers {
				want := map[Role][2]int{RoleRouter: {m.Experts, c.Hidden}, RoleExpertUp: {m.Experts * 2 * m.Inner, c.Hidden},
					RoleExpertDown: {m.Experts * c.Hidden, m.Inner}}
				if m.SharedInner > 0 {
					want[RoleSharedUp], want[RoleSharedDown] = [2]int{2 * m.SharedInner, c.Hidden}, [2]int{c.Hidden, m.SharedInner}
					want[RoleSharedGate] = [2]int{1, c.Hidden}
				}
				for r, shape := range want {
					if g := got[fmt.Sprintf("%d %s", l, r)]; g != shape {
						t.Errorf("layer %d %s: %v, want %v", l, r, g, shape)
					}
				}
				for _, r := range []Role{RoleUp, RoleDown} {
					if _, ok := got[fmt.Sprintf("%d %s", l, r)]; ok {
						t.Errorf("layer %d has a dense %s in a sparse layer", l, r)
					}
				}
			}
			checkGolden(t, fx.name, c.VocabSize)
		})
	}
}

// TestExpertWeightsAreCheckedBeforeConversion: an expert's tensor of the wrong shape, or
// one missing, fails Weights naming the tensor and the fields its shape comes from,
// before any weight is converted.
func TestExpertWeightsAreCheckedBeforeConversion(t *testing.T) {
	tensors := fixtureTensors(t, "../testdata/mixtral-tiny")
	cfg := fixtureConfig(t, "../testdata/mixtral-tiny")
	const victim = "model.layers.1.block_sparse_moe.experts.5.w3.weight"
	var short, dropped []*Tensor
	for _, tn := range tensors {
		if tn.Name != victim {
			short, dropped = append(short, tn), append(dropped, tn)
			continue
		}
		// 11 of its 12 rows.
		c := *tn
		c.Shape, c.Data = []int{11, 32}, c.Data[:11*32*4]
		short = append(short, &c)
	}
	for _, tc := range []struct {
		name    string
		tensors []*Tensor
		want    []string
	}{
		{"an expert's up projection one row short", short,
			[]string{"experts.5.w3.weight", "shape [11 32], expected [12 32]", "num_local_experts 8, intermediate_size 12, hidden_size 32"}},
		{"an expert's up projection missing", dropped, []string{"experts.5.w3.weight"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ck, err := Open(writeCheckpoint(t, cfg, tc.tensors))
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			_, err = ck.Weights()
			if err == nil {
				t.Fatal("Weights succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestMoEFamiliesRefuseBadFields parses the fixtures' configs with a value out of range:
// the parse fails naming the field, before anything is sized by it.
func TestMoEFamiliesRefuseBadFields(t *testing.T) {
	set := func(kv ...any) func(map[string]any) {
		return func(m map[string]any) {
			for i := 0; i+1 < len(kv); i += 2 {
				m[kv[i].(string)] = kv[i+1]
			}
		}
	}
	for _, tc := range []struct {
		fixture, name string
		edit          func(map[string]any)
		want          []string
	}{
		{"mixtral-tiny", "more experts a token than experts", set("num_experts_per_tok", 9),
			[]string{"field num_experts_per_tok", "9 is outside [1, num_local_experts 8]"}},
		{"mixtral-tiny", "no experts", set("num_local_experts", 0),
			[]string{"field num_local_experts", "must be a positive integer"}},
		{"mixtral-tiny", "an absurd expert count", set("num_local_experts", 1<<20),
			[]string{"field num_local_experts", "outside [1, 4096]"}},
		{"mixtral-tiny", "both expert counts, differing", set("num_experts", 4),
			[]string{"field num_local_experts", "8 differs from num_experts 4"}},
		{"mixtral-tiny", "an absurd expert width", set("intermediate_size", 1<<30),
			[]string{"field intermediate_size", "outside [1, 262144]"}},
		{"qwen2moe-tiny", "a sparse step of zero", set("decoder_sparse_step", 0),
			[]string{"field decoder_sparse_step", "must be a positive integer"}},
		{"qwen2moe-tiny", "a dense layer past the last", set("mlp_only_layers", []int{2}),
			[]string{"field mlp_only_layers", "2 is not a distinct layer index below num_hidden_layers 2"}},
		{"qwen2moe-tiny", "a dense layer twice", set("mlp_only_layers", []int{0, 0}),
			[]string{"field mlp_only_layers", "0 is not a distinct layer index"}},
		{"qwen2moe-tiny", "a negative shared expert", set("shared_expert_intermediate_size", -8),
			[]string{"field shared_expert_intermediate_size", "non-negative integer"}},
		{"qwen2moe-tiny", "an absurd shared expert", set("shared_expert_intermediate_size", 1<<30),
			[]string{"field shared_expert_intermediate_size", "outside [0, 262144]"}},
		{"qwen2moe-tiny", "an absurd expert width", set("moe_intermediate_size", 1<<30),
			[]string{"field moe_intermediate_size", "outside [1, 262144]"}},
		{"qwen2moe-tiny", "top-k of zero", set("num_experts_per_tok", 0),
			[]string{"field num_experts_per_tok", "must be a positive integer"}},
		{"qwen2moe-tiny", "an activation the engines lack", set("hidden_act", "relu2"),
			[]string{"field hidden_act", `"relu2" is not supported`}},
	} {
		t.Run(tc.fixture+": "+tc.name, func(t *testing.T) {
			m := fixtureConfig(t, filepath.Join("../testdata", tc.fixture))
			tc.edit(m)
			raw, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, _, err = parseConfig(raw); err == nil {
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

// TestMoEFamiliesReadPublishedConfigs parses configs laid out as the published
// checkpoints' config.json (transformers 4's fields).
func TestMoEFamiliesReadPublishedConfigs(t *testing.T) {
	all := func(n int) []bool {
		s := make([]bool, n)
		for l := range s {
			s[l] = true
		}
		return s
	}
	for _, tc := range []struct {
		name, config string
		want         MoE
		check        func(c Config) bool
	}{
		{"Mixtral-8x7B-Instruct-v0.1", `{"architectures": ["MixtralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
			"hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
			"model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
			"num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false, "rms_norm_eps": 1e-05,
			"rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
			"torch_dtype": "bfloat16", "vocab_size": 32000}`,
			MoE{Experts: 8, TopK: 2, Inner: 14336, NormTopK: true, Sparse: all(32)},
			func(c Config) bool { return c.SlidingWindow == 0 && c.HeadDim == 128 && c.Rope.Theta == 1e6 }},
		{"Qwen1.5-MoE-A2.7B", `{"architectures": ["Qwen2MoeForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151643,
			"hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632, "max_position_embeddings": 8192,
			"max_window_layers": 21, "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24,
			"num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
			"tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936,
			"decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
			"num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": false, "output_router_logits": false}`,
			MoE{Experts: 60, TopK: 4, Inner: 1408, SharedInner: 5632, Sparse: all(24)},
			func(c Config) bool { return c.QKVBias && !c.OutBias && c.SlidingWindow == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _, err := parseConfig([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			if c.MoE == nil || !reflect.DeepEqual(*c.MoE, tc.want) || !tc.check(c) {
				t.Errorf("%+v (moe %+v)", c, c.MoE)
			}
		})
	}
}

// TestRecipeOfMoE: a sparse layer's MLP stage is the mixture with the descriptor's
// routing; a dense layer of a MoE model (Qwen3-MoE's mlp_only_layers) keeps the MLP.
func TestRecipeOfMoE(t *testing.T) {
	for _, tc := range []struct {
		dir    string
		sparse []bool
		shared bool
	}{
		{"../testdata/mixtral-tiny", []bool{true, true}, false},
		{"../testdata/qwen2moe-tiny", []bool{true, true}, true},
	} {
		c := parsedConfig(t, fixtureConfig(t, tc.dir))
		var got []bool
		for _, s := range c.Recipe() {
			switch s.Kind {
			case StageMoE:
				got = append(got, true)
				want := Stage{Kind: StageMoE, Layer: s.Layer, Gated: true, Act: ActSiLU, Experts: 8, TopK: 2,
					NormTopK: c.MoE.NormTopK, SharedExpert: tc.shared}
				if s != want {
					t.Errorf("%s layer %d: %+v, want %+v", c.ModelType, s.Layer, s, want)
				}
			case StageMLP:
				got = append(got, false)
			}
		}
		if !slices.Equal(got, tc.sparse) {
			t.Errorf("%s: sparse layers %v, want %v", c.ModelType, got, tc.sparse)
		}
	}
	c, _, _, err := pendingFixture(t, "qwen3moe-tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []StageKind
	for _, s := range c.Recipe() {
		if s.Kind == StageMLP || s.Kind == StageMoE {
			kinds = append(kinds, s.Kind)
		}
	}
	if !slices.Equal(kinds, []StageKind{StageMLP, StageMoE}) {
		t.Errorf("qwen3moe-tiny's MLP stages %v, want a dense layer 0 and a sparse layer 1", kinds)
	}
}

// TestTensorParallelSplitsExperts: the experts' and the shared expert's widths divide
// over the ranks or the split is refused, naming the field.
func TestTensorParallelSplitsExperts(t *testing.T) {
	c := Config{Heads: 32, KVHeads: 4, Inner: 6144, VocabSize: 151936, HeadDim: 128,
		MoE: &MoE{Experts: 128, TopK: 8, Inner: 768}}
	l, err := c.TensorParallel(2)
	if err != nil || l.MoEInner != 384 || l.SharedInner != 0 {
		t.Fatalf("Qwen3-30B-A3B over 2: %+v, %v", l, err)
	}
	if rc := c.RankConfig(l); rc.MoE.Inner != 384 || c.MoE.Inner != 768 {
		t.Errorf("rank config's experts %d units (the model's now %d)", rc.MoE.Inner, c.MoE.Inner)
	}
	for _, tc := range []struct {
		moe  MoE
		want string
	}{
		{MoE{Experts: 8, TopK: 2, Inner: 100}, "does not divide the experts' 100 units (moe_intermediate_size"},
		{MoE{Experts: 8, TopK: 2, Inner: 64, SharedInner: 20}, "does not divide the shared expert's 20 units"},
	} {
		c.MoE = &tc.moe
		if _, err := c.TensorParallel(8); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v over 8: %v, want %q", tc.moe, err, tc.want)
		}
	}
}

package model

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

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

// TestMoEFamiliesRefuseBadFields adds to TestFamiliesRefuseBadFields' cases: widths out
// of range where each family reads them, an activation the engines lack; the parse fails
// naming the field, before anything is sized by it.
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
		{"mixtral-tiny", "an absurd expert width", set("intermediate_size", 1<<30),
			[]string{"field intermediate_size", "outside [1, 262144]"}},
		{"qwen2moe-tiny", "an absurd shared expert", set("shared_expert_intermediate_size", 1<<30),
			[]string{"field shared_expert_intermediate_size", "outside [0, 262144]"}},
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
	c, err := familyFixture(t, "qwen3moe-tiny", nil)
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
	if rc := c.RankConfig(l, 1); rc.MoE.Inner != 384 || c.MoE.Inner != 768 {
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

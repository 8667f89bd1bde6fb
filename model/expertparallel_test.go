package model

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestExpertParallelShardsConcatenate splits the mixture-of-experts fixtures (Mixtral's
// 8 experts; Qwen2-MoE's 8 with a shared expert; Qwen3-MoE's 8 beside a dense layer)
// over 1, 2 and 4 ranks with the experts spread whole: each share has its rank config's
// shapes; the ranks' expert up and down projections, concatenated in rank order, are the
// whole model's, value for value; the router is whole on every rank; and every other
// weight — the shared expert's included — is the tensor-parallel share.
func TestExpertParallelShardsConcatenate(t *testing.T) {
	for _, fixture := range []string{"mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny"} {
		ck, err := Open(filepath.Join("..", "testdata", fixture))
		if err != nil {
			t.Fatal(err)
		}
		defer ck.Close()
		cfg := &ck.Config
		ws, err := ck.Weights()
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{1, 2, 4} {
			l, err := cfg.ExpertParallel(n)
			if err != nil {
				t.Fatalf("%s over %d: %v", fixture, n, err)
			}
			tl, err := cfg.TensorParallel(n)
			if err != nil {
				t.Fatal(err)
			}
			if l.Experts != cfg.MoE.Experts/n || l.MoEInner != cfg.MoE.Inner || l.SharedInner != tl.SharedInner {
				t.Fatalf("%s over %d: layout %+v", fixture, n, l)
			}
			ep := make([][]Weight, n)
			tp := make([][]Weight, n)
			for r := range n {
				if ep[r], err = ShardWeights(ws, cfg, l, r); err != nil {
					t.Fatal(err)
				}
				if tp[r], err = ShardWeights(ws, cfg, tl, r); err != nil {
					t.Fatal(err)
				}
				rc := cfg.RankConfig(l, r)
				if first, held := rc.MoE.Held(); first != r*l.Experts || held != l.Experts {
					t.Fatalf("%s over %d, rank %d: holds experts from %d, %d of them", fixture, n, r, first, held)
				}
				for i := range ws {
					rows, cols, _ := rc.Shape(ws[i].Role)
					if s := &ep[r][i]; s.Rows != rows || s.Cols != cols {
						t.Fatalf("%s over %d, rank %d: %s share %d×%d, want the rank config's %d×%d", fixture, n, r, &ws[i], s.Rows, s.Cols, rows, cols)
					}
				}
			}
			for i := range ws {
				w := &ws[i]
				name := fixture + "/" + w.String()
				whole := values(t, w)
				switch w.Role {
				case RoleExpertUp, RoleExpertDown:
					var cat []float32
					for r := range n {
						cat = append(cat, values(t, &ep[r][i])...)
					}
					if !slices.Equal(cat, whole) {
						t.Fatalf("%s over %d: the ranks' experts concatenated differ from the whole", name, n)
					}
				case RoleRouter:
					for r := range n {
						if !slices.Equal(values(t, &ep[r][i]), whole) {
							t.Fatalf("%s over %d, rank %d: the router is not whole", name, n, r)
						}
					}
				default:
					for r := range n {
						if !slices.Equal(values(t, &ep[r][i]), values(t, &tp[r][i])) {
							t.Fatalf("%s over %d, rank %d: differs from the tensor-parallel share", name, n, r)
						}
					}
				}
			}
		}
	}
}

func values(t *testing.T, w *Weight) []float32 {
	t.Helper()
	v, err := w.Float32()
	if err != nil {
		t.Fatalf("%s: %v", w, err)
	}
	return v
}

// TestExpertParallelLayout checks the split of Qwen3-30B-A3B's shape (128 experts over
// 2 ranks of 64, each whole; a width tensor parallelism could not split goes too), the
// rank configs' expert ranges, and the messages of a split that does not go.
func TestExpertParallelLayout(t *testing.T) {
	c := Config{Heads: 32, KVHeads: 4, Inner: 6144, VocabSize: 151936, HeadDim: 128, Hidden: 2048,
		MoE: &MoE{Experts: 128, TopK: 8, Inner: 768}}
	l, err := c.ExpertParallel(2)
	if err != nil || l.Experts != 64 || l.MoEInner != 768 || l.Heads != 16 {
		t.Fatalf("Qwen3-30B-A3B over 2: %+v, %v", l, err)
	}
	for r, want := range [][2]int{{0, 64}, {64, 64}} {
		rc := c.RankConfig(l, r)
		if first, n := rc.MoE.Held(); first != want[0] || n != want[1] || rc.MoE.Experts != 128 || rc.MoE.Inner != 768 {
			t.Errorf("rank %d holds experts from %d, %d of them, of %d, %d units", r, first, n, rc.MoE.Experts, rc.MoE.Inner)
		}
		if rows, _, _ := rc.Shape(RoleExpertUp); rows != 64*2*768 {
			t.Errorf("rank %d: expert up rows %d", r, rows)
		}
		if rows, _, _ := rc.Shape(RoleRouter); rows != 128 {
			t.Errorf("rank %d: router rows %d, want every expert's", r, rows)
		}
	}
	if first, n := c.MoE.Held(); first != 0 || n != 128 {
		t.Errorf("the whole model holds experts from %d, %d of them", first, n)
	}
	// 8 ranks of experts of 100 units: tensor parallelism refuses the width, expert
	// parallelism keeps each expert whole.
	c8 := Config{Heads: 8, KVHeads: 8, Inner: 64, VocabSize: 10, HeadDim: 8, MoE: &MoE{Experts: 16, TopK: 2, Inner: 100}}
	if _, err := c8.TensorParallel(8); err == nil {
		t.Error("tensor parallelism split 100 units over 8")
	}
	if l, err := c8.ExpertParallel(8); err != nil || l.Experts != 2 || l.MoEInner != 100 {
		t.Errorf("experts of 100 units over 8: %+v, %v", l, err)
	}
	for _, tc := range []struct {
		cfg  Config
		n    int
		want string
	}{
		{Config{Heads: 8, KVHeads: 8, Inner: 64, VocabSize: 10, HeadDim: 8}, 2, "the model has no mixture of experts"},
		{Config{Heads: 12, KVHeads: 12, Inner: 96, VocabSize: 10, HeadDim: 8, MoE: &MoE{Experts: 8, TopK: 2, Inner: 64}}, 3,
			"3 does not divide the model's 8 experts (num_experts, num_local_experts)"},
		{Config{Heads: 8, KVHeads: 8, Inner: 64, VocabSize: 10, HeadDim: 8, MoE: &MoE{Experts: 8, TopK: 2, Inner: 64, SharedInner: 20}}, 8,
			"does not divide the shared expert's 20 units"},
		{c, 3, "does not divide the model's 32 attention heads"},
	} {
		if _, err := tc.cfg.ExpertParallel(tc.n); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("over %d: %v, want an error containing %q", tc.n, err, tc.want)
		}
	}
}

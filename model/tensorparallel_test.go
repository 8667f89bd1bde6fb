package model

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
)

// matVec is W x for a canonical [rows][cols] weight, in float64.
func matVec(t *testing.T, w *Weight, x []float64) []float64 {
	t.Helper()
	v, err := w.Float32()
	if err != nil {
		t.Fatalf("%s: %v", w, err)
	}
	if len(x) != w.Cols {
		t.Fatalf("%s: %d inputs for %d columns", w, len(x), w.Cols)
	}
	y := make([]float64, w.Rows)
	for r := range y {
		for c, xc := range x {
			y[r] += float64(v[r*w.Cols+c]) * xc
		}
	}
	return y
}

func randVec(rng *rand.Rand, n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = rng.NormFloat64()
	}
	return x
}

// close64 compares within float64 rounding of sums of float32 products.
func close64(t *testing.T, what string, got, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Abs(got[i]-want[i]) > 1e-9*(1+math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
	}
}

// TestShardWeightsComputeTheWholeModel splits the fixture checkpoints (GPT-2's fused,
// transposed Conv1D matrices; LLaMA's separate projections with 2 KV heads; Qwen2's
// single KV head and biases) over 1, 2 and 4 ranks and checks each share against the
// whole weight on random inputs: column-parallel shares give their rows of the whole
// output (query rows of the rank's heads, key and value rows of the KV heads they read,
// gate and up rows of its units), row-parallel shares' partial sums over the ranks give
// the whole output with the bias once, the vocabulary rows concatenate to the whole
// embedding and LM head, and the rest is the same on every rank. Mixtral's and
// Qwen2-MoE's experts (and shared expert) split as the MLP does, each expert's gate and
// up rows of the rank's units, its down projection's matching columns; the router and
// the shared expert's gate are whole on every rank.
func TestShardWeightsComputeTheWholeModel(t *testing.T) {
	for _, fixture := range []string{"gpt2-tiny", "llama-tiny", "qwen2-tiny", "mixtral-tiny", "qwen2moe-tiny"} {
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
			l, err := cfg.TensorParallel(n)
			if err != nil {
				t.Fatalf("%s over %d: %v", fixture, n, err)
			}
			rc := cfg.RankConfig(l, 0)
			shares := make([][]Weight, n)
			for r := range n {
				if shares[r], err = ShardWeights(ws, cfg, l, r); err != nil {
					t.Fatal(err)
				}
				if len(shares[r]) != len(ws) {
					t.Fatalf("%s rank %d: %d weights, want %d", fixture, r, len(shares[r]), len(ws))
				}
			}
			rng := rand.New(rand.NewPCG(uint64(n), 7))
			D := cfg.HeadDim
			for i := range ws {
				w := &ws[i]
				name := fixture + "/" + w.String()
				for r := range n {
					s := &shares[r][i]
					rows, cols, _ := rc.Shape(w.Role)
					if s.Rows != rows || s.Cols != cols {
						t.Fatalf("%s over %d, rank %d: share %d×%d, want the rank config's %d×%d", name, n, r, s.Rows, s.Cols, rows, cols)
					}
				}
				switch w.Role {
				case RoleQKV, RoleQKVBias, RoleUp, RoleUpBias:
					x := randVec(rng, w.Cols)
					whole := matVec(t, w, x)
					for r := range n {
						got := matVec(t, &shares[r][i], x)
						var want []float64
						if w.Role == RoleQKV || w.Role == RoleQKVBias {
							kv := (r / l.KVShare) * l.KVHeads
							want = append(want, whole[r*l.Heads*D:(r+1)*l.Heads*D]...)
							k0 := cfg.Heads*D + kv*D
							want = append(want, whole[k0:k0+l.KVHeads*D]...)
							v0 := (cfg.Heads+cfg.KVHeads)*D + kv*D
							want = append(want, whole[v0:v0+l.KVHeads*D]...)
						} else {
							want = append(want, whole[r*l.Inner:(r+1)*l.Inner]...)
							if cfg.GatedMLP {
								want = append(want, whole[cfg.Inner+r*l.Inner:cfg.Inner+(r+1)*l.Inner]...)
							}
						}
						close64(t, name+" rank share", got, want)
					}
				case RoleExpertUp, RoleSharedUp:
					// Expert by expert (the shared expert: one), its gate rows of the rank's
					// units, then its up rows.
					x := randVec(rng, w.Cols)
					whole := matVec(t, w, x)
					inner, per := cfg.MoE.Inner, l.MoEInner
					if w.Role == RoleSharedUp {
						inner, per = cfg.MoE.SharedInner, l.SharedInner
					}
					for r := range n {
						var want []float64
						for e0 := 0; e0 < w.Rows; e0 += 2 * inner {
							want = append(want, whole[e0+r*per:e0+(r+1)*per]...)
							want = append(want, whole[e0+inner+r*per:e0+inner+(r+1)*per]...)
						}
						close64(t, name+" rank share", matVec(t, &shares[r][i], x), want)
					}
				case RoleOut, RoleDown, RoleExpertDown, RoleSharedDown:
					x := randVec(rng, w.Cols)
					whole := matVec(t, w, x)
					sum := make([]float64, w.Rows)
					per := w.Cols / n
					for r := range n {
						part := matVec(t, &shares[r][i], x[r*per:(r+1)*per])
						for j := range sum {
							sum[j] += part[j]
						}
					}
					close64(t, name+" sum of partials", sum, whole)
				case RoleOutBias, RoleDownBias:
					whole := matVec(t, w, []float64{1})
					sum := make([]float64, w.Rows)
					for r := range n {
						for j, v := range matVec(t, &shares[r][i], []float64{1}) {
							sum[j] += v
						}
					}
					close64(t, name+" summed over ranks", sum, whole)
				case RoleEmbed, RoleLMHead:
					x := randVec(rng, w.Cols)
					whole := matVec(t, w, x)
					var cat []float64
					for r := range n {
						cat = append(cat, matVec(t, &shares[r][i], x)...)
					}
					close64(t, name+" concatenated", cat[:w.Rows], whole)
					for j, v := range cat[w.Rows:] {
						if v != 0 {
							t.Fatalf("%s: padding row %d is %g", name, j, v)
						}
					}
				default:
					x := randVec(rng, w.Cols)
					whole := matVec(t, w, x)
					for r := range n {
						close64(t, name+" whole on every rank", matVec(t, &shares[r][i], x), whole)
					}
				}
			}
		}
	}
}

// TestTensorParallelLayout checks the split and the messages of one that does not go.
func TestTensorParallelLayout(t *testing.T) {
	c := Config{Heads: 32, KVHeads: 8, Inner: 11008, VocabSize: 32000, HeadDim: 128}
	l, err := c.TensorParallel(4)
	if err != nil || l != (TPLayout{Size: 4, Heads: 8, KVHeads: 2, KVShare: 1, Inner: 2752, VocabRows: 8000}) {
		t.Errorf("Llama shape over 4: %+v, %v", l, err)
	}
	// More ranks than KV heads: each KV head on the ranks whose heads read it.
	l, err = c.TensorParallel(16)
	if err != nil || l.KVHeads != 1 || l.KVShare != 2 || l.Heads != 2 {
		t.Errorf("over 16: %+v, %v", l, err)
	}
	// A vocabulary that does not divide: rounded up, the last rank padded.
	c2 := Config{Heads: 12, KVHeads: 12, Inner: 3072, VocabSize: 50257, HeadDim: 64}
	if l, err := c2.TensorParallel(4); err != nil || l.VocabRows != 12565 {
		t.Errorf("GPT-2 over 4: %+v, %v", l, err)
	}
	for _, tc := range []struct {
		cfg  Config
		n    int
		want string
	}{
		{c, 0, "tensor_parallel_size 0: want at least 1"},
		{c, 3, "does not divide the model's 32 attention heads (num_attention_heads, n_head)"},
		{Config{Heads: 12, KVHeads: 3, Inner: 64, VocabSize: 10}, 4, "neither divides nor is a multiple of the model's 3 KV heads (num_key_value_heads)"},
		{Config{Heads: 8, KVHeads: 8, Inner: 100, VocabSize: 10}, 8, "does not divide the MLP's 100 units (intermediate_size, n_inner)"},
	} {
		if _, err := tc.cfg.TensorParallel(tc.n); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("over %d: %v, want an error containing %q", tc.n, err, tc.want)
		}
	}
}

// TestVocabRowsPadTheLastRank splits a 10-row embedding over 4 ranks of 3 rows.
func TestVocabRowsPadTheLastRank(t *testing.T) {
	data := make([]byte, 10*2*4)
	for i := range 20 {
		b := math.Float32bits(float32(i + 1))
		data[4*i], data[4*i+1], data[4*i+2], data[4*i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
	}
	w := Weight{Role: RoleEmbed, Layer: -1, Rows: 10, Cols: 2, Parts: []Part{{Tensor: &Tensor{Name: "wte", DType: "F32", Shape: []int{10, 2}, Data: data}, Rows: 10}}}
	var all []float32
	for r := range 4 {
		s, err := w.vocabRows(3*r, 3)
		if err != nil {
			t.Fatal(err)
		}
		v, err := s.Float32()
		if err != nil || s.Rows != 3 {
			t.Fatalf("rank %d: %d rows, %v", r, s.Rows, err)
		}
		all = append(all, v...)
	}
	for i, v := range all {
		want := float32(i + 1)
		if i >= 20 {
			want = 0
		}
		if v != want {
			t.Fatalf("element %d = %g, want %g", i, v, want)
		}
	}
}

package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gollm/model"
)

// TestQuantFP8RowRoundsEachGroup: every value of a row becomes an e4m3 value times its
// group's scale (amax / 448), for groups of 128 columns and for the whole row (rowWise),
// the largest magnitude of each group survives exactly, and an all-zero group stays zero.
func TestQuantFP8RowRoundsEachGroup(t *testing.T) {
	for _, group := range []int{128, 300} {
		quantFP8RowCase(t, group)
	}
}

func quantFP8RowCase(t *testing.T, group int) {
	rng := rand.New(rand.NewPCG(7, 1))
	r := make([]float32, 300) // groups of 128, 128 and 44
	for i := range r {
		r[i] = float32(rng.NormFloat64()) * float32(1+i/128*10)
	}
	for i := 128; i < 256; i++ {
		r[i] = 0
	}
	orig := slices.Clone(r)
	quantFP8Row(r, group)
	for g := 0; g < len(r); g += group {
		x, o := r[g:min(g+group, len(r))], orig[g:min(g+group, len(r))]
		var a float32
		for _, v := range o {
			a = max(a, abs32(v))
		}
		changed := 0
		for i, v := range x {
			if a == 0 {
				if v != 0 {
					t.Fatalf("group at %d: all zeros, element %d became %g", g, i, v)
				}
				continue
			}
			code := model.Float32ToE4M3(v * 448 / a)
			if back := model.E4M3ToFloat32(code) * a / 448; math.Abs(float64(back-v)) > 1e-6*float64(a) {
				t.Fatalf("group at %d element %d: %g is not an e4m3 value times %g", g, i, v, a/448)
			}
			if rel := math.Abs(float64(v-o[i])) / float64(a); rel > 1.0/16 {
				t.Fatalf("group at %d element %d: %g rounded to %g, off by %.3g of the group's amax", g, i, o[i], v, rel)
			}
			if v != o[i] {
				changed++
			}
			if abs32(o[i]) == a && abs32(v) != a {
				t.Fatalf("group at %d: its largest magnitude %g became %g", g, o[i], v)
			}
		}
		if a != 0 && changed == 0 {
			t.Fatalf("group at %d: nothing was rounded", g)
		}
	}
}

// TestQuantizeActivationsFP8OnlyPastItsRows: the rounding changes a step's logits only in
// steps of more than the rows given, and turned off the engine is the float one again.
func TestQuantizeActivationsFP8OnlyPastItsRows(t *testing.T) {
	m := loadModel(t, "../../testdata/llama-tiny")
	prompt := []int32{5, 9, 2, 7, 7, 1, 3, 8, 4, 6, 2, 11}
	run := func(minRows int, tokens []int32) []float32 {
		e := newCPU(t, m, 4, 8)
		e.QuantizeActivationsFP8(minRows, false)
		out := mustStep(t, e, Sequence{ID: 1, Tokens: tokens, Blocks: []int32{0, 1}, ContextLogits: true})
		return out[0].ContextLogits
	}
	ref := run(-1, prompt)
	if q := run(len(prompt), prompt); !slices.Equal(q, ref) {
		t.Fatal("a step of exactly the rows given was rounded")
	}
	q := run(len(prompt)-1, prompt)
	if slices.Equal(q, ref) {
		t.Fatal("a step past the rows given was not rounded")
	}
	var num, den float64
	for i := range q {
		d := float64(q[i] - ref[i])
		num, den = num+d*d, den+float64(ref[i])*float64(ref[i])
	}
	if rel := math.Sqrt(num / den); rel > 0.3 {
		t.Fatalf("rounded logits %.3g (relative L2) from the float ones: more than FP8's rounding", rel)
	}
}

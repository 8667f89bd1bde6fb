package main

import (
	"math"
	"reflect"
	"testing"
)

// TestTopKAndLogSumExp checks the logprob helpers against hand values.
func TestTopKAndLogSumExp(t *testing.T) {
	row := []float32{1, 5, 3, 5, -2}
	for _, c := range []struct {
		k    int
		want []int
	}{
		{3, []int{1, 3, 2}}, // the tie goes to the lower index
		{0, nil},
		{9, []int{1, 3, 2, 0, 4}}, // more than the row: all of it
	} {
		if got := topK(make([]int, 0, c.k+1), row, c.k); !reflect.DeepEqual(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
			t.Errorf("topK(%d) = %v, want %v", c.k, got, c.want)
		}
	}
	if lse := logSumExp([]float32{0, 0}); math.Abs(lse-math.Ln2) > 1e-12 {
		t.Errorf("logSumExp(0, 0) = %v, want ln 2", lse)
	}
	if lse := logSumExp([]float32{float32(math.Inf(-1))}); !math.IsInf(lse, -1) {
		t.Errorf("logSumExp(-Inf) = %v, want -Inf", lse)
	}
}

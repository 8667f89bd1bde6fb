package cpu

import "gollm/model"

// actFP8Group is the width of the column groups an activation row is quantized in.
const actFP8Group = 128

// QuantizeActivationsFP8 makes the engine round the inputs of its attention and MLP
// projections to float8_e4m3fn in steps of more than minRows rows, as the GPU engine's
// FP8 GEMMs on tensor cores do (W8A8): each row in groups of 128 columns, a group's scale
// its largest magnitude / 448. Steps of minRows rows or fewer keep the inputs as they
// are (the GPU's few-row kernels read the weights alone in FP8). It is the reference the
// GPU's many-row FP8 path is tested against; a negative minRows turns it off.
func (e *Engine) QuantizeActivationsFP8(minRows int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.actFP8 = minRows
}

// quantFP8Rows rounds rows in place as QuantizeActivationsFP8 says, where it applies to
// the step's n rows.
func (e *Engine) quantFP8Rows(rows [][]float32) {
	if e.actFP8 < 0 || len(e.s.rows) <= e.actFP8 {
		return
	}
	parallelFor(len(e.s.rows), 1, 8, func(_, lo, hi int) {
		for _, r := range rows[lo:hi] {
			quantFP8Row(r)
		}
	})
}

// quantFP8Row rounds one row, a 128-column group at a time: x · (448 / amax) to the
// nearest e4m3 (saturating), times amax / 448.
func quantFP8Row(r []float32) {
	for g := 0; g < len(r); g += actFP8Group {
		x := r[g:min(g+actFP8Group, len(r))]
		var a float32
		for _, v := range x {
			a = max(a, abs32(v))
		}
		if a == 0 {
			continue
		}
		inv, sc := 448/a, a/448
		for i, v := range x {
			x[i] = model.E4M3ToFloat32(model.Float32ToE4M3(v*inv)) * sc
		}
	}
}

func abs32(v float32) float32 {
	if v < 0 {
		return -v
	}
	return v
}

package cpu

import "gollm/model"

// actFP8Group is the width of the column groups an activation row is quantized in.
const actFP8Group = 128

// QuantizeActivationsFP8 makes the engine round the inputs of its attention and MLP
// projections to float8_e4m3fn in steps of more than minRows rows, as the GPU engine's
// FP8 GEMMs on tensor cores do (W8A8): each row in groups of 128 columns, a group's scale
// its largest magnitude / 448 — or, rowWise, each row as one group, as the GPU does for
// weights with a scale a row (model.Quant.RowScaled; quantization fp8). Steps of minRows
// rows or fewer keep the inputs as they are (the GPU's few-row kernels read the weights
// alone in FP8). It is the reference the GPU's many-row FP8 path is tested against; a
// negative minRows turns it off.
func (e *Engine) QuantizeActivationsFP8(minRows int, rowWise bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.actFP8, e.actFP8Row = minRows, rowWise
}

// quantFP8Rows rounds rows in place as QuantizeActivationsFP8 says, where it applies to
// the step's n rows.
func (e *Engine) quantFP8Rows(rows [][]float32) {
	if e.actFP8 < 0 || len(e.s.rows) <= e.actFP8 {
		return
	}
	group := actFP8Group
	if e.actFP8Row && len(rows) > 0 {
		group = len(rows[0])
	}
	parallelFor(len(e.s.rows), 1, 8, func(_, lo, hi int) {
		for _, r := range rows[lo:hi] {
			quantFP8Row(r, group)
		}
	})
}

// quantFP8Row rounds one row, a group of columns at a time: x · (448 / amax) to the
// nearest e4m3 (saturating), times amax / 448.
func quantFP8Row(r []float32, group int) {
	for g := 0; g < len(r); g += group {
		x := r[g:min(g+group, len(r))]
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

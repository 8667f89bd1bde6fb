package cuda

import (
	"fmt"

	"go.uber.org/zap"

	"gollm/model"
)

// fp8Projection says whether the GPU stores a role in FP8 (cuda/fp8.cuh's projections).
func fp8Projection(r model.Role) bool {
	return r == model.RoleQKV || r == model.RoleOut || r == model.RoleUp || r == model.RoleDown
}

// fp8Weights readies a checkpoint's weights for the arena: with opts.Quantization "fp8"
// the float projections are quantized first (model.QuantizeFP8). The projections stay
// FP8 where the GPU's kernels take them — one GPU, every projection part FP8, columns a
// multiple of 16, scale blocks of whole 128-column groups —; every other FP8 weight (an
// FP8 checkpoint's experts, say, or all of them where the projections cannot stay) is
// dequantized to float32 on the host for the arena to convert. Quantization asked for
// where it cannot be kept is refused.
func fp8Weights(ws []model.Weight, ckpt *model.Checkpoint, size int, opts Options) ([]model.Weight, error) {
	quantize := opts.Quantization == "fp8"
	if quantize {
		var proj []model.Weight
		idx := []int{}
		for i, w := range ws {
			if fp8Projection(w.Role) && !w.FP8() {
				proj = append(proj, w)
				idx = append(idx, i)
			}
		}
		q, err := model.QuantizeFP8(proj)
		if err != nil {
			return nil, err
		}
		for k, i := range idx {
			ws[i] = q[k]
		}
	}
	why := ""
	stored := false
	for _, w := range ws {
		stored = stored || w.FP8()
		if !fp8Projection(w.Role) || why != "" {
			continue
		}
		if w.Cols%16 != 0 {
			why = fmt.Sprintf("%s has %d columns, not a multiple of 16", &w, w.Cols)
		}
		for _, p := range w.Parts {
			switch {
			case p.Scale == nil:
				why = fmt.Sprintf("%s is not stored in FP8", &w)
			case p.BlockCols%128 != 0 && p.BlockCols < w.Cols:
				why = fmt.Sprintf("%s has scale blocks of %d columns, not whole 128-column groups", &w, p.BlockCols)
			}
		}
	}
	if !stored {
		return ws, nil
	}
	if size != 1 && why == "" {
		why = "tensor parallelism splits no FP8 weights yet"
	}
	if quantize && why != "" {
		return nil, fmt.Errorf("quantization fp8: %s", why)
	}
	out := make([]model.Weight, len(ws))
	for i, w := range ws {
		out[i] = w
		if w.FP8() && (why != "" || !fp8Projection(w.Role)) {
			d, err := model.DequantizeFP8([]model.Weight{w})
			if err != nil {
				return nil, err
			}
			out[i] = d[0]
		}
	}
	scheme := "quantization fp8 (128×128 blocks)"
	if q := ckpt.Quant(); q != nil {
		scheme = q.String()
	}
	if why != "" {
		opts.Logger.Info("fp8 weights dequantized to the compute type", zap.String("checkpoint", ckpt.Dir),
			zap.String("quantization", scheme), zap.String("why", why), zap.String("dtype", opts.DType))
	} else {
		opts.Logger.Info("fp8 projections kept in FP8", zap.String("checkpoint", ckpt.Dir),
			zap.String("quantization", scheme), zap.String("dtype", opts.DType))
	}
	return out, nil
}

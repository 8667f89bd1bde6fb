package cpu

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"gollm/model"
)

// WeightFormat is how the CPU engine stores a checkpoint's weight matrices
// (cpu_weight_format): as the checkpoint stores them, widened or narrowed to a float
// type, or quantized at load.
type WeightFormat string

const (
	// FormatAuto keeps each matrix as stored: float32, float16 and bfloat16 matrices (and
	// a GGUF file's quantized ones) are computed on where they lie in the mapping.
	FormatAuto WeightFormat = "auto"
	// FormatF32, FormatF16 and FormatBF16 convert every matrix to that float type.
	FormatF32  WeightFormat = "fp32"
	FormatF16  WeightFormat = "fp16"
	FormatBF16 WeightFormat = "bf16"
	// FormatQ8 quantizes every matrix to Q8_0 (blocks of 32 int8 with an fp16 scale).
	FormatQ8 WeightFormat = "q8_0"
	// FormatQ4K quantizes every matrix to Q4_K (super-blocks of 256 4-bit values with
	// 6-bit sub-block scales and mins), and the LM head to Q6_K, as llama.cpp's Q4_K_M
	// does: the head's error reaches every logit.
	FormatQ4K WeightFormat = "q4_k"
)

// WeightFormats lists the formats ParseWeightFormat accepts.
var WeightFormats = []WeightFormat{FormatAuto, FormatF32, FormatF16, FormatBF16, FormatQ8, FormatQ4K}

// ParseWeightFormat reads a cpu_weight_format value; "" is FormatAuto.
func ParseWeightFormat(s string) (WeightFormat, error) {
	if s == "" {
		return FormatAuto, nil
	}
	if f := WeightFormat(s); slices.Contains(WeightFormats, f) {
		return f, nil
	}
	names := make([]string, len(WeightFormats))
	for i, f := range WeightFormats {
		names[i] = string(f)
	}
	return "", fmt.Errorf("%q is not a weight format (want one of %s)", s, strings.Join(names, ", "))
}

// target is the dtype a matrix of role r and width cols is stored in under f, given the
// dtype it is stored in; a matrix whose rows are not whole blocks of the quantized
// format keeps a finer one.
func (f WeightFormat) target(r model.Role, tied bool, cols int, stored string) string {
	switch f {
	case FormatF32:
		return "F32"
	case FormatF16:
		return "F16"
	case FormatBF16:
		return "BF16"
	case FormatQ8:
		if cols%model.Q8Elems == 0 {
			return model.DTypeQ8_0
		}
	case FormatQ4K:
		head := r == model.RoleLMHead || (tied && r == model.RoleEmbed)
		switch {
		case cols%model.KElems == 0 && head:
			return model.DTypeQ6_K
		case cols%model.KElems == 0:
			return model.DTypeQ4_K
		case cols%model.Q8Elems == 0:
			return model.DTypeQ8_0
		}
	}
	if model.IsQuantized(stored) {
		return stored
	}
	if stored == "F8_E4M3" {
		return "F32" // an FP8 checkpoint's matrix: its weights times their scales
	}
	if f == FormatQ8 || f == FormatQ4K {
		return "F32" // a matrix too narrow to quantize: its stored floats, widened
	}
	return stored
}

// LoadWeights prepares the weights of an open checkpoint in format f. Matrices whose
// stored dtype is the one f asks for, untransposed, are not copied: they are used in
// place in the checkpoint's mapping, and the weights then own the checkpoint and close
// it when released. Otherwise (and always on error) the checkpoint is closed before
// LoadWeights returns. What is converted, quantized or repacked is held outside the Go
// heap (buffers) until the weights are released. Quantizing runs on GOMAXPROCS
// goroutines.
func LoadWeights(c *model.Checkpoint, f WeightFormat) (_ *Weights, err error) {
	mapped := false
	defer func() {
		if err != nil || !mapped {
			if cerr := c.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("cpu: close %s: %w", c.Dir, cerr)
			}
		}
	}()
	if _, err := ParseWeightFormat(string(f)); err != nil {
		return nil, fmt.Errorf("cpu: LoadWeights: %w", err)
	}
	cfg := c.Config
	if err := checkConfig(&cfg); err != nil {
		return nil, fmt.Errorf("cpu: LoadWeights: %w", err)
	}
	ws, err := c.Weights()
	if err != nil {
		return nil, fmt.Errorf("cpu: load %s: %w", c.Dir, err)
	}
	w := newWeights(cfg)
	w.bufs = &buffers{}
	defer func() {
		if err != nil {
			_ = w.bufs.free()
		}
	}()
	for i := range ws {
		mw := &ws[i]
		if !matrixRole(mw.Role) {
			v, err := mw.Float32()
			if err != nil {
				return nil, fmt.Errorf("cpu: load %s: %s: %w", c.Dir, mw, err)
			}
			*w.vectorOf(mw.Role, mw.Layer) = v
			for _, p := range mw.Parts {
				c.Evict(p.Tensor)
			}
			continue
		}
		m, inPlace, err := loadMatrix(mw, f, cfg.TiedHead, w.bufs)
		if err != nil {
			return nil, fmt.Errorf("cpu: load %s: %s: %w", c.Dir, mw, err)
		}
		mapped = mapped || inPlace
		*w.matrixOf(mw.Role, mw.Layer) = m
		// The parts copied out of the mapping leave the resident set (the page cache
		// keeps them), so that a checkpoint quantized at load does not peak at both
		// forms' size.
		for pi, p := range mw.Parts {
			if !sameMemory(p.Tensor.Data, m.parts[pi]) {
				c.Evict(p.Tensor)
			}
		}
	}
	for r := range model.NumRoles {
		if !matrixRole(r) {
			continue
		}
		if !r.PerLayer() {
			if _, _, present := cfg.Shape(r); present && *w.matrixOf(r, -1) == nil {
				return nil, fmt.Errorf("cpu: load %s: %s is missing", c.Dir, r)
			}
			continue
		}
		for l := range cfg.Layers {
			// A sparse layer has experts where a dense one has its MLP.
			if _, _, present := cfg.LayerShape(r, l); present && *w.matrixOf(r, l) == nil {
				return nil, fmt.Errorf("cpu: load %s: layer %d %s is missing", c.Dir, l, r)
			}
		}
	}
	w.finish()
	if mapped {
		w.ckpt = c
	}
	return w, nil
}

// sameMemory says part mp uses the tensor data in place.
func sameMemory(data []byte, mp matPart) bool {
	if len(data) == 0 {
		return false
	}
	switch {
	case len(mp.raw) > 0:
		return &mp.raw[0] == &data[0]
	case len(mp.f32) > 0:
		return unsafe.Pointer(&mp.f32[0]) == unsafe.Pointer(&data[0])
	}
	return false
}

// loadMatrix makes the matrix of weight mw in format f; inPlace says some part points
// into the checkpoint's mapping.
//
// Quantized parts of a matrix the engine multiplies by (all but an embedding that is not
// also the LM head) are stored with their rows interleaved four at a time (matPart.ilv):
// a decode step then streams each group of four rows as one run of memory, where rows
// one after the other are four short streams the hardware's prefetchers follow badly —
// the same repacking llama.cpp does at load. The copy replaces the mapped bytes, whose
// pages the loader then drops.
func loadMatrix(mw *model.Weight, f WeightFormat, tied bool, b *buffers) (m *matrix, inPlace bool, err error) {
	m = &matrix{rows: mw.Rows, cols: mw.Cols}
	products := mw.Role != model.RoleEmbed || tied
	for _, p := range mw.Parts {
		stored := p.Tensor.DType
		want := f.target(mw.Role, tied, mw.Cols, stored)
		fm, ok := formatOf(want)
		if !ok {
			return nil, false, fmt.Errorf("no CPU format for dtype %s", want)
		}
		switch {
		case want != stored || p.Transposed:
			if err := convertPart(m, fm, &p, mw.Cols, b); err != nil {
				return nil, false, err
			}
		case fm == fmtF32:
			v, ok := float32View(p.Tensor.Data)
			if !ok {
				if err := convertPart(m, fm, &p, mw.Cols, b); err != nil {
					return nil, false, err
				}
				break
			}
			if err := m.addPart(fm, p.Rows, nil, v, p.Perm); err != nil {
				return nil, false, err
			}
			inPlace = true
		default:
			if err := m.addPart(fm, p.Rows, p.Tensor.Data, nil, p.Perm); err != nil {
				return nil, false, err
			}
			if fm >= fmtQ8 && products {
				if err := m.parts[len(m.parts)-1].interleave(b); err != nil {
					return nil, false, err
				}
			} else {
				inPlace = true
			}
		}
		if last := &m.parts[len(m.parts)-1]; last.f >= fmtQ8 && products && last.ilv == 0 {
			if err := last.interleave(b); err != nil {
				return nil, false, err
			}
		}
	}
	return m, inPlace, nil
}

// convertPart appends part p converted to format fm, its rows in their canonical order.
func convertPart(m *matrix, fm format, p *model.Part, cols int, b *buffers) error {
	rows := p.Rows
	// The part as float32 rows in canonical order: one row at a time from a row-major
	// tensor, or the whole part at once from a transposed or FP8 one (its block scales).
	var whole []float32
	if p.Transposed || p.Scale != nil {
		var err error
		w := model.Weight{Rows: rows, Cols: cols, Parts: []model.Part{*p}}
		if whole, err = w.Float32(); err != nil {
			return err
		}
	}
	srcBytes := 0
	if whole == nil {
		var err error
		if srcBytes, err = model.RowBytes(p.Tensor.DType, cols); err != nil {
			return err
		}
		if len(p.Tensor.Data) != rows*srcBytes {
			return fmt.Errorf("tensor %s: %d bytes for %d rows of %d bytes", p.Tensor.Name, len(p.Tensor.Data), rows, srcBytes)
		}
	}
	// canon[i] is the stored row that canonical row i comes from.
	canon := make([]int, rows)
	for i := range canon {
		canon[i] = i
	}
	if p.Perm != nil {
		for s, c := range p.Perm {
			canon[c] = s
		}
	}
	rowOf := func(i int, buf []float32) []float32 {
		if whole != nil {
			return whole[i*cols : (i+1)*cols]
		}
		s := canon[i]
		src := p.Tensor.Data[s*srcBytes : (s+1)*srcBytes]
		switch p.Tensor.DType {
		case "F16", "BF16":
			widenRow(src, buf, p.Tensor.DType == "BF16")
		default:
			_ = model.DequantizeRow(p.Tensor.DType, src, buf)
		}
		return buf
	}
	if fm == fmtF32 {
		out, err := b.float32s(rows * cols)
		if err != nil {
			return err
		}
		for i := range rows {
			copy(out[i*cols:], rowOf(i, out[i*cols:(i+1)*cols]))
		}
		return m.addPart(fm, rows, nil, out, nil)
	}
	rb, err := model.RowBytes(fm.String(), cols)
	if err != nil {
		return err
	}
	out, err := b.bytes(rows * rb)
	if err != nil {
		return err
	}
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	errs := make([]error, workers)
	per := (rows + workers - 1) / workers
	for k := range workers {
		lo, hi := k*per, min(rows, (k+1)*per)
		if lo >= hi {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]float32, cols)
			for i := lo; i < hi; i++ {
				if errs[k] = encodeRow(fm, rowOf(i, buf), out[i*rb:(i+1)*rb]); errs[k] != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return m.addPart(fm, rows, out, nil, nil)
}

// encodeRow stores one row of values in fm.
func encodeRow(fm format, v []float32, dst []byte) error {
	switch fm {
	case fmtF16:
		for i, x := range v {
			h := model.Float32ToF16(x)
			dst[2*i], dst[2*i+1] = byte(h), byte(h>>8)
		}
		return nil
	case fmtBF16:
		for i, x := range v {
			h := model.Float32ToBF16(x)
			dst[2*i], dst[2*i+1] = byte(h), byte(h>>8)
		}
		return nil
	}
	return model.QuantizeRow(fm.String(), v, dst)
}

package cpu

import (
	"gollm/engine"
	"gollm/model"
)

// kvFP8 converts keys and values to and from an FP8 KV pool (engine.KVFP8).
type kvFP8 struct {
	// decode is, per layer and kind (keys 0, values 1), every code's real value: its
	// float8_e4m3fn value times the scale.
	decode [][2][256]float32
	// scale is, per layer and kind, the scale a value is divided by before rounding.
	scale [][2]float32
}

// newKVFP8 builds the tables of a model of layers layers from its key and value scales
// (nil: 1 for every layer).
func newKVFP8(k, v []float32, layers int) *kvFP8 {
	f := &kvFP8{decode: make([][2][256]float32, layers), scale: make([][2]float32, layers)}
	for l := range layers {
		f.scale[l] = [2]float32{engine.Scale(k, l), engine.Scale(v, l)}
		for kind := range 2 {
			for c := range 256 {
				f.decode[l][kind][c] = model.E4M3ToFloat32(uint8(c)) * f.scale[l][kind]
			}
		}
	}
	return f
}

// encode stores x as codes: x / scale rounded to nearest even, saturated at ±448.
func (f *kvFP8) encode(dst []uint8, x []float32, layer, kind int) {
	s := f.scale[layer][kind]
	for i, v := range x {
		dst[i] = model.Float32ToE4M3(v / s)
	}
}

// cached returns n consecutive cached floats of layer li's keys (kind 0) or values (1)
// from pool offset at: a view of the float32 pool, or the FP8 codes decoded into tmp.
func (e *Engine) cached(at, n, li, kind int, tmp []float32) []float32 {
	if e.fp8 == nil {
		return e.kv[at : at+n]
	}
	tab := &e.fp8.decode[li][kind]
	out := tmp[:n]
	for i, c := range e.kv8[at : at+n] {
		out[i] = tab[c]
	}
	return out
}

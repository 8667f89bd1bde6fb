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

// stageFP8 decodes into s.stage layer li's keys and values of every block the step's
// rows read (from window's start, or the sequence's, to the row), each block once
// whatever the rows and query heads reading it: attention then runs on float32 as over
// a float32 pool.
func (e *Engine) stageFP8(b *engine.Batch, li, window int) {
	s := &e.s
	T := e.info.TokensPerBlock
	if len(s.staged) < e.info.NumBlocks {
		s.staged = make([]int32, e.info.NumBlocks)
		for i := range s.staged {
			s.staged[i] = -1
		}
	}
	for _, blk := range s.stageList {
		s.staged[blk] = -1
	}
	s.stageList = s.stageList[:0]
	// A sequence's rows are consecutive and in position order: its last row reads the
	// most blocks, from the earliest start of its rows.
	for r := 0; r < len(s.rows); {
		seq, first := s.rows[r].seq, 0
		if window > 0 {
			first = max(0, s.rows[r].pos-window+1)
		}
		last := r
		for last+1 < len(s.rows) && s.rows[last+1].seq == seq {
			last++
		}
		blocks := b.Seqs[seq].Blocks
		for i := first / T; i <= s.rows[last].pos/T; i++ {
			if blk := blocks[i]; s.staged[blk] < 0 {
				s.staged[blk] = int32(len(s.stageList))
				s.stageList = append(s.stageList, blk)
			}
		}
		r = last + 1
	}
	cfg := &e.w.cfg
	per := T * cfg.HeadDim // one (block, kind, kv head)
	n := len(s.stageList) * 2 * cfg.KVHeads
	if cap(s.stage) < n*per {
		s.stage = make([]float32, n*per)
	}
	s.stage = s.stage[:n*per]
	parallelFor(n, 1, 1, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			blk, kind, h := int(s.stageList[i/(2*cfg.KVHeads)]), i/cfg.KVHeads%2, i%cfg.KVHeads
			tab := &e.fp8.decode[li][kind]
			src := e.kv8[e.kvBase(blk, li, kind, h):][:per]
			dst := s.stage[i*per : (i+1)*per]
			for j, c := range src {
				dst[j] = tab[c]
			}
		}
	})
}

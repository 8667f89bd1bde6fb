package model

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Block-quantized weight formats, in GGML's layouts (llama.cpp's GGUF files store them;
// the CPU engine computes on them in place and quantizes float checkpoints into them).
// A matrix row of C values is C/BlockElems blocks back to back; rows follow each other.
//
//	Q8_0 (32 values, 34 bytes): d fp16, q int8[32]; value = d·q.
//	Q4_K (256 values, 144 bytes): d fp16, dmin fp16, scales [12]byte (eight 6-bit
//	  scales and eight 6-bit mins, packed), qs [128]byte (4-bit, two per byte); value of
//	  sub-block j (32 values) = d·sc[j]·q − dmin·m[j]. Bytes 32c..32c+31 of qs hold
//	  sub-block 2c in their low nibbles and 2c+1 in their high ones.
//	Q6_K (256 values, 210 bytes): ql [128]byte (low 4 bits), qh [64]byte (high 2 bits),
//	  scales int8[16], d fp16; value of sub-block k (16 values) = d·scales[k]·(q − 32).
const (
	DTypeQ8_0 = "Q8_0"
	DTypeQ4_K = "Q4_K"
	DTypeQ6_K = "Q6_K"
)

// Block sizes of the formats above.
const (
	// Q8Elems and Q8Bytes are a Q8_0 block's values and bytes.
	Q8Elems, Q8Bytes = 32, 34
	// KElems is a k-quant super-block's values.
	KElems = 256
	// Q4KBytes and Q6KBytes are a Q4_K and a Q6_K super-block's bytes.
	Q4KBytes, Q6KBytes = 144, 210
)

// BlockLayout gives a weight dtype's block: values and bytes per block (1 value for
// the float types). ok is false for a dtype that is not a weight format.
func BlockLayout(dtype string) (elems, bytes int, ok bool) {
	switch dtype {
	case "F32":
		return 1, 4, true
	case "F16", "BF16":
		return 1, 2, true
	case DTypeQ8_0:
		return Q8Elems, Q8Bytes, true
	case DTypeQ4_K:
		return KElems, Q4KBytes, true
	case DTypeQ6_K:
		return KElems, Q6KBytes, true
	}
	return 0, 0, false
}

// IsQuantized says whether dtype is one of the block-quantized formats.
func IsQuantized(dtype string) bool {
	return dtype == DTypeQ8_0 || dtype == DTypeQ4_K || dtype == DTypeQ6_K
}

// RowBytes is the size of a row of cols values in dtype; an error when cols is not a
// whole number of the format's blocks.
func RowBytes(dtype string, cols int) (int, error) {
	elems, bytes, ok := BlockLayout(dtype)
	if !ok {
		return 0, fmt.Errorf("dtype %s is not a weight format (want F32, F16, BF16, Q8_0, Q4_K or Q6_K)", dtype)
	}
	if cols%elems != 0 {
		return 0, fmt.Errorf("%d values per row are not a whole number of %s blocks of %d", cols, dtype, elems)
	}
	return cols / elems * bytes, nil
}

// DequantizeRow writes the values of one row of dtype (src holds exactly the row) into
// dst, whose length is the row's values.
func DequantizeRow(dtype string, src []byte, dst []float32) error {
	n, err := RowBytes(dtype, len(dst))
	if err != nil {
		return err
	}
	if len(src) != n {
		return fmt.Errorf("%d bytes for a %s row of %d values (want %d)", len(src), dtype, len(dst), n)
	}
	switch dtype {
	case "F32":
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case "F16":
		for i := range dst {
			dst[i] = F16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case "BF16":
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	case DTypeQ8_0:
		for b := range len(dst) / Q8Elems {
			blk := src[b*Q8Bytes : (b+1)*Q8Bytes]
			d := F16ToFloat32(binary.LittleEndian.Uint16(blk))
			out := dst[b*Q8Elems : (b+1)*Q8Elems]
			for i := range out {
				out[i] = d * float32(int8(blk[2+i]))
			}
		}
	case DTypeQ4_K:
		for b := range len(dst) / KElems {
			dequantQ4K(src[b*Q4KBytes:(b+1)*Q4KBytes], dst[b*KElems:(b+1)*KElems])
		}
	case DTypeQ6_K:
		for b := range len(dst) / KElems {
			dequantQ6K(src[b*Q6KBytes:(b+1)*Q6KBytes], dst[b*KElems:(b+1)*KElems])
		}
	}
	return nil
}

// Q4KScales unpacks a Q4_K super-block's 12 scale bytes into its eight 6-bit scales and
// eight 6-bit mins: scales and mins 0-3 are the low 6 bits of bytes 0-3 and 4-7; 4-7 take
// their low 4 bits from the nibbles of bytes 8-11 and their top 2 from the top bits of
// bytes 0-3 (scales) and 4-7 (mins).
func Q4KScales(s []byte) (sc, m [8]uint8) {
	for j := range 4 {
		sc[j] = s[j] & 63
		m[j] = s[j+4] & 63
		sc[j+4] = s[j+8]&0x0f | s[j]>>6<<4
		m[j+4] = s[j+8]>>4 | s[j+4]>>6<<4
	}
	return sc, m
}

// dequantQ4K expands one Q4_K super-block into 256 values.
func dequantQ4K(blk []byte, out []float32) {
	d := F16ToFloat32(binary.LittleEndian.Uint16(blk))
	dmin := F16ToFloat32(binary.LittleEndian.Uint16(blk[2:]))
	sc, m := Q4KScales(blk[4:16])
	qs := blk[16:Q4KBytes]
	for j := range 8 {
		chunk := qs[j/2*32 : j/2*32+32]
		shift := uint(j%2) * 4
		ds, dm := d*float32(sc[j]), dmin*float32(m[j])
		for i, q := range chunk {
			out[j*32+i] = ds*float32(q>>shift&0x0f) - dm
		}
	}
}

// Q6KValue returns the 6-bit value (0..63, stored offset by 32) at position p of a Q6_K
// super-block: p = 128c + 32s + l takes the low nibble (s < 2) or the high one of ql[64c +
// 32(s mod 2) + l], and bits 2s and 2s+1 of qh[32c + l] above it.
func Q6KValue(blk []byte, p int) uint8 {
	c, s, l := p/128, p%128/32, p%32
	lo := blk[64*c+32*(s%2)+l]
	if s >= 2 {
		lo >>= 4
	}
	hi := blk[128+32*c+l] >> (2 * s) & 3
	return lo&0x0f | hi<<4
}

// dequantQ6K expands one Q6_K super-block into 256 values.
func dequantQ6K(blk []byte, out []float32) {
	d := F16ToFloat32(binary.LittleEndian.Uint16(blk[208:]))
	for p := range KElems {
		out[p] = d * float32(int8(blk[192+p/16])) * float32(int(Q6KValue(blk, p))-32)
	}
}

// QuantizeRow writes one row of values (a whole number of the format's blocks) in a
// block-quantized dtype into dst (RowBytes long).
func QuantizeRow(dtype string, src []float32, dst []byte) error {
	n, err := RowBytes(dtype, len(src))
	if err != nil {
		return err
	}
	if len(dst) != n {
		return fmt.Errorf("%d bytes for a %s row of %d values (want %d)", len(dst), dtype, len(src), n)
	}
	switch dtype {
	case DTypeQ8_0:
		for b := range len(src) / Q8Elems {
			quantQ8_0(src[b*Q8Elems:(b+1)*Q8Elems], dst[b*Q8Bytes:(b+1)*Q8Bytes])
		}
	case DTypeQ4_K:
		for b := range len(src) / KElems {
			quantQ4K(src[b*KElems:(b+1)*KElems], dst[b*Q4KBytes:(b+1)*Q4KBytes])
		}
	case DTypeQ6_K:
		for b := range len(src) / KElems {
			quantQ6K(src[b*KElems:(b+1)*KElems], dst[b*Q6KBytes:(b+1)*Q6KBytes])
		}
	default:
		return fmt.Errorf("dtype %s is not a quantized format (want Q8_0, Q4_K or Q6_K)", dtype)
	}
	return nil
}

// roundHalfAway rounds to the nearest integer, halves away from zero (C's roundf).
func roundHalfAway(x float32) int {
	if x >= 0 {
		return int(x + 0.5)
	}
	return -int(-x + 0.5)
}

// quantQ8_0 quantizes 32 values symmetrically: d = max|x|/127, q = round(x/d).
func quantQ8_0(x []float32, blk []byte) {
	var amax float32
	for _, v := range x {
		amax = max(amax, math.Float32frombits(math.Float32bits(v)&^(1<<31)))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(blk, Float32ToF16(d))
	for i, v := range x {
		blk[2+i] = byte(int8(max(-127, min(127, roundHalfAway(v*id)))))
	}
}

// fitScaleMin finds, for values x (weighted by w) quantized to 0..nmax as
// x ≈ scale·q − min (min ≥ 0), a scale and min of small weighted squared error: the
// range's own, then the least-squares fit for each of a few nearby scales' rounding,
// keeping the best; q receives the values' quantization under it.
func fitScaleMin(x, w []float32, nmax int, q []uint8) (scale, mn float32) {
	lo, hi := x[0], x[0]
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	lo = min(lo, 0)
	if hi == lo {
		clear(q)
		return 0, -lo
	}
	errOf := func(s, m float32) float32 {
		var e float32
		is := 1 / s
		for i, v := range x {
			qi := max(0, min(nmax, roundHalfAway((v+m)*is)))
			d := s*float32(qi) - m - v
			e += w[i] * d * d
		}
		return e
	}
	bestS, bestM := (hi-lo)/float32(nmax), -lo
	best := errOf(bestS, bestM)
	for step := -2; step <= 3; step++ {
		iscale := (float32(nmax) + 0.25*float32(step)) / (hi - lo)
		// Round with this scale, then solve the weighted least squares for scale and min.
		var sw, swq, swq2, swx, swqx float32
		for i, v := range x {
			qi := float32(max(0, min(nmax, roundHalfAway(iscale*(v-lo)))))
			wi := w[i]
			sw += wi
			swq += wi * qi
			swq2 += wi * qi * qi
			swx += wi * v
			swqx += wi * qi * v
		}
		det := sw*swq2 - swq*swq
		if !(det > 0) {
			continue
		}
		sc := (sw*swqx - swq*swx) / det
		m := (swq2*swx - swq*swqx) / det // x ≈ s·q + m, so the stored min is −m
		if m > 0 {
			m = 0
			sc = swqx / swq2
		}
		if !(sc > 0) {
			continue
		}
		if e := errOf(sc, -m); e < best {
			best, bestS, bestM = e, sc, -m
		}
	}
	is := 1 / bestS
	for i, v := range x {
		q[i] = uint8(max(0, min(nmax, roundHalfAway((v+bestM)*is))))
	}
	return bestS, bestM
}

// quantQ4K quantizes 256 values: each 32-value sub-block gets a fitted scale and min,
// which are then stored as 6-bit multiples of the super-block's d and dmin, and the
// values requantized against the stored ones.
func quantQ4K(x []float32, blk []byte) {
	var scales, mins [8]float32
	q := make([]uint8, KElems)
	w := make([]float32, 32)
	for j := range 8 {
		sub := x[j*32 : (j+1)*32]
		// Weigh each value by its size, as llama.cpp's k-quants do without an imatrix:
		// large weights matter more to the dot products.
		var ss float32
		for _, v := range sub {
			ss += v * v
		}
		av := float32(math.Sqrt(float64(ss / 32)))
		for i, v := range sub {
			w[i] = av + float32(math.Abs(float64(v)))
		}
		scales[j], mins[j] = fitScaleMin(sub, w, 15, q[j*32:(j+1)*32])
	}
	var maxS, maxM float32
	for j := range 8 {
		maxS, maxM = max(maxS, scales[j]), max(maxM, mins[j])
	}
	d, dmin := maxS/63, maxM/63
	var sc, m [8]uint8
	for j := range 8 {
		if d > 0 {
			sc[j] = uint8(min(63, roundHalfAway(scales[j]/d)))
		}
		if dmin > 0 {
			m[j] = uint8(min(63, roundHalfAway(mins[j]/dmin)))
		}
	}
	binary.LittleEndian.PutUint16(blk, Float32ToF16(d))
	binary.LittleEndian.PutUint16(blk[2:], Float32ToF16(dmin))
	s := blk[4:16]
	for j := range 4 {
		s[j] = sc[j] | sc[j+4]>>4<<6
		s[j+4] = m[j] | m[j+4]>>4<<6
		s[j+8] = sc[j+4]&0x0f | m[j+4]&0x0f<<4
	}
	// Requantize against the scales as stored (fp16 d and dmin, 6-bit multiples).
	d, dmin = F16ToFloat32(binary.LittleEndian.Uint16(blk)), F16ToFloat32(binary.LittleEndian.Uint16(blk[2:]))
	for j := range 8 {
		ds, dm := d*float32(sc[j]), dmin*float32(m[j])
		for i := range 32 {
			qi := 0
			if ds > 0 {
				qi = max(0, min(15, roundHalfAway((x[j*32+i]+dm)/ds)))
			}
			q[j*32+i] = uint8(qi)
		}
	}
	qs := blk[16:Q4KBytes]
	for c := range 4 {
		for i := range 32 {
			qs[c*32+i] = q[(2*c)*32+i] | q[(2*c+1)*32+i]<<4
		}
	}
}

// quantQ6K quantizes 256 values: each 16-value sub-block gets the symmetric scale (of a
// few near max|x|/32) of least squared error, stored as an int8 multiple of the
// super-block's d.
func quantQ6K(x []float32, blk []byte) {
	var scales [16]float32
	for k := range 16 {
		sub := x[k*16 : (k+1)*16]
		var amax, vmax float32
		for _, v := range sub {
			if a := float32(math.Abs(float64(v))); a > amax {
				amax, vmax = a, v
			}
		}
		if amax == 0 {
			continue
		}
		best := math.Inf(1)
		for step := -6; step <= 6; step++ {
			// The largest value maps near −32 (the wider side of −32..31).
			s := vmax / (-32 + 0.1*float32(step))
			var e float64
			for _, v := range sub {
				qi := max(-32, min(31, roundHalfAway(v/s)))
				d := float64(s*float32(qi) - v)
				e += d * d
			}
			if e < best {
				best, scales[k] = e, s
			}
		}
	}
	var amax, smax float32
	for _, s := range scales {
		if a := float32(math.Abs(float64(s))); a > amax {
			amax, smax = a, s
		}
	}
	var d float32
	if amax > 0 {
		d = smax / -128
	}
	binary.LittleEndian.PutUint16(blk[208:], Float32ToF16(d))
	d = F16ToFloat32(binary.LittleEndian.Uint16(blk[208:]))
	var sc [16]int8
	for k := range 16 {
		if d != 0 {
			sc[k] = int8(max(-128, min(127, roundHalfAway(scales[k]/d))))
		}
		blk[192+k] = byte(sc[k])
	}
	ql, qh := blk[:128], blk[128:192]
	clear(ql)
	clear(qh)
	for p := range KElems {
		k := p / 16
		q := 32
		if s := d * float32(sc[k]); s != 0 {
			q = max(0, min(63, roundHalfAway(x[p]/s)+32))
		}
		c, sub, l := p/128, p%128/32, p%32
		lo := uint8(q) & 0x0f
		if sub >= 2 {
			lo <<= 4
		}
		ql[64*c+32*(sub%2)+l] |= lo
		qh[32*c+l] |= uint8(q) >> 4 << (2 * sub)
	}
}

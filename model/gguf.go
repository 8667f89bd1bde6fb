package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"sort"

	"golang.org/x/sys/unix"
)

// A GGUF file (llama.cpp's format) is, little-endian: the magic "GGUF", a version (2 or
// 3), the tensor count and the metadata count (uint64 each); the metadata, each a key
// (string), a value type (uint32) and the value; the tensor infos, each a name, a
// dimension count (uint32), the dimensions (uint64, innermost first), a GGML type
// (uint32) and an offset (uint64) into the data region; then, at the next multiple of
// general.alignment (32 by default), the data region. A string is a uint64 length and
// its bytes; an array an element type (uint32), a count (uint64) and the elements.
//
// The file is memory-mapped and read with every length and count checked against the
// bytes left before anything proportional to it is allocated, so a truncated or hostile
// file fails with an error naming what is wrong.

// ggufMagic is "GGUF" read as a little-endian uint32.
const ggufMagic = 0x46554747

// Bounds on a GGUF file's structure beyond what its size already bounds.
const (
	// maxGGUFDims is GGML's GGML_MAX_DIMS.
	maxGGUFDims = 4
	// maxGGUFNesting bounds arrays of arrays.
	maxGGUFNesting = 4
	// maxGGUFAlignment bounds general.alignment.
	maxGGUFAlignment = 1 << 16
)

// GGUF metadata value types.
const (
	ggufU8 uint32 = iota
	ggufI8
	ggufU16
	ggufI16
	ggufU32
	ggufI32
	ggufF32
	ggufBool
	ggufString
	ggufArray
	ggufU64
	ggufI64
	ggufF64
)

// ggufScalarSize is each fixed-size value type's size.
var ggufScalarSize = map[uint32]int{
	ggufU8: 1, ggufI8: 1, ggufU16: 2, ggufI16: 2, ggufU32: 4, ggufI32: 4, ggufF32: 4, ggufBool: 1,
	ggufU64: 8, ggufI64: 8, ggufF64: 8,
}

// ggmlType is one GGML tensor type: its name and its block (values and bytes).
type ggmlType struct {
	name          string
	elems, nbytes int
}

// ggmlTypes are GGML's tensor types by number (ggml.h), with their block sizes, so that
// every tensor's extent is known and checked even where its type is not one gollm
// computes with (those fail when a weight needs them).
var ggmlTypes = map[uint32]ggmlType{
	0: {"F32", 1, 4}, 1: {"F16", 1, 2}, 2: {"Q4_0", 32, 18}, 3: {"Q4_1", 32, 20}, 6: {"Q5_0", 32, 22},
	7: {"Q5_1", 32, 24}, 8: {DTypeQ8_0, Q8Elems, Q8Bytes}, 9: {"Q8_1", 32, 36}, 10: {"Q2_K", 256, 84},
	11: {"Q3_K", 256, 110}, 12: {DTypeQ4_K, KElems, Q4KBytes}, 13: {"Q5_K", 256, 176},
	14: {DTypeQ6_K, KElems, Q6KBytes}, 15: {"Q8_K", 256, 292}, 16: {"IQ2_XXS", 256, 66},
	17: {"IQ2_XS", 256, 74}, 18: {"IQ3_XXS", 256, 98}, 19: {"IQ1_S", 256, 50}, 20: {"IQ4_NL", 32, 18},
	21: {"IQ3_S", 256, 110}, 22: {"IQ2_S", 256, 82}, 23: {"IQ4_XS", 256, 136}, 24: {"I8", 1, 1},
	25: {"I16", 1, 2}, 26: {"I32", 1, 4}, 27: {"I64", 1, 8}, 28: {"F64", 1, 8}, 29: {"IQ1_M", 256, 56},
	30: {"BF16", 1, 2}, 34: {"TQ1_0", 256, 54}, 35: {"TQ2_0", 256, 66}, 39: {"MXFP4", 32, 17},
}

// ggufValue is one metadata value.
type ggufValue struct {
	// typ is its value type.
	typ uint32
	// u holds an unsigned or boolean value, i a signed one, f a float one, s a string.
	u uint64
	i int64
	f float64
	s string
	// arr is an array's contents.
	arr *ggufArr
}

// ggufArr is an array value: strings decoded, numbers kept as stored.
type ggufArr struct {
	// typ is the element type; n the count.
	typ uint32
	n   int
	// raw holds fixed-size elements back to back (in the mapping).
	raw []byte
	// strs holds string elements.
	strs []string
}

// ggufFile is one memory-mapped GGUF file.
type ggufFile struct {
	// path is where it was opened from, for messages.
	path string
	// mapped is the whole file, mapped read-only.
	mapped []byte
	// version is the format version.
	version uint32
	// meta is the metadata by key.
	meta map[string]ggufValue
	// tensors are the tensors by name; their Data point into mapped, their DType is the
	// GGML type's name and their Shape is row-major (the dimensions reversed).
	tensors map[string]*Tensor
}

// ggufReader reads the header of a mapped file, keeping the first error.
type ggufReader struct {
	// b is the file; off the read position.
	b   []byte
	off int
	// err is the first error; what names the field being read, for it.
	err  error
	what string
}

// fail records err unless an error is recorded.
func (r *ggufReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%s: "+format, append([]any{r.what}, args...)...)
	}
}

// take returns the next n bytes, or nil (and an error) when fewer are left.
func (r *ggufReader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)-r.off) {
		r.fail("%d bytes needed at offset %d, but the file ends %d bytes later (truncated?)", n, r.off, len(r.b)-r.off)
		return nil
	}
	v := r.b[r.off : r.off+int(n) : r.off+int(n)]
	r.off += int(n)
	return v
}

func (r *ggufReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *ggufReader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// str reads a string.
func (r *ggufReader) str() string {
	n := r.u64()
	return string(r.take(n))
}

// count reads an element count of elements at least min bytes each, refusing one the
// bytes left cannot hold.
func (r *ggufReader) count(min int) int {
	n := r.u64()
	if r.err == nil && n > uint64(len(r.b)-r.off)/uint64(min) {
		r.fail("a count of %d elements of at least %d bytes each exceeds the %d bytes left", n, min, len(r.b)-r.off)
		return 0
	}
	return int(n)
}

// minSize is the fewest bytes a value of type typ takes.
func minSize(typ uint32) int {
	switch typ {
	case ggufString:
		return 8
	case ggufArray:
		return 12
	}
	return ggufScalarSize[typ]
}

// value reads a value of type typ; depth counts the arrays it is inside.
func (r *ggufReader) value(typ uint32, depth int) ggufValue {
	v := ggufValue{typ: typ}
	switch typ {
	case ggufU8:
		if b := r.take(1); b != nil {
			v.u = uint64(b[0])
		}
	case ggufI8:
		if b := r.take(1); b != nil {
			v.i = int64(int8(b[0]))
		}
	case ggufBool:
		if b := r.take(1); b != nil {
			if b[0] > 1 {
				r.fail("bool value %d is neither 0 nor 1", b[0])
			}
			v.u = uint64(b[0])
		}
	case ggufU16:
		if b := r.take(2); b != nil {
			v.u = uint64(binary.LittleEndian.Uint16(b))
		}
	case ggufI16:
		if b := r.take(2); b != nil {
			v.i = int64(int16(binary.LittleEndian.Uint16(b)))
		}
	case ggufU32:
		v.u = uint64(r.u32())
	case ggufI32:
		v.i = int64(int32(r.u32()))
	case ggufF32:
		v.f = float64(math.Float32frombits(r.u32()))
	case ggufU64:
		v.u = r.u64()
	case ggufI64:
		v.i = int64(r.u64())
	case ggufF64:
		v.f = math.Float64frombits(r.u64())
	case ggufString:
		v.s = r.str()
	case ggufArray:
		if depth >= maxGGUFNesting {
			r.fail("arrays nested more than %d deep", maxGGUFNesting)
			return v
		}
		et := r.u32()
		if r.err == nil && et > ggufF64 {
			r.fail("unknown array element type %d", et)
			return v
		}
		n := r.count(max(1, minSize(et)))
		a := &ggufArr{typ: et, n: n}
		switch et {
		case ggufString:
			a.strs = make([]string, n)
			for i := range a.strs {
				a.strs[i] = r.str()
				if r.err != nil {
					return v
				}
			}
		case ggufArray:
			for range n {
				r.value(ggufArray, depth+1)
				if r.err != nil {
					return v
				}
			}
		default:
			a.raw = r.take(uint64(n) * uint64(ggufScalarSize[et]))
		}
		v.arr = a
	default:
		r.fail("unknown value type %d", typ)
	}
	return v
}

// openGGUF maps path and reads its header: the metadata and every tensor's info, each
// tensor's extent checked to lie in the data region without overlapping another.
func openGGUF(path string) (_ *ggufFile, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mapping outlives the descriptor
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	if size < 24 {
		return nil, fmt.Errorf("%s: %d bytes is too short for a GGUF header", path, size)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("%s: %d bytes does not fit in memory", path, size)
	}
	mapped, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	g := &ggufFile{path: path, mapped: mapped, meta: map[string]ggufValue{}, tensors: map[string]*Tensor{}}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	if err := g.parse(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return g, nil
}

// parse reads the header.
func (g *ggufFile) parse() error {
	r := &ggufReader{b: g.mapped, what: "header"}
	if m := r.u32(); m != ggufMagic {
		return fmt.Errorf("not a GGUF file (magic %#08x, want %#08x \"GGUF\")", m, ggufMagic)
	}
	g.version = r.u32()
	if g.version != 2 && g.version != 3 {
		return fmt.Errorf("GGUF version %d is not supported (2 or 3)", g.version)
	}
	r.what = "tensor count"
	nt := r.count(24) // name length, dimension count, type, offset
	r.what = "metadata count"
	nkv := r.count(13) // key length, value type, one byte of value
	if r.err != nil {
		return r.err
	}
	for i := range nkv {
		r.what = fmt.Sprintf("metadata entry %d", i)
		key := r.str()
		if r.err == nil {
			r.what = fmt.Sprintf("metadata %q", key)
		}
		typ := r.u32()
		v := r.value(typ, 0)
		if r.err != nil {
			return r.err
		}
		if _, dup := g.meta[key]; dup {
			return fmt.Errorf("metadata %q appears twice", key)
		}
		g.meta[key] = v
	}
	align := uint64(32)
	if v, ok := g.meta["general.alignment"]; ok {
		if v.typ != ggufU32 || v.u == 0 || v.u > maxGGUFAlignment || bits.OnesCount64(v.u) != 1 {
			return fmt.Errorf("metadata \"general.alignment\": want a power of two up to %d as uint32, got type %d value %d", maxGGUFAlignment, v.typ, v.u)
		}
		align = v.u
	}
	type info struct {
		name   string
		dims   []uint64
		typ    uint32
		offset uint64
	}
	infos := make([]info, 0, nt)
	for i := range nt {
		r.what = fmt.Sprintf("tensor info %d", i)
		in := info{name: r.str()}
		if r.err == nil {
			r.what = fmt.Sprintf("tensor %s", in.name)
		}
		nd := r.u32()
		if r.err == nil && (nd == 0 || nd > maxGGUFDims) {
			r.fail("%d dimensions (want 1 to %d)", nd, maxGGUFDims)
		}
		if r.err != nil {
			return r.err
		}
		for range nd {
			in.dims = append(in.dims, r.u64())
		}
		in.typ = r.u32()
		in.offset = r.u64()
		if r.err != nil {
			return r.err
		}
		infos = append(infos, in)
	}
	dataStart := (uint64(r.off) + align - 1) / align * align
	if len(infos) == 0 {
		dataStart = min(dataStart, uint64(len(g.mapped))) // a file of metadata alone need not pad
	}
	if dataStart > uint64(len(g.mapped)) {
		return fmt.Errorf("the data region would start at %d, past the file's %d bytes (truncated?)", dataStart, len(g.mapped))
	}
	data := g.mapped[dataStart:]
	type span struct {
		name       string
		begin, end uint64
	}
	spans := make([]span, 0, len(infos))
	for _, in := range infos {
		tt, ok := ggmlTypes[in.typ]
		if !ok {
			return fmt.Errorf("tensor %s: GGML type %d is unknown", in.name, in.typ)
		}
		if in.dims[0]%uint64(tt.elems) != 0 {
			return fmt.Errorf("tensor %s: %d values per row are not a whole number of %s blocks of %d", in.name, in.dims[0], tt.name, tt.elems)
		}
		// The size, each product checked against the data region (which bounds it).
		limit := uint64(len(data))
		var nbytes uint64
		shape := make([]int, len(in.dims))
		for k, d := range in.dims {
			if d == 0 || d > limit {
				return fmt.Errorf("tensor %s: dimension %d is %d (the data region holds %d bytes)", in.name, k, d, limit)
			}
			shape[len(in.dims)-1-k] = int(d)
			if k == 0 {
				nbytes = d / uint64(tt.elems) * uint64(tt.nbytes)
				if nbytes > limit {
					return fmt.Errorf("tensor %s: a row of %d %s values needs more than the data region's %d bytes", in.name, d, tt.name, limit)
				}
				continue
			}
			if nbytes > limit/d {
				return fmt.Errorf("tensor %s: dimensions %v need more than the data region's %d bytes", in.name, in.dims, limit)
			}
			nbytes *= d
		}
		if in.offset%align != 0 {
			return fmt.Errorf("tensor %s: offset %d is not a multiple of the alignment %d", in.name, in.offset, align)
		}
		if in.offset > limit || nbytes > limit-in.offset {
			return fmt.Errorf("tensor %s: %d bytes at offset %d run past the data region's %d bytes (truncated file?)", in.name, nbytes, in.offset, limit)
		}
		if _, dup := g.tensors[in.name]; dup {
			return fmt.Errorf("tensor %s appears twice", in.name)
		}
		end := in.offset + nbytes
		g.tensors[in.name] = &Tensor{Name: in.name, DType: tt.name, Shape: shape, Data: data[in.offset:end:end]}
		spans = append(spans, span{in.name, in.offset, end})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].begin < spans[j].begin })
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return fmt.Errorf("tensors %s and %s overlap", spans[i-1].name, spans[i].name)
		}
	}
	return nil
}

// close unmaps the file.
func (g *ggufFile) close() error {
	if g.mapped == nil {
		return nil
	}
	err := unix.Munmap(g.mapped)
	g.mapped = nil
	if err != nil {
		return fmt.Errorf("munmap %s: %w", g.path, err)
	}
	return nil
}

// errNoKey is wrapped when a metadata key is absent.
var errNoKey = errors.New("missing")

// uint reads a non-negative integer of any integer type.
func (g *ggufFile) uint(key string) (uint64, error) {
	v, ok := g.meta[key]
	if !ok {
		return 0, fmt.Errorf("metadata %q: %w", key, errNoKey)
	}
	switch v.typ {
	case ggufU8, ggufU16, ggufU32, ggufU64:
		return v.u, nil
	case ggufI8, ggufI16, ggufI32, ggufI64:
		if v.i >= 0 {
			return uint64(v.i), nil
		}
		return 0, fmt.Errorf("metadata %q: %d is negative", key, v.i)
	}
	return 0, fmt.Errorf("metadata %q: want an integer, got value type %d", key, v.typ)
}

// float reads a number of any numeric type.
func (g *ggufFile) float(key string) (float64, error) {
	v, ok := g.meta[key]
	if !ok {
		return 0, fmt.Errorf("metadata %q: %w", key, errNoKey)
	}
	switch v.typ {
	case ggufF32, ggufF64:
		return v.f, nil
	case ggufU8, ggufU16, ggufU32, ggufU64:
		return float64(v.u), nil
	case ggufI8, ggufI16, ggufI32, ggufI64:
		return float64(v.i), nil
	}
	return 0, fmt.Errorf("metadata %q: want a number, got value type %d", key, v.typ)
}

// str reads a string.
func (g *ggufFile) str(key string) (string, error) {
	v, ok := g.meta[key]
	if !ok {
		return "", fmt.Errorf("metadata %q: %w", key, errNoKey)
	}
	if v.typ != ggufString {
		return "", fmt.Errorf("metadata %q: want a string, got value type %d", key, v.typ)
	}
	return v.s, nil
}

// boolean reads a bool.
func (g *ggufFile) boolean(key string) (bool, error) {
	v, ok := g.meta[key]
	if !ok {
		return false, fmt.Errorf("metadata %q: %w", key, errNoKey)
	}
	if v.typ != ggufBool {
		return false, fmt.Errorf("metadata %q: want a bool, got value type %d", key, v.typ)
	}
	return v.u == 1, nil
}

// array reads an array of element type typ.
func (g *ggufFile) array(key string, typ uint32) (*ggufArr, error) {
	v, ok := g.meta[key]
	if !ok {
		return nil, fmt.Errorf("metadata %q: %w", key, errNoKey)
	}
	if v.typ != ggufArray || v.arr == nil || v.arr.typ != typ {
		return nil, fmt.Errorf("metadata %q: want an array of value type %d", key, typ)
	}
	return v.arr, nil
}

// f32s is an array of float32.
func (a *ggufArr) f32s() []float32 {
	out := make([]float32, a.n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(a.raw[4*i:]))
	}
	return out
}

// i32s is an array of int32.
func (a *ggufArr) i32s() []int32 {
	out := make([]int32, a.n)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(a.raw[4*i:]))
	}
	return out
}

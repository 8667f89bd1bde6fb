package model

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}})
// and the data region, which the offsets index from its first byte.

// Bounds on what safetensors headers may hold, so that a hostile or corrupt header is
// refused in bounded time and memory, naming the bound, before anything it describes is
// allocated: the header is read entry by entry, never whole into a map.
const (
	// maxHeaderBytes bounds one file's JSON header; the reference implementation refuses
	// more than 100 MB too, and a larger length is a corrupt file, not a big model.
	maxHeaderBytes = 100 << 20
	// maxCheckpointHeaderBytes bounds the headers of all of a checkpoint's files: a
	// released model of 160 shards and 90,000 tensors has 11 MB of them.
	maxCheckpointHeaderBytes = 256 << 20
	// maxTensors bounds a checkpoint's tensors, over all its files: the largest released
	// models (mixtures of hundreds of experts, with FP8 scales) hold under 150,000.
	maxTensors = 1 << 18
	// maxDims bounds a tensor's rank (released checkpoints use at most 5).
	maxDims = 8
)

// headerBudget is what a checkpoint's headers may still hold, spent file by file.
type headerBudget struct {
	// tensors is the number of tensors still allowed.
	tensors int
	// bytes is the header bytes still allowed.
	bytes int64
}

// newHeaderBudget is the budget of one checkpoint.
func newHeaderBudget() *headerBudget {
	return &headerBudget{tensors: maxTensors, bytes: maxCheckpointHeaderBytes}
}

// dtypeSizes gives the element size of each safetensors dtype.
var dtypeSizes = map[string]int{
	"F64": 8, "F32": 4, "F16": 2, "BF16": 2,
	"I64": 8, "I32": 4, "I16": 2, "I8": 1,
	"U64": 8, "U32": 4, "U16": 2, "U8": 1,
	"BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}

// Tensor is one named tensor of a checkpoint, in its stored type and layout.
type Tensor struct {
	// Name is the tensor's name as stored in the file.
	Name string
	// DType is the safetensors type: "F32", "F16", "BF16", "I32", "I64", ….
	DType string
	// Shape is the tensor's shape, row-major; empty for a scalar.
	Shape []int
	// Data is the raw little-endian data. For a tensor of an open Checkpoint it points
	// into the memory-mapped file: read-only, and valid only until Close.
	Data []byte
}

// NumElements is the product of the shape (1 for a scalar).
func (t *Tensor) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Float32 converts an F32, F16 or BF16 tensor to a new float32 slice.
func (t *Tensor) Float32() ([]float32, error) {
	n := t.NumElements()
	if size, ok := dtypeSizes[t.DType]; ok && len(t.Data) != n*size {
		return nil, fmt.Errorf("tensor %s: %d bytes of data for %d %s elements", t.Name, len(t.Data), n, t.DType)
	}
	out := make([]float32, n)
	switch t.DType {
	case "F32":
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
	case "F16":
		for i := range out {
			out[i] = F16ToFloat32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	case "BF16":
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(t.Data[2*i:])) << 16)
		}
	default:
		return nil, fmt.Errorf("tensor %s: dtype %s is not a float type (want F32, F16 or BF16)", t.Name, t.DType)
	}
	return out, nil
}

// Int32 converts an I32 tensor, or an I64 one whose values fit, to a new int32 slice.
func (t *Tensor) Int32() ([]int32, error) {
	n := t.NumElements()
	if size, ok := dtypeSizes[t.DType]; ok && len(t.Data) != n*size {
		return nil, fmt.Errorf("tensor %s: %d bytes of data for %d %s elements", t.Name, len(t.Data), n, t.DType)
	}
	out := make([]int32, n)
	switch t.DType {
	case "I32":
		for i := range out {
			out[i] = int32(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
	case "I64":
		for i := range out {
			v := int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
			if v < math.MinInt32 || v > math.MaxInt32 {
				return nil, fmt.Errorf("tensor %s: element %d = %d does not fit in int32", t.Name, i, v)
			}
			out[i] = int32(v)
		}
	default:
		return nil, fmt.Errorf("tensor %s: dtype %s is not an integer type (want I32 or I64)", t.Name, t.DType)
	}
	return out, nil
}

// NewFloatTensor encodes float32 values as an F32, F16 or BF16 tensor (rounding to
// nearest even), for writing checkpoints.
func NewFloatTensor(name, dtype string, shape []int, values []float32) (*Tensor, error) {
	t := &Tensor{Name: name, DType: dtype, Shape: append([]int(nil), shape...)}
	if n := t.NumElements(); n != len(values) {
		return nil, fmt.Errorf("tensor %s: shape %v holds %d elements, got %d values", name, shape, n, len(values))
	}
	switch dtype {
	case "F32":
		t.Data = make([]byte, 4*len(values))
		for i, v := range values {
			binary.LittleEndian.PutUint32(t.Data[4*i:], math.Float32bits(v))
		}
	case "F16":
		t.Data = make([]byte, 2*len(values))
		for i, v := range values {
			binary.LittleEndian.PutUint16(t.Data[2*i:], Float32ToF16(v))
		}
	case "BF16":
		t.Data = make([]byte, 2*len(values))
		for i, v := range values {
			binary.LittleEndian.PutUint16(t.Data[2*i:], Float32ToBF16(v))
		}
	default:
		return nil, fmt.Errorf("tensor %s: cannot encode float32 as dtype %s (want F32, F16 or BF16)", name, dtype)
	}
	return t, nil
}

// F16ToFloat32 decodes an IEEE 754 half-precision value.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch exp {
	case 0x1f: // infinity or NaN: keep the payload
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case 0: // zero or subnormal: mant × 2^-24, exact in float32
		f := float32(mant) / (1 << 24)
		if sign != 0 {
			f = -f
		}
		return f
	default: // rebias the exponent from 15 to 127
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	}
}

// Float32ToF16 encodes a float32 as IEEE 754 half precision, rounding to nearest even;
// values beyond the half range become infinities.
func Float32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 // a quiet NaN
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e > 0 {
		// Normal: keep the top 10 mantissa bits and round on the 13 dropped ones; a carry
		// out of the mantissa correctly bumps the exponent (up to infinity).
		h := uint32(e)<<10 | mant>>13
		rem := mant & 0x1fff
		if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	// Subnormal half: the value is m × 2^-24 with m = full >> shift.
	full := mant | 0x800000
	shift := uint32(14 - e)
	if shift > 24 {
		return sign
	}
	m := full >> shift
	rem := full & (1<<shift - 1)
	halfway := uint32(1) << (shift - 1)
	if rem > halfway || (rem == halfway && m&1 == 1) {
		m++
	}
	return sign | uint16(m)
}

// Float32ToBF16 encodes a float32 as bfloat16, rounding to nearest even.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40 // keep NaN a (quiet) NaN
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// stFile is one memory-mapped safetensors file.
type stFile struct {
	// path is where the file was opened from, for messages.
	path string
	// mapped is the whole file, mapped read-only; nil for an empty mapping.
	mapped []byte
	// tensors are the file's tensors, by stored name; their Data point into mapped.
	tensors map[string]*Tensor
	// metadata holds the header's __metadata__ strings.
	metadata map[string]string
}

// stEntry is one tensor's entry in a safetensors header.
type stEntry struct {
	// DType names the element type (F32, F16, BF16, …).
	DType string `json:"dtype"`
	// Shape lists the tensor's dimensions, outermost first.
	Shape []int `json:"shape"`
	// Offsets are [begin, end) byte offsets into the data region.
	Offsets []int64 `json:"data_offsets"`
}

// openSafetensors maps path read-only and validates its header (openSafetensorsWithin)
// under a budget of its own.
func openSafetensors(path string) (*stFile, error) {
	return openSafetensorsWithin(path, newHeaderBudget())
}

// openSafetensorsWithin maps path read-only and validates its header, spending budget:
// every tensor's dtype is known, its rank at most maxDims, its offsets inside the data
// region, its byte size product(shape) times the element size, no name appears twice
// and no two tensors overlap.
func openSafetensorsWithin(path string, budget *headerBudget) (_ *stFile, err error) {
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
	if size < 8 {
		return nil, fmt.Errorf("%s: %d bytes is too short for a safetensors header", path, size)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("%s: %d bytes does not fit in memory", path, size)
	}
	mapped, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	st := &stFile{path: path, mapped: mapped}
	defer func() {
		if err != nil {
			st.close()
		}
	}()
	n := binary.LittleEndian.Uint64(mapped)
	switch {
	case n > uint64(size-8):
		return nil, fmt.Errorf("%s: header length %d exceeds the file's %d bytes (truncated or not safetensors)", path, n, size)
	case n > maxHeaderBytes:
		return nil, fmt.Errorf("%s: header of %d bytes is over the bound of %d bytes (100 MiB) on one file's safetensors header", path, n, maxHeaderBytes)
	case int64(n) > budget.bytes:
		return nil, fmt.Errorf("%s: header of %d bytes takes the checkpoint's headers over the bound of %d bytes (256 MiB) on all its files' headers",
			path, n, maxCheckpointHeaderBytes)
	}
	budget.bytes -= int64(n)
	data := mapped[8+n:]
	st.tensors = map[string]*Tensor{}
	type span struct {
		name       string
		begin, end int64
	}
	var spans []span
	err = readHeader(mapped[8:8+n], func(name string, dec *json.Decoder) error {
		if name == "__metadata__" {
			if st.metadata != nil {
				return errors.New("__metadata__ appears twice")
			}
			if err := dec.Decode(&st.metadata); err != nil {
				return fmt.Errorf("__metadata__ must map strings to strings: %w", err)
			}
			return nil
		}
		if _, dup := st.tensors[name]; dup {
			return fmt.Errorf("tensor %s appears twice", name)
		}
		if budget.tensors == 0 {
			return fmt.Errorf("more than %d tensors in the checkpoint, the bound on a checkpoint's tensors (the largest released models hold under 150,000)", maxTensors)
		}
		budget.tensors--
		var e stEntryIn
		if err := dec.Decode(&e); err != nil {
			return fmt.Errorf("tensor %s: bad header entry: %w", name, err)
		}
		elem, ok := dtypeSizes[e.DType]
		if !ok {
			return fmt.Errorf("tensor %s: unknown dtype %q", name, e.DType)
		}
		if len(e.Offsets) != 2 {
			return fmt.Errorf("tensor %s: data_offsets must be [begin, end], got %v", name, e.Offsets)
		}
		want := int64(elem)
		for _, d := range e.Shape {
			if d < 0 {
				return fmt.Errorf("tensor %s: negative dimension in shape %v", name, e.Shape)
			}
			if d > 0 && want > math.MaxInt64/int64(d) {
				return fmt.Errorf("tensor %s: shape %v overflows", name, e.Shape)
			}
			want *= int64(d)
		}
		begin, end := e.Offsets[0], e.Offsets[1]
		if begin < 0 || end < begin || end > int64(len(data)) {
			return fmt.Errorf("tensor %s: data_offsets [%d, %d] outside the %d-byte data region (truncated file?)",
				name, begin, end, len(data))
		}
		if end-begin != want {
			return fmt.Errorf("tensor %s: data_offsets span %d bytes but shape %v of %s needs %d",
				name, end-begin, e.Shape, e.DType, want)
		}
		st.tensors[name] = &Tensor{Name: name, DType: e.DType, Shape: e.Shape, Data: data[begin:end:end]}
		spans = append(spans, span{name, begin, end})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].begin < spans[j].begin })
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return nil, fmt.Errorf("%s: tensors %s and %s overlap", path, spans[i-1].name, spans[i].name)
		}
	}
	return st, nil
}

// readHeader walks a header's top-level object, calling entry with each key and the
// decoder positioned at its value, which entry must consume.
func readHeader(header []byte, entry func(name string, dec *json.Decoder) error) error {
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.DisallowUnknownFields()
	notJSON := func(err error) error { return fmt.Errorf("header is not valid JSON: %w", err) }
	tok, err := dec.Token()
	if err != nil {
		return notJSON(err)
	}
	if tok != json.Delim('{') {
		return notJSON(fmt.Errorf("it is %v, not an object", tok))
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return notJSON(err)
		}
		name, ok := tok.(string)
		if !ok {
			return notJSON(fmt.Errorf("key %v", tok))
		}
		if err := entry(name, dec); err != nil {
			var se *json.SyntaxError
			if errors.As(err, &se) || errors.Is(err, io.ErrUnexpectedEOF) {
				return notJSON(err)
			}
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return notJSON(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return notJSON(errors.New("data after the header's object"))
	}
	return nil
}

// stEntryIn is one tensor's entry in a header being read: stEntry with its arrays
// bounded before they are decoded.
type stEntryIn struct {
	// DType is the element type.
	DType string `json:"dtype"`
	// Shape is the tensor's shape, at most maxDims long.
	Shape boundedInts `json:"shape"`
	// Offsets are [begin, end) byte offsets into the data region.
	Offsets offsetPair `json:"data_offsets"`
}

// boundedInts is a shape of at most maxDims dimensions.
type boundedInts []int

// UnmarshalJSON refuses more than maxDims numbers before it allocates them.
func (b *boundedInts) UnmarshalJSON(raw []byte) error {
	if bytes.Count(raw, []byte(",")) >= maxDims {
		return fmt.Errorf("shape has more than %d dimensions, the bound on a tensor's rank", maxDims)
	}
	return json.Unmarshal(raw, (*[]int)(b))
}

// offsetPair is data_offsets, read only when it is short enough to be [begin, end].
type offsetPair []int64

// UnmarshalJSON refuses a long array before it allocates it.
func (o *offsetPair) UnmarshalJSON(raw []byte) error {
	if bytes.Count(raw, []byte(",")) > 1 {
		return errors.New("data_offsets must be [begin, end]")
	}
	return json.Unmarshal(raw, (*[]int64)(o))
}

// close unmaps the file.
func (st *stFile) close() error {
	if st.mapped == nil {
		return nil
	}
	err := unix.Munmap(st.mapped)
	st.mapped = nil
	if err != nil {
		return fmt.Errorf("munmap %s: %w", st.path, err)
	}
	return nil
}

// WriteSafetensors writes tensors, in the given order, and metadata to a safetensors
// file. It writes a temporary file beside path and renames it, so a reader never sees a
// half-written file.
func WriteSafetensors(path string, tensors []*Tensor, metadata map[string]string) (err error) {
	header := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var offset int64
	for _, t := range tensors {
		if t.Name == "" || t.Name == "__metadata__" {
			return fmt.Errorf("write %s: invalid tensor name %q", path, t.Name)
		}
		if _, dup := header[t.Name]; dup {
			return fmt.Errorf("write %s: tensor %s appears twice", path, t.Name)
		}
		elem, ok := dtypeSizes[t.DType]
		if !ok {
			return fmt.Errorf("write %s: tensor %s: unknown dtype %q", path, t.Name, t.DType)
		}
		if want := t.NumElements() * elem; len(t.Data) != want {
			return fmt.Errorf("write %s: tensor %s: %d bytes of data, shape %v of %s needs %d",
				path, t.Name, len(t.Data), t.Shape, t.DType, want)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{} // a scalar's shape is [], not null
		}
		end := offset + int64(len(t.Data))
		header[t.Name] = stEntry{DType: t.DType, Shape: shape, Offsets: []int64{offset, end}}
		offset = end
	}
	js, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("write %s: encode header: %w", path, err)
	}
	// Pad the header with spaces so the data region starts 8-byte aligned, as the
	// reference writer does; readers may then view the data in place.
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w := bufio.NewWriterSize(tmp, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(js)))
	w.Write(lenBuf[:])
	w.Write(js)
	for _, t := range tensors {
		w.Write(t.Data)
	}
	// bufio keeps the first write error and returns it from Flush.
	if err := w.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ErrTensorNotFound is wrapped by Checkpoint.Tensor when the checkpoint holds no tensor
// of that name.
var ErrTensorNotFound = errors.New("tensor not found")

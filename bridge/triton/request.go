package triton

/*
#include "api.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Tensor is a copy of one input tensor of a request, in Go memory.
type Tensor struct {
	// Name matches one of the model's inputs in config.pbtxt.
	Name string
	// DataType is its element type.
	DataType DataType
	// Shape is its shape, batch dimension first when the model batches.
	Shape []int64
	// Data holds its bytes, all buffers gathered (BYTES elements each with a 4-byte
	// little-endian length prefix, as Triton passes them).
	Data []byte
}

// Request is a TRITONBACKEND_Request.
type Request struct {
	// p is Triton's object.
	p *C.TRITONBACKEND_Request
}

// RequestsFrom copies the request pointers out of the array Triton passed to
// TRITONBACKEND_ModelInstanceExecute (the array itself is Triton's).
func RequestsFrom(p unsafe.Pointer, n uint32) []Request {
	if n == 0 || p == nil {
		return nil
	}
	ptrs := unsafe.Slice((**C.TRITONBACKEND_Request)(p), n)
	rs := make([]Request, n)
	for i, r := range ptrs {
		rs[i] = Request{p: r}
	}
	return rs
}

// ID returns the request's id string, "" when the client gave none.
func (r Request) ID() string {
	var id *C.char
	if goError(C.gt_TRITONBACKEND_RequestId(r.p, &id)) != nil || id == nil {
		return ""
	}
	return C.GoString(id)
}

// Inputs copies every input tensor of the request into Go memory.
func (r Request) Inputs() ([]Tensor, error) {
	var n C.uint32_t
	if err := goError(C.gt_TRITONBACKEND_RequestInputCount(r.p, &n)); err != nil {
		return nil, fmt.Errorf("input count: %w", err)
	}
	ts := make([]Tensor, 0, n)
	for i := C.uint32_t(0); i < n; i++ {
		var (
			in      *C.TRITONBACKEND_Input
			name    *C.char
			dtype   C.int
			shape   *C.int64_t
			dims    C.uint32_t
			size    C.uint64_t
			buffers C.uint32_t
		)
		if err := goError(C.gt_input_info(r.p, i, &in, &name, &dtype, &shape, &dims, &size, &buffers)); err != nil {
			return nil, fmt.Errorf("input %d: %w", i, err)
		}
		t := Tensor{Name: C.GoString(name), DataType: DataType(dtype), Shape: make([]int64, dims)}
		if dims > 0 {
			for j, d := range unsafe.Slice((*int64)(unsafe.Pointer(shape)), dims) {
				t.Shape[j] = d
			}
		}
		t.Data = make([]byte, size)
		var dst unsafe.Pointer
		if size > 0 {
			dst = unsafe.Pointer(&t.Data[0])
		}
		if err := goError(C.gt_input_copy(in, buffers, dst, size)); err != nil {
			return nil, fmt.Errorf("input %q: %w", t.Name, err)
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// RequestedOutputs returns the names of the outputs the client asked for; none means
// the client left the choice to the model.
func (r Request) RequestedOutputs() ([]string, error) {
	var n C.uint32_t
	if err := goError(C.gt_TRITONBACKEND_RequestOutputCount(r.p, &n)); err != nil {
		return nil, fmt.Errorf("requested output count: %w", err)
	}
	names := make([]string, 0, n)
	for i := C.uint32_t(0); i < n; i++ {
		var name *C.char
		if err := goError(C.gt_TRITONBACKEND_RequestOutputName(r.p, i, &name)); err != nil {
			return nil, fmt.Errorf("requested output %d: %w", i, err)
		}
		names = append(names, C.GoString(name))
	}
	return names, nil
}

// Release gives the request back to Triton; it must not be used afterwards.
func (r Request) Release() error {
	if err := goError(C.gt_TRITONBACKEND_RequestRelease(r.p, C.uint32_t(releaseAll))); err != nil {
		return fmt.Errorf("release request: %w", err)
	}
	return nil
}

package triton

/*
#include <stdlib.h>
#include "api.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// ResponseFactory is a TRITONBACKEND_ResponseFactory: it makes a request's responses
// after the request itself has been released.
type ResponseFactory struct {
	// p is Triton's object.
	p *C.TRITONBACKEND_ResponseFactory
}

// NewResponseFactory makes the response factory of a request; Delete frees it.
func NewResponseFactory(r Request) (ResponseFactory, error) {
	var f *C.TRITONBACKEND_ResponseFactory
	if err := goError(C.gt_TRITONBACKEND_ResponseFactoryNew(&f, r.p)); err != nil {
		return ResponseFactory{}, fmt.Errorf("new response factory: %w", err)
	}
	return ResponseFactory{p: f}, nil
}

// SendFlags sends flags (ResponseFinal) without a response.
func (f ResponseFactory) SendFlags(flags uint32) error {
	if err := goError(C.gt_TRITONBACKEND_ResponseFactorySendFlags(f.p, C.uint32_t(flags))); err != nil {
		return fmt.Errorf("send response flags: %w", err)
	}
	return nil
}

// IsCancelled says whether Triton has cancelled the request (the client went away or
// cancelled it).
func (f ResponseFactory) IsCancelled() (bool, error) {
	var c C.bool
	if err := goError(C.gt_TRITONBACKEND_ResponseFactoryIsCancelled(f.p, &c)); err != nil {
		return false, fmt.Errorf("is cancelled: %w", err)
	}
	return bool(c), nil
}

// Delete frees the factory.
func (f ResponseFactory) Delete() error {
	if err := goError(C.gt_TRITONBACKEND_ResponseFactoryDelete(f.p)); err != nil {
		return fmt.Errorf("delete response factory: %w", err)
	}
	return nil
}

// Cancelled sets cancelled[i] to whether factories[i]'s request is cancelled, in one
// crossing into C; cancelled must be as long as factories.
func Cancelled(factories []ResponseFactory, cancelled []bool) error {
	if len(factories) == 0 {
		return nil
	}
	if len(cancelled) < len(factories) {
		return fmt.Errorf("cancelled: %d results for %d factories", len(cancelled), len(factories))
	}
	// ResponseFactory is a struct of one C pointer, so the slice is an array of them.
	err := goError(C.gt_factories_cancelled((**C.TRITONBACKEND_ResponseFactory)(unsafe.Pointer(&factories[0])),
		C.size_t(len(factories)), (*C.bool)(unsafe.Pointer(&cancelled[0]))))
	if err != nil {
		return fmt.Errorf("is cancelled: %w", err)
	}
	return nil
}

// Response is a TRITONBACKEND_Response under construction; Send or Delete ends it.
type Response struct {
	// p is Triton's object.
	p *C.TRITONBACKEND_Response
}

// NewResponse begins a response on a factory.
func NewResponse(f ResponseFactory) (Response, error) {
	var r *C.TRITONBACKEND_Response
	if err := goError(C.gt_TRITONBACKEND_ResponseNewFromFactory(&r, f.p)); err != nil {
		return Response{}, fmt.Errorf("new response: %w", err)
	}
	return Response{p: r}, nil
}

// AddOutput adds an output tensor and copies data (its bytes, row-major; BYTES elements
// length-prefixed) into it.
func (r Response) AddOutput(name string, dtype DataType, shape []int64, data []byte) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var shp *C.int64_t
	if len(shape) > 0 {
		shp = (*C.int64_t)(unsafe.Pointer(&shape[0]))
	}
	var src unsafe.Pointer
	if len(data) > 0 {
		src = unsafe.Pointer(&data[0])
	}
	err := goError(C.gt_response_output(r.p, cname, C.int(dtype), shp, C.uint32_t(len(shape)), src, C.uint64_t(len(data))))
	if err != nil {
		return fmt.Errorf("output %q: %w", name, err)
	}
	return nil
}

// Send sends the response, with flags (ResponseFinal for the last) and, when err is not
// nil, as an error response with CodeOf(err)'s code. The response is Triton's
// afterwards, even when Send fails.
func (r Response) Send(flags uint32, err error) error {
	cerr := cError(err)
	if cerr != nil {
		defer C.gt_TRITONSERVER_ErrorDelete(cerr)
	}
	if serr := goError(C.gt_TRITONBACKEND_ResponseSend(r.p, C.uint32_t(flags), cerr)); serr != nil {
		return fmt.Errorf("send response: %w", serr)
	}
	return nil
}

// Delete drops a response that will not be sent.
func (r Response) Delete() error {
	if err := goError(C.gt_TRITONBACKEND_ResponseDelete(r.p)); err != nil {
		return fmt.Errorf("delete response: %w", err)
	}
	return nil
}

// SendRequestError answers a request with err as its one, final response, made from
// the request itself: for when its response factory cannot be made.
func SendRequestError(r Request, err error) error {
	var resp *C.TRITONBACKEND_Response
	if nerr := goError(C.gt_TRITONBACKEND_ResponseNew(&resp, r.p)); nerr != nil {
		return fmt.Errorf("new response: %w", nerr)
	}
	cerr := cError(err)
	if cerr != nil {
		defer C.gt_TRITONSERVER_ErrorDelete(cerr)
	}
	if serr := goError(C.gt_TRITONBACKEND_ResponseSend(resp, C.uint32_t(ResponseFinal), cerr)); serr != nil {
		return fmt.Errorf("send response: %w", serr)
	}
	return nil
}

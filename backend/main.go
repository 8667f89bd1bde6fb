// Command backend is gollm's Triton backend, built with -buildmode=c-shared into
// libtriton_gollm.so. This file holds the exported TRITONBACKEND_* entry points: thin
// wrappers that turn Triton's pointers into bridge/triton types, call the Go side, and
// turn an error — or a panic, which must never reach tritonserver — into a Triton error.
// The configuration parameters and tensors are described in README.md.
package main

/*
#include <stdint.h>

// Opaque Triton types of the exported signatures (bridge/triton declares the rest).
typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONBACKEND_Backend TRITONBACKEND_Backend;
typedef struct TRITONBACKEND_Model TRITONBACKEND_Model;
typedef struct TRITONBACKEND_ModelInstance TRITONBACKEND_ModelInstance;
typedef struct TRITONBACKEND_Request TRITONBACKEND_Request;
*/
import "C"

import (
	"fmt"
	"os"
	"runtime/debug"
	"unsafe"

	"gollm/bridge/triton"
)

// main is never called: the package is a shared library.
func main() {}

// cError converts a Go error into an owned Triton error for Triton to take.
func cError(err error) *C.TRITONSERVER_Error {
	return (*C.TRITONSERVER_Error)(triton.NewCError(err))
}

// guard turns a panic in an entry point into a Triton error in *ret. It must be
// deferred directly.
func guard(entry string, ret **C.TRITONSERVER_Error) {
	p := recover()
	if p == nil {
		return
	}
	err := fmt.Errorf("gollm: %s: internal error: %v", entry, p)
	if log := currentLogger(); log != nil {
		log.Sugar().Errorw("panic in "+entry, "panic", p, "stack", string(debug.Stack()))
	} else {
		fmt.Fprintf(os.Stderr, "%v\n%s", err, debug.Stack())
	}
	*ret = cError(triton.WithCode(triton.CodeInternal, err))
}

//export TRITONBACKEND_Initialize
func TRITONBACKEND_Initialize(backend *C.TRITONBACKEND_Backend) (ret *C.TRITONSERVER_Error) {
	defer guard("TRITONBACKEND_Initialize", &ret)
	return cError(initialize(triton.BackendFrom(unsafe.Pointer(backend))))
}

//export TRITONBACKEND_Finalize
func TRITONBACKEND_Finalize(backend *C.TRITONBACKEND_Backend) (ret *C.TRITONSERVER_Error) {
	defer guard("TRITONBACKEND_Finalize", &ret)
	return cError(finalize(triton.BackendFrom(unsafe.Pointer(backend))))
}

//export TRITONBACKEND_ModelInitialize
func TRITONBACKEND_ModelInitialize(model *C.TRITONBACKEND_Model) (ret *C.TRITONSERVER_Error) {
	defer guard("TRITONBACKEND_ModelInitialize", &ret)
	return cError(modelInitialize(triton.ModelFrom(unsafe.Pointer(model))))
}

//export TRITONBACKEND_ModelFinalize
func TRITONBACKEND_ModelFinalize(model *C.TRITONBACKEND_Model) (ret *C.TRITONSERVER_Error) {
	defer guard("TRITONBACKEND_ModelFinalize", &ret)
	return cError(modelFinalize(triton.ModelFrom(unsafe.Pointer(model))))
}

//export TRITONBACKEND_ModelInstanceInitialize
func TRITONBACKEND_ModelInstanceInitialize(instance *C.TRITONBACKEND_ModelInstance) (ret *C.TRITONSERVER_Error) {
	defer guard("TRITONBACKEND_ModelInstanceInitialize", &ret)
	return cError(instanceInitialize(triton.InstanceFrom(unsafe.Pointer(instance))))
}

//export TRITONBACKEND_ModelInstanceFinalize
func TRITONBACKEND_ModelInstanceFinalize(instance *C.TRITONBACKEND_ModelInstance) (ret *C.TRITONSERVER_Error) {
	defer guard("TRITONBACKEND_ModelInstanceFinalize", &ret)
	return cError(instanceFinalize(triton.InstanceFrom(unsafe.Pointer(instance))))
}

//export TRITONBACKEND_ModelInstanceExecute
func TRITONBACKEND_ModelInstanceExecute(instance *C.TRITONBACKEND_ModelInstance, requests **C.TRITONBACKEND_Request, count C.uint32_t) (ret *C.TRITONSERVER_Error) {
	defer guard("TRITONBACKEND_ModelInstanceExecute", &ret)
	return cError(instanceExecute(triton.InstanceFrom(unsafe.Pointer(instance)),
		triton.RequestsFrom(unsafe.Pointer(requests), uint32(count))))
}

package triton

/*
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "api.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime/cgo"
	"sync"
	"time"
	"unsafe"
)

// The API versions this package is written against (tritonserver 2.51, r24.10).
const (
	BackendAPIMajor = C.GT_BACKEND_API_MAJOR
	BackendAPIMinor = C.GT_BACKEND_API_MINOR
	ServerAPIMajor  = C.GT_SERVER_API_MAJOR
	ServerAPIMinor  = C.GT_SERVER_API_MINOR
)

// Resolve looks up every Triton function this package calls in the running process. It
// must succeed before any other call here; calling it again is harmless.
func Resolve() error {
	if missing := C.gt_resolve(); missing != nil {
		return Errorf(CodeUnsupported, "this tritonserver lacks %s, which gollm needs", C.GoString(missing))
	}
	return nil
}

// CheckAPIVersions compares the backend and server API versions Triton reports with the
// ones this package was written against: the majors must be equal and Triton's minors
// at least as high.
func CheckAPIVersions() error {
	var major, minor C.uint32_t
	if err := goError(C.gt_TRITONBACKEND_ApiVersion(&major, &minor)); err != nil {
		return fmt.Errorf("read the backend API version: %w", err)
	}
	if err := compatible("backend", uint32(major), uint32(minor), BackendAPIMajor, BackendAPIMinor); err != nil {
		return err
	}
	if err := goError(C.gt_TRITONSERVER_ApiVersion(&major, &minor)); err != nil {
		return fmt.Errorf("read the server API version: %w", err)
	}
	return compatible("server", uint32(major), uint32(minor), ServerAPIMajor, ServerAPIMinor)
}

// compatible says whether Triton's API version major.minor serves a backend built for
// wantMajor.wantMinor.
func compatible(api string, major, minor, wantMajor, wantMinor uint32) error {
	if major != wantMajor || minor < wantMinor {
		return Errorf(CodeUnsupported,
			"tritonserver's %s API version is %d.%d; gollm needs %d.%d or a later %d.x (tritonserver 2.51 / r24.10 or newer)",
			api, major, minor, wantMajor, wantMinor, wantMajor)
	}
	return nil
}

// goError turns an error Triton returned into *Error and deletes the C object; nil
// stays nil.
func goError(e *C.TRITONSERVER_Error) error {
	if e == nil {
		return nil
	}
	code := Code(C.gt_TRITONSERVER_ErrorCode(e))
	msg := C.GoString(C.gt_TRITONSERVER_ErrorMessage(e))
	C.gt_TRITONSERVER_ErrorDelete(e)
	return &Error{Code: code, Err: errors.New(msg)}
}

// cError makes a Triton error object of err (nil for nil); the caller owns it.
func cError(err error) *C.TRITONSERVER_Error {
	if err == nil {
		return nil
	}
	msg := C.CString(err.Error())
	defer C.free(unsafe.Pointer(msg))
	return C.gt_TRITONSERVER_ErrorNew(C.int(CodeOf(err)), msg)
}

// NewCError makes a Triton error object of err (nil for nil), with CodeOf's code, for an
// exported TRITONBACKEND_* function to return: Triton takes ownership.
func NewCError(err error) unsafe.Pointer {
	return unsafe.Pointer(cError(err))
}

// clock relates Go's monotonic clock to CLOCK_MONOTONIC, the clock Triton's statistics
// use, so that Now needs no cgo call.
var clock struct {
	once sync.Once
	base uint64
	at   time.Time
}

// Now returns the current time in nanoseconds on Triton's statistics clock.
func Now() uint64 {
	clock.once.Do(func() {
		clock.at = time.Now()
		clock.base = uint64(C.gt_monotonic_ns())
	})
	return clock.base + uint64(time.Since(clock.at))
}

// Backend is a TRITONBACKEND_Backend.
type Backend struct {
	// p is Triton's object.
	p *C.TRITONBACKEND_Backend
}

// BackendFrom wraps the pointer Triton passed to TRITONBACKEND_Initialize.
func BackendFrom(p unsafe.Pointer) Backend { return Backend{p: (*C.TRITONBACKEND_Backend)(p)} }

// Name returns the backend's name.
func (b Backend) Name() (string, error) {
	var name *C.char
	if err := goError(C.gt_TRITONBACKEND_BackendName(b.p, &name)); err != nil {
		return "", fmt.Errorf("backend name: %w", err)
	}
	return C.GoString(name), nil
}

// Model is a TRITONBACKEND_Model.
type Model struct {
	// p is Triton's object.
	p *C.TRITONBACKEND_Model
}

// ModelFrom wraps the pointer Triton passed to TRITONBACKEND_ModelInitialize.
func ModelFrom(p unsafe.Pointer) Model { return Model{p: (*C.TRITONBACKEND_Model)(p)} }

// Name returns the model's name.
func (m Model) Name() (string, error) {
	var name *C.char
	if err := goError(C.gt_TRITONBACKEND_ModelName(m.p, &name)); err != nil {
		return "", fmt.Errorf("model name: %w", err)
	}
	return C.GoString(name), nil
}

// Version returns the model's version.
func (m Model) Version() (uint64, error) {
	var v C.uint64_t
	if err := goError(C.gt_TRITONBACKEND_ModelVersion(m.p, &v)); err != nil {
		return 0, fmt.Errorf("model version: %w", err)
	}
	return uint64(v), nil
}

// RepositoryPath returns the model's folder in the model repository
// (<repository>/<model name>).
func (m Model) RepositoryPath() (string, error) {
	var kind C.int
	var loc *C.char
	if err := goError(C.gt_TRITONBACKEND_ModelRepository(m.p, &kind, &loc)); err != nil {
		return "", fmt.Errorf("model repository: %w", err)
	}
	if kind != artifactFilesystem {
		return "", Errorf(CodeUnsupported, "model artifacts of type %d: gollm reads models from the file system only", int(kind))
	}
	return C.GoString(loc), nil
}

// ConfigJSON returns the model configuration as Triton's JSON (config version 1).
func (m Model) ConfigJSON() ([]byte, error) {
	var msg *C.TRITONSERVER_Message
	if err := goError(C.gt_TRITONBACKEND_ModelConfig(m.p, 1, &msg)); err != nil {
		return nil, fmt.Errorf("model config: %w", err)
	}
	defer C.gt_TRITONSERVER_MessageDelete(msg)
	var base *C.char
	var size C.size_t
	if err := goError(C.gt_TRITONSERVER_MessageSerializeToJson(msg, &base, &size)); err != nil {
		return nil, fmt.Errorf("serialize the model config: %w", err)
	}
	return C.GoBytes(unsafe.Pointer(base), C.int(size)), nil
}

// SetState attaches v to the model (replacing and freeing any earlier state); State
// returns it. ClearState must be called in TRITONBACKEND_ModelFinalize.
func (m Model) SetState(v any) error {
	m.ClearState()
	h := cgo.NewHandle(v)
	if err := goError(C.gt_model_set_state(m.p, C.uintptr_t(h))); err != nil {
		h.Delete()
		return fmt.Errorf("set model state: %w", err)
	}
	return nil
}

// State returns what SetState attached, or nil.
func (m Model) State() any {
	var h C.uintptr_t
	if goError(C.gt_model_state(m.p, &h)) != nil || h == 0 {
		return nil
	}
	return cgo.Handle(h).Value()
}

// ClearState detaches and frees the model's state.
func (m Model) ClearState() {
	var h C.uintptr_t
	if goError(C.gt_model_state(m.p, &h)) != nil || h == 0 {
		return
	}
	cgo.Handle(h).Delete()
	_ = goError(C.gt_model_set_state(m.p, 0))
}

// ModelInstance is a TRITONBACKEND_ModelInstance.
type ModelInstance struct {
	// p is Triton's object.
	p *C.TRITONBACKEND_ModelInstance
}

// InstanceFrom wraps the pointer Triton passed to TRITONBACKEND_ModelInstance*.
func InstanceFrom(p unsafe.Pointer) ModelInstance {
	return ModelInstance{p: (*C.TRITONBACKEND_ModelInstance)(p)}
}

// Name returns the instance's name.
func (i ModelInstance) Name() (string, error) {
	var name *C.char
	if err := goError(C.gt_TRITONBACKEND_ModelInstanceName(i.p, &name)); err != nil {
		return "", fmt.Errorf("instance name: %w", err)
	}
	return C.GoString(name), nil
}

// Kind returns the instance's kind (KIND_CPU, KIND_GPU, …).
func (i ModelInstance) Kind() (InstanceKind, error) {
	var k C.int
	if err := goError(C.gt_TRITONBACKEND_ModelInstanceKind(i.p, &k)); err != nil {
		return 0, fmt.Errorf("instance kind: %w", err)
	}
	return InstanceKind(k), nil
}

// DeviceID returns the instance's device (the GPU for KIND_GPU).
func (i ModelInstance) DeviceID() (int, error) {
	var id C.int32_t
	if err := goError(C.gt_TRITONBACKEND_ModelInstanceDeviceId(i.p, &id)); err != nil {
		return 0, fmt.Errorf("instance device: %w", err)
	}
	return int(id), nil
}

// Model returns the instance's model.
func (i ModelInstance) Model() (Model, error) {
	var m *C.TRITONBACKEND_Model
	if err := goError(C.gt_TRITONBACKEND_ModelInstanceModel(i.p, &m)); err != nil {
		return Model{}, fmt.Errorf("instance model: %w", err)
	}
	return Model{p: m}, nil
}

// SetState attaches v to the instance (replacing and freeing any earlier state).
// ClearState must be called in TRITONBACKEND_ModelInstanceFinalize.
func (i ModelInstance) SetState(v any) error {
	i.ClearState()
	h := cgo.NewHandle(v)
	if err := goError(C.gt_instance_set_state(i.p, C.uintptr_t(h))); err != nil {
		h.Delete()
		return fmt.Errorf("set instance state: %w", err)
	}
	return nil
}

// State returns what SetState attached, or nil.
func (i ModelInstance) State() any {
	var h C.uintptr_t
	if goError(C.gt_instance_state(i.p, &h)) != nil || h == 0 {
		return nil
	}
	return cgo.Handle(h).Value()
}

// ClearState detaches and frees the instance's state.
func (i ModelInstance) ClearState() {
	var h C.uintptr_t
	if goError(C.gt_instance_state(i.p, &h)) != nil || h == 0 {
		return
	}
	cgo.Handle(h).Delete()
	_ = goError(C.gt_instance_set_state(i.p, 0))
}

// Timestamps are the points of a request's execution that Triton's statistics record,
// in nanoseconds on Now's clock.
type Timestamps struct {
	// ExecStart is when Execute began handling the request.
	ExecStart uint64
	// ComputeStart is when its inputs were read.
	ComputeStart uint64
	// ComputeEnd is when its work was handed over (queued for the batch manager).
	ComputeEnd uint64
	// ExecEnd is when Execute was done with it.
	ExecEnd uint64
}

// ReportStatistics records a request's statistics; it must come before the request is
// released.
func (i ModelInstance) ReportStatistics(r Request, success bool, ts Timestamps) error {
	err := goError(C.gt_TRITONBACKEND_ModelInstanceReportStatistics(i.p, r.p, C.bool(success),
		C.uint64_t(ts.ExecStart), C.uint64_t(ts.ComputeStart), C.uint64_t(ts.ComputeEnd), C.uint64_t(ts.ExecEnd)))
	if err != nil {
		return fmt.Errorf("report statistics: %w", err)
	}
	return nil
}

// ReportBatchStatistics records the execution of a batch of n requests (Triton's
// execution count).
func (i ModelInstance) ReportBatchStatistics(n int, ts Timestamps) error {
	err := goError(C.gt_TRITONBACKEND_ModelInstanceReportBatchStatistics(i.p, C.uint64_t(n),
		C.uint64_t(ts.ExecStart), C.uint64_t(ts.ComputeStart), C.uint64_t(ts.ComputeEnd), C.uint64_t(ts.ExecEnd)))
	if err != nil {
		return fmt.Errorf("report batch statistics: %w", err)
	}
	return nil
}

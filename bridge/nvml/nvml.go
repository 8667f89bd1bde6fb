// Package nvml reads NVIDIA GPUs' state — memory, utilization, power, temperature, the
// processes holding memory — from NVML (libnvidia-ml.so.1, part of the driver), for
// gollm's per-GPU metrics and its messages about GPU memory.
//
// The library is opened with dlopen when Open is first called, as github.com/NVIDIA/go-nvml
// does, so a program using this package loads and runs on a machine without the driver;
// Open fails there. go-nvml itself is not used: it leaves NVML's symbols to the dynamic
// loader, and tritonserver opens backends with RTLD_NOW, so a backend linked with it does
// not load at all where libnvidia-ml is absent. This package looks up the dozen functions
// it calls with dlsym instead.
package nvml

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// LibraryName is the file name of NVML.
const LibraryName = "libnvidia-ml.so.1"

// NVML's return codes that this package tells apart.
const (
	codeSuccess         = 0
	codeNotSupported    = 3
	codeInsufficient    = 7
	codeFunctionMissing = 13
)

// Lib is an initialized NVML. Close it when done; NVML counts the inits.
type Lib struct {
	// p points at the C shim's state for this Lib.
	p unsafe.Pointer
	// mu serializes calls (NVML is thread-safe, the shim's state is read-only; the
	// mutex makes Close safe against calls in flight).
	mu sync.Mutex
}

// Open loads NVML from path ("" for LibraryName on the loader's search path) and
// initializes it. Without the driver it fails, naming the library.
func Open(path string) (*Lib, error) {
	if path == "" {
		path = LibraryName
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cerr *C.char
	var code C.int
	p := C.gn_open(cpath, &cerr, &code)
	if p == nil {
		msg := C.GoString(cerr)
		if code != 0 {
			return nil, fmt.Errorf("nvml: %s: nvmlInit_v2: %s (code %d)", path, msg, int(code))
		}
		return nil, fmt.Errorf("nvml: cannot load %s (no NVIDIA driver?): %s", path, msg)
	}
	return &Lib{p: p}, nil
}

// Close shuts NVML down. Later calls do nothing.
func (l *Lib) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.p == nil {
		return nil
	}
	rc := C.gn_close(l.p)
	l.p = nil
	if rc != codeSuccess {
		return fmt.Errorf("nvml: nvmlShutdown: code %d", int(rc))
	}
	return nil
}

// errClosed is returned by the calls on a closed Lib.
var errClosed = errors.New("nvml: the library is closed")

// call runs f with the library state, under the mutex.
func (l *Lib) call(op string, f func(p unsafe.Pointer) C.int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.p == nil {
		return errClosed
	}
	if rc := f(l.p); rc != codeSuccess {
		return &Error{Op: op, Code: int(rc), Message: C.GoString(C.gn_error(l.p, rc))}
	}
	return nil
}

// Error is a failed NVML call.
type Error struct {
	// Op names the NVML function that failed.
	Op string
	// Code is its nvmlReturn_t.
	Code int
	// Message is nvmlErrorString's.
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("nvml: %s: %s (code %d)", e.Op, e.Message, e.Code) }

// Unsupported says the device does not offer the query (power on some boards, say) or
// the driver lacks the function.
func Unsupported(err error) bool {
	var e *Error
	return errors.As(err, &e) && (e.Code == codeNotSupported || e.Code == codeFunctionMissing)
}

// Device is one GPU.
type Device struct {
	// l is its library.
	l *Lib
	// h is NVML's handle.
	h C.gn_device
	// UUID is the device's UUID ("GPU-…").
	UUID string
}

// DeviceByUUID finds the GPU with uuid, as CUDA reports it (cudaDeviceProp.uuid): NVML's
// indices follow PCI order and CUDA's (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES) need not.
func (l *Lib) DeviceByUUID(uuid string) (*Device, error) {
	cu := C.CString(uuid)
	defer C.free(unsafe.Pointer(cu))
	d := &Device{l: l, UUID: uuid}
	if err := l.call("nvmlDeviceGetHandleByUUID", func(p unsafe.Pointer) C.int { return C.gn_device_by_uuid(p, cu, &d.h) }); err != nil {
		return nil, fmt.Errorf("GPU %s: %w", uuid, err)
	}
	return d, nil
}

// Name returns the device's name.
func (d *Device) Name() (string, error) {
	var buf [96]C.char
	err := d.l.call("nvmlDeviceGetName", func(p unsafe.Pointer) C.int { return C.gn_device_name(p, d.h, &buf[0], C.uint(len(buf))) })
	if err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// Reading is one sample of a device.
type Reading struct {
	// MemoryTotal and MemoryUsed are bytes (every process's use, and the driver's).
	MemoryTotal, MemoryUsed uint64
	// Utilization is the share of the last sample period in which a kernel ran, 0..1;
	// HasUtilization is false when the device does not say.
	Utilization    float64
	HasUtilization bool
	// PowerWatts is the board's power draw; HasPower is false when it does not say.
	PowerWatts float64
	HasPower   bool
	// TemperatureC is the GPU's temperature; HasTemperature is false when it does not say.
	TemperatureC   float64
	HasTemperature bool
}

// Read samples the device. Memory must be readable; the rest is left out where the
// device does not support it (Unsupported), and other failures are returned.
func (d *Device) Read() (Reading, error) {
	var r Reading
	var m C.gn_memory
	if err := d.l.call("nvmlDeviceGetMemoryInfo", func(p unsafe.Pointer) C.int { return C.gn_memory_info(p, d.h, &m) }); err != nil {
		return r, err
	}
	r.MemoryTotal, r.MemoryUsed = uint64(m.total), uint64(m.used)
	var errs []error
	optional := func(err error, has *bool) {
		switch {
		case err == nil:
			*has = true
		case !Unsupported(err):
			errs = append(errs, err)
		}
	}
	var u C.gn_utilization
	optional(d.l.call("nvmlDeviceGetUtilizationRates", func(p unsafe.Pointer) C.int { return C.gn_utilization_rates(p, d.h, &u) }), &r.HasUtilization)
	r.Utilization = float64(u.gpu) / 100
	var mw C.uint
	optional(d.l.call("nvmlDeviceGetPowerUsage", func(p unsafe.Pointer) C.int { return C.gn_power_usage(p, d.h, &mw) }), &r.HasPower)
	r.PowerWatts = float64(mw) / 1000
	var temp C.uint
	optional(d.l.call("nvmlDeviceGetTemperature", func(p unsafe.Pointer) C.int { return C.gn_temperature(p, d.h, &temp) }), &r.HasTemperature)
	r.TemperatureC = float64(temp)
	return r, errors.Join(errs...)
}

// Process is a process holding memory on a device.
type Process struct {
	// PID is its process id.
	PID int
	// Name is its executable ("" if NVML cannot say).
	Name string
	// UsedBytes is its memory on the device; HasUsed is false where NVML cannot say (in
	// some containers).
	UsedBytes uint64
	HasUsed   bool
}

// Processes lists the compute processes holding memory on the device.
func (d *Device) Processes() ([]Process, error) {
	n := C.uint(16)
	for range 4 {
		buf := make([]C.gn_process, n)
		count := n
		err := d.l.call("nvmlDeviceGetComputeRunningProcesses_v3", func(p unsafe.Pointer) C.int {
			return C.gn_processes(p, d.h, &count, (*C.gn_process)(unsafe.Pointer(&buf[0])))
		})
		var e *Error
		if errors.As(err, &e) && e.Code == codeInsufficient {
			n = count + 8
			continue
		}
		if err != nil {
			return nil, err
		}
		out := make([]Process, 0, count)
		for _, pi := range buf[:count] {
			p := Process{PID: int(pi.pid)}
			// NVML_VALUE_NOT_AVAILABLE is all ones.
			if pi.used_gpu_memory != ^C.ulonglong(0) {
				p.UsedBytes, p.HasUsed = uint64(pi.used_gpu_memory), true
			}
			var name [256]C.char
			if d.l.call("nvmlSystemGetProcessName", func(lp unsafe.Pointer) C.int {
				return C.gn_process_name(lp, pi.pid, &name[0], C.uint(len(name)))
			}) == nil {
				p.Name = C.GoString(&name[0])
			}
			out = append(out, p)
		}
		return out, nil
	}
	return nil, errors.New("nvml: the process list keeps growing")
}

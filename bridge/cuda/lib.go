// Package cuda runs gollm's CUDA engine (libgollm_cuda.so, built from cuda/) behind the
// engine.Engine interface. It is the only Go code that calls cuda/.
//
// The library is opened with dlopen when the first GPU engine is made, so a program that
// imports this package (the Triton backend) loads and runs on a machine with no GPU and no
// CUDA libraries; only NewEngine fails there, with the loader's message. It is looked up
// in this order: Options.Library, $GOLLM_CUDA_LIB, the folder of the binary or shared
// library this package is linked into (the backend's folder under tritonserver), then the
// dynamic loader's search path.
package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/../../cuda
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "trampoline.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"
)

// LibraryName is the file name of the CUDA engine library.
const LibraryName = "libgollm_cuda.so"

// EnvLibrary names the environment variable that overrides where the library is found.
const EnvLibrary = "GOLLM_CUDA_LIB"

// lib holds the opened library's entry points.
type lib struct {
	// path is the file that was opened.
	path string
	// handle is dlopen's handle.
	handle unsafe.Pointer
	// abiVersion … engineDestroy are the gollm_* functions.
	abiVersion, deviceCount, weightsCreate, weightsRelease unsafe.Pointer
	engineCreate, step, launch, wait, engineDestroy        unsafe.Pointer
	engineReset, deviceInfo, weightsBytes                  unsafe.Pointer
	// ncclDescribe … commRelease are ABI 7's tensor-parallel calls.
	ncclDescribe, commCreateAll, commAbort, commRelease unsafe.Pointer
}

var (
	// libMu guards libs.
	libMu sync.Mutex
	// libs caches opened libraries by the path asked for ("" for the default search).
	libs = map[string]*lib{}
)

// candidates lists where to look for the library, in order.
func candidates(explicit string) []string {
	if explicit != "" {
		return []string{explicit}
	}
	var out []string
	if env := os.Getenv(EnvLibrary); env != "" {
		out = append(out, env)
	}
	if self := C.gollm_self_path(); self != nil {
		out = append(out, filepath.Join(filepath.Dir(C.GoString(self)), LibraryName))
	}
	return append(out, LibraryName)
}

// openLib opens (once) and checks the engine library.
func openLib(explicit string) (*lib, error) {
	libMu.Lock()
	defer libMu.Unlock()
	if l, ok := libs[explicit]; ok {
		return l, nil
	}
	var errs []error
	for _, path := range candidates(explicit) {
		if path != LibraryName {
			if _, err := os.Stat(path); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", path, err))
				continue
			}
		}
		cpath := C.CString(path)
		h := C.gollm_open(cpath)
		C.free(unsafe.Pointer(cpath))
		if h == nil {
			errs = append(errs, fmt.Errorf("dlopen %s: %s", path, C.GoString(C.gollm_dlerror())))
			continue
		}
		l := &lib{path: path, handle: h}
		if err := l.resolve(); err != nil {
			return nil, fmt.Errorf("cuda: %s: %w", path, err)
		}
		if v := C.call_abi_version(l.abiVersion); v != C.GOLLM_ABI_VERSION {
			return nil, fmt.Errorf("cuda: %s has ABI version %d, this build expects %d", path, int(v), C.GOLLM_ABI_VERSION)
		}
		libs[explicit] = l
		return l, nil
	}
	return nil, fmt.Errorf("cuda: cannot load %s (set %s to its path): %w", LibraryName, EnvLibrary, errors.Join(errs...))
}

// preloadDeps opens the libraries in dir that libgollm_cuda.so links by soname
// (cuBLAS 13), so that it loads in a process whose loader path lacks them — the tests'
// on a machine that has them only in .deps. Ones missing are skipped.
func preloadDeps(dir string) {
	for _, name := range []string{"libcublasLt.so.13", "libcublas.so.13"} {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err != nil {
			continue
		}
		cpath := C.CString(path)
		C.gollm_open(cpath)
		C.free(unsafe.Pointer(cpath))
	}
}

// resolve looks up every entry point.
func (l *lib) resolve() error {
	for _, s := range []struct {
		name string
		dst  *unsafe.Pointer
	}{
		{"gollm_abi_version", &l.abiVersion},
		{"gollm_device_count", &l.deviceCount},
		{"gollm_weights_create", &l.weightsCreate},
		{"gollm_weights_release", &l.weightsRelease},
		{"gollm_engine_create", &l.engineCreate},
		{"gollm_step", &l.step},
		{"gollm_launch", &l.launch},
		{"gollm_wait", &l.wait},
		{"gollm_engine_destroy", &l.engineDestroy},
		{"gollm_engine_reset", &l.engineReset},
		{"gollm_device_describe", &l.deviceInfo},
		{"gollm_weights_bytes", &l.weightsBytes},
		{"gollm_nccl_describe", &l.ncclDescribe},
		{"gollm_comm_create_all", &l.commCreateAll},
		{"gollm_comm_abort", &l.commAbort},
		{"gollm_comm_release", &l.commRelease},
	} {
		cname := C.CString(s.name)
		p := C.gollm_sym(l.handle, cname)
		C.free(unsafe.Pointer(cname))
		if p == nil {
			return fmt.Errorf("symbol %s not found", s.name)
		}
		*s.dst = p
	}
	return nil
}

// Error is an error reported by the CUDA library.
type Error struct {
	// Code is the gollm_code.
	Code int
	// Op names the call that failed.
	Op string
	// Message is the library's description.
	Message string
}

// Error codes of gollm.h.
const (
	CodeInvalidArgument = 1
	CodeCUDA            = 2
	CodeCUBLAS          = 3
	CodeOutOfMemory     = 4
	CodeInternal        = 5
	CodeAllMasked       = 6
	// CodeNCCL: NCCL is missing or failed, or the communicators were aborted (ABI 7).
	CodeNCCL = 7
)

func (e *Error) Error() string {
	kind := map[int]string{CodeInvalidArgument: "invalid argument", CodeCUDA: "CUDA error",
		CodeCUBLAS: "cuBLAS error", CodeOutOfMemory: "out of memory", CodeInternal: "internal error",
		CodeAllMasked: "every token masked", CodeNCCL: "NCCL error"}[e.Code]
	if kind == "" {
		kind = fmt.Sprintf("code %d", e.Code)
	}
	return fmt.Sprintf("cuda: %s: %s: %s", e.Op, kind, e.Message)
}

// statusErr converts a gollm_status into an error (nil on success).
func statusErr(op string, code C.int32_t, st *C.gollm_status) error {
	if code == C.GOLLM_OK {
		return nil
	}
	return &Error{Code: int(code), Op: op, Message: C.GoString(&st.message[0])}
}

// DeviceCount returns the number of CUDA devices, loading the library from path (""
// for the default search).
func DeviceCount(path string) (int, error) {
	l, err := openLib(path)
	if err != nil {
		return 0, err
	}
	var n C.int32_t
	var st C.gollm_status
	if err := statusErr("gollm_device_count", C.call_device_count(l.deviceCount, &n, &st), &st); err != nil {
		return 0, err
	}
	return int(n), nil
}

// DeviceInfo describes a CUDA device.
type DeviceInfo struct {
	// Ordinal is the CUDA device ordinal.
	Ordinal int
	// Name is the device's name ("NVIDIA H100 80GB HBM3").
	Name string
	// UUID is "GPU-…", as NVML and nvidia-smi show it.
	UUID string
	// PCIBusID is the device's PCI address.
	PCIBusID string
	// Free and Total are its memory in bytes when asked.
	Free, Total int64
}

// Device describes CUDA device ordinal (making its primary context current), loading
// the library from path ("" for the default search).
func Device(path string, ordinal int) (DeviceInfo, error) {
	l, err := openLib(path)
	if err != nil {
		return DeviceInfo{}, err
	}
	var d C.gollm_device_info
	var st C.gollm_status
	if err := statusErr("gollm_device_describe", C.call_device_info(l.deviceInfo, C.int32_t(ordinal), &d, &st), &st); err != nil {
		return DeviceInfo{}, err
	}
	return DeviceInfo{Ordinal: ordinal, Name: C.GoString(&d.name[0]), UUID: C.GoString(&d.uuid[0]),
		PCIBusID: C.GoString(&d.pci_bus_id[0]), Free: int64(d.free_bytes), Total: int64(d.total_bytes)}, nil
}

// ncclPath is $GOLLM_NCCL_LIB as a C string (empty: the loader's search), for the
// caller to free.
func ncclPath() *C.char { return C.CString(os.Getenv(EnvNCCL)) }

// NCCLInfo describes the NCCL library tensor parallelism uses.
type NCCLInfo struct {
	// Version is NCCL's version code (22703 for 2.27.3).
	Version int
	// Path is what was opened: $GOLLM_NCCL_LIB, else libnccl.so.2 from the loader's path.
	Path string
}

// NCCL opens NCCL through the engine library loaded from path ("" for the default
// search) and describes it. It needs no GPU: it says whether tensor parallelism can run
// here, and which NCCL it would use.
func NCCL(path string) (NCCLInfo, error) {
	l, err := openLib(path)
	if err != nil {
		return NCCLInfo{}, err
	}
	var d C.gollm_nccl_info
	var st C.gollm_status
	nl := ncclPath()
	defer C.free(unsafe.Pointer(nl))
	if err := statusErr("gollm_nccl_describe", C.call_nccl_describe(l.ncclDescribe, nl, &d, &st), &st); err != nil {
		return NCCLInfo{}, err
	}
	return NCCLInfo{Version: int(d.version), Path: C.GoString(&d.path[0])}, nil
}

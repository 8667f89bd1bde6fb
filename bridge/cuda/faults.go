package cuda

/*
#include <stdlib.h>
#include "trampoline.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"
)

// The switches that inject failures into the CUDA engine (gollm_faults), so that the
// failure paths of the engine, this package and the backend run on a real GPU. They are
// read when weights or an engine are made — by the backend too, so that tritonserver's
// environment reaches its GPU instances (tests/gpu/ops_check.sh).
const (
	// EnvFailStep is "N" (the engine's Nth step fails once after its work is enqueued),
	// "N:lost" (a kernel of it traps: the context is lost) or "N:early" (it fails before
	// any of its work is enqueued).
	EnvFailStep = "GOLLM_CUDA_FAIL_STEP"
	// EnvFailRank makes only this tensor-parallel rank fail.
	EnvFailRank = "GOLLM_CUDA_FAIL_RANK"
	// EnvFailAlloc fails, as out of memory, every device allocation whose purpose contains
	// its text ("weights", "KV pool", "logits", …).
	EnvFailAlloc = "GOLLM_CUDA_FAIL_ALLOC"
	// EnvNCCL is the path of libnccl.so.2 to open for tensor parallelism (default: the
	// loader's search path).
	EnvNCCL = "GOLLM_NCCL_LIB"
)

// faults are the injected failures of gollm_faults.
type faults struct {
	// step > 0 fails the engine's step-th step; mode is a gollm_fail_mode.
	step, mode int
	// rank is the tensor-parallel rank that fails (-1: every one).
	rank int
	// alloc fails the allocations whose purpose contains it ("": none).
	alloc string
}

// faultsFromEnv reads the fault switches; a malformed one is an error naming it.
func faultsFromEnv() (faults, error) {
	f := faults{rank: -1, alloc: os.Getenv(EnvFailAlloc)}
	if v := os.Getenv(EnvFailStep); v != "" {
		num, mode, _ := strings.Cut(v, ":")
		n, err := strconv.Atoi(num)
		switch {
		case err != nil || n < 1 || n > 1<<30:
			return f, fmt.Errorf("%s=%s: want N, N:lost or N:early, with N >= 1 the step that fails", EnvFailStep, v)
		case mode == "lost":
			f.mode = C.GOLLM_FAIL_LOST
		case mode == "early":
			f.mode = C.GOLLM_FAIL_EARLY
		case mode != "" || strings.HasSuffix(v, ":"):
			return f, fmt.Errorf("%s=%s: want N, N:lost or N:early, with N >= 1 the step that fails", EnvFailStep, v)
		}
		f.step = n
	}
	if v := os.Getenv(EnvFailRank); v != "" {
		r, err := strconv.Atoi(v)
		if err != nil || r < 0 || r > 64 {
			return f, fmt.Errorf("%s=%s: want the tensor-parallel rank that fails, 0 to 64", EnvFailRank, v)
		}
		f.rank = r
	}
	return f, nil
}

// c is f as gollm_faults; its fail_alloc is C memory the caller frees with free.
func (f faults) c() C.gollm_faults {
	out := C.gollm_faults{fail_step: C.int32_t(f.step), fail_mode: C.int32_t(f.mode), fail_rank: C.int32_t(f.rank)}
	if f.alloc != "" {
		out.fail_alloc = C.CString(f.alloc)
	}
	return out
}

// freeFaults releases the C string of a gollm_faults made by faults.c.
func freeFaults(f *C.gollm_faults) {
	if f.fail_alloc != nil {
		C.free(unsafe.Pointer(f.fail_alloc))
		f.fail_alloc = nil
	}
}

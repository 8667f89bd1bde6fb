package cuda

// #include <stdlib.h>
// #include "trampoline.h"
import "C"

import (
	"fmt"
	"time"
	"unsafe"
)

// AllReduceMethod is how AllReduceComm.Run all-reduces (gollm_allreduce_method).
type AllReduceMethod int

// The all-reduce methods measured.
const (
	// AllReduceCustom is the custom all-reduce over peer access, fused with the residual
	// add and RMSNorm, its payload in the compute type.
	AllReduceCustom AllReduceMethod = C.GOLLM_AR_CUSTOM
	// AllReduceNCCLF32 is ncclAllReduce of the fp32 sums, then the residual add and
	// RMSNorm's kernel: a tensor-parallel step without the custom all-reduce.
	AllReduceNCCLF32 AllReduceMethod = C.GOLLM_AR_NCCL_F32
	// AllReduceNCCL is ncclAllReduce of the payload in the compute type alone.
	AllReduceNCCL AllReduceMethod = C.GOLLM_AR_NCCL
	// AllReduceTwoShot is AllReduceCustom in two shots: each rank sums its slice of every
	// row over the ranks, then gathers the others' sums; the results are the one-shot's.
	AllReduceTwoShot AllReduceMethod = C.GOLLM_AR_TWO_SHOT
)

func (m AllReduceMethod) String() string {
	switch m {
	case AllReduceCustom:
		return "custom"
	case AllReduceNCCLF32:
		return "nccl-f32"
	case AllReduceNCCL:
		return "nccl"
	case AllReduceTwoShot:
		return "two-shot"
	}
	return fmt.Sprintf("method %d", int(m))
}

// AllReduceParams is one measurement: rows × hidden partial sums a rank, in DType
// ("float16" or "bfloat16") on the wire.
type AllReduceParams struct {
	Method      AllReduceMethod
	DType       string
	Rows        int
	Hidden      int
	Iters, Reps int
	// Check runs one call and a graph of three replayed twice first, each against the
	// host's sums (not for AllReduceNCCL).
	Check   bool
	Timeout time.Duration
}

// AllReduceResult is what Run measured.
type AllReduceResult struct {
	// PerCall is the median over the replays of the slowest rank's time a call.
	PerCall time.Duration
	// MaxErrH is the largest |h − host sum|; MaxErrXn the largest error of the normed rows
	// relative to max(1, |host value|).
	MaxErrH, MaxErrXn float64
	// RanksDiffer counts elements in which a rank's h or xn bits differ from rank 0's.
	RanksDiffer int
	// Custom is false where the GPUs lack peer access (Reason says why): nothing ran.
	Custom bool
	Reason string
}

// AllReduceComm is communicators over GPUs for measuring their all-reduce alone, without a
// model (bench/arbench, the GPU tests).
type AllReduceComm struct {
	lib     *lib
	comm    *C.gollm_comm
	devices []int
}

// NewAllReduceComm makes the communicators of devices through the library at library
// ("": the default search).
func NewAllReduceComm(devices []int, library string) (*AllReduceComm, error) {
	if len(devices) < 1 {
		return nil, fmt.Errorf("cuda: NewAllReduceComm: no devices")
	}
	l, err := openLib(library)
	if err != nil {
		return nil, err
	}
	cdev := make([]C.int32_t, len(devices))
	for r, d := range devices {
		cdev[r] = C.int32_t(d)
	}
	var comm *C.gollm_comm
	var st C.gollm_status
	nl := ncclPath()
	defer C.free(unsafe.Pointer(nl))
	if err := statusErr("gollm_comm_create_all", C.call_comm_create_all(l.commCreateAll, C.int32_t(len(devices)), &cdev[0], nl, &comm, &st), &st); err != nil {
		return nil, fmt.Errorf("cuda: communicators over GPUs %v: %w", devices, err)
	}
	return &AllReduceComm{lib: l, comm: comm, devices: devices}, nil
}

// Run measures (and with p.Check checks) one all-reduce configuration.
func (a *AllReduceComm) Run(p AllReduceParams) (AllReduceResult, error) {
	dt := C.int32_t(C.GOLLM_DTYPE_F16)
	switch p.DType {
	case "", "float16":
	case "bfloat16":
		dt = C.GOLLM_DTYPE_BF16
	default:
		return AllReduceResult{}, fmt.Errorf("cuda: all-reduce dtype %q (want float16 or bfloat16)", p.DType)
	}
	cp := C.gollm_allreduce_params{method: C.int32_t(p.Method), dtype: dt, rows: C.int32_t(p.Rows),
		hidden: C.int32_t(p.Hidden), iters: C.int32_t(p.Iters), reps: C.int32_t(p.Reps),
		timeout_ms: C.int32_t(min(p.Timeout.Milliseconds(), 1<<30))}
	if p.Check {
		cp.check = 1
	}
	var out C.gollm_allreduce_result
	var st C.gollm_status
	if err := statusErr("gollm_allreduce_bench", C.call_allreduce_bench(a.lib.allreduceBench, a.comm, &cp, &out, &st), &st); err != nil {
		return AllReduceResult{}, fmt.Errorf("cuda: all-reduce %s of %d×%d over GPUs %v: %w", p.Method, p.Rows, p.Hidden, a.devices, err)
	}
	return AllReduceResult{PerCall: time.Duration(float64(out.us_per_call) * float64(time.Microsecond)),
		MaxErrH: float64(out.max_err_h), MaxErrXn: float64(out.max_err_xn), RanksDiffer: int(out.ranks_differ),
		Custom: out.custom != 0, Reason: C.GoString(&out.reason[0])}, nil
}

// Close releases the communicators.
func (a *AllReduceComm) Close() {
	if a.comm != nil {
		C.call_comm_release(a.lib.commRelease, a.comm)
		a.comm = nil
	}
}

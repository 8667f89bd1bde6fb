// faults.cu — the injected failures that make a step or an allocation fail (gollm_faults,
// which bridge/cuda fills from GOLLM_CUDA_FAIL_STEP, GOLLM_CUDA_FAIL_RANK and
// GOLLM_CUDA_FAIL_ALLOC; the messages name those switches), so that the failure paths of
// the engine, the Go bridge and the backend run on a real GPU; and gollm_engine_reset,
// which readies an engine after a failed step or finds its context lost.
#include <cstring>
#include <string>

#include "internal.h"

namespace gollm {

namespace {

// fault_trap_kernel stops with a trap: the launch fails with cudaErrorLaunchFailure, which
// is sticky — the context is lost, as after a real fault in a kernel.
__global__ void fault_trap_kernel() { __trap(); }

}  // namespace

FailStep fail_step_of(const gollm_faults& f) {
  FailStep fs;
  if (f.fail_step < 0 || f.fail_mode < GOLLM_FAIL_ENQUEUED || f.fail_mode > GOLLM_FAIL_EARLY ||
      f.fail_rank < -1 || f.fail_rank > 64)
    invalid("faults: fail_step %d, fail_mode %d and fail_rank %d: want a step >= 0 (0: none), a "
            "gollm_fail_mode and a rank of -1 to 64",
            f.fail_step, f.fail_mode, f.fail_rank);
  fs.step = f.fail_step;
  fs.lost = f.fail_mode == GOLLM_FAIL_LOST;
  fs.early = f.fail_mode == GOLLM_FAIL_EARLY;
  fs.rank = f.fail_rank;
  return fs;
}

bool fail_this_step(const gollm_engine* e) {
  return e->fail.step > 0 && e->steps == e->fail.step && (e->fail.rank < 0 || e->fail.rank == e->tp_rank);
}

namespace {
// alloc_fault is the calling thread's gollm_faults.fail_alloc while an AllocFault lives.
thread_local const char* alloc_fault = nullptr;
}  // namespace

AllocFault::AllocFault(const char* text) : prev(alloc_fault) { alloc_fault = text; }
AllocFault::~AllocFault() { alloc_fault = prev; }

void maybe_fail_alloc(size_t n, const char* what) {
  const char* v = alloc_fault;
  if (!v || !*v || !what || !std::strstr(what, v)) return;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "allocate %zu bytes of device memory for %s: out of memory (injected: "
                "GOLLM_CUDA_FAIL_ALLOC=%s)",
                n, what, v);
  throw Error(GOLLM_ERR_OUT_OF_MEMORY, buf);
}

[[noreturn]] void inject_step_fault(gollm_engine* e) {
  char buf[384];
  if (e->fail.lost) {
    fault_trap_kernel<<<1, 1, 0, e->stream>>>();
    cudaError_t err = cudaStreamSynchronize(e->stream);
    if (err == cudaSuccess) err = cudaGetLastError();
    std::snprintf(buf, sizeof buf,
                  "step %lld: a kernel trapped: %s (injected: GOLLM_CUDA_FAIL_STEP=%d:lost)",
                  (long long)e->steps, cudaGetErrorString(err), e->fail.step);
    throw Error(GOLLM_ERR_CUDA, buf);
  }
  // A real CUDA call that fails (an invalid copy), while the step's kernels still run (or,
  // early, before any is enqueued): what a failing cudaMemcpyAsync or launch in the middle
  // of a step looks like.
  cudaError_t err = cudaMemcpyAsync(nullptr, nullptr, 4, cudaMemcpyDeviceToHost, e->stream);
  if (err == cudaSuccess) err = cudaErrorInvalidValue;
  cudaGetLastError();  // reported below, as check_cuda would
  std::snprintf(buf, sizeof buf,
                "step %lld: cudaMemcpyAsync failed: %s (injected: GOLLM_CUDA_FAIL_STEP=%d%s)",
                (long long)e->steps, cudaGetErrorString(err), e->fail.step, e->fail.early ? ":early" : "");
  throw Error(GOLLM_ERR_CUDA, buf);
}

void reset_engine(gollm_engine* e) {
  if (!e) invalid("gollm_engine_reset: engine is NULL");
  // Launched steps are not waited for after a failure: the stream is synchronized below.
  drop_launched(e);
  // A tensor-parallel rank whose communicators were aborted cannot step again (tp_check
  // says so); one whose NCCL failed asynchronously neither.
  if (e->comm) {
    DeviceGuard dg(e->device);
    tp_check(e);
  }
  cudaError_t err = cudaSetDevice(e->device);
  // A failed call leaves its error to the next cudaGetLastError; a sticky one stays.
  if (err == cudaSuccess) {
    cudaGetLastError();
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(e->stream, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(e->stream, &g);
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();
    }
    // The failed step's kernels may still run; an error in them shows here.
    err = cudaStreamSynchronize(e->stream);
  }
  // Split reductions count their finished parts in these tickets and zero them when the
  // last part is done; a step cut short can leave them set.
  if (err == cudaSuccess) err = cudaMemsetAsync(e->tickets.p, 0, e->tickets.bytes, e->stream);
  if (err == cudaSuccess)
    err = cudaMemsetAsync(e->greedy_tickets.p, 0, e->greedy_tickets.bytes, e->stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(e->stream);
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "the CUDA context of device %d is lost (%s): the engine cannot serve again",
                  e->device, cudaGetErrorString(err));
    throw Error(GOLLM_ERR_CUDA, buf);
  }
}

void device_info(int32_t device, gollm_device_info* out) {
  if (!out) invalid("gollm_device_describe: out is NULL");
  *out = gollm_device_info{};
  DeviceGuard dg(device);
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::snprintf(out->name, sizeof out->name, "%s", prop.name);
  const unsigned char* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::snprintf(out->uuid, sizeof out->uuid,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                u[14], u[15]);
  CUDA_CHECK(cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, device));
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  out->free_bytes = (int64_t)free_b;
  out->total_bytes = (int64_t)total_b;
}

}  // namespace gollm

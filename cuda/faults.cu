// faults.cu — the debugging switches that make a step or an allocation fail
// (GOLLM_CUDA_FAIL_STEP, GOLLM_CUDA_FAIL_ALLOC; gollm.h), so that the failure paths of the
// engine, the Go bridge and the backend run on a real GPU; and gollm_engine_reset, which
// readies an engine after a failed step or finds its context lost.
#include <cstdlib>
#include <cstring>
#include <string>

#include "internal.h"

namespace gollm {

namespace {

// fault_trap_kernel stops with a trap: the launch fails with cudaErrorLaunchFailure, which
// is sticky — the context is lost, as after a real fault in a kernel.
__global__ void fault_trap_kernel() { __trap(); }

}  // namespace

FailStep fail_step_from_env() {
  FailStep f;
  const char* v = std::getenv("GOLLM_CUDA_FAIL_STEP");
  if (!v || !*v) return f;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || n < 1 || n > (1L << 30) ||
      (*end && std::strcmp(end, ":lost") != 0 && std::strcmp(end, ":early") != 0))
    invalid("GOLLM_CUDA_FAIL_STEP=%s: want N, N:lost or N:early, with N >= 1 the step that fails", v);
  f.step = (int)n;
  f.lost = std::strcmp(end, ":lost") == 0;
  f.early = std::strcmp(end, ":early") == 0;
  if (const char* r = std::getenv("GOLLM_CUDA_FAIL_RANK"); r && *r) {
    const long k = std::strtol(r, &end, 10);
    if (end == r || *end || k < 0 || k > 64)
      invalid("GOLLM_CUDA_FAIL_RANK=%s: want the tensor-parallel rank that fails, 0 to 64", r);
    f.rank = (int)k;
  }
  return f;
}

bool fail_this_step(const gollm_engine* e) {
  return e->fail.step > 0 && e->steps == e->fail.step && (e->fail.rank < 0 || e->fail.rank == e->tp_rank);
}

void maybe_fail_alloc(size_t n, const char* what) {
  const char* v = std::getenv("GOLLM_CUDA_FAIL_ALLOC");
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

// comm.cu — tensor parallelism's communication: NCCL opened with dlopen, the
// communicators of an instance's GPUs (gollm_comm: creation, the ranks' agreement on the KV
// pool, abort, release), and the collectives an engine's step makes on its stream.
#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "internal.h"

namespace gollm {
namespace nccl {

namespace {

std::mutex lib_mu;
Lib* loaded = nullptr;  // never freed: NCCL stays open for the process

}  // namespace

const Lib& lib(const char* want) {
  std::lock_guard<std::mutex> lk(lib_mu);
  if (loaded) return *loaded;
  const std::string path = want && *want ? want : "libnccl.so.2";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* why = dlerror();
    char buf[900];
    std::snprintf(buf, sizeof buf,
                  "tensor parallelism needs NCCL: dlopen %s: %s (put the lib folder of NVIDIA's "
                  "nvidia-nccl-cu13 wheel, or of an NCCL install, on the loader's path, or set "
                  "GOLLM_NCCL_LIB to libnccl.so.2's path)",
                  path.c_str(), why ? why : "unknown error");
    throw Error(GOLLM_ERR_NCCL, buf);
  }
  std::unique_ptr<Lib> l(new Lib);
  l->path = path;
  auto sym = [&](const char* name, bool required) -> void* {
    void* p = dlsym(h, name);
    if (!p && required) {
      dlclose(h);
      char buf[600];
      std::snprintf(buf, sizeof buf, "NCCL %s has no %s: not an NCCL 2 library", path.c_str(), name);
      throw Error(GOLLM_ERR_NCCL, buf);
    }
    return p;
  };
  l->GetVersion = reinterpret_cast<result_t (*)(int*)>(sym("ncclGetVersion", true));
  l->CommInitAll = reinterpret_cast<result_t (*)(comm_t*, int, const int*)>(sym("ncclCommInitAll", true));
  l->CommDestroy = reinterpret_cast<result_t (*)(comm_t)>(sym("ncclCommDestroy", true));
  l->CommAbort = reinterpret_cast<result_t (*)(comm_t)>(sym("ncclCommAbort", true));
  l->CommGetAsyncError =
      reinterpret_cast<result_t (*)(comm_t, result_t*)>(sym("ncclCommGetAsyncError", true));
  l->GetErrorString = reinterpret_cast<const char* (*)(result_t)>(sym("ncclGetErrorString", true));
  l->GetLastError = reinterpret_cast<const char* (*)(comm_t)>(sym("ncclGetLastError", false));
  l->AllReduce = reinterpret_cast<result_t (*)(const void*, void*, size_t, int, int, comm_t, cudaStream_t)>(
      sym("ncclAllReduce", true));
  l->AllGather = reinterpret_cast<result_t (*)(const void*, void*, size_t, int, comm_t, cudaStream_t)>(
      sym("ncclAllGather", true));
  const result_t r = l->GetVersion(&l->version);
  if (r != kSuccess) {
    char buf[600];
    std::snprintf(buf, sizeof buf, "NCCL %s: ncclGetVersion failed: %s", path.c_str(),
                  l->GetErrorString(r));
    dlclose(h);
    throw Error(GOLLM_ERR_NCCL, buf);
  }
  loaded = l.release();
  return *loaded;
}

}  // namespace nccl

namespace {

// nccl_fail throws GOLLM_ERR_NCCL for call's result r, with NCCL's last error for comm.
[[noreturn]] void nccl_fail(const std::string& call, nccl::result_t r, nccl::comm_t comm) {
  const nccl::Lib& L = nccl::lib();
  const char* last = comm && L.GetLastError ? L.GetLastError(comm) : nullptr;
  char buf[900];
  std::snprintf(buf, sizeof buf, "%s: %s (ncclResult_t %d)%s%s", call.c_str(), L.GetErrorString(r), r,
                last && *last ? ": " : "", last ? last : "");
  throw Error(GOLLM_ERR_NCCL, buf);
}

// aborted_error is what an engine's call says once its communicators were aborted.
[[noreturn]] void aborted_error(const gollm_engine* e) {
  char buf[900];
  std::snprintf(buf, sizeof buf,
                "tensor parallel rank %d of %d (device %d): the NCCL communicators were aborted%s%s; "
                "the engine cannot run again",
                e->tp_rank, e->tp_size, e->device, e->comm->abort_cause.empty() ? "" : " after: ",
                e->comm->abort_cause.c_str());
  throw Error(GOLLM_ERR_NCCL, buf);
}

// abort_mu serialises aborts that could not take a communicator's guard.
std::mutex abort_mu;

// Agreement timeout: every rank's engine is created at the same time (gollm.h), so the
// ranks propose within the time their buffers take to allocate.
constexpr int kAgreeSeconds = 300;

}  // namespace

void nccl_describe(const char* nccl_lib, gollm_nccl_info* out) {
  if (!out) invalid("gollm_nccl_describe: out is NULL");
  *out = gollm_nccl_info{};
  const nccl::Lib& L = nccl::lib(nccl_lib);
  out->version = L.version;
  std::snprintf(out->path, sizeof out->path, "%s", L.path.c_str());
}

void create_comm(int32_t n, const int32_t* devices, const char* nccl_lib, gollm_comm** out) {
  if (!out) invalid("gollm_comm_create_all: out is NULL");
  if (n < 1 || n > 64 || !devices)
    invalid("gollm_comm_create_all: %d devices (want 1 to 64) and devices %s", n,
            devices ? "given" : "NULL");
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int i = 0; i < n; i++) {
    if (devices[i] < 0 || devices[i] >= count)
      invalid("gollm_comm_create_all: rank %d on device %d, but the process sees %d CUDA devices", i,
              devices[i], count);
    for (int j = 0; j < i; j++)
      if (devices[j] == devices[i])
        invalid("gollm_comm_create_all: ranks %d and %d both on device %d", j, i, devices[i]);
  }
  const nccl::Lib& L = nccl::lib(nccl_lib);
  std::unique_ptr<gollm_comm> c(new gollm_comm);
  c->n = n;
  c->devices.assign(devices, devices + n);
  c->comms.assign(n, nullptr);
  c->taken.assign(n, 0);
  const nccl::result_t r = L.CommInitAll(c->comms.data(), n, c->devices.data());
  if (r != nccl::kSuccess) {
    std::string call = "ncclCommInitAll over devices [";
    for (int i = 0; i < n; i++) call += (i ? ", " : "") + std::to_string(devices[i]);
    call += "] (NCCL " + std::to_string(L.version) + ", " + L.path + ")";
    nccl_fail(call, r, nullptr);
  }
  // The custom all-reduce where every pair of GPUs has peer access (NCCL otherwise).
  if (n > 1) {
    try {
      c->peer_why = peer_access(n, devices);
      if (c->peer_why.empty()) c->peer = make_peer_bufs(n, devices, kArSlotBytes);
    } catch (...) {
      for (int i = 0; i < n; i++) {
        if (cudaSetDevice(devices[i]) != cudaSuccess) cudaGetLastError();
        if (c->comms[i]) L.CommDestroy(c->comms[i]);
      }
      throw;
    }
  }
  *out = c.release();
}

void abort_comm(gollm_comm* c, const char* cause) {
  if (!c) invalid("gollm_comm_abort: comm is NULL");
  // First the custom all-reduce's kernels: those waiting for a peer end (their error word
  // says aborted).
  if (c->peer) *reinterpret_cast<volatile int*>(c->peer->herr + kArMaxRanks) = 1;
  {
    // An engine's call enqueues and returns: the guard is free within microseconds, unless
    // a call is blocked inside NCCL (its queue full behind a collective that waits for a
    // failed rank), which only the abort below releases: then it goes ahead without.
    std::unique_lock<std::shared_timed_mutex> lk(c->guard, std::defer_lock);
    if (!lk.try_lock_for(std::chrono::seconds(5))) {
      // Blocked inside NCCL: go ahead (aborted is atomic; abort_mu orders two aborts).
    }
    std::lock_guard<std::mutex> one(abort_mu);
    if (c->aborted.load()) return;
    c->abort_cause = cause ? cause : "";
    c->aborted.store(true);
  }
  {
    // Ranks waiting to agree on the KV pool stop too. The graphs go before the
    // communicators: ncclCommAbort waits until every graph holding their collectives is
    // destroyed (NCCL 2.28: commDestroySync polls until the comm's persistent references
    // are gone), which without this hung it for ever.
    std::lock_guard<std::mutex> lk(c->mu);
    if (c->failed.empty()) c->failed = "the communicators were aborted";
    for (auto& [dev, g] : c->graphs) {
      if (cudaSetDevice(dev) != cudaSuccess) cudaGetLastError();
      if (cudaGraphExecDestroy(g) != cudaSuccess) cudaGetLastError();
    }
    c->graphs.clear();
  }
  c->cv.notify_all();
  // No engine is inside an NCCL call now, and none enters one: abort every rank at once
  // (a rank's collective may wait for another's).
  const nccl::Lib& L = nccl::lib();
  std::vector<nccl::result_t> res(c->n, nccl::kSuccess);
  std::vector<std::thread> ts;
  for (int r = 0; r < c->n; r++) {
    ts.emplace_back([&, r] {
      if (cudaSetDevice(c->devices[r]) != cudaSuccess) cudaGetLastError();
      res[r] = L.CommAbort(c->comms[r]);
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < c->n; r++) {
    c->comms[r] = nullptr;
    if (res[r] != nccl::kSuccess)
      nccl_fail("ncclCommAbort of rank " + std::to_string(r) + " (device " +
                    std::to_string(c->devices[r]) + ")",
                res[r], nullptr);
  }
}

void release_comm(gollm_comm* c) {
  if (!c || c->refs.fetch_sub(1) != 1) return;
  if (!c->aborted.load() && nccl::loaded) {
    for (int r = 0; r < c->n; r++) {
      if (!c->comms[r]) continue;
      if (cudaSetDevice(c->devices[r]) != cudaSuccess) cudaGetLastError();
      nccl::loaded->CommDestroy(c->comms[r]);
    }
  }
  delete c;
}

void comm_graph_add(gollm_comm* c, int device, cudaGraphExec_t g) {
  std::lock_guard<std::mutex> lk(c->mu);
  if (c->aborted.load()) {
    cudaGraphExecDestroy(g);
    throw Error(GOLLM_ERR_NCCL, "the NCCL communicators were aborted while a graph was captured; the "
                                "engine cannot run again");
  }
  c->graphs.emplace_back(device, g);
}

void comm_graph_drop(gollm_comm* c, cudaGraphExec_t g) {
  std::lock_guard<std::mutex> lk(c->mu);
  for (size_t i = 0; i < c->graphs.size(); i++) {
    if (c->graphs[i].second != g) continue;
    c->graphs.erase(c->graphs.begin() + (long)i);
    CUDA_CHECK(cudaGraphExecDestroy(g));
    return;
  }
}

void comm_claim(gollm_comm* c, int rank) {
  std::lock_guard<std::mutex> lk(c->mu);
  if (c->taken[rank])
    invalid("tensor parallel rank %d of %d (device %d): the communicator has an engine on this rank "
            "already (one engine a rank; make a communicator per instance)",
            rank, c->n, c->devices[rank]);
  c->taken[rank] = 1;
}

int64_t comm_agree_min(gollm_comm* c, int rank, int64_t v) {
  std::unique_lock<std::mutex> lk(c->mu);
  if (!c->failed.empty()) {
    char buf[700];
    std::snprintf(buf, sizeof buf, "tensor parallel rank %d: %s", rank, c->failed.c_str());
    throw Error(GOLLM_ERR_NCCL, buf);
  }
  c->agreed = std::min(c->agreed, v);
  c->arrived++;
  if (c->arrived == c->n) {
    c->cv.notify_all();
    return c->agreed;
  }
  const bool done = c->cv.wait_for(lk, std::chrono::seconds(kAgreeSeconds),
                                   [&] { return c->arrived == c->n || !c->failed.empty(); });
  if (c->arrived == c->n) return c->agreed;
  char buf[700];
  if (done)
    std::snprintf(buf, sizeof buf, "tensor parallel rank %d: %s", rank, c->failed.c_str());
  else
    std::snprintf(buf, sizeof buf,
                  "tensor parallel rank %d: %d of the %d ranks' engines reached the KV pool's sizing "
                  "within %d s (each rank's engine must be created at the same time, from a "
                  "thread of its own)",
                  rank, c->arrived, c->n, kAgreeSeconds);
  c->failed = buf;
  c->cv.notify_all();
  throw Error(GOLLM_ERR_NCCL, buf);
}

void comm_abandon(gollm_comm* c, int rank) {
  {
    std::lock_guard<std::mutex> lk(c->mu);
    if (!c->failed.empty() || c->arrived == c->n) return;
    c->failed = "rank " + std::to_string(rank) + " (device " + std::to_string(c->devices[rank]) +
                ") failed before its KV pool was sized (its own error says why)";
  }
  c->cv.notify_all();
}

void comm_barrier(gollm_comm* c, int rank) {
  std::unique_lock<std::mutex> lk(c->mu);
  const int64_t round = c->bar_rounds;
  if (!c->aborted.load()) {
    if (++c->bar_count == c->n) {
      c->bar_count = 0;
      c->bar_rounds++;
      c->cv.notify_all();
      return;
    }
    c->cv.wait(lk, [&] { return c->bar_rounds != round || c->aborted.load(); });
    if (c->bar_rounds != round) return;
  }
  char buf[700];
  std::snprintf(buf, sizeof buf,
                "tensor parallel rank %d: the communicators were aborted while it waited for the "
                "other ranks to grow their step buffers%s%s",
                rank, c->abort_cause.empty() ? "" : " (after: ", c->abort_cause.empty() ? "" : (c->abort_cause + ")").c_str());
  throw Error(GOLLM_ERR_NCCL, buf);
}

// Collectives of an engine's step, on its stream (captured into its graphs in graph mode).

void tp_all_reduce(gollm_engine* e, float* buf, size_t count, const char* what, int layer) {
#ifdef GOLLM_MEASURE
  if (e->skip & gollm_engine::kSkipAllReduce) return;
#endif
  std::shared_lock<std::shared_timed_mutex> lk(e->comm->guard);
  if (e->comm->aborted.load()) aborted_error(e);
  const nccl::Lib& L = nccl::lib();
  nccl::comm_t nc = e->comm->comms[e->tp_rank];
  const nccl::result_t r = L.AllReduce(buf, buf, count, nccl::kFloat32, nccl::kSum, nc, e->stream);
  if (r != nccl::kSuccess) {
    char call[300];
    std::snprintf(call, sizeof call, "ncclAllReduce of %s%s%s (%zu floats) on rank %d of %d (device %d)",
                  what, layer >= 0 ? ", layer " : "", layer >= 0 ? std::to_string(layer).c_str() : "",
                  count, e->tp_rank, e->tp_size, e->device);
    nccl_fail(call, r, nc);
  }
}

void tp_all_gather(gollm_engine* e, const float* send, float* recv, size_t count) {
  std::shared_lock<std::shared_timed_mutex> lk(e->comm->guard);
  if (e->comm->aborted.load()) aborted_error(e);
  const nccl::Lib& L = nccl::lib();
  nccl::comm_t nc = e->comm->comms[e->tp_rank];
  const nccl::result_t r = L.AllGather(send, recv, count, nccl::kFloat32, nc, e->stream);
  if (r != nccl::kSuccess) {
    char call[300];
    std::snprintf(call, sizeof call,
                  "ncclAllGather of the LM head's logits (%zu floats a rank) on rank %d of %d (device %d)",
                  count, e->tp_rank, e->tp_size, e->device);
    nccl_fail(call, r, nc);
  }
}

void tp_graph_launch(gollm_engine* e, cudaGraphExec_t g) {
  std::shared_lock<std::shared_timed_mutex> lk(e->comm->guard);
  if (e->comm->aborted.load()) aborted_error(e);
  CUDA_CHECK(cudaGraphLaunch(g, e->stream));
}

void tp_check(gollm_engine* e) {
  // A custom all-reduce that gave up waiting for a peer: the ranks' flags no longer pair
  // up, so the communicators are aborted (every rank's next call fails) and the step
  // fails with why.
  gollm_comm* c = e->comm;
  if (c->peer && !c->aborted.load()) {
    const int word = *reinterpret_cast<volatile int*>(c->peer->herr + e->tp_rank);
    if (word != 0) {
      const std::string why = ar_error(*c->peer, e->tp_rank, word, e->ar_timeout_ns);
      try {
        abort_comm(c, why.c_str());
      } catch (const Error&) {
        // The abort's own failure: the engine is lost either way.
      }
      throw Error(GOLLM_ERR_NCCL, why + "; the communicators were aborted and the engine cannot run again");
    }
  }
  std::shared_lock<std::shared_timed_mutex> lk(e->comm->guard);
  if (e->comm->aborted.load()) aborted_error(e);
  const nccl::Lib& L = nccl::lib();
  nccl::comm_t nc = e->comm->comms[e->tp_rank];
  nccl::result_t async = nccl::kSuccess;
  const nccl::result_t r = L.CommGetAsyncError(nc, &async);
  char call[200];
  if (r != nccl::kSuccess) {
    std::snprintf(call, sizeof call, "ncclCommGetAsyncError on rank %d of %d (device %d)", e->tp_rank,
                  e->tp_size, e->device);
    nccl_fail(call, r, nc);
  }
  if (async != nccl::kSuccess && async != nccl::kInProgress) {
    std::snprintf(call, sizeof call, "NCCL's communicator of rank %d of %d (device %d) failed",
                  e->tp_rank, e->tp_size, e->device);
    nccl_fail(call, async, nc);
  }
}

}  // namespace gollm

// comm.h — tensor parallelism's communication: NCCL, opened at run time with dlopen
// (the path the caller gives, else libnccl.so.2) through the project's own minimal declarations of
// the calls it makes; the custom all-reduce's peer buffers (allreduce.cu); and gollm_comm,
// the communicators of the GPUs one instance spreads a model over. Included by internal.h;
// comm.cu and allreduce.cu implement it.
#pragma once

#include <atomic>
#include <memory>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "gollm.h"

namespace gollm {
namespace nccl {

// NCCL's C ABI as far as gollm uses it (nccl.h, NCCL 2.x): a communicator is an opaque
// pointer; results, data types and reduction operations are C enums (int-sized).
struct CommImpl;
typedef CommImpl* comm_t;       // ncclComm_t
typedef int result_t;           // ncclResult_t
constexpr result_t kSuccess = 0;     // ncclSuccess
constexpr result_t kInProgress = 7;  // ncclInProgress (non-blocking communicators only)
constexpr int kFloat16 = 6;          // ncclFloat16 (ncclDataType_t)
constexpr int kFloat32 = 7;          // ncclFloat32
constexpr int kBfloat16 = 9;         // ncclBfloat16
constexpr int kSum = 0;              // ncclSum (ncclRedOp_t)

// Lib is the opened library's entry points.
struct Lib {
  std::string path;  // what dlopen opened
  int version = 0;   // ncclGetVersion
  result_t (*GetVersion)(int*) = nullptr;
  result_t (*CommInitAll)(comm_t*, int, const int*) = nullptr;
  result_t (*CommDestroy)(comm_t) = nullptr;
  result_t (*CommAbort)(comm_t) = nullptr;
  result_t (*CommGetAsyncError)(comm_t, result_t*) = nullptr;
  const char* (*GetErrorString)(result_t) = nullptr;
  const char* (*GetLastError)(comm_t) = nullptr;  // NCCL 2.13 and later; may be null
  result_t (*AllReduce)(const void*, void*, size_t, int, int, comm_t, cudaStream_t) = nullptr;
  result_t (*AllGather)(const void*, void*, size_t, int, comm_t, cudaStream_t) = nullptr;
};

// lib opens NCCL once — path, or libnccl.so.2 when path is null or empty — and later
// calls return the same whatever their path; throws GOLLM_ERR_NCCL naming what was tried
// when it cannot.
const Lib& lib(const char* path = nullptr);

}  // namespace nccl

// The custom all-reduce (allreduce.cu): one kernel a call, each rank writing its partial
// sums (rounded to the payload type) into its own buffer, raising a flag in each peer's
// memory and reading the peers' buffers over NVLink once their flags are up — peer access
// between the GPUs of one process, no host round trip, so that decode graphs capture it.
// A launch runs up to kArBlocks blocks; block b owns region b of each parity slot (the
// rows it reduces) and the flags [src rank][b]; its call count (the epoch, in counters[b])
// picks the slot, so that a rank one call ahead writes the other one.
constexpr int kArMaxRanks = 8;
constexpr int kArBlocks = 64;
constexpr size_t kArMaxBytes = 4u << 20;      // the largest payload tuning.allreduce_bytes allows
// A parity slot of the engines' buffers: the largest payload, and the two-shot's fp32 sums
// of it beside it.
constexpr size_t kArSlotBytes = 3 * kArMaxBytes;
constexpr size_t kArDefaultBytes = 1u << 20;  // the largest payload a call sends by default
constexpr unsigned kArTimeoutMs = 20000;      // a flag's wait before the step fails
// Error words (PeerBufs.herr): what a rank's kernel met, with the peer it waited for in
// bits 8 and up.
constexpr int kArTimedOut = 1, kArAborted = 2;

// PeerBufs are the custom all-reduce's buffers on every rank: each rank's device memory
// ([2][slot] payload, then flags [kArMaxRanks][kArBlocks], counters [kArBlocks] and the
// two-shot's second flags [kArMaxRanks][kArBlocks], uint32), the peers' mapped into each other's address space, and pinned host words the
// kernels write their errors to (herr[rank]) and read the abort from (herr[kArMaxRanks]).
struct PeerBufs {
  int n = 0;
  size_t slot = 0;
  std::vector<int> devices;
  std::vector<char*> mem;
  int* herr = nullptr;
  PeerBufs() = default;
  PeerBufs(const PeerBufs&) = delete;
  PeerBufs& operator=(const PeerBufs&) = delete;
  ~PeerBufs();
  uint32_t* flags(int r) const { return reinterpret_cast<uint32_t*>(mem[r] + 2 * slot); }
  uint32_t* counters(int r) const { return flags(r) + kArMaxRanks * kArBlocks; }
  uint32_t* flags2(int r) const { return counters(r) + kArBlocks; }
  size_t bytes() const { return 2 * slot + (2 * kArMaxRanks + 1) * kArBlocks * 4; }
};

// peer_access says why n devices cannot take the custom all-reduce ("" when they can: every
// pair has peer access, which it enables). make_peer_bufs allocates the buffers (slot
// bytes a parity slot) on each device, zeroed.
std::string peer_access(int n, const int* devices);
std::unique_ptr<PeerBufs> make_peer_bufs(int n, const int* devices, size_t slot);

}  // namespace gollm

// gollm_comm: the NCCL communicators of n GPUs driven by this process, rank i on
// devices[i], shared by the ranks' engines (refcounted).
struct gollm_comm {
  std::atomic<int> refs{1};            // the creator and each engine
  int n = 0;                           // ranks
  std::vector<int> devices;            // CUDA ordinal of each rank
  std::vector<gollm::nccl::comm_t> comms;  // each rank's communicator
  // Engine creation: each rank claims its slot, then the ranks agree on the KV pool's
  // blocks (the fewest any can hold). Guarded by mu.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> taken;   // an engine was made on the rank
  int arrived = 0;           // ranks that proposed their block count
  int64_t agreed = INT64_MAX;  // the smallest proposal so far
  std::string failed;        // set when a rank failed before proposing: the others stop
  // The step barrier (comm_barrier): arrivals of the current round and rounds completed.
  int bar_count = 0;
  int64_t bar_rounds = 0;
  // Abort: the NCCL calls of every engine hold guard shared and check aborted; abort takes
  // it exclusively to set aborted, so that no call is inside NCCL on a communicator that
  // ncclCommAbort is freeing (unless one stays inside for seconds: blocked in NCCL, which
  // the abort is then what releases).
  std::shared_timed_mutex guard;
  std::atomic<bool> aborted{false};
  std::string abort_cause;   // written once, under guard exclusively, before aborted
  // Every engine's CUDA graphs (device, graph): those with collectives hold the
  // communicator, and NCCL's abort returns only once they are destroyed, so the abort
  // destroys them first (an in-flight one is freed when its launch ends, which the abort's
  // flag makes happen). Guarded by mu; see comm_graph_add.
  std::vector<std::pair<int, cudaGraphExec_t>> graphs;
  // The custom all-reduce's buffers, or null (then peer_why says why: no peer access, or
  // more ranks than kArMaxRanks): NCCL all-reduces everything.
  std::unique_ptr<gollm::PeerBufs> peer;
  std::string peer_why;
};

namespace gollm {

// comm.cu
void create_comm(int32_t n, const int32_t* devices, const char* nccl_lib, gollm_comm** out);
void abort_comm(gollm_comm* c, const char* cause);
void release_comm(gollm_comm* c);
void nccl_describe(const char* nccl_lib, gollm_nccl_info* out);
// comm_claim takes rank's engine slot (invalid if taken); comm_agree_min proposes v for the
// KV pool's blocks and returns the smallest proposal once every rank made one (or throws
// when a rank failed first, or the communicators were aborted); comm_abandon tells the
// waiting ranks that rank failed before proposing.
void comm_claim(gollm_comm* c, int rank);
int64_t comm_agree_min(gollm_comm* c, int rank, int64_t v);
void comm_abandon(gollm_comm* c, int rank);
// comm_graph_add registers an engine's new graph exec (destroying it and throwing when the
// communicators were aborted meanwhile); comm_graph_drop destroys one, unless the abort
// did already.
void comm_graph_add(gollm_comm* c, int device, cudaGraphExec_t g);
void comm_graph_drop(gollm_comm* c, cudaGraphExec_t g);
// comm_barrier returns once every rank has called it (the same number of times), or
// throws GOLLM_ERR_NCCL once the communicators are aborted.
void comm_barrier(gollm_comm* c, int rank);

}  // namespace gollm

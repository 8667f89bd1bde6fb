// allreduce.cu — tensor parallelism's custom all-reduce (comm.h, allreduce.cuh): the peer
// buffers, an engine's fused all-reduce, residual add and norm, and gollm_allreduce_bench.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <thread>

#include "allreduce.cuh"
#include "internal.h"

namespace gollm {

PeerBufs::~PeerBufs() {
  for (size_t r = 0; r < mem.size(); r++) {
    if (!mem[r]) continue;
    if (cudaSetDevice(devices[r]) != cudaSuccess) cudaGetLastError();
    if (cudaFree(mem[r]) != cudaSuccess) cudaGetLastError();
  }
  if (herr && cudaFreeHost(herr) != cudaSuccess) cudaGetLastError();
}

std::string peer_access(int n, const int* devices) {
  if (n > kArMaxRanks)
    return std::to_string(n) + " ranks (the custom all-reduce takes up to " + std::to_string(kArMaxRanks) + ")";
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      if (i == j) continue;
      int ok = 0;
      CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, devices[i], devices[j]));
      if (!ok)
        return "device " + std::to_string(devices[i]) + " has no peer access to device " +
               std::to_string(devices[j]);
    }
  for (int i = 0; i < n; i++) {
    DeviceGuard dg(devices[i]);
    for (int j = 0; j < n; j++) {
      if (i == j) continue;
      const cudaError_t err = cudaDeviceEnablePeerAccess(devices[j], 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else if (err != cudaSuccess) {
        cudaGetLastError();
        return "enabling peer access from device " + std::to_string(devices[i]) + " to " +
               std::to_string(devices[j]) + ": " + cudaGetErrorString(err);
      }
    }
  }
  return "";
}

std::unique_ptr<PeerBufs> make_peer_bufs(int n, const int* devices, size_t slot) {
  std::unique_ptr<PeerBufs> p(new PeerBufs);
  p->n = n;
  p->slot = align_up(slot, (size_t)kArBlocks * 256);
  p->devices.assign(devices, devices + n);
  p->mem.assign(n, nullptr);
  void* h = nullptr;
  CUDA_CHECK(cudaHostAlloc(&h, (kArMaxRanks + 1) * sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  p->herr = static_cast<int*>(h);
  std::memset(p->herr, 0, (kArMaxRanks + 1) * sizeof(int));
  for (int r = 0; r < n; r++) {
    DeviceGuard dg(devices[r]);
    maybe_fail_alloc(p->bytes(), "the custom all-reduce's buffers");
    void* m = nullptr;
    const cudaError_t err = cudaMalloc(&m, p->bytes());
    if (err != cudaSuccess) {
      cudaGetLastError();
      char buf[300];
      std::snprintf(buf, sizeof buf, "allocate %zu bytes of device memory for the custom all-reduce's buffers on device %d: %s",
                    p->bytes(), devices[r], cudaGetErrorString(err));
      throw Error(GOLLM_ERR_OUT_OF_MEMORY, buf);
    }
    p->mem[r] = static_cast<char*>(m);
    CUDA_CHECK(cudaMemset(m, 0, p->bytes()));
  }
  for (int r = 0; r < n; r++) {
    DeviceGuard dg(devices[r]);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  return p;
}

namespace {

ArArgs ar_args(const PeerBufs& p, int rank, unsigned long long timeout_ns) {
  ArArgs a{};
  for (int r = 0; r < p.n; r++) a.data[r] = p.mem[r], a.flags[r] = p.flags(r), a.flags2[r] = p.flags2(r);
  a.counter = p.counters(rank);
  a.err = p.herr + rank;
  a.abort = p.herr + kArMaxRanks;
  a.timeout_ns = timeout_ns;
  a.slot = p.slot;
  a.rank = rank, a.n = p.n;
  return a;
}

// fits says whether rows x hidden of psize-byte payload fit one call on p: each block's
// rows in its region.
bool fits(const PeerBufs& p, int rows, int hidden, size_t psize) {
  if (rows < 1 || hidden % 8 != 0) return false;
  const int G = std::min(rows, kArBlocks);
  return (size_t)((rows + G - 1) / G) * hidden * psize <= p.slot / kArBlocks;
}

// fits_two says the same of the two-shot, whose block regions hold the fp32 sums beside
// the payload.
bool fits_two(const PeerBufs& p, int rows, int hidden, size_t psize) {
  if (rows < 1 || hidden % 8 != 0) return false;
  const int G = std::min(rows, kArBlocks);
  return (size_t)((rows + G - 1) / G) * hidden * (psize + 4) <= p.slot / kArBlocks;
}

template <typename T, typename P>
void launch_ar(const ArArgs& a, const float* part, float* h, const float* bias, T* xn,
               const float* gamma, const float* beta, int rows, int hidden, float eps, bool rms,
               bool add, bool two, Stream st) {
  if (two)
    launch("ar_two_kernel", ar_two_kernel<T, P>, std::min(rows, kArBlocks), kArThreads, 0,
           st, a, part, h, bias, xn, gamma, beta, rows, hidden, eps, rms, add);
  else
    launch("ar_norm_kernel", ar_norm_kernel<T, P>, std::min(rows, kArBlocks), kArThreads, 0,
           st, a, part, h, bias, xn, gamma, beta, rows, hidden, eps, rms, add);
}

// ar_enter holds the communicators' guard for the caller's launch, refusing an engine
// whose communicators were aborted.
std::shared_lock<std::shared_timed_mutex> ar_enter(gollm_engine* e) {
  std::shared_lock<std::shared_timed_mutex> lk(e->comm->guard);
  if (e->comm->aborted.load())
    throw Error(GOLLM_ERR_NCCL, "tensor parallel rank " + std::to_string(e->tp_rank) +
                                    ": the communicators were aborted; the engine cannot run again");
  return lk;
}

// vocab_share is how many of this rank's vr LM head rows are vocabulary (the last rank's
// shard may run past it).
int vocab_share(const gollm_engine* e, int vr) { return std::max(0, std::min(vr, e->vocab - e->tp_rank * vr)); }

// ar_kind is 0 where the engine's custom all-reduce does not take rows x hidden of psize,
// 1 where its one-shot does, 2 where its two-shot does. Every rank decides alike.
int ar_kind(const gollm_engine* e, int rows, int hidden, size_t psize) {
  // The limits count 2-byte elements whatever the payload, so that the embedding's fp32
  // sum goes where the layers' sums of its rows go.
  const size_t bytes = (size_t)rows * hidden * 2;
  if (!e->ar || bytes > e->ar_bytes) return 0;
  const PeerBufs& p = *e->comm->peer;
  if (e->ar_two_bytes > 0 && bytes >= e->ar_two_bytes && fits_two(p, rows, hidden, psize)) return 2;
  return fits(p, rows, hidden, psize) ? 1 : 0;
}

}  // namespace

bool ar_fits(const gollm_engine* e, int rows, int hidden, size_t psize) { return ar_kind(e, rows, hidden, psize) != 0; }

template <typename T>
void tp_reduce_norm(gollm_engine* e, const float* part, float* h, const float* bias, T* xn,
                    const float* gamma, const float* beta, int rows, int hidden, float eps,
                    bool rms, bool add, bool f32) {
  const auto lk = ar_enter(e);
  ArArgs a = ar_args(*e->comm->peer, e->tp_rank, e->ar_timeout_ns);
  bool two = ar_kind(e, rows, hidden, f32 ? 4 : sizeof(T)) == 2;
#ifdef GOLLM_MEASURE
  if (e->skip & gollm_engine::kSkipAllReduce) {
    // A set of one: the one-shot with no peers, this rank's share added and normed alone.
    a.data[0] = a.data[a.rank], a.flags[0] = a.flags[a.rank], a.flags2[0] = a.flags2[a.rank];
    a.rank = 0, a.n = 1, two = false;
  }
#endif
  // With PDL the call launches under the previous kernel's tail and the next kernel's
  // prologue (its weight prefetch) overlaps the wait for the peers.
  const Stream st(e->stream, e->pdl);
  if (f32)
    launch_ar<T, float>(a, part, h, bias, xn, gamma, beta, rows, hidden, eps, rms, add, two, st);
  else
    launch_ar<T, T>(a, part, h, bias, xn, gamma, beta, rows, hidden, eps, rms, add, two, st);
}

template void tp_reduce_norm<__half>(gollm_engine*, const float*, float*, const float*, __half*,
                                     const float*, const float*, int, int, float, bool, bool, bool);
template void tp_reduce_norm<__nv_bfloat16>(gollm_engine*, const float*, float*, const float*,
                                            __nv_bfloat16*, const float*, const float*, int, int,
                                            float, bool, bool, bool);

void tp_greedy(gollm_engine* e, const float* part, const int32_t* samp_seq, const int32_t* samp_row,
               int entries, int vr) {
  if (entries == 0) return;
  const auto lk = ar_enter(e);
  const ArArgs a = ar_args(*e->comm->peer, e->tp_rank, e->ar_timeout_ns);
  const int first = e->tp_rank * vr, valid = vocab_share(e, vr);
  launch("ar_greedy_kernel", ar_greedy_kernel, std::min(entries, kArBlocks), kArThreads, 0,
         Stream(e->stream, false), a, part, samp_seq, samp_row, e->dtok.as<int32_t>(), e->dlp.as<float>(),
         entries, vr, valid, first);
}

bool tp_cand_row(const DevSeq& sq) {
  return (sq.flags & GOLLM_SEQ_SAMPLE) && sq.temperature > 0.f && sq.top_k > 1 && sq.top_k <= kTpCandK &&
         sq.bias_off < 0 && sq.pen_cnt == 0 && sq.mask_cnt == 0 && sq.ret_row < 0 && sq.allow_off < 0;
}

bool tp_cand_fits(const gollm_engine* e, int entries) {
  if (!e->tp_cands || entries < 1 || e->vocab <= kTpCandK) return false;
  const PeerBufs& p = *e->comm->peer;
  const int G = std::min(entries, kArBlocks);
  // The records in each block's region; the compact rows, their ids and sums in tp_gather.
  const size_t nc = (size_t)e->tp_size * kTpCandK;
  return (size_t)((entries + G - 1) / G) * sizeof(CandRecord) <= p.slot / kArBlocks &&
         (size_t)entries * (nc * 8 + 8) <= e->tp_gather.bytes;
}

void tp_sample(gollm_engine* e, const float* part, const int32_t* samp_seq, const int32_t* samp_row,
               const DevSeq* seqs, int entries, int vr) {
  if (entries == 0) return;
  const auto lk = ar_enter(e);
  const ArArgs a = ar_args(*e->comm->peer, e->tp_rank, e->ar_timeout_ns);
  const int first = e->tp_rank * vr, valid = vocab_share(e, vr);
  const int nc = e->tp_size * kTpCandK;
  // tp_gather (unused by these steps): zfull first (8-byte aligned), then rows and ids.
  char* base = e->tp_gather.as<char>();
  double* zfull = reinterpret_cast<double*>(base);
  float* crow = reinterpret_cast<float*>(base + (size_t)entries * 8);
  int32_t* cid = reinterpret_cast<int32_t*>(base + (size_t)entries * 8 + (size_t)entries * nc * 4);
  launch("ar_cand_kernel", ar_cand_kernel, std::min(entries, kArBlocks), kArThreads, 0, Stream(e->stream, false), a,
         part, samp_seq, samp_row, seqs, crow, cid, zfull, entries, vr, valid, first);
  launch("ar_cand_sample_kernel", ar_cand_sample_kernel, entries, kSampleThreads, 0, Stream(e->stream, false), crow,
         cid, static_cast<const double*>(zfull), samp_seq, seqs, e->dtok.as<int32_t>(), e->dlp.as<float>(), nc,
         e->vocab);
}

std::string ar_error(const PeerBufs& p, int rank, int word, unsigned long long timeout_ns) {
  const int peer = word >> 8;
  char buf[400];
  if ((word & 0xff) == kArAborted)
    std::snprintf(buf, sizeof buf,
                  "tensor parallel rank %d: the custom all-reduce stopped waiting for rank %d: a rank's "
                  "wait timed out or the communicators were aborted",
                  rank, peer);
  else
    std::snprintf(buf, sizeof buf,
                  "tensor parallel rank %d (device %d): the custom all-reduce waited %.1f s for rank %d (device %d), which never arrived",
                  rank, p.devices[rank], timeout_ns / 1e9, peer, peer < p.n ? p.devices[peer] : -1);
  return buf;
}

// The benchmark and check (gollm_allreduce_bench).
namespace {

// Rank r's inputs, the same wherever they are computed: a hash of (r, i) to [-1, 1).
float input(uint32_t r, uint32_t i, uint32_t salt) {
  uint32_t x = i * 2654435761u ^ (r + 1) * 40503u ^ salt * 2246822519u;
  x ^= x >> 15, x *= 2246822519u, x ^= x >> 13, x *= 3266489917u, x ^= x >> 16;
  return (float)(x >> 8) / (float)(1 << 23) - 1.f;
}

// The salts of the three sets of partial sums (bench_rank's parts). The checks' call k
// sends set k % kSets — one eager call, then a graph of kSets calls replayed twice —, so
// that every call's sums differ from those of the two calls before it.
constexpr uint32_t kSalts[] = {1, 5, 6};
constexpr int kSets = (int)std::size(kSalts), kCheckCalls = 1 + 2 * kSets;

template <typename T> float round_host(float v);
template <> float round_host<__half>(float v) { return __half2float(__float2half_rn(v)); }
template <> float round_host<__nv_bfloat16>(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
template <typename T> float to_host(T v);
template <> float to_host<__half>(__half v) { return __half2float(v); }
template <> float to_host<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// Barrier is a reusable barrier of the bench's rank threads; once a rank failed (fail),
// every wait throws instead.
struct Barrier {
  std::mutex mu;
  std::condition_variable cv;
  int n, count = 0;
  int64_t round = 0;
  bool broken = false;
  explicit Barrier(int n_) : n(n_) {}
  void wait() {
    std::unique_lock<std::mutex> lk(mu);
    const int64_t r = round;
    if (!broken && ++count == n) {
      count = 0, round++;
      cv.notify_all();
      return;
    }
    cv.wait(lk, [&] { return round != r || broken; });
    if (round == r) throw Error(GOLLM_ERR_NCCL, "another rank of the all-reduce bench failed");
  }
  void fail() {
    std::lock_guard<std::mutex> lk(mu);
    broken = true;
    cv.notify_all();
  }
};

struct RankOut {
  std::vector<float> h, xn;  // after the checks
  std::vector<float> ms;     // each replay's time a call
  std::string err;
};

template <typename T>
void bench_rank(gollm_comm* c, PeerBufs* peer, const gollm_allreduce_params& p, int r, Barrier& bar,
                RankOut& out, std::vector<std::vector<float>>* checks) {
  DeviceGuard dg(c->devices[r]);
  const int rows = p.rows, H = p.hidden;
  const size_t n = (size_t)rows * H;
  // The stream, events and graph go whatever happens (a capture left open is ended).
  struct Res {
    cudaStream_t st = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    cudaGraphExec_t ex = nullptr;
    ~Res() {
      if (st) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(st, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone) {
          cudaGraph_t g = nullptr;
          cudaStreamEndCapture(st, &g);
          if (g) cudaGraphDestroy(g);
        }
        cudaStreamSynchronize(st);
      }
      if (ex) cudaGraphExecDestroy(ex);
      if (e0) cudaEventDestroy(e0);
      if (e1) cudaEventDestroy(e1);
      if (st) cudaStreamDestroy(st);
      cudaGetLastError();
    }
  } res;
  CUDA_CHECK(cudaStreamCreateWithFlags(&res.st, cudaStreamNonBlocking));
  cudaStream_t st = res.st;
  // The checks' calls cycle through the sets of partial sums (kSalts), so that a call that
  // read a peer's payload of an earlier call (its buffer half's last, two calls back) or of
  // a region not yet written gets other sums than the host's; the timing sends the first
  // alone.
  DevMem parts[kSets], h, xn, gamma, bias, payload;
  for (DevMem& m : parts) m.alloc(n * 4, "bench partial sums");
  h.alloc(n * 4, "bench residual");
  xn.alloc(n * sizeof(T), "bench normed rows");
  gamma.alloc(H * 4, "bench gamma");
  bias.alloc(H * 4, "bench bias");
  payload.alloc(n * sizeof(T), "bench payload");
  // Copies on st, waited for: a cudaMemcpy from pageable memory may return before its DMA
  // lands, and st (non-blocking) does not wait for the legacy stream's copies.
  auto upload = [&](void* dst, const void* src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
  };
  std::vector<float> hp(n), hh(n), hg(H), hb(H);
  for (int s = 0; s < kSets; s++) {
    for (size_t i = 0; i < n; i++) hp[i] = input(r, (uint32_t)i, kSalts[s]);
    upload(parts[s].p, hp.data(), n * 4);
  }
  for (size_t i = 0; i < n; i++) hh[i] = input(0, (uint32_t)i, 2);
  for (int i = 0; i < H; i++) hg[i] = 1.f + 0.5f * input(0, i, 3), hb[i] = 0.1f * input(0, i, 4);
  upload(h.p, hh.data(), n * 4);
  upload(gamma.p, hg.data(), H * 4);
  upload(bias.p, hb.data(), H * 4);
  CUDA_CHECK(cudaMemsetAsync(payload.p, 0, payload.bytes, st));
  const nccl::Lib& L = nccl::lib();
  const unsigned long long tmo = (unsigned long long)(p.timeout_ms > 0 ? p.timeout_ms : kArTimeoutMs) * 1000000ull;
  const int dt = std::is_same<T, __half>::value ? nccl::kFloat16 : nccl::kBfloat16;
  // NCCL_F32's sums land apart from the partial sums, which every call sends again.
  DevMem recv;
  if (p.method == GOLLM_AR_NCCL_F32) recv.alloc(n * 4, "bench fp32 sums");
  auto one = [&](const DevMem& src) {
    if (p.method == GOLLM_AR_CUSTOM || p.method == GOLLM_AR_TWO_SHOT) {
      launch_ar<T, T>(ar_args(*peer, r, tmo), src.as<float>(), h.as<float>(), bias.as<float>(), xn.as<T>(),
                      gamma.as<float>(), nullptr, rows, H, 1e-5f, true, true, p.method == GOLLM_AR_TWO_SHOT,
                      Stream(st, false));
      return;
    }
    nccl::result_t res;
    if (p.method == GOLLM_AR_NCCL_F32) {
      res = L.AllReduce(src.p, recv.p, n, nccl::kFloat32, nccl::kSum, c->comms[r], st);
      if (res == nccl::kSuccess)
        residual_norm<T>(h.as<float>(), recv.as<float>(), bias.as<float>(), xn.as<T>(), gamma.as<float>(), rows,
                         H, 1e-5f, st);
    } else {
      res = L.AllReduce(payload.p, payload.p, n, dt, nccl::kSum, c->comms[r], st);
    }
    if (res != nccl::kSuccess)
      throw Error(GOLLM_ERR_NCCL, std::string("ncclAllReduce in the all-reduce bench: ") + L.GetErrorString(res));
  };
  auto read_back = [&](std::vector<float>& dst) {
    std::vector<T> x(n);
    dst.resize(2 * n);
    CUDA_CHECK(cudaMemcpyAsync(dst.data(), h.p, n * 4, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaMemcpyAsync(x.data(), xn.p, n * sizeof(T), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    for (size_t i = 0; i < n; i++) dst[n + i] = to_host<T>(x[i]);
  };
  // graph_of captures k calls: of the first partial sums alone, or, as the checks' calls
  // 1 … k, cycling from the second.
  auto graph_of = [&](int k, bool cycle) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ex = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < k; i++) one(parts[cycle ? (i + 1) % kSets : 0]);
    CUDA_CHECK(cudaStreamEndCapture(st, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ex, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
    return ex;
  };
  // NCCL sets up on a collective's first use: once eagerly, every rank.
  bar.wait();
  one(parts[0]);
  CUDA_CHECK(cudaStreamSynchronize(st));
  if (p.check && p.method != GOLLM_AR_NCCL) {
    // Fresh inputs, then one call (eager) and kSets + kSets in a graph replayed twice.
    upload(h.p, hh.data(), n * 4);
    bar.wait();
    one(parts[0]);
    read_back((*checks)[0 * c->n + r]);
    bar.wait();
    res.ex = graph_of(kSets, true);
    bar.wait();
    for (int k = 0; k < 2; k++) CUDA_CHECK(cudaGraphLaunch(res.ex, st));
    read_back((*checks)[1 * c->n + r]);
    CUDA_CHECK(cudaGraphExecDestroy(res.ex));
    res.ex = nullptr;
  }
  // Timing: a graph of iters calls, replayed once untimed and reps times timed; the ranks
  // start each replay together.
  upload(h.p, hh.data(), n * 4);
  bar.wait();
  res.ex = graph_of(p.iters, false);
  CUDA_CHECK(cudaEventCreate(&res.e0));
  CUDA_CHECK(cudaEventCreate(&res.e1));
  for (int k = 0; k <= p.reps; k++) {
    bar.wait();
    CUDA_CHECK(cudaEventRecord(res.e0, st));
    CUDA_CHECK(cudaGraphLaunch(res.ex, st));
    CUDA_CHECK(cudaEventRecord(res.e1, st));
    CUDA_CHECK(cudaEventSynchronize(res.e1));
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, res.e0, res.e1));
    if (k > 0) out.ms.push_back(ms / p.iters);
  }
  if (peer && peer->herr[r] != 0) out.err = ar_error(*peer, r, peer->herr[r], tmo);
}

// The host's h and xn after the checks' first calls (the custom or NCCL_F32 path) from
// h0: call k's partial sums (set k % kSets) added in rank order.
template <typename T>
void reference(const gollm_allreduce_params& p, int ranks, int calls, bool custom, std::vector<float>& out) {
  const int rows = p.rows, H = p.hidden;
  const size_t n = (size_t)rows * H;
  out.assign(2 * n, 0.f);
  std::vector<float> hg(H), hb(H);
  for (int i = 0; i < H; i++) hg[i] = 1.f + 0.5f * input(0, i, 3), hb[i] = 0.1f * input(0, i, 4);
  for (size_t i = 0; i < n; i++) {
    float h = input(0, (uint32_t)i, 2);
    for (int k = 0; k < calls; k++) {
      float acc = 0.f;
      for (int r = 0; r < ranks; r++) {
        const float v = input(r, (uint32_t)i, kSalts[k % kSets]);
        acc += custom ? round_host<T>(v) : v;
      }
      h = h + acc + hb[i % H];
    }
    out[i] = h;
  }
  for (int row = 0; row < rows; row++) {
    double ss = 0;
    for (int i = 0; i < H; i++) ss += (double)out[(size_t)row * H + i] * out[(size_t)row * H + i];
    const double rstd = 1.0 / std::sqrt(ss / H + 1e-5);
    for (int i = 0; i < H; i++)
      out[n + (size_t)row * H + i] = (float)(out[(size_t)row * H + i] * rstd * hg[i]);
  }
}

template <typename T>
void bench_t(gollm_comm* c, const gollm_allreduce_params& p, gollm_allreduce_result* out) {
  std::unique_ptr<PeerBufs> peer;
  const bool custom = p.method == GOLLM_AR_CUSTOM || p.method == GOLLM_AR_TWO_SHOT;
  if (custom) {
    if (!c->peer) {
      out->custom = 0;
      std::snprintf(out->reason, sizeof out->reason, "%s", c->peer_why.c_str());
      return;
    }
    // Buffers of its own, sized for the message (the engines' stay as they are); the
    // two-shot's regions hold the fp32 sums too.
    const size_t per = p.method == GOLLM_AR_TWO_SHOT ? sizeof(T) + 4 : sizeof(T);
    const int G = std::min(p.rows, kArBlocks);
    const size_t need = (size_t)((p.rows + G - 1) / G) * p.hidden * per * kArBlocks;
    peer = make_peer_bufs(c->n, c->devices.data(), std::max(need, kArSlotBytes));
    out->custom = 1;
  }
  const int n = c->n;
  Barrier bar(n);
  std::vector<RankOut> outs(n);
  std::vector<std::vector<float>> checks(2 * n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; r++)
    ts.emplace_back([&, r] {
      try {
        bench_rank<T>(c, peer.get(), p, r, bar, outs[r], &checks);
      } catch (const std::exception& ex) {
        // The others stop at their next barrier; a kernel of theirs waiting for this rank
        // ends at the all-reduce's timeout (the abort word, for the custom one).
        outs[r].err = "rank " + std::to_string(r) + ": " + ex.what();
        if (peer) *reinterpret_cast<volatile int*>(peer->herr + kArMaxRanks) = 1;
        bar.fail();
      }
    });
  for (auto& t : ts) t.join();
  // The failure that stopped the others first.
  for (int pass = 0; pass < 2; pass++)
    for (int r = 0; r < n; r++)
      if (!outs[r].err.empty() && (pass == 1 || outs[r].err.find("another rank") == std::string::npos))
        throw Error(GOLLM_ERR_NCCL, outs[r].err);
  // The slowest rank's time a call, median over the replays.
  std::vector<float> worst(outs[0].ms.size(), 0.f);
  for (int r = 0; r < n; r++)
    for (size_t k = 0; k < worst.size(); k++) worst[k] = std::max(worst[k], outs[r].ms[k]);
  std::sort(worst.begin(), worst.end());
  out->us_per_call = worst.empty() ? 0.f : 1000.f * worst[worst.size() / 2];
  if (!p.check || p.method == GOLLM_AR_NCCL) return;
  const size_t sz = (size_t)p.rows * p.hidden;
  for (int k = 0; k < 2; k++) {
    std::vector<float> ref;
    reference<T>(p, n, k == 0 ? 1 : kCheckCalls, custom, ref);
    for (int r = 0; r < n; r++) {
      const std::vector<float>& got = checks[k * n + r];
      for (size_t i = 0; i < sz; i++) {
        out->max_err_h = std::max(out->max_err_h, std::fabs(got[i] - ref[i]));
        const float x = ref[sz + i];
        out->max_err_xn = std::max(out->max_err_xn, std::fabs(got[sz + i] - x) / std::max(1.f, std::fabs(x)));
        if (r > 0 && (std::memcmp(&got[i], &checks[k * n][i], 4) != 0 ||
                      std::memcmp(&got[sz + i], &checks[k * n][sz + i], 4) != 0))
          out->ranks_differ++;
      }
    }
  }
}

}  // namespace

void allreduce_bench(gollm_comm* c, const gollm_allreduce_params* p, gollm_allreduce_result* out) {
  if (!c || !p || !out) invalid("gollm_allreduce_bench: comm, params and out must not be NULL");
  *out = gollm_allreduce_result{};
  if (p->method < GOLLM_AR_CUSTOM || p->method > GOLLM_AR_TWO_SHOT)
    invalid("gollm_allreduce_bench: method %d is not a gollm_allreduce_method", p->method);
  if (p->dtype != GOLLM_DTYPE_F16 && p->dtype != GOLLM_DTYPE_BF16)
    invalid("gollm_allreduce_bench: dtype %d (want GOLLM_DTYPE_F16 or GOLLM_DTYPE_BF16)", p->dtype);
  if (p->rows < 1 || p->rows > 65536 || p->hidden < 8 || p->hidden > 65536 || p->hidden % 8 != 0 ||
      (int64_t)p->rows * p->hidden > (64 << 20))
    invalid("gollm_allreduce_bench: %d rows of %d (want 1..65536 rows, hidden a multiple of 8 up "
            "to 65536, at most 64 Mi elements)",
            p->rows, p->hidden);
  if (p->iters < 1 || p->iters > 10000 || p->reps < 1 || p->reps > 100)
    invalid("gollm_allreduce_bench: iters %d and reps %d (want 1..10000 and 1..100)", p->iters, p->reps);
  if (p->timeout_ms < 0 || p->timeout_ms > 600000)
    invalid("gollm_allreduce_bench: timeout_ms %d (want 0..600000)", p->timeout_ms);
  if (c->aborted.load()) throw Error(GOLLM_ERR_NCCL, "gollm_allreduce_bench: the communicators were aborted");
  if (p->dtype == GOLLM_DTYPE_BF16)
    bench_t<__nv_bfloat16>(c, *p, out);
  else
    bench_t<__half>(c, *p, out);
}

}  // namespace gollm

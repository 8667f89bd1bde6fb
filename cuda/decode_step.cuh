// decode_step.cuh — a whole decode step of a few sequences (one token each) as one
// persistent kernel: the embedding, every layer's five stages (LayerNorm+QKV+KV write,
// attention, output projection+residual, LayerNorm+MLP up+activation, MLP down+residual)
// and the LM head, separated by grid-wide barriers instead of kernel boundaries. Before
// each barrier a block prefetches into L2 the weights it reads after it, so the barrier's
// wait overlaps the next stage's memory traffic. Launched cooperatively (every block
// resident), so the barriers cannot deadlock.
#pragma once
#include <cooperative_groups.h>

#include "attention.cuh"
#include "gemv.cuh"

namespace gollm {

// StepLayer is a layer's weights as decode_step_kernel reads them (a device array).
struct StepLayer {
  const void *attn_w, *proj_w, *fc_w, *mlp_w;      // [out][in] T
  const float *attn_b, *proj_b, *fc_b, *mlp_b;     // biases
  const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;      // LayerNorms
};

// StepArgs are decode_step_kernel's operands.
struct StepArgs {
  const StepLayer* layers;  // [nlayers]
  int nlayers;
  const void* wte;          // [vocab][hidden] T
  const void* wpe;          // [positions][hidden] T
  const float *lnf_w, *lnf_b;
  int n;                    // token rows, each a sequence's one new token (n <= R)
  int hidden, inner, vocab, act;
  float eps;
  const int32_t *row_tok, *row_pos, *row_seq, *dec_rows, *blocks;
  const DevSeq* seqs;
  float* h;                 // [n][hidden] residual stream
  float* qkv;               // [n][3*hidden]
  void* att;                // [n][hidden] T
  void* fch;                // [n][inner] T
  void* kv;                 // the pool
  KVGeom geom;
  float *partial, *part_ml; // decode attention split-K
  int* tickets;
  int splits, max_len;
  const int32_t* lrow_src;  // rows whose logits are needed
  int nlogit;
  float* logits;            // [nlogit][vocab]
};

template <typename T, int R>
__global__ void __launch_bounds__(kGemvThreads) decode_step_kernel(StepArgs s) {
  extern __shared__ __align__(16) unsigned char step_smem[];
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  const int H = s.hidden, I = s.inner;
  const T* wte = static_cast<const T*>(s.wte);
  const T* wpe = static_cast<const T*>(s.wpe);
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < s.n * H;
       idx += gridDim.x * blockDim.x) {
    const int r = idx / H, c = idx % H;
    s.h[idx] = to_f32(wte[(int64_t)s.row_tok[r] * H + c]) + to_f32(wpe[(int64_t)s.row_pos[r] * H + c]);
  }
  const int wH = gemv_wpo(H), wI = gemv_wpo(I);
  GemvArgs a{};
  a.n = s.n;
  a.h = s.h;
  a.eps = s.eps;
  a.kv = s.kv;
  a.row_pos = s.row_pos;
  a.row_seq = s.row_seq;
  a.seqs = s.seqs;
  a.blocks = s.blocks;
  a.geom = s.geom;
  a.qscale = rsqrtf((float)s.geom.head_dim);
  a.act = s.act;
  for (int l = 0; l < s.nlayers; l++) {
    const StepLayer& L = s.layers[l];
    // LayerNorm 1, QKV, KV write.
    a.layer = l;
    a.w = L.attn_w, a.bias = L.attn_b, a.in = H, a.out = 3 * H, a.gamma = L.ln1_w, a.beta = L.ln1_b;
    a.y = s.qkv;
    gemv_prefetch<T>(a, wH);
    grid.sync();
    gemv_block<T, R, GEMV_IN_LN, GEMV_OUT_QKV>(a, wH, step_smem);
    grid.sync();
    // Attention, split over (row, head, part) items.
    const int items = s.n * s.geom.heads * s.splits;
    for (int it = blockIdx.x; it < items; it += gridDim.x) {
      const int part = it % s.splits, head = (it / s.splits) % s.geom.heads,
                i = it / (s.splits * s.geom.heads);
      decode_attend<T>(s.qkv, static_cast<T*>(s.att), static_cast<const T*>(s.kv), s.dec_rows,
                       s.row_pos, s.row_seq, s.seqs, s.blocks, s.geom, l, s.max_len, s.partial,
                       s.part_ml, s.tickets, i, head, part, s.splits,
                       reinterpret_cast<float*>(step_smem));
      __syncthreads();
    }
    // Output projection, residual.
    a.w = L.proj_w, a.bias = L.proj_b, a.in = H, a.out = H, a.x = s.att, a.hout = s.h;
    gemv_prefetch<T>(a, wH);
    grid.sync();
    gemv_block<T, R, GEMV_IN_T, GEMV_OUT_RESID>(a, wH, step_smem);
    // LayerNorm 2, MLP up, activation.
    a.w = L.fc_w, a.bias = L.fc_b, a.in = H, a.out = I, a.gamma = L.ln2_w, a.beta = L.ln2_b;
    a.y = s.fch;
    gemv_prefetch<T>(a, wH);
    grid.sync();
    gemv_block<T, R, GEMV_IN_LN, GEMV_OUT_ACT>(a, wH, step_smem);
    // MLP down, residual.
    a.w = L.mlp_w, a.bias = L.mlp_b, a.in = I, a.out = H, a.x = s.fch, a.hout = s.h;
    gemv_prefetch<T>(a, wI);
    grid.sync();
    gemv_block<T, R, GEMV_IN_T, GEMV_OUT_RESID>(a, wI, step_smem);
  }
  // Final LayerNorm and the LM head on the rows whose logits are needed.
  GemvArgs lm{};
  lm.n = s.nlogit, lm.h = s.h, lm.idx = s.lrow_src, lm.eps = s.eps;
  lm.gamma = s.lnf_w, lm.beta = s.lnf_b, lm.w = s.wte, lm.in = H, lm.out = s.vocab;
  lm.y = s.logits;
  gemv_prefetch<T>(lm, wH);
  grid.sync();
  gemv_block<T, R, GEMV_IN_LN, GEMV_OUT_F32>(lm, wH, step_smem);
}

// step_smem_bytes is decode_step_kernel's dynamic shared memory: the larger of the gemv
// input rows and the attention scratch.
inline size_t step_smem_bytes(int R, int hidden, int inner, int head_dim, int max_len) {
  size_t g = (size_t)R * std::max(hidden, inner) * 2;
  size_t at = decode_smem(head_dim, max_len, kGemvThreads);
  return std::max(g, at);
}

inline bool step_fits(int R, int hidden, int inner, int head_dim, int max_len) {
  return step_smem_bytes(R, hidden, inner, head_dim, max_len) <= 96 * 1024;
}

template <typename T, int R>
void step_allow_smem_one() {
  CUDA_CHECK(cudaFuncSetAttribute(decode_step_kernel<T, R>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
}

template <typename T>
void step_allow_smem() {
  step_allow_smem_one<T, 1>();
  step_allow_smem_one<T, 2>();
  step_allow_smem_one<T, 4>();
  step_allow_smem_one<T, 8>();
}

// decode_step_blocks is the grid: two blocks per SM when that many fit (fewer blocks make
// the barriers cheaper; two keep enough loads in flight).
template <typename T, int R>
int decode_step_blocks_r(int sms, size_t smem) {
  int per = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, decode_step_kernel<T, R>,
                                                           kGemvThreads, smem));
  if (per < 1) throw Error(GOLLM_ERR_INTERNAL, "decode_step_kernel does not fit on an SM");
  return sms * std::min(per, 2);
}

template <typename T>
void decode_step(const StepArgs& s, int sms, cudaStream_t stream) {
  const int R = gemv_rows(s.n);
  const size_t smem = step_smem_bytes(R, s.hidden, s.inner, s.geom.head_dim, s.max_len);
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = kGemvThreads;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t err;
  switch (R) {
    case 1:
      cfg.gridDim = decode_step_blocks_r<T, 1>(sms, smem);
      err = cudaLaunchKernelEx(&cfg, decode_step_kernel<T, 1>, s);
      break;
    case 2:
      cfg.gridDim = decode_step_blocks_r<T, 2>(sms, smem);
      err = cudaLaunchKernelEx(&cfg, decode_step_kernel<T, 2>, s);
      break;
    case 4:
      cfg.gridDim = decode_step_blocks_r<T, 4>(sms, smem);
      err = cudaLaunchKernelEx(&cfg, decode_step_kernel<T, 4>, s);
      break;
    default:
      cfg.gridDim = decode_step_blocks_r<T, 8>(sms, smem);
      err = cudaLaunchKernelEx(&cfg, decode_step_kernel<T, 8>, s);
      break;
  }
  CUDA_CHECK(err);
}

}  // namespace gollm

// weights.cu — the weight arena: every role the architecture has, in one device
// allocation, filled from the role-tagged host tensors of gollm_weights_params (matrices
// converted to the compute type and laid out [out][in], vectors to fp32).
#include <cstring>
#include <memory>

#include "convert.cuh"
#include "internal.h"

namespace gollm {

void DevMem::alloc(size_t n, const char* what) {
  reset();
  if (n == 0) return;
  maybe_fail_alloc(n, what);
  cudaError_t e = cudaMalloc(&p, n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    p = nullptr;
    char buf[256];
    std::snprintf(buf, sizeof buf, "allocate %zu bytes of device memory for %s: %s", n, what,
                  cudaGetErrorString(e));
    throw Error(GOLLM_ERR_OUT_OF_MEMORY, buf);
  }
  bytes = n;
}

void HostMem::alloc(size_t n, const char* what) {
  reset();
  if (n == 0) return;
  cudaError_t e = cudaHostAlloc(&p, n, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    p = nullptr;
    char buf[256];
    std::snprintf(buf, sizeof buf, "allocate %zu bytes of pinned host memory for %s: %s", n,
                  what, cudaGetErrorString(e));
    throw Error(GOLLM_ERR_OUT_OF_MEMORY, buf);
  }
  bytes = n;
}

void invalid(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  throw Error(GOLLM_ERR_INVALID_ARGUMENT, buf);
}

bool role_shape(const gollm_model_config& c, int role, int64_t& rows, int64_t& cols) {
  const Dims d(c);
  const bool layer_norm = c.norm == GOLLM_NORM_LAYER;
  cols = 1;
  switch (role) {
    case GOLLM_ROLE_EMBED: rows = d.V, cols = d.H; return true;
    case GOLLM_ROLE_POS_EMBED: rows = d.P, cols = d.H; return c.positions == GOLLM_POS_LEARNED;
    case GOLLM_ROLE_FINAL_NORM: case GOLLM_ROLE_ATTN_NORM: case GOLLM_ROLE_MLP_NORM:
      rows = d.H; return true;
    case GOLLM_ROLE_FINAL_NORM_BIAS: case GOLLM_ROLE_ATTN_NORM_BIAS: case GOLLM_ROLE_MLP_NORM_BIAS:
      rows = d.H; return layer_norm;
    case GOLLM_ROLE_LM_HEAD: rows = d.V, cols = d.H; return !c.tied_head;
    case GOLLM_ROLE_QKV: rows = d.qkv, cols = d.H; return true;
    case GOLLM_ROLE_QKV_BIAS: rows = d.qkv; return true;   // optional: see below
    case GOLLM_ROLE_OUT: rows = d.H, cols = d.att; return true;
    case GOLLM_ROLE_OUT_BIAS: rows = d.H; return true;     // optional
    case GOLLM_ROLE_UP: rows = d.up, cols = d.H; return true;
    case GOLLM_ROLE_UP_BIAS: rows = d.up; return true;     // optional
    case GOLLM_ROLE_DOWN: rows = d.H, cols = d.I; return true;
    case GOLLM_ROLE_DOWN_BIAS: rows = d.H; return true;    // optional
  }
  rows = 0;
  return false;
}

namespace {

// optional_role says whether a role may be absent even where role_shape allows it: the
// projections' biases (a model has them or not, all layers alike).
bool optional_role(int role) {
  return role == GOLLM_ROLE_QKV_BIAS || role == GOLLM_ROLE_OUT_BIAS ||
         role == GOLLM_ROLE_UP_BIAS || role == GOLLM_ROLE_DOWN_BIAS;
}

bool is_matrix(int role) {
  switch (role) {
    case GOLLM_ROLE_EMBED: case GOLLM_ROLE_POS_EMBED: case GOLLM_ROLE_LM_HEAD: case GOLLM_ROLE_QKV:
    case GOLLM_ROLE_OUT: case GOLLM_ROLE_UP: case GOLLM_ROLE_DOWN:
      return true;
  }
  return false;
}

const char* role_name(int role) {
  static const char* names[GOLLM_ROLES] = {
      "embed", "pos_embed", "final_norm", "final_norm_bias", "lm_head",
      "attn_norm", "attn_norm_bias", "qkv", "qkv_bias", "out", "out_bias",
      "mlp_norm", "mlp_norm_bias", "up", "up_bias", "down", "down_bias"};
  return role >= 0 && role < GOLLM_ROLES ? names[role] : "?";
}

size_t dtype_size(int dtype) { return dtype == GOLLM_DTYPE_F32 ? 4 : 2; }

void check_config(const gollm_model_config& c) {
  if (c.vocab_size < 1 || c.max_positions < 1 || c.hidden < 1 || c.layers < 1 || c.heads < 1 ||
      c.kv_heads < 1 || c.inner < 1)
    invalid("config: vocab_size=%d, max_positions=%d, hidden=%d, layers=%d, heads=%d, "
            "kv_heads=%d, inner=%d must all be at least 1",
            c.vocab_size, c.max_positions, c.hidden, c.layers, c.heads, c.kv_heads, c.inner);
  if (c.heads % c.kv_heads != 0)
    invalid("config: kv_heads %d does not divide heads %d", c.kv_heads, c.heads);
  if (c.head_dim % 8 != 0 || c.head_dim < 8 || c.head_dim > 256)
    invalid("config: head_dim %d must be a multiple of 8 from 8 to 256", c.head_dim);
  if (c.hidden % 8 != 0)
    invalid("config: hidden %d must be a multiple of 8", c.hidden);
  if (!(c.norm_eps > 0.f)) invalid("config: norm_eps %g must be positive", c.norm_eps);
  if (c.norm != GOLLM_NORM_LAYER && c.norm != GOLLM_NORM_RMS)
    invalid("config: norm %d is not a gollm_norm", c.norm);
  if (c.positions != GOLLM_POS_LEARNED && c.positions != GOLLM_POS_ROTARY)
    invalid("config: positions %d is not a gollm_positions", c.positions);
  if (c.positions == GOLLM_POS_ROTARY &&
      (c.rope_dim < 2 || c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim))
    invalid("config: rope_dim %d must be even, at least 2 and at most head_dim %d", c.rope_dim,
            c.head_dim);
  if (c.activation < GOLLM_ACT_GELU_TANH || c.activation > GOLLM_ACT_SILU)
    invalid("config: activation %d is not a gollm_activation", c.activation);
  if (c.sliding_window < 0 || c.window_from_layer < 0)
    invalid("config: sliding_window %d and window_from_layer %d must not be negative",
            c.sliding_window, c.window_from_layer);
  if (c.hidden > 16384) invalid("config: hidden %d exceeds 16384", c.hidden);
}

// upload copies one host tensor onto the device at dst (row offset applied by the caller),
// converted to the destination's type: matrices to T [rows][cols] (transposed from
// [cols][rows] when stored so), vectors to fp32.
void upload(const gollm_tensor& t, const char* what, bool matrix, int dtype, void* dst,
            DevMem& staging, cudaStream_t stream) {
  if (!t.data) invalid("%s: no data", what);
  if (t.dtype < GOLLM_DTYPE_F32 || t.dtype > GOLLM_DTYPE_BF16)
    invalid("%s: dtype %d is not F32, F16 or BF16", what, t.dtype);
  const int64_t n = t.rows * t.cols;
  const size_t bytes = (size_t)n * dtype_size(t.dtype);
  if (staging.bytes < bytes) staging.alloc(bytes, "weight staging");
  CUDA_CHECK(cudaMemcpyAsync(staging.p, t.data, bytes, cudaMemcpyHostToDevice, stream));
  if (!matrix)
    convert<float>(staging.p, t.dtype, static_cast<float*>(dst), n, stream);
  else if (t.transposed && dtype == GOLLM_DTYPE_BF16)
    convert_transpose<__nv_bfloat16>(staging.p, t.dtype, static_cast<__nv_bfloat16*>(dst),
                                     (int)t.cols, (int)t.rows, stream);
  else if (t.transposed)
    convert_transpose<__half>(staging.p, t.dtype, static_cast<__half*>(dst), (int)t.cols,
                              (int)t.rows, stream);
  else if (dtype == GOLLM_DTYPE_BF16)
    convert<__nv_bfloat16>(staging.p, t.dtype, static_cast<__nv_bfloat16*>(dst), n, stream);
  else
    convert<__half>(staging.p, t.dtype, static_cast<__half*>(dst), n, stream);
  // The staging buffer is reused by the next tensor; the host data may be unmapped.
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

void create_weights(const gollm_weights_params* p, gollm_weights** out) {
  if (!p || !out) invalid("gollm_weights_create: params and out must not be NULL");
  const gollm_model_config& c = p->config;
  check_config(c);
  if (p->dtype != GOLLM_DTYPE_F16 && p->dtype != GOLLM_DTYPE_BF16)
    invalid("dtype %d: the engine computes in F16 (1) or BF16 (2)", p->dtype);
  if (p->num_weights < 0 || (p->num_weights > 0 && !p->weights))
    invalid("weights: %d entries at %p", p->num_weights, (const void*)p->weights);
  if (c.positions == GOLLM_POS_ROTARY && !p->rope_inv_freq)
    invalid("rope_inv_freq: NULL under rotary positions");
  DeviceGuard dg(p->device);
  std::unique_ptr<gollm_weights> w(new gollm_weights);
  w->device = p->device;
  w->dtype = p->dtype;
  w->cfg = c;

  // Which roles each slot (the model's, then each layer's) receives, and how many rows.
  const int slots = 1 + c.layers;
  auto slot_of = [&](int role, int layer) {
    return role < GOLLM_FIRST_LAYER_ROLE ? (layer == -1 ? 0 : -1)
                                         : (layer >= 0 && layer < c.layers ? 1 + layer : -1);
  };
  std::vector<int64_t> given((size_t)slots * GOLLM_ROLES, 0);
  for (int i = 0; i < p->num_weights; i++) {
    const gollm_weight& wt = p->weights[i];
    if (wt.role < 0 || wt.role >= GOLLM_ROLES) invalid("weights[%d]: role %d is not a gollm_role", i, wt.role);
    const int slot = slot_of(wt.role, wt.layer);
    if (slot < 0) invalid("weights[%d] (%s): layer %d outside the model", i, role_name(wt.role), wt.layer);
    int64_t rows, cols;
    if (!role_shape(c, wt.role, rows, cols))
      invalid("weights[%d]: the architecture has no %s", i, role_name(wt.role));
    if (wt.part.rows < 1 || wt.part.cols != cols)
      invalid("layer %d %s: a part of %lld×%lld does not fit [%lld][%lld]", wt.layer,
              role_name(wt.role), (long long)wt.part.rows, (long long)wt.part.cols,
              (long long)rows, (long long)cols);
    given[(size_t)slot * GOLLM_ROLES + wt.role] += wt.part.rows;
  }
  // Every role present with all its rows; an optional bias absent in every layer or none.
  bool has_opt[GOLLM_ROLES] = {};
  for (int slot = 0; slot < slots; slot++) {
    const int layer = slot - 1;
    for (int r = slot == 0 ? 0 : GOLLM_FIRST_LAYER_ROLE; r < (slot == 0 ? GOLLM_FIRST_LAYER_ROLE : GOLLM_ROLES); r++) {
      int64_t rows, cols;
      const int64_t got = given[(size_t)slot * GOLLM_ROLES + r];
      if (!role_shape(c, r, rows, cols)) continue;
      if (optional_role(r)) {
        if (slot == 1) has_opt[r] = got > 0;
        if ((got > 0) != has_opt[r])
          invalid("%s: given in some layers and not in layer %d", role_name(r), layer);
        if (got == 0) continue;
      }
      if (got != rows)
        invalid("layer %d %s: %lld rows given, the config implies %lld", layer, role_name(r),
                (long long)got, (long long)rows);
    }
  }

  // Arena layout: matrices in the compute type, vectors in fp32, each 256-byte aligned. The
  // LM head's matrix (the embedding's, when tied) gets zero rows up to lm_head_ld(vocab),
  // so that its GEMM has no odd dimension (cuBLAS takes a slow kernel for GPT-2's 50,257).
  const size_t es = 2;
  auto head_role = [&](int r) {
    return r == GOLLM_ROLE_LM_HEAD || (c.tied_head && r == GOLLM_ROLE_EMBED);
  };
  size_t off = 0;
  std::vector<size_t> where((size_t)slots * GOLLM_ROLES, SIZE_MAX);
  for (int slot = 0; slot < slots; slot++)
    for (int r = 0; r < GOLLM_ROLES; r++) {
      if (given[(size_t)slot * GOLLM_ROLES + r] == 0) continue;
      int64_t rows, cols;
      role_shape(c, r, rows, cols);
      if (slot == 0 && head_role(r)) rows = lm_head_ld((int)rows);
      where[(size_t)slot * GOLLM_ROLES + r] = off;
      off = align_up(off + (size_t)(rows * cols) * (is_matrix(r) ? es : 4));
    }
  const size_t freq_off = off;
  if (c.positions == GOLLM_POS_ROTARY) off = align_up(off + (size_t)c.rope_dim / 2 * 4);
  w->arena.alloc(off, "weights");
  char* base = w->arena.as<char>();
  auto at = [&](int slot, int r) -> void* {
    const size_t o = where[(size_t)slot * GOLLM_ROLES + r];
    return o == SIZE_MAX ? nullptr : base + o;
  };

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> sguard(
      stream, [](cudaStream_t s) { cudaStreamDestroy(s); });
  DevMem staging;
  std::vector<int64_t> filled((size_t)slots * GOLLM_ROLES, 0);
  for (int i = 0; i < p->num_weights; i++) {
    const gollm_weight& wt = p->weights[i];
    const int slot = slot_of(wt.role, wt.layer);
    int64_t& row = filled[(size_t)slot * GOLLM_ROLES + wt.role];
    const bool matrix = is_matrix(wt.role);
    char* dst = static_cast<char*>(at(slot, wt.role)) + (size_t)(row * wt.part.cols) * (matrix ? es : 4);
    char what[96];
    std::snprintf(what, sizeof what, "layer %d %s rows %lld…", wt.layer, role_name(wt.role), (long long)row);
    upload(wt.part, what, matrix, p->dtype, dst, staging, stream);
    row += wt.part.rows;
  }
  for (int r = 0; r < GOLLM_FIRST_LAYER_ROLE; r++) {
    int64_t rows, cols;
    if (!at(0, r) || !head_role(r) || !role_shape(c, r, rows, cols)) continue;
    CUDA_CHECK(cudaMemset(static_cast<char*>(at(0, r)) + (size_t)(rows * cols) * es, 0,
                          (size_t)((lm_head_ld((int)rows) - rows) * cols) * es));
  }
  if (c.positions == GOLLM_POS_ROTARY) {
    CUDA_CHECK(cudaMemcpy(base + freq_off, p->rope_inv_freq, (size_t)c.rope_dim / 2 * 4,
                          cudaMemcpyHostToDevice));
    w->inv_freq = reinterpret_cast<const float*>(base + freq_off);
  }

  w->embed = at(0, GOLLM_ROLE_EMBED);
  w->pos = at(0, GOLLM_ROLE_POS_EMBED);
  w->final_w = static_cast<const float*>(at(0, GOLLM_ROLE_FINAL_NORM));
  w->final_b = static_cast<const float*>(at(0, GOLLM_ROLE_FINAL_NORM_BIAS));
  w->lm_head = c.tied_head ? w->embed : at(0, GOLLM_ROLE_LM_HEAD);
  w->layers.resize(c.layers);
  for (int l = 0; l < c.layers; l++) {
    LayerW& L = w->layers[l];
    const int s = 1 + l;
    L.norm1_w = static_cast<const float*>(at(s, GOLLM_ROLE_ATTN_NORM));
    L.norm1_b = static_cast<const float*>(at(s, GOLLM_ROLE_ATTN_NORM_BIAS));
    L.qkv_w = at(s, GOLLM_ROLE_QKV);
    L.qkv_b = static_cast<const float*>(at(s, GOLLM_ROLE_QKV_BIAS));
    L.out_w = at(s, GOLLM_ROLE_OUT);
    L.out_b = static_cast<const float*>(at(s, GOLLM_ROLE_OUT_BIAS));
    L.norm2_w = static_cast<const float*>(at(s, GOLLM_ROLE_MLP_NORM));
    L.norm2_b = static_cast<const float*>(at(s, GOLLM_ROLE_MLP_NORM_BIAS));
    L.up_w = at(s, GOLLM_ROLE_UP);
    L.up_b = static_cast<const float*>(at(s, GOLLM_ROLE_UP_BIAS));
    L.down_w = at(s, GOLLM_ROLE_DOWN);
    L.down_b = static_cast<const float*>(at(s, GOLLM_ROLE_DOWN_BIAS));
  }
  *out = w.release();
}

void release_weights(gollm_weights* w) {
  if (w && w->refs.fetch_sub(1) == 1) {
    cudaSetDevice(w->device);
    delete w;
  }
}

}  // namespace gollm

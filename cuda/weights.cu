// weights.cu — the weight arena: every role the architecture has, in one device
// allocation, filled from the role-tagged host tensors of gollm_weights_params (matrices
// converted to the compute type and laid out [out][in], vectors to fp32); and the recipe,
// checked against what the forward pass walks, with each stage's weights resolved.
#include <cmath>
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
    case GOLLM_ROLE_Q_NORM: case GOLLM_ROLE_K_NORM: rows = d.D; return c.qk_norm != 0;
    case GOLLM_ROLE_POST_ATTN_NORM: case GOLLM_ROLE_POST_MLP_NORM: rows = d.H; return c.post_norms != 0;
    // The experts' roles (a sparse layer's: layer_role_shape).
    case GOLLM_ROLE_ROUTER: rows = c.experts, cols = d.H; return c.experts > 0;
    // Under expert parallelism the experts held (local_experts); the router scores all.
    case GOLLM_ROLE_EXPERT_UP: rows = (int64_t)held_experts(c) * 2 * c.moe_inner, cols = d.H; return c.experts > 0;
    case GOLLM_ROLE_EXPERT_DOWN: rows = (int64_t)held_experts(c) * d.H, cols = c.moe_inner; return c.experts > 0;
    case GOLLM_ROLE_SHARED_UP: rows = 2 * (int64_t)c.shared_inner, cols = d.H; return c.experts > 0 && c.shared_inner > 0;
    case GOLLM_ROLE_SHARED_DOWN: rows = d.H, cols = c.shared_inner; return c.experts > 0 && c.shared_inner > 0;
    case GOLLM_ROLE_SHARED_GATE: rows = 1, cols = d.H; return c.experts > 0 && c.shared_inner > 0;
  }
  rows = 0;
  return false;
}

bool layer_role_shape(const gollm_model_config& c, bool sparse, int role, int64_t& rows, int64_t& cols) {
  switch (role) {
    case GOLLM_ROLE_UP: case GOLLM_ROLE_UP_BIAS: case GOLLM_ROLE_DOWN: case GOLLM_ROLE_DOWN_BIAS:
      if (sparse) return rows = 0, false;
      break;
    case GOLLM_ROLE_ROUTER: case GOLLM_ROLE_EXPERT_UP: case GOLLM_ROLE_EXPERT_DOWN:
    case GOLLM_ROLE_SHARED_UP: case GOLLM_ROLE_SHARED_DOWN: case GOLLM_ROLE_SHARED_GATE:
      if (!sparse) return rows = 0, false;
      break;
  }
  return role_shape(c, role, rows, cols);
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
    case GOLLM_ROLE_OUT: case GOLLM_ROLE_UP: case GOLLM_ROLE_DOWN: case GOLLM_ROLE_ROUTER:
    case GOLLM_ROLE_EXPERT_UP: case GOLLM_ROLE_EXPERT_DOWN: case GOLLM_ROLE_SHARED_UP:
    case GOLLM_ROLE_SHARED_DOWN: case GOLLM_ROLE_SHARED_GATE:
      return true;
  }
  return false;
}

const char* role_name(int role) {
  static const char* names[GOLLM_ROLES] = {
      "embed", "pos_embed", "final_norm", "final_norm_bias", "lm_head",
      "attn_norm", "attn_norm_bias", "qkv", "qkv_bias", "out", "out_bias",
      "mlp_norm", "mlp_norm_bias", "up", "up_bias", "down", "down_bias",
      "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm",
      "router", "expert_up", "expert_down", "shared_up", "shared_down", "shared_gate"};
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
  if (c.norm != GOLLM_NORM_LAYER && c.norm != GOLLM_NORM_RMS)
    invalid("config: norm %d is not a gollm_norm", c.norm);
  if (c.positions != GOLLM_POS_LEARNED && c.positions != GOLLM_POS_ROTARY)
    invalid("config: positions %d is not a gollm_positions", c.positions);
  if (c.hidden > 16384) invalid("config: hidden %d exceeds 16384", c.hidden);
  if (c.experts < 0 || c.experts > kMoeMaxExperts || c.moe_inner < 0 || c.moe_inner > (1 << 18) ||
      c.shared_inner < 0 || c.shared_inner > (1 << 18) || (c.experts > 0) != (c.moe_inner > 0) ||
      (c.experts == 0 && c.shared_inner > 0))
    invalid("config: experts %d (at most %d), moe_inner %d and shared_inner %d (at most 262144) do not "
            "describe experts, or their absence",
            c.experts, kMoeMaxExperts, c.moe_inner, c.shared_inner);
  if (c.local_experts < 0 || c.expert_first < 0 || (int64_t)c.expert_first + c.local_experts > c.experts ||
      (c.local_experts == 0 && c.expert_first != 0))
    invalid("config: expert_first %d and local_experts %d do not name a run of the %d experts", c.expert_first,
            c.local_experts, c.experts);
}

const char* stage_name(int kind) {
  static const char* names[GOLLM_STAGE_KINDS] = {"embed",    "norm",    "qkv",     "rotary",
                                                 "kv_write", "attention", "out",   "mlp",
                                                 "residual", "lm_head", "qk_norm", "post_norm",
                                                 "moe"};
  return kind >= 0 && kind < GOLLM_STAGE_KINDS ? names[kind] : "?";
}

// stage_fail throws for recipe stage i, naming it.
[[noreturn]] void stage_fail(int i, const gollm_stage& s, const char* what) {
  invalid("recipe stage %d (%s, layer %d): %s", i, stage_name(s.kind), s.layer, what);
}

// check_values refuses a stage's values out of range.
void check_values(const gollm_weights_params* p, int i) {
  const gollm_model_config& c = p->config;
  const gollm_stage& s = p->stages[i];
  char buf[256];
  switch (s.kind) {
    case GOLLM_STAGE_NORM:
      if (s.norm != c.norm) stage_fail(i, s, "its norm kind is not the config's");
      if (!(s.eps > 0.f) || !std::isfinite(s.eps)) stage_fail(i, s, "eps must be positive and finite");
      if (s.weight != (s.layer < 0 ? GOLLM_ROLE_FINAL_NORM : GOLLM_ROLE_ATTN_NORM) &&
          !(s.layer >= 0 && s.weight == GOLLM_ROLE_MLP_NORM))
        stage_fail(i, s, "weight is not a norm role of its layer (ATTN_NORM, MLP_NORM; FINAL_NORM at -1)");
      break;
    case GOLLM_STAGE_QK_NORM:
    case GOLLM_STAGE_POST_NORM:
      if (s.norm != GOLLM_NORM_RMS) stage_fail(i, s, "only RMSNorm is implemented for it");
      if (!(s.eps > 0.f) || !std::isfinite(s.eps)) stage_fail(i, s, "eps must be positive and finite");
      if (s.kind == GOLLM_STAGE_QK_NORM ? s.weight != GOLLM_ROLE_Q_NORM
                                        : s.weight != GOLLM_ROLE_POST_ATTN_NORM && s.weight != GOLLM_ROLE_POST_MLP_NORM)
        stage_fail(i, s, "weight is not its role (Q_NORM; POST_ATTN_NORM or POST_MLP_NORM)");
      break;
    case GOLLM_STAGE_ROTARY: {
      if (c.positions != GOLLM_POS_ROTARY) stage_fail(i, s, "the config has learned positions");
      if (s.rope_dim < 2 || s.rope_dim % 2 != 0 || s.rope_dim > c.head_dim) {
        std::snprintf(buf, sizeof buf, "rope_dim %d must be even, at least 2 and at most head_dim %d",
                      s.rope_dim, c.head_dim);
        stage_fail(i, s, buf);
      }
      // Longrope's long set follows its short one.
      const int64_t sets = s.rope_long > 0 ? 2 : 1;
      if (s.rope_long < 0) stage_fail(i, s, "rope_long must not be negative");
      if (s.rope_freqs < 0 || (int64_t)s.rope_freqs + sets * (s.rope_dim / 2) > p->num_rope_freqs || !p->rope_freqs) {
        std::snprintf(buf, sizeof buf, "its %lld frequencies from %d pass the %d given",
                      (long long)(sets * (s.rope_dim / 2)), s.rope_freqs, p->num_rope_freqs);
        stage_fail(i, s, buf);
      }
      if (!(s.rope_scale > 0.f) || !std::isfinite(s.rope_scale)) stage_fail(i, s, "rope_scale must be positive and finite");
      break;
    }
    case GOLLM_STAGE_ATTENTION:
      if (s.window < 0) stage_fail(i, s, "window must not be negative");
      if (!(s.scale > 0.f) || !std::isfinite(s.scale)) stage_fail(i, s, "scale must be positive and finite");
      if (!(s.softcap >= 0.f) || !std::isfinite(s.softcap)) stage_fail(i, s, "softcap must be 0 or positive and finite");
      break;
    case GOLLM_STAGE_EMBED:
      if (!(s.scale >= 0.f) || !std::isfinite(s.scale)) stage_fail(i, s, "scale must be 0 or positive and finite");
      break;
    case GOLLM_STAGE_LM_HEAD:
      if (!(s.softcap >= 0.f) || !std::isfinite(s.softcap)) stage_fail(i, s, "softcap must be 0 or positive and finite");
      break;
    case GOLLM_STAGE_MLP:
      if (s.activation < GOLLM_ACT_GELU_TANH || s.activation > GOLLM_ACT_SILU)
        stage_fail(i, s, "activation is not a gollm_activation");
      if ((s.gated != 0) != (c.gated_mlp != 0)) stage_fail(i, s, "gated is not the config's gated_mlp");
      break;
    case GOLLM_STAGE_MOE:
      if (c.experts < 1) stage_fail(i, s, "the config has no experts");
      if (s.experts != c.experts) stage_fail(i, s, "experts is not the config's");
      if (s.top_k < 1 || s.top_k > s.experts || s.top_k > kMoeMaxTopK) {
        std::snprintf(buf, sizeof buf, "top_k %d must be in [1, min(experts %d, %d)]", s.top_k, s.experts,
                      kMoeMaxTopK);
        stage_fail(i, s, buf);
      }
      if (s.activation < GOLLM_ACT_GELU_TANH || s.activation > GOLLM_ACT_SILU)
        stage_fail(i, s, "activation is not a gollm_activation");
      if (s.gated != 1) stage_fail(i, s, "experts are gated MLPs (gated 1)");
      if ((s.shared != 0) != (c.shared_inner > 0)) stage_fail(i, s, "shared is not the config's shared_inner > 0");
      break;
  }
}

}  // namespace

// The forward pass walks a pre-norm decoder (forward.cu): EMBED, then per layer NORM, QKV,
// [QK_NORM], [ROTARY], KV_WRITE, ATTENTION, OUT, [POST_NORM], RESIDUAL, NORM, MLP or MOE,
// [POST_NORM], RESIDUAL, then NORM, LM_HEAD. Its dispatchers rely on that order — a NORM
// after EMBED and after each RESIDUAL, computed by their kernels; the q/k norm, rotary and
// KV write right after the QKV projection, applied by its epilogue; a post-norm right
// before the RESIDUAL that applies it —, so any other is refused here, naming the first
// stage out of place.
void check_recipe(const gollm_weights_params* p) {
  const gollm_model_config& c = p->config;
  const int n = p->num_stages;
  if (n < 3 || !p->stages) invalid("recipe: %d stages at %p", n, (const void*)p->stages);
  if (p->num_rope_freqs < 0) invalid("recipe: %d rotary frequencies", p->num_rope_freqs);
  // The layer's stages after its first, in order; ROTARY is there under rotary positions,
  // QK_NORM with the config's qk_norm, POST_NORM (twice) with its post_norms.
  static const int body[] = {GOLLM_STAGE_QKV,       GOLLM_STAGE_QK_NORM,  GOLLM_STAGE_ROTARY,
                             GOLLM_STAGE_KV_WRITE,  GOLLM_STAGE_ATTENTION, GOLLM_STAGE_OUT,
                             GOLLM_STAGE_POST_NORM, GOLLM_STAGE_RESIDUAL, GOLLM_STAGE_NORM,
                             GOLLM_STAGE_MLP,       GOLLM_STAGE_POST_NORM, GOLLM_STAGE_RESIDUAL};
  auto present = [&](int kind) {
    switch (kind) {
      case GOLLM_STAGE_ROTARY: return c.positions == GOLLM_POS_ROTARY;
      case GOLLM_STAGE_QK_NORM: return c.qk_norm != 0;
      case GOLLM_STAGE_POST_NORM: return c.post_norms != 0;
    }
    return true;
  };
  int i = 0;
  auto expect = [&](int kind, int layer) {
    if (i >= n) invalid("recipe: ends after %d stages, before %s of layer %d", n, stage_name(kind), layer);
    const gollm_stage& s = p->stages[i];
    // A layer's MLP is dense or a mixture of experts.
    if (kind == GOLLM_STAGE_MLP && s.kind == GOLLM_STAGE_MOE) kind = GOLLM_STAGE_MOE;
    if (s.kind != kind || s.layer != layer) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "out of place: the forward pass walks %s of layer %d here",
                    stage_name(kind), layer);
      stage_fail(i, s, buf);
    }
    check_values(p, i);
    i++;
  };
  expect(GOLLM_STAGE_EMBED, -1);
  for (int l = 0; l < c.layers; l++) {
    expect(GOLLM_STAGE_NORM, l);
    for (int k : body)
      if (present(k)) expect(k, l);
  }
  expect(GOLLM_STAGE_NORM, -1);
  expect(GOLLM_STAGE_LM_HEAD, -1);
  if (i != n) stage_fail(i, p->stages[i], "past the LM head");
}

namespace {

// upload copies one host tensor onto the device at dst (row offset applied by the caller),
// converted to the destination's type: matrices to T [rows][cols] (transposed from
// [cols][rows] when stored so), vectors to fp32.
void upload(const gollm_tensor& t, const char* what, bool matrix, int dtype, void* dst,
            DevMem& staging, cudaStream_t stream) {
  if (!t.data) invalid("%s: no data", what);
  if (t.dtype < GOLLM_DTYPE_F32 || t.dtype > GOLLM_DTYPE_BF16)
    invalid("%s: dtype %d is not F32, F16 or BF16 (F8E4M3: the projections only)", what, t.dtype);
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

// fp8_role says whether a role may be stored in FP8 (fp8.cuh's projections).
bool fp8_role(int role) {
  return role == GOLLM_ROLE_QKV || role == GOLLM_ROLE_OUT || role == GOLLM_ROLE_UP || role == GOLLM_ROLE_DOWN;
}

// upload_fp8 copies an F8E4M3 part's bytes to dst ([rows][cols]) and its scales, each
// repeated over its block, to sdst ([rows][ceil(cols/128)], fp8.cuh's layout), on stream as
// upload does.
void upload_fp8(const gollm_tensor& t, const char* what, uint8_t* dst, float* sdst, cudaStream_t stream) {
  if (!t.data || !t.scale) invalid("%s: F8E4M3 without %s", what, t.data ? "scales" : "data");
  const int64_t G = (t.cols + kFp8Group - 1) / kFp8Group;
  const int64_t bc = std::min<int64_t>(t.block_cols, t.cols), sc = (t.cols + t.block_cols - 1) / t.block_cols;
  std::vector<float> sv((size_t)(t.rows * G));
  for (int64_t r = 0; r < t.rows; r++)
    for (int64_t g = 0; g < G; g++) {
      const float v = t.scale[(r / t.block_rows) * sc + g * kFp8Group / bc];
      if (!(v > 0.f) || !std::isfinite(v)) invalid("%s: scale of row %lld, column %lld is %g", what, (long long)r, (long long)(g * kFp8Group), v);
      sv[(size_t)(r * G + g)] = v;
    }
  CUDA_CHECK(cudaMemcpyAsync(dst, t.data, (size_t)(t.rows * t.cols), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(sdst, sv.data(), sv.size() * 4, cudaMemcpyHostToDevice, stream));
  // sv goes, and the host data may be unmapped.
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
  check_recipe(p);
  AllocFault af(p->faults.fail_alloc);
  DeviceGuard dg(p->device);
  std::unique_ptr<gollm_weights> w(new gollm_weights);
  w->device = p->device;
  w->dtype = p->dtype;
  w->cfg = c;

  // Which roles each slot (the model's, then each layer's) receives, and how many rows. A
  // layer whose MLP is the experts (its recipe's MOE stage) holds their roles, not UP/DOWN.
  const int slots = 1 + c.layers;
  std::vector<char> sparse(c.layers, 0);
  for (int i = 0; i < p->num_stages; i++)
    if (p->stages[i].kind == GOLLM_STAGE_MOE) sparse[p->stages[i].layer] = 1;
  auto slot_shape = [&](int slot, int role, int64_t& rows, int64_t& cols) {
    return slot == 0 ? role_shape(c, role, rows, cols) : layer_role_shape(c, sparse[slot - 1], role, rows, cols);
  };
  auto slot_of = [&](int role, int layer) {
    return role < GOLLM_FIRST_LAYER_ROLE ? (layer == -1 ? 0 : -1)
                                         : (layer >= 0 && layer < c.layers ? 1 + layer : -1);
  };
  std::vector<int64_t> given((size_t)slots * GOLLM_ROLES, 0);
  int fp8_parts = 0, float_parts = 0;
  for (int i = 0; i < p->num_weights; i++) {
    const gollm_weight& wt = p->weights[i];
    if (wt.role < 0 || wt.role >= GOLLM_ROLES) invalid("weights[%d]: role %d is not a gollm_role", i, wt.role);
    const int slot = slot_of(wt.role, wt.layer);
    if (slot < 0) invalid("weights[%d] (%s): layer %d outside the model", i, role_name(wt.role), wt.layer);
    int64_t rows, cols;
    if (!slot_shape(slot, wt.role, rows, cols))
      invalid("weights[%d]: layer %d of the architecture has no %s", i, wt.layer, role_name(wt.role));
    if (wt.part.rows < 1 || wt.part.cols != cols)
      invalid("layer %d %s: a part of %lld×%lld does not fit [%lld][%lld]", wt.layer,
              role_name(wt.role), (long long)wt.part.rows, (long long)wt.part.cols,
              (long long)rows, (long long)cols);
    if (wt.part.dtype == GOLLM_DTYPE_F8E4M3) {
      const gollm_tensor& t = wt.part;
      if (!fp8_role(wt.role) || t.transposed)
        invalid("layer %d %s: F8E4M3 is for the projections QKV, OUT, UP and DOWN, stored [out][in]", wt.layer, role_name(wt.role));
      if (t.cols % 16 != 0 || t.block_rows < 1 || t.block_cols < 1 ||
          (t.block_cols % kFp8Group != 0 && t.block_cols < t.cols))
        invalid("layer %d %s: F8E4M3 of %lld columns with scale blocks of %d×%d (want columns a multiple of 16, "
                "blocks a multiple of 128 columns or whole rows)",
                wt.layer, role_name(wt.role), (long long)t.cols, t.block_rows, t.block_cols);
      fp8_parts++;
    } else if (fp8_role(wt.role)) {
      float_parts++;
    }
    given[(size_t)slot * GOLLM_ROLES + wt.role] += wt.part.rows;
  }
  if (fp8_parts > 0 && float_parts > 0)
    invalid("weights: %d projection parts are F8E4M3 and %d are not; FP8 needs every QKV, OUT, UP and DOWN "
            "part in FP8", fp8_parts, float_parts);
  w->fp8 = fp8_parts > 0;
  if (w->fp8) {
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p->device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, p->device));
    if (major * 10 + minor < 89)
      invalid("FP8 weights need a GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell); GPU %d is %d.%d",
              p->device, major, minor);
  }
  // Every role present with all its rows; an optional bias absent in every layer or none.
  bool has_opt[GOLLM_ROLES] = {};
  for (int slot = 0; slot < slots; slot++) {
    const int layer = slot - 1;
    for (int r = slot == 0 ? 0 : GOLLM_FIRST_LAYER_ROLE; r < (slot == 0 ? GOLLM_FIRST_LAYER_ROLE : GOLLM_ROLES); r++) {
      int64_t rows, cols;
      const int64_t got = given[(size_t)slot * GOLLM_ROLES + r];
      if (!slot_shape(slot, r, rows, cols)) continue;
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
  // FP8 projections: one byte a weight, then their scales [rows][ceil(cols/128)] fp32.
  size_t off = 0;
  std::vector<size_t> where((size_t)slots * GOLLM_ROLES, SIZE_MAX);
  std::vector<size_t> where_s((size_t)slots * GOLLM_ROLES, SIZE_MAX);
  for (int slot = 0; slot < slots; slot++)
    for (int r = 0; r < GOLLM_ROLES; r++) {
      if (given[(size_t)slot * GOLLM_ROLES + r] == 0) continue;
      int64_t rows, cols;
      slot_shape(slot, r, rows, cols);
      if (slot == 0 && head_role(r)) rows = lm_head_ld((int)rows);
      where[(size_t)slot * GOLLM_ROLES + r] = off;
      if (w->fp8 && fp8_role(r)) {
        off = align_up(off + (size_t)(rows * cols));
        where_s[(size_t)slot * GOLLM_ROLES + r] = off;
        off = align_up(off + (size_t)(rows * ((cols + kFp8Group - 1) / kFp8Group)) * 4);
        continue;
      }
      off = align_up(off + (size_t)(rows * cols) * (is_matrix(r) ? es : 4));
    }
  const size_t freq_off = off;
  off = align_up(off + (size_t)p->num_rope_freqs * 4);
  w->arena.alloc(off, "weights");
  char* base = w->arena.as<char>();
  auto at = [&](int slot, int r) -> void* {
    const size_t o = where[(size_t)slot * GOLLM_ROLES + r];
    return o == SIZE_MAX ? nullptr : base + o;
  };
  auto scales = [&](int slot, int r) -> const float* {
    const size_t o = where_s[(size_t)slot * GOLLM_ROLES + r];
    return o == SIZE_MAX ? nullptr : reinterpret_cast<const float*>(base + o);
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
    char what[96];
    std::snprintf(what, sizeof what, "layer %d %s rows %lld…", wt.layer, role_name(wt.role), (long long)row);
    if (wt.part.dtype == GOLLM_DTYPE_F8E4M3) {
      const int64_t G = (wt.part.cols + kFp8Group - 1) / kFp8Group;
      upload_fp8(wt.part, what, static_cast<uint8_t*>(at(slot, wt.role)) + (size_t)(row * wt.part.cols),
                 reinterpret_cast<float*>(base + where_s[(size_t)slot * GOLLM_ROLES + wt.role]) + (size_t)(row * G),
                 stream);
      row += wt.part.rows;
      continue;
    }
    char* dst = static_cast<char*>(at(slot, wt.role)) + (size_t)(row * wt.part.cols) * (matrix ? es : 4);
    upload(wt.part, what, matrix, p->dtype, dst, staging, stream);
    row += wt.part.rows;
  }
  for (int r = 0; r < GOLLM_FIRST_LAYER_ROLE; r++) {
    int64_t rows, cols;
    if (!at(0, r) || !head_role(r) || !role_shape(c, r, rows, cols)) continue;
    CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(at(0, r)) + (size_t)(rows * cols) * es, 0,
                               (size_t)((lm_head_ld((int)rows) - rows) * cols) * es, stream));
  }
  const float* freqs = reinterpret_cast<const float*>(base + freq_off);
  if (p->num_rope_freqs > 0)
    CUDA_CHECK(cudaMemcpyAsync(base + freq_off, p->rope_freqs, (size_t)p->num_rope_freqs * 4,
                               cudaMemcpyHostToDevice, stream));
  // Every copy and memset of the load went on stream, which an engine's stream does not
  // wait for: done before the weights are handed out.
  CUDA_CHECK(cudaStreamSynchronize(stream));

  w->embed = at(0, GOLLM_ROLE_EMBED);
  w->pos = at(0, GOLLM_ROLE_POS_EMBED);
  w->lm_head = c.tied_head ? w->embed : at(0, GOLLM_ROLE_LM_HEAD);
  // Each stage's weights, and the values the stages around QKV and KV_WRITE give their
  // epilogue: the layer's rotary and attention scale (check_recipe fixed their places).
  const int n = p->num_stages;
  w->recipe.resize(n);
  for (int i = 0; i < n; i++) {
    Stage& st = w->recipe[i];
    st.s = p->stages[i];
    const int slot = st.s.layer + 1;
    switch (st.s.kind) {
      case GOLLM_STAGE_NORM:
        st.gamma = static_cast<const float*>(at(slot, st.s.weight));
        st.beta = static_cast<const float*>(at(slot, st.s.weight + 1));
        break;
      case GOLLM_STAGE_QK_NORM:
        st.gamma = static_cast<const float*>(at(slot, GOLLM_ROLE_Q_NORM));
        st.beta = static_cast<const float*>(at(slot, GOLLM_ROLE_K_NORM));
        break;
      case GOLLM_STAGE_POST_NORM:
        st.gamma = static_cast<const float*>(at(slot, st.s.weight));
        break;
      case GOLLM_STAGE_QKV:
        st.w = at(slot, GOLLM_ROLE_QKV), st.b = static_cast<const float*>(at(slot, GOLLM_ROLE_QKV_BIAS));
        st.ws = scales(slot, GOLLM_ROLE_QKV);
        break;
      case GOLLM_STAGE_OUT:
        st.w = at(slot, GOLLM_ROLE_OUT), st.b = static_cast<const float*>(at(slot, GOLLM_ROLE_OUT_BIAS));
        st.ws = scales(slot, GOLLM_ROLE_OUT);
        break;
      case GOLLM_STAGE_MLP:
        st.w = at(slot, GOLLM_ROLE_UP), st.b = static_cast<const float*>(at(slot, GOLLM_ROLE_UP_BIAS));
        st.w2 = at(slot, GOLLM_ROLE_DOWN), st.b2 = static_cast<const float*>(at(slot, GOLLM_ROLE_DOWN_BIAS));
        st.ws = scales(slot, GOLLM_ROLE_UP), st.ws2 = scales(slot, GOLLM_ROLE_DOWN);
        break;
      case GOLLM_STAGE_MOE:
        st.w = at(slot, GOLLM_ROLE_EXPERT_UP), st.w2 = at(slot, GOLLM_ROLE_EXPERT_DOWN);
        st.router = at(slot, GOLLM_ROLE_ROUTER);
        st.shared_w = at(slot, GOLLM_ROLE_SHARED_UP), st.shared_w2 = at(slot, GOLLM_ROLE_SHARED_DOWN);
        st.shared_gate = at(slot, GOLLM_ROLE_SHARED_GATE);
        break;
      case GOLLM_STAGE_LM_HEAD:
        st.w = w->lm_head;
        break;
    }
  }
  for (int i = 0; i < n; i++) {
    Stage& st = w->recipe[i];
    if (st.s.kind == GOLLM_STAGE_EMBED || st.s.kind == GOLLM_STAGE_RESIDUAL) st.next = &w->recipe[i + 1];
    if ((st.s.kind == GOLLM_STAGE_OUT || st.s.kind == GOLLM_STAGE_MLP || st.s.kind == GOLLM_STAGE_MOE) &&
        w->recipe[i + 1].s.kind == GOLLM_STAGE_POST_NORM)
      st.post = &w->recipe[i + 1];
    if (st.s.kind != GOLLM_STAGE_QKV) continue;
    // QKV, [QK_NORM], [ROTARY], KV_WRITE, ATTENTION.
    int j = i + 1;
    const Stage* qk = w->recipe[j].s.kind == GOLLM_STAGE_QK_NORM ? &w->recipe[j++] : nullptr;
    const gollm_stage* rot = w->recipe[j].s.kind == GOLLM_STAGE_ROTARY ? &w->recipe[j++].s : nullptr;
    const gollm_stage& att = w->recipe[j + 1].s;
    for (Stage* e : {&st, &w->recipe[j]}) {
      e->qscale = att.scale;
      if (rot) e->inv_freq = freqs + rot->rope_freqs, e->rope_dim = rot->rope_dim;
      if (qk) e->qkx.q_gamma = qk->gamma, e->qkx.k_gamma = qk->beta, e->qkx.eps = qk->s.eps;
      if (rot && rot->rope_long > 0)
        e->qkx.long_freq = e->inv_freq + rot->rope_dim / 2, e->qkx.long_from = rot->rope_long;
      if (rot) e->qkx.rope_scale = rot->rope_scale;
      e->extra = qk || (rot && (rot->rope_long > 0 || rot->rope_scale != 1.f));
    }
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

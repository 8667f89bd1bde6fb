/* gollm.h — the C ABI of libgollm_cuda.so, gollm's CUDA engine for decoder-only language
 * models described by a gollm_model_config (their shapes) and a recipe (their forward pass
 * as an ordered list of gollm_stage, with the values each takes in its layer: LayerNorm or
 * RMSNorm, learned or rotary positions over a whole head or part of it (longrope's two
 * frequency sets), per-head query and key norms, multi-head, multi-query or grouped-query
 * attention with a window per layer and soft-capped scores, post-norms of the branches,
 * a plain or gated MLP or a mixture of experts, a tied or separate LM head with soft-capped
 * logits).
 *
 * Every function reports failure through a gollm_status {code, message} and returns the
 * code; none aborts or exits, and no C++ exception crosses it. Objects:
 *
 *   gollm_weights  a model's weights on one GPU, converted once to fp16 or bf16. Refcounted:
 *                  every engine made on it holds a reference, so instances of a model on one
 *                  GPU share one copy (AITemplate's ModelContainer constants).
 *   gollm_engine   a paged KV pool (fp16/bf16 as the weights, or float8_e4m3fn with per-layer
 *                  scales), scratch buffers, a stream, a cuBLAS handle and the CUDA
 *                  graphs of decode steps; runs one iteration per gollm_step call.
 *   gollm_comm     tensor parallelism: the NCCL communicators of the GPUs one instance
 *                  spreads a model over, one rank a GPU (ABI 7). Each rank's engine runs on
 *                  that rank's share of the weights and all-reduces and all-gathers with the
 *                  others inside its steps, so the ranks' steps must run at the same time,
 *                  from one thread each. NCCL (libnccl.so.2, or the path the caller gives)
 *                  is opened with dlopen when the first communicator is made: without it
 *                  the library still loads and serves a model on one GPU.
 *
 * The library reads no environment variable: every setting comes through these calls.
 *
 * The engine keeps no per-request state: each gollm_step names, for every scheduled
 * sequence, its new tokens, position, block table and sampling parameters.
 */
#ifndef GOLLM_H
#define GOLLM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GOLLM_API marks the exported functions; the library hides everything else. */
#if defined(__GNUC__)
#define GOLLM_API __attribute__((visibility("default")))
#else
#define GOLLM_API
#endif

/* GOLLM_ABI_VERSION changes whenever a struct or function below changes. */
#define GOLLM_ABI_VERSION 16

enum gollm_code {
  GOLLM_OK = 0,
  GOLLM_ERR_INVALID_ARGUMENT = 1, /* a bad parameter or step descriptor */
  GOLLM_ERR_CUDA = 2,             /* a CUDA runtime error */
  GOLLM_ERR_CUBLAS = 3,           /* a cuBLAS error */
  GOLLM_ERR_OUT_OF_MEMORY = 4,    /* device or pinned host memory ran out */
  GOLLM_ERR_INTERNAL = 5,         /* anything else (a C++ exception) */
  GOLLM_ERR_ALL_MASKED = 6,       /* unused: a masked row is its token -2, not an error */
  GOLLM_ERR_NCCL = 7              /* NCCL is missing or failed, or the communicators were
                                     aborted (gollm_comm_abort) */
};

/* gollm_status carries an error out of every call. */
typedef struct gollm_status {
  int32_t code;        /* a gollm_code */
  char message[1024];  /* NUL-terminated description; empty on success */
} gollm_status;

/* GOLLM_DTYPE_F8E4M3: float8_e4m3fn weights with fp32 scales (gollm_tensor.scale), for the
 * projections QKV, OUT, UP and DOWN only, on compute capability 8.9 and newer. */
enum gollm_dtype { GOLLM_DTYPE_F32 = 0, GOLLM_DTYPE_F16 = 1, GOLLM_DTYPE_BF16 = 2, GOLLM_DTYPE_F8E4M3 = 3 };

enum gollm_activation {
  GOLLM_ACT_GELU_TANH = 0, /* gelu_new, gelu_pytorch_tanh, gelu_fast */
  GOLLM_ACT_GELU_ERF = 1,  /* gelu */
  GOLLM_ACT_RELU = 2,      /* relu */
  GOLLM_ACT_SILU = 3       /* silu (swish) */
};

enum gollm_norm {
  GOLLM_NORM_LAYER = 0, /* (x - mean) / sqrt(var + eps) * w + b */
  GOLLM_NORM_RMS = 1    /* x / sqrt(mean(x^2) + eps) * w, no bias */
};

enum gollm_positions {
  GOLLM_POS_LEARNED = 0, /* a position embedding added to the token embedding */
  GOLLM_POS_ROTARY = 1   /* queries and keys rotated by position (the recipe's ROTARY) */
};

/* gollm_model_config is the model's shapes (model.Config in Go): the sizes of its weights
 * and buffers, and which roles it has. What its layers compute is its recipe. */
typedef struct gollm_model_config {
  int32_t vocab_size;        /* tokens */
  int32_t max_positions;     /* longest sequence */
  int32_t hidden;            /* model width */
  int32_t layers;            /* transformer blocks */
  int32_t heads;             /* query heads */
  int32_t kv_heads;          /* key/value heads; divides heads */
  int32_t head_dim;          /* a multiple of 8, at most 256 */
  int32_t inner;             /* MLP units (the gate's and the up-projection's each when gated) */
  int32_t norm;              /* a gollm_norm: the norms' kind (LayerNorm's have bias roles) */
  int32_t positions;         /* a gollm_positions (learned ones have POS_EMBED) */
  int32_t gated_mlp;         /* nonzero: UP holds the gate's rows, then the up-projection's */
  int32_t tied_head;         /* nonzero: the LM head is the token embedding */
  int32_t qk_norm;           /* nonzero: the layers have Q_NORM and K_NORM (ABI 9) */
  int32_t post_norms;        /* nonzero: the layers have POST_ATTN_NORM and POST_MLP_NORM */
  /* Mixture of experts (ABI 11): the layers whose recipe has a MOE stage hold the expert
   * roles instead of UP and DOWN; all zero without experts. */
  int32_t experts;           /* experts of a sparse layer, at most 4096 */
  int32_t moe_inner;         /* an expert's units (its gate's and up-projection's each) */
  int32_t shared_inner;      /* the shared expert's units; 0: none */
  /* Expert parallelism (ABI 16): the weights hold experts [expert_first, expert_first +
   * local_experts) of the router's experts, whole (EXPERT_UP and EXPERT_DOWN have
   * local_experts experts' rows); the pairs routed to the others add nothing here (another
   * rank's share, added by the all-reduce after the stage). local_experts 0: every expert
   * (expert_first 0). */
  int32_t expert_first;
  int32_t local_experts;
} gollm_model_config;

/* gollm_stage_kind is what a stage of the recipe does (model.StageKind in Go, the same
 * order). x is the block input, h the fp32 residual stream, the branch what a projection
 * into the residual width wrote. */
enum gollm_stage_kind {
  GOLLM_STAGE_EMBED = 0,     /* h = EMBED[token] (× scale) (+ POS_EMBED[position] under learned
                                positions) */
  GOLLM_STAGE_NORM = 1,      /* x = norm(h) for the stage that reads it (QKV, MLP, LM_HEAD) */
  GOLLM_STAGE_QKV = 2,       /* queries, keys, values = x·QKVᵀ + QKV_BIAS */
  GOLLM_STAGE_ROTARY = 3,    /* queries and keys rotated by position */
  GOLLM_STAGE_KV_WRITE = 4,  /* keys and values into the paged pool */
  GOLLM_STAGE_ATTENTION = 5, /* causal attention over the pool, through each query head's KV head
                                (scores soft-capped where softcap > 0) */
  GOLLM_STAGE_OUT = 6,       /* branch = attention·OUTᵀ + OUT_BIAS */
  GOLLM_STAGE_MLP = 7,       /* branch = DOWN·act(UP·x) (gated: act(gate) · up) + biases */
  GOLLM_STAGE_RESIDUAL = 8,  /* h += branch */
  GOLLM_STAGE_LM_HEAD = 9,   /* logits = x·LM_HEADᵀ of the rows whose logits are read (soft-capped
                                where softcap > 0) */
  GOLLM_STAGE_QK_NORM = 10,  /* each query head normed by Q_NORM, each key head by K_NORM, over
                                head_dim (ABI 9) */
  GOLLM_STAGE_POST_NORM = 11, /* branch = norm(branch) (POST_ATTN_NORM or POST_MLP_NORM) */
  GOLLM_STAGE_MOE = 12,      /* branch = Σ over x's top_k experts of p_e · expert_e(x), p the
                                softmax of x·ROUTERᵀ in fp32 (renormalised over the top_k
                                with norm_topk), expert_e = EXPERT_DOWN_e·(act(gate_e) · up_e)
                                of EXPERT_UP_e·x; with shared, + sigmoid(SHARED_GATE·x) ·
                                SHARED_DOWN·(act(gate) · up) of SHARED_UP·x (ABI 11) */
  GOLLM_STAGE_KINDS
};

/* gollm_stage is one stage of the recipe with its values; fields its kind does not read
 * are zero. The recipe is a pre-norm decoder: EMBED, then per layer NORM, QKV, [QK_NORM],
 * [ROTARY], KV_WRITE, ATTENTION, OUT, [POST_NORM], RESIDUAL, NORM, MLP or MOE, [POST_NORM],
 * RESIDUAL, then NORM, LM_HEAD — QK_NORM where the config has qk_norm, POST_NORM where it
 * has post_norms, MOE in a layer whose MLP is the experts (the library refuses another
 * order, naming the stage). */
typedef struct gollm_stage {
  int32_t kind;       /* a gollm_stage_kind */
  int32_t layer;      /* its layer; -1 for the model's own (EMBED, the final NORM, LM_HEAD) */
  int32_t weight;     /* NORM, QK_NORM, POST_NORM: its weight's role (NORM: ATTN_NORM,
                         MLP_NORM, FINAL_NORM, under LayerNorm its bias the role after it;
                         QK_NORM: Q_NORM; POST_NORM: POST_ATTN_NORM, POST_MLP_NORM) */
  int32_t norm;       /* NORM, QK_NORM, POST_NORM: a gollm_norm, the config's (RMS for the
                         last two) */
  float eps;          /* NORM, QK_NORM, POST_NORM: epsilon */
  int32_t rope_dim;   /* ROTARY: rotated dimensions of each query and key head, even, at most
                         head_dim; dimension i pairs with i + rope_dim/2, the rest pass */
  int32_t rope_freqs; /* ROTARY: its rope_dim/2 frequencies start at rope_freqs[rope_freqs]
                         of gollm_weights_params (position p turns pair i by rope_freqs[i]·p) */
  int32_t window;     /* ATTENTION: > 0, a query attends to its last window positions (its
                         own included); 0, to all */
  float scale;        /* ATTENTION: the query·key scale (1/√head_dim, or the model's), applied
                         to the queries as they are written; EMBED: > 0, the embeddings'
                         multiplier, it and the product rounded to the compute type */
  float softcap;      /* ATTENTION, LM_HEAD: > 0, scores or logits become
                         softcap·tanh(x/softcap); 0: none */
  int32_t activation; /* MLP, MOE: a gollm_activation */
  int32_t gated;      /* MLP: nonzero, act(gate) · up; the config's gated_mlp. MOE: 1 */
  int32_t rope_long;  /* ROTARY: > 0 (longrope), a sequence longer than rope_long positions
                         after the step takes the long frequencies, which follow the short
                         ones (rope_freqs + rope_dim/2); 0: one set (ABI 9) */
  float rope_scale;   /* ROTARY: cos and sin are multiplied by it (longrope's attention
                         factor; 1 otherwise) */
  int32_t experts;    /* MOE: the config's experts (ABI 11) */
  int32_t top_k;      /* MOE: experts a token goes to, 1 … experts */
  int32_t norm_topk;  /* MOE: nonzero, the top_k probabilities renormalised to sum to 1 */
  int32_t shared;     /* MOE: nonzero, the shared expert (the config's shared_inner > 0) */
} gollm_stage;

/* gollm_role is the part a weight plays (model.Role in Go, the same order). Matrices are
 * [out][in] in these terms; vectors (norms, biases) [n]:
 *   EMBED [vocab][hidden]; POS_EMBED [max_positions][hidden] (learned positions only);
 *   FINAL_NORM, FINAL_NORM_BIAS [hidden]; LM_HEAD [vocab][hidden] (untied only);
 *   per layer: ATTN_NORM, ATTN_NORM_BIAS [hidden]; QKV [(heads+2*kv_heads)*head_dim][hidden]
 *   (the query rows, then the key rows, then the value rows) and QKV_BIAS;
 *   OUT [hidden][heads*head_dim] and OUT_BIAS [hidden]; MLP_NORM, MLP_NORM_BIAS [hidden];
 *   UP [inner or, gated, 2*inner][hidden] (the gate's rows first) and UP_BIAS;
 *   DOWN [hidden][inner] and DOWN_BIAS [hidden]; Q_NORM, K_NORM [head_dim] (qk_norm);
 *   POST_ATTN_NORM, POST_MLP_NORM [hidden] (post_norms);
 *   a sparse layer (a MOE stage) instead of UP, DOWN and their biases: ROUTER
 *   [experts][hidden]; EXPERT_UP [experts·2·moe_inner][hidden] (expert by expert, its gate's
 *   rows, then its up-projection's); EXPERT_DOWN [experts·hidden][moe_inner] (both of the
 *   local_experts held, where the config says); with a shared
 *   expert SHARED_UP [2·shared_inner][hidden] (gate's rows first), SHARED_DOWN
 *   [hidden][shared_inner], SHARED_GATE [1][hidden].
 * The *_NORM_BIAS roles exist under LayerNorm only; a bias role is absent when the model
 * has none (every bias of a role is given, or none). */
enum gollm_role {
  GOLLM_ROLE_EMBED = 0, GOLLM_ROLE_POS_EMBED, GOLLM_ROLE_FINAL_NORM, GOLLM_ROLE_FINAL_NORM_BIAS,
  GOLLM_ROLE_LM_HEAD,
  GOLLM_ROLE_ATTN_NORM, GOLLM_ROLE_ATTN_NORM_BIAS, GOLLM_ROLE_QKV, GOLLM_ROLE_QKV_BIAS,
  GOLLM_ROLE_OUT, GOLLM_ROLE_OUT_BIAS, GOLLM_ROLE_MLP_NORM, GOLLM_ROLE_MLP_NORM_BIAS,
  GOLLM_ROLE_UP, GOLLM_ROLE_UP_BIAS, GOLLM_ROLE_DOWN, GOLLM_ROLE_DOWN_BIAS,
  GOLLM_ROLE_Q_NORM, GOLLM_ROLE_K_NORM, GOLLM_ROLE_POST_ATTN_NORM, GOLLM_ROLE_POST_MLP_NORM,
  GOLLM_ROLE_ROUTER, GOLLM_ROLE_EXPERT_UP, GOLLM_ROLE_EXPERT_DOWN, GOLLM_ROLE_SHARED_UP,
  GOLLM_ROLE_SHARED_DOWN, GOLLM_ROLE_SHARED_GATE,
  GOLLM_ROLES
};
#define GOLLM_FIRST_LAYER_ROLE GOLLM_ROLE_ATTN_NORM

/* gollm_tensor is one stored piece of a weight, in host memory (the mapped file). */
typedef struct gollm_tensor {
  const void* data;   /* little-endian elements */
  int64_t rows;       /* rows of the weight this piece holds */
  int64_t cols;       /* the weight's columns (1 for a vector) */
  int32_t dtype;      /* a gollm_dtype */
  int32_t transposed; /* nonzero: stored [cols][rows] (GPT-2's Conv1D) instead of [rows][cols] */
  /* ABI 13, F8E4M3 only: fp32 scales [ceil(rows/block_rows)][ceil(cols/block_cols)], the weight
   * being the stored value times its block's scale; block_cols a multiple of 128 or at
   * least cols (one scale across the row). cols a multiple of 16. Every part of every
   * QKV, OUT, UP and DOWN is F8E4M3, or none is. */
  const float* scale;
  int32_t block_rows, block_cols;
} gollm_tensor;

/* gollm_weight tags a piece with its role and layer. A role's pieces (the query, key and
 * value projections of a fused QKV, say) are given one after another, in row order. */
typedef struct gollm_weight {
  int32_t role;      /* a gollm_role */
  int32_t layer;     /* the layer of a per-layer role; -1 for the model's own */
  gollm_tensor part; /* the piece */
} gollm_weight;

/* gollm_faults makes chosen calls fail, so that the failure paths of the engine and of its
 * callers run on a real GPU (bridge/cuda reads them from GOLLM_CUDA_FAIL_STEP,
 * GOLLM_CUDA_FAIL_RANK and GOLLM_CUDA_FAIL_ALLOC for its tests). All zero: none. */
enum gollm_fail_mode {
  GOLLM_FAIL_ENQUEUED = 0, /* a real failing CUDA call after the step's forward pass is
                              enqueued (gollm_engine_reset then recovers) */
  GOLLM_FAIL_LOST = 1,     /* a kernel of the step traps: the context is lost */
  GOLLM_FAIL_EARLY = 2     /* before any of the step's work is enqueued (a tensor-parallel
                              rank's peers then wait for collectives that do not come) */
};
typedef struct gollm_faults {
  int32_t fail_step;      /* > 0: the engine's fail_step-th gollm_step or gollm_launch fails once */
  int32_t fail_mode;      /* a gollm_fail_mode */
  int32_t fail_rank;      /* -1: every tensor-parallel rank fails; else only this one */
  const char* fail_alloc; /* non-empty: every device allocation whose purpose contains it
                             ("weights", "KV pool", "logits", …) fails as out of memory */
} gollm_faults;

/* gollm_weights_params describes a checkpoint to copy onto a GPU. */
typedef struct gollm_weights_params {
  int32_t device;              /* CUDA device ordinal */
  int32_t dtype;               /* GOLLM_DTYPE_F16 or GOLLM_DTYPE_BF16: weights, activations, KV */
  gollm_model_config config;   /* the shapes */
  int32_t num_stages;          /* entries of stages */
  const gollm_stage* stages;   /* the recipe: the forward pass in order */
  int32_t num_rope_freqs;      /* entries of rope_freqs */
  const float* rope_freqs;     /* the rotary stages' frequencies (gollm_stage.rope_freqs) */
  int32_t num_weights;         /* entries of weights */
  const gollm_weight* weights; /* every piece of every role the architecture has */
  gollm_faults faults;         /* fail_alloc only */
} gollm_weights_params;

/* Kernel paths gollm_tuning.off turns off. Each is on by default where the GPU has it;
 * turning one off keeps results within rounding. Batch invariance is on by default: a
 * row's results are then bitwise the same whatever else the step holds, and the bits
 * below only move the paths of a library running without it. */
enum gollm_tuning_off {
  GOLLM_TUNING_NO_PDL = 1,     /* programmatic dependent launch (sm_90) */
  GOLLM_TUNING_NO_BULK = 2,    /* bulk (TMA) copies of the gemv and MLP weights (sm_90) */
  GOLLM_TUNING_NO_FUSED = 4,   /* the one-kernel MLP of decode steps of up to 4 rows */
  GOLLM_TUNING_NO_GROUPED = 8, /* decode attention a block per KV head (all its query heads) */
  GOLLM_TUNING_NO_STREAM = 16, /* the streaming gemv of few-row steps (narrow models then
                                  take the staged gemv and fused MLP, wide ones cuBLAS) */
  GOLLM_TUNING_NO_TILED = 32,  /* the tensor-core projections of steps of up to 64 rows
                                  (cuBLAS then) */
  GOLLM_TUNING_NO_PROMPT_GRAPHS = 64, /* prompt steps replayed from graphs of their padded
                                         shape (every such step then runs kernel by kernel) */
  GOLLM_TUNING_NO_CTX_MMA = 128,      /* context attention on mma.sync (the WMMA kernel then) */
  GOLLM_TUNING_NO_CUSTOM_AR = 256,    /* tensor parallelism's custom all-reduce over peer
                                         access (NCCL then, in fp32, for every all-reduce) */
  GOLLM_TUNING_NO_INVARIANT = 512,    /* batch invariance (cuda/README.md): the kernels then
                                         follow the step's row count (the streaming and staged
                                         gemv, the fused MLP, cuBLAS; decode attention's splits
                                         by batch), and a row's results depend within rounding
                                         on the rows beside it. bridge/cuda sets it unless
                                         the model asks for invariance (batch_invariant) */
  GOLLM_TUNING_NO_BLASLT = 1024,      /* the projections of steps past the tiled rows on
                                         cuBLASLt, an algorithm timed per shape at the
                                         warm-up (cublasGemmEx's default algorithm then;
                                         ABI 15), and FP8 weights' on its block-scaled
                                         FP8 GEMMs (gollm's weight-only kernels then;
                                         ABI 16) */
  GOLLM_TUNING_NO_TP_CANDIDATES = 2048 /* tensor parallelism's decode steps sampled from
                                          each rank's candidates (greedy: its maximum;
                                          top-k up to 64: its first 64) instead of the
                                          gathered vocabulary (ABI 16) */
};

/* gollm_tuning chooses among kernel paths that give the same results within rounding, to
 * measure one against another. */
typedef struct gollm_tuning {
  int32_t off;          /* gollm_tuning_off bits */
  int32_t gemv_rows;    /* most token rows on the staged gemv path, 0..8; -1: the default
                           (4 on models up to 1024 wide, else 0) */
  int32_t tiled_rows;   /* most token rows on the tiled projections, 0..64; -1: the default
                           (16 on models up to 1024 wide, else 0) */
  int32_t tile_blocks;  /* the tiled launches aim at tile_blocks blocks a multiprocessor,
                           1..4; 0: 1 */
  int32_t decode_parts; /* decode attention split this many ways at every batch size, 1..16;
                           0: by decode_splits */
  int32_t skip;         /* libraries built with GOLLM_MEASURE only: stage kinds (bit
                           1 << gollm_stage_kind) left out of every step, so that a step's
                           time without them says what they cost in place (the results are
                           wrong), and bit 30 tensor parallelism's all-reduces (each rank's
                           own share added alone); other builds refuse a nonzero value */
  int32_t allreduce_bytes;      /* tensor parallelism: the largest all-reduce (rows x hidden
                                   x 2 bytes) the custom all-reduce takes, 1 to 4 MiB; 0:
                                   1 MiB. Larger ones go to NCCL (ABI 12) */
  int32_t allreduce_timeout_ms; /* how long the custom all-reduce waits for a peer before the
                                   step fails (the communicators are then aborted), 1 to
                                   600000; 0: 20000 */
  int32_t allreduce_two_bytes;  /* the payload (rows x hidden x 2 bytes) from which the custom
                                   all-reduce runs in two shots (reduce-scatter, then
                                   all-gather of the sums), up to 4 MiB; 0 or negative:
                                   never (ABI 16) */
} gollm_tuning;

/* gollm_engine_params sizes an engine. */
typedef struct gollm_engine_params {
  int32_t tokens_per_block;   /* KV positions per block */
  int32_t num_blocks;         /* KV blocks; 0: size the pool from kv_free_fraction */
  float kv_free_fraction;     /* share of the free memory (after weights and scratch) for KV */
  int32_t max_tokens;         /* most new tokens in one step */
  int32_t max_seqs;           /* most sequences in one step */
  int32_t max_logit_rows;     /* LM-head rows computed at once (context logits come in chunks) */
  int32_t cuda_graphs;        /* nonzero: replay CUDA graphs (decode steps by batch bucket, prompt steps by padded shape) */
  int32_t warmup;             /* nonzero: before returning, call every padded cuBLAS shape
                                 once, run a prompt step and capture every decode graph
                                 (writes KV block 0; the pool is unused yet) */
  int32_t max_seq_len;        /* longest sequence served, at most the model's max_positions
                                 and 32768 (decode attention holds a row's scores in shared
                                 memory); 0: the model's max_positions, at most 8192 */
  gollm_tuning tuning;        /* kernel paths, for A/B measurement; zero fields: the defaults */
  gollm_faults faults;        /* injected failures (tests); zero: none */
  int64_t mem_budget;         /* > 0 with num_blocks 0: the engine's scratch buffers and KV
                                 pool together take at most this many device bytes (the
                                 pool gets what the scratch leaves; kv_free_fraction is not
                                 used); creation fails with GOLLM_ERR_OUT_OF_MEMORY, naming
                                 the sizes, when that leaves no KV block or more than the
                                 device has free */
  /* Tensor parallelism (ABI 7); zero for one GPU. */
  struct gollm_comm* comm;    /* the instance's communicators (gollm_comm_create_all), or NULL:
                                 the engine holds a reference until it is destroyed */
  int32_t tp_rank;            /* this engine's rank in comm: the weights are that rank's share
                                 (model.ShardWeights; every rank holds the whole OUT_BIAS and
                                 DOWN_BIAS, added once after the all-reduce) on comm's device
                                 tp_rank. One engine a rank and communicator. */
  int32_t tp_vocab;           /* the whole model's vocabulary (tokens, logits and sampling);
                                 the weights' config holds this rank's ceil(tp_vocab / ranks)
                                 rows of the embedding and LM head. 0 without comm. */
  /* The KV pool's element type (ABI 16). 0, or the weights' dtype: the compute type (two
     bytes an element). GOLLM_DTYPE_F8E4M3: float8_e4m3fn (one byte) — layer l's keys are
     stored divided by kv_scales[2l] and its values by kv_scales[2l + 1], rounded to nearest
     even and saturated at ±448, and attention reads them back times the scale. */
  int32_t kv_dtype;
  const float* kv_scales;     /* F8E4M3: [layers][2] (key, value), each finite and positive;
                                 NULL: 1 for every layer. Copied at creation. */
} gollm_engine_params;

/* gollm_engine_info describes a created engine. */
typedef struct gollm_engine_info {
  int32_t num_blocks;       /* KV blocks in the pool (ids 0..num_blocks-1) */
  int32_t tokens_per_block; /* KV positions per block */
  int64_t weight_bytes;     /* device bytes of the (shared) weights */
  int64_t kv_bytes;         /* device bytes of the KV pool */
  int64_t scratch_bytes;    /* device bytes of activations and step buffers */
  char device_name[256];    /* cudaDeviceProp.name */
  int32_t warmup_gemm_shapes; /* cuBLAS shapes the warm-up called */
  int32_t warmup_graphs;      /* decode graphs it captured */
  float warmup_ms;            /* its wall time */
  int32_t max_seq_len;        /* the longest sequence the engine serves */
  int32_t warmup_gemm_tuned;  /* GEMM shapes whose cuBLASLt algorithms it timed (ABI 15) */
  float warmup_gemm_tune_ms;  /* the wall time that timing took, part of warmup_ms */
} gollm_engine_info;

/* Flags of gollm_seq.flags. */
enum gollm_seq_flag {
  GOLLM_SEQ_SAMPLE = 1,         /* sample a token after the last new token */
  GOLLM_SEQ_RETURN_LOGITS = 2,  /* return the last position's logits (bias added) */
  GOLLM_SEQ_CONTEXT_LOGITS = 4, /* return the raw logits of every new token */
  /* ABI 15: the sequence attends to positions other sequences of the step write (the
     rows of one sequence's proposals, each a sequence of one token over the same block
     table, speculative decoding): attention then starts after the step's keys and values
     are all written. */
  GOLLM_SEQ_CHAINED = 8
};

/* gollm_seq is one sequence's share of a step. Offsets index the arrays of gollm_step_in. */
typedef struct gollm_seq {
  int32_t token_offset, token_count; /* new tokens: tokens[token_offset .. +token_count) */
  int32_t pos;                       /* position of the first new token */
  int32_t block_offset, block_count; /* block table: block_ids[block_offset .. +block_count) */
  int32_t flags;                     /* gollm_seq_flag bits */
  int64_t logits_offset;             /* where its logits go in gollm_step_out.logits: context
                                        rows first ([token_count][vocab]), then the returned
                                        row ([vocab]) */
  float temperature;                 /* 0: greedy */
  int32_t top_k;                     /* 0: no limit */
  float top_p;                       /* 0 or 1: no limit */
  float repetition_penalty;          /* 0 or 1: none */
  float presence_penalty;            /* subtracted once per distinct history token */
  float frequency_penalty;           /* subtracted once per occurrence */
  int32_t penalty_offset, penalty_count; /* distinct history tokens with their counts */
  int32_t mask_offset, mask_count;   /* tokens to mask (-inf) after the penalties: min length
                                        and bad words, decided by the caller */
  int32_t bias_offset;               /* embedding bias: bias[bias_offset .. +vocab), or -1 */
  double uniform;                    /* the draw in [0, 1) for this step */
  /* ABI 10: guided decoding and min-p. */
  int32_t allowed_offset;            /* the tokens it may sample (guided decoding): bit i%32 of
                                        allowed[allowed_offset + i/32] for token i, (vocab+31)/32
                                        words, applied after the masks; -1: every token */
  float min_p;                       /* after top-k and top-p, keep the tokens at least min_p
                                        times as likely as the most likely one; 0: none */
} gollm_seq;

/* gollm_step_in is one iteration's work; every array is in host memory. */
typedef struct gollm_step_in {
  int32_t num_seqs;              /* sequences */
  const gollm_seq* seqs;         /* [num_seqs] */
  int32_t num_tokens;            /* length of tokens */
  const int32_t* tokens;         /* new tokens of all sequences */
  int32_t num_block_ids;         /* length of block_ids */
  const int32_t* block_ids;      /* block tables of all sequences */
  int32_t num_penalties;         /* length of penalty_tokens and penalty_counts */
  const int32_t* penalty_tokens; /* distinct history tokens */
  const int32_t* penalty_counts; /* their occurrence counts */
  int32_t num_masks;             /* length of mask_tokens */
  const int32_t* mask_tokens;    /* tokens to mask */
  int64_t num_bias;              /* length of bias */
  const float* bias;             /* embedding biases */
  int32_t num_block_copies;      /* entries of block_copies */
  const int32_t* block_copies;   /* [num_block_copies][2]: (src, dst) KV blocks, each in
                                    [0, num_blocks), copied whole, in order, before the
                                    forward pass (the copy-on-write of beams) */
  int64_t num_allowed;           /* ABI 10: length of allowed, in 32-bit words */
  const uint32_t* allowed;       /* guided decoding's token bitmasks (gollm_seq.allowed_offset) */
  const int32_t* feed;           /* [num_seqs] or NULL (gollm_launch only): -1, or the
                                    sequence of the step launched just before, still not
                                    waited for, whose sampled token is this sequence's one
                                    new token (its entry in tokens is then a placeholder) */
  /* ABI 14: guided decoding's masks after the launch. Nonzero (gollm_launch only): the
     forward pass is enqueued now and the sampling when gollm_supply_allowed gives the
     masks; allowed is then not read (may be NULL), num_allowed is the most words that call
     may give, and every allowed_offset must be -1. Needs one GPU, no logits returned, no
     context logits. */
  int32_t late_allowed;
} gollm_step_in;

/* gollm_step_out receives a step's results in host memory the caller owns. */
typedef struct gollm_step_out {
  int32_t* tokens;     /* [num_seqs]: sampled token, -1 when the sequence samples none,
                          -2 when every token is masked (that sequence's failure alone) */
  float* log_probs;    /* [num_seqs]: log-probability of the sampled token */
  float* logits;       /* returned logits, at each gollm_seq.logits_offset; may be NULL when
                          no sequence asks for logits */
  int64_t logits_len;  /* floats in logits */
} gollm_step_out;

/* gollm_device_info describes a device, for logs, metrics and memory sizing. */
typedef struct gollm_device_info {
  char name[256];       /* cudaDeviceProp.name */
  char uuid[48];        /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML and nvidia-smi */
  char pci_bus_id[32];  /* "0000:3b:00.0" */
  int64_t free_bytes;   /* cudaMemGetInfo at the call */
  int64_t total_bytes;
} gollm_device_info;

/* gollm_nccl_info describes the NCCL library tensor parallelism uses (ABI 7). */
typedef struct gollm_nccl_info {
  int32_t version;  /* ncclGetVersion's code: 22703 for 2.27.3 */
  char path[512];   /* what was opened: the path asked for, else libnccl.so.2 */
} gollm_nccl_info;

typedef struct gollm_weights gollm_weights;
typedef struct gollm_engine gollm_engine;
typedef struct gollm_comm gollm_comm;

/* gollm_abi_version returns GOLLM_ABI_VERSION as compiled into the library. */
GOLLM_API int32_t gollm_abi_version(void);

/* gollm_device_count stores the number of CUDA devices. */
GOLLM_API int32_t gollm_device_count(int32_t* count, gollm_status* status);

/* gollm_device_describe describes a device (making its primary context current). */
GOLLM_API int32_t gollm_device_describe(int32_t device, gollm_device_info* out, gollm_status* status);

/* gollm_weights_create copies and converts a checkpoint's weights onto a GPU. The host
 * tensors may be freed once it returns. The caller holds one reference. */
GOLLM_API int32_t gollm_weights_create(const gollm_weights_params* params, gollm_weights** out,
                             gollm_status* status);

/* gollm_weights_release drops a reference; the last one frees the device memory. */
GOLLM_API void gollm_weights_release(gollm_weights* w);

/* gollm_weights_bytes returns the device bytes of w's arena (0 for NULL). */
GOLLM_API int64_t gollm_weights_bytes(const gollm_weights* w);

/* gollm_engine_create makes an engine on w (taking a reference to it). */
GOLLM_API int32_t gollm_engine_create(gollm_weights* w, const gollm_engine_params* params,
                            gollm_engine** out, gollm_engine_info* info, gollm_status* status);

/* gollm_step runs one iteration. Not safe to call concurrently on one engine. */
GOLLM_API int32_t gollm_step(gollm_engine* e, const gollm_step_in* in, gollm_step_out* out,
                   gollm_status* status);

/* gollm_launch enqueues one iteration and returns without waiting for it; gollm_wait
 * waits for the oldest launched one and writes its results into out (whose logits must
 * hold logits_len floats when it returns logits). At most two launched iterations wait at
 * once; gollm_step (launch and wait) needs none waiting. A launch while one waits may feed
 * sequences from that one's sampled tokens (gollm_step_in.feed), so that the host reads
 * step k's results while the GPU computes step k+1. After an error from either call, call
 * gollm_engine_reset: launched iterations are then forgotten. */
GOLLM_API int32_t gollm_launch(gollm_engine* e, const gollm_step_in* in, int64_t logits_len,
                               gollm_status* status);
GOLLM_API int32_t gollm_wait(gollm_engine* e, gollm_step_out* out, gollm_status* status);

/* gollm_supply_allowed (ABI 14) gives the latest launch, made with late_allowed, its guided
 * decoding masks and enqueues its sampling: offsets[num_seqs] is each sequence's
 * allowed_offset (as gollm_seq's: -1, or its (vocab+31)/32 words in allowed), allowed
 * holds num_allowed words, at most the launch's num_allowed; rows may share words. It must
 * come before the next gollm_launch and before the gollm_wait for that launch; the wait for
 * the launch before it may come first. The host computes the masks from that launch's
 * tokens while the GPU runs this one's forward pass. */
GOLLM_API int32_t gollm_supply_allowed(gollm_engine* e, const int32_t* offsets, int32_t num_seqs,
                                       const uint32_t* allowed, int64_t num_allowed,
                                       gollm_status* status);

/* gollm_engine_reset readies an engine after a gollm_step that failed: it waits for the
 * failed step's work, clears a pending error, ends a capture left open and zeroes the
 * counters that split reductions leave set when a step is cut short, so that no later step
 * computes from them. GOLLM_ERR_CUDA means the CUDA context is lost (a sticky error, such
 * as an illegal address or a trap): the engine cannot serve again; destroy it. Failures
 * can be injected to test this path (gollm_faults). */
GOLLM_API int32_t gollm_engine_reset(gollm_engine* e, gollm_status* status);

/* gollm_engine_destroy frees an engine and its reference to the weights (and to its
 * communicators). */
GOLLM_API void gollm_engine_destroy(gollm_engine* e);

/* gollm_nccl_describe opens NCCL (once; nccl_lib when not NULL or empty, else libnccl.so.2 on the
 * loader's path) and describes it: GOLLM_ERR_NCCL, naming what was tried, when it cannot
 * be opened. Needs no GPU. */
GOLLM_API int32_t gollm_nccl_describe(const char* nccl_lib, gollm_nccl_info* out,
                                      gollm_status* status);

/* gollm_comm_create_all makes the communicators of n GPUs of this process
 * (ncclCommInitAll over devices[0..n), rank i on devices[i]), opening NCCL as
 * gollm_nccl_describe does; the caller holds one reference. Then one engine per rank,
 * each from its own thread, created at the same time: creation agrees on the KV pool's
 * blocks (the fewest any rank can hold, so that one block table serves every rank) and its
 * warm-up runs collectives. Where every pair of the GPUs has peer access (ABI 12), it
 * enables it and gives each rank the custom all-reduce's buffers (about 8 MiB a GPU). */
GOLLM_API int32_t gollm_comm_create_all(int32_t n, const int32_t* devices, const char* nccl_lib,
                                        gollm_comm** out, gollm_status* status);

/* gollm_comm_abort aborts every rank's communicator (ncclCommAbort, the ranks in parallel):
 * collectives waiting for a rank that failed return (the custom all-reduce's too), and every later call of an engine on
 * comm fails with GOLLM_ERR_NCCL. The engines cannot step again; destroy them. cause (may
 * be NULL) goes into their errors. Safe from any thread, while the engines' threads wait. */
GOLLM_API int32_t gollm_comm_abort(gollm_comm* comm, const char* cause, gollm_status* status);

/* gollm_allreduce_bench measures and checks tensor parallelism's all-reduce on comm's GPUs
 * (ABI 12): one thread a rank, each with random partial sums [rows][hidden] fp32, a
 * residual stream and a norm's weights; no engine may use comm meanwhile. */
enum gollm_allreduce_method {
  GOLLM_AR_CUSTOM = 0,    /* the custom all-reduce fused with the residual add and RMSNorm,
                             the payload in the compute type (dtype) */
  GOLLM_AR_NCCL_F32 = 1,  /* ncclAllReduce of the fp32 sums, then the residual add and
                             RMSNorm's kernel: what a step without the custom one runs */
  GOLLM_AR_NCCL = 2,      /* ncclAllReduce of rows x hidden elements of dtype alone */
  GOLLM_AR_TWO_SHOT = 3   /* GOLLM_AR_CUSTOM in two shots: each rank sums its slice of the
                             rows, then gathers the others' (ABI 16) */
};
typedef struct gollm_allreduce_params {
  int32_t method;   /* gollm_allreduce_method */
  int32_t dtype;    /* GOLLM_DTYPE_F16 or GOLLM_DTYPE_BF16 */
  int32_t rows, hidden;  /* hidden a multiple of 8 */
  int32_t iters;    /* calls in the timed graph, 1..10000 */
  int32_t reps;     /* replays of it timed (after one untimed), 1..100 */
  int32_t check;    /* nonzero: one call and then a graph of 3 replayed twice, each
                       result against the host's sums (GOLLM_AR_NCCL: none) */
  int32_t timeout_ms; /* the custom all-reduce's wait for a peer; 0: 20000 */
} gollm_allreduce_params;
typedef struct gollm_allreduce_result {
  float us_per_call;    /* median over the replays of the slowest rank's time a call */
  float max_err_h;      /* the largest |h - host sum| over every rank and check */
  float max_err_xn;     /* the largest |xn - host norm| relative to max(1, |host norm|) */
  int32_t ranks_differ; /* elements of h or xn in which a rank's bits differ from rank 0's */
  int32_t custom;       /* 1: the custom all-reduce ran (0: no peer access; reason says why) */
  char reason[256];
} gollm_allreduce_result;
GOLLM_API int32_t gollm_allreduce_bench(struct gollm_comm* comm, const gollm_allreduce_params* params,
                                        gollm_allreduce_result* out, gollm_status* status);

/* gollm_comm_release drops the caller's reference; the communicators are destroyed once
 * the engines made on them are destroyed too. */
GOLLM_API void gollm_comm_release(gollm_comm* comm);

#ifdef __cplusplus
}
#endif

#endif /* GOLLM_H */

/* gollm.h — the C ABI of libgollm_cuda.so, gollm's CUDA engine for GPT-2.
 *
 * Every function reports failure through a gollm_status {code, message} and returns the
 * code; none aborts or exits, and no C++ exception crosses it. Objects:
 *
 *   gollm_weights  a model's weights on one GPU, converted once to fp16 or bf16. Refcounted:
 *                  every engine made on it holds a reference, so instances of a model on one
 *                  GPU share one copy (AITemplate's ModelContainer constants).
 *   gollm_engine   a paged KV pool, scratch buffers, a stream, a cuBLAS handle and the CUDA
 *                  graphs of decode steps; runs one iteration per gollm_step call.
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
#define GOLLM_ABI_VERSION 2

enum gollm_code {
  GOLLM_OK = 0,
  GOLLM_ERR_INVALID_ARGUMENT = 1, /* a bad parameter or step descriptor */
  GOLLM_ERR_CUDA = 2,             /* a CUDA runtime error */
  GOLLM_ERR_CUBLAS = 3,           /* a cuBLAS error */
  GOLLM_ERR_OUT_OF_MEMORY = 4,    /* device or pinned host memory ran out */
  GOLLM_ERR_INTERNAL = 5,         /* anything else (a C++ exception) */
  GOLLM_ERR_ALL_MASKED = 6        /* sampling found every token masked */
};

/* gollm_status carries an error out of every call. */
typedef struct gollm_status {
  int32_t code;        /* a gollm_code */
  char message[1024];  /* NUL-terminated description; empty on success */
} gollm_status;

enum gollm_dtype { GOLLM_DTYPE_F32 = 0, GOLLM_DTYPE_F16 = 1, GOLLM_DTYPE_BF16 = 2 };

enum gollm_activation {
  GOLLM_ACT_GELU_TANH = 0, /* gelu_new, gelu_pytorch_tanh, gelu_fast */
  GOLLM_ACT_GELU_ERF = 1,  /* gelu */
  GOLLM_ACT_RELU = 2       /* relu */
};

/* gollm_model_config is GPT-2's hyperparameters. */
typedef struct gollm_model_config {
  int32_t vocab_size;    /* tokens */
  int32_t max_positions; /* n_positions */
  int32_t hidden;        /* n_embd */
  int32_t layers;        /* n_layer */
  int32_t heads;         /* n_head */
  int32_t head_dim;      /* hidden / heads; even, at most 256 */
  int32_t inner;         /* MLP width */
  int32_t activation;    /* a gollm_activation */
  float layer_norm_eps;  /* layer_norm_epsilon */
} gollm_model_config;

/* gollm_tensor is one checkpoint tensor in host memory (the mapped file). */
typedef struct gollm_tensor {
  const void* data; /* little-endian elements, row-major */
  int64_t numel;    /* element count, checked against the config */
  int32_t dtype;    /* a gollm_dtype */
} gollm_tensor;

/* The tensors of one layer, in this order in gollm_weights_params.layers. Matrices keep
 * the checkpoint's Conv1D layout [in][out]. */
enum gollm_layer_tensor {
  GOLLM_LN1_W, GOLLM_LN1_B,   /* [hidden] */
  GOLLM_ATTN_W, GOLLM_ATTN_B, /* [hidden][3*hidden], [3*hidden] */
  GOLLM_PROJ_W, GOLLM_PROJ_B, /* [hidden][hidden], [hidden] */
  GOLLM_LN2_W, GOLLM_LN2_B,   /* [hidden] */
  GOLLM_FC_W, GOLLM_FC_B,     /* [hidden][inner], [inner] */
  GOLLM_MLP_W, GOLLM_MLP_B,   /* [inner][hidden], [hidden] */
  GOLLM_LAYER_TENSORS
};

/* gollm_weights_params describes a checkpoint to copy onto a GPU. */
typedef struct gollm_weights_params {
  int32_t device;            /* CUDA device ordinal */
  int32_t dtype;             /* GOLLM_DTYPE_F16 or GOLLM_DTYPE_BF16: weights, activations, KV */
  gollm_model_config config; /* hyperparameters */
  gollm_tensor wte;          /* [vocab][hidden]; also the tied LM head */
  gollm_tensor wpe;          /* [max_positions][hidden] */
  gollm_tensor lnf_w;        /* [hidden] */
  gollm_tensor lnf_b;        /* [hidden] */
  const gollm_tensor* layers; /* config.layers * GOLLM_LAYER_TENSORS, layer-major */
} gollm_weights_params;

/* gollm_engine_params sizes an engine. */
typedef struct gollm_engine_params {
  int32_t tokens_per_block;   /* KV positions per block */
  int32_t num_blocks;         /* KV blocks; 0: size the pool from kv_free_fraction */
  float kv_free_fraction;     /* share of the free memory (after weights and scratch) for KV */
  int32_t max_tokens;         /* most new tokens in one step */
  int32_t max_seqs;           /* most sequences in one step */
  int32_t max_logit_rows;     /* LM-head rows computed at once (context logits come in chunks) */
  int32_t cuda_graphs;        /* nonzero: replay CUDA graphs for decode-only steps */
  int32_t warmup;             /* nonzero: before returning, call every padded cuBLAS shape
                                 once, run a prompt step and capture every decode graph
                                 (writes KV block 0; the pool is unused yet) */
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
} gollm_engine_info;

/* Flags of gollm_seq.flags. */
enum gollm_seq_flag {
  GOLLM_SEQ_SAMPLE = 1,         /* sample a token after the last new token */
  GOLLM_SEQ_RETURN_LOGITS = 2,  /* return the last position's logits (bias added) */
  GOLLM_SEQ_CONTEXT_LOGITS = 4  /* return the raw logits of every new token */
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
} gollm_step_in;

/* gollm_step_out receives a step's results in host memory the caller owns. */
typedef struct gollm_step_out {
  int32_t* tokens;     /* [num_seqs]: sampled token, -1 when the sequence samples none */
  float* log_probs;    /* [num_seqs]: log-probability of the sampled token */
  float* logits;       /* returned logits, at each gollm_seq.logits_offset; may be NULL when
                          no sequence asks for logits */
  int64_t logits_len;  /* floats in logits */
} gollm_step_out;

typedef struct gollm_weights gollm_weights;
typedef struct gollm_engine gollm_engine;

/* gollm_abi_version returns GOLLM_ABI_VERSION as compiled into the library. */
GOLLM_API int32_t gollm_abi_version(void);

/* gollm_device_count stores the number of CUDA devices. */
GOLLM_API int32_t gollm_device_count(int32_t* count, gollm_status* status);

/* gollm_weights_create copies and converts a checkpoint's weights onto a GPU. The host
 * tensors may be freed once it returns. The caller holds one reference. */
GOLLM_API int32_t gollm_weights_create(const gollm_weights_params* params, gollm_weights** out,
                             gollm_status* status);

/* gollm_weights_release drops a reference; the last one frees the device memory. */
GOLLM_API void gollm_weights_release(gollm_weights* w);

/* gollm_engine_create makes an engine on w (taking a reference to it). */
GOLLM_API int32_t gollm_engine_create(gollm_weights* w, const gollm_engine_params* params,
                            gollm_engine** out, gollm_engine_info* info, gollm_status* status);

/* gollm_step runs one iteration. Not safe to call concurrently on one engine. */
GOLLM_API int32_t gollm_step(gollm_engine* e, const gollm_step_in* in, gollm_step_out* out,
                   gollm_status* status);

/* gollm_engine_destroy frees an engine and its reference to the weights. */
GOLLM_API void gollm_engine_destroy(gollm_engine* e);

#ifdef __cplusplus
}
#endif

#endif /* GOLLM_H */

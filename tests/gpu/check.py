"""GPU engine against Hugging Face transformers, on random-weight GPT-2 and LLaMA-family
checkpoints.

Run on a machine with a GPU, torch and transformers (the device machine), after building
libgollm_cuda.so and the gollm-gpucheck command:

    python3 tests/gpu/check.py --bin .carry/gollm-gpucheck --lib build/libgollm_cuda.so

It writes checkpoints with transformers — GPT-2: the 124M shape, an odd one (6 heads of
80, 5 layers, vocabulary 1,000) and one whose MLP is 1,002 wide; the LLaMA family: the
TinyLlama-1.1B shape, a Llama-3 shape with llama3 rope scaling and a 128,256 vocabulary, a
Qwen2 shape (q/k/v biases, tied embeddings), a Mistral shape whose sliding window is
shorter than most prompts, an odd one (hidden 640, 10 heads, 2 KV heads), and a Phi-3
shape whose partial rotary factor rotates 96 of each head's 128 dimensions; the families of
issue 37: a Qwen3 shape (q/k norms, head_dim 128 with heads · head_dim ≠ hidden), Gemma 2
shapes with head_dim 256 and 128 (post-norms, (1 + w) norms, the embedding scale,
query_pre_attn_scalar, alternating windows shorter than most prompts, attention and final
soft-caps set low enough to bend these logits), a Gemma 3 shape (q/k norms, five sliding
layers with the local rope to one global layer with linear scaling), and Phi-3 and
Phi-4-mini shapes with longrope whose original context most runs cross (the latter with a
partial rotary), and the mixtures of experts: Mixtral (8 experts, top 2), Qwen2-MoE (60
experts, top 4 unnormalised, a gated shared expert, q/k/v biases) and Qwen3-MoE (128
experts, top 8 renormalised, a dense first layer) — whose weights are rounded to bfloat16 so that both engines read exactly
the same numbers; makes 64 prompts of mixed lengths; runs
gollm-gpucheck (each prompt alone, then all 64 as an in-flight batch, with and without
CUDA graphs, and chunked prefill) in float16 and bfloat16; and runs transformers in
float32 on the prompt followed by gollm's generated tokens (teacher forcing). It checks:

- prompt and decode-step logits: relative L2 error of every row below 1e-2;
- greedy tokens: gollm's token at each step is transformers' argmax, unless transformers'
  top two logits differ there by less than the run's measured logit error can flip
  (max(1e-3, 6 × the largest per-row RMS difference from transformers over the logit
  prompts); reported as an accepted divergence);
- the same tokens from each prompt alone and inside the batch of 64 (a difference is
  accepted on the same terms; the top-2 gaps and the tolerance go to NAME-DTYPE.gaps.json
  beside the run's output, for tests/gpu/triton_e2e.sh's streams);
- as a yardstick, transformers itself in the run's dtype against its float32: the
  relative L2 error of its own fp16/bf16 logits on the logit prompts (column hf_relL2).
  A run fails when gollm's error exceeds max(1e-2, 1.5 × transformers' own in that dtype);
- longrope picks its frequency set by the sequence's length after each forward pass, so
  for the longrope shapes the references run as gollm does — the prompt in one pass, then
  one pass a generated token (and the chunked prefill's reference in the same 7-token
  chunks) — rather than teacher-forced in a single pass, which would rotate the prompt by
  the long factors wherever the generation crosses the original context;
- sampling (odd model, float16): the GPU's sampled tokens agree with the CPU engine's
  on the same logits in at least 95% of the draws.

It prints a table and exits non-zero on any failure.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file
from transformers import (AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, GPT2Config, LlamaConfig,
                          MistralConfig, MixtralConfig, Phi3Config, Qwen2Config, Qwen2MoeConfig, Qwen3Config,
                          Qwen3MoeConfig)

TOL_LOGITS = 1e-2
TOL_GAP = 1e-3
STEPS = 32
NPROMPTS = 64
KLOGITS = 8


def make_checkpoint(path, cfg, seed, save_dtypes, spread_norms=False):
    """Random model with weights rounded to bf16 (exact in fp16 and fp32 too). With
    spread_norms the norm weights are spread around their initial value (Gemma's 0, the
    others' 1), so that a norm read as w where 1 + w is meant, or the reverse, shows."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        # A wider embedding (and LM head) makes the logits peaked (std ~ sqrt(hidden) *
        # 0.1), so greedy choices are far apart compared with float16 rounding.
        model.get_input_embeddings().weight.normal_(0.0, 0.1)
        if not cfg.tie_word_embeddings:
            model.get_output_embeddings().weight.normal_(0.0, 0.1)
        for name, p in model.named_parameters():
            # Biases are zero at initialisation: make the LLaMA family's (Qwen2's q/k/v)
            # count. GPT-2's stay as they were, so that its rows compare with earlier runs.
            if cfg.model_type != "gpt2" and name.endswith("bias"):
                p.normal_(0.0, 0.02)
            if spread_norms and "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    out = {}
    for name, dt in save_dtypes.items():
        d = os.path.join(path, name)
        if not os.path.exists(os.path.join(d, "model.safetensors")):
            model.to(dt).save_pretrained(d, safe_serialization=True)
        out[name] = d
    return out


def make_prompts(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 200, 255, 256, 300]
    while len(lengths) < NPROMPTS:
        lengths.append(int(torch.randint(1, 300, (1,), generator=g)))
    # The logit-checked prompts first: a spread of lengths.
    order = [9, 13, 17, 0, 20, 6, 22, 15] + [i for i in range(NPROMPTS) if i not in (9, 13, 17, 0, 20, 6, 22, 15)]
    return [torch.randint(0, vocab, (lengths[i],), generator=g).tolist() for i in order]


def rel_l2_rows(a, b):
    """Largest per-row ‖a−b‖/‖b‖."""
    a = a.double()
    b = b.double()
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1)).max())


def reference(ckpt, prompts, gen, dtype=torch.float32):
    """transformers logits (fp32 unless dtype says) on prompt + gollm's fed tokens, per prompt."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation="eager")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=dtype, attn_implementation="eager")
    model = model.cuda().eval()
    refs = []
    with torch.no_grad():
        for p, g in zip(prompts, gen):
            ids = torch.tensor([p + g[:STEPS]], device="cuda")
            refs.append(model(ids).logits[0].float().cpu())
    del model
    torch.cuda.empty_cache()
    return refs


def reference_stepwise(ckpt, prompts, gen, chunk=0, dtype=torch.float32):
    """transformers logits as gollm computes them under longrope: each prompt in one
    forward pass (or in chunks of chunk tokens, with the cache), then gen's tokens one
    pass each, so that each pass picks its frequency set by the sequence's length after
    it. Rows as reference()'s: the prompt's, then one per fed token (gen=None: the
    prompt's alone)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation="eager")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=dtype, attn_implementation="eager")
    model = model.cuda().eval()
    refs = []
    with torch.no_grad():
        for k, p in enumerate(prompts):
            pieces = [p[i:i + chunk] for i in range(0, len(p), chunk)] if chunk else [p]
            if gen is not None:
                pieces += [[t] for t in gen[k][:STEPS]]
            past, rows = None, []
            for piece in pieces:
                out = model(torch.tensor([piece], device="cuda"), past_key_values=past, use_cache=True)
                past = out.past_key_values
                rows.append(out.logits[0].float().cpu())
            refs.append(torch.cat(rows))
    del model
    torch.cuda.empty_cache()
    return refs


def gemma3_text_config(**kw):
    """Gemma3TextConfig with a local rope base (sliding layers) and linear scaling on the
    global ones, in transformers 5's rope_parameters or transformers 4's fields."""
    try:
        return Gemma3TextConfig(**kw, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})
    except (TypeError, ValueError):
        return Gemma3TextConfig(**kw, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                                rope_scaling={"rope_type": "linear", "factor": 8.0})


def phi3_longrope_config(rotary, original, partial, **kw):
    """Phi3Config with longrope: short factors near 1, long ones rising to 8 over the
    rotated pairs, in transformers 5's rope_parameters or transformers 4's rope_scaling."""
    half = rotary // 2
    factors = {"short_factor": [1.0 + 0.01 * i for i in range(half)],
               "long_factor": [1.0 + 7.0 * i / (half - 1) for i in range(half)]}
    try:
        return Phi3Config(**kw, original_max_position_embeddings=original, rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": partial,
            "original_max_position_embeddings": original, **factors})
    except (TypeError, ValueError):
        return Phi3Config(**kw, original_max_position_embeddings=original, partial_rotary_factor=partial,
                          rope_theta=10000.0, rope_scaling={"type": "longrope", **factors})


# The shapes whose references run step by step (reference_stepwise): longrope's.
STEPWISE = {"phi3-4L-longrope", "phi4mini-4L-longrope-partial"}
# The shapes whose norm weights are spread (make_checkpoint): issue 37's families.
SPREAD_NORMS = {"qwen3-4L-qknorm", "gemma2-4L-d256-cap", "gemma2-4L-d128-cap", "gemma3-6L-d256",
                "qwen3moe-3L-128x8"} | STEPWISE


def rms_diff_rows(a, b):
    """Largest per-row RMS of a−b: the absolute error scale of single logits."""
    return float((a.double() - b.double()).pow(2).mean(dim=-1).sqrt().max())


def top2_gaps(prompts, refs):
    """Per prompt: transformers' top-2 logit gap at each row that chose a generated token
    (row k chose g[k])."""
    out = []
    for p, r in zip(prompts, refs):
        top = r[len(p) - 1 : len(p) + STEPS].topk(2, dim=-1).values
        out.append((top[:, 0] - top[:, 1]).tolist())
    return out


def check_tokens(prompts, gen, refs, gaps, tol_gap):
    """Per prompt: steps whose token is not the reference argmax; those with a top-2 gap
    (gaps: top2_gaps) under tol_gap are accepted divergences, the others failures."""
    fails, accepted, min_gap = [], [], float("inf")
    for i, (p, g, r) in enumerate(zip(prompts, gen, refs)):
        am = r[len(p) - 1 : len(p) + STEPS].argmax(dim=-1).tolist()  # the row that chose g[k]
        for k in range(STEPS + 1):
            min_gap = min(min_gap, gaps[i][k])
            if g[k] != am[k]:
                (accepted if gaps[i][k] < tol_gap else fails).append((i, k, g[k], am[k], gaps[i][k]))
    return fails, accepted, min_gap


def same_tokens(a, b, gaps, tol_gap):
    """Prompts whose tokens differ between two runs; a difference at a step whose
    reference gap (gaps: top2_gaps, on run a's tokens) is under tol_gap is accepted."""
    bad, ok = [], []
    for i in range(len(a)):
        if a[i] == b[i]:
            continue
        k = next(j for j in range(len(a[i])) if a[i][j] != b[i][j])
        (ok if gaps[i][k] < tol_gap else bad).append((i, k, gaps[i][k]))
    return bad, ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="gollm-gpucheck binary")
    ap.add_argument("--lib", default="", help="libgollm_cuda.so")
    ap.add_argument("--work", default="/tmp/gollm-gpucheck")
    ap.add_argument("--json", default="", help="write the results here too")
    ap.add_argument("--only", default="", help="comma-separated model names to run (default: all)")
    ap.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated dtypes to run")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    t0 = time.time()
    shapes = {
        "gpt2-124M": (GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
                      {"f16": torch.float16, "bf16": torch.bfloat16}),
        "odd-6x80-5L-v1000": (GPT2Config(vocab_size=1000, n_positions=1024, n_embd=480, n_layer=5, n_head=6,
                                         bos_token_id=999, eos_token_id=999),
                              {"f32": torch.float32}),
        # An MLP width that is not a multiple of 8 (nor of 4): the gemv kernels refuse it,
        # so decode steps take the cuBLAS path, and bias + GELU its one-element-a-thread
        # kernel.
        "inner1002-4x64-2L-v1000": (GPT2Config(vocab_size=1000, n_positions=1024, n_embd=256, n_layer=2,
                                               n_head=4, n_inner=1002, bos_token_id=999,
                                               eos_token_id=999),
                                    {"f32": torch.float32}),
        "tinyllama-1.1B": (LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                       num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                       max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=1,
                                       eos_token_id=2, tie_word_embeddings=False),
                           {"f16": torch.float16, "bf16": torch.bfloat16}),
        "llama3-4L-v128256": (LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                          num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8,
                                          max_position_embeddings=131072, rms_norm_eps=1e-5,
                                          bos_token_id=128000, eos_token_id=[128001, 128008, 128009],
                                          rope_theta=500000.0, tie_word_embeddings=True,
                                          rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 8192}),
                              {"f32": torch.float32}),
        "qwen2-4L-896": (Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                     num_hidden_layers=4, num_attention_heads=14, num_key_value_heads=2,
                                     max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                     tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645),
                         {"f32": torch.float32}),
        "mistral-4L-w128": (MistralConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                          num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                          max_position_embeddings=4096, sliding_window=128, rms_norm_eps=1e-5,
                                          rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
                                          tie_word_embeddings=False),
                            {"f32": torch.float32}),
        "llama-odd-640x10h2kv": (LlamaConfig(vocab_size=1000, hidden_size=640, intermediate_size=1728,
                                             num_hidden_layers=3, num_attention_heads=10, num_key_value_heads=2,
                                             max_position_embeddings=1024, rms_norm_eps=1e-6, bos_token_id=1,
                                             eos_token_id=2, tie_word_embeddings=False),
                                 {"f32": torch.float32}),
        # Phi-3's fused projections and a partial rotary factor (Phi-4-mini's 0.75): 96 of
        # each head's 128 dimensions rotate, so every path takes the rotary's own kernel
        # rather than a projection's epilogue.
        "phi3-4L-partial": (Phi3Config(vocab_size=32064, hidden_size=1024, intermediate_size=2816,
                                       num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                       partial_rotary_factor=0.75, max_position_embeddings=4096,
                                       rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=32000,
                                       pad_token_id=32000, tie_word_embeddings=False),
                            {"f32": torch.float32}),
        # Qwen3: per-head q/k norms before the rotary (the QKV epilogue's own kernel on every
        # path), 16 heads of 128 in a model 1024 wide.
        "qwen3-4L-qknorm": (Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                        num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
                                        head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                                        rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=151643,
                                        eos_token_id=151645),
                            {"f32": torch.float32}),
        # Gemma 2 (the 2B/9B head of 256, and the 27B's 128, where the soft-cap keeps the
        # scores off the tensor-core context kernel and the grouped decode kernel): windows of
        # 128 and 96 on alternate layers, soft-caps low enough to bend random logits.
        "gemma2-4L-d256-cap": (Gemma2Config(vocab_size=32000, hidden_size=1152, intermediate_size=4608,
                                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=256, query_pre_attn_scalar=256, sliding_window=128,
                                            attn_logit_softcapping=1.0, final_logit_softcapping=5.0,
                                            max_position_embeddings=8192, rms_norm_eps=1e-6, bos_token_id=2,
                                            eos_token_id=1, pad_token_id=0,
                                            hidden_activation="gelu_pytorch_tanh"),
                               {"f32": torch.float32}),
        "gemma2-4L-d128-cap": (Gemma2Config(vocab_size=32000, hidden_size=1024, intermediate_size=4096,
                                            num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                                            head_dim=128, query_pre_attn_scalar=144, sliding_window=96,
                                            attn_logit_softcapping=1.0, final_logit_softcapping=5.0,
                                            max_position_embeddings=8192, rms_norm_eps=1e-6, bos_token_id=2,
                                            eos_token_id=1, pad_token_id=0,
                                            hidden_activation="gelu_pytorch_tanh"),
                               {"f32": torch.float32}),
        # Gemma 3: five sliding layers (window 64, the local rope) to a global one (rope_theta
        # 1e6, linear ×8: the 4B's), q/k norms with 1 + w, one KV head.
        "gemma3-6L-d256": (gemma3_text_config(vocab_size=32000, hidden_size=1152, intermediate_size=6912,
                                              num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
                                              head_dim=256, query_pre_attn_scalar=256, sliding_window=64,
                                              max_position_embeddings=32768, rms_norm_eps=1e-6, bos_token_id=2,
                                              eos_token_id=1, pad_token_id=0,
                                              hidden_activation="gelu_pytorch_tanh"),
                           {"f32": torch.float32}),
        # Phi-3 longrope: the original context (128) inside the prompts' range, so that runs
        # take the short set, the long one, and switch during generation; Phi-4-mini's shape
        # adds the partial rotary (96 of 128) to it.
        "phi3-4L-longrope": (phi3_longrope_config(128, 128, 1.0, vocab_size=32064, hidden_size=1024,
                                                  intermediate_size=2816, num_hidden_layers=4,
                                                  num_attention_heads=8, num_key_value_heads=2,
                                                  max_position_embeddings=4096, rms_norm_eps=1e-5,
                                                  bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
                                                  tie_word_embeddings=False),
                             {"f32": torch.float32}),
        "phi4mini-4L-longrope-partial": (phi3_longrope_config(96, 256, 0.75, vocab_size=32064, hidden_size=768,
                                                              intermediate_size=2048, num_hidden_layers=4,
                                                              num_attention_heads=6, num_key_value_heads=2,
                                                              max_position_embeddings=4096, rms_norm_eps=1e-5,
                                                              bos_token_id=1, eos_token_id=32000,
                                                              pad_token_id=32000, tie_word_embeddings=True),
                                         {"f32": torch.float32}),
        # Mixtures of experts, two or three layers of the published shapes' widths. Their
        # routing is a discrete choice: where a token's k-th and (k+1)-th experts are nearly
        # tied, rounding may send it elsewhere — in transformers' own float16 run as in
        # gollm's, so the yardstick (hf_relL2) carries those rows too.
        "mixtral-2L-8x2": (MixtralConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2048,
                                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                         num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096,
                                         rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None,
                                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
                           {"f32": torch.float32}),
        "qwen2moe-2L-60x4": (Qwen2MoeConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                            moe_intermediate_size=704, shared_expert_intermediate_size=2816,
                                            num_experts=60, num_experts_per_tok=4, norm_topk_prob=False,
                                            decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=2,
                                            num_attention_heads=16, num_key_value_heads=16,
                                            max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                            use_sliding_window=False, bos_token_id=1, eos_token_id=2,
                                            tie_word_embeddings=False),
                             {"f32": torch.float32}),
        "qwen3moe-3L-128x8": (Qwen3MoeConfig(vocab_size=32000, hidden_size=1024, intermediate_size=3072,
                                             moe_intermediate_size=384, num_experts=128, num_experts_per_tok=8,
                                             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
                                             num_hidden_layers=3, num_attention_heads=16, num_key_value_heads=4,
                                             head_dim=128, max_position_embeddings=8192, rms_norm_eps=1e-6,
                                             rope_theta=1000000.0, use_sliding_window=False, bos_token_id=1,
                                             eos_token_id=2, tie_word_embeddings=False),
                              {"f32": torch.float32}),
    }
    runs = []  # (model, dtype, ckpt dir, sampling?)
    only = set(filter(None, args.only.split(",")))
    for mi, (name, (cfg, saves)) in enumerate(shapes.items()):
        if only and name not in only:
            continue
        dirs = make_checkpoint(os.path.join(args.work, name), cfg, 100 + mi, saves, spread_norms=name in SPREAD_NORMS)
        if "f16" in dirs:
            runs += [(name, "float16", dirs["f16"], False), (name, "bfloat16", dirs["bf16"], False)]
        else:
            sampling = "odd" in name  # a sampled run per family is enough
            runs += [(name, "float16", dirs["f32"], sampling), (name, "bfloat16", dirs["f32"], False)]
    runs = [r for r in runs if r[1] in args.dtypes.split(",")]
    print(f"checkpoints ready in {time.time() - t0:.1f}s", flush=True)

    rows, failures, notes = [], [], []
    for name, dtype, ckpt, sampling in runs:
        vocab = shapes[name][0].vocab_size
        prompts = make_prompts(vocab, 7)
        pfile = os.path.join(args.work, f"prompts-{vocab}.json")
        with open(pfile, "w") as f:
            json.dump({"prompts": prompts}, f)
        out = os.path.join(args.work, f"{name}-{dtype}.safetensors")
        cmd = [args.bin, "-ckpt", ckpt, "-dtype", dtype, "-prompts", pfile, "-out", out,
               "-steps", str(STEPS), "-logit-prompts", str(KLOGITS)]
        if args.lib:
            cmd += ["-lib", args.lib]
        if sampling:
            cmd.append("-sampling")
        t1 = time.time()
        res = subprocess.run(cmd, capture_output=True, text=True)
        print(res.stdout, res.stderr, flush=True)
        label = f"{name} {dtype}"
        if res.returncode != 0:
            failures.append(f"{label}: gollm-gpucheck failed ({res.returncode})")
            rows.append({"run": label, "status": "ERROR"})
            continue
        samp = None
        for line in res.stdout.splitlines():
            if line.startswith("SAMPLING "):
                samp = json.loads(line[len("SAMPLING "):])
        g = load_file(out)
        gen = {k: g[f"{k}.tokens"].long().tolist() for k in ("single", "batch", "batchlogits")}
        own_dtype = torch.float16 if dtype == "float16" else torch.bfloat16
        if name in STEPWISE:
            refs = reference_stepwise(ckpt, prompts, gen["single"])
            own = reference_stepwise(ckpt, prompts[:KLOGITS], gen["single"][:KLOGITS], dtype=own_dtype)
            chunk_refs = reference_stepwise(ckpt, prompts[:KLOGITS], None, chunk=7)
        else:
            refs = reference(ckpt, prompts, gen["single"])
            # transformers in the run's dtype, on the logit prompts: the yardstick.
            own = reference(ckpt, prompts[:KLOGITS], gen["single"][:KLOGITS], own_dtype)
            chunk_refs = [r[:len(p)] for p, r in zip(prompts[:KLOGITS], refs)]
        hf_err = max(rel_l2_rows(own[i], refs[i]) for i in range(KLOGITS))
        row = {"run": label, "gollm_s": round(time.time() - t1, 1)}
        err = {"prompt": 0.0, "decode": 0.0, "batch_decode": 0.0, "batch_prompt": 0.0, "chunked": 0.0}
        scale = 0.0  # the largest per-row RMS logit difference from transformers fp32
        for i in range(KLOGITS):
            P = len(prompts[i])
            r = refs[i]
            scale = max(scale, rms_diff_rows(g[f"single.prompt_logits.{i}"], r[:P]),
                        rms_diff_rows(g[f"single.decode_logits.{i}"], r[P:P + STEPS]))
            err["prompt"] = max(err["prompt"], rel_l2_rows(g[f"single.prompt_logits.{i}"], r[:P]))
            err["decode"] = max(err["decode"], rel_l2_rows(g[f"single.decode_logits.{i}"], r[P:P + STEPS]))
            err["batch_prompt"] = max(err["batch_prompt"], rel_l2_rows(g[f"batchlogits.prompt_logits.{i}"], r[:P]))
            # The batch fed its own tokens; compare its logits where they match the single run.
            if gen["batchlogits"][i] == gen["single"][i]:
                err["batch_decode"] = max(err["batch_decode"], rel_l2_rows(g[f"batchlogits.decode_logits.{i}"], r[P:P + STEPS]))
            err["chunked"] = max(err["chunked"], rel_l2_rows(g[f"chunked.prompt_logits.{i}"], chunk_refs[i]))
        tol = max(TOL_LOGITS, 1.5 * hf_err)
        for k, v in err.items():
            row[f"relL2_{k}"] = f"{v:.2e}"
            if not v < tol:
                failures.append(f"{label}: {k} logits relative L2 {v:.3e} ≥ {tol:.3e}")
        row["hf_relL2"] = f"{hf_err:.2e}"
        tol_gap = max(TOL_GAP, 6 * scale)
        row["tol_gap"] = f"{tol_gap:.1e}"
        # The reference's top-2 gaps, with the tolerance, also beside the run's output:
        # tritonbench -check -gaps accepts the same near-ties in tests/gpu/triton_e2e.sh's
        # streams.
        gaps = top2_gaps(prompts, refs)
        with open(out[: -len(".safetensors")] + ".gaps.json", "w") as f:
            json.dump({"tol_gap": tol_gap, "gaps": gaps}, f)
        fails, accepted, min_gap = check_tokens(prompts, gen["single"], refs, gaps, tol_gap)
        ntok = len(prompts) * (STEPS + 1)
        row["tokens_vs_hf"] = f"{ntok - len(fails) - len(accepted)}/{ntok}"
        row["accepted_divergences"] = len(accepted)
        row["min_top2_gap"] = f"{min_gap:.2e}"
        for f_ in fails:
            failures.append(f"{label}: prompt {f_[0]} step {f_[1]}: gollm {f_[2]}, transformers {f_[3]} (top-2 gap {f_[4]:.2e})")
        for a in accepted:
            notes.append(f"{label}: accepted divergence prompt {a[0]} step {a[1]} (gap {a[4]:.2e})")
        for k in ("batch", "batchlogits"):
            bad, ok = same_tokens(gen["single"], gen[k], gaps, tol_gap)
            row[f"{k}_same"] = f"{len(prompts) - len(bad) - len(ok)}/{len(prompts)}"
            for b in bad:
                failures.append(f"{label}: {k}: prompt {b[0]} differs from its single run at step {b[1]} (gap {b[2]:.2e})")
            for b in ok:
                notes.append(f"{label}: {k}: prompt {b[0]} differs at step {b[1]}, accepted (gap {b[2]:.2e})")
        if samp is not None:
            rate = samp["agree"] / samp["total"]
            row["sampling_agree"] = f"{samp['agree']}/{samp['total']}"
            notes.append(f"{label}: sampling vs CPU engine: {json.dumps(samp)}")
            if rate < 0.95:
                failures.append(f"{label}: sampling agrees with the CPU engine in {rate:.1%} < 95%")
        rows.append(row)

    keys = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    print()
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
    for n in notes:
        print("note:", n)
    for f_ in failures:
        print("FAIL:", f_)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "notes": notes, "failures": failures}, f, indent=1)
    print(f"{len(rows) - len({f.split(':')[0] for f in failures})} passed, {len({f.split(':')[0] for f in failures})} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

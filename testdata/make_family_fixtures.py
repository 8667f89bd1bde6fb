"""Write the tiny fixture checkpoints of the families issue 37 adds — Qwen3, Gemma 2, Gemma 3,
Phi-3, Phi-4-mini, Mixtral, Qwen2-MoE, Qwen3-MoE — and their golden logits with Hugging Face
transformers' own model classes, in float32 on the CPU so that they are exact:

    python3 testdata/make_family_fixtures.py testdata

Made with torch 2.15.0 (PyPI's wheel, run on the CPU) and transformers 5.24.0, installed into
a virtual environment outside the repository; each golden file records both versions in its
metadata. Like make_llama_fixtures.py it writes, per fixture, testdata/<name> (config.json,
model.safetensors, generation_config.json as save_pretrained writes them) and
testdata/<name>-golden.safetensors (prompt ids, prompt logits, greedy tokens and the logits
of 16 decode steps after the 14-token prompt), with weights spread wider than the default
initialisation so that greedy choices are far apart. Each fixture's seed (the last entry of
its row) was picked among the first 24 for a greedy run of at least 10 distinct tokens whose
top-2 logits stay at least 0.01 apart (and, for the MoE ones, router probabilities 1e-3
apart). Vocabularies have 256 tokens (192 for the two largest MoE fixtures); each weighs at
most 170 KB. What each one covers:

  qwen3-tiny      Qwen3: per-head RMSNorm of queries and keys before rotary (q_norm, k_norm),
                  head_dim 16 given explicitly (heads · head_dim = 64 ≠ hidden 32), grouped-query
                  attention, tied embeddings; Qwen3's sampling defaults in generation_config.json
  gemma2-tiny     Gemma 2: embeddings scaled by √hidden, RMSNorm with (1 + w) in float32, pre- and
                  post-norms around attention and the MLP, GeGLU with the tanh GELU, queries scaled
                  by query_pre_attn_scalar^-½ (24, not head_dim 16), attention-logit soft-capping
                  (4.0) and final-logit soft-capping (3.0) set low enough to bend these logits,
                  alternating sliding (window 6, layers 0 and 2) and global layers
  gemma3-tiny     Gemma 3 text (Gemma3ForCausalLM): layer_types sliding, sliding, full (window 5),
                  a rope base per layer kind (10,000 sliding; 1,000,000 with linear scaling 2 on the
                  global layer), q_norm and k_norm with (1 + w), query_pre_attn_scalar 20, no
                  soft-capping
  phi3-longrope-tiny Phi-3: fused qkv_proj and gate_up_proj, longrope with short and long factors and
                  original_max_position_embeddings 8 below the 14-token prompt, so that the long
                  factors and the attention factor √(1 + ln 16 / ln 8) are the ones in use for every
                  position (transformers picks one set for the whole sequence by its length)
  phi4mini-tiny   Phi-4-mini's shape: partial_rotary_factor 0.75 (12 of 16 dimensions rotated),
                  longrope whose original context (64) holds the whole run, so that the short factors
                  are the ones in use, tied embeddings, grouped-query attention
  mixtral-tiny    Mixtral: 8 experts, top-2 with the top weights renormalised, w1/w2/w3 names
  qwen2moe-tiny   Qwen2-MoE: 8 experts top-2 without renormalisation (norm_topk_prob false), the
                  shared expert scaled by sigmoid(shared_expert_gate · x), q/k/v biases
  qwen3moe-tiny   Qwen3-MoE: layer 0 dense (mlp_only_layers [0]), layer 1 8 experts top-2 with
                  norm_topk_prob true, q_norm/k_norm

The MoE fixtures are checked for routing ties: across the prompt and every decode step, the
k-th and (k+1)-th router probabilities of each token differ by more than 1e-3, so that float
error in an engine cannot change which experts a token goes to. Prompts cross each sliding
window, and the whole sequence computed at once must agree with the cached decode steps.
"""
import os
import sys

import torch
from safetensors.torch import save_file
import transformers
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          MixtralConfig, MixtralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

common = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, max_position_embeddings=128,
              bos_token_id=1, eos_token_id=2)


def longrope(rotary_dim, original):
    """Short factors near 1 and long factors rising to 8 over the pairs (Phi-3's shape)."""
    half = rotary_dim // 2
    return {"rope_type": "longrope",
            "short_factor": [1.0 + 0.05 * i for i in range(half)],
            "long_factor": [1.0 + 7.0 * i / (half - 1) for i in range(half)],
            "original_max_position_embeddings": original}


fixtures = [
    ("qwen3-tiny", Qwen3ForCausalLM, Qwen3Config(
        **common, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True),
     dict(do_sample=True, temperature=0.6, top_k=20, top_p=0.95), 1),
    ("gemma2-tiny", Gemma2ForCausalLM, Gemma2Config(
        **{**common, "num_hidden_layers": 3, "bos_token_id": 2, "eos_token_id": [1, 107]},
        pad_token_id=0, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        query_pre_attn_scalar=24, sliding_window=6, attn_logit_softcapping=4.0, final_logit_softcapping=3.0,
        hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True),
     dict(), 15),
    ("gemma3-tiny", Gemma3ForCausalLM, Gemma3TextConfig(
        **{**common, "num_hidden_layers": 3, "bos_token_id": 2, "eos_token_id": [1, 106]},
        pad_token_id=0, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        query_pre_attn_scalar=20, sliding_window=5,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0}},
        hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True),
     dict(do_sample=True, top_k=64, top_p=0.95), 21),
    ("phi3-longrope-tiny", Phi3ForCausalLM, Phi3Config(
        **{**common, "eos_token_id": [2, 7]}, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, original_max_position_embeddings=8, rope_theta=10000.0,
        rope_parameters={**longrope(8, 8), "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
        sliding_window=None, pad_token_id=3, tie_word_embeddings=False),
     dict(), 15),
    ("phi4mini-tiny", Phi3ForCausalLM, Phi3Config(
        **{**common, "eos_token_id": [2, 7]}, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
        rms_norm_eps=1e-5, original_max_position_embeddings=64, rope_theta=10000.0,
        rope_parameters={**longrope(12, 64), "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
        sliding_window=None, pad_token_id=3, tie_word_embeddings=True),
     dict(), 4),
    ("mixtral-tiny", MixtralForCausalLM, MixtralConfig(
        **{**common, "vocab_size": 192}, intermediate_size=12, num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
        num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None,
        tie_word_embeddings=False),
     dict(), 20),
    ("qwen2moe-tiny", Qwen2MoeForCausalLM, Qwen2MoeConfig(
        **{**common, "vocab_size": 192}, intermediate_size=64, moe_intermediate_size=8, shared_expert_intermediate_size=32,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False),
     dict(), 19),
    ("qwen3moe-tiny", Qwen3MoeForCausalLM, Qwen3MoeConfig(
        **common, intermediate_size=64, moe_intermediate_size=8, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0], num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False),
     dict(do_sample=True, temperature=0.6, top_k=20, top_p=0.95), 2),
]

prompt = torch.tensor([[17, 101, 3, 150, 99, 99, 12, 77, 140, 5, 31, 180, 64, 128]])
STEPS = 16


def build(name, cls, cfg, gen, seed, out):
    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    # Spread the weights wider than the default 0.02 so that logits are peaked: greedy
    # choices then differ by far more than the float error the comparison allows.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                # Gemma's norms scale by (1 + w): these scale by about 2, which keeps the
                # residual stream from being mostly the √hidden-scaled embedding.
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif pname.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "embed_tokens" in pname or "lm_head" in pname:
                # A tied embedding scores each token against itself; a narrower one keeps
                # greedy decoding from repeating the last token.
                p.copy_((0.1 if cfg.tie_word_embeddings else 0.3) * torch.randn_like(p))
            else:
                # Fused expert tensors are [experts][out][in]: the input is the last axis.
                p.copy_(p.shape[-1] ** -0.5 * torch.randn_like(p))
    model.generation_config.update(**gen)
    model.save_pretrained(os.path.join(out, name), safe_serialization=True)

    # Router probabilities of every MoE layer, for the tie check.
    routes = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: routes.append(o[0].detach().float()))
             for n, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")]
    with torch.no_grad():
        o = model(prompt, use_cache=True)
        prompt_logits = o.logits[0].clone()
        past = o.past_key_values
        tok = int(prompt_logits[-1].argmax())
        toks, steps = [], []
        for _ in range(STEPS):
            toks.append(tok)
            o = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past = o.past_key_values
            steps.append(o.logits[0, -1].clone())
            tok = int(o.logits[0, -1].argmax())
        for h in hooks:
            h.remove()
        # The whole sequence at once must give the same logits as the cached steps (it
        # checks that the sliding windows and the cache agree in transformers itself).
        full = model(torch.cat([prompt, torch.tensor([toks])], dim=1)).logits[0]
        n = prompt.shape[1]
        assert torch.allclose(full[n:n + STEPS - 1], torch.stack(steps[:STEPS - 1]), atol=1e-4), name
        assert torch.allclose(full[:n], prompt_logits, atol=1e-4), name
    route_gap = None
    if routes:
        k = cfg.num_experts_per_tok
        probs = torch.cat([torch.softmax(r, dim=-1) for r in routes])
        top = probs.topk(k + 1, dim=-1).values
        route_gap = float((top[:, k - 1] - top[:, k]).min())
    gap = min(float(s.topk(2).values[0] - s.topk(2).values[1]) for s in [prompt_logits[-1]] + steps)
    return {"prompt_logits": prompt_logits, "greedy": toks, "steps": steps, "gap": gap, "route_gap": route_gap}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "testdata"
    only = set(sys.argv[2:])
    for name, cls, cfg, gen, seed in fixtures:
        if only and name not in only:
            continue
        r = build(name, cls, cfg, gen, seed, out)
        assert r["route_gap"] is None or r["route_gap"] > 1e-3, f"{name}: router probabilities {r['route_gap']:.2g} apart"
        save_file({
            "prompt_ids": prompt[0].to(torch.int32).contiguous(),
            "prompt_logits": r["prompt_logits"].float().contiguous(),
            "greedy_tokens": torch.tensor(r["greedy"], dtype=torch.int32),
            "decode_logits": torch.stack(r["steps"]).float().contiguous(),
        }, os.path.join(out, name + "-golden.safetensors"),
            metadata={"transformers": transformers.__version__, "torch": torch.__version__})
        size = os.path.getsize(os.path.join(out, name, "model.safetensors"))
        print(name, "greedy", r["greedy"], "top-2 logit gap min %.3f" % r["gap"],
              "" if r["route_gap"] is None else "router gap min %.4f" % r["route_gap"], "weights %d B" % size)


if __name__ == "__main__":
    main()

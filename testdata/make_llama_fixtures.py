"""Write the tiny LLaMA-family fixture checkpoints and their golden logits with Hugging Face
transformers, in float32 on the CPU so that they are exact.

    python3 testdata/make_llama_fixtures.py testdata [NAME...]

(the NAMEs alone, when given). For each fixture it writes testdata/<name> (config.json, model.safetensors,
generation_config.json as save_pretrained writes them) and testdata/<name>-golden.safetensors
(prompt ids, prompt logits, greedy tokens and the logits of 16 decode steps). The four
cover what the LLaMA family adds to GPT-2:

  llama-tiny    RMSNorm, rotary, grouped-query attention (4 heads, 2 KV heads), SwiGLU,
                a separate LM head
  llama3-tiny   llama3 rope scaling (an original context shorter than the run, so that
                scaling matters), head_dim given explicitly (32, with hidden 64 and 4 heads),
                attention and MLP biases, tied embeddings
  qwen2-tiny    Qwen2: q/k/v biases, multi-query attention (1 KV head), tied embeddings
  mistral-tiny  Mistral with a sliding window of 8, shorter than the 12-token prompt
  phi3-tiny     Phi-3: fused qkv_proj and gate_up_proj, and a partial rotary factor of 0.5
                (8 of each head's 16 dimensions rotate)
"""
import os
import sys

import torch
from safetensors.torch import save_file
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM)

out = sys.argv[1] if len(sys.argv) > 1 else "testdata"
only = set(sys.argv[2:])
common = dict(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=128, rms_norm_eps=1e-6,
              bos_token_id=1, eos_token_id=2)
fixtures = [
    ("llama-tiny", LlamaForCausalLM, LlamaConfig(**common, num_key_value_heads=2,
                                                 tie_word_embeddings=False)),
    ("llama3-tiny", LlamaForCausalLM, LlamaConfig(**{**common, "eos_token_id": [2, 3]},
                                                  num_key_value_heads=2, head_dim=32,
                                                  attention_bias=True, mlp_bias=True,
                                                  tie_word_embeddings=True, rope_theta=500000.0,
                                                  rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                                "low_freq_factor": 1.0,
                                                                "high_freq_factor": 4.0,
                                                                "original_max_position_embeddings": 16})),
    ("qwen2-tiny", Qwen2ForCausalLM, Qwen2Config(**common, num_key_value_heads=1,
                                                 tie_word_embeddings=True, rope_theta=1000000.0)),
    ("mistral-tiny", MistralForCausalLM, MistralConfig(**common, num_key_value_heads=2,
                                                       sliding_window=8, tie_word_embeddings=False)),
    ("phi3-tiny", Phi3ForCausalLM, Phi3Config(**common, num_key_value_heads=2, partial_rotary_factor=0.5,
                                              pad_token_id=None, tie_word_embeddings=False)),
]

prompt = torch.tensor([[17, 401, 3, 998, 250, 250, 12, 77, 640, 5, 31, 900]])
for name, cls, cfg in fixtures:
    if only and name not in only:
        continue
    torch.manual_seed(20261123)
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    # Spread the weights wider than the default 0.02 so that logits are peaked: greedy
    # choices then differ by far more than the float error the comparison allows.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif pname.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "embed_tokens" in pname or "lm_head" in pname:
                # A tied embedding scores each token against itself; a narrower one keeps
                # greedy decoding from repeating the last token.
                p.copy_((0.1 if cfg.tie_word_embeddings else 0.3) * torch.randn_like(p))
            else:
                p.copy_(p.shape[-1] ** -0.5 * torch.randn_like(p))
    model.save_pretrained(os.path.join(out, name), safe_serialization=True)
    with torch.no_grad():
        o = model(prompt, use_cache=True)
        prompt_logits = o.logits[0].clone()
        past = o.past_key_values
        tok = int(prompt_logits[-1].argmax())
        toks, steps = [], []
        for _ in range(16):
            toks.append(tok)
            o = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past = o.past_key_values
            steps.append(o.logits[0, -1].clone())
            tok = int(o.logits[0, -1].argmax())
        # The whole sequence at once must give the same logits as the cached steps (it
        # checks that the sliding window and the cache agree in transformers itself).
        full = model(torch.cat([prompt, torch.tensor([toks])], dim=1)).logits[0]
        assert torch.allclose(full[prompt.shape[1]:prompt.shape[1] + 15], torch.stack(steps[:15]),
                              atol=1e-4), name
    save_file({
        "prompt_ids": prompt[0].to(torch.int32).contiguous(),
        "prompt_logits": prompt_logits.float().contiguous(),
        "greedy_tokens": torch.tensor(toks, dtype=torch.int32),
        "decode_logits": torch.stack(steps).float().contiguous(),
    }, os.path.join(out, name + "-golden.safetensors"),
        metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    gaps = [float(s.topk(2).values[0] - s.topk(2).values[1]) for s in steps]
    print(name, "greedy", toks, "top2 gap min %.3f" % min(gaps))

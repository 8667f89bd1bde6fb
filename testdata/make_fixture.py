"""Write the tiny GPT-2 fixture checkpoint and its golden logits with Hugging Face transformers.

Run once on a machine with torch and transformers (the device machine has both):
    python3 tests/gpu/make_fixture.py testdata
It writes testdata/gpt2-tiny (config.json + model.safetensors), testdata/gpt2-tiny-sharded
(the same weights split into shards with model.safetensors.index.json) and
testdata/gpt2-tiny-golden.safetensors (prompt ids, prompt logits, greedy tokens and the
logits of 16 decode steps), all in float32 on the CPU so that they are exact.
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

out = sys.argv[1] if len(sys.argv) > 1 else "testdata"
torch.manual_seed(20261121)
cfg = GPT2Config(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                 bos_token_id=0, eos_token_id=999, layer_norm_epsilon=1e-5)
model = GPT2LMHeadModel(cfg).eval()
model.config._attn_implementation = "eager"
# Spread the weights wider than the default 0.02 so that logits are peaked: greedy choices
# then differ by far more than the float error the comparison allows.
with torch.no_grad():
    for name, p in model.named_parameters():
        if ".ln_" in name or name.startswith("transformer.ln_f"):
            p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
        elif name.endswith("bias"):
            p.copy_(0.1 * torch.randn_like(p))
        else:
            p.copy_(0.3 * torch.randn_like(p))

model.save_pretrained(os.path.join(out, "gpt2-tiny"), safe_serialization=True)
model.save_pretrained(os.path.join(out, "gpt2-tiny-sharded"), safe_serialization=True,
                      max_shard_size="200KB")

prompt = torch.tensor([[17, 401, 3, 998, 250, 250, 12, 77, 640, 5, 31, 900]])
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
    # One more generate() run to cross-check the hand-written loop.
    g = model.generate(prompt, max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert g[0, prompt.shape[1]:].tolist() == toks, (g, toks)

save_file({
    "prompt_ids": prompt[0].to(torch.int32).contiguous(),
    "prompt_logits": prompt_logits.float().contiguous(),
    "greedy_tokens": torch.tensor(toks, dtype=torch.int32),
    "decode_logits": torch.stack(steps).float().contiguous(),
}, os.path.join(out, "gpt2-tiny-golden.safetensors"),
   metadata={"transformers": __import__("transformers").__version__, "torch": torch.__version__})
print("greedy", toks)
print("top2 gap min", float(min((s.topk(2).values[0] - s.topk(2).values[1]) for s in steps)))

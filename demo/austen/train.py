"""Train the demo model on the device machine (a GPU, torch and transformers), from what
prepare.py wrote:

    python3 demo/austen/train.py DATA OUT [SECONDS] [--layers N --hidden N --heads N
        --kv-heads N --inner N --shard-mb N]

Without the options it trains the shipped model (model_repository/austen/1). The options
give another shape on the same tokenizer — the speculative decoding target whose draft is
the shipped model (README.md, "The speculative decoding pair") — and --shard-mb splits
the saved weights into files of at most that many megabytes (model.safetensors.index.json).

A LLaMA-shaped model — 4 layers, hidden 256, 4 heads of 64 with 2 KV heads (grouped-query
attention), a gated SiLU MLP 768 wide, RMSNorm, rotary positions, tied embeddings, the
4,096-token vocabulary of DATA/tokenizer.json: 4.2M parameters — trained on random 256-token
windows of DATA/train.txt (paragraphs joined by <|endoftext|>), batches of 64, with AdamW
(warm-up, cosine decay) and attention dropout 0.1, bf16 autocast, for 1,500 steps (or SECONDS,
default 150, of wall time). The held-out perplexity (DATA/heldout.txt, non-overlapping
256-token windows) is measured every 50 steps and the best weights are kept. OUT receives
the Hugging Face checkpoint in float16 (config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json with a chat template) and
train.log with the curve and sample completions.
"""
import argparse
import json
import math
import os
import shutil
import time

import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

CTX = 256
# The GPU when there is one; the CPU only for a smoke run of the script.
DEV = "cuda" if torch.cuda.is_available() else "cpu"
BATCH = 64
# Optimizer steps: about 27 passes over the corpus. A 0.9M-token corpus overfits a
# 4.2M-parameter model after about 10 (the held-out perplexity turns near step 550), so the
# best checkpoint is kept, not the last.
STEPS = 1500
EVERY = 50
SEED = 20261123

# A minimal chat template (the model never saw chats: it writes Austen-like prose after
# whatever the template renders).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}\"{{ message['content'] }}\" said she.\n"
    "{% else %}\"{{ message['content'] }}\" he replied.<|endoftext|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}\"{% endif %}"
)


def tokens(tok, path):
    eos = tok.token_to_id("<|endoftext|>")
    ids = []
    for line in open(path):
        line = line.rstrip("\n")
        if line:
            ids += tok.encode(line).ids + [eos]
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def perplexity(model, ids):
    model.eval()
    n = (len(ids) - 1) // CTX
    x = ids[: n * CTX].view(n, CTX).to(DEV)
    y = ids[1 : n * CTX + 1].view(n, CTX).to(DEV)
    nll = 0.0
    for i in range(0, n, 64):
        with torch.autocast(DEV, dtype=torch.bfloat16):
            logits = model(x[i : i + 64]).logits.float()
        nll += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i : i + 64].reshape(-1),
                                                 reduction="sum").item()
    model.train()
    return math.exp(nll / (n * CTX))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("seconds", nargs="?", type=float, default=150)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--inner", type=int, default=768)
    ap.add_argument("--shard-mb", type=int, default=0)
    args = ap.parse_args()
    data, out, seconds = args.data, args.out, args.seconds
    os.makedirs(out, exist_ok=True)
    log = open(os.path.join(out, "train.log"), "w")

    def say(*a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        log.write(s + "\n")

    torch.manual_seed(SEED)
    tok = Tokenizer.from_file(os.path.join(data, "tokenizer.json"))
    train = tokens(tok, os.path.join(data, "train.txt"))
    held = tokens(tok, os.path.join(data, "heldout.txt"))
    eos = tok.token_to_id("<|endoftext|>")
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=args.hidden, intermediate_size=args.inner,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=True, attention_dropout=0.1, bos_token_id=eos, eos_token_id=eos,
                      pad_token_id=eos)
    model = LlamaForCausalLM(cfg).to(DEV)
    params = sum(p.numel() for p in model.parameters())
    say(f"corpus {len(train)} training tokens, {len(held)} held out; model {params / 1e6:.2f}M parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warm, lr_max, lr_min = 50, 1e-3, 5e-5
    # The step count the time allows, estimated after a few steps, sets the cosine decay.
    est_steps, step, t0 = None, 0, time.time()
    best, best_state = float("inf"), None
    g = torch.Generator(device="cpu").manual_seed(SEED)
    while True:
        el = time.time() - t0
        est_steps = STEPS
        if step >= est_steps or el > seconds:
            break
        total = est_steps or 10**9
        lr = lr_max * step / warm if step < warm else lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(train) - CTX - 1, (BATCH,), generator=g)
        x = torch.stack([train[s : s + CTX] for s in starts]).to(DEV)
        y = torch.stack([train[s + 1 : s + CTX + 1] for s in starts]).to(DEV)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            logits = model(x).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % EVERY == 0 or step == est_steps or time.time() - t0 > seconds:
            ppl = perplexity(model, held)
            say(f"step {step} lr {lr:.2e} train loss {loss.item():.3f} held-out perplexity {ppl:.2f} ({time.time() - t0:.0f}s)")
            if ppl < best:
                best, best_state = ppl, {k: v.detach().clone() for k, v in model.state_dict().items()}
    if best_state is None:  # a run too short to evaluate
        best, best_state = perplexity(model, held), model.state_dict()
    model.load_state_dict(best_state)
    say(f"best held-out perplexity {best:.2f} after {step} steps, {time.time() - t0:.0f}s")
    model = model.half().eval()
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
                                               do_sample=True, temperature=0.8, top_p=0.95)
    if args.shard_mb > 0:
        model.save_pretrained(out, safe_serialization=True, max_shard_size=f"{args.shard_mb}MB")
    else:
        model.save_pretrained(out, safe_serialization=True)
    shutil.copy(os.path.join(data, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|endoftext|>",
                   "pad_token": "<|endoftext|>", "add_bos_token": False, "add_eos_token": False,
                   "model_max_length": 1024, "chat_template": CHAT_TEMPLATE}, f, indent=2)
    # Samples, greedy and sampled, for the README.
    with torch.no_grad():
        for prompt in ["Hello, my name is", "It is a truth universally acknowledged", "The weather at Bath"]:
            ids = torch.tensor([tok.encode(prompt).ids], device=DEV)
            greedy = model.generate(ids, max_new_tokens=40, do_sample=False)
            torch.manual_seed(1)
            sampled = model.generate(ids, max_new_tokens=40, do_sample=True, temperature=0.8, top_p=0.95)
            say(f"greedy  {prompt!r} -> {tok.decode(greedy[0, ids.shape[1]:].tolist())!r}")
            say(f"sampled {prompt!r} -> {tok.decode(sampled[0, ids.shape[1]:].tolist())!r}")


if __name__ == "__main__":
    main()

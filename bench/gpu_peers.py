"""GPU benchmark: gollm's engine beside Hugging Face transformers and the bandwidth floor.

Run on the GPU machine (torch and transformers there), after building libgollm_cuda.so
and bench/gpubench:

    python3 bench/gpu_peers.py --gpubench .carry/gpubench --lib .carry/libgollm_cuda.so

It writes random-weight fp16 checkpoints (GPT-2 124M; the GPT-350M shape of
FasterTransformer's table: 24 layers, 16 heads of 64, vocabulary 51,200; the TinyLlama-1.1B
and Llama-2-7B shapes) and bf16 ones (the Qwen3-8B and Gemma-3-4B text shapes; pick with
--models), measures the device-to-device copy bandwidth,
runs gpubench (the engine alone), then the same workloads in transformers (eager
`generate`, and `generate` with cache_implementation="static", which compiles), and writes
every figure as a JSON line in BENCH.md's format to bench/results/<date>-gpu-<gpu>.jsonl
(appending; and --out), printing a table last.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, GPT2Config, LlamaConfig, Qwen3Config


def gemma3_4b_text():
    """Gemma 3 4B's language model (gemma-3-4b-it's text_config with the config class's
    defaults), in transformers 5's rope_parameters or transformers 4's fields."""
    kw = dict(vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
              num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
              sliding_window=1024, max_position_embeddings=131072, rms_norm_eps=1e-6, bos_token_id=2,
              eos_token_id=1, pad_token_id=0, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)
    try:
        return Gemma3TextConfig(**kw, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})
    except (TypeError, ValueError):
        return Gemma3TextConfig(**kw, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                                rope_scaling={"rope_type": "linear", "factor": 8.0})


MODELS = {
    "gpt2-124M": GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                            bos_token_id=0, eos_token_id=0),
    "gpt-350M": GPT2Config(vocab_size=51200, n_positions=1024, n_embd=1024, n_layer=24, n_head=16,
                           bos_token_id=0, eos_token_id=0),
    "tinyllama-1.1B": LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                  num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                  max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=1,
                                  eos_token_id=2, tie_word_embeddings=False),
    "llama2-7B": LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                             num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                             max_position_embeddings=4096, rms_norm_eps=1e-5, bos_token_id=1,
                             eos_token_id=2, tie_word_embeddings=False),
    # Tensor parallelism's second shape (tests/gpu/tp_check.sh); no peer run of it here.
    "llama2-13B": LlamaConfig(vocab_size=32000, hidden_size=5120, intermediate_size=13824,
                              num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40,
                              max_position_embeddings=4096, rms_norm_eps=1e-5, bos_token_id=1,
                              eos_token_id=2, tie_word_embeddings=False),
    # Issue 37's dense targets (bench/dense_peers.sh), in bf16 as they are served.
    "qwen3-8B": Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                            max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                            bos_token_id=151643, eos_token_id=151645, tie_word_embeddings=False),
    "gemma3-4B": gemma3_4b_text(),
}
# The models benchmarked in bfloat16; the others in float16.
BF16 = {"qwen3-8B", "gemma3-4B"}
WORKLOADS = {
    "gpt2-124M": ["decode_b1_i128_o128", "tput_b64_i128_o128", "beam4_b16_i128_o128"],
    "gpt-350M": ["lat_b1_i128_o8", "lat_b8_i128_o8", "lat_b64_i128_o8", "lat_b1_i512_o32", "lat_b16_i512_o32"],
    "tinyllama-1.1B": ["decode_b1_i128_o128", "tput_b64_i128_o128", "beam4_b16_i128_o128"],
    "llama2-7B": ["decode_b1_i128_o128", "tput_b64_i128_o128"],
    "qwen3-8B": ["decode_b1_i128_o128", "tput_b64_i128_o128"],
    "gemma3-4B": ["decode_b1_i128_o128", "tput_b64_i128_o128"],
}
# transformers' static cache compiles per shape; only these run it (the rest: eager).
STATIC = {"decode_b1_i128_o128", "tput_b64_i128_o128", "lat_b1_i128_o8"}


def parse(w):
    kind, rest = w.split("_", 1)
    b, i, o = map(int, re.match(r"b(\d+)_i(\d+)_o(\d+)", rest).groups())
    return kind, b, i, o


def torch_dtype(name):
    return torch.bfloat16 if name in BF16 else torch.float16


def make_checkpoint(root, name):
    d = os.path.join(root, name)
    if not os.path.exists(os.path.join(d, "config.json")):
        torch.manual_seed(1)
        # Made on the GPU in fp16: a 7B model initialised on the CPU in fp32 takes minutes.
        with torch.device("cuda"):
            m = AutoModelForCausalLM.from_config(MODELS[name], torch_dtype=torch_dtype(name))
        m.save_pretrained(d, safe_serialization=True)
        del m
        torch.cuda.empty_cache()
    return d


def step_bytes(name, ctx):
    """Bytes a decode step reads at least: every weight once (the embedding only by the
    rows it looks up, unless it is the tied LM head) and the KV cache of ctx positions."""
    cfg = MODELS[name]
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in m.parameters())
    if not cfg.tie_word_embeddings:
        total -= m.get_input_embeddings().weight.numel()
    if hasattr(cfg, "n_positions"):
        total -= cfg.n_positions * cfg.n_embd  # wpe: one row a token
        layers, kv_width = cfg.n_layer, cfg.n_embd
    else:
        layers = cfg.num_hidden_layers
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_width = cfg.num_key_value_heads * head_dim
    return 2 * total + 2 * 2 * layers * kv_width * ctx


def copy_bandwidth():
    """Bytes read plus written per second by a large device-to-device copy (median)."""
    n = 1 << 30
    a = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    return 2 * n / times[len(times) // 2]


def hf_run(model, b, i, o, static, vocab, beams=1, reps=3, first_too=True):
    ids = torch.randint(0, vocab, (b, i), device="cuda")
    mask = torch.ones_like(ids)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None, attention_mask=mask)
    if beams > 1:
        kw.update(num_beams=beams, num_return_sequences=1, length_penalty=1.0, early_stopping=False)
    if static:
        kw["cache_implementation"] = "static"

    def gen(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        assert out.shape[1] == i + n, out.shape
        return time.perf_counter() - t

    gen(o)  # warm-up (and compilation)
    gen(o)
    full = sorted(gen(o) for _ in range(reps))[reps // 2]
    # The first token's time, which decode figures subtract; the others do not read it.
    first = sorted(gen(1) for _ in range(reps))[reps // 2] if first_too else 0.0
    return full, first


def figure(kind, b, o, full, first):
    if kind == "decode":
        return "ms_per_token", (full - first) * 1e3 / (o - 1)
    if kind == "tput" or kind.startswith("beam"):
        return "tokens_per_s", b * o / full
    return "latency_ms", full * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpubench", required=True)
    ap.add_argument("--lib", default="")
    ap.add_argument("--work", default="/tmp/gollm-bench")
    ap.add_argument("--out", default="")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-static", action="store_true")
    ap.add_argument("--models", default="gpt2-124M,gpt-350M", help="comma-separated: " + ",".join(MODELS))
    ap.add_argument("--workloads", default="", help="comma-separated subset of the models' workloads (default: all)")
    ap.add_argument("--hf-workloads", default="", help="comma-separated workloads transformers runs (default: all)")
    ap.add_argument("--skip-eager", action="store_true", help="transformers' static-cache generate only")
    ap.add_argument("--graphs-only", action="store_true", help="gpubench with CUDA graphs only")
    ap.add_argument("--reps", type=int, default=0, help="timed repetitions (gpubench's -reps; transformers' 3); 0: defaults")
    args = ap.parse_args()
    t_start = time.time()
    if args.workloads:
        keep = set(args.workloads.split(","))
        for k in WORKLOADS:
            WORKLOADS[k] = [w for w in WORKLOADS[k] if w in keep]
    os.makedirs(args.work, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    # GOLLM_COMMIT names the build that runs (the device machine's copy of the tree may
    # carry older git metadata than the library it was handed); git is the fallback.
    commit = os.environ.get("GOLLM_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        except OSError:
            commit = ""
    base = {"date": date, "commit": commit, "machine": gpu}
    results = []

    def add(model, workload, impl, metric, value):
        dt = "bf16" if model in BF16 else "fp16"
        r = dict(base, model=model, dtype=dt, workload=workload, impl=impl, metric=metric, value=round(value, 4))
        results.append(r)
        print(json.dumps(r), flush=True)

    bw = copy_bandwidth()
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    for name in args.models.split(","):
        ckpt = make_checkpoint(args.work, name)
        print(f"[{time.time() - t_start:.0f}s] {name}: checkpoint ready", flush=True)
        cmd = [args.gpubench, "-ckpt", ckpt, "-model", name, "-workloads", ",".join(WORKLOADS[name]),
               "-dtype", "bfloat16" if name in BF16 else "float16"]
        if args.lib:
            cmd += ["-lib", args.lib]
        if args.reps:
            cmd += ["-reps", str(args.reps)]
        for extra in ([],) if args.graphs_only else ([], ["-graphs=false"]):
            res = subprocess.run(cmd + extra, capture_output=True, text=True)
            sys.stderr.write(res.stderr)
            if res.returncode != 0:
                print(f"gpubench failed on {name}: {res.returncode}", flush=True)
                continue
            for line in res.stdout.splitlines():
                r = json.loads(line)
                add(r["model"], r["workload"], r["impl"], r["metric"], r["value"])
        # The floor: the bytes a step must read (weights once, the KV cache of the
        # sequences' mean length), over the measured bandwidth.
        cfg = MODELS[name]
        for w in WORKLOADS[name]:
            kind, b, i, o = parse(w)
            step = step_bytes(name, b * (i + o // 2)) / bw
            if kind.startswith("beam"):
                continue  # no floor: the beams' KV sharing makes it a different sum
            if kind == "decode":
                add(name, w, "floor", "ms_per_token", step * 1e3)
            elif kind == "lat":
                add(name, w, "floor", "latency_ms", step * o * 1e3)
            else:
                add(name, w, "floor", "tokens_per_s", b / step)
        print(f"[{time.time() - t_start:.0f}s] {name}: gpubench done", flush=True)
        hf_workloads = [w for w in WORKLOADS[name] if not args.hf_workloads or w in args.hf_workloads.split(",")]
        if args.skip_hf or not hf_workloads:
            continue
        try:
            model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch_dtype(name))
        except TypeError:
            model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch_dtype(name))
        model = model.cuda().eval()
        with torch.no_grad():
            for w in hf_workloads:
                kind, b, i, o = parse(w)
                for impl, static in (("hf-eager", False), ("hf-static", True)):
                    if static and (args.skip_static or w not in STATIC):
                        continue
                    if not static and args.skip_eager:
                        continue
                    try:
                        beams = int(kind[4:]) if kind.startswith("beam") else 1
                        full, first = hf_run(model, b, i, o, static, cfg.vocab_size, beams, reps=args.reps or 3,
                                             first_too=kind == "decode")
                    except Exception as e:  # a peer failing must not lose the other figures
                        print(f"{impl} {name} {w}: {type(e).__name__}: {e}", flush=True)
                        continue
                    metric, value = figure(kind, b, o, full, first)
                    add(name, w, impl, metric, value)
        print(f"[{time.time() - t_start:.0f}s] {name}: transformers done", flush=True)
        del model
        torch.cuda.empty_cache()

    short = re.sub(r"[^a-z0-9]+", "-", gpu.lower().replace("nvidia", "")).strip("-").split("-")[0]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{date}-gpu-{short}.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for p in filter(None, [path, args.out]):
        with open(p, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    impls = []
    for r in results:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    print()
    print("| model | workload | metric | " + " | ".join(impls) + " |")
    print("|---|---|---|" + "---|" * len(impls))
    keys = []
    for r in results:
        k = (r["model"], r["workload"], r["metric"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        vals = {r["impl"]: r["value"] for r in results if (r["model"], r["workload"], r["metric"]) == k}
        print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(f"{vals[i]:.4g}" if i in vals else "" for i in impls) + " |")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

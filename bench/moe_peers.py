"""Mixture-of-experts benchmark: gollm's engine on full-size random-weight MoE shapes beside
its bandwidth floor and Hugging Face transformers, in one device call.

Run on the GPU machine (torch and transformers there), after building libgollm_cuda.so and
bench/gpubench (tests/gpu/README.md's carry):

    python3 bench/moe_peers.py --gpubench .carry/gpubench --lib $PWD/.carry/libgollm_cuda.so

Models (--models): qwen3-30b-a3b (Qwen3-30B-A3B's config: 48 layers, 128 experts of 768
units, top 8; 61 GB in bfloat16, one H200) and mixtral-8x7b (93 GB: -tp 2 on two GPUs).
Neither is written to disk: gpubench gives the config random weights in memory
(-random-gb), and transformers makes its own random model on the GPU — the same shapes,
other values.

Workloads: decode_b1_i128_o128 (ms per token after the first) and tput_b64_i128_o128
(generated tokens per second, the prompts included). Rows, in BENCH.md's format, go to
bench/results/<date>-moe-<gpu>.jsonl and --out:
- gollm-engine (bf16), from gpubench;
- floor: the bytes a decode step must read — every weight but the experts once (the
  embedding only by its looked-up rows), the experts a step routes to (batch B: E·(1 −
  (1 − k/E)^B) of E a layer, uniform routing), the KV cache at the sequences' mean length —
  over the measured copy bandwidth;
- hf-static: transformers' generate with cache_implementation="static", in a child process
  that gets --hf-seconds (the rest of the call's time; a workload that does not finish in
  it gives no row, and the table says how long it had).
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_peers  # noqa: E402  (copy_bandwidth, parse)

WORKLOADS = ["decode_b1_i128_o128", "tput_b64_i128_o128"]

# The published configs' fields (transformers 4 names), random weights on top.
CONFIGS = {
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
        "bos_token_id": 151643, "eos_token_id": 151645, "decoder_sparse_step": 1, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
        "max_window_layers": 48, "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False,
        "vocab_size": 151936},
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "num_local_experts": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000},
}


def moe_dims(cfg):
    """(experts, top_k, expert units, shared units, dense layers, sparse layers)."""
    L = cfg["num_hidden_layers"]
    E = cfg.get("num_experts") or cfg.get("num_local_experts")
    mi = cfg.get("moe_intermediate_size", cfg["intermediate_size"])
    step = cfg.get("decoder_sparse_step", 1)
    dense = set(cfg.get("mlp_only_layers", []))
    sparse = sum(1 for l in range(L) if l not in dense and (l + 1) % step == 0)
    return E, cfg["num_experts_per_tok"], mi, cfg.get("shared_expert_intermediate_size", 0), L - sparse, sparse


def step_bytes(cfg, batch, ctx):
    """Bytes (bf16) a decode step of batch rows at ctx positions in all reads at least."""
    H, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // heads
    E, k, mi, si, dense, sparse = moe_dims(cfg)
    attn = H * (heads + 2 * kv) * hd + heads * hd * H + 2 * H
    routed = E * (1 - (1 - k / E) ** batch)
    moe = E * H + routed * 3 * mi * H + (3 * si * H + H if si else 0)
    params = L * attn + sparse * moe + dense * 3 * cfg["intermediate_size"] * H + V * H + H
    kv_bytes = 2 * L * 2 * kv * hd * ctx
    return 2 * params + kv_bytes


def weight_gb(cfg):
    """The model's bf16 weights in GB."""
    H, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // heads
    E, k, mi, si, dense, sparse = moe_dims(cfg)
    attn = H * (heads + 2 * kv) * hd + heads * hd * H
    moe = E * H + E * 3 * mi * H + (3 * si * H + H if si else 0)
    embed = V * H * (1 if cfg.get("tie_word_embeddings") else 2)
    return 2 * (L * attn + sparse * moe + dense * 3 * cfg["intermediate_size"] * H + embed) / 1e9


def hf_child(cfg_dir, workloads, reps):
    """transformers on a random model of cfg_dir's config, one JSON line a workload."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = AutoConfig.from_pretrained(cfg_dir)
    t0 = time.perf_counter()
    torch.manual_seed(1)
    with torch.device("cuda"):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.eval()
    print(json.dumps({"note": f"transformers' random model ready in {time.perf_counter() - t0:.0f} s"}), flush=True)
    with torch.no_grad():
        for w in workloads:
            kind, b, i, o = gpu_peers.parse(w)
            ids = torch.randint(0, cfg.vocab_size, (b, i), device="cuda")
            kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None, attention_mask=torch.ones_like(ids),
                      cache_implementation="static")

            def gen(n):
                torch.cuda.synchronize()
                t = time.perf_counter()
                out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
                torch.cuda.synchronize()
                assert out.shape[1] == i + n, out.shape
                return time.perf_counter() - t

            t = time.perf_counter()
            gen(o)  # warm-up and compilation
            print(json.dumps({"note": f"hf-static {w}: warm-up {time.perf_counter() - t:.0f} s"}), flush=True)
            full = sorted(gen(o) for _ in range(reps))[reps // 2]
            first = sorted(gen(1) for _ in range(reps))[reps // 2] if kind == "decode" else 0.0
            metric, value = gpu_peers.figure(kind, b, o, full, first)
            print(json.dumps({"workload": w, "metric": metric, "value": value}), flush=True)


def write_config(root, name):
    """root/name/config.json for a shape this file (CONFIGS) or gpu_peers (MODELS) knows, for
    gpubench's -random-gb; returns root/name."""
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "config.json")
    if name in CONFIGS:
        with open(path, "w") as f:
            json.dump(CONFIGS[name], f)
    else:
        gpu_peers.MODELS[name].to_json_file(path)
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpubench", default="")
    ap.add_argument("--lib", default="")
    ap.add_argument("--work", default="/tmp/gollm-moe-bench")
    ap.add_argument("--out", default="")
    ap.add_argument("--models", default="qwen3-30b-a3b", help="comma-separated: " + ",".join(CONFIGS))
    ap.add_argument("--tp", type=int, default=1, help="gollm's tensor_parallel_size (transformers: one GPU)")
    ap.add_argument("--budget", type=float, default=520, help="seconds for the whole run")
    ap.add_argument("--reps", type=int, default=3, help="gpubench's timed repetitions")
    ap.add_argument("--hf-reps", type=int, default=1, help="transformers' timed repetitions (after a warm-up)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--hf-child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--write-configs", default="", metavar="DIR",
                    help="only write DIR/<model>/config.json for each of --models (any shape here or in gpu_peers)")
    args = ap.parse_args()
    if args.write_configs:
        for name in args.models.split(","):
            write_config(args.write_configs, name)
        return
    if args.hf_child:
        hf_child(args.hf_child, WORKLOADS, args.hf_reps)
        return
    start = time.time()
    os.makedirs(args.work, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    commit = os.environ.get("GOLLM_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        except OSError:
            commit = ""
    base = {"date": date, "commit": commit, "machine": gpu}
    results, notes = [], []

    def add(model, workload, impl, metric, value, **extra):
        r = dict(base, model=model, dtype="bf16", workload=workload, impl=impl, metric=metric, value=round(value, 4), **extra)
        results.append(r)
        print(json.dumps(r), flush=True)

    bw = gpu_peers.copy_bandwidth()
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    for name in args.models.split(","):
        cfg = CONFIGS[name]
        label = name
        cfg_dir = write_config(args.work, name)
        gb = weight_gb(cfg)
        print(f"{name}: {gb:.1f} GB of bf16 weights", flush=True)
        if args.gpubench:
            cmd = [args.gpubench, "-ckpt", cfg_dir, "-model", label, "-dtype", "bfloat16", "-reps", str(args.reps),
                   "-random-gb", str(math.ceil(gb * 1.05)), "-workloads", ",".join(WORKLOADS), "-tp", str(args.tp)]
            if args.lib:
                cmd += ["-lib", args.lib]
            left = args.budget - (time.time() - start)
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=max(60, left))
            sys.stderr.write(res.stderr)
            if res.returncode != 0:
                notes.append(f"{label}: gpubench failed ({res.returncode})")
            for line in res.stdout.splitlines():
                r = json.loads(line)
                extra = {"tp": r["tp"]} if "tp" in r else {}
                add(label, r["workload"], r["impl"], r["metric"], r["value"], **extra)
        for w in WORKLOADS:
            kind, b, i, o = gpu_peers.parse(w)
            step = step_bytes(cfg, b, b * (i + o // 2)) / bw
            if kind == "decode":
                add(label, w, "floor", "ms_per_token", step * 1e3)
            else:
                add(label, w, "floor", "tokens_per_s", b / step)
        if args.skip_hf:
            continue
        free = torch.cuda.mem_get_info()[0] / 1e9
        if free < gb * 1.15:
            notes.append(f"{label}: transformers skipped: {gb:.0f} GB of weights, {free:.0f} GB free on one GPU")
            continue
        left = args.budget - (time.time() - start)
        if left < 60:
            notes.append(f"{label}: transformers skipped: {left:.0f} s left of the budget")
            continue
        child = [sys.executable, os.path.abspath(__file__), "--hf-child", cfg_dir, "--hf-reps", str(args.hf_reps)]
        t = time.time()
        try:
            res = subprocess.run(child, capture_output=True, text=True, timeout=left)
            out, err = res.stdout, res.stderr
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            notes.append(f"{label}: transformers stopped after {left:.0f} s; workloads not reported did not finish")
        sys.stderr.write(err[-4000:])
        for line in out.splitlines():
            r = json.loads(line)
            if "note" in r:
                notes.append(f"{label}: {r['note']}")
            else:
                add(label, r["workload"], "hf-static", r["metric"], r["value"])
        print(f"transformers took {time.time() - t:.0f} s", flush=True)

    short = gpu.lower().replace("nvidia", "").strip().split(" ")[0]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{date}-moe-{short}.jsonl")
    for p in filter(None, [path, args.out]):
        with open(p, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    impls = []
    for r in results:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    print()
    # The last two columns compare times: gollm's over the floor's (the b1 target: at most
    # 1.5) and transformers' over gollm's (the b64 target: at least 3).
    print("| model | workload | metric | " + " | ".join(impls) + " | gollm time / floor's | hf-static time / gollm's |")
    print("|---|---|---|" + "---|" * (len(impls) + 2))
    keys = []
    for r in results:
        k = (r["model"], r["workload"], r["metric"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        vals = {r["impl"]: r["value"] for r in results if (r["model"], r["workload"], r["metric"]) == k}
        g = next((v for i, v in vals.items() if i.startswith("gollm-engine")), None)

        def time_ratio(slow, fast):
            if slow is None or fast is None or not slow or not fast:
                return ""
            # ms per token grows with time; tokens per second shrinks with it.
            return f"{(slow / fast if k[2] == 'ms_per_token' else fast / slow):.2f}×"

        print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(f"{vals[i]:.4g}" if i in vals else "" for i in impls) +
              f" | {time_ratio(g, vals.get('floor'))} | {time_ratio(vals.get('hf-static'), g)} |")
    for n in notes:
        print("note:", n)
    print(f"wrote {path}; {time.time() - start:.0f} s in all")


if __name__ == "__main__":
    main()

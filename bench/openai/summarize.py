#!/usr/bin/env python3
"""Turns bench/openai/run.sh's aiperf exports and abload lines into BENCH.md's JSON lines
(stdout) and a table (stderr): per implementation and concurrency, the median over
rounds of aiperf's per-run TTFT (p50 and p99), ITL (p50 and p99) and output throughput,
then the OpenAI frontend's overhead against Triton directly; then abload's A/B figures
(Triton over gRPC against gollm-openai) with each server's CPU time per token.

usage: summarize.py ARTIFACT_DIR COMMIT ISL OSL
"""
import datetime
import json
import pathlib
import re
import statistics
import sys


def machine():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip() + f" ({sum(1 for l in open('/proc/cpuinfo') if l.startswith('processor'))} cores)"
    return "unknown"


def main():
    art, commit, isl, osl = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    runs = {}  # (impl, c) -> list of metrics dicts
    for d in sorted(art.iterdir()):
        m = re.fullmatch(r"(gollm-\w+)-c(\d+)-r(\d+)", d.name)
        if not m or not d.is_dir():
            continue
        exp = json.loads((d / "profile_export_aiperf.json").read_text())
        runs.setdefault((m.group(1), int(m.group(2))), []).append({
            "ttft_ms": exp["time_to_first_token"]["p50"],
            "ttft_ms_p99": exp["time_to_first_token"]["p99"],
            "itl_ms": exp["inter_token_latency"]["p50"],
            "itl_ms_p99": exp["inter_token_latency"]["p99"],
            "tokens_per_s": exp["output_token_throughput"]["avg"],
        })
    base = {"date": datetime.date.today().isoformat(), "commit": commit, "machine": machine(),
            "model": "gpt2-demo-16M", "dtype": "fp32"}
    med = {}
    for (impl, c), rs in sorted(runs.items()):
        for metric in rs[0]:
            v = statistics.median(r[metric] for r in rs)
            med[(impl, c, metric)] = v
            print(json.dumps({**base, "workload": f"aiperf_c{c}_i{isl}_o{osl}", "impl": impl,
                              "metric": metric, "value": round(v, 3), "rounds": len(rs)}))
    print(f"{'c':>3} {'impl':<13} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'tok/s':>8}", file=sys.stderr)
    for (impl, c), rs in sorted(runs.items()):
        g = lambda k: med[(impl, c, k)]
        print(f"{c:>3} {impl:<13} {g('ttft_ms'):>9.2f} {g('ttft_ms_p99'):>9.2f} {g('itl_ms'):>8.2f} {g('itl_ms_p99'):>8.2f} {g('tokens_per_s'):>8.1f}", file=sys.stderr)
    for c in sorted({c for (_, c) in runs}):
        if ("gollm-triton", c, "ttft_ms") not in med or ("gollm-openai", c, "ttft_ms") not in med:
            continue
        added = med[("gollm-openai", c, "ttft_ms")] - med[("gollm-triton", c, "ttft_ms")]
        t0, t1 = med[("gollm-triton", c, "tokens_per_s")], med[("gollm-openai", c, "tokens_per_s")]
        loss = 100 * (t0 - t1) / t0
        for metric, v in (("ttft_ms_added", added), ("tokens_per_s_loss_pct", loss)):
            print(json.dumps({**base, "workload": f"aiperf_c{c}_i{isl}_o{osl}", "impl": "gollm-openai-overhead",
                              "metric": metric, "value": round(v, 3)}))
        print(f"c={c}: the OpenAI frontend adds {added:+.2f} ms to the median TTFT and costs {loss:+.1f}% of throughput", file=sys.stderr)
    ab = art / "abload.jsonl"
    if not ab.exists():
        return
    for line in ab.read_text().splitlines():
        d = json.loads(line)
        wl = f"abload_c{d['concurrency']}_w{d['prompt_words']}_o{d['max_tokens']}"
        rows = [("gollm-triton-grpc", k, d[f"triton-grpc.{k}"]) for k in ("ttft_ms", "ttft_ms_p99", "itl_ms", "itl_ms_p99", "tokens_per_s")]
        rows += [("gollm-openai", k, d[f"openai.{k}"]) for k in ("ttft_ms", "ttft_ms_p99", "itl_ms", "itl_ms_p99", "tokens_per_s")]
        rows += [("gollm-openai-overhead", k, d[k]) for k in ("ttft_ms_added", "itl_ms_added", "tokens_per_s_loss_pct")]
        # CPU time per token generated: the frontend's own, and tritonserver's on each path.
        if "openai.openai_cpu_us_per_token" in d:
            rows.append(("gollm-openai", "frontend_cpu_us_per_token", d["openai.openai_cpu_us_per_token"]))
        for path, impl in (("triton-grpc", "gollm-triton-grpc"), ("openai", "gollm-openai")):
            if f"{path}.triton_cpu_us_per_token" in d:
                rows.append((impl, "tritonserver_cpu_us_per_token", d[f"{path}.triton_cpu_us_per_token"]))
        for impl, metric, v in rows:
            print(json.dumps({**base, "workload": wl, "impl": impl, "metric": metric, "value": round(v, 3), "rounds": d["rounds"]}))
        print(f"abload c={d['concurrency']} ({d['rounds']} rounds of {d['requests']}): TTFT p50 {d['triton-grpc.ttft_ms']:.2f} -> {d['openai.ttft_ms']:.2f} ms "
              f"({d['ttft_ms_added']:+.2f}), ITL p50 {d['triton-grpc.itl_ms']:.2f} -> {d['openai.itl_ms']:.2f} ms, "
              f"{d['triton-grpc.tokens_per_s']:.0f} -> {d['openai.tokens_per_s']:.0f} tok/s ({d['tokens_per_s_loss_pct']:+.1f}% lost); "
              f"CPU per token: gollm-openai {d.get('openai.openai_cpu_us_per_token', float('nan')):.0f} us, "
              f"tritonserver {d.get('triton-grpc.triton_cpu_us_per_token', float('nan')):.0f} us direct, "
              f"{d.get('openai.triton_cpu_us_per_token', float('nan')):.0f} us behind gollm-openai", file=sys.stderr)


if __name__ == "__main__":
    main()

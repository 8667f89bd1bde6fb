"""Plot a bench/concurrency.sh run: tokens/s against concurrency (gollm through
tritonserver, perf_analyzer) and batch size (transformers), and gollm's p50/p99 request
latency, as an SVG beside the results file. Standard library only.

    python3 bench/plot_concurrency.py bench/results/2026-11-24-concurrency-h100.jsonl
"""
import json
import math
import os
import re
import sys

import svgplot

W, H, L, R, T, B = 860, 330, 80, 250, 40, 50  # size and margins of one panel


def load(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    series = {}
    for r in rows:
        m = re.match(r"(?:perf_analyzer_c|tput_b)(\d+)", r["workload"])
        if not m:
            continue
        key = (r["impl"], r["metric"])
        series.setdefault(key, []).append((int(m.group(1)), r["value"]))
    for v in series.values():
        v.sort()
    return rows, series


def panel(out, y0, title, ylabel, lines, ymin, ymax):
    x = lambda c: math.log2(c) / 6
    svgplot.panel(out, (W, H, L, R, T, B), y0, title, ylabel, "concurrency (gollm) / batch size (transformers)",
                  [(x(c), c) for c in (1, 2, 4, 8, 16, 32, 64)],
                  [(label, color, dash, [(x(c), v) for c, v in pts]) for label, color, dash, pts in lines],
                  ymin, ymax, legend_gap=18)


def main():
    path = sys.argv[1]
    rows, s = load(path)
    head = rows[0]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{2 * H + 60}" viewBox="0 0 {W} {2 * H + 60}">',
           '<rect width="100%" height="100%" fill="#fff"/>']
    tput = [("gollm, tritonserver (perf_analyzer)", "#c0392b", "", s.get(("gollm-triton", "tokens_per_s"), [])),
            ("transformers static", "#2980b9", "6,3", s.get(("hf-static", "tokens_per_s"), [])),
            ("transformers eager", "#7f8c8d", "2,3", s.get(("hf-eager", "tokens_per_s"), []))]
    vals = [v for *_, pts in tput for _, v in pts]
    panel(out, 0, f"{head['model']} {head['dtype']}, 128-token prompts, 128 new tokens — {head['machine']}, {head['commit']}",
          "generated tokens/s", tput, 10 ** math.floor(math.log10(min(vals))), 10 ** math.ceil(math.log10(max(vals))))
    lat = [("gollm p50", "#c0392b", "", s.get(("gollm-triton", "latency_ms"), [])),
           ("gollm p99", "#c0392b", "6,3", s.get(("gollm-triton", "latency_ms_p99"), []))]
    vals = [v for *_, pts in lat for _, v in pts]
    if vals:
        panel(out, H + 30, "gollm through tritonserver: whole-request latency (128 tokens)", "ms", lat,
              10 ** math.floor(math.log10(min(vals))), 10 ** math.ceil(math.log10(max(vals))))
    # Little's law on perf_analyzer's own figures: requests in flight = requests/s × latency.
    # Well under C means the client did not keep C requests in flight.
    rate = dict(s.get(("gollm-triton", "tokens_per_s"), []))
    p50 = dict(s.get(("gollm-triton", "latency_ms"), []))
    out_tokens = int(re.search(r"_o(\d+)", next(r["workload"] for r in rows if r["workload"].startswith("tput_")) or "_o128").group(1))
    held = [f"{c}→{rate[c] / out_tokens * p50[c] / 1e3:.1f}" for c in sorted(rate) if c in p50]
    if held:
        out.append(f'<text x="{L}" y="{2 * H + 38}" font-family="sans-serif" font-size="11">Requests perf_analyzer kept in flight (its requests/s × its p50 latency): '
                   + ", ".join(held) + ".</text>")
        short = min(rate[c] / out_tokens * p50[c] / 1e3 / c for c in rate if c in p50) < 0.7
        verdict = ("Far under C: its throughput line is the client\'s pace, not the server\'s capacity." if short else
                   "Close to C at every point: the throughput line is the server\'s at that load.")
        out.append(f'<text x="{L}" y="{2 * H + 54}" font-family="sans-serif" font-size="11">{verdict}</text>')
    out.append("</svg>")
    svg = os.path.splitext(path)[0] + ".svg"
    open(svg, "w").write("\n".join(out) + "\n")
    print(svg)


if __name__ == "__main__":
    main()

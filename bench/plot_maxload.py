"""Plot a bench/maxload.sh run: for each model shape, output tokens/s, time to the first
token (p50) and inter-token latency (p50) against concurrency (1, 8, 64, 256 and max load,
every request offered at once), a line for each input/output length and impl (the engine
alone solid, through tritonserver dashed), as an SVG beside the results file. Standard
library only.

    python3 bench/plot_maxload.py bench/results/2026-11-27-maxload-h100.jsonl
"""
import json
import os
import re
import sys

import svgplot

W, H, L, R, T, B = 760, 300, 80, 230, 40, 50  # size and margins of one panel
XS = ["1", "8", "64", "256", "max"]
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def load(path):
    """{model: {(io, impl): {metric: [(x index, value)]}}} of the load rows."""
    out = {}
    for line in open(path):
        if not line.strip():
            continue
        r = json.loads(line)
        m = re.match(r"(?:maxload|load_c(\d+))_i(\d+)_o(\d+)$", r["workload"])
        if not m:
            continue
        x = "max" if m.group(1) is None else m.group(1)
        if x not in XS:
            continue
        io = f"i{m.group(2)}/o{m.group(3)}"
        series = out.setdefault(r["model"], {}).setdefault((io, r["impl"]), {})
        series.setdefault(r["metric"], []).append((XS.index(x), r["value"]))
    return out


def panel(out, y0, title, ylabel, lines):
    vals = [v for _, _, _, pts in lines for _, v in pts if v > 0]
    if not vals:
        return
    svgplot.panel(out, (W, H, L, R, T, B), y0, title, ylabel, "concurrency (max: every request offered at once)",
                  [(i / (len(XS) - 1), x) for i, x in enumerate(XS)],
                  [(label, color, dash, [(i / (len(XS) - 1), v) for i, v in pts]) for label, color, dash, pts in lines],
                  min(vals) / 1.5, max(vals) * 1.5)


def main(path):
    data = load(path)
    out = []
    y = 0
    for model in sorted(data):
        series = data[model]
        ios = sorted({io for io, _ in series})
        def lines(metric):
            res = []
            for (io, impl), ms in sorted(series.items()):
                color = COLORS[ios.index(io) % len(COLORS)]
                dash = "5,3" if "triton" in impl else ""
                res.append((f"{io} {impl.replace('gollm-', '')}", color, dash, ms.get(metric, [])))
            return res
        panel(out, y, f"{model}: output tokens/s", "tokens/s", lines("tokens_per_s"))
        panel(out, y + H, f"{model}: time to the first token, p50", "ms", lines("ttft_ms"))
        panel(out, y + 2 * H, f"{model}: inter-token latency, p50", "ms", lines("itl_ms"))
        y += 3 * H
    svg = os.path.splitext(path)[0] + ".svg"
    with open(svg, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{max(y, H)}" viewBox="0 0 {W} {max(y, H)}">\n')
        f.write('<rect width="100%" height="100%" fill="white"/>\n')
        f.write("\n".join(out))
        f.write("\n</svg>\n")
    print(svg)


if __name__ == "__main__":
    main(sys.argv[1])

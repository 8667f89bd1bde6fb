"""Plot a bench/maxload.sh run: for each model shape, output tokens/s, time to the first
token (p50) and inter-token latency (p50) against concurrency (1, 8, 64, 256 and max load,
every request offered at once), a line for each input/output length and impl (the engine
alone solid, through tritonserver dashed), as an SVG beside the results file. Standard
library only.

    python3 bench/plot_maxload.py bench/results/2026-11-27-maxload-h100.jsonl
"""
import json
import math
import os
import re
import sys

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
    ymin, ymax = min(vals) / 1.5, max(vals) * 1.5
    px = lambda i: L + i / (len(XS) - 1) * (W - L - R)
    py = lambda v: y0 + T + (1 - (math.log10(v) - math.log10(ymin)) / (math.log10(ymax) - math.log10(ymin))) * (H - T - B)
    out.append(f'<text x="{L}" y="{y0 + 22}" font-family="sans-serif" font-size="13">{title}</text>')
    out.append(f'<rect x="{L}" y="{y0 + T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#999"/>')
    for i, x in enumerate(XS):
        out.append(f'<line x1="{px(i):.1f}" y1="{y0 + T}" x2="{px(i):.1f}" y2="{y0 + H - B}" stroke="#eee"/>')
        out.append(f'<text x="{px(i):.1f}" y="{y0 + H - B + 16}" font-family="sans-serif" font-size="11" text-anchor="middle">{x}</text>')
    e = math.floor(math.log10(ymin))
    while 10 ** e <= ymax:
        for k in (1, 2, 5):
            v = k * 10 ** e
            if ymin <= v <= ymax:
                out.append(f'<line x1="{L}" y1="{py(v):.1f}" x2="{W - R}" y2="{py(v):.1f}" stroke="#eee"/>')
                out.append(f'<text x="{L - 6}" y="{py(v) + 4:.1f}" font-family="sans-serif" font-size="11" text-anchor="end">{v:g}</text>')
        e += 1
    out.append(f'<text x="{(L + W - R) / 2}" y="{y0 + H - 12}" font-family="sans-serif" font-size="11" text-anchor="middle">concurrency (max: every request offered at once)</text>')
    out.append(f'<text x="16" y="{y0 + H / 2}" font-family="sans-serif" font-size="11" transform="rotate(-90 16 {y0 + H / 2})" text-anchor="middle">{ylabel}</text>')
    for n, (label, color, dash, pts) in enumerate(lines):
        pts = sorted(p for p in pts if p[1] > 0)
        if not pts:
            continue
        d = " ".join(f"{px(i):.1f},{py(v):.1f}" for i, v in pts)
        out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        for i, v in pts:
            out.append(f'<circle cx="{px(i):.1f}" cy="{py(v):.1f}" r="3" fill="{color}"/>')
        ly = y0 + T + 14 + 16 * n
        out.append(f'<line x1="{W - R + 12}" y1="{ly - 4}" x2="{W - R + 34}" y2="{ly - 4}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        out.append(f'<text x="{W - R + 40}" y="{ly}" font-family="sans-serif" font-size="11">{label}</text>')


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

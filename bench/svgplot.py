"""The panels of bench/plot_*.py's SVG figures: a titled box with grid lines, ticks, axis
labels, one polyline per series and a legend at its right. Standard library only."""
import math


def panel(out, box, y0, title, ylabel, xlabel, xticks, lines, ymin, ymax, log=True, legend_gap=16, yticks=None):
    """Appends a panel's SVG elements to out.

    box: (W, H, L, R, T, B), the panel's size and margins; y0 its top.
    xticks: [(x, label)], x in [0, 1] across the plotting area.
    lines: [(label, color, dash, [(x, y)])], x as in xticks; a series with no points keeps
      its legend slot empty; on a log axis points at or below zero are left out.
    ymin, ymax: the y axis' range; log: logarithmic (ticks 1, 2, 5 a decade), else linear
      with yticks (values) for its grid.
    """
    W, H, L, R, T, B = box
    px = lambda x: L + x * (W - L - R)
    if log:
        lo, hi = math.log10(ymin), math.log10(ymax)
        py = lambda v: y0 + T + (1 - (math.log10(v) - lo) / (hi - lo)) * (H - T - B)
    else:
        py = lambda v: y0 + T + (1 - (v - ymin) / (ymax - ymin)) * (H - T - B)
    out.append(f'<text x="{L}" y="{y0 + 22}" font-family="sans-serif" font-size="13">{title}</text>')
    out.append(f'<rect x="{L}" y="{y0 + T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#999"/>')
    for x, label in xticks:
        out.append(f'<line x1="{px(x):.1f}" y1="{y0 + T}" x2="{px(x):.1f}" y2="{y0 + H - B}" stroke="#eee"/>')
        out.append(f'<text x="{px(x):.1f}" y="{y0 + H - B + 16}" font-family="sans-serif" font-size="11" text-anchor="middle">{label}</text>')
    for v in log_ticks(ymin, ymax) if log else yticks or []:
        out.append(f'<line x1="{L}" y1="{py(v):.1f}" x2="{W - R}" y2="{py(v):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{L - 6}" y="{py(v) + 4:.1f}" font-family="sans-serif" font-size="11" text-anchor="end">{v:g}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{y0 + H - 12}" font-family="sans-serif" font-size="11" text-anchor="middle">{xlabel}</text>')
    out.append(f'<text x="16" y="{y0 + H / 2}" font-family="sans-serif" font-size="11" transform="rotate(-90 16 {y0 + H / 2})" text-anchor="middle">{ylabel}</text>')
    for n, (label, color, dash, pts) in enumerate(lines):
        pts = sorted(p for p in pts if p[1] > 0 or not log)
        if not pts:
            continue
        d = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in pts)
        out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        for x, v in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(v):.1f}" r="3" fill="{color}"/>')
        ly = y0 + T + 14 + legend_gap * n
        out.append(f'<line x1="{W - R + 12}" y1="{ly - 4}" x2="{W - R + 34}" y2="{ly - 4}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        out.append(f'<text x="{W - R + 40}" y="{ly}" font-family="sans-serif" font-size="11">{label}</text>')


def log_ticks(ymin, ymax):
    """1, 2 and 5 times each power of ten within [ymin, ymax]."""
    e = math.floor(math.log10(ymin))
    while 10 ** e <= ymax:
        for k in (1, 2, 5):
            v = k * 10 ** e
            if ymin <= v <= ymax:
                yield v
        e += 1

package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// curve is one line of a panel.
type curve struct {
	// name is its legend.
	name string
	// color is its SVG stroke.
	color string
	// y gives its value at a sample (NaN: no point).
	y func(i int, s sample) float64
}

// panel is one chart of the plot, sharing the time axis with the others.
type panel struct {
	// title names the quantity and its unit.
	title string
	// curves are its lines.
	curves []curve
}

// Plot geometry, in SVG user units.
const (
	plotW, panelH       = 900.0, 200.0
	marginL, marginR    = 70.0, 20.0
	marginT, panelGap   = 55.0, 45.0
	legendW, axisTicks  = 150.0, 4
	innerW              = plotW - marginL - marginR - legendW
	innerH              = panelH - 30
	fontAttr            = `font-family="sans-serif" font-size="11"`
	loadEndDash         = `stroke="#888" stroke-dasharray="4 3"`
	plotBackgroundColor = "#fff"
)

// plot draws the samples as an SVG: memory, GPU memory (with a GPU), the model's
// gauges, and the throughput and failures, over time; a dashed line marks the load's end.
func plot(r report, samples []sample) string {
	rate := func(i int, s sample) float64 {
		if i == 0 || !s.loaded {
			return math.NaN()
		}
		p := samples[i-1]
		return float64(s.tokens-p.tokens) / (s.t - p.t)
	}
	panels := []panel{
		{"memory (MiB)", []curve{
			{"tritonserver RSS", "#1f77b4", func(_ int, s sample) float64 { return s.rss / (1 << 20) }},
			{"Go runtime", "#2ca02c", func(_ int, s sample) float64 { return s.goMem / (1 << 20) }},
			{"Go heap", "#ff7f0e", func(_ int, s sample) float64 { return s.goHeap / (1 << 20) }},
			{"Go heap, live", "#d62728", func(_ int, s sample) float64 { return s.goLive / (1 << 20) }},
		}},
	}
	if !math.IsNaN(r.gpuStart) {
		panels = append(panels, panel{"GPU memory used (GB)", []curve{
			{"GPU memory", "#9467bd", func(_ int, s sample) float64 { return s.gpuMem / 1e9 }},
		}})
	}
	panels = append(panels,
		panel{"requests (" + r.cfg.model + ")", []curve{
			{"active", "#1f77b4", func(_ int, s sample) float64 { return s.active }},
			{"queued", "#d62728", func(_ int, s sample) float64 { return s.queued }},
		}},
		panel{"KV blocks", []curve{
			{"used", "#8c564b", func(_ int, s sample) float64 { return s.kvUsed }},
			{"free", "#7f7f7f", func(_ int, s sample) float64 { return s.kvFree }},
		}},
		panel{"throughput and failures", []curve{
			{"tokens/s", "#17becf", rate},
			{"failed requests", "#d62728", func(_ int, s sample) float64 { return float64(s.failed) }},
		}},
	)
	tMax := 1.0
	for _, s := range samples {
		tMax = math.Max(tMax, s.t)
	}
	h := marginT + float64(len(panels))*(panelH+panelGap)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f">`+"\n", plotW, h, plotW, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="%s"/>`+"\n", plotBackgroundColor)
	title := fmt.Sprintf("soak: %s, %d in flight, %s, %s — %s, %s; %d requests, %d failed",
		r.cfg.label, r.cfg.concurrency, streamWord(r.cfg.streaming), r.cfg.duration, r.machine, r.cfg.commit, r.done, r.failed)
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-family="sans-serif" font-size="13">%s</text>`+"\n", marginL, html.EscapeString(title))
	for k, p := range panels {
		top := marginT + float64(k)*(panelH+panelGap)
		drawPanel(&b, p, samples, top, tMax, r.loadS)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// drawPanel draws one panel whose top edge is at top.
func drawPanel(b *strings.Builder, p panel, samples []sample, top, tMax, loadEnd float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range p.curves {
		for i, s := range samples {
			if v := c.y(i, s); !math.IsNaN(v) && !math.IsInf(v, 0) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0, 1
	}
	// Start at 0 unless the values sit far above it, so that flat lines look flat.
	if lo > 0 && lo < hi/2 {
		lo = 0
	}
	if lo >= 0 && hi <= 0 || hi == lo {
		hi = lo + math.Max(1, math.Abs(lo)*0.1)
	}
	pad := (hi - lo) * 0.08
	lo, hi = math.Max(lo-pad, math.Min(lo, 0)), hi+pad
	x := func(t float64) float64 { return marginL + t/tMax*innerW }
	y := func(v float64) float64 { return top + innerH - (v-lo)/(hi-lo)*innerH }
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" %s font-weight="bold">%s</text>`+"\n", marginL, top-6, fontAttr, html.EscapeString(p.title))
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#ccc"/>`+"\n", marginL, top, innerW, innerH)
	for i := 0; i <= axisTicks; i++ {
		v := lo + (hi-lo)*float64(i)/axisTicks
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/>`, marginL, marginL+innerW, y(v), y(v))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" %s text-anchor="end">%s</text>`+"\n", marginL-6, y(v)+4, fontAttr, tick(v))
		t := tMax * float64(i) / axisTicks
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" %s text-anchor="middle">%s min</text>`+"\n", x(t), top+innerH+15, fontAttr, tick(t/60))
	}
	fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" %s/>`+"\n", x(loadEnd), x(loadEnd), top, top+innerH, loadEndDash)
	for k, c := range p.curves {
		var pts []string
		for i, s := range samples {
			v := c.y(i, s)
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.t), y(v)))
		}
		if len(pts) > 0 {
			fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", c.color, strings.Join(pts, " "))
		}
		ly := top + 14 + float64(k)*16
		lx := marginL + innerW + 12
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`, lx, lx+18, ly-4, ly-4, c.color)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" %s>%s</text>`+"\n", lx+24, ly, fontAttr, html.EscapeString(c.name))
	}
}

// tick formats an axis value.
func tick(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

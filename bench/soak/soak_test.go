package main

import (
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

const page = `# HELP gollm_kv_blocks_used KV cache blocks held by requests
# TYPE gollm_kv_blocks_used gauge
gollm_kv_blocks_used{instance="austen_0_0",model="austen",version="1"} 12
gollm_kv_blocks_used{instance="austen_0_1",model="austen",version="1"} 3
gollm_kv_blocks_used{instance="gpt2_0_0",model="gpt2",version="1"} 40
gollm_go_heap_bytes 1.2345e+08
nv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 5e9
gollm_odd{name="a,b=\"c\""} 7
nv_cpu_utilization 0.5
`

func TestParseMetrics(t *testing.T) {
	ss, err := parseMetrics(strings.NewReader(page), "gollm_", "nv_gpu_memory_used_bytes")
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 6 {
		t.Fatalf("kept %d series, want 6 (nv_cpu_utilization left out): %v", len(ss), ss)
	}
	if v, ok := sum(ss, "gollm_kv_blocks_used", map[string]string{"model": "austen"}); !ok || v != 15 {
		t.Errorf("austen's KV blocks used: %v, %v; want 15 summed over its two instances", v, ok)
	}
	if v, ok := sum(ss, "gollm_go_heap_bytes", nil); !ok || v != 1.2345e8 {
		t.Errorf("Go heap: %v, %v", v, ok)
	}
	if _, ok := sum(ss, "gollm_kv_blocks_used", map[string]string{"model": "llama"}); ok {
		t.Error("a model without series was found")
	}
	if v, _ := sum(ss, "gollm_odd", map[string]string{"name": `a,b="c"`}); v != 7 {
		t.Errorf("a label value with a comma and quotes: %v, want 7", v)
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	if p := percentile(xs, 0.5); p != 3 {
		t.Errorf("median %v, want 3", p)
	}
	if p := percentile(xs, 0.99); p != 5 {
		t.Errorf("p99 %v, want 5", p)
	}
	if !math.IsNaN(percentile(nil, 0.5)) {
		t.Error("percentile of nothing is not NaN")
	}
}

func TestSummaryAndPlot(t *testing.T) {
	var samples []sample
	for i := range 11 {
		s := sample{t: float64(i * 60), loaded: i < 10, rss: float64(300+i) * (1 << 20), goHeap: 100 << 20, goLive: 80 << 20,
			goMem: 150 << 20, gpuMem: math.NaN(), active: 16, kvUsed: 40, kvFree: 984, kvMax: 1024,
			done: int64(i * 100), tokens: int64(i * 6000)}
		if i == 10 {
			s.active, s.kvUsed, s.kvFree = 0, 0, 1024
		}
		samples = append(samples, s)
	}
	if !samples[10].isIdle() || samples[5].isIdle() {
		t.Fatal("isIdle: the last sample is idle, a loaded one is not")
	}
	c := config{model: "austen", label: "austen", duration: 10 * time.Minute, concurrency: 16, streaming: true, commit: "abc"}
	var cs counters
	cs.done.Store(1000)
	cs.tokens.Store(60000)
	cs.latencies = []float64{10, 20, 30}
	r := summarize(c, samples, &cs, 600*time.Second, 600*time.Second, true)
	if r.rssStart != 300 || r.rssMax != 310 || r.rssEnd != 310 {
		t.Errorf("RSS start %v max %v end %v, want 300 310 310", r.rssStart, r.rssMax, r.rssEnd)
	}
	// Loaded samples 0..9: the last (309) less the middle one (305).
	if r.rssDrift != 4 {
		t.Errorf("RSS drift over the second half %v, want 4", r.rssDrift)
	}
	if r.tokensPerS != 100 || r.latP50 != 20 {
		t.Errorf("tokens/s %v, latency p50 %v; want 100 and 20", r.tokensPerS, r.latP50)
	}
	if w := c.workload(); w != "soak_c16_stream_10m" {
		t.Errorf("workload %q", w)
	}
	svg := plot(r, samples)
	d := xml.NewDecoder(strings.NewReader(svg))
	polylines := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the plot is not well-formed XML: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if se.Name.Local == "polyline" {
			polylines++
		}
		// Go's decoder accepts a repeated attribute; SVG renderers do not.
		seen := map[string]bool{}
		for _, a := range se.Attr {
			if seen[a.Name.Local] {
				t.Errorf("<%s> repeats the attribute %s", se.Name.Local, a.Name.Local)
			}
			seen[a.Name.Local] = true
		}
	}
	// memory 4, requests 2, KV 2, throughput 2 (no GPU panel).
	if polylines != 10 {
		t.Errorf("%d lines drawn, want 10", polylines)
	}
}

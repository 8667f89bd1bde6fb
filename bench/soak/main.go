// Command soak drives a running tritonserver serving gollm with a steady load for a long
// time and watches its memory: are RSS, the backend's Go heap and the GPU memory flat, do
// all requests succeed, and do gollm's gauges go back to idle when the load stops?
//
//	soak -addr 127.0.0.1:8001 -metrics http://127.0.0.1:8002/metrics -model austen \
//	     -duration 30m -concurrency 16 [-streaming=false] [-pid N]
//
// -concurrency workers each send one text request after another (a prompt from a fixed
// list, max_tokens drawn from [-min-tokens, -max-tokens], a random seed), each request on
// a gRPC stream of its own, read to its final response. Every -interval (default: the
// duration / 120) it samples tritonserver's RSS (/proc; the process serving the gRPC port,
// or -pid), and from /metrics the backend's gollm_go_heap_bytes, gollm_go_heap_live_bytes
// and gollm_go_memory_bytes,
// the model's gollm_requests_*, gollm_kv_blocks_* and gollm_tokens_per_iteration, and GPU
// memory (gollm_gpu_memory_used_bytes, else Triton's nv_gpu_memory_used_bytes) where there
// is a GPU. When the duration is over it lets the requests in flight finish, waits for the
// gauges to show an idle model, and samples once more.
//
// It writes -out (default bench/results/<date>-soak-<cpu|gpu>.jsonl, BENCH.md's format:
// the summary, then one line per sample and quantity with its time "t_s") and a plot
// beside it (.svg). It exits 1 when a request failed or the gauges did not return to idle.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"gollm/tests/harness"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// prompts are the requests' openings: sentences in the demo model's style, of a few to
// a few dozen tokens.
var prompts = []string{
	"It is a truth universally acknowledged",
	"Mr. Darcy walked into the room and",
	"Emma Woodhouse, handsome, clever, and rich,",
	"The family of Dashwood had long been settled in Sussex.",
	"She was not in the habit of",
	"\"My dear Jane,\" said Elizabeth,",
	"Catherine had never been so happy in her life; and yet",
	"Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who",
	"There was no possibility of taking a walk that day.",
	"Anne",
	"The ball at Netherfield was, in every respect, a great success, and the next morning",
	"Fanny Price was at this time just ten years old",
}

// config are the command's settings.
type config struct {
	addr, metricsURL, model     string
	duration, interval, wait    time.Duration
	concurrency                 int
	streaming                   bool
	minTokens, maxTokens        int
	pid                         int
	out, commit, machine, label string
}

func main() {
	var c config
	flag.StringVar(&c.addr, "addr", "127.0.0.1:8001", "tritonserver's gRPC address")
	flag.StringVar(&c.metricsURL, "metrics", "http://127.0.0.1:8002/metrics", "tritonserver's metrics page")
	flag.StringVar(&c.model, "model", "austen", "the model to load")
	flag.DurationVar(&c.duration, "duration", 30*time.Minute, "how long the load lasts")
	flag.DurationVar(&c.interval, "interval", 0, "sampling interval (0: the duration / 120, within 1 s and 60 s)")
	flag.DurationVar(&c.wait, "wait", 2*time.Minute, "how long to wait for the model to be ready")
	flag.IntVar(&c.concurrency, "concurrency", 16, "requests in flight at once")
	flag.BoolVar(&c.streaming, "streaming", true, "ask for a response per token (false: one response per request)")
	flag.IntVar(&c.minTokens, "min-tokens", 16, "fewest tokens a request asks for")
	flag.IntVar(&c.maxTokens, "max-tokens", 128, "most tokens a request asks for")
	flag.IntVar(&c.pid, "pid", 0, "tritonserver's process id (0: the one serving -addr's port)")
	flag.StringVar(&c.out, "out", "", "results file (default bench/results/<date>-soak-<cpu|gpu>.jsonl); the plot goes beside it as .svg")
	flag.StringVar(&c.commit, "commit", "", "the commit served (default: git rev-parse --short HEAD)")
	flag.StringVar(&c.machine, "machine", "", "the machine (default: the GPU's name, else the CPU's)")
	flag.StringVar(&c.label, "name", "", "the model's name in the results (default: -model)")
	flag.Parse()
	if err := c.check(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	ok, err := run(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// check validates the flags and fills the defaults.
func (c *config) check() error {
	switch {
	case flag.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	case c.duration <= 0:
		return fmt.Errorf("-duration %v must be positive", c.duration)
	case c.concurrency < 1:
		return fmt.Errorf("-concurrency %d must be at least 1", c.concurrency)
	case c.minTokens < 1 || c.maxTokens < c.minTokens:
		return fmt.Errorf("-min-tokens %d and -max-tokens %d: want 1 ≤ min ≤ max", c.minTokens, c.maxTokens)
	case c.interval < 0:
		return fmt.Errorf("-interval %v must not be negative", c.interval)
	}
	if c.interval == 0 {
		c.interval = min(max(c.duration/120, time.Second), time.Minute)
	}
	if c.label == "" {
		c.label = c.model
	}
	if c.commit == "" {
		if b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
			c.commit = strings.TrimSpace(string(b))
		} else {
			c.commit = "unknown"
		}
	}
	return nil
}

// sample is one reading of the server.
type sample struct {
	// t is the time since the load started, in seconds.
	t float64
	// loaded says the load was still running.
	loaded bool
	// rss, goHeap, goLive, goMem and gpuMem are bytes; NaN when not known.
	rss, goHeap, goLive, goMem, gpuMem float64
	// active … tokensPerIter are the model's gauges, summed over its instances.
	active, queued, kvUsed, kvFree, kvMax, tokensPerIter float64
	// done and failed count the requests finished so far; tokens the tokens received.
	done, failed, tokens int64
}

// counters are the workers' running totals.
type counters struct {
	done, failed, tokens atomic.Int64
	// mu guards latencies, ttfts and errs.
	mu sync.Mutex
	// latencies and ttfts are the successful requests' times, in ms.
	latencies, ttfts []float64
	// errs counts the failures by message.
	errs map[string]int
}

func run(c config) (bool, error) {
	cl, err := dial(c.addr)
	if err != nil {
		return false, err
	}
	defer cl.close()
	if err := cl.waitReady(c.model, c.wait); err != nil {
		return false, err
	}
	pid := c.pid
	if pid == 0 {
		_, portStr, _ := strings.Cut(c.addr, ":")
		port, perr := strconv.Atoi(portStr)
		if perr != nil {
			return false, fmt.Errorf("-addr %q has no port", c.addr)
		}
		if pid, err = findServer(port); err != nil {
			return false, err
		}
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	probe := func(t0 time.Time, loaded bool, cs *counters) (sample, error) {
		s := sample{t: time.Since(t0).Seconds(), loaded: loaded, rss: math.NaN(), goHeap: math.NaN(), goLive: math.NaN(), goMem: math.NaN(), gpuMem: math.NaN()}
		if r, err := harness.ProcessRSS(pid); err == nil {
			s.rss = float64(r)
		} else {
			return s, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ss, err := scrape(ctx, hc, c.metricsURL)
		if err != nil {
			return s, err
		}
		fill(&s, ss, c.model)
		s.done, s.failed, s.tokens = cs.done.Load(), cs.failed.Load(), cs.tokens.Load()
		return s, nil
	}

	var cs counters
	cs.errs = map[string]int{}
	t0 := time.Now()
	first, err := probe(t0, true, &cs)
	if err != nil {
		return false, err
	}
	machine := c.machine
	if machine == "" {
		machine = machineName(!math.IsNaN(first.gpuMem))
	}
	fmt.Printf("soak: %s on %s, %d in flight, %s, %v; tritonserver pid %d, RSS %.0f MiB\n",
		c.model, c.addr, c.concurrency, streamWord(c.streaming), c.duration, pid, first.rss/(1<<20))

	ctx, stop := context.WithTimeout(context.Background(), c.duration)
	defer stop()
	var wg sync.WaitGroup
	for w := range c.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker(ctx, cl, c, w, &cs)
		}()
	}
	samples := []sample{first}
	tick := time.NewTicker(c.interval)
	for loop := true; loop; {
		select {
		case <-ctx.Done():
			loop = false
		case <-tick.C:
			s, err := probe(t0, true, &cs)
			if err != nil {
				fmt.Fprintf(os.Stderr, "soak: sample at %.0f s: %v\n", s.t, err)
				continue
			}
			samples = append(samples, s)
			fmt.Printf("soak: %5.0f s  RSS %6.0f MiB  Go heap %6.0f MiB (live %6.0f)  active %3.0f  KV used %5.0f  done %6d  failed %d\n",
				s.t, s.rss/(1<<20), s.goHeap/(1<<20), s.goLive/(1<<20), s.active, s.kvUsed, s.done, s.failed)
		}
	}
	tick.Stop()
	loadEnd := time.Since(t0)
	// The requests in flight finish; none starts after the deadline.
	wg.Wait()
	drained := time.Since(t0)
	idle, last, err := waitIdle(func() (sample, error) { return probe(t0, false, &cs) }, 30*time.Second)
	if err != nil {
		return false, err
	}
	// The backend returns freed memory once it has been idle for 2 s.
	time.Sleep(3 * time.Second)
	if s, err := probe(t0, false, &cs); err == nil {
		last = s
	}
	samples = append(samples, last)

	r := summarize(c, samples, &cs, loadEnd, drained, idle)
	r.machine = machine
	out := c.out
	if out == "" {
		kind := "cpu"
		if !math.IsNaN(first.gpuMem) {
			kind = "gpu"
		}
		out = filepath.Join("bench", "results", fmt.Sprintf("%s-soak-%s.jsonl", time.Now().UTC().Format("2006-01-02"), kind))
	}
	if err := writeResults(out, r, samples); err != nil {
		return false, err
	}
	svg := strings.TrimSuffix(out, filepath.Ext(out)) + ".svg"
	if err := os.WriteFile(svg, []byte(plot(r, samples)), 0o644); err != nil {
		return false, fmt.Errorf("write the plot: %w", err)
	}
	r.print(os.Stdout)
	fmt.Printf("soak: wrote %s and %s\n", out, svg)
	return r.failed == 0 && idle, nil
}

// worker sends requests one after another until ctx ends.
func worker(ctx context.Context, cl *client, c config, w int, cs *counters) {
	rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	for n := 0; ctx.Err() == nil; n++ {
		prompt := prompts[rng.IntN(len(prompts))]
		maxTokens := c.minTokens + rng.IntN(c.maxTokens-c.minTokens+1)
		start := time.Now()
		// The request itself may outlive the load's deadline: it is allowed to finish.
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		o := cl.generate(rctx, c.model, fmt.Sprintf("soak-%d-%d", w, n), prompt, maxTokens, c.streaming, rng.Uint64())
		cancel()
		end := time.Now()
		cs.tokens.Add(int64(o.tokens))
		cs.mu.Lock()
		if o.err != nil {
			cs.failed.Add(1)
			msg := o.err.Error()
			if len(msg) > 120 {
				msg = msg[:120]
			}
			cs.errs[msg]++
		} else {
			cs.done.Add(1)
			cs.latencies = append(cs.latencies, float64(end.Sub(start).Microseconds())/1000)
			if !o.first.IsZero() {
				cs.ttfts = append(cs.ttfts, float64(o.first.Sub(start).Microseconds())/1000)
			}
		}
		cs.mu.Unlock()
	}
}

// fill reads a sample's gauges from a scrape: the process-wide ones, the model's summed
// over its instances, GPU memory from gollm's families or else Triton's.
func fill(s *sample, ss []series, model string) {
	m := map[string]string{"model": model}
	get := func(name string, match map[string]string) float64 {
		v, ok := sum(ss, name, match)
		if !ok {
			return math.NaN()
		}
		return v
	}
	s.goHeap = get("gollm_go_heap_bytes", nil)
	s.goLive = get("gollm_go_heap_live_bytes", nil)
	s.goMem = get("gollm_go_memory_bytes", nil)
	s.active = get("gollm_requests_active", m)
	s.queued = get("gollm_requests_queued", m)
	s.kvUsed = get("gollm_kv_blocks_used", m)
	s.kvFree = get("gollm_kv_blocks_free", m)
	s.kvMax = get("gollm_kv_blocks_max", m)
	s.tokensPerIter = get("gollm_tokens_per_iteration", m)
	s.gpuMem = get("gollm_gpu_memory_used_bytes", nil)
	if math.IsNaN(s.gpuMem) {
		s.gpuMem = get("nv_gpu_memory_used_bytes", nil)
	}
}

// isIdle says the model's gauges show nothing in flight and an empty pool.
func (s sample) isIdle() bool {
	return s.active == 0 && s.queued == 0 && s.kvUsed == 0 && s.kvFree == s.kvMax && s.tokensPerIter == 0
}

// waitIdle samples until the gauges are idle or timeout passes.
func waitIdle(probe func() (sample, error), timeout time.Duration) (bool, sample, error) {
	deadline := time.Now().Add(timeout)
	for {
		s, err := probe()
		if err != nil {
			return false, s, err
		}
		if s.isIdle() {
			return true, s, nil
		}
		if time.Now().After(deadline) {
			return false, s, nil
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// report is the soak's summary.
type report struct {
	// cfg records the run's settings beside its figures.
	cfg config
	// machine names the machine.
	machine string
	// done, failed and tokens sum the workers' counters.
	done, failed, tokens int64
	// loadS is the load's duration and drainS when its last request ended, in seconds.
	loadS, drainS float64
	// tokensPerS is tokens over drainS.
	tokensPerS float64
	// latP50, latP99, ttftP50 are in ms.
	latP50, latP99, ttftP50 float64
	// rss* and heap* are MiB: at the first sample, the most, after the load, and the
	// growth over the load's second half (last loaded sample less the one at its middle).
	rssStart, rssMax, rssEnd, rssDrift     float64
	heapStart, heapMax, heapEnd, heapDrift float64
	// gpuStart, gpuMax, gpuEnd are GB (NaN without a GPU).
	gpuStart, gpuMax, gpuEnd float64
	// idle says the gauges went back to idle.
	idle bool
	// errs counts failures by message.
	errs map[string]int
}

// summarize computes the report from the samples and counters.
func summarize(c config, samples []sample, cs *counters, loadEnd, drained time.Duration, idle bool) report {
	r := report{cfg: c, done: cs.done.Load(), failed: cs.failed.Load(), tokens: cs.tokens.Load(),
		loadS: loadEnd.Seconds(), drainS: drained.Seconds(), idle: idle, errs: cs.errs}
	r.tokensPerS = float64(r.tokens) / r.drainS
	cs.mu.Lock()
	r.latP50, r.latP99 = percentile(cs.latencies, 0.5), percentile(cs.latencies, 0.99)
	r.ttftP50 = percentile(cs.ttfts, 0.5)
	cs.mu.Unlock()
	const mib = 1 << 20
	pick := func(f func(sample) float64, scale float64) (start, maxv, end, drift float64) {
		var loaded []float64
		maxv = math.NaN()
		for _, s := range samples {
			v := f(s) / scale
			if s.loaded {
				loaded = append(loaded, v)
			}
			if math.IsNaN(maxv) || v > maxv {
				maxv = v
			}
		}
		start, end = f(samples[0])/scale, f(samples[len(samples)-1])/scale
		drift = math.NaN()
		if len(loaded) >= 3 {
			drift = loaded[len(loaded)-1] - loaded[len(loaded)/2]
		}
		return
	}
	r.rssStart, r.rssMax, r.rssEnd, r.rssDrift = pick(func(s sample) float64 { return s.rss }, mib)
	r.heapStart, r.heapMax, r.heapEnd, r.heapDrift = pick(func(s sample) float64 { return s.goLive }, mib)
	r.gpuStart, r.gpuMax, r.gpuEnd, _ = pick(func(s sample) float64 { return s.gpuMem }, 1e9)
	return r
}

// percentile returns the q-quantile of xs (nearest rank), NaN for none.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// line is one record of the results file in BENCH.md's format.
type line struct {
	Date     string   `json:"date"`
	Commit   string   `json:"commit"`
	Machine  string   `json:"machine"`
	Model    string   `json:"model"`
	DType    string   `json:"dtype"`
	Workload string   `json:"workload"`
	Impl     string   `json:"impl"`
	Metric   string   `json:"metric"`
	Value    float64  `json:"value"`
	T        *float64 `json:"t_s,omitempty"`
	Note     string   `json:"note,omitempty"`
}

// workload names the soak: soak_c<concurrency>_<stream|nostream>_<minutes>m.
func (c config) workload() string {
	s := "stream"
	if !c.streaming {
		s = "nostream"
	}
	return fmt.Sprintf("soak_c%d_%s_%dm", c.concurrency, s, int(math.Round(c.duration.Minutes())))
}

// writeResults writes the summary and the samples as JSON lines.
func writeResults(path string, r report, samples []sample) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	base := line{Date: time.Now().UTC().Format("2006-01-02"), Commit: r.cfg.commit, Machine: r.machine,
		Model: r.cfg.label, DType: "n/a", Workload: r.cfg.workload(), Impl: "gollm-triton"}
	if !math.IsNaN(r.gpuStart) {
		base.DType = "fp16"
	}
	var lines []line
	add := func(metric string, v float64, note string) {
		if math.IsNaN(v) {
			return
		}
		l := base
		l.Metric, l.Value, l.Note = metric, round(v), note
		lines = append(lines, l)
	}
	add("requests", float64(r.done), fmt.Sprintf("max_tokens in [%d, %d], text prompts, random seeds", r.cfg.minTokens, r.cfg.maxTokens))
	add("failures", float64(r.failed), errSummary(r.errs))
	add("tokens_per_s", r.tokensPerS, "generated tokens over the load and its drain")
	add("latency_ms", r.latP50, "median whole request")
	add("latency_ms_p99", r.latP99, "")
	add("ttft_ms", r.ttftP50, "median")
	add("rss_mib_start", r.rssStart, "tritonserver's RSS at the load's start (models loaded)")
	add("rss_mib_max", r.rssMax, "")
	add("rss_mib_end", r.rssEnd, "after the load, idle for 3 s")
	add("rss_mib_drift_second_half", r.rssDrift, "the last sample under load less the one at the load's middle")
	add("go_heap_live_mib_start", r.heapStart, "gollm_go_heap_live_bytes: live at the last collection")
	add("go_heap_live_mib_max", r.heapMax, "")
	add("go_heap_live_mib_end", r.heapEnd, "")
	add("go_heap_live_mib_drift_second_half", r.heapDrift, "")
	add("gpu_mem_gb_start", r.gpuStart, "")
	add("gpu_mem_gb_max", r.gpuMax, "")
	add("gpu_mem_gb_end", r.gpuEnd, "")
	add("gauges_idle_at_end", b2f(r.idle), "1: requests active, paused, queued 0, every KV block free, 0 tokens per iteration after the load")
	for _, s := range samples {
		t := round(s.t)
		for _, q := range []struct {
			metric string
			v      float64
		}{
			{"rss_mib", s.rss / (1 << 20)}, {"go_heap_mib", s.goHeap / (1 << 20)}, {"go_heap_live_mib", s.goLive / (1 << 20)},
			{"gpu_mem_gb", s.gpuMem / 1e9},
			{"requests_active", s.active}, {"kv_blocks_used", s.kvUsed}, {"requests_done", float64(s.done)},
			{"failures", float64(s.failed)},
		} {
			if math.IsNaN(q.v) {
				continue
			}
			l := base
			l.Metric, l.Value, l.T = q.metric, round(q.v), &t
			lines = append(lines, l)
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, l := range lines {
		if err := enc.Encode(l); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// errSummary lists the failures by message, most frequent first.
func errSummary(errs map[string]int) string {
	type kv struct {
		msg string
		n   int
	}
	var all []kv
	for m, n := range errs {
		all = append(all, kv{m, n})
	}
	slices.SortFunc(all, func(a, b kv) int { return b.n - a.n })
	var parts []string
	for i, e := range all {
		if i == 3 {
			break
		}
		parts = append(parts, fmt.Sprintf("%d× %s", e.n, e.msg))
	}
	return strings.Join(parts, "; ")
}

// print writes the summary for a person.
func (r report) print(w *os.File) {
	fmt.Fprintf(w, "soak: %d requests, %d failed, %.1f tokens/s, latency p50 %.0f ms p99 %.0f ms, TTFT p50 %.0f ms\n",
		r.done, r.failed, r.tokensPerS, r.latP50, r.latP99, r.ttftP50)
	fmt.Fprintf(w, "soak: RSS %.0f → max %.0f → %.0f MiB after (second half %+.1f MiB); live Go heap %.0f → max %.0f → %.0f MiB (second half %+.1f MiB)\n",
		r.rssStart, r.rssMax, r.rssEnd, r.rssDrift, r.heapStart, r.heapMax, r.heapEnd, r.heapDrift)
	if !math.IsNaN(r.gpuStart) {
		fmt.Fprintf(w, "soak: GPU memory %.2f → max %.2f → %.2f GB\n", r.gpuStart, r.gpuMax, r.gpuEnd)
	}
	fmt.Fprintf(w, "soak: gauges back to idle: %v\n", r.idle)
	if len(r.errs) > 0 {
		fmt.Fprintf(w, "soak: failures: %s\n", errSummary(r.errs))
	}
}

// machineName is the GPU's name when there is one, else the CPU's model and core count.
func machineName(gpu bool) string {
	if gpu {
		if b, err := exec.Command("nvidia-smi", "--query-gpu=name", "--format=csv,noheader").Output(); err == nil {
			if n := strings.TrimSpace(strings.Split(string(b), "\n")[0]); n != "" {
				return n
			}
		}
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	cores := 0
	name := "unknown CPU"
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "model name"); ok {
			cores++
			name = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return fmt.Sprintf("%s, %d cores", name, cores)
}

func streamWord(s bool) string {
	if s {
		return "streaming"
	}
	return "not streaming"
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// round keeps four significant decimals, so the files stay readable.
func round(v float64) float64 { return math.Round(v*1e4) / 1e4 }

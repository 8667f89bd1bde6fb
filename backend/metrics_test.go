package main

import (
	"os"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"

	"gollm/batchmanager"
	"gollm/bridge/triton"
	"gollm/engines"
)

// busyStats are the stats of an iteration in full flight.
func busyStats() batchmanager.Stats {
	return batchmanager.Stats{
		IterationCounter:      41,
		ActiveRequestCount:    5,
		MaxRequestCount:       8,
		MaxKVCacheBlocks:      100,
		FreeKVCacheBlocks:     70,
		UsedKVCacheBlocks:     30,
		TokensPerKVCacheBlock: 64,
		ScheduledRequests:     4,
		ContextRequests:       1,
		GenerationRequests:    3,
		TotalContextTokens:    17,
		TotalGenerationTokens: 4,
		PausedRequests:        1,
		WaitingRequests:       2,
		ReusedKVCacheBlocks:   9,
	}
}

func TestStatsValues(t *testing.T) {
	t.Run("an iteration's stats map onto the gauges and counter totals", func(t *testing.T) {
		got := statsValues(busyStats(), 3, metricValues{})
		want := metricValues{
			metricRequestsActive:     5,
			metricRequestsPaused:     1,
			metricRequestsQueued:     2 + 3,
			metricKVBlocksUsed:       30,
			metricKVBlocksFree:       70,
			metricKVBlocksMax:        100,
			metricTokensPerIteration: 17 + 3,
			metricIterations:         41,
			metricKVBlocksReused:     9,
			metricInstanceReady:      1,

			metricSequencesPerIterationMax: 4,
		}
		if got != want {
			t.Errorf("got  %v\nwant %v", got, want)
		}
	})
	t.Run("the most sequences an iteration ran is kept across smaller iterations", func(t *testing.T) {
		s := busyStats()
		s.ScheduledRequests = 300
		big := statsValues(s, 0, metricValues{})
		s.ScheduledRequests = 2
		if got := statsValues(s, 0, big)[metricSequencesPerIterationMax]; got != 300 {
			t.Errorf("after an iteration of 300 sequences and one of 2: got %v, want 300", got)
		}
		if got := idleValues(big)[metricSequencesPerIterationMax]; got != 300 {
			t.Errorf("idle after 300 sequences: got %v, want 300", got)
		}
	})
	t.Run("tokens per iteration counts one token per generation step, not sampled tokens", func(t *testing.T) {
		s := busyStats()
		s.TotalContextTokens, s.GenerationRequests, s.TotalGenerationTokens = 0, 6, 6
		if got := statsValues(s, 0, metricValues{})[metricTokensPerIteration]; got != 6 {
			t.Errorf("got %v, want 6", got)
		}
		s.TotalContextTokens, s.ContextRequests, s.GenerationRequests, s.TotalGenerationTokens = 12, 1, 0, 1
		if got := statsValues(s, 0, metricValues{})[metricTokensPerIteration]; got != 12 {
			t.Errorf("a prompt of 12 finishing with a sampled token: got %v, want 12", got)
		}
	})
	t.Run("the iteration that ends the last request leaves tokens per iteration at 0", func(t *testing.T) {
		s := busyStats()
		s.ActiveRequestCount, s.PausedRequests, s.WaitingRequests = 0, 0, 0
		if got := statsValues(s, 0, metricValues{})[metricTokensPerIteration]; got != 0 {
			t.Errorf("got %v, want 0", got)
		}
		if got := statsValues(s, 1, metricValues{})[metricTokensPerIteration]; got != 20 {
			t.Errorf("with a request queued in the backend: got %v, want 20", got)
		}
	})
}

func TestIdleValues(t *testing.T) {
	busy := statsValues(busyStats(), 1, metricValues{})
	got := idleValues(busy)
	want := metricValues{
		metricKVBlocksFree:   100,
		metricKVBlocksMax:    100,
		metricIterations:     41,
		metricKVBlocksReused: 9,
		metricInstanceReady:  1,

		metricSequencesPerIterationMax: 4,
	}
	if got != want {
		t.Errorf("got  %v\nwant %v", got, want)
	}
	if init := initialValues(100); init[metricKVBlocksFree] != 100 || init[metricKVBlocksMax] != 100 || init[metricKVBlocksUsed] != 0 || init[metricInstanceReady] != 1 {
		t.Errorf("initial values %v: want an empty pool of 100", init)
	}
}

func TestMetricUpdates(t *testing.T) {
	busy := statsValues(busyStats(), 0, metricValues{})
	t.Run("nothing changed: no update, so no crossing into Triton", func(t *testing.T) {
		if u := metricUpdates(nil, busy, busy); len(u) != 0 {
			t.Errorf("got %v", u)
		}
	})
	t.Run("a changed gauge is set and a grown counter incremented by the difference", func(t *testing.T) {
		next := busy
		next[metricKVBlocksUsed], next[metricKVBlocksFree] = 31, 69
		next[metricIterations]++
		got := metricUpdates(nil, busy, next)
		want := []metricUpdate{
			{id: metricKVBlocksUsed, value: 31},
			{id: metricKVBlocksFree, value: 69},
			{id: metricIterations, value: 1, add: true},
		}
		if !equalUpdates(got, want) {
			t.Errorf("got  %v\nwant %v", got, want)
		}
	})
	t.Run("a counter total that went down counts again from 0", func(t *testing.T) {
		next := busy
		next[metricKVBlocksReused] = 2
		got := metricUpdates(nil, busy, next)
		want := []metricUpdate{{id: metricKVBlocksReused, value: 2, add: true}}
		if !equalUpdates(got, want) {
			t.Errorf("got  %v\nwant %v", got, want)
		}
		next[metricKVBlocksReused] = 0
		if got := metricUpdates(nil, busy, next); len(got) != 0 {
			t.Errorf("a total reset to 0: got %v, want no update", got)
		}
	})
	t.Run("a gauge may go to 0 and below its old value", func(t *testing.T) {
		got := metricUpdates(nil, busy, idleValues(busy))
		for _, u := range got {
			if u.add {
				t.Errorf("idle values increment %s", metricDefs[u.id].name)
			}
		}
		if len(got) != 6 {
			t.Errorf("got %d updates %v, want the 6 gauges that change", len(got), got)
		}
	})
}

// equalUpdates compares update lists.
func equalUpdates(a, b []metricUpdate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMetricSeriesFollowTheStats plays a run through metricUpdates into series that
// behave like Triton's (gauges set, counters only incremented) and checks what a scrape
// would show at each step.
func TestMetricSeriesFollowTheStats(t *testing.T) {
	var series metricValues
	shown := metricValues{}
	apply := func(next metricValues) {
		for _, u := range metricUpdates(nil, shown, next) {
			switch {
			case metricDefs[u.id].kind == triton.MetricCounter && !u.add:
				t.Fatalf("%s is a counter but was set", metricDefs[u.id].name)
			case u.add && u.value < 0:
				t.Fatalf("%s incremented by %v", metricDefs[u.id].name, u.value)
			case u.add:
				series[u.id] += u.value
			default:
				series[u.id] = u.value
			}
		}
		shown = next
	}
	apply(initialValues(10))
	if series[metricKVBlocksFree] != 10 || series[metricKVBlocksMax] != 10 {
		t.Fatalf("before any request: %v", series)
	}
	s := batchmanager.Stats{MaxKVCacheBlocks: 10}
	for i := range 5 {
		s.IterationCounter++
		s.ActiveRequestCount, s.UsedKVCacheBlocks, s.FreeKVCacheBlocks = 2, 2+i/2, 8-i/2
		s.GenerationRequests = 2
		s.ReusedKVCacheBlocks = uint64(i)
		apply(statsValues(s, 0, metricValues{}))
	}
	if series[metricRequestsActive] != 2 || series[metricKVBlocksUsed] != 4 || series[metricIterations] != 5 || series[metricKVBlocksReused] != 4 {
		t.Fatalf("mid-run: %v", series)
	}
	// A failed iteration: the manager starts a fresh pool (reuse total back to 0) and
	// ends its requests without reporting; the backend shows the idle values.
	apply(idleValues(shown))
	s.ReusedKVCacheBlocks = 0
	s.IterationCounter++
	s.ActiveRequestCount, s.UsedKVCacheBlocks, s.FreeKVCacheBlocks, s.ReusedKVCacheBlocks = 1, 1, 9, 3
	apply(statsValues(s, 0, metricValues{}))
	s.IterationCounter++
	s.ActiveRequestCount, s.UsedKVCacheBlocks, s.FreeKVCacheBlocks, s.GenerationRequests = 0, 0, 10, 1
	apply(statsValues(s, 0, metricValues{}))
	want := metricValues{
		metricKVBlocksFree:   10,
		metricKVBlocksMax:    10,
		metricIterations:     7,
		metricKVBlocksReused: 4 + 3,
		metricInstanceReady:  1,
	}
	if series != want {
		t.Errorf("after the run: got  %v\nwant %v", series, want)
	}
}

func TestMetricDefinitions(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	all := append(append(metricDefs[:0:0], metricDefs[:]...), runtimeDefs...)
	all = append(all, gpuDefs()...)
	for id, d := range all {
		t.Run(d.name, func(t *testing.T) {
			if !strings.HasPrefix(d.name, "gollm_") {
				t.Errorf("metric %d: name %q lacks the gollm_ prefix", id, d.name)
			}
			if seen[d.name] {
				t.Errorf("name %q is used twice", d.name)
			}
			seen[d.name] = true
			if d.help == "" {
				t.Errorf("%s has no description", d.name)
			}
			if d.kind != triton.MetricGauge && d.kind != triton.MetricCounter {
				t.Errorf("%s: kind %v", d.name, d.kind)
			}
			if !strings.Contains(string(readme), "`"+d.name+"`") {
				t.Errorf("README.md does not document %s", d.name)
			}
		})
	}
}

func TestReadRuntime(t *testing.T) {
	keep := make([]byte, 8<<20)
	v := readRuntime(make([]metrics.Sample, len(runtimeSamples)))
	if v[0] < float64(len(keep)) {
		t.Errorf("Go heap %v bytes with 8 MiB live", v[0])
	}
	runtime.GC()
	v = readRuntime(make([]metrics.Sample, len(runtimeSamples)))
	if v[1] < float64(len(keep)) || v[1] > 2*v[0] {
		t.Errorf("live heap %v bytes after a collection, with 8 MiB live and %v bytes of objects", v[1], v[0])
	}
	if v[2] < v[0] {
		t.Errorf("the runtime holds %v bytes, less than its heap objects' %v", v[2], v[0])
	}
	runtime.KeepAlive(keep)
}

func TestGPUUsersCountSharedWeightsOnce(t *testing.T) {
	u := gpuUsers{weights: map[string]int64{}, instances: map[string]engines.GPUUse{}, models: map[string]string{}}
	u.add("gpt2", "gpt2_0_0", engines.GPUUse{Weights: 100, KV: 1000, Scratch: 10})
	u.add("gpt2", "gpt2_0_1", engines.GPUUse{Weights: 100, KV: 1000, Scratch: 10})
	u.add("llama", "llama_0_0", engines.GPUUse{Weights: 500, KV: 3000, Scratch: 30})
	if got, want := u.own(), [3]float64{600, 5000, 50}; got != want {
		t.Errorf("three instances of two models: %v, want %v (each model's weights once)", got, want)
	}
	u.remove("gpt2_0_0")
	if got, want := u.own(), [3]float64{600, 4000, 40}; got != want {
		t.Errorf("with one gpt2 instance left: %v, want %v", got, want)
	}
	u.remove("gpt2_0_1")
	if got, want := u.own(), [3]float64{500, 3000, 30}; got != want {
		t.Errorf("with gpt2 gone: %v, want %v", got, want)
	}
}

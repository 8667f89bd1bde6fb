// Package loadstat holds what the load benchmarks (bench/gpubench through the batch
// manager, bench/tritonbench through tritonserver) share: the load workload's name, the
// schedule of a fixed concurrency, and the figures of a run — output tokens per second,
// time to the first token and the gaps between tokens, at percentiles — as BENCH.md rows.
package loadstat

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Load is a parsed load workload: load_c<C>_n<N>_i<I>_o<O> keeps C requests in flight
// (a client that sends the next when one ends) until N have been sent; C = 0 offers all
// N at once (max load, as trtllm-bench's throughput mode).
type Load struct {
	// Name is as given.
	Name string
	// Concurrency is C; 0 is max load.
	Concurrency int
	// Requests, In and Out are N, the prompt length and the new tokens of each request.
	Requests, In, Out int
}

// IsLoad says whether s names a load workload.
func IsLoad(s string) bool { return strings.HasPrefix(s, "load_") }

// Parse reads a load workload's name; requests are at most max (a bound on what the
// name may ask a benchmark to hold).
func Parse(s string) (Load, error) {
	l := Load{Name: s}
	if _, err := fmt.Sscanf(s, "load_c%d_n%d_i%d_o%d", &l.Concurrency, &l.Requests, &l.In, &l.Out); err != nil {
		return l, fmt.Errorf("workload %q: want load_c<C>_n<N>_i<I>_o<O> (C 0 for all at once): %w", s, err)
	}
	if l.Concurrency < 0 || l.Requests < 1 || l.Requests > 1<<20 || l.In < 1 || l.Out < 2 || l.Concurrency > l.Requests {
		return l, fmt.Errorf("workload %q: want C in [0, N], N in [1, 2^20], I ≥ 1, O ≥ 2", s)
	}
	return l, nil
}

// InFlight is the most requests the load keeps in flight.
func (l Load) InFlight() int {
	if l.Concurrency == 0 {
		return l.Requests
	}
	return l.Concurrency
}

// Workload is the name rows carry: maxload_i<I>_o<O> for max load, else
// load_c<C>_i<I>_o<O> (the request count goes into the row's "requests").
func (l Load) Workload() string {
	if l.Concurrency == 0 {
		return fmt.Sprintf("maxload_i%d_o%d", l.In, l.Out)
	}
	return fmt.Sprintf("load_c%d_i%d_o%d", l.Concurrency, l.In, l.Out)
}

// Request is one request's timeline: when it was offered (sent, or queued for the batch
// manager) and when each response with tokens arrived, with how many tokens each held.
type Request struct {
	Offered time.Time
	Times   []time.Time
	Tokens  []int
}

// Summary is a run's figures.
type Summary struct {
	// Wall is from the first offer to the last token.
	Wall time.Duration
	// Tokens is every request's output tokens.
	Tokens int
	// TTFT are the times to the first token, sorted; ITL the gaps between a request's
	// responses after the first, each divided by the tokens of the later response, sorted.
	TTFT, ITL []float64
}

// Summarize reads the requests' timelines.
func Summarize(reqs []Request) Summary {
	var s Summary
	var first, last time.Time
	for _, r := range reqs {
		if first.IsZero() || r.Offered.Before(first) {
			first = r.Offered
		}
		for i, t := range r.Times {
			s.Tokens += r.Tokens[i]
			if t.After(last) {
				last = t
			}
			if i == 0 {
				s.TTFT = append(s.TTFT, t.Sub(r.Offered).Seconds())
				continue
			}
			if n := r.Tokens[i]; n > 0 {
				gap := t.Sub(r.Times[i-1]).Seconds() / float64(n)
				for range n {
					s.ITL = append(s.ITL, gap)
				}
			}
		}
	}
	s.Wall = last.Sub(first)
	slices.Sort(s.TTFT)
	slices.Sort(s.ITL)
	return s
}

// Percentile is the p-th percentile (0..100) of sorted values (nearest rank); NaN when
// there are none.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	k := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}

// Rows are the summary as BENCH.md rows (less date, commit and machine): tokens_per_s,
// ttft_ms and itl_ms at p50, p90 and p99. base holds the fields every row carries
// (model, dtype, impl, ...); workload, requests and concurrency are added.
func (s Summary) Rows(l Load, base map[string]any) []map[string]any {
	var rows []map[string]any
	add := func(metric string, v float64) {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
		r := map[string]any{"workload": l.Workload(), "requests": l.Requests, "concurrency": l.InFlight(),
			"metric": metric, "value": math.Round(v*1000) / 1000}
		for k, x := range base {
			r[k] = x
		}
		rows = append(rows, r)
	}
	if s.Wall > 0 {
		add("tokens_per_s", float64(s.Tokens)/s.Wall.Seconds())
	}
	for _, p := range []struct {
		suffix string
		p      float64
	}{{"", 50}, {"_p90", 90}, {"_p99", 99}} {
		add("ttft_ms"+p.suffix, Percentile(s.TTFT, p.p)*1e3)
		add("itl_ms"+p.suffix, Percentile(s.ITL, p.p)*1e3)
	}
	return rows
}

package batchmanager

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gollm/engine"
	"gollm/guide"
)

// instantEngine returns at once: a benchmark of it measures the manager alone.
type instantEngine struct {
	// info describes a pool big enough for the benchmark.
	info engine.Info
	// outs is reused for every step.
	outs []engine.Output
}

func (e *instantEngine) Info() engine.Info { return e.info }
func (e *instantEngine) Close() error      { return nil }
func (e *instantEngine) Step(b *engine.Batch) ([]engine.Output, error) {
	if cap(e.outs) < len(b.Seqs) {
		e.outs = make([]engine.Output, len(b.Seqs))
	}
	outs := e.outs[:len(b.Seqs)]
	for i := range b.Seqs {
		s := &b.Seqs[i]
		outs[i] = engine.Output{Token: int32((s.Pos*7 + len(s.Tokens)) % e.info.VocabSize)}
		if !s.Sample {
			outs[i].Token = -1
		}
	}
	return outs, nil
}

// benchOutputLen is each benchmark request's output length: requests keep finishing
// and being replaced, so admission, contexts and final responses are part of the mix.
const benchOutputLen = 128

// schedBench measures one iteration of the manager (intake, scheduling, block
// bookkeeping, building the batch, applying outputs, streaming responses, stats JSON)
// with `active` sequences in flight and an engine that returns at once.
func schedBench(b *testing.B, active int) { schedBenchWith(b, active, nil, false) }

// schedBenchWith is schedBench with every request under g when g is set (an engine
// that samples allowed tokens), in the overlap schedule when overlap is set.
func schedBenchWith(b *testing.B, active int, g *guide.Guide, overlap bool) {
	const prompt, tpb = 16, 16
	var eng engine.Engine = &instantEngine{info: engine.Info{VocabSize: 50000, MaxSeqLen: 4096, NumBlocks: active * 12, TokensPerBlock: tpb}}
	if g != nil {
		eng = &guidedEngine{instantEngine{info: engine.Info{VocabSize: g.Vocab().Size(), MaxSeqLen: 4096, NumBlocks: active * 12, TokensPerBlock: tpb}}}
	}
	next := uint64(0)
	var finished int
	newReq := func(out int) *InferenceRequest {
		next++
		p := make([]int32, prompt)
		for i := range p {
			p[i] = int32(next+uint64(i)) % 50000
		}
		return &InferenceRequest{ID: next, InputIDs: p, MaxNewTokens: out, PadID: -1, Streaming: true, Guide: g}
	}
	var queue []*InferenceRequest
	// Stagger the first requests' lengths so that finishes spread over the iterations.
	for i := range active {
		queue = append(queue, newReq(1+i*benchOutputLen/active))
	}
	cb := Callbacks{
		GetInferenceRequests: func(max int) []*InferenceRequest {
			for ; finished > 0; finished-- {
				queue = append(queue, newReq(benchOutputLen))
			}
			n := min(max, len(queue))
			out := queue[:n:n]
			queue = queue[n:]
			return out
		},
		SendResponse: func(id uint64, out Result, final bool, err error) {
			if err != nil {
				panic(err)
			}
			if final {
				finished++
			}
		},
		PollStopSignal:          func() map[uint64]struct{} { return nil },
		ReturnBatchManagerStats: func(string) {},
	}
	m, err := newManager(eng, Config{MaxBatchSize: active, Policy: GuaranteedNoEvict, Overlap: overlap}, cb, nil)
	if err != nil {
		b.Fatal(err)
	}
	// Warm up into the steady state.
	for range 2 * benchOutputLen {
		m.iterate()
	}
	if got := len(m.running); got < active*9/10 {
		b.Fatalf("only %d of %d sequences active", got, active)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		m.iterate()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/iteration")
}

// benchActive are the sequences in flight the benchmark measures: up to max_batch_size
// 1,024, where the host's share of an iteration must stay under a GPU step's time for
// the overlap schedule to hide it.
var benchActive = []int{64, 256, 512, 1024}

func BenchmarkIteration(b *testing.B) {
	for _, n := range benchActive {
		b.Run(fmt.Sprintf("active=%d", n), func(b *testing.B) { schedBench(b, n) })
	}
}

// TestWriteBenchResults runs the benchmark and saves its figures in the format of
// BENCH.md when GOLLM_BENCH_RESULTS names the results folder (bench/results):
//
//	GOLLM_BENCH_RESULTS=$PWD/bench/results go test -run TestWriteBenchResults ./batchmanager/
func TestWriteBenchResults(t *testing.T) {
	dir := os.Getenv("GOLLM_BENCH_RESULTS")
	if dir == "" {
		t.Skip("set GOLLM_BENCH_RESULTS to the results folder to run the benchmark and save it")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	date := time.Now().Format("2006-01-02")
	commit := "unknown"
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(out))
	}
	machine := cpuModel()
	path := filepath.Join(dir, date+"-batchmanager-cpu.jsonl")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, n := range benchActive {
		// Median of five runs: shared machines are noisy.
		var runs []float64
		for range 5 {
			r := testing.Benchmark(func(b *testing.B) { schedBench(b, n) })
			runs = append(runs, float64(r.T.Nanoseconds())/float64(r.N))
		}
		ns := median(runs)
		line, err := json.Marshal(map[string]any{
			"date": date, "commit": commit, "machine": machine, "model": "n/a", "dtype": "n/a",
			"workload": fmt.Sprintf("sched_s%d", n), "impl": "gollm-batchmanager", "metric": "ns_per_iteration",
			"value": float64(int64(ns*10)) / 10,
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(append(line, '\n')); err != nil {
			t.Fatal(err)
		}
		t.Logf("sched_s%d: %.0f ns/iteration (runs %v)", n, ns, runs)
	}
	t.Logf("saved to %s", path)
}

// median of a few values.
func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}

// cpuModel is the CPU's model name from /proc/cpuinfo.
func cpuModel() string {
	raw, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

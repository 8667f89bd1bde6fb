package cuda

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/engine"
)

// prepSizes are the batch sizes BenchmarkStepPrep measures.
var prepSizes = []int{64, 256, 512, 1024}

// BenchmarkStepPrep is the host's share of a decode step on the GPU engine before and
// after the library call, at 64 to 1,024 sequences of 1,000 positions (Llama-3's
// vocabulary, greedy): the batch's checks, the split into calls, the flattened arrays,
// the outputs collected. Under the overlap schedule it runs while the previous step
// computes, so it must stay well under a step's time at those batch sizes.
func BenchmarkStepPrep(b *testing.B) {
	for _, n := range prepSizes {
		b.Run(fmt.Sprintf("seqs=%d", n), func(b *testing.B) { stepPrepBench(b, n) })
	}
}

func stepPrepBench(b *testing.B, n int) {
	const T, pos = 64, 1000
	info := engine.Info{VocabSize: 128256, MaxSeqLen: 8192, NumBlocks: n * 17, TokensPerBlock: T}
	batch := &engine.Batch{Seqs: make([]engine.Sequence, n)}
	for i := range batch.Seqs {
		blocks := make([]int32, 17)
		for k := range blocks {
			blocks[k] = int32(i*17 + k)
		}
		hist := make([]int32, pos+1)
		batch.Seqs[i] = engine.Sequence{ID: uint64(i + 1), Tokens: hist[pos:], Pos: pos, Blocks: blocks,
			Sample: true, History: hist, NumGenerated: 100}
	}
	check := engine.NewBatchChecker(info, "cuda")
	var p stepPrep
	p.init(info.VocabSize)
	outs := make([]engine.Output, n)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := check.Check(batch); err != nil {
			b.Fatal(err)
		}
		for _, part := range splitBatch(batch, 8192, 1024) {
			p.build(batch, part, info)
			p.collect(batch, part, nil, outs, info.VocabSize)
		}
	}
}

// TestWriteStepPrepResults runs BenchmarkStepPrep (the median of five runs a size) and
// appends its figures to <date>-stepprep-cpu.jsonl in GOLLM_BENCH_RESULTS (bench/results),
// in BENCH.md's format:
//
//	GOLLM_BENCH_RESULTS=$PWD/bench/results go test -run TestWriteStepPrepResults ./bridge/cuda/
func TestWriteStepPrepResults(t *testing.T) {
	dir := os.Getenv("GOLLM_BENCH_RESULTS")
	if dir == "" {
		t.Skip("set GOLLM_BENCH_RESULTS to the results folder to run the benchmark and save it")
	}
	date := time.Now().Format("2006-01-02")
	commit := "unknown"
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(out))
	}
	machine := "unknown CPU"
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				machine = strings.TrimSpace(v)
				break
			}
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, date+"-stepprep-cpu.jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, n := range prepSizes {
		var runs []float64
		for range 5 {
			r := testing.Benchmark(func(b *testing.B) { stepPrepBench(b, n) })
			runs = append(runs, float64(r.T.Nanoseconds())/float64(r.N))
		}
		slices.Sort(runs)
		line, err := json.Marshal(map[string]any{
			"date": date, "commit": commit, "machine": machine, "model": "llama3.1-8B vocabulary", "dtype": "n/a",
			"workload": fmt.Sprintf("decode_prep_s%d", n), "impl": "gollm-cuda-bridge", "metric": "ns_per_iteration",
			"value": float64(int64(runs[2]*10)) / 10,
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(append(line, '\n')); err != nil {
			t.Fatal(err)
		}
		t.Logf("decode_prep_s%d: %.0f ns (runs %v)", n, runs[2], runs)
	}
}

package austen

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/model"
	"gollm/tokenizer"
)

// heldOutIDs is heldout-sample.txt tokenized as TestHeldOutPerplexity reads it: each
// non-empty line, then the end token.
func heldOutIDs(t testing.TB) []int32 {
	t.Helper()
	tok, err := tokenizer.Load(dir + "/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	eos, ok := tok.TokenID("<|endoftext|>")
	if !ok {
		t.Fatal("no <|endoftext|> token")
	}
	raw, err := os.ReadFile("heldout-sample.txt")
	if err != nil {
		t.Fatal(err)
	}
	var ids []int32
	for _, line := range strings.Split(string(raw), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			ids = append(append(ids, tok.Encode(line)...), eos)
		}
	}
	return ids
}

// perplexity is the shipped model's held-out perplexity with its weights stored in
// format f and its KV cache in kvd: 256-token windows, each position predicting the next
// token.
func perplexity(t testing.TB, f cpu.WeightFormat, kvd engine.KVDType, ids []int32) (ppl float64, n int) {
	ppl, top := perplexityTop(t, f, kvd, ids)
	return ppl, len(top)
}

// perplexityTop is perplexity, with each position's most likely next token.
func perplexityTop(t testing.TB, f cpu.WeightFormat, kvd engine.KVDType, ids []int32) (ppl float64, top []int32) {
	t.Helper()
	c, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := cpu.LoadWeights(c, f)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release()
	const ctx = 256
	e, err := cpu.New(w, engine.KVConfig{NumBlocks: ctx / 64, TokensPerBlock: 64, DType: kvd})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	V := w.Config().VocabSize
	var nll float64
	for start := 0; start+ctx+1 <= len(ids); start += ctx {
		outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: ids[start : start+ctx], Blocks: []int32{0, 1, 2, 3}, ContextLogits: true}}})
		if err != nil {
			t.Fatal(err)
		}
		logits := outs[0].ContextLogits
		for i := range ctx {
			row := logits[i*V : (i+1)*V]
			mx, best := row[0], 0
			for j, v := range row {
				if v > mx {
					mx, best = v, j
				}
			}
			top = append(top, int32(best))
			var z float64
			for _, v := range row {
				z += math.Exp(float64(v - mx))
			}
			nll += float64(mx) + math.Log(z) - float64(row[ids[start+i+1]])
		}
	}
	return math.Exp(nll / float64(len(top))), top
}

// quantizedFormats are the CPU weight formats measured against float32, with the most
// perplexity each may add (4-bit's is reported; its bound only catches a broken kernel).
var quantizedFormats = []struct {
	f     cpu.WeightFormat
	bound float64
}{{cpu.FormatF16, 0.001}, {cpu.FormatBF16, 0.01}, {cpu.FormatQ8, 0.02}, {cpu.FormatQ4K, 0.05}}

// TestQuantizedPerplexity measures what the CPU engine's weight formats cost on the
// held-out text: 8-bit (Q8_0, integer dot products against 8-bit activations) must stay
// within 2% of float32's perplexity.
func TestQuantizedPerplexity(t *testing.T) {
	ids := heldOutIDs(t)
	base, n := perplexity(t, cpu.FormatF32, engine.KVAuto, ids)
	t.Logf("fp32: perplexity %.3f over %d tokens", base, n)
	for _, q := range quantizedFormats {
		ppl, _ := perplexity(t, q.f, engine.KVAuto, ids)
		t.Logf("%s: perplexity %.3f, %+.2f%% against fp32", q.f, ppl, 100*(ppl/base-1))
		if ppl > base*(1+q.bound) {
			t.Errorf("%s: perplexity %.3f is %.2f%% above fp32's %.3f (allowed %.1f%%)", q.f, ppl, 100*(ppl/base-1), base, 100*q.bound)
		}
	}
}

// TestFP8KVCachePerplexity measures what an FP8 KV cache (kv_cache_dtype fp8, scales of
// 1: the shipped checkpoint has none) costs on the held-out text: within 2% of the
// float32 cache's perplexity, and the greedy next token of most positions unchanged.
func TestFP8KVCachePerplexity(t *testing.T) {
	ids := heldOutIDs(t)
	base, baseTop := perplexityTop(t, cpu.FormatF32, engine.KVAuto, ids)
	ppl, top := perplexityTop(t, cpu.FormatF32, engine.KVFP8, ids)
	same := 0
	for i := range top {
		if top[i] == baseTop[i] {
			same++
		}
	}
	agree := float64(same) / float64(len(top))
	t.Logf("KV cache fp32: perplexity %.3f over %d tokens; fp8: %.3f, %+.2f%%; greedy token the same at %.2f%% of positions",
		base, len(top), ppl, 100*(ppl/base-1), 100*agree)
	if agree < 0.95 {
		t.Errorf("FP8 KV cache: the greedy token agrees with the float32 cache's at %.2f%% of positions (want at least 95%%)", 100*agree)
	}
	if ppl > base*1.02 {
		t.Errorf("FP8 KV cache: perplexity %.3f is %.2f%% above the float32 cache's %.3f (allowed 2%%)", ppl, 100*(ppl/base-1), base)
	}
	if ppl == base {
		t.Errorf("FP8 KV cache: perplexity %.6f is the float32 cache's to the last digit: the pool was not rounded", ppl)
	}
}

// BenchmarkQuantizedPerplexity measures the same, and the float32 weights over an FP8 KV
// cache (workload …_kvfp8), and appends the figures to
// bench/results/<date>-perplexity-cpu.jsonl (BENCH.md's format): perplexity per format
// and its ratio to float32's.
func BenchmarkQuantizedPerplexity(b *testing.B) {
	ids := heldOutIDs(b)
	type row struct {
		Date     string  `json:"date"`
		Commit   string  `json:"commit"`
		Machine  string  `json:"machine"`
		Model    string  `json:"model"`
		DType    string  `json:"dtype"`
		Workload string  `json:"workload"`
		Impl     string  `json:"impl"`
		Metric   string  `json:"metric"`
		Value    float64 `json:"value"`
	}
	commit, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	date := time.Now().UTC().Format("2006-01-02")
	machine := fmt.Sprintf("%s (%d cores)", cpuName(), runtime.NumCPU())
	var rows []row
	var base float64
	for range b.N {
		rows = rows[:0]
		formats := append([]cpu.WeightFormat{cpu.FormatF32}, func() []cpu.WeightFormat {
			var fs []cpu.WeightFormat
			for _, q := range quantizedFormats {
				fs = append(fs, q.f)
			}
			return fs
		}()...)
		for _, f := range formats {
			ppl, n := perplexity(b, f, engine.KVAuto, ids)
			if f == cpu.FormatF32 {
				base = ppl
			}
			wl := fmt.Sprintf("heldout_ppl_%d", n)
			r := row{date, strings.TrimSpace(string(commit)), machine, "austen-4.2M", string(f), wl, "gollm-engine", "perplexity", math.Round(ppl*1e4) / 1e4}
			rows = append(rows, r)
			r.Metric, r.Value = "perplexity_ratio_vs_fp32", math.Round(ppl/base*1e5)/1e5
			rows = append(rows, r)
			b.ReportMetric(ppl, string(f)+"-ppl")
		}
		// The float32 weights over an FP8 KV cache (kv_cache_dtype fp8, scales of 1).
		ppl, n := perplexity(b, cpu.FormatF32, engine.KVFP8, ids)
		wl := fmt.Sprintf("heldout_ppl_%d_kvfp8", n)
		r := row{date, strings.TrimSpace(string(commit)), machine, "austen-4.2M", string(cpu.FormatF32), wl, "gollm-engine", "perplexity", math.Round(ppl*1e4) / 1e4}
		rows = append(rows, r)
		r.Metric, r.Value = "perplexity_ratio_vs_fp32", math.Round(ppl/base*1e5)/1e5
		rows = append(rows, r)
		b.ReportMetric(ppl, "kvfp8-ppl")
	}
	path := filepath.Join("..", "..", "bench", "results", date+"-perplexity-cpu.jsonl")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("appended %d rows to %s", len(rows), path)
}

// cpuName is /proc/cpuinfo's model name.
func cpuName() string {
	raw, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

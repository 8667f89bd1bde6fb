// Command cpubench times gollm's CPU engine alone as llama.cpp's llama-bench times
// llama.cpp, so that bench/llamacpp.sh can run the two side by side on the same files:
//
//	cpubench -model FILE_OR_FOLDER [-format auto] [-kv auto] [-threads 2] [-p 128] [-n 128] [-d 0] [-reps 1]
//
// pp<P> is one prompt step of P random tokens into an empty KV cache (prompt tokens per
// second); tg<N> is N single-token greedy steps from an empty cache, or after a D-token
// prompt with -d (generated tokens per second), as llama-bench's pp and tg tests (and its
// -d depth) are. -kv is kv_cache_dtype (auto, fp8; scales of 1). -random GB gives a
// config.json's shape random weights held in memory. Each is run once to warm up, then -reps
// times. It prints one JSON object: the medians, the load time, the weights' bytes and
// formats, and the process's peak resident set (VmHWM, which counts the checkpoint's
// mapped pages the engine touched).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/model"
)

func main() {
	path := flag.String("model", "", "checkpoint folder or GGUF file")
	format := flag.String("format", "auto", "cpu_weight_format")
	threads := flag.Int("threads", 2, "GOMAXPROCS")
	kvType := flag.String("kv", "auto", "kv_cache_dtype: auto or fp8")
	depth := flag.Int("d", 0, "cached tokens before the generated ones (llama-bench's depth)")
	random := flag.Float64("random", 0, "GB: random weights in memory (model.OpenRandom) for -model's config.json, at most this size")
	p := flag.Int("p", 128, "prompt tokens (pp)")
	n := flag.Int("n", 128, "generated tokens (tg)")
	reps := flag.Int("reps", 1, "timed repetitions of each test")
	prof := flag.String("cpuprofile", "", "write a CPU profile of the timed runs here")
	flag.Parse()
	kvd, err := engine.ParseKVDType(*kvType)
	if err == nil {
		open := model.Open
		if *random > 0 {
			open = func(dir string) (*model.Checkpoint, error) { return model.OpenRandom(dir, 1, int64(*random*1e9)) }
		}
		err = run(open, *path, *format, *prof, kvd, *threads, *p, *n, *depth, *reps)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cpubench:", err)
		os.Exit(1)
	}
}

// result is what cpubench prints.
type result struct {
	Model      string         `json:"model"`
	Format     string         `json:"format"`
	KVDType    string         `json:"kv_cache_dtype"`
	Depth      int            `json:"depth"`
	Threads    int            `json:"threads"`
	LoadS      float64        `json:"load_s"`
	WeightsGB  float64        `json:"weights_gb"`
	Formats    map[string]int `json:"formats"`
	PromptTPS  float64        `json:"prompt_tokens_per_s"`
	DecodeTPS  float64        `json:"decode_tokens_per_s"`
	PeakRSSGB  float64        `json:"peak_rss_gb"`
	PromptRuns []float64      `json:"prompt_runs"`
	DecodeRuns []float64      `json:"decode_runs"`
}

func run(open func(string) (*model.Checkpoint, error), path, format, prof string, kvd engine.KVDType, threads, p, n, depth, reps int) error {
	runtime.GOMAXPROCS(threads)
	f, err := cpu.ParseWeightFormat(format)
	if err != nil {
		return err
	}
	start := time.Now()
	c, err := open(path)
	if err != nil {
		return err
	}
	cfg := c.Config
	w, err := cpu.LoadWeights(c, f)
	if err != nil {
		return err
	}
	defer w.Release()
	res := result{Model: path, Format: format, KVDType: kvd.String(), Depth: depth, Threads: threads, LoadS: time.Since(start).Seconds(),
		WeightsGB: float64(w.Bytes()) / 1e9, Formats: w.Formats()}
	const perBlock = 64
	blocks := make([]int32, (max(p, depth+n)+perBlock)/perBlock)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	e, err := cpu.New(w, engine.KVConfig{NumBlocks: len(blocks), TokensPerBlock: perBlock, MaxSeqLen: min(cfg.MaxPositions, len(blocks)*perBlock), DType: kvd})
	if err != nil {
		return err
	}
	defer e.Close()
	if prof != "" { // after loading, which the profile leaves out
		f, err := os.Create(prof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]int32, p)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(cfg.VocabSize))
	}
	pp := func() (float64, error) {
		t := time.Now()
		if _, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: prompt, Blocks: blocks, Sample: true, History: prompt}}}); err != nil {
			return 0, err
		}
		return float64(p) / time.Since(t).Seconds(), nil
	}
	if depth+n > cfg.MaxPositions {
		return fmt.Errorf("-d %d and -n %d pass the model's %d positions", depth, n, cfg.MaxPositions)
	}
	ctx := make([]int32, depth)
	for i := range ctx {
		ctx[i] = int32(rng.IntN(cfg.VocabSize))
	}
	tg := func() (float64, error) {
		tok := int32(1)
		history := slices.Clone(ctx)
		if depth > 0 { // the depth's prompt, untimed
			if _, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: ctx, Blocks: blocks}}}); err != nil {
				return 0, err
			}
		}
		t := time.Now()
		for i := range n {
			history = append(history, tok)
			outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: []int32{tok}, Pos: depth + i, Blocks: blocks,
				Sample: true, History: history, NumGenerated: i}}})
			if err != nil {
				return 0, err
			}
			tok = outs[0].Token
		}
		return float64(n) / time.Since(t).Seconds(), nil
	}
	for i := 0; i <= reps; i++ {
		a, err := pp()
		if err != nil {
			return err
		}
		b, err := tg()
		if err != nil {
			return err
		}
		if i > 0 { // the first is the warm-up
			res.PromptRuns = append(res.PromptRuns, a)
			res.DecodeRuns = append(res.DecodeRuns, b)
		}
	}
	res.PromptTPS, res.DecodeTPS = median(res.PromptRuns), median(res.DecodeRuns)
	if hwm, err := peakRSS(); err == nil {
		res.PeakRSSGB = float64(hwm) / 1e9
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// median of v (v not empty).
func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// peakRSS reads the process's peak resident set (VmHWM) in bytes.
func peakRSS() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/self/status")
}

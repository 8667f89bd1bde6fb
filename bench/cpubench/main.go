// Command cpubench times gollm's CPU engine alone as llama.cpp's llama-bench times
// llama.cpp, so that bench/llamacpp.sh can run the two side by side on the same files:
//
//	cpubench -model FILE_OR_FOLDER [-format auto] [-threads 2] [-p 128] [-n 128] [-reps 1]
//
// pp<P> is one prompt step of P random tokens into an empty KV cache (prompt tokens per
// second); tg<N> is N single-token greedy steps from an empty cache (generated tokens per
// second), as llama-bench's pp and tg tests are. Each is run once to warm up, then -reps
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
	p := flag.Int("p", 128, "prompt tokens (pp)")
	n := flag.Int("n", 128, "generated tokens (tg)")
	reps := flag.Int("reps", 1, "timed repetitions of each test")
	prof := flag.String("cpuprofile", "", "write a CPU profile of the timed runs here")
	flag.Parse()
	if err := run(*path, *format, *prof, *threads, *p, *n, *reps); err != nil {
		fmt.Fprintln(os.Stderr, "cpubench:", err)
		os.Exit(1)
	}
}

// result is what cpubench prints.
type result struct {
	Model      string         `json:"model"`
	Format     string         `json:"format"`
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

func run(path, format, prof string, threads, p, n, reps int) error {
	runtime.GOMAXPROCS(threads)
	f, err := cpu.ParseWeightFormat(format)
	if err != nil {
		return err
	}
	start := time.Now()
	c, err := model.Open(path)
	if err != nil {
		return err
	}
	cfg := c.Config
	w, err := cpu.LoadWeights(c, f)
	if err != nil {
		return err
	}
	defer w.Release()
	res := result{Model: path, Format: format, Threads: threads, LoadS: time.Since(start).Seconds(),
		WeightsGB: float64(w.Bytes()) / 1e9, Formats: w.Formats()}
	const perBlock = 64
	blocks := make([]int32, (max(p, n)+perBlock)/perBlock)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	e, err := cpu.New(w, engine.KVConfig{NumBlocks: len(blocks), TokensPerBlock: perBlock, MaxSeqLen: min(cfg.MaxPositions, len(blocks)*perBlock)})
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
	tg := func() (float64, error) {
		tok := int32(1)
		history := []int32{}
		t := time.Now()
		for i := range n {
			history = append(history, tok)
			outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: []int32{tok}, Pos: i, Blocks: blocks,
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

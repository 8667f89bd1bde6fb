// specbench measures speculative decoding on the CPU engine, through the batch manager
// in this process (no tritonserver): tokens per second with speculation off and on,
// alternating within each round (the order swapped every round) on a shared machine,
// the median of the rounds, with the acceptance rate, the mean accepted length and the
// load average. It appends rows in bench/results' format (BENCH.md):
//
//	go run ./bench/specbench -out bench/results
//
// Workloads: prompt lookup on a prompt the answer copies from (copyingPrompt: a text,
// then its opening again, where the model's answer repeats the text), at batch 1; prompt lookup on a short prompt (the model's own
// repetitions) at batch 1; a draft model at batch 1 (-draft, by default the model
// itself: every proposal accepted, so the row shows the mechanism's cost and ceiling,
// not a trained pair's acceptance); prompt lookup at batch 64 (the policy's
// speculative_max_step_tokens turns it off there).
//
// -engine gpu runs the target and the draft on the CUDA engine instead (the library at
// $GOLLM_CUDA_LIB or build/libgollm_cuda.so, CUDA device 0), for the device machine:
//
//	go run ./bench/specbench -engine gpu -model <target> -draft <draft> -out bench/results
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gollm/batchmanager"
	"gollm/bridge/cuda"
	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/model"
	"gollm/speculate"
	"gollm/tokenizer"
)

// config is the command line.
type config struct {
	target, draft, out, passage string
	rounds, maxNew, k           int
	only                        string
	verbose                     bool
	// engine is "cpu" or "gpu"; lib the CUDA library's path.
	engine, lib string
	// overlap is the batch manager's overlap schedule: "on", "off", or "auto" (on for
	// the GPU engine, as the backend's overlap_scheduler defaults).
	overlap string
	// modes are the runs compared: off, and speculation under the adaptive policy
	// (speculative_adaptive, as served) and pinned on.
	modes []string
}

func main() {
	var c config
	flag.StringVar(&c.target, "model", "model_repository/austen/1", "the target checkpoint")
	flag.StringVar(&c.draft, "draft", "", "the draft checkpoint (default: the model itself)")
	flag.StringVar(&c.out, "out", "", "the results folder (bench/results); empty: print only")
	flag.StringVar(&c.passage, "passage", "demo/austen/heldout-sample.txt", "text the copy-heavy prompt is cut from")
	flag.IntVar(&c.rounds, "rounds", 5, "rounds of off/on runs (the median is kept)")
	flag.IntVar(&c.maxNew, "max-new", 128, "tokens generated per request at batch 1")
	flag.IntVar(&c.k, "k", 0, "num_speculative_tokens (0: 8 for prompt lookup, 4 for the draft model)")
	flag.StringVar(&c.only, "only", "", "run only the workloads whose name contains this")
	flag.BoolVar(&c.verbose, "v", false, "log every run")
	flag.StringVar(&c.engine, "engine", "cpu", "cpu or gpu")
	flag.StringVar(&c.lib, "lib", os.Getenv("GOLLM_CUDA_LIB"), "the CUDA library (-engine gpu; default build/libgollm_cuda.so)")
	flag.StringVar(&c.overlap, "overlap", "auto", "the overlap schedule, off and on alike: on, off, or auto (on for -engine gpu, as served)")
	modes := flag.String("modes", "off,adaptive,pinned", "the runs compared, off first: off, adaptive (speculative_adaptive true, as served), pinned (false)")
	flag.Parse()
	c.modes = strings.Split(*modes, ",")
	if c.modes[0] != "off" || len(c.modes) < 2 {
		log.Fatalf("-modes %q: want off first, then adaptive and/or pinned", *modes)
	}
	for _, m := range c.modes[1:] {
		if m != "adaptive" && m != "pinned" {
			log.Fatalf("-modes: %q is not adaptive or pinned", m)
		}
	}
	if c.draft == "" {
		c.draft = c.target
	}
	if err := run(c); err != nil {
		log.Fatal(err)
	}
}

// workload is one comparison: the requests and the proposer of the "on" runs.
type workload struct {
	name string
	reqs func() []*batchmanager.InferenceRequest
	// spec makes the "on" run's speculation (a fresh proposer each run).
	spec func() (batchmanager.Speculation, string, error)
}

// result is one run's figures.
type result struct {
	tokensPerS, acceptance, meanLen float64
	// cpuMsPerToken is the process's CPU time (user and system) per generated token: on
	// a machine shared with other work it moves less than the wall time.
	cpuMsPerToken float64
	// heldOff counts the measured pass's iterations the adaptive policy held off.
	heldOff float64
}

// cpuTime is the process's user and system time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func run(c config) error {
	m, err := model.LoadFloat32(c.target)
	if err != nil {
		return err
	}
	tok, err := tokenizer.Load(filepath.Join(c.target, "tokenizer.json"))
	if err != nil {
		return err
	}
	draftModel := m
	if c.draft != c.target {
		if draftModel, err = model.LoadFloat32(c.draft); err != nil {
			return err
		}
	}
	passage, err := os.ReadFile(c.passage)
	if err != nil {
		return err
	}
	text := tok.Encode(string(passage))
	copyPrompt, copied, err := copyingPrompt(m, text, tok.Encode("\n\n"), c.maxNew)
	if err != nil {
		return err
	}
	log.Printf("lookup_copy_b1: the answer copies the prompt for its first %d of %d tokens", copied, c.maxNew)
	plainPrompt := tok.EncodePrompt("It is a truth universally acknowledged")
	lookupK, draftK := 8, 4
	if c.k > 0 {
		lookupK, draftK = c.k, c.k
	}
	single := func(prompt []int32) func() []*batchmanager.InferenceRequest {
		return func() []*batchmanager.InferenceRequest {
			return []*batchmanager.InferenceRequest{{ID: 1, InputIDs: prompt, MaxNewTokens: c.maxNew, PadID: -1, Streaming: true}}
		}
	}
	lookup := func() (batchmanager.Speculation, string, error) {
		g, err := speculate.NewNGram(2, 4)
		return batchmanager.Speculation{Proposer: g, MaxDraft: lookupK}, fmt.Sprintf("prompt_lookup k=%d", lookupK), err
	}
	works := []workload{
		{"lookup_copy_b1", single(copyPrompt), lookup},
		{"lookup_plain_b1", single(plainPrompt), lookup},
		{"draft_b1", single(plainPrompt), func() (batchmanager.Speculation, string, error) {
			e, err := newEngine(c, c.draft, draftModel)
			if err != nil {
				return batchmanager.Speculation{}, "", err
			}
			d, err := speculate.NewDraft(e, m.Config.VocabSize)
			return batchmanager.Speculation{Proposer: d, MaxDraft: draftK}, fmt.Sprintf("draft_model %s k=%d", c.draft, draftK), err
		}},
		{"lookup_b64", func() []*batchmanager.InferenceRequest {
			var rs []*batchmanager.InferenceRequest
			for i := range 64 {
				p := text[i*7 : i*7+24]
				rs = append(rs, &batchmanager.InferenceRequest{ID: uint64(i + 1), InputIDs: p, MaxNewTokens: 64, PadID: -1})
			}
			return rs
		}, lookup},
	}
	date := time.Now().Format("2006-01-02")
	commit := "unknown"
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(out))
	}
	machine, dtype, suffix := cpuModel(), "fp32", "cpu"
	if c.engine == "gpu" {
		e, err := newEngine(c, c.target, m)
		if err != nil {
			return err
		}
		if g, ok := e.(*cuda.Engine); ok {
			machine = g.DeviceName
		}
		_ = e.Close()
		dtype, suffix = "fp16", "gpu"
	}
	var f *os.File
	if c.out != "" {
		path := filepath.Join(c.out, date+"-speculative-"+suffix+".jsonl")
		if f, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			return err
		}
		defer f.Close()
		log.Printf("appending to %s", path)
	}
	for _, w := range works {
		if c.only != "" && !strings.Contains(w.name, c.only) {
			continue
		}
		load0 := loadAvg()
		runs := make([][]result, len(c.modes))
		desc := ""
		// A warm-up of each.
		for _, mode := range c.modes {
			if _, _, err := measure(c, m, w, mode); err != nil {
				return err
			}
		}
		for r := range c.rounds {
			// The order turns every round.
			for j := range c.modes {
				i := (j + r) % len(c.modes)
				res, d, err := measure(c, m, w, c.modes[i])
				if err != nil {
					return err
				}
				if c.verbose {
					log.Printf("%s round %d: %s %s %.1f tokens/s, %.3f CPU ms/token", w.name, r, c.modes[i], d, res.tokensPerS, res.cpuMsPerToken)
				}
				runs[i] = append(runs[i], res)
				if i > 0 {
					desc = d
				}
			}
		}
		load := fmt.Sprintf("%s → %s", load0, loadAvg())
		tps := func(r result) float64 { return r.tokensPerS }
		cpuMs := func(r result) float64 { return r.cpuMsPerToken }
		mOff, cOff := medianOf(runs[0], tps), medianOf(runs[0], cpuMs)
		rows := []map[string]any{
			{"speculation": "off", "value": mOff, "metric": "tokens_per_s"},
			{"speculation": "off", "value": cOff, "metric": "cpu_ms_per_token"},
		}
		for i, mode := range c.modes[1:] {
			on := runs[i+1]
			mOn, cOn := medianOf(on, tps), medianOf(on, cpuMs)
			acc, ml := medianOf(on, func(r result) float64 { return r.acceptance }), medianOf(on, func(r result) float64 { return r.meanLen })
			held := medianOf(on, func(r result) float64 { return r.heldOff })
			log.Printf("%s: off %.1f tokens/s, %s (%s) %.1f tokens/s (%.2fx), acceptance %.3f, mean accepted length %.2f, %.0f iterations held off; load %s",
				w.name, mOff, mode, desc, mOn, mOn/mOff, acc, ml, held, load)
			log.Printf("%s: CPU time per token off %.3f ms, %s %.3f ms (%.2fx less)", w.name, cOff, mode, cOn, cOff/cOn)
			rows = append(rows,
				map[string]any{"speculation": desc, "policy": mode, "value": mOn, "metric": "tokens_per_s", "acceptance_rate": acc, "mean_accepted_length": ml, "speedup": mOn / mOff, "held_off_iterations": held},
				map[string]any{"speculation": desc, "policy": mode, "value": cOn, "metric": "cpu_ms_per_token", "acceptance_rate": acc, "mean_accepted_length": ml, "speedup": cOff / cOn, "held_off_iterations": held})
		}
		for _, row := range rows {
			row["impl"], row["date"], row["commit"], row["machine"] = "gollm-manager", date, commit, machine
			row["model"], row["dtype"], row["workload"] = modelName(c.target), dtype, w.name
			row["load_avg"], row["rounds"] = load, c.rounds
			row["overlap_scheduler"] = c.overlap == "on" || c.overlap == "auto" && c.engine == "gpu"
			if w.name == "lookup_copy_b1" {
				row["copied_tokens"] = copied
			}
			row["note"] = "batch manager and " + strings.ToUpper(c.engine) + " engine in one process (no tritonserver), greedy; off and on (policy adaptive: speculative_adaptive true, as served; pinned: false) in turn, median of the rounds; each run's manager serves the workload once unmeasured first (the adaptive policy learns as a served instance would), then measured; batch 1 (streaming): the decode rate, tokens after the first over the time from the first response to the last, batch 64: generated tokens over the wall time"
			if f != nil {
				line, err := json.Marshal(row)
				if err != nil {
					return err
				}
				if _, err := f.Write(append(line, '\n')); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// copyingPrompt is a prompt whose greedy answer copies a text in it, as an edit or a
// summary quoting its source does: an Austen passage's opening, a text, a blank line and
// the opening again. A small model does not copy a passage it is shown (it continues in
// its own words), so the text is the model's own continuation of the opening, revised
// until the answer repeats it: each round's text is the answer to the previous round's
// prompt, and the prompt whose answer repeats the longest run of its text is kept, with
// that run's length (copied; at most n, the answer's length). Greedy decoding on the CPU
// engine (float32); the GPU's fp16 answer may part from it sooner.
func copyingPrompt(m *model.Float32, text, sep []int32, n int) ([]int32, int, error) {
	e, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: 64, TokensPerBlock: 64})
	if err != nil {
		return nil, 0, err
	}
	defer e.Close()
	blocks := make([]int32, 64)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	greedy := func(prompt []int32) ([]int32, error) {
		hist := slices.Clone(prompt)
		toks, pos := prompt, 0
		for range n {
			outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: toks, Pos: pos, Blocks: blocks, Sample: true, History: hist}}})
			if err != nil {
				return nil, err
			}
			pos += len(toks)
			hist = append(hist, outs[0].Token)
			toks = hist[len(hist)-1:]
		}
		return hist[len(prompt):], nil
	}
	var best []int32
	copied := -1
	for _, at := range []int{200, 0, 600, 1200} {
		if at+60 > len(text) || 2*(60+n)+len(sep) > 64*64 {
			continue
		}
		open := text[at : at+60]
		doc, err := greedy(open)
		if err != nil {
			return nil, 0, err
		}
		for range 8 {
			p := append(append(append(slices.Clone(open), doc...), sep...), open...)
			ans, err := greedy(p)
			if err != nil {
				return nil, 0, err
			}
			run := 0
			for run < n && ans[run] == doc[run] {
				run++
			}
			if run > copied {
				best, copied = p, run
			}
			if copied >= n*9/10 {
				return best, copied, nil
			}
			doc = ans
		}
	}
	if best == nil {
		return nil, 0, fmt.Errorf("specbench: the passage is too short for a copying prompt")
	}
	return best, copied, nil
}

// newEngine makes an engine of c's kind on the checkpoint dir (m: its float32 weights,
// for the CPU engine).
func newEngine(c config, dir string, m *model.Float32) (engine.Engine, error) {
	if c.engine != "gpu" {
		return cpu.NewFromModel(m, engine.KVConfig{NumBlocks: 256, TokensPerBlock: 64})
	}
	lib := c.lib
	if lib == "" {
		lib = filepath.Join("build", cuda.LibraryName)
	}
	ck, err := model.Open(dir)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	return cuda.New(ck, cuda.Options{Library: lib, NumBlocks: 256, TokensPerBlock: 64, MaxSeqs: 64})
}

// measure runs w's requests twice on one manager over a fresh engine — a pass
// unmeasured, then the measured one — with speculation by mode (off, adaptive, pinned).
func measure(c config, m *model.Float32, w workload, mode string) (result, string, error) {
	e, err := newEngine(c, c.target, m)
	if err != nil {
		return result{}, "", err
	}
	defer e.Close()
	cfg := batchmanager.Config{Overlap: c.overlap == "on" || c.overlap == "auto" && c.engine == "gpu"}
	desc := "off"
	if mode != "off" {
		if cfg.Speculation, desc, err = w.spec(); err != nil {
			return result{}, "", err
		}
		cfg.Speculation.Adaptive = mode == "adaptive"
	}
	done := make(chan error, 64)
	generated := 0
	// A batch-1 request's decode rate: its tokens after the first over the time between
	// its first response (after the prompt's step) and its last.
	var first, end time.Time
	var queue []*batchmanager.InferenceRequest
	var last batchmanager.Stats
	var mu sync.Mutex
	mgr, err := batchmanager.New(e, cfg, batchmanager.Callbacks{
		GetInferenceRequests: func(int) []*batchmanager.InferenceRequest {
			mu.Lock()
			defer mu.Unlock()
			q := queue
			queue = nil
			return q
		},
		SendResponse: func(_ uint64, res batchmanager.Result, final bool, err error) {
			mu.Lock()
			defer mu.Unlock()
			if first.IsZero() {
				first = time.Now()
			}
			if final {
				generated += res.Generated
				end = time.Now()
				done <- err
			}
		},
		IterationStats: func(s batchmanager.Stats) {
			mu.Lock()
			last = s
			mu.Unlock()
		},
	}, nil)
	if err != nil {
		return result{}, "", err
	}
	defer mgr.Shutdown()
	pass := func(id0 uint64) (time.Duration, time.Duration, int, error) {
		reqs := w.reqs()
		for _, r := range reqs {
			r.ID += id0
		}
		mu.Lock()
		first, generated, queue = time.Time{}, 0, reqs
		mu.Unlock()
		start, cpu0 := time.Now(), cpuTime()
		mgr.Wake()
		for range reqs {
			if err := <-done; err != nil {
				return 0, 0, 0, err
			}
		}
		return time.Since(start), cpuTime() - cpu0, len(reqs), nil
	}
	if _, _, _, err := pass(0); err != nil {
		return result{}, "", err
	}
	mu.Lock()
	before := last
	mu.Unlock()
	elapsed, cpuUsed, n, err := pass(1000)
	if err != nil {
		return result{}, "", err
	}
	mu.Lock()
	defer mu.Unlock()
	r := result{tokensPerS: float64(generated) / elapsed.Seconds(), cpuMsPerToken: cpuUsed.Seconds() * 1000 / float64(generated)}
	if n == 1 && end.After(first) {
		r.tokensPerS = float64(generated-1) / end.Sub(first).Seconds()
	}
	drafted := last.DraftTokensTotal - before.DraftTokensTotal
	accepted := last.AcceptedDraftTokensTotal - before.AcceptedDraftTokensTotal
	steps := last.SpeculativeStepsTotal - before.SpeculativeStepsTotal
	if drafted > 0 {
		r.acceptance = float64(accepted) / float64(drafted)
	}
	if steps > 0 {
		r.meanLen = float64(accepted+steps) / float64(steps)
	}
	r.heldOff = float64(last.SpeculationHeldOffTotal - before.SpeculationHeldOffTotal)
	return r, desc, nil
}

// medianOf is the median of f over rs.
func medianOf(rs []result, f func(result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}

// loadAvg is the 1-minute load average.
func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(raw))[0]
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

// modelName names a checkpoint folder for the rows: its folder, with its parent for a
// version folder (model_repository/austen/1 → austen).
func modelName(dir string) string {
	base := filepath.Base(dir)
	if _, err := strconv.Atoi(base); err == nil {
		return filepath.Base(filepath.Dir(dir))
	}
	return base
}

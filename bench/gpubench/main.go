// Command gpubench times gollm's GPU engine alone on static batches of random prompts
// and prints one JSON object per figure (BENCH.md's fields less date, commit and
// machine, which bench/gpu_peers.py adds):
//
//	gpubench -ckpt DIR -model gpt2-124M -workloads decode_b1_i128_o128,tput_b64_i128_o128
//
// Workloads: decode_b<B>_i<I>_o<O> reports decode milliseconds per token (the steps
// after the first token, whose time is the prompt's), tput_… generated tokens per second
// over the whole run, lat_… the whole run's latency in milliseconds (the FasterTransformer
// tables), beam<W>_… generated tokens per second (B × O: the best beam's) of B
// requests of beam width W through the batch manager, as a server runs them (each beam
// a sequence of the step; beams fork their parents' KV blocks). Each is run once to warm
// up (CUDA graph capture), then -reps times; the median is reported. Sampling is greedy
// (or beam search) with no end token, so every run generates exactly O tokens per
// sequence. serve_… reports generated tokens per second of B plain requests queued at
// once through the batch manager (what a server adds on top of the engine, less
// Triton). guided_… is serve_… with every request under a guided decoding constraint
// (-guide-regex, over the checkpoint's tokenizer.json; its default allows any text, so
// that every request still generates O tokens and the figure sets the masks' cost — the
// host's per step and the GPU's upload and masking — beside serve_'s, with or without
// -overlap). -overlap runs the static workloads with each decode step launched before the
// previous one is read, fed on the GPU (engine.Pipeliner), and the batch manager's
// workloads with its overlap schedule (guided steps launched without their masks, which
// come while the forward pass runs: engine.LateMasker). -tp N splits the model over GPUs 0..N-1 (tensor
// parallelism, NCCL); its figures carry "tp" and an impl ending in -tpN; with
// -expert-parallel each GPU holds its share of a mixture's experts whole (impl -tpN-ep,
// "expert_parallel": true). -random-gb N
// gives the model of -ckpt's config.json random weights in memory (at most N GB; no
// weight files read), for full-size shapes whose files would not fit the disk.
//
// load_c<C>_n<N>_i<I>_o<O> runs N streaming greedy requests through the batch manager
// (the overlap schedule with -overlap, chunked prompts under a -max-num-tokens budget a
// step, at most -max-batch sequences a step) as a server drives it: C in flight at once,
// the next offered as one ends, or with C = 0 all N offered at once (max load, as
// trtllm-bench's throughput mode). It reports output tokens per second over the run and
// the time to the first token and the gap between tokens at p50, p90 and p99
// (bench/loadstat), each row with "requests" and "concurrency"; the workload is
// maxload_i<I>_o<O> or load_c<C>_i<I>_o<O>. It runs once, after a short warm-up load of
// its own shape (every decode bucket is captured at engine creation), and with any load
// workload the KV pool is sized from the free memory (-kv-fraction), not from the
// workloads. A run's tokens/s row also says how its steps went: how many and how full,
// the engine's time a step, and the steps with prompt tokens apart from decode-only ones
// (iterations_context, iterations_decode and each kind's wall time from one step's start
// to the next's, wall_ms_per_iteration_context and _decode).
// -quantization fp8 loads the projections in FP8 (128×128 block scales, quantized at
// load); its figures carry dtype "fp8" (the activations in -dtype). -kv-cache-dtype fp8
// stores the KV cache as float8_e4m3fn (kv_cache_dtype: the checkpoint's k_scale and
// v_scale, 1 where it has none, as random weights); its figures' impl ends in -kvfp8.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"gollm/batchmanager"
	"gollm/bench/loadstat"
	"gollm/bridge/cuda"
	"gollm/engine"
	"gollm/guide"
	"gollm/model"
	"gollm/tokenizer"
)

// overlap is -overlap.
var overlap bool

// batchInvariant is -batch-invariant.
var batchInvariant bool

// guideRegex is -guide-regex.
var guideRegex string

// maxBatch, maxNumTokens and kvFraction are -max-batch, -max-num-tokens and -kv-fraction.
var (
	maxBatch, maxNumTokens int
	kvFraction             float64
)

// quantization is -quantization: "fp8" loads the projections in FP8.
var quantization string

// kvDType is -kv-cache-dtype.
var kvDType string

// expertParallel is -expert-parallel: under -tp, the experts whole, E/tp a GPU.
var expertParallel bool

// benchEngine is what the workloads run on: a GPU engine, or a tensor-parallel one.
type benchEngine interface {
	engine.Engine
	engine.Pipeliner
}

// workload is a parsed workload name.
type workload struct {
	// name is as given.
	name string
	// kind is decode, tput, lat or beam.
	kind string
	// width holds a beam<W>_ workload's beam width, 1 otherwise.
	width int
	// batch, in and out are the batch size, prompt length and new tokens.
	batch, in, out int
}

func parseWorkload(s string) (workload, error) {
	w := workload{name: s}
	i := strings.IndexByte(s, '_')
	if i < 0 {
		return w, fmt.Errorf("workload %q: want kind_b<B>_i<I>_o<O>", s)
	}
	w.kind = s[:i]
	if _, err := fmt.Sscanf(s[i+1:], "b%d_i%d_o%d", &w.batch, &w.in, &w.out); err != nil || w.batch < 1 || w.in < 1 || w.out < 2 {
		return w, fmt.Errorf("workload %q: want kind_b<B>_i<I>_o<O> with O ≥ 2", s)
	}
	if n, err := fmt.Sscanf(w.kind, "beam%d", &w.width); err == nil && n == 1 && w.width >= 2 {
		w.kind = "beam"
		return w, nil
	}
	if w.kind != "decode" && w.kind != "tput" && w.kind != "lat" && w.kind != "serve" && w.kind != "guided" {
		return w, fmt.Errorf("workload %q: kind %q is not decode, tput, lat, serve, guided or beam<W> (W ≥ 2)", s, w.kind)
	}
	return w, nil
}

func main() {
	ckptDir := flag.String("ckpt", "", "checkpoint folder")
	name := flag.String("model", "", "model name for the results")
	list := flag.String("workloads", "decode_b1_i128_o128", "comma-separated workloads")
	reps := flag.Int("reps", 5, "timed repetitions per workload")
	dtype := flag.String("dtype", "float16", "float16 or bfloat16")
	lib := flag.String("lib", "", "path of libgollm_cuda.so")
	graphs := flag.Bool("graphs", true, "replay CUDA graphs (decode and prompt steps)")
	warmup := flag.Bool("warmup", true, "warm the engine up at creation (false: fewer kernels for a profiler)")
	flag.BoolVar(&overlap, "overlap", false, "launch each step before reading the previous one (the overlap schedule)")
	tp := flag.Int("tp", 1, "tensor_parallel_size: split the model over GPUs 0..tp-1")
	randomGB := flag.Float64("random-gb", 0, "> 0: random weights for -ckpt's config.json, at most this many GB")
	flag.BoolVar(&batchInvariant, "batch-invariant", false, "batch invariance on (batch_invariant)")
	flag.StringVar(&guideRegex, "guide-regex", `[^\x00]*`, "the guided workloads' constraint (a regular expression)")
	flag.IntVar(&maxBatch, "max-batch", 1024, "load workloads: the batch manager's max_batch_size (the engine's MaxSeqs)")
	flag.IntVar(&maxNumTokens, "max-num-tokens", 8192, "load workloads: the most tokens a step (chunked prompts fill what decode leaves)")
	flag.Float64Var(&kvFraction, "kv-fraction", 0.9, "load workloads: the share of the free GPU memory the KV pool takes")
	flag.StringVar(&quantization, "quantization", "", "fp8: the projections in FP8, quantized at load")
	flag.StringVar(&kvDType, "kv-cache-dtype", "auto", "the KV cache's element type: auto (the compute type) or fp8 (float8_e4m3fn)")
	flag.BoolVar(&expertParallel, "expert-parallel", false, "with -tp: expert parallelism (each GPU E/tp experts whole)")
	flag.Parse()
	if expertParallel && *tp < 2 {
		fmt.Fprintln(os.Stderr, "gpubench: -expert-parallel needs -tp 2 or more")
		os.Exit(2)
	}
	if err := run(*ckptDir, *name, *list, *reps, *dtype, *lib, *graphs, *warmup, *tp, *randomGB); err != nil {
		fmt.Fprintln(os.Stderr, "gpubench:", err)
		os.Exit(1)
	}
}

func run(ckptDir, name, list string, reps int, dtype, lib string, graphs, warmup bool, tp int, randomGB float64) error {
	var ws []workload
	var loads []loadstat.Load
	maxTok, maxSeqs, maxLen := 0, 0, 0
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if loadstat.IsLoad(s) {
			l, err := loadstat.Parse(s)
			if err != nil {
				return err
			}
			loads = append(loads, l)
			maxSeqs = max(maxSeqs, min(l.InFlight(), maxBatch))
			maxLen = max(maxLen, l.In+l.Out)
			continue
		}
		w, err := parseWorkload(s)
		if err != nil {
			return err
		}
		ws = append(ws, w)
		maxTok = max(maxTok, w.batch*w.in)
		maxSeqs = max(maxSeqs, w.batch*max(1, w.width))
		maxLen = max(maxLen, w.in+w.out)
	}
	open := model.Open
	if randomGB > 0 {
		open = func(dir string) (*model.Checkpoint, error) { return model.OpenRandom(dir, 1, int64(randomGB*1e9)) }
	}
	ckpt, err := open(ckptDir)
	if err != nil {
		return err
	}
	defer ckpt.Close()
	kvd, err := engine.ParseKVDType(kvDType)
	if err != nil {
		return fmt.Errorf("-kv-cache-dtype: %w", err)
	}
	var ks, vs []float32
	if kvd == engine.KVFP8 {
		if ks, vs, err = ckpt.KVScales(); err != nil {
			return err
		}
	}
	const T = 64
	perSeq := (maxLen + T - 1) / T
	// Twice the blocks of maxSeqs sequences: a beam writes into a copy of a block it
	// shares with its siblings.
	opts := cuda.Options{DType: dtype, Quantization: quantization, Library: lib, TokensPerBlock: T,
		NumBlocks: 2 * perSeq * maxSeqs, MaxTokens: max(maxTok, 8192), MaxSeqs: max(maxSeqs, 64),
		DisableCUDAGraphs: !graphs, SkipWarmup: !warmup, BatchInvariant: batchInvariant, ExpertParallel: expertParallel,
		Tuning: cuda.TuningFromEnv(), KVDType: kvd, KScales: ks, VScales: vs}
	if len(loads) > 0 {
		// As a server sizes it: what the weights and scratch leave. The batch manager
		// admits what fits.
		opts.NumBlocks, opts.KVFreeFraction = 0, kvFraction
		opts.MaxTokens = max(maxTok, maxNumTokens)
	}
	var eng benchEngine
	start := time.Now()
	if tp > 1 {
		devices := make([]int, tp)
		for i := range devices {
			devices[i] = i
		}
		t, err := cuda.NewTensorParallel(ckpt, devices, opts)
		if err != nil {
			return err
		}
		var weights int64
		for r := range tp {
			w, _, _ := t.Memory(r)
			weights += w
		}
		split := "tensor parallel"
		if expertParallel {
			split += ", experts whole"
		}
		fmt.Fprintf(os.Stderr, "gpubench: %s over %d × %s (%s), weights %.1f MB in all, ready in %.1f s\n",
			name, tp, t.DeviceName(), split, float64(weights)/1e6, time.Since(start).Seconds())
		eng = t
	} else {
		e, err := cuda.New(ckpt, opts)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "gpubench: %s on %s, weights %.1f MB, ready in %.1f s\n", name, e.DeviceName,
			float64(e.WeightBytes)/1e6, time.Since(start).Seconds())
		fmt.Fprintf(os.Stderr, "gpubench: at most %d sequences a step: scratch %.2f GB, KV pool %.2f GB (%d blocks); warm-up %d GEMM shapes (%d timed in %.1f s) and %d decode graphs in %.1f s\n",
			opts.MaxSeqs, float64(e.ScratchBytes)/1e9, float64(e.KVBytes)/1e9, e.Info().NumBlocks,
			e.WarmupGEMMShapes, e.WarmupGEMMTuned, e.WarmupTuneTime.Seconds(), e.WarmupGraphs, e.WarmupTime.Seconds())
		eng = e
	}
	defer eng.Close()
	// The weights are on the GPU: the host's copies (random ones: the model's size) go.
	if err := ckpt.Close(); err != nil {
		return err
	}
	impl := "gollm-engine"
	if !graphs {
		impl = "gollm-engine-nographs"
	}
	if overlap {
		impl += "-overlap"
	}
	if tp > 1 {
		impl += fmt.Sprintf("-tp%d", tp)
	}
	if expertParallel {
		impl += "-ep"
	}
	if kvd == engine.KVFP8 {
		impl += "-kvfp8"
	}
	short := map[string]string{"float16": "fp16", "bfloat16": "bf16"}[dtype]
	if quantization != "" {
		short = quantization
	}
	for _, l := range loads {
		if err := runLoadWorkload(eng, l, name, short, impl); err != nil {
			return fmt.Errorf("%s: %w", l.Name, err)
		}
	}
	for _, w := range ws {
		rng := rand.New(rand.NewPCG(uint64(w.batch), uint64(w.in)))
		prompts := make([][]int32, w.batch)
		for i := range prompts {
			prompts[i] = make([]int32, w.in)
			for j := range prompts[i] {
				prompts[i][j] = int32(rng.IntN(eng.Info().VocabSize))
			}
		}
		var totals, decodes, launches []float64
		for r := 0; r <= reps; r++ {
			var total, decode float64
			var err error
			switch {
			case w.kind == "beam":
				total, err = beams(eng, prompts, w.width, w.out)
			case w.kind == "serve":
				total, err = serve(eng, prompts, w.out, nil)
			case w.kind == "guided":
				g, gerr := guideFor(ckptDir, eng.Info().VocabSize)
				if gerr != nil {
					return gerr
				}
				total, err = serve(eng, prompts, w.out, g)
			case overlap:
				total, decode, err = staticOverlap(eng, prompts, w.out, perSeq)
			default:
				total, decode, err = static(eng, prompts, w.out, perSeq)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", w.name, err)
			}
			if r > 0 { // the first run warms up
				totals = append(totals, total)
				decodes = append(decodes, decode)
				launches = append(launches, promptLaunch.Seconds())
			}
		}
		total, decode := median(totals), median(decodes)
		out := map[string]any{"model": name, "dtype": short, "workload": w.name, "impl": impl}
		if tp > 1 {
			out["tp"] = tp
		}
		if expertParallel {
			out["expert_parallel"] = true
		}
		switch w.kind {
		case "decode":
			out["metric"], out["value"] = "ms_per_token", decode*1e3/float64(w.out-1)
		case "tput", "beam", "serve", "guided":
			out["metric"], out["value"] = "tokens_per_s", float64(w.batch*w.out)/total
		case "lat":
			out["metric"], out["value"] = "latency_ms", total*1e3
			// The prompt step's share, to set beside tritonbench's time to the first token.
			out["prompt_ms"] = (total - decode) * 1e3
			if overlap {
				out["prompt_launch_ms"] = median(launches) * 1e3
			}
		}
		j, _ := json.Marshal(out)
		fmt.Println(string(j))
	}
	return nil
}

// static runs one static batch: every prompt prefilled in one step (which samples the
// first token), then out-1 decode steps. It returns the whole time and the decode steps'
// time, in seconds.
func static(eng benchEngine, prompts [][]int32, out, perSeq int) (float64, float64, error) {
	seqs, outs, start, err := prefill(eng, prompts, perSeq)
	if err != nil {
		return 0, 0, err
	}
	decodeStart := time.Now()
	next := make([]int32, len(prompts))
	for s := 1; s < out; s++ {
		for i := range seqs {
			next[i] = outs[i].Token
			seqs[i].Tokens = next[i : i+1]
			seqs[i].Pos = len(prompts[i]) + s - 1
			seqs[i].NumGenerated = s
		}
		if outs, err = eng.Step(&engine.Batch{Seqs: seqs}); err != nil {
			return 0, 0, err
		}
	}
	end := time.Now()
	return end.Sub(start).Seconds(), end.Sub(decodeStart).Seconds(), nil
}

// prefill starts a static batch: its sequences (staticSeqs) and their prompt step,
// which samples the first tokens, timed from start.
// With -overlap the step is launched and then waited for, and promptLaunch keeps how long
// the launch took: the host's share of the prompt step (enqueueing its kernels).
func prefill(eng benchEngine, prompts [][]int32, perSeq int) (seqs []engine.Sequence, outs []engine.Output, start time.Time, err error) {
	seqs = staticSeqs(prompts, perSeq)
	start = time.Now()
	if !overlap {
		outs, err = eng.Step(&engine.Batch{Seqs: seqs})
		return seqs, outs, start, err
	}
	if err = eng.Launch(&engine.Batch{Seqs: seqs}); err != nil {
		return seqs, nil, start, err
	}
	promptLaunch = time.Since(start)
	outs, err = eng.Wait()
	return seqs, outs, start, err
}

// promptLaunch is the last prefill's launch time (with -overlap).
var promptLaunch time.Duration

// staticSeqs are the greedy sequences of a static batch, each prompt with blocks of its
// own.
func staticSeqs(prompts [][]int32, perSeq int) []engine.Sequence {
	seqs := make([]engine.Sequence, len(prompts))
	for i, p := range prompts {
		blocks := make([]int32, perSeq)
		for k := range blocks {
			blocks[k] = int32(i*perSeq + k)
		}
		seqs[i] = engine.Sequence{ID: uint64(i), Tokens: p, Blocks: blocks, Sample: true,
			Sampling: engine.SamplingParams{}, History: p}
	}
	return seqs
}

// beams runs one request of beam width W per prompt through a batch manager, all queued
// at once, and returns the seconds until the last final response.
func beams(eng benchEngine, prompts [][]int32, width, out int) (float64, error) {
	queue := make([]*batchmanager.InferenceRequest, len(prompts))
	for i, p := range prompts {
		queue[i] = &batchmanager.InferenceRequest{ID: uint64(i + 1), InputIDs: p, MaxNewTokens: out, PadID: -1,
			BeamWidth: width, ExcludeInputInOutput: true}
	}
	return runManager(eng, queue, len(prompts)*width, func(_ uint64, res batchmanager.Result, final bool) error {
		if final && len(res.Beams) > 0 && len(res.Beams[0].Tokens) != out {
			return fmt.Errorf("a best beam of %d tokens, want %d", len(res.Beams[0].Tokens), out)
		}
		return nil
	})
}

// runManager runs queue through a batch manager of maxBatch sequences (the overlap
// schedule with -overlap), all queued at once, and returns the seconds until the last
// final response; check sees every response and may fail the run.
func runManager(eng benchEngine, queue []*batchmanager.InferenceRequest, maxBatch int,
	check func(id uint64, res batchmanager.Result, final bool) error) (float64, error) {
	n := len(queue)
	done := make(chan error, n)
	var mu sync.Mutex
	start := time.Now()
	m, err := batchmanager.New(eng, batchmanager.Config{MaxBatchSize: maxBatch, Overlap: overlap}, batchmanager.Callbacks{
		GetInferenceRequests: func(max int) []*batchmanager.InferenceRequest {
			mu.Lock()
			defer mu.Unlock()
			k := len(queue)
			if max >= 0 {
				k = min(k, max)
			}
			q := queue[:k]
			queue = queue[k:]
			return q
		},
		SendResponse: func(id uint64, res batchmanager.Result, final bool, err error) {
			if err == nil {
				err = check(id, res, final)
			}
			if err != nil {
				done <- err
			} else if final {
				done <- nil
			}
		},
	}, nil)
	if err != nil {
		return 0, err
	}
	defer m.Shutdown()
	for range n {
		if err := <-done; err != nil {
			return 0, err
		}
	}
	return time.Since(start).Seconds(), nil
}

// staticOverlap is static with every decode step launched before the one before it is
// read: step s+1's tokens are fed on the GPU from step s's sampling.
func staticOverlap(eng benchEngine, prompts [][]int32, out, perSeq int) (float64, float64, error) {
	seqs, outs, start, err := prefill(eng, prompts, perSeq)
	if err != nil {
		return 0, 0, err
	}
	decodeStart := time.Now()
	// Step 1's tokens are known on the host; every later step is fed on the GPU.
	next := make([]int32, len(prompts))
	placeholder := []int32{0}
	for i := range seqs {
		next[i] = outs[i].Token
		seqs[i].Tokens, seqs[i].Pos, seqs[i].NumGenerated = next[i:i+1], len(prompts[i]), 1
	}
	if err := eng.Launch(&engine.Batch{Seqs: seqs}); err != nil {
		return 0, 0, err
	}
	for s := 2; s < out; s++ {
		for i := range seqs {
			seqs[i].Tokens, seqs[i].Pos, seqs[i].NumGenerated, seqs[i].Feed = placeholder, len(prompts[i])+s-1, s, i+1
		}
		if err := eng.Launch(&engine.Batch{Seqs: seqs}); err != nil {
			return 0, 0, err
		}
		if _, err := eng.Wait(); err != nil {
			return 0, 0, err
		}
	}
	if _, err := eng.Wait(); err != nil {
		return 0, 0, err
	}
	end := time.Now()
	return end.Sub(start).Seconds(), end.Sub(decodeStart).Seconds(), nil
}

// serve runs one plain greedy request per prompt through a batch manager, all queued at
// once, and returns the seconds until the last final response.
func serve(eng benchEngine, prompts [][]int32, out int, g *guide.Guide) (float64, error) {
	queue := make([]*batchmanager.InferenceRequest, len(prompts))
	for i, p := range prompts {
		queue[i] = &batchmanager.InferenceRequest{ID: uint64(i + 1), InputIDs: p, MaxNewTokens: out, PadID: -1,
			ExcludeInputInOutput: true, Streaming: true, Guide: g}
	}
	got := make([]int, len(prompts)+1)
	return runManager(eng, queue, len(prompts), func(id uint64, res batchmanager.Result, final bool) error {
		got[id] += res.Length
		if final && got[id] != out {
			return fmt.Errorf("request %d: %d tokens, want %d", id, got[id], out)
		}
		return nil
	})
}

// guideFor compiles -guide-regex over the checkpoint's tokenizer, with every state's
// table made before the timing (a served constraint's are, after its first requests).
func guideFor(dir string, vocab int) (*guide.Guide, error) {
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("guided workloads need the checkpoint's tokenizer.json: %w", err)
	}
	tb, err := tok.TokenBytes()
	if err != nil {
		return nil, err
	}
	v, err := guide.NewVocab(tb, vocab)
	if err != nil {
		return nil, err
	}
	g, err := guide.NewCompiler(v, 0).Guide(guide.KindRegex, guideRegex)
	if err != nil {
		return nil, err
	}
	return g, g.Precompute()
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}

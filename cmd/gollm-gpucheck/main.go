// Command gollm-gpucheck runs prompts through the GPU engine and writes what it produced
// (greedy tokens, prompt and decode-step logits) to a safetensors file, for
// tests/gpu/check.py to compare with Hugging Face transformers on the same checkpoint.
//
//	gollm-gpucheck -ckpt DIR -dtype float16 -prompts prompts.json -out gollm.safetensors
//
// Each prompt runs alone (prefill, then -steps greedy decode steps), then all of them run
// as one in-flight batch twice: joining at staggered iterations so that prompts and decode
// steps share iterations, once without logits (decode iterations replay CUDA graphs) and
// once returning the logits of the first -logit-prompts prompts (kernel by kernel). The
// first prompts are also prefilled in chunks of 7 tokens. With -sampling it also runs the
// CPU engine beside the GPU engine on the same batches with varied sampling parameters
// and prints how often their tokens agree.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"os"
	"time"

	"gollm/bridge/cuda"
	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/engine/enginetest"
	"gollm/model"
)

// options are the command's flags.
type options struct {
	// ckpt names the checkpoint folder (config.json, safetensors).
	ckpt string
	// dtype picks the GPU's compute type: float16 or bfloat16.
	dtype string
	// prompts is a JSON file {"prompts": [[ids…], …]}.
	prompts string
	// out receives the tokens and logits, for check.py.
	out string
	// steps is the number of decode steps after each prompt.
	steps int
	// logitPrompts is how many prompts keep their logits.
	logitPrompts int
	// sampling runs the CPU-vs-GPU sampling comparison.
	sampling bool
	// invariant is -batch-invariant.
	invariant bool
	// lib is libgollm_cuda.so's path ("" searches).
	lib string
}

func main() {
	var o options
	flag.StringVar(&o.ckpt, "ckpt", "", "checkpoint folder")
	flag.StringVar(&o.dtype, "dtype", "float16", "float16 or bfloat16")
	flag.StringVar(&o.prompts, "prompts", "", "JSON file {\"prompts\": [[ids...], ...]}")
	flag.StringVar(&o.out, "out", "gollm.safetensors", "output safetensors file")
	flag.IntVar(&o.steps, "steps", 32, "decode steps per prompt")
	flag.IntVar(&o.logitPrompts, "logit-prompts", 8, "prompts whose logits are written")
	flag.BoolVar(&o.sampling, "sampling", false, "compare sampling with the CPU engine")
	flag.BoolVar(&o.invariant, "batch-invariant", false, "batch invariance on (the engine's BatchInvariant)")
	flag.StringVar(&o.lib, "lib", "", "path of libgollm_cuda.so")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "gollm-gpucheck:", err)
		os.Exit(1)
	}
}

// blockPool hands out KV block ids in a shuffled order, so that block tables are not
// contiguous.
type blockPool struct {
	// free lists the free ids.
	free []int32
}

func newBlockPool(n int, rng *rand.Rand) *blockPool {
	p := &blockPool{free: make([]int32, n)}
	for i := range p.free {
		p.free[i] = int32(i)
	}
	rng.Shuffle(n, func(i, j int) { p.free[i], p.free[j] = p.free[j], p.free[i] })
	return p
}

func (p *blockPool) take(n int) ([]int32, error) {
	if n > len(p.free) {
		return nil, fmt.Errorf("KV pool exhausted: need %d blocks, %d free", n, len(p.free))
	}
	b := append([]int32(nil), p.free[len(p.free)-n:]...)
	p.free = p.free[:len(p.free)-n]
	return b, nil
}

func (p *blockPool) give(b []int32) { p.free = append(p.free, b...) }

// seqRun is one sequence's state across iterations.
type seqRun struct {
	// prompt is its prompt.
	prompt []int32
	// blocks is its block table, sized for the whole run.
	blocks []int32
	// hist is prompt plus generated tokens.
	hist []int32
	// gen collects the generated tokens, in order.
	gen []int32
	// promptLogits, decodeLogits collect logits when asked.
	promptLogits, decodeLogits []float32
	// start counts the batch iterations before the sequence joins.
	start int
}

func run(o options) error {
	raw, err := os.ReadFile(o.prompts)
	if err != nil {
		return err
	}
	var pf struct {
		// Prompts hold one token-id list per prompt.
		Prompts [][]int32 `json:"prompts"`
	}
	if err := json.Unmarshal(raw, &pf); err != nil {
		return fmt.Errorf("%s: %w", o.prompts, err)
	}
	ckpt, err := model.Open(o.ckpt)
	if err != nil {
		return err
	}
	defer ckpt.Close()
	const T = 16 // small blocks: many per sequence, so tables matter
	longest := 0
	for _, p := range pf.Prompts {
		longest = max(longest, len(p))
	}
	perSeq := (longest + o.steps + 1 + T - 1) / T
	numBlocks := perSeq*len(pf.Prompts) + 64
	t0 := time.Now()
	eng, err := cuda.New(ckpt, cuda.Options{DType: o.dtype, TokensPerBlock: T, NumBlocks: numBlocks, Library: o.lib,
		BatchInvariant: o.invariant, Tuning: cuda.TuningFromEnv()})
	if err != nil {
		return err
	}
	defer eng.Close()
	fmt.Printf("engine on %s: %d blocks, weights %.1f MB, load %.2fs (warm-up %v: %d cuBLAS shapes, %d graphs)\n", eng.DeviceName, eng.Info().NumBlocks,
		float64(eng.WeightBytes)/1e6, time.Since(t0).Seconds(), eng.WarmupTime, eng.WarmupGEMMShapes, eng.WarmupGraphs)
	// The warm-up captures a greedy and a sampled graph for each batch bucket 1, 2, 4, …
	// up to the default 256 sequences, and for chained rows (proposals verified in rows)
	// 2, 4, … 32.
	if want := 2*bits.Len(256) + 2*(bits.Len(32)-1); eng.WarmupGraphs != want || eng.WarmupGEMMShapes == 0 {
		return fmt.Errorf("warm-up readied %d graphs and %d cuBLAS shapes, want %d graphs and some shapes", eng.WarmupGraphs, eng.WarmupGEMMShapes, want)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pool := newBlockPool(numBlocks, rng)
	V := eng.Info().VocabSize
	K := min(o.logitPrompts, len(pf.Prompts))
	var tensors []*model.Tensor
	addF := func(name string, shape []int, v []float32) error {
		t, err := model.NewFloatTensor(name, "F32", shape, v)
		if err != nil {
			return err
		}
		tensors = append(tensors, t)
		return nil
	}

	// Singles.
	t0 = time.Now()
	singles := make([]*seqRun, len(pf.Prompts))
	for i, p := range pf.Prompts {
		r := &seqRun{prompt: p}
		if r.blocks, err = pool.take(perSeq); err != nil {
			return err
		}
		if err := runBatch(eng, []*seqRun{r}, o.steps, func(int) bool { return i < K }); err != nil {
			return fmt.Errorf("prompt %d alone: %w", i, err)
		}
		pool.give(r.blocks)
		singles[i] = r
	}
	fmt.Printf("singles: %d prompts in %.2fs\n", len(singles), time.Since(t0).Seconds())

	// Batches: staggered joins, without and with logits.
	batch := func(withLogits bool) ([]*seqRun, error) {
		runs := make([]*seqRun, len(pf.Prompts))
		for i, p := range pf.Prompts {
			runs[i] = &seqRun{prompt: p, start: (i % 4) * 2}
			if runs[i].blocks, err = pool.take(perSeq); err != nil {
				return nil, err
			}
		}
		err := runBatch(eng, runs, o.steps, func(i int) bool { return withLogits && i < K })
		for _, r := range runs {
			pool.give(r.blocks)
		}
		return runs, err
	}
	t0 = time.Now()
	graphRuns, err := batch(false)
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	logitRuns, err := batch(true)
	if err != nil {
		return fmt.Errorf("batch with logits: %w", err)
	}
	fmt.Printf("batches: 2 × %d sequences in %.2fs\n", len(pf.Prompts), time.Since(t0).Seconds())

	// Chunked prefill of the first prompts: chunks of 7 tokens, context logits.
	var chunked [][]float32
	for i := 0; i < K; i++ {
		p := pf.Prompts[i]
		blocks, err := pool.take(perSeq)
		if err != nil {
			return err
		}
		var rows []float32
		for from := 0; from < len(p); from += 7 {
			to := min(from+7, len(p))
			outs, err := eng.Step(&engine.Batch{Seqs: []engine.Sequence{{
				ID: uint64(i), Tokens: p[from:to], Pos: from, Blocks: blocks, ContextLogits: true,
				Sample: to == len(p), History: p[:to], Sampling: engine.SamplingParams{},
			}}})
			if err != nil {
				return fmt.Errorf("chunked prompt %d: %w", i, err)
			}
			rows = append(rows, outs[0].ContextLogits...)
		}
		pool.give(blocks)
		chunked = append(chunked, rows)
	}

	toks := func(runs []*seqRun) []float32 {
		out := make([]float32, 0, len(runs)*(o.steps+1))
		for _, r := range runs {
			for _, t := range r.gen {
				out = append(out, float32(t))
			}
		}
		return out
	}
	n := len(pf.Prompts)
	for _, x := range []struct {
		name string
		runs []*seqRun
	}{{"single", singles}, {"batch", graphRuns}, {"batchlogits", logitRuns}} {
		if err := addF(x.name+".tokens", []int{n, o.steps + 1}, toks(x.runs)); err != nil {
			return err
		}
	}
	for i := 0; i < K; i++ {
		L := len(pf.Prompts[i])
		if err := addF(fmt.Sprintf("single.prompt_logits.%d", i), []int{L, V}, singles[i].promptLogits); err != nil {
			return err
		}
		if err := addF(fmt.Sprintf("single.decode_logits.%d", i), []int{o.steps, V}, singles[i].decodeLogits); err != nil {
			return err
		}
		if err := addF(fmt.Sprintf("batchlogits.decode_logits.%d", i), []int{o.steps, V}, logitRuns[i].decodeLogits); err != nil {
			return err
		}
		if err := addF(fmt.Sprintf("batchlogits.prompt_logits.%d", i), []int{L, V}, logitRuns[i].promptLogits); err != nil {
			return err
		}
		if err := addF(fmt.Sprintf("chunked.prompt_logits.%d", i), []int{L, V}, chunked[i]); err != nil {
			return err
		}
	}
	if err := model.WriteSafetensors(o.out, tensors, map[string]string{"device": eng.DeviceName, "dtype": o.dtype}); err != nil {
		return err
	}
	fmt.Printf("wrote %s\n", o.out)
	if o.sampling {
		return compareSampling(ckpt, eng, pf.Prompts, pool, perSeq)
	}
	return nil
}

// runBatch runs the sequences as one in-flight batch: sequence i joins at its start
// iteration with its whole prompt, then decodes steps greedy tokens; logits(i) says
// whether it returns its logits.
func runBatch(eng engine.Engine, runs []*seqRun, steps int, logits func(int) bool) error {
	for it := 0; ; it++ {
		var b engine.Batch
		var idx []int
		for i, r := range runs {
			if it < r.start || len(r.gen) == steps+1 {
				continue
			}
			want := logits(i)
			sq := engine.Sequence{ID: uint64(i), Blocks: r.blocks, Sample: true, Sampling: engine.SamplingParams{}}
			if len(r.gen) == 0 {
				sq.Tokens, sq.Pos, sq.ContextLogits = r.prompt, 0, want
				r.hist = append([]int32(nil), r.prompt...)
			} else {
				sq.Tokens = []int32{r.gen[len(r.gen)-1]}
				sq.Pos = len(r.prompt) + len(r.gen) - 1
				sq.ReturnLogits = want
				sq.NumGenerated = len(r.gen)
			}
			sq.History = r.hist
			b.Seqs = append(b.Seqs, sq)
			idx = append(idx, i)
		}
		if len(b.Seqs) == 0 {
			if it > 100 {
				return nil
			}
			done := true
			for _, r := range runs {
				done = done && len(r.gen) == steps+1
			}
			if done {
				return nil
			}
			continue
		}
		outs, err := eng.Step(&b)
		if err != nil {
			return fmt.Errorf("iteration %d: %w", it, err)
		}
		for k, i := range idx {
			r := runs[i]
			if len(r.gen) == 0 {
				r.promptLogits = outs[k].ContextLogits
			} else {
				r.decodeLogits = append(r.decodeLogits, outs[k].Logits...)
			}
			r.gen = append(r.gen, outs[k].Token)
			r.hist = append(r.hist, outs[k].Token)
		}
	}
}

// samplingCase is one sequence's sampling set-up in the comparison.
type samplingCase struct {
	// name describes it.
	name string
	// p are its parameters.
	p engine.SamplingParams
}

// compareSampling runs the CPU engine beside the GPU engine, teacher-forced on the CPU
// engine's tokens, and prints the share of steps whose sampled tokens agree.
func compareSampling(ckpt *model.Checkpoint, gpu *cuda.Engine, prompts [][]int32, pool *blockPool, perSeq int) error {
	m, err := ckpt.Float32Weights()
	if err != nil {
		return err
	}
	info := gpu.Info()
	ref, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: info.NumBlocks, TokensPerBlock: info.TokensPerBlock, MaxSeqLen: info.MaxSeqLen})
	if err != nil {
		return err
	}
	defer ref.Close()
	V := info.VocabSize
	rng := rand.New(rand.NewPCG(7, 8))
	bias := make([]float32, V)
	for i := range bias {
		bias[i] = float32(rng.NormFloat64())
	}
	bias[3] = float32(math.Inf(-1))
	cases := []samplingCase{
		{"temperature 0.8", engine.SamplingParams{Temperature: 0.8, Seed: 1}},
		{"temperature 1.5", engine.SamplingParams{Temperature: 1.5, Seed: 2}},
		{"top-k 5", engine.SamplingParams{Temperature: 1, TopK: 5, Seed: 3}},
		{"top-k 1", engine.SamplingParams{Temperature: 1, TopK: 1, Seed: 4}},
		{"top-p 0.9", engine.SamplingParams{Temperature: 1, TopP: 0.9, Seed: 5}},
		{"top-p 0.5", engine.SamplingParams{Temperature: 0.7, TopP: 0.5, Seed: 6}},
		{"top-k 50 top-p 0.8 t1.3", engine.SamplingParams{Temperature: 1.3, TopK: 50, TopP: 0.8, Seed: 7}},
		{"repetition 1.3", engine.SamplingParams{Temperature: 0.7, RepetitionPenalty: 1.3, Seed: 8}},
		{"presence+frequency", engine.SamplingParams{Temperature: 1, PresencePenalty: 0.5, FrequencyPenalty: 0.3, Seed: 9}},
		{"greedy repetition 2", engine.SamplingParams{RepetitionPenalty: 2}},
		{"min length", engine.SamplingParams{Temperature: 1, MinLength: 20, EndIDs: []int32{int32(V - 1)}, Seed: 10}},
		{"bad words", engine.SamplingParams{Temperature: 1, Seed: 11, BadWords: [][]int32{{5}, {7, 9}, {int32(V - 2)}}}},
		{"bias", engine.SamplingParams{Temperature: 1, Seed: 12, EmbeddingBias: bias}},
		{"greedy bias", engine.SamplingParams{EmbeddingBias: bias}},
		{"top-k 1000 top-p 0.95", engine.SamplingParams{Temperature: 0.9, TopK: 1000, TopP: 0.95, Seed: 13}},
		{"temperature 0.05", engine.SamplingParams{Temperature: 0.05, Seed: 14}},
	}
	type st struct {
		prompt, hist []int32
		blocks       []int32
		gen          int
	}
	seqs := make([]*st, len(cases))
	for i := range cases {
		p := prompts[i%len(prompts)]
		b, err := pool.take(perSeq)
		if err != nil {
			return err
		}
		defer pool.give(b)
		seqs[i] = &st{prompt: p, hist: append([]int32(nil), p...), blocks: b}
	}
	const steps = 24
	agree, total := 0, 0
	maxLP, maxLogit := 0.0, 0.0
	perCase := make([]int, len(cases))
	for s := 0; s <= steps; s++ {
		var b engine.Batch
		for i, c := range cases {
			q := seqs[i]
			sq := engine.Sequence{ID: uint64(i), Blocks: q.blocks, Sample: true, Sampling: c.p, History: q.hist, NumGenerated: q.gen, ReturnLogits: true}
			if s == 0 {
				sq.Tokens, sq.Pos = q.prompt, 0
			} else {
				sq.Tokens, sq.Pos = q.hist[len(q.hist)-1:], len(q.hist)-1
			}
			b.Seqs = append(b.Seqs, sq)
		}
		co, err := ref.Step(&b)
		if err != nil {
			return fmt.Errorf("cpu step %d: %w", s, err)
		}
		gouts, err := gpu.Step(&b)
		if err != nil {
			return fmt.Errorf("gpu step %d: %w", s, err)
		}
		for i := range cases {
			total++
			if co[i].Token == gouts[i].Token {
				agree++
				perCase[i]++
				maxLP = max(maxLP, math.Abs(float64(co[i].LogProb-gouts[i].LogProb)))
			}
			maxLogit = max(maxLogit, enginetest.RelL2(gouts[i].Logits, co[i].Logits))
			seqs[i].hist = append(seqs[i].hist, co[i].Token)
			seqs[i].gen++
		}
	}
	res := map[string]any{"agree": agree, "total": total, "max_abs_logprob_diff": maxLP, "max_rel_l2_logits": maxLogit}
	pc := map[string]int{}
	for i, c := range cases {
		pc[c.name] = perCase[i]
	}
	res["per_case_agree_of_25"] = pc
	j, _ := json.Marshal(res)
	fmt.Printf("SAMPLING %s\n", j)
	return nil
}

// Command tritonbench drives a running tritonserver serving gollm over streaming gRPC
// (ModelStreamInfer), for the end-to-end figures (impl "gollm-triton") and check:
//
//	tritonbench -addr 127.0.0.1:8001 -model gpt2 -check prompts.json -expect gollm.safetensors
//	tritonbench -addr 127.0.0.1:8001 -model gpt2 -name gpt2-124M -workloads decode_b1_i128_o128,...
//
// -check sends each prompt of the JSON file ({"prompts": [[ids…], …]}) as a streaming
// greedy request (end_id -1) and compares the streamed tokens with the "single.tokens"
// that gollm-gpucheck wrote from the engine alone; it exits non-zero on a difference.
// With -gaps (check.py's GAPS file for the same run: transformers' top-2 logit gap at every
// step of every prompt, and the run's tolerance), a stream that parts from the engine's
// single run where that gap is under the tolerance is accepted, as check.py accepts such
// a difference between the single run and the batch: the 64 streams share iterations, and
// a near-tie may turn with the batch's other summation order.
// -workloads runs gpubench's workloads as b concurrent streams, each request its own
// stream: decode_… reports the median gap between a stream's tokens after the first,
// tput_… generated tokens per second, lat_… the wall time until the last stream ends.
// Walls end at the last final response. -preopen opens every stream before the clock
// starts, as a client that keeps its streams open would (new streams reach the model
// over milliseconds, spreading 64 requests over several iterations).
// -against OTHER sends the same 48 random greedy prompts (1 to 60 tokens, 32 new tokens
// each, all at once) to -model and to OTHER and compares the streams: for a model served
// with tensor_parallel_size N against the same checkpoint on one GPU. Floating-point sums
// in another order may turn a near-tie the other way, so it passes when every stream
// ends and at least -min-same of them are identical; it prints each difference.
// load_c<C>_n<N>_i<I>_o<O> (bench/loadstat) sends N streaming greedy requests, each on
// a stream of its own, C at a time (the next sent as one ends) or all at once for C = 0,
// and reports output tokens per second and the time to the first token and between
// tokens at p50, p90 and p99, as gpubench's load workloads do for the engine alone.
// -conns N spreads the streams over N gRPC connections (stream k on connection k mod N);
// -streaming=false asks each request for one final response with all its tokens (impl
// "gollm-triton-nostream"), to tell the cost of per-token responses from the rest.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"gollm/bench/loadstat"
	"gollm/kserve"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8001", "tritonserver gRPC address")
	modelName := flag.String("model", "gpt2", "model name in the repository")
	name := flag.String("name", "gpt2-124M", "model name for the results")
	check := flag.String("check", "", "prompts JSON file to check against -expect")
	expect := flag.String("expect", "", "gollm-gpucheck output with single.tokens")
	gaps := flag.String("gaps", "", "with -check: check.py's top-2 gaps file, to accept streams that part at a near-tie")
	list := flag.String("workloads", "", "comma-separated workloads")
	reps := flag.Int("reps", 3, "timed repetitions per workload")
	vocab := flag.Int("vocab", 50257, "vocabulary size for random prompts")
	wait := flag.Duration("wait", 120*time.Second, "how long to wait for the model to be ready")
	conns := flag.Int("conns", 1, "gRPC connections the streams are spread over")
	streaming := flag.Bool("streaming", true, "stream tokens (false: one response per request, impl gollm-triton-nostream)")
	preopen := flag.Bool("preopen", false, "open every stream before the clock starts (a client that keeps its streams)")
	against := flag.String("against", "", "model whose greedy streams -model's must equal (tensor parallel against one GPU)")
	minSame := flag.Float64("min-same", 0.9, "with -against: the fraction of identical streams that passes")
	dtype := flag.String("dtype", "fp16", "the served model's weights as the rows name them (fp16, bf16, fp8): a label only")
	kvFP8 := flag.Bool("kv-fp8", false, "the served model's KV cache is FP8 (kv_cache_dtype): the rows' impl ends in -kvfp8")
	flag.Parse()
	if *conns < 1 {
		fmt.Fprintln(os.Stderr, "tritonbench: -conns must be at least 1")
		os.Exit(2)
	}
	opts := options{conns: *conns, streaming: *streaming, preopen: *preopen, against: *against, minSame: *minSame, gaps: *gaps,
		dtype: *dtype, kvFP8: *kvFP8}
	if err := run(*addr, *modelName, *name, *check, *expect, *list, *reps, *vocab, *wait, opts); err != nil {
		fmt.Fprintln(os.Stderr, "tritonbench:", err)
		os.Exit(1)
	}
}

// options are the client's settings beside the workloads.
type options struct {
	// conns is the number of gRPC connections; stream k uses connection k mod conns.
	conns int
	// streaming asks for a response per token; false asks for one final response.
	streaming bool
	// preopen opens the streams before the clock starts.
	preopen bool
	// against is the model -model's greedy streams are compared with ("": no comparison).
	against string
	// minSame is the fraction of identical streams that passes the comparison.
	minSame float64
	// gaps is check.py's file of top-2 gaps for -check ("": every difference fails).
	gaps string
	// dtype and kvFP8 label the rows: the server's model settings, which the client cannot see.
	dtype string
	kvFP8 bool
}

// impl is the rows' impl: gollm-triton, -nostream without streaming, -kvfp8 over an FP8
// KV cache (as gpubench names its own).
func (o options) impl() string {
	impl := "gollm-triton"
	if !o.streaming {
		impl += "-nostream"
	}
	if o.kvFP8 {
		impl += "-kvfp8"
	}
	return impl
}

func run(addr, modelName, name, check, expect, list string, reps, vocab int, wait time.Duration, opts options) error {
	var cs []kserve.GRPCInferenceServiceClient
	for range opts.conns {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		cs = append(cs, kserve.NewGRPCInferenceServiceClient(conn))
	}
	c := cs[0]
	deadline := time.Now().Add(wait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := c.ModelReady(ctx, &kserve.ModelReadyRequest{Name: modelName})
		cancel()
		if err == nil && r.GetReady() {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("model %s not ready after %v: %v", modelName, wait, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if check != "" {
		return runCheck(c, modelName, check, expect, opts.gaps)
	}
	if opts.against != "" {
		return runAgainst(c, modelName, opts.against, vocab, opts.minSame)
	}
	for _, w := range strings.Split(list, ",") {
		if w == "" {
			continue
		}
		if loadstat.IsLoad(w) {
			if err := runLoadWorkload(cs, modelName, name, w, vocab, opts); err != nil {
				return fmt.Errorf("%s: %w", w, err)
			}
			continue
		}
		if err := runWorkload(cs, modelName, name, w, reps, vocab, opts); err != nil {
			return fmt.Errorf("%s: %w", w, err)
		}
	}
	return nil
}

// result is one streamed request's tokens and their arrival times.
type result struct {
	// tokens hold the streamed output_ids, in order.
	tokens []int32
	// times are when each response with tokens arrived, counts how many tokens each held.
	times  []time.Time
	counts []int
	// final is when the final response arrived (the stream's close comes after).
	final time.Time
}

func int32Tensor(name string, shape []int64, v ...int32) (*kserve.ModelInferRequest_InferInputTensor, []byte) {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return &kserve.ModelInferRequest_InferInputTensor{Name: name, Datatype: "INT32", Shape: shape}, b
}

// stream sends one greedy request on its own stream and reads it to the end; streaming
// asks for each token as it comes, otherwise one response carries them all.
func stream(c kserve.GRPCInferenceServiceClient, modelName, id string, prompt []int32, out int, streaming bool) (result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := c.ModelStreamInfer(ctx)
	if err != nil {
		return result{}, err
	}
	return request(s, modelName, id, prompt, out, streaming)
}

// request sends one greedy request on an open stream and reads it to the end.
func request(s kserve.GRPCInferenceService_ModelStreamInferClient, modelName, id string, prompt []int32, out int, streaming bool) (result, error) {
	req := &kserve.ModelInferRequest{ModelName: modelName, Id: id, Parameters: map[string]*kserve.InferParameter{
		"triton_enable_empty_final_response": {ParameterChoice: &kserve.InferParameter_BoolParam{BoolParam: true}},
	}}
	add := func(t *kserve.ModelInferRequest_InferInputTensor, raw []byte) {
		req.Inputs = append(req.Inputs, t)
		req.RawInputContents = append(req.RawInputContents, raw)
	}
	add(int32Tensor("input_ids", []int64{1, int64(len(prompt))}, prompt...))
	add(int32Tensor("input_lengths", []int64{1, 1}, int32(len(prompt))))
	add(int32Tensor("request_output_len", []int64{1, 1}, int32(out)))
	add(int32Tensor("end_id", []int64{1, 1}, -1))
	flag := byte(0)
	if streaming {
		flag = 1
	}
	add(&kserve.ModelInferRequest_InferInputTensor{Name: "streaming", Datatype: "BOOL", Shape: []int64{1, 1}}, []byte{flag})
	if err := s.Send(req); err != nil {
		return result{}, err
	}
	var res result
	for {
		msg, err := s.Recv()
		if err != nil {
			return res, fmt.Errorf("request %s: %w", id, err)
		}
		if e := msg.GetErrorMessage(); e != "" {
			return res, fmt.Errorf("request %s: %s", id, e)
		}
		r := msg.GetInferResponse()
		for i, o := range r.GetOutputs() {
			if o.GetName() != "output_ids" || i >= len(r.GetRawOutputContents()) {
				continue
			}
			raw := r.GetRawOutputContents()[i]
			if len(raw) > 0 {
				res.times = append(res.times, time.Now())
				res.counts = append(res.counts, len(raw)/4)
			}
			for j := 0; j+4 <= len(raw); j += 4 {
				res.tokens = append(res.tokens, int32(binary.LittleEndian.Uint32(raw[j:])))
			}
		}
		if p, ok := r.GetParameters()["triton_final_response"]; ok && p.GetBoolParam() {
			res.final = time.Now()
			break
		}
	}
	_ = s.CloseSend()
	if _, err := s.Recv(); err != io.EOF && err != nil {
		return res, err
	}
	return res, nil
}

func runCheck(c kserve.GRPCInferenceServiceClient, modelName, promptsFile, expect, gapsFile string) error {
	raw, err := os.ReadFile(promptsFile)
	if err != nil {
		return err
	}
	var pf struct {
		// Prompts hold one token-id list per prompt.
		Prompts [][]int32 `json:"prompts"`
	}
	if err := json.Unmarshal(raw, &pf); err != nil {
		return err
	}
	want, steps, err := expectedTokens(expect)
	if err != nil {
		return err
	}
	if len(want) != len(pf.Prompts) {
		return fmt.Errorf("%s has %d prompts, %s %d", expect, len(want), promptsFile, len(pf.Prompts))
	}
	var ties *nearTies
	if gapsFile != "" {
		if ties, err = readNearTies(gapsFile); err != nil {
			return err
		}
	}
	results, err := streamAll(c, modelName, pf.Prompts, steps)
	if err != nil {
		return err
	}
	got := make([][]int32, len(results))
	for i, r := range results {
		got[i] = r.tokens
	}
	equal, accepted, differ := compareStreams(got, want, ties)
	for _, m := range accepted {
		fmt.Println("accepted:", m)
	}
	for _, m := range differ {
		fmt.Println("differs:", m)
	}
	fmt.Printf("TRITON streamed tokens equal to the engine's: %d/%d prompts (%d tokens each); %d more part at a near-tie\n",
		equal, len(pf.Prompts), steps, len(accepted))
	if len(differ) > 0 {
		return fmt.Errorf("%d prompts differ", len(differ))
	}
	return nil
}

// nearTies is check.py's GAPS file for one run: Gaps[i][k] is transformers' top-2 logit
// gap (float32 reference, on the engine's single-run tokens) at the row that chose token k
// of prompt i, and Tol the run's tolerance for a flipped token.
type nearTies struct {
	// Tol is the gap under which a different token is a near-tie.
	Tol float64 `json:"tol_gap"`
	// Gaps are the top-2 gaps, [prompts][steps].
	Gaps [][]float64 `json:"gaps"`
}

func readNearTies(path string) (*nearTies, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var t nearTies
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !(t.Tol > 0) || len(t.Gaps) == 0 {
		return nil, fmt.Errorf("%s: want a positive tol_gap and gaps, got %v and %d prompts", path, t.Tol, len(t.Gaps))
	}
	return &t, nil
}

// compareStreams sorts the prompts' streams (got) against the engine's single runs
// (want): equal counts the identical ones; a stream of the full length that first parts
// at a step whose gap (ties) is under the tolerance is accepted; every other difference —
// a short stream, a wide gap, no gaps for it — is in differ. Each message names the
// prompt, the step and the tokens from there on.
func compareStreams(got, want [][]int32, ties *nearTies) (equal int, accepted, differ []string) {
	for i := range want {
		g := got[i]
		if slices.Equal(g, want[i]) {
			equal++
			continue
		}
		k := partAt(g, want[i])
		msg := fmt.Sprintf("prompt %d parts at step %d: triton %v, engine %v", i, k, g[k:], want[i][k:])
		switch {
		case len(g) != len(want[i]):
			differ = append(differ, fmt.Sprintf("%s (%d tokens streamed, %d expected)", msg, len(g), len(want[i])))
		case ties != nil && i < len(ties.Gaps) && k < len(ties.Gaps[i]) && ties.Gaps[i][k] < ties.Tol:
			accepted = append(accepted, fmt.Sprintf("%s (top-2 gap %.2e < %.2e)", msg, ties.Gaps[i][k], ties.Tol))
		case ties != nil && i < len(ties.Gaps) && k < len(ties.Gaps[i]):
			differ = append(differ, fmt.Sprintf("%s (top-2 gap %.2e, not a near-tie)", msg, ties.Gaps[i][k]))
		default:
			differ = append(differ, msg)
		}
	}
	return equal, accepted, differ
}

// streamAll sends every prompt at once as a streaming greedy request of steps tokens, so
// that they share iterations as in-flight batching does, and returns their streams.
func streamAll(c kserve.GRPCInferenceServiceClient, modelName string, prompts [][]int32, steps int) ([]result, error) {
	results := make([]result, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Go(func() { results[i], errs[i] = stream(c, modelName, fmt.Sprint(i), p, steps, true) })
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// runAgainst compares the greedy streams of model and other for the same random prompts.
func runAgainst(c kserve.GRPCInferenceServiceClient, model, other string, vocab int, minSame float64) error {
	const n, steps = 48, 32
	rng := rand.New(rand.NewPCG(7, uint64(vocab)))
	prompts := make([][]int32, n)
	for i := range prompts {
		prompts[i] = make([]int32, 1+rng.IntN(60))
		for j := range prompts[i] {
			prompts[i][j] = int32(rng.IntN(vocab))
		}
	}
	got := map[string][]result{}
	for _, m := range []string{model, other} {
		res, err := streamAll(c, m, prompts, steps)
		if err != nil {
			return fmt.Errorf("model %s: %w", m, err)
		}
		got[m] = res
	}
	same := 0
	for i := range prompts {
		a, b := got[model][i].tokens, got[other][i].tokens
		if len(a) != steps || len(b) != steps {
			return fmt.Errorf("prompt %d: %d tokens from %s, %d from %s; want %d", i, len(a), model, len(b), other, steps)
		}
		if slices.Equal(a, b) {
			same++
			continue
		}
		k := partAt(a, b)
		fmt.Printf("prompt %d (%d tokens): the streams part at step %d: %s %v, %s %v\n", i, len(prompts[i]), k, model, a[k:], other, b[k:])
	}
	fmt.Printf("TRITON %s's greedy streams equal to %s's: %d/%d prompts (%d tokens each)\n", model, other, same, n, steps)
	if float64(same) < minSame*n {
		return fmt.Errorf("%d of %d streams differ, more than -min-same %.2f allows", n-same, n, minSame)
	}
	return nil
}

// partAt is the first step at which streams a and b differ, or the shorter one's length.
func partAt(a, b []int32) int {
	k := 0
	for k < len(a) && k < len(b) && a[k] == b[k] {
		k++
	}
	return k
}

// expectedTokens reads single.tokens [prompts][steps] (F32) from gollm-gpucheck's
// safetensors output: an 8-byte header length, a JSON header, then the data.
func expectedTokens(path string) ([][]int32, int, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	if len(raw) < 8 {
		return nil, 0, fmt.Errorf("%s: too short for safetensors", path)
	}
	hl := int(binary.LittleEndian.Uint64(raw))
	if hl > len(raw)-8 {
		return nil, 0, fmt.Errorf("%s: header length %d exceeds the file", path, hl)
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+hl], &header); err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	var t struct {
		// DType must be I32 for the tokens.
		DType string `json:"dtype"`
		// Shape is [prompts, steps].
		Shape []int `json:"shape"`
		// Offsets bound the data after the header.
		Offsets [2]int `json:"data_offsets"`
	}
	h, ok := header["single.tokens"]
	if !ok {
		return nil, 0, fmt.Errorf("%s has no single.tokens", path)
	}
	if err := json.Unmarshal(h, &t); err != nil {
		return nil, 0, err
	}
	if t.DType != "F32" || len(t.Shape) != 2 || t.Offsets[1] > len(raw)-8-hl || t.Offsets[1]-t.Offsets[0] != 4*t.Shape[0]*t.Shape[1] {
		return nil, 0, fmt.Errorf("%s: single.tokens is %s %v at %v", path, t.DType, t.Shape, t.Offsets)
	}
	data := raw[8+hl+t.Offsets[0] : 8+hl+t.Offsets[1]]
	n, steps := t.Shape[0], t.Shape[1]
	out := make([][]int32, n)
	for i := range out {
		for j := 0; j < steps; j++ {
			out[i] = append(out[i], int32(math.Float32frombits(binary.LittleEndian.Uint32(data[4*(i*steps+j):]))))
		}
	}
	return out, steps, nil
}

func runWorkload(cs []kserve.GRPCInferenceServiceClient, modelName, name, w string, reps, vocab int, opts options) error {
	var kind string
	var b, in, out int
	i := strings.IndexByte(w, '_')
	if i < 0 {
		return fmt.Errorf("want kind_b<B>_i<I>_o<O>")
	}
	kind = w[:i]
	if _, err := fmt.Sscanf(w[i+1:], "b%d_i%d_o%d", &b, &in, &out); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(uint64(b), uint64(in)))
	prompts := make([][]int32, b)
	for k := range prompts {
		prompts[k] = make([]int32, in)
		for j := range prompts[k] {
			prompts[k][j] = int32(rng.IntN(vocab))
		}
	}
	var walls, gaps, ttfts []float64
	for r := 0; r <= reps; r++ {
		results := make([]result, b)
		errs := make([]error, b)
		var streams []kserve.GRPCInferenceService_ModelStreamInferClient
		var cancels []context.CancelFunc
		if opts.preopen {
			streams = make([]kserve.GRPCInferenceService_ModelStreamInferClient, b)
			for k := range streams {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				cancels = append(cancels, cancel)
				s, err := cs[k%len(cs)].ModelStreamInfer(ctx)
				if err != nil {
					return fmt.Errorf("open stream %d: %w", k, err)
				}
				streams[k] = s
			}
		}
		start := time.Now()
		var wg sync.WaitGroup
		for k := range prompts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("%d-%d", r, k)
				if streams != nil {
					results[k], errs[k] = request(streams[k], modelName, id, prompts[k], out, opts.streaming)
				} else {
					results[k], errs[k] = stream(cs[k%len(cs)], modelName, id, prompts[k], out, opts.streaming)
				}
			}()
		}
		wg.Wait()
		for _, cancel := range cancels {
			cancel()
		}
		// The wall ends with the last final response: closing the streams afterwards is
		// the client's bookkeeping, not generation.
		var last time.Time
		for k := range results {
			if errs[k] != nil {
				return errs[k]
			}
			if len(results[k].tokens) != out {
				return fmt.Errorf("stream %d: %d tokens, want %d", k, len(results[k].tokens), out)
			}
			if results[k].final.After(last) {
				last = results[k].final
			}
		}
		wall := last.Sub(start).Seconds()
		if r == 0 {
			continue // warm-up
		}
		walls = append(walls, wall)
		for _, res := range results {
			if len(res.times) > 0 {
				ttfts = append(ttfts, res.times[0].Sub(start).Seconds())
			}
			for j := 1; j < len(res.times); j++ {
				gaps = append(gaps, res.times[j].Sub(res.times[j-1]).Seconds())
			}
		}
	}
	slices.Sort(walls)
	slices.Sort(gaps)
	slices.Sort(ttfts)
	wall := walls[len(walls)/2]
	o := map[string]any{"model": name, "dtype": opts.dtype, "workload": w, "impl": opts.impl()}
	if len(cs) > 1 {
		o["conns"] = len(cs)
	}
	if opts.preopen {
		o["streams"] = "preopened"
	}
	switch kind {
	case "decode":
		if len(gaps) == 0 {
			return fmt.Errorf("no gaps between tokens: decode figures need -streaming")
		}
		o["metric"], o["value"] = "ms_per_token", gaps[len(gaps)/2]*1e3
	case "tput":
		o["metric"], o["value"] = "tokens_per_s", float64(b*out)/wall
	default:
		o["metric"], o["value"] = "latency_ms", wall*1e3
		// Where the latency goes beside the engine's (gpubench's prompt_ms and decode
		// ms/token): the median stream's first token, and the median gap after it.
		if len(ttfts) > 0 {
			o["ttft_ms"] = ttfts[len(ttfts)/2] * 1e3
		}
		if len(gaps) > 0 {
			o["gap_ms"] = gaps[len(gaps)/2] * 1e3
		}
	}
	j, _ := json.Marshal(o)
	fmt.Println(string(j))
	return nil
}

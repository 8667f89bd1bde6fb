// Command abload measures what gollm's OpenAI server adds on top of Triton, with the
// same client code on both paths: streaming requests with the same prompt and the same
// tensors, sent either straight to Triton over gRPC (ModelStreamInfer, as gollm-openai
// sends them) or to gollm-openai's /v1/completions (SSE), in alternating phases of
// -requests requests at -concurrency. It prints per path the medians over phases of
// time to first token, inter-token latency and output throughput, and the difference.
//
//	go run ./bench/openai/abload -triton 127.0.0.1:8001 -openai http://127.0.0.1:9000
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"gollm/kserve"
)

// result is one request's timings.
type result struct {
	// ttft is the time to the first token.
	ttft time.Duration
	// itl is the mean gap between tokens after the first.
	itl time.Duration
	// tokens counts the tokens received, for the throughput.
	tokens int
}

// phase is one path's run of requests.
type phase struct {
	// results hold one entry per request of the phase.
	results []result
	// wall runs from the phase's first request to its last answer.
	wall time.Duration
}

func main() {
	tritonAddr := flag.String("triton", "127.0.0.1:8001", "tritonserver's gRPC address")
	openaiURL := flag.String("openai", "http://127.0.0.1:9000", "gollm-openai's base URL")
	model := flag.String("model", "gpt2", "the model")
	conc := flag.Int("concurrency", 4, "requests in flight")
	n := flag.Int("requests", 32, "requests per phase")
	rounds := flag.Int("rounds", 4, "phases per path, alternating")
	words := flag.Int("prompt-words", 48, "words in the prompt")
	out := flag.Int("max-tokens", 64, "tokens to generate (greedy, so both paths do the same work)")
	openaiPID := flag.Int("openai-pid", 0, "gollm-openai's process id: report its CPU time per token (Linux /proc)")
	tritonPID := flag.Int("triton-pid", 0, "tritonserver's process id: report its CPU time per token on each path")
	flag.Parse()

	prompt := strings.TrimSpace(strings.Repeat("the quick brown fox jumps over a lazy dog ", *words/9+1))
	prompt = strings.Join(strings.Fields(prompt)[:*words], " ")
	conn, err := grpc.NewClient(*tritonAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	client := kserve.NewGRPCInferenceServiceClient(conn)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *conc}}
	paths := map[string]func() (result, error){
		"triton-grpc": func() (result, error) { return viaTriton(client, *model, prompt, *out) },
		"openai":      func() (result, error) { return viaOpenAI(hc, *openaiURL, *model, prompt, *out) },
	}
	order := []string{"triton-grpc", "openai"}
	// Warm up both paths (model description, connections, the engine's first steps).
	for _, p := range order {
		if _, err := run(paths[p], *conc, 2**conc); err != nil {
			fail(fmt.Errorf("%s warm-up: %w", p, err))
		}
	}
	stats := map[string][]map[string]float64{}
	for r := range *rounds {
		for _, p := range order {
			oa0, tr0 := cpuSeconds(*openaiPID), cpuSeconds(*tritonPID)
			ph, err := run(paths[p], *conc, *n)
			if err != nil {
				fail(fmt.Errorf("%s round %d: %w", p, r, err))
			}
			s := summarize(ph)
			tokens := s["tokens_per_s"] * ph.wall.Seconds()
			if *openaiPID > 0 {
				s["openai_cpu_us_per_token"] = 1e6 * (cpuSeconds(*openaiPID) - oa0) / tokens
			}
			if *tritonPID > 0 {
				s["triton_cpu_us_per_token"] = 1e6 * (cpuSeconds(*tritonPID) - tr0) / tokens
			}
			stats[p] = append(stats[p], s)
			fmt.Fprintf(os.Stderr, "round %d %-12s ttft p50 %6.2f ms  itl p50 %5.2f ms  %6.1f tok/s\n", r+1, p, s["ttft_ms"], s["itl_ms"], s["tokens_per_s"])
		}
	}
	med := func(p, k string) float64 {
		var v []float64
		for _, s := range stats[p] {
			v = append(v, s[k])
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	line := map[string]any{"concurrency": *conc, "requests": *n, "rounds": *rounds, "prompt_words": *words, "max_tokens": *out}
	for _, p := range order {
		for _, k := range []string{"ttft_ms", "ttft_ms_p99", "itl_ms", "itl_ms_p99", "tokens_per_s", "openai_cpu_us_per_token", "triton_cpu_us_per_token"} {
			if _, ok := stats[p][0][k]; ok {
				line[p+"."+k] = med(p, k)
			}
		}
	}
	line["ttft_ms_added"] = med("openai", "ttft_ms") - med("triton-grpc", "ttft_ms")
	line["itl_ms_added"] = med("openai", "itl_ms") - med("triton-grpc", "itl_ms")
	line["tokens_per_s_loss_pct"] = 100 * (med("triton-grpc", "tokens_per_s") - med("openai", "tokens_per_s")) / med("triton-grpc", "tokens_per_s")
	b, _ := json.Marshal(line)
	fmt.Println(string(b))
}

// cpuSeconds is a process's user + system CPU time (/proc/PID/stat), 0 for pid 0.
func cpuSeconds(pid int) float64 {
	if pid == 0 {
		return 0
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		fail(fmt.Errorf("read the CPU time of process %d: %w", pid, err))
	}
	// Fields after the command's closing parenthesis; utime and stime are the 12th
	// and 13th of them, in clock ticks (100 per second on Linux).
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	var ut, st float64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return (ut + st) / 100
}

// fail prints err and exits.
func fail(err error) {
	fmt.Fprintln(os.Stderr, "abload:", err)
	os.Exit(1)
}

// run sends n requests with conc in flight.
func run(do func() (result, error), conc, n int) (*phase, error) {
	var (
		mu    sync.Mutex
		ph    = &phase{}
		first error
		next  = make(chan struct{}, n)
		wg    sync.WaitGroup
	)
	for range n {
		next <- struct{}{}
	}
	close(next)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				r, err := do()
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				ph.results = append(ph.results, r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	ph.wall = time.Since(start)
	return ph, first
}

// summarize gives a phase's medians, 99th percentiles and throughput.
func summarize(ph *phase) map[string]float64 {
	var ttft, itl []float64
	tokens := 0
	for _, r := range ph.results {
		ttft = append(ttft, float64(r.ttft)/1e6)
		itl = append(itl, float64(r.itl)/1e6)
		tokens += r.tokens
	}
	slices.Sort(ttft)
	slices.Sort(itl)
	pct := func(v []float64, p float64) float64 { return v[min(len(v)-1, int(p*float64(len(v))))] }
	return map[string]float64{"ttft_ms": pct(ttft, 0.5), "ttft_ms_p99": pct(ttft, 0.99), "itl_ms": pct(itl, 0.5),
		"itl_ms_p99": pct(itl, 0.99), "tokens_per_s": float64(tokens) / ph.wall.Seconds()}
}

// timer turns token arrival times into a result.
type timer struct {
	// start is when the request was sent.
	start time.Time
	// times mark each token's arrival, for the inter-token latency.
	times []time.Time
}

// result computes the request's timings.
func (t *timer) result() result {
	r := result{tokens: len(t.times)}
	if len(t.times) > 0 {
		r.ttft = t.times[0].Sub(t.start)
	}
	if len(t.times) > 1 {
		r.itl = t.times[len(t.times)-1].Sub(t.times[0]) / time.Duration(len(t.times)-1)
	}
	return r
}

// viaTriton streams one request over gRPC with the tensors gollm-openai sends.
func viaTriton(c kserve.GRPCInferenceServiceClient, model, prompt string, maxTokens int) (result, error) {
	text := binary.LittleEndian.AppendUint32(nil, uint32(len(prompt)))
	text = append(text, prompt...)
	one := []int64{1, 1}
	req := &kserve.ModelInferRequest{
		ModelName: model,
		Inputs: []*kserve.ModelInferRequest_InferInputTensor{
			{Name: "text_input", Datatype: "BYTES", Shape: one},
			{Name: "max_tokens", Datatype: "INT32", Shape: one},
			{Name: "stream", Datatype: "BOOL", Shape: one},
			{Name: "return_num_input_tokens", Datatype: "BOOL", Shape: one},
			{Name: "return_num_output_tokens", Datatype: "BOOL", Shape: one},
			{Name: "return_finish_reason", Datatype: "BOOL", Shape: one},
		},
		RawInputContents: [][]byte{text, binary.LittleEndian.AppendUint32(nil, uint32(maxTokens)), {1}, {1}, {1}, {1}},
		Outputs: []*kserve.ModelInferRequest_InferRequestedOutputTensor{{Name: "text_output"}, {Name: "output_ids"},
			{Name: "num_input_tokens"}, {Name: "num_output_tokens"}, {Name: "finish_reason"}},
		Parameters: map[string]*kserve.InferParameter{
			"triton_enable_empty_final_response": {ParameterChoice: &kserve.InferParameter_BoolParam{BoolParam: true}},
		},
	}
	t := &timer{start: time.Now()}
	stream, err := c.ModelStreamInfer(context.Background())
	if err != nil {
		return result{}, err
	}
	if err := stream.Send(req); err != nil {
		return result{}, err
	}
	if err := stream.CloseSend(); err != nil {
		return result{}, err
	}
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return t.result(), nil
		}
		if err != nil {
			return result{}, err
		}
		if m := msg.GetErrorMessage(); m != "" {
			return result{}, fmt.Errorf("triton: %s", m)
		}
		for i, o := range msg.GetInferResponse().GetOutputs() {
			if o.GetName() == "output_ids" && len(msg.GetInferResponse().GetRawOutputContents()[i]) > 0 {
				t.times = append(t.times, time.Now())
			}
		}
	}
}

// viaOpenAI streams one completion from gollm-openai.
func viaOpenAI(hc *http.Client, base, model, prompt string, maxTokens int) (result, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens,
		"temperature": 0, "stream": true})
	t := &timer{start: time.Now()}
	resp, err := hc.Post(base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return result{}, fmt.Errorf("openai: %s: %s", resp.Status, b)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: ")) || bytes.Equal(line, []byte("data: [DONE]")) {
			continue
		}
		var chunk struct {
			// Choices hold the one choice a request of n 1 streams.
			Choices []struct {
				// Text is what the chunk adds.
				Text string `json:"text"`
				// FinishReason ends the choice.
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(line[6:], &chunk); err != nil {
			return result{}, err
		}
		// One chunk per token (the final one, with finish_reason, carries none).
		if len(chunk.Choices) == 1 && chunk.Choices[0].FinishReason == nil {
			t.times = append(t.times, time.Now())
		}
	}
	return t.result(), sc.Err()
}

package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/kserve"
	"gollm/model"
	"gollm/tests/harness"
	"gollm/tokenizer"
)

// Response parameters Triton uses for decoupled models.
const (
	// enableFinalParam asks Triton to mark each streamed response with finalParam and
	// to send an empty response when the model's final flag comes without data.
	enableFinalParam = "triton_enable_empty_final_response"
	// finalParam is true on a request's last response.
	finalParam = "triton_final_response"
)

// testPrompt is the text prompt of the README's example.
const testPrompt = "Hello, my name is"

// tensor is one input of a request, its data already in the protocol's raw layout.
type tensor struct {
	// name must be one of the model's inputs.
	name string
	// dtype is the KServe datatype ("INT32", "BOOL", "BYTES", "FP32").
	dtype string
	// shape starts with the batch dimension.
	shape []int64
	// raw is the little-endian data (BYTES: each element prefixed by its uint32 length).
	raw []byte
}

func int32s(name string, shape []int64, v ...int32) tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return tensor{name, "INT32", shape, b}
}

func float32s(name string, shape []int64, v ...float32) tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return tensor{name, "FP32", shape, b}
}

func boolean(name string, v bool) tensor {
	b := []byte{0}
	if v {
		b[0] = 1
	}
	return tensor{name, "BOOL", []int64{1, 1}, b}
}

func text(name, s string) tensor {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(s)))
	return tensor{name, "BYTES", []int64{1, 1}, append(b, s...)}
}

// tokenInputs are the inputs of a token request: input_ids [1, len], input_lengths,
// request_output_len and streaming.
func tokenInputs(prompt []int32, n int, streaming bool) []tensor {
	return []tensor{
		int32s("input_ids", []int64{1, int64(len(prompt))}, prompt...),
		int32s("input_lengths", []int64{1, 1}, int32(len(prompt))),
		int32s("request_output_len", []int64{1, 1}, int32(n)),
		boolean("streaming", streaming),
	}
}

// inferRequest builds a request for the model with raw inputs; on a decoupled model it
// asks for the final-response marker.
func inferRequest(model, id string, inputs []tensor) *kserve.ModelInferRequest {
	req := &kserve.ModelInferRequest{
		ModelName: model,
		Id:        id,
		Parameters: map[string]*kserve.InferParameter{
			enableFinalParam: {ParameterChoice: &kserve.InferParameter_BoolParam{BoolParam: true}},
		},
	}
	for _, in := range inputs {
		req.Inputs = append(req.Inputs, &kserve.ModelInferRequest_InferInputTensor{
			Name: in.name, Datatype: in.dtype, Shape: in.shape,
		})
		req.RawInputContents = append(req.RawInputContents, in.raw)
	}
	return req
}

// output finds an output of a response and decodes it as INT32; ok is false when the
// response lacks it.
func outputInt32(r *kserve.ModelInferResponse, name string) (v []int32, shape []int64, ok bool, err error) {
	for i, o := range r.GetOutputs() {
		if o.GetName() != name {
			continue
		}
		if o.GetDatatype() != "INT32" {
			return nil, o.GetShape(), true, fmt.Errorf("output %s is %s, want INT32", name, o.GetDatatype())
		}
		if i < len(r.GetRawOutputContents()) {
			raw := r.GetRawOutputContents()[i]
			if len(raw)%4 != 0 {
				return nil, o.GetShape(), true, fmt.Errorf("output %s: %d raw bytes, not a multiple of 4", name, len(raw))
			}
			v = make([]int32, len(raw)/4)
			for j := range v {
				v[j] = int32(binary.LittleEndian.Uint32(raw[4*j:]))
			}
		} else {
			v = o.GetContents().GetIntContents()
		}
		if want := numElements(o.GetShape()); want != len(v) {
			return nil, o.GetShape(), true, fmt.Errorf("output %s: shape %v holds %d elements, data %d", name, o.GetShape(), want, len(v))
		}
		return v, o.GetShape(), true, nil
	}
	return nil, nil, false, nil
}

func numElements(shape []int64) int {
	n := 1
	for _, d := range shape {
		n *= int(d)
	}
	return n
}

// isFinal reports Triton's final-response marker on a response.
func isFinal(r *kserve.ModelInferResponse) bool {
	p, ok := r.GetParameters()[finalParam]
	return ok && p.GetBoolParam()
}

// streamResult is what one request produced over ModelStreamInfer.
type streamResult struct {
	// tokens are the output_ids of all responses, concatenated.
	tokens []int32
	// responses counts the responses received, empty ones included.
	responses int
	// withTokens counts the responses that carried at least one token.
	withTokens int
	// final is true when the final-response marker arrived.
	final bool
	// errMsg is the error the request ended with, "" if none.
	errMsg string
	// seqLen is the last sequence_length seen, -1 if none.
	seqLen int32
}

// readStream reads the responses of the request id from the stream until the final
// marker or an error response.
func readStream(stream kserve.GRPCInferenceService_ModelStreamInferClient, id string) (streamResult, error) {
	res := streamResult{seqLen: -1}
	for {
		msg, err := stream.Recv()
		if err != nil {
			return res, fmt.Errorf("request %s: receive after %d responses: %w", id, res.responses, err)
		}
		res.responses++
		r := msg.GetInferResponse()
		if got := r.GetId(); got != "" && got != id {
			return res, fmt.Errorf("request %s: got a response for request %q", id, got)
		}
		if msg.GetErrorMessage() != "" {
			res.errMsg = msg.GetErrorMessage()
			res.final = true
			return res, nil
		}
		ids, _, ok, err := outputInt32(r, "output_ids")
		if err != nil {
			return res, fmt.Errorf("request %s: %w", id, err)
		}
		if ok && len(ids) > 0 {
			res.tokens = append(res.tokens, ids...)
			res.withTokens++
		}
		if sl, _, ok, err := outputInt32(r, "sequence_length"); err == nil && ok && len(sl) > 0 {
			res.seqLen = sl[0]
		}
		if isFinal(r) {
			res.final = true
			return res, nil
		}
	}
}

// streamInfer sends one request on a new stream and reads all its responses.
func streamInfer(ctx context.Context, c kserve.GRPCInferenceServiceClient, req *kserve.ModelInferRequest) (streamResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.ModelStreamInfer(ctx)
	if err != nil {
		return streamResult{}, fmt.Errorf("open stream: %w", err)
	}
	if err := stream.Send(req); err != nil {
		return streamResult{}, fmt.Errorf("send request %s: %w", req.GetId(), err)
	}
	res, err := readStream(stream, req.GetId())
	if err != nil {
		return res, err
	}
	if err := stream.CloseSend(); err != nil {
		return res, fmt.Errorf("close stream: %w", err)
	}
	// End the call the way clients do: wait for the server to close its side.
	if msg, err := stream.Recv(); err != io.EOF {
		return res, fmt.Errorf("request %s: after the final response: got %v, %v; want the end of the stream", req.GetId(), msg, err)
	}
	return res, nil
}

// checkpointInfo is what the tests need of the demo checkpoint.
type checkpointInfo struct {
	// dir holds config.json, the safetensors and tokenizer.json.
	dir string
	// cfg is its config.
	cfg model.Config
	// tok is its tokenizer.
	tok *tokenizer.Tokenizer
}

var demo struct {
	once sync.Once
	info checkpointInfo
	err  error
}

// demoCheckpoint loads the demo checkpoint's config and tokenizer once.
func demoCheckpoint(t testing.TB) checkpointInfo {
	t.Helper()
	demo.once.Do(func() {
		dir, err := harness.DemoCheckpoint()
		if err != nil {
			demo.err = err
			return
		}
		ck, err := model.Open(dir)
		if err != nil {
			demo.err = err
			return
		}
		defer ck.Close()
		tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
		if err != nil {
			demo.err = err
			return
		}
		demo.info = checkpointInfo{dir: dir, cfg: ck.Config, tok: tok}
	})
	if demo.err != nil {
		t.Fatalf("demo checkpoint: %v", demo.err)
	}
	return demo.info
}

// greedyCache holds greedy runs by checkpoint, prompt and length: the CPU engine is
// run once per distinct request.
var greedyCache sync.Map

// refEngines holds one CPU engine per checkpoint folder, with a KV pool for one
// sequence of the model's maximum length; greedyTokens runs one sequence at a time.
var refEngines struct {
	// mu serialises the runs and guards byDir.
	mu sync.Mutex
	// byDir maps a checkpoint folder to its engine.
	byDir map[string]*refEngine
}

// refEngine is a loaded reference engine.
type refEngine struct {
	// e computes the reference tokens in the test process.
	e *cpu.Engine
	// blocks is the block table covering the whole pool.
	blocks []int32
}

// tokensPerBlock is the reference engine's KV block size.
const tokensPerBlock = 64

func loadRefEngine(dir string) (*refEngine, error) {
	if r, ok := refEngines.byDir[dir]; ok {
		return r, nil
	}
	m, err := model.LoadFloat32(dir)
	if err != nil {
		return nil, err
	}
	blocks := make([]int32, (m.Config.MaxPositions+tokensPerBlock-1)/tokensPerBlock)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	e, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: len(blocks), TokensPerBlock: tokensPerBlock})
	if err != nil {
		return nil, err
	}
	if refEngines.byDir == nil {
		refEngines.byDir = map[string]*refEngine{}
	}
	r := &refEngine{e: e, blocks: blocks}
	refEngines.byDir[dir] = r
	return r, nil
}

// greedyTokens runs the CPU engine on the checkpoint in dir: the prompt, then n-1
// greedy steps, and returns the n greedy tokens. It does not stop at an end token.
func greedyTokens(t testing.TB, dir string, prompt []int32, n int) []int32 {
	t.Helper()
	key := fmt.Sprint(dir, prompt, n)
	if v, ok := greedyCache.Load(key); ok {
		return v.([]int32)
	}
	refEngines.mu.Lock()
	defer refEngines.mu.Unlock()
	r, err := loadRefEngine(dir)
	if err != nil {
		t.Fatalf("greedy reference: %v", err)
	}
	history := append([]int32(nil), prompt...)
	next := prompt
	var out []int32
	for len(out) < n {
		seq := engine.Sequence{
			ID: 1, Tokens: next, Pos: len(history) - len(next), Blocks: r.blocks,
			Sample: true, Sampling: engine.SamplingParams{}, History: history,
			NumGenerated: len(out),
		}
		outs, err := r.e.Step(&engine.Batch{Seqs: []engine.Sequence{seq}})
		if err != nil {
			t.Fatalf("greedy reference: step %d: %v", len(out), err)
		}
		tok := outs[0].Token
		out = append(out, tok)
		history = append(history, tok)
		next = []int32{tok}
	}
	greedyCache.Store(key, out)
	return out
}

// excludeInputInOutput reads the shipped config's exclude_input_in_output parameter
// (false when absent, as in the TensorRT-LLM backend): whether a non-streaming
// response's output_ids and text_output leave the prompt out.
func excludeInputInOutput(t testing.TB) bool {
	t.Helper()
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(root, "model_repository", modelName, "config.pbtxt"))
	if err != nil {
		t.Fatal(err)
	}
	v, ok := harness.ConfigParameter(string(cfg), "exclude_input_in_output")
	return ok && strings.EqualFold(v, "true")
}

// wantNonStreaming is the output_ids of a non-streaming response: the generated tokens,
// after the prompt unless the model excludes it.
func wantNonStreaming(t testing.TB, prompt, generated []int32) []int32 {
	if excludeInputInOutput(t) {
		return generated
	}
	return append(append([]int32(nil), prompt...), generated...)
}

// testContext is a context for one test's requests, bounded so a hung server fails the
// test instead of the whole run.
func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// jsonPost makes a POST of body, marshalled to JSON, to url.
func jsonPost(ctx context.Context, url string, body any) (*http.Request, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

// postJSON posts body to url and returns the response body; a non-200 status is an
// error carrying the body.
func postJSON(ctx context.Context, c *http.Client, url string, body any) ([]byte, error) {
	req, err := jsonPost(ctx, url, body)
	if err != nil {
		return nil, err
	}
	return readResponse(c, req)
}

// getBody fetches url; a non-200 status is an error carrying the body.
func getBody(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return readResponse(c, req)
}

// readResponse sends req and reads the body; a non-200 status is an error carrying it.
func readResponse(c *http.Client, req *http.Request) ([]byte, error) {
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: read body: %w", req.Method, req.URL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("%s %s: %s: %s", req.Method, req.URL, resp.Status, out)
	}
	return out, nil
}

// sseEvents posts body to a generate_stream url and returns the data of each
// server-sent event, in order.
func sseEvents(ctx context.Context, c *http.Client, url string, body any) ([]string, error) {
	req, err := jsonPost(ctx, url, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		out, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("POST %s: %s: %s", url, resp.Status, out)
	}
	var events []string
	var data []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data != nil {
				events = append(events, strings.Join(data, "\n"))
				data = nil
			}
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	if data != nil {
		events = append(events, strings.Join(data, "\n"))
	}
	if err := sc.Err(); err != nil {
		return events, fmt.Errorf("POST %s: read events: %w", url, err)
	}
	return events, nil
}

// generateOutput is the part of a generate response the tests read.
type generateOutput struct {
	// TextOutput is nil when the response has none.
	TextOutput *string `json:"text_output"`
	// Error is set on an error event.
	Error string `json:"error"`
}

func decodeGenerate(b []byte) (generateOutput, error) {
	var g generateOutput
	if err := json.Unmarshal(b, &g); err != nil {
		return g, fmt.Errorf("decode %q: %w", b, err)
	}
	if g.Error != "" {
		return g, errors.New(g.Error)
	}
	if g.TextOutput == nil {
		return g, fmt.Errorf("no text_output in %s", b)
	}
	return g, nil
}

package openai

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"gollm/kserve"
)

// fakeTriton answers the unary calls the server makes before it generates: one ready
// model "m" with gollm's text tensors, and Unavailable for everything when down. It
// has no streams: these tests stop at validation (the real stack is tests/openai).
type fakeTriton struct {
	// GRPCInferenceServiceClient is nil: a call the fake does not answer panics.
	kserve.GRPCInferenceServiceClient
	// down makes every call fail as an unreachable server does.
	down bool
	// without names an input the model lacks.
	without string
}

// ServerReady reports ready unless down.
func (f *fakeTriton) ServerReady(context.Context, *kserve.ServerReadyRequest, ...grpc.CallOption) (*kserve.ServerReadyResponse, error) {
	if f.down {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	return &kserve.ServerReadyResponse{Ready: true}, nil
}

// ModelReady knows model "m" only.
func (f *fakeTriton) ModelReady(_ context.Context, in *kserve.ModelReadyRequest, _ ...grpc.CallOption) (*kserve.ModelReadyResponse, error) {
	if f.down {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	if in.Name != "m" {
		return nil, status.Errorf(codes.NotFound, "Request for unknown model: '%s' is not found", in.Name)
	}
	return &kserve.ModelReadyResponse{Ready: true}, nil
}

// ModelConfig describes "m" with the shipped config's text tensors.
func (f *fakeTriton) ModelConfig(_ context.Context, in *kserve.ModelConfigRequest, _ ...grpc.CallOption) (*kserve.ModelConfigResponse, error) {
	cfg := &kserve.ModelConfig{Name: in.Name, Backend: "gollm", MaxBatchSize: 8,
		ModelTransactionPolicy: &kserve.ModelTransactionPolicy{Decoupled: true}}
	for _, n := range []string{inTextInput, inMaxTokens, inStream, inTemperature, inTopP, inSeed, inEmbeddingBias,
		inStopWords, inReturnNumInput, inReturnNumOutput, inReturnFinish} {
		if n != f.without {
			cfg.Input = append(cfg.Input, &kserve.ModelInput{Name: n})
		}
	}
	cfg.Output = []*kserve.ModelOutput{{Name: outTextOutput}, {Name: outOutputIDs}, {Name: outNumInput}, {Name: outNumOutput}, {Name: outFinishReason}}
	return &kserve.ModelConfigResponse{Config: cfg}, nil
}

// RepositoryIndex lists "m".
func (f *fakeTriton) RepositoryIndex(context.Context, *kserve.RepositoryIndexRequest, ...grpc.CallOption) (*kserve.RepositoryIndexResponse, error) {
	if f.down {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	return &kserve.RepositoryIndexResponse{Models: []*kserve.RepositoryIndexResponse_ModelIndex{{Name: "m", Version: "1", State: "READY"}}}, nil
}

// call sends a request to a server over f and returns the status and error object.
func call(t *testing.T, f *fakeTriton, method, path, body string) (int, errorJSON, string) {
	t.Helper()
	s := New(Config{Triton: f})
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	var e errorBody
	_ = json.Unmarshal(rec.Body.Bytes(), &e)
	return rec.Code, e.Error, rec.Body.String()
}

// TestValidation checks that every bad field is refused with 400, OpenAI's error
// object, and the field named, before anything reaches Triton.
func TestValidation(t *testing.T) {
	cases := []struct {
		path, body, param, msg string
	}{
		{"/v1/completions", `{"model": "m", "prompt": "x", "temperature": 2.5}`, "temperature", "between 0 and 2"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "temperature": -1}`, "temperature", "between 0 and 2"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "top_p": 1.1}`, "top_p", "top_p"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "max_tokens": 0}`, "max_tokens", "at least 1"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "n": 0}`, "n", "between 1"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "n": 500}`, "n", "between 1"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "presence_penalty": 2.5}`, "presence_penalty", "between -2 and 2"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "frequency_penalty": -3}`, "frequency_penalty", "between -2 and 2"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "stop": ["a","b","c","d","e"]}`, "stop", "at most 4"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "stop": 3}`, "stop", "string"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "stream_options": {"include_usage": true}}`, "stream_options", "stream"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "logprobs": 6}`, "logprobs", "between 0 and 5"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "logit_bias": {"1": 5}}`, "logit_bias", "vocabulary size"},
		{"/v1/completions", `{"model": "m"}`, "prompt", "missing"},
		{"/v1/completions", `{"model": "m", "prompt": ""}`, "prompt", "empty"},
		{"/v1/completions", `{"model": "m", "prompt": ["a", "b"]}`, "prompt", "one prompt"},
		{"/v1/completions", `{"model": "m", "prompt": [1, 2]}`, "prompt", "token-id"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "suffix": "y"}`, "suffix", "not supported"},
		{"/v1/completions", `{"prompt": "x"}`, "model", "missing"},
		{"/v1/completions", `{"model": "m", "prompt": "x", "max_tokens": "ten"}`, "max_tokens", "max_tokens"},
		{"/v1/completions", `{"model": "m", "prompt": `, "", "not valid JSON"},
		{"/v1/chat/completions", `{"model": "m", "messages": []}`, "messages", "at least one"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"content": "hi"}]}`, "messages", "no role"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`, "", "only \"text\""},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}`, "tools", "function name"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "maybe"}`, "tool_choice", "not none, auto"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "tool", "content": "42"}]}`, "messages", "tool_call_id"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}`, "top_logprobs", "needs \"logprobs\""},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}`, "response_format", "does not take guided decoding"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}}`, "response_format.type", "not one of"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema"}}`, "response_format", "needs"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}`, "response_format.json_schema.name", "letters"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": [1]}}}`, "response_format.json_schema.schema", "JSON object"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "s", "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}}`, "response_format.json_schema.schema", "'additionalProperties' is required"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "s", "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"], "additionalProperties": false}}}}`, "response_format.json_schema.schema", "missing 'b'"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "foo": 1}`, "foo", "Unrecognized request argument supplied: foo"},
		{"/v1/completions", `{"model": "m", "prompt": "hi", "messages": []}`, "messages", "Unrecognized request argument supplied: messages"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "functions": []}`, "functions", "not supported"},
		{"/v1/completions", `{"model": "m", "prompt": "hi", "top_k": -5}`, "top_k", "top_k"},
		{"/v1/completions", `{"model": "m", "prompt": "hi", "min_p": 2}`, "min_p", "between 0 and 1"},
		{"/v1/completions", `{"model": "m", "prompt": "hi", "repetition_penalty": 0}`, "repetition_penalty", "(0, 100]"},
		{"/v1/completions", `{"model": "m", "prompt": "hi", "max_tokens": 4, "min_tokens": 5}`, "min_tokens", "between 0 and max_tokens"},
		{"/v1/chat/completions", `{"model": "m", "messages": [{"role": "user", "content": "hi"}]}`, "model", "no chat template"},
	}
	for _, c := range cases {
		code, e, body := call(t, &fakeTriton{}, http.MethodPost, c.path, c.body)
		if code != http.StatusBadRequest || e.Type != "invalid_request_error" || !strings.Contains(e.Message, c.msg) {
			t.Errorf("%s %s: %d %s; want 400 invalid_request_error with %q", c.path, c.body, code, body, c.msg)
			continue
		}
		if c.param != "" && (e.Param == nil || *e.Param != c.param) {
			t.Errorf("%s %s: param %v, want %q", c.path, c.body, e.Param, c.param)
		}
	}
}

// TestStatuses checks the statuses of an unknown model, a missing route, and Triton
// being down.
func TestStatuses(t *testing.T) {
	code, e, _ := call(t, &fakeTriton{}, http.MethodPost, "/v1/completions", `{"model": "zz", "prompt": "x"}`)
	if code != http.StatusNotFound || e.Code == nil || *e.Code != "model_not_found" || !strings.Contains(e.Message, `"zz"`) {
		t.Errorf("unknown model: %d %+v", code, e)
	}
	if code, _, _ := call(t, &fakeTriton{}, http.MethodGet, "/v1/nothing", ""); code != http.StatusNotFound {
		t.Errorf("unknown route: %d", code)
	}
	code, e, _ = call(t, &fakeTriton{down: true}, http.MethodPost, "/v1/completions", `{"model": "m", "prompt": "x"}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(e.Message, "connection refused") {
		t.Errorf("Triton down: %d %+v", code, e)
	}
	if code, _, _ := call(t, &fakeTriton{down: true}, http.MethodGet, "/health", ""); code != http.StatusServiceUnavailable {
		t.Errorf("health with Triton down: %d", code)
	}
	if code, _, _ := call(t, &fakeTriton{}, http.MethodGet, "/health", ""); code != http.StatusOK {
		t.Errorf("health: %d", code)
	}
	code, _, body := call(t, &fakeTriton{}, http.MethodGet, "/v1/models", "")
	if code != http.StatusOK || !strings.Contains(body, `"id":"m"`) {
		t.Errorf("models: %d %s", code, body)
	}
}

// TestBuildRequest checks the tensors a choice sends: text, max_tokens and stream;
// temperature whenever it is set (0 too: a model's default may be to sample); the seed
// and top_p only when sampling; the non-empty stop strings as stop_words; always the
// backend's counts and finish reason; and a refusal when the model lacks an input.
func TestBuildRequest(t *testing.T) {
	resp, _ := (&fakeTriton{}).ModelConfig(context.Background(), &kserve.ModelConfigRequest{Name: "m"})
	r := &registry{overrides: map[string]string{}}
	mi := r.describe(resp.Config, "1")
	const always = ",return_num_input_tokens,return_num_output_tokens,return_finish_reason"
	for _, c := range []struct {
		name   string
		p      genParams
		inputs string
	}{
		{"sampling at a temperature", genParams{temperature: ptr(float32(0.5)), seed: 9}, "text_input,max_tokens,stream,temperature,random_seed" + always},
		{"with a nucleus", genParams{temperature: ptr(float32(0.5)), topP: ptr(float32(0.9)), seed: 9}, "text_input,max_tokens,stream,temperature,random_seed,runtime_top_p" + always},
		{"greedy sends temperature 0 and no seed", genParams{temperature: ptr(float32(0)), topP: ptr(float32(0.9))}, "text_input,max_tokens,stream,temperature" + always},
		{"the model's defaults send only the seed", genParams{seed: 9}, "text_input,max_tokens,stream,random_seed" + always},
		{"stop strings", genParams{seed: 9, stop: []string{"", "\n\n"}}, "text_input,max_tokens,stream,random_seed,stop_words" + always},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := c.p
			p.prompt, p.maxTokens, p.requestID = "hi", 3, "x"
			req, err := buildRequest(mi, &p)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, in := range req.Inputs {
				names = append(names, in.Name)
			}
			if got := strings.Join(names, ","); got != c.inputs {
				t.Errorf("inputs %s, want %s", got, c.inputs)
			}
			if string(req.RawInputContents[0][4:]) != "hi" || req.Id != "x" {
				t.Errorf("text_input %q, id %q", req.RawInputContents[0], req.Id)
			}
			for i, in := range req.Inputs {
				if in.Name == inStopWords {
					if want := "\x02\x00\x00\x00\n\n"; string(req.RawInputContents[i]) != want || in.Datatype != "BYTES" || in.Shape[1] != 1 {
						t.Errorf("stop_words %s %v %q, want BYTES [1, 1] %q", in.Datatype, in.Shape, req.RawInputContents[i], want)
					}
				}
			}
		})
	}
	resp, _ = (&fakeTriton{without: inReturnFinish}).ModelConfig(context.Background(), &kserve.ModelConfigRequest{Name: "m"})
	if _, err := buildRequest(r.describe(resp.Config, "1"), &genParams{prompt: "hi", maxTokens: 3}); err == nil || !strings.Contains(err.Error(), inReturnFinish) {
		t.Errorf("a model without return_finish_reason: %v", err)
	}
	if _, err := buildRequest(mi, &genParams{prompt: "hi", maxTokens: 3, presence: 1}); err == nil || !strings.Contains(err.Error(), "presence_penalty") {
		t.Errorf("a model without presence_penalty: %v", err)
	}
}

// TestSamplingDefaults checks what a request that leaves temperature out gets:
// OpenAI's 1 on a checkpoint that decodes greedily by default, the checkpoint's own
// defaults (nothing sent) on one whose generation_config.json samples; and that top_p 0
// is greedy.
func TestSamplingDefaults(t *testing.T) {
	s := New(Config{Triton: &fakeTriton{}})
	temp := func(mi *modelInfo, f samplingFields) *float32 {
		t.Helper()
		p, _, api := s.params(mi, &f, nil, "max_tokens")
		if api != nil {
			t.Fatal(api)
		}
		return p.temperature
	}
	if got := temp(&modelInfo{}, samplingFields{}); got == nil || *got != 1 {
		t.Errorf("greedy checkpoint, no temperature: %v, want 1", got)
	}
	if got := temp(&modelInfo{samples: true}, samplingFields{}); got != nil {
		t.Errorf("sampling checkpoint, no temperature: %v, want none sent", *got)
	}
	if got := temp(&modelInfo{samples: true}, samplingFields{Temperature: ptr(0.0)}); got == nil || *got != 0 {
		t.Errorf("sampling checkpoint, temperature 0: %v, want 0", got)
	}
	if got := temp(&modelInfo{samples: true}, samplingFields{TopP: ptr(0.0)}); got == nil || *got != 0 {
		t.Errorf("top_p 0: temperature %v, want 0 (greedy)", got)
	}
}

// TestServedSeqLen checks the longest sequence the frontend assumes the backend serves.
func TestServedSeqLen(t *testing.T) {
	for _, c := range []struct {
		positions int
		param     string
		want      int
	}{
		{1024, "", 1024},
		{131072, "", 8192},
		{131072, "32768", 32768},
		{1024, "4096", 1024},
		{1024, "256", 256},
		{1024, "junk", 1024},
		{0, "256", 0},
	} {
		if got := servedSeqLen(c.positions, c.param); got != c.want {
			t.Errorf("servedSeqLen(%d, %q) = %d, want %d", c.positions, c.param, got, c.want)
		}
	}
}

package tests

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"gollm/kserve"
	"gollm/tests/harness"
)

// tokenPrompt is the token prompt of the token tests: "Hello, my name is" in GPT-2's
// vocabulary, checked against the tokenizer in TestServing.
var tokenPrompt = []int32{15496, 11, 616, 1438, 318}

// checkTokenPrompt fails the test when the checkpoint's tokenizer does not give
// tokenPrompt for testPrompt (the text and token tests must mean the same request).
func checkTokenPrompt(t *testing.T, ck checkpointInfo) {
	t.Helper()
	if got := ck.tok.Encode(testPrompt); !slices.Equal(got, tokenPrompt) {
		t.Fatalf("tokenizer: %q encodes to %v, want %v", testPrompt, got, tokenPrompt)
	}
}

func TestServing(t *testing.T) {
	s := sharedServer(t)
	ck := demoCheckpoint(t)
	c := s.Client(t)
	checkTokenPrompt(t, ck)

	t.Run("server is live and ready and the model is ready", func(t *testing.T) {
		ctx := testContext(t, 30*time.Second)
		live, err := c.ServerLive(ctx, &kserve.ServerLiveRequest{})
		if err != nil || !live.GetLive() {
			t.Errorf("ServerLive = %v, %v; want live", live, err)
		}
		ready, err := c.ServerReady(ctx, &kserve.ServerReadyRequest{})
		if err != nil || !ready.GetReady() {
			t.Errorf("ServerReady = %v, %v; want ready", ready, err)
		}
		mr, err := c.ModelReady(ctx, &kserve.ModelReadyRequest{Name: modelName})
		if err != nil || !mr.GetReady() {
			t.Errorf("ModelReady(%s) = %v, %v; want ready", modelName, mr, err)
		}
		for _, path := range []string{"/v2/health/live", "/v2/health/ready", "/v2/models/" + modelName + "/ready"} {
			resp, err := s.HTTP().Get(s.HTTPURL() + path)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("GET %s: %s, want 200", path, resp.Status)
			}
		}
	})

	t.Run("model metadata lists the token and text tensors", func(t *testing.T) {
		ctx := testContext(t, 30*time.Second)
		md, err := c.ModelMetadata(ctx, &kserve.ModelMetadataRequest{Name: modelName})
		if err != nil {
			t.Fatalf("ModelMetadata: %v", err)
		}
		types := map[string]string{}
		for _, in := range md.GetInputs() {
			types[in.GetName()] = in.GetDatatype()
		}
		for _, out := range md.GetOutputs() {
			types[out.GetName()] = out.GetDatatype()
		}
		want := map[string]string{
			"input_ids": "INT32", "input_lengths": "INT32", "request_output_len": "INT32",
			"end_id": "INT32", "streaming": "BOOL", "text_input": "BYTES", "max_tokens": "INT32",
			"stream": "BOOL", "output_ids": "INT32", "sequence_length": "INT32", "text_output": "BYTES",
		}
		for name, dt := range want {
			if types[name] != dt {
				t.Errorf("tensor %s: datatype %q, want %q", name, types[name], dt)
			}
		}
	})

	t.Run("a streaming request's tokens equal the CPU engine's greedy tokens", func(t *testing.T) {
		const n = 16
		want := greedyTokens(t, ck.dir, tokenPrompt, n)
		ctx := testContext(t, 2*time.Minute)
		res, err := streamInfer(ctx, c, inferRequest(modelName, "stream-1", tokenInputs(tokenPrompt, n, true)))
		if err != nil {
			t.Fatal(err)
		}
		if res.errMsg != "" {
			t.Fatalf("error response: %s", res.errMsg)
		}
		if !slices.Equal(res.tokens, want) {
			t.Errorf("streamed tokens %v, want greedy %v", res.tokens, want)
		}
		// Streaming means one response per token (plus perhaps an empty final one).
		if res.withTokens != n {
			t.Errorf("%d responses carried tokens, want %d (one per token)", res.withTokens, n)
		}
		if !res.final {
			t.Errorf("no response marked %s", finalParam)
		}
	})

	t.Run("a non-streaming request on the decoupled model gets one response with all tokens", func(t *testing.T) {
		const n = 12
		want := wantNonStreaming(t, tokenPrompt, greedyTokens(t, ck.dir, tokenPrompt, n))
		ctx := testContext(t, 2*time.Minute)
		res, err := streamInfer(ctx, c, inferRequest(modelName, "whole-1", tokenInputs(tokenPrompt, n, false)))
		if err != nil {
			t.Fatal(err)
		}
		if res.errMsg != "" {
			t.Fatalf("error response: %s", res.errMsg)
		}
		if res.withTokens != 1 {
			t.Errorf("%d responses carried tokens, want 1", res.withTokens)
		}
		if !slices.Equal(res.tokens, want) {
			t.Errorf("output_ids %v, want %v", res.tokens, want)
		}
		if res.seqLen != int32(len(want)) {
			t.Errorf("sequence_length %d, want %d", res.seqLen, len(want))
		}
	})

	t.Run("the generate endpoint returns the detokenized greedy text", func(t *testing.T) {
		checkGenerate(t, s, ck, 16)
	})

	t.Run("the generate_stream endpoint streams events that add up to the greedy text", func(t *testing.T) {
		const n = 16
		want := ck.tok.Decode(greedyTokens(t, ck.dir, tokenPrompt, n))
		ctx := testContext(t, 2*time.Minute)
		events, err := sseEvents(ctx, s.HTTP(), s.HTTPURL()+"/v2/models/"+modelName+"/generate_stream",
			map[string]any{"text_input": testPrompt, "max_tokens": n, "stream": true})
		if err != nil {
			t.Fatal(err)
		}
		var sb strings.Builder
		for i, ev := range events {
			g, err := decodeGenerate([]byte(ev))
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			sb.WriteString(*g.TextOutput)
		}
		if len(events) < n/2 {
			t.Errorf("%d events, want about one per token (%d)", len(events), n)
		}
		if sb.String() != want {
			t.Errorf("events add up to %q, want %q", sb.String(), want)
		}
	})
}

func TestCancellation(t *testing.T) {
	s := sharedServer(t)
	ck := demoCheckpoint(t)
	c := s.Client(t)

	t.Run("closing the stream mid-generation stops the request", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		waitMetric(t, ctx, s, metricActiveRequests, 0, 30*time.Second)
		waitMetric(t, ctx, s, metricKVBlocksUsed, 0, 30*time.Second)
		iterations := mustMetric(t, ctx, s, "gollm_iterations")
		sctx, scancel := context.WithCancel(ctx)
		stream, err := c.ModelStreamInfer(sctx)
		if err != nil {
			t.Fatal(err)
		}
		// Long enough that it is still generating when the client goes away.
		if err := stream.Send(inferRequest(modelName, "cancel-1", tokenInputs(tokenPrompt, 500, true))); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			msg, err := stream.Recv()
			if err != nil {
				t.Fatalf("response %d: %v", i, err)
			}
			if msg.GetErrorMessage() != "" {
				t.Fatalf("response %d: error %s", i, msg.GetErrorMessage())
			}
		}
		if active := mustMetric(t, ctx, s, metricActiveRequests); active != 1 {
			t.Errorf("%s = %v mid-generation, want 1", metricActiveRequests, active)
		}
		scancel()
		// Responses already buffered may still arrive; then the call ends as cancelled.
		for i := 0; ; i++ {
			_, err := stream.Recv()
			if err == nil && i < 500 {
				continue
			}
			if err == nil {
				t.Fatal("the stream still delivers 500 responses after its context was cancelled")
			}
			if status.Code(err) != codes.Canceled {
				t.Fatalf("after the cancellation: %v, want code Canceled", err)
			}
			break
		}
		// The client library says Canceled whatever the server does: the server must have
		// stopped the request, given its KV blocks back, and run far fewer iterations
		// than its 500 tokens.
		waitMetric(t, ctx, s, metricActiveRequests, 0, 30*time.Second)
		waitMetric(t, ctx, s, metricKVBlocksUsed, 0, 30*time.Second)
		ran := mustMetric(t, ctx, s, "gollm_iterations") - iterations
		if ran >= 250 {
			t.Errorf("%v iterations for a 500-token request cancelled after 3 tokens: the server did not stop it", ran)
		}
		t.Logf("the cancelled request ran %v iterations", ran)
	})

	t.Run("the server serves the next request correctly", func(t *testing.T) {
		const n = 8
		prompt := []int32{464, 2068, 7586, 21831}
		want := greedyTokens(t, ck.dir, prompt, n)
		ctx := testContext(t, 2*time.Minute)
		res, err := streamInfer(ctx, c, inferRequest(modelName, "after-cancel", tokenInputs(prompt, n, true)))
		if err != nil {
			t.Fatal(err)
		}
		if res.errMsg != "" || !slices.Equal(res.tokens, want) {
			t.Errorf("after a cancellation: tokens %v, error %q; want %v", res.tokens, res.errMsg, want)
		}
	})
}

func TestNonDecoupledModel(t *testing.T) {
	s := harness.Start(t, harness.Options{Models: []harness.Model{{NonDecoupled: true}}})
	ck := demoCheckpoint(t)
	c := s.Client(t)
	const n = 10

	t.Run("ModelInfer returns all tokens in one response", func(t *testing.T) {
		want := wantNonStreaming(t, tokenPrompt, greedyTokens(t, ck.dir, tokenPrompt, n))
		ctx := testContext(t, 2*time.Minute)
		resp, err := c.ModelInfer(ctx, inferRequest(modelName, "unary-1", tokenInputs(tokenPrompt, n, false)))
		if err != nil {
			t.Fatalf("ModelInfer: %v", err)
		}
		ids, shape, ok, err := outputInt32(resp, "output_ids")
		if err != nil || !ok {
			t.Fatalf("output_ids: present %v, %v", ok, err)
		}
		if !slices.Equal(ids, want) {
			t.Errorf("output_ids %v (shape %v), want %v", ids, shape, want)
		}
		sl, _, ok, err := outputInt32(resp, "sequence_length")
		if err != nil || !ok || len(sl) != 1 || sl[0] != int32(len(want)) {
			t.Errorf("sequence_length %v (present %v, %v), want [%d]", sl, ok, err, len(want))
		}
	})

	t.Run("the generate endpoint works on the non-decoupled model", func(t *testing.T) {
		checkGenerate(t, s, ck, n)
	})
}

func TestExplicitModelControl(t *testing.T) {
	s := harness.Start(t, harness.Options{Flags: []string{"--model-control-mode=explicit", "--load-model=" + modelName}})
	ck := demoCheckpoint(t)
	c := s.Client(t)
	const n = 6
	want := greedyTokens(t, ck.dir, tokenPrompt, n)
	serve := func(t *testing.T, id string) {
		t.Helper()
		ctx := testContext(t, 2*time.Minute)
		res, err := streamInfer(ctx, c, inferRequest(modelName, id, tokenInputs(tokenPrompt, n, true)))
		if err != nil {
			t.Fatal(err)
		}
		if res.errMsg != "" || !slices.Equal(res.tokens, want) {
			t.Fatalf("tokens %v, error %q; want %v", res.tokens, res.errMsg, want)
		}
	}
	serve(t, "explicit-0")
	for round := 1; round <= 3; round++ {
		t.Run(fmt.Sprintf("unload and load again, round %d, serves a request", round), func(t *testing.T) {
			ctx := testContext(t, 2*time.Minute)
			if _, err := c.RepositoryModelUnload(ctx, &kserve.RepositoryModelUnloadRequest{ModelName: modelName}); err != nil {
				t.Fatalf("unload: %v", err)
			}
			waitModelState(t, ctx, c, false)
			res, err := streamInfer(ctx, c, inferRequest(modelName, fmt.Sprintf("unloaded-%d", round), tokenInputs(tokenPrompt, n, true)))
			if err == nil && res.errMsg == "" {
				t.Fatalf("a request to the unloaded model succeeded: %v", res.tokens)
			}
			if _, err := c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: modelName}); err != nil {
				t.Fatalf("load: %v", err)
			}
			if err := s.WaitModelReady(ctx, c, modelName); err != nil {
				t.Fatal(err)
			}
			serve(t, fmt.Sprintf("explicit-%d", round))
		})
	}
}

// waitModelState waits until the model's readiness is ready.
func waitModelState(t *testing.T, ctx context.Context, c kserve.GRPCInferenceServiceClient, ready bool) {
	t.Helper()
	for {
		r, err := c.ModelReady(ctx, &kserve.ModelReadyRequest{Name: modelName})
		if err == nil && r.GetReady() == ready {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("model %s never became ready=%v: %v", modelName, ready, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func TestShutdown(t *testing.T) {
	t.Run("SIGINT after serving a request exits with code 0", func(t *testing.T) {
		s := harness.Start(t, harness.Options{})
		c := s.Client(t)
		ctx := testContext(t, 2*time.Minute)
		res, err := streamInfer(ctx, c, inferRequest(modelName, "before-sigint", tokenInputs(tokenPrompt, 4, true)))
		if err != nil || res.errMsg != "" || len(res.tokens) != 4 {
			t.Fatalf("request before shutdown: %v tokens, %v, error %q", len(res.tokens), err, res.errMsg)
		}
		code, err := s.Stop()
		if err != nil || code != 0 {
			t.Fatalf("Stop = %d, %v; want exit code 0", code, err)
		}
	})

	t.Run("SIGINT with a request in flight ends it at once with an error and exits with code 0", func(t *testing.T) {
		s := harness.Start(t, harness.Options{})
		c := s.Client(t)
		ctx := testContext(t, 2*time.Minute)
		stream, err := c.ModelStreamInfer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Far more tokens than the demo model makes before the server is gone.
		if err := stream.Send(inferRequest(modelName, "cut-short", tokenInputs(tokenPrompt, 1000, true))); err != nil {
			t.Fatal(err)
		}
		if first, err := stream.Recv(); err != nil || first.GetErrorMessage() != "" {
			t.Fatalf("first response: %v, error %q", err, first.GetErrorMessage())
		}
		stopped := make(chan error, 1)
		go func() {
			code, err := s.Stop()
			if err == nil && code != 0 {
				err = fmt.Errorf("exit code %d, want 0", code)
			}
			stopped <- err
		}()
		res, err := readStream(stream, "cut-short")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(res.errMsg, "shutting down") {
			t.Errorf("the request in flight ended after %d more tokens with error %q, want one saying the server is shutting down", len(res.tokens), res.errMsg)
		}
		_ = stream.CloseSend()
		if err := <-stopped; err != nil {
			t.Fatalf("Stop: %v", err)
		}
	})

	t.Run("SIGINT with a request in flight lets it finish within shutdown_grace_secs and exits with code 0", func(t *testing.T) {
		s := harness.Start(t, harness.Options{Models: []harness.Model{{Parameters: map[string]string{"shutdown_grace_secs": "15"}}}})
		ck := demoCheckpoint(t)
		const n = 200
		want := greedyTokens(t, ck.dir, tokenPrompt, n)
		c := s.Client(t)
		ctx := testContext(t, 2*time.Minute)
		stream, err := c.ModelStreamInfer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(inferRequest(modelName, "in-flight", tokenInputs(tokenPrompt, n, true))); err != nil {
			t.Fatal(err)
		}
		first, err := stream.Recv()
		if err != nil || first.GetErrorMessage() != "" {
			t.Fatalf("first response: %v, error %q", err, first.GetErrorMessage())
		}
		tokens, _, _, err := outputInt32(first.GetInferResponse(), "output_ids")
		if err != nil {
			t.Fatal(err)
		}
		type exit struct {
			code int
			err  error
		}
		stopped := make(chan exit, 1)
		go func() {
			code, err := s.Stop()
			stopped <- exit{code, err}
		}()
		// The client reads its request to the end and then ends the call, as clients
		// do; tritonserver keeps the model until open streams end.
		res, err := readStream(stream, "in-flight")
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != io.EOF {
			t.Errorf("after the final response: %v, want the end of the stream", err)
		}
		tokens = append(tokens, res.tokens...)
		if res.errMsg != "" || !slices.Equal(tokens, want) {
			t.Errorf("the request in flight ended with %d tokens, error %q; want all %d greedy tokens", len(tokens), res.errMsg, n)
		}
		select {
		case e := <-stopped:
			if e.err != nil || e.code != 0 {
				t.Fatalf("Stop = %d, %v; want exit code 0", e.code, e.err)
			}
		case <-time.After(90 * time.Second):
			t.Fatal("tritonserver did not exit within 90 s of SIGINT")
		}
	})
}

// checkGenerate asks the generate endpoint for n tokens of testPrompt and checks the
// text against the CPU engine's greedy tokens, detokenized.
func checkGenerate(t *testing.T, s *harness.Server, ck checkpointInfo, n int) {
	t.Helper()
	gen := greedyTokens(t, ck.dir, tokenPrompt, n)
	want := ck.tok.Decode(gen)
	if !excludeInputInOutput(t) {
		want = ck.tok.Decode(append(slices.Clone(tokenPrompt), gen...))
	}
	ctx := testContext(t, 2*time.Minute)
	body, err := postJSON(ctx, s.HTTP(), s.HTTPURL()+"/v2/models/"+modelName+"/generate",
		map[string]any{"text_input": testPrompt, "max_tokens": n})
	if err != nil {
		t.Fatal(err)
	}
	g, err := decodeGenerate(body)
	if err != nil {
		t.Fatal(err)
	}
	if *g.TextOutput != want {
		t.Errorf("text_output %q, want %q", *g.TextOutput, want)
	}
}

package tests

// Shutdown under load (issue 11): SIGTERM while streams are generating, with an exit
// timeout shorter than the streams, must end every stream with a final response and
// exit cleanly; a request Triton's core refuses must not hold the server up at exit.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
)

// heapCorruptionRE matches what glibc (with MALLOC_CHECK_=3) and the C++ runtime print
// when the heap is corrupted or a thread dies under an exiting process.
var heapCorruptionRE = regexp.MustCompile(`malloc|free\(\)|double free|corrupted|terminate called|Aborted|Signal \((6|11)\)|SIGSEGV|fatal error:|panic:|ASSERTION FAILED`)

// streamOutcome is how one stream ended.
type streamOutcome struct {
	// tokens counts the tokens received.
	tokens int
	// final says a response marked final (or an error response) arrived.
	final bool
	// errMsg is the error response's message, "" if none.
	errMsg string
	// recvErr is the error that ended the stream before a final response, if any.
	recvErr error
}

// sigtermRound starts a server with --exit-timeout-secs=3, opens streams that each
// want far more tokens than the server can make in 3 s, waits until every stream has
// its first token, sends SIGTERM, and checks that every stream gets a final response,
// the server exits with code 0 well before the harness's kill, and the log shows no
// heap corruption.
func sigtermRound(t *testing.T, streams int) {
	s, err := harness.Launch(harness.Options{
		ExitTimeout: 3 * time.Second,
		Env:         []string{"MALLOC_CHECK_=3"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer func() {
		if t.Failed() {
			t.Logf("tritonserver log (%s):\n%s", s.LogPath, s.LogTail(64<<10))
		}
	}()
	conn, err := s.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := kserve.NewGRPCInferenceServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// 1000 tokens take the demo model minutes at 16 streams on a CPU.
	const n = 1000
	outcomes := make([]streamOutcome, streams)
	started := make(chan int, streams)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outcomes[i] = runStream(ctx, c, fmt.Sprintf("sigterm-%d", i), n, started)
		}()
	}
	for range streams {
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatalf("not every stream started: %v", ctx.Err())
		}
	}
	sent := time.Now()
	code, err := s.StopWith(syscall.SIGTERM)
	took := time.Since(sent)
	wg.Wait()
	if err != nil {
		t.Fatalf("after SIGTERM: %v", err)
	}
	if code != 0 {
		t.Errorf("tritonserver exited with code %d after SIGTERM, want 0", code)
	}
	t.Logf("exited %v after SIGTERM", took.Round(time.Millisecond))

	for i, o := range outcomes {
		switch {
		case o.recvErr != nil:
			t.Errorf("stream %d: no final response after %d tokens: %v", i, o.tokens, o.recvErr)
		case !o.final:
			t.Errorf("stream %d: ended without a final response after %d tokens", i, o.tokens)
		case o.errMsg != "" && !strings.Contains(o.errMsg, "shutting down"):
			t.Errorf("stream %d: final error %q does not say the server is shutting down", i, o.errMsg)
		}
	}
	if m := heapCorruptionRE.FindString(s.Log()); m != "" {
		t.Errorf("the server log shows %q", m)
	}
}

// runStream sends one streaming request for n tokens, signals started at its first
// token, and reads to its final response; then it half-closes the stream and reads it
// to the end, as Triton's clients do.
func runStream(ctx context.Context, c kserve.GRPCInferenceServiceClient, id string, n int, started chan<- int) (o streamOutcome) {
	stream, err := c.ModelStreamInfer(ctx)
	if err != nil {
		o.recvErr = err
		started <- 0
		return o
	}
	if err := stream.Send(inferRequest(modelName, id, tokenInputs(tokenPrompt, n, true))); err != nil {
		o.recvErr = err
		started <- 0
		return o
	}
	signalled := false
	defer func() {
		if !signalled {
			started <- 0
		}
	}()
	for !o.final {
		msg, err := stream.Recv()
		if err != nil {
			o.recvErr = err
			return o
		}
		if e := msg.GetErrorMessage(); e != "" {
			o.errMsg, o.final = e, true
			break
		}
		r := msg.GetInferResponse()
		ids, _, ok, err := outputInt32(r, "output_ids")
		if err != nil {
			o.recvErr = err
			return o
		}
		if ok {
			o.tokens += len(ids)
		}
		if o.tokens > 0 && !signalled {
			signalled = true
			started <- 0
		}
		o.final = isFinal(r)
	}
	if err := stream.CloseSend(); err != nil {
		return o
	}
	if _, err := stream.Recv(); err != nil && !errors.Is(err, io.EOF) {
		// The server may be gone by now; the final response is what counts.
		return o
	}
	return o
}

func TestSIGTERMWithStreamsInFlight(t *testing.T) {
	demoCheckpoint(t)
	const rounds, streams = 10, 16
	for round := 1; round <= rounds; round++ {
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			sigtermRound(t, streams)
		})
		if t.Failed() {
			return
		}
	}
}

func TestUnloadWithStreamsInFlight(t *testing.T) {
	s := harness.Start(t, harness.Options{
		Flags: []string{"--model-control-mode=explicit", "--load-model=" + modelName},
		Env:   []string{"MALLOC_CHECK_=3"},
	})
	ck := demoCheckpoint(t)
	c := s.Client(t)
	ctx := testContext(t, 2*time.Minute)
	const streams = 4
	outcomes := make([]streamOutcome, streams)
	started := make(chan int, streams)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outcomes[i] = runStream(ctx, c, fmt.Sprintf("unload-%d", i), 1000, started)
		}()
	}
	for range streams {
		<-started
	}
	if _, err := c.RepositoryModelUnload(ctx, &kserve.RepositoryModelUnloadRequest{ModelName: modelName}); err != nil {
		t.Fatalf("unload: %v", err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the streams did not end within 30 s of the unload")
	}
	for i, o := range outcomes {
		if o.recvErr != nil || !strings.Contains(o.errMsg, "unloading") {
			t.Errorf("stream %d: after %d tokens: error response %q, stream error %v; want a final error saying the model is unloading", i, o.tokens, o.errMsg, o.recvErr)
		}
	}
	waitModelState(t, ctx, c, false)
	if _, err := c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: modelName}); err != nil {
		t.Fatalf("load again: %v", err)
	}
	if err := s.WaitModelReady(ctx, c, modelName); err != nil {
		t.Fatal(err)
	}
	want := greedyTokens(t, ck.dir, tokenPrompt, 6)
	res, err := streamInfer(ctx, c, inferRequest(modelName, "after-unload", tokenInputs(tokenPrompt, 6, true)))
	if err != nil || res.errMsg != "" || !slices.Equal(res.tokens, want) {
		t.Fatalf("after the reload: tokens %v, %v, error %q; want %v", res.tokens, err, res.errMsg, want)
	}
	if m := heapCorruptionRE.FindString(s.Log()); m != "" {
		t.Errorf("the server log shows %q", m)
	}
}

// TestExitAfterCoreRejectedRequest sends a request Triton's core refuses (input_ids as
// FP32 where the config says INT32), so the backend never sees it, and ends the stream
// either by half-closing it or by cancelling it; then SIGTERM. Half-closed, the server
// exits with code 0. Cancelled, tritonserver 2.51's gRPC frontend keeps the failed
// request (and with it the model) alive: a defect of its own, shown the same with its
// Python backend (see README, Known limits). The server must then still exit once
// --exit-timeout-secs has passed, with the backend holding nothing and no corruption.
func TestExitAfterCoreRejectedRequest(t *testing.T) {
	for _, tc := range []struct {
		// name reads as a sentence.
		name string
		// cancel ends the stream by cancelling the call instead of half-closing it.
		cancel bool
	}{
		{"the client half-closes its stream: exit code 0", false},
		{"the client cancels its stream: exit within the exit timeout", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const exitTimeout = 3 * time.Second
			s, err := harness.Launch(harness.Options{ExitTimeout: exitTimeout, Env: []string{"MALLOC_CHECK_=3"}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			defer func() {
				if t.Failed() {
					t.Logf("tritonserver log (%s):\n%s", s.LogPath, s.LogTail(64<<10))
				}
			}()
			conn, err := s.Dial()
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			c := kserve.NewGRPCInferenceServiceClient(conn)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			sctx, scancel := context.WithCancel(ctx)
			defer scancel()
			stream, err := c.ModelStreamInfer(sctx)
			if err != nil {
				t.Fatal(err)
			}
			req := inferRequest(modelName, "fp32", []tensor{float32s("input_ids", []int64{1, 5}, 1, 2, 3, 4, 5),
				int32s("input_lengths", []int64{1, 1}, 5), int32s("request_output_len", []int64{1, 1}, 4)})
			if err := stream.Send(req); err != nil {
				t.Fatal(err)
			}
			res, err := readStream(stream, "fp32")
			if err != nil || !strings.Contains(res.errMsg, "expects 'INT32'") {
				t.Fatalf("want Triton's datatype error, got %+v, %v", res, err)
			}
			if tc.cancel {
				scancel()
			} else {
				if err := stream.CloseSend(); err != nil {
					t.Fatal(err)
				}
				if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
					t.Fatalf("after the error response: %v, want the end of the stream", err)
				}
			}
			// The backend never saw the request: Triton counts neither an inference nor an
			// execution (the core refuses it before it counts it).
			body, err := getBody(ctx, s.HTTP(), s.HTTPURL()+"/v2/models/"+modelName+"/stats")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(body), `"inference_count":0,`) || !strings.Contains(string(body), `"execution_count":0,`) {
				t.Errorf("model statistics %s: want 0 inferences and 0 executions", body)
			}
			time.Sleep(100 * time.Millisecond)
			sent := time.Now()
			code, err := s.StopWith(syscall.SIGTERM)
			took := time.Since(sent)
			if err != nil {
				t.Fatal(err)
			}
			log := s.Log()
			t.Logf("exit code %d after %v", code, took.Round(time.Millisecond))
			switch {
			case !tc.cancel && code != 0:
				t.Errorf("exit code %d, want 0", code)
			case code != 0 && (code != 1 || !strings.Contains(log, "Exit timeout expired")):
				t.Errorf("exit code %d, want 0, or 1 after Triton's exit timeout", code)
			case code == 1 && !strings.Contains(log, "gollm: the process is exiting (status 1) with 1 model instance(s) still loaded"):
				// exit(1) with the model loaded: the backend's exit guard ends the process
				// before exit's destructors run.
				t.Error("the log does not show the backend's exit guard ending the process")
			}
			if took > exitTimeout+3*time.Second {
				t.Errorf("exit took %v, want at most the exit timeout %v and a little", took, exitTimeout)
			}
			if strings.Contains(log, "ending the requests in flight") {
				t.Error("the backend had requests in flight at shutdown")
			}
			if m := heapCorruptionRE.FindString(log); m != "" {
				t.Errorf("the server log shows %q", m)
			}
		})
	}
}

// TestSIGTERMWithHTTPStreamsInFlight shows a tritonserver 2.51 limit, so it runs only
// with GOLLM_TEST_TRITON_DEFECTS=1: at SIGTERM tritonserver first waits, for the whole
// --exit-timeout-secs, for its HTTP connections to close (generate_stream keeps them
// open), without telling the models; then it destroys its HTTP frontend with the
// requests still in flight and calls exit(1) with no time left. The backend cannot
// see the shutdown before that. With the backend's exit guard the process ends with
// code 1 (it used to die of SIGSEGV in exit's destructors every time); now and then a
// response sent into the destroyed HTTP frontend still crashes it first (2 runs in 39).
func TestSIGTERMWithHTTPStreamsInFlight(t *testing.T) {
	if os.Getenv("GOLLM_TEST_TRITON_DEFECTS") == "" {
		t.Skip("shows a tritonserver 2.51 defect; set GOLLM_TEST_TRITON_DEFECTS=1 to run it")
	}
	s, err := harness.Launch(harness.Options{ExitTimeout: 3 * time.Second, Env: []string{"MALLOC_CHECK_=3"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const streams = 4
	started := make(chan struct{}, streams)
	for range streams {
		go func() {
			body, _ := json.Marshal(map[string]any{"text_input": testPrompt, "max_tokens": 1000, "stream": true})
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.HTTPURL()+"/v2/models/"+modelName+"/generate_stream", bytes.NewReader(body))
			if err != nil {
				started <- struct{}{}
				return
			}
			resp, err := s.HTTP().Do(req)
			if err != nil {
				started <- struct{}{}
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			first := true
			for sc.Scan() {
				if first && strings.HasPrefix(sc.Text(), "data:") {
					first = false
					started <- struct{}{}
				}
			}
			if first {
				started <- struct{}{}
			}
		}()
	}
	for range streams {
		<-started
	}
	code, err := s.StopWith(syscall.SIGTERM)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exit code %d", code)
	if code != 0 && code != 1 {
		t.Errorf("exit code %d, want 0 or 1\n%s", code, s.LogTail(8<<10))
	}
}

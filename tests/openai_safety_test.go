package tests

// The OpenAI server's refusals and memory (issue 32, finding 10), through the built
// gollm-openai binary in front of a real tritonserver: max_tokens past 2^31 no longer
// wraps into a few tokens, unknown roles and user messages without content are refused
// as OpenAI refuses them, requests that arrive while tritonserver shuts down get 503,
// not 404 model_not_found. (Its memory settings, as the backend's, are tested in
// cmd/gollm-openai.)

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gollm/tests/harness"
)

// openaiServer is a running gollm-openai.
type openaiServer struct {
	// url is its base URL, such as http://127.0.0.1:40123.
	url string
	// cmd is its process.
	cmd *exec.Cmd
	// out holds its output.
	out *bytes.Buffer
}

// startOpenAI builds cmd/gollm-openai and runs it in front of s until the test ends.
func startOpenAI(t *testing.T, s *harness.Server) *openaiServer {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gollm-openai")
	build := exec.Command("go", "build", "-o", bin, "./cmd/gollm-openai")
	build.Dir = s.Root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build gollm-openai: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	o := &openaiServer{url: "http://" + addr, out: &bytes.Buffer{}}
	o.cmd = exec.Command(bin, "-triton", s.GRPCAddr(), "-listen", addr, "-model-repository", s.RepoDir)
	o.cmd.Stdout, o.cmd.Stderr = o.out, o.out
	o.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := o.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = o.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = o.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = o.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("gollm-openai's output:\n%s", o.out)
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(o.url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return o
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gollm-openai not healthy after a minute: %v\n%s", err, o.out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// post sends a JSON body and returns the status and the body read whole.
func (o *openaiServer) post(ctx context.Context, path string, body any) (int, []byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

func TestOpenAIRefusalsAndMemory(t *testing.T) {
	s := harness.Start(t, harness.Options{Models: []harness.Model{{Parameters: map[string]string{"shutdown_grace_secs": "6"}}},
		ExitTimeout: 15 * time.Second})
	o := startOpenAI(t, s)
	ctx := testContext(t, 10*time.Minute)
	user := func(text string) []map[string]any { return []map[string]any{{"role": "user", "content": text}} }

	for _, tc := range []struct {
		name, path string
		body       map[string]any
		param      string
	}{
		{"max_tokens past 2^31 is refused, not wrapped", "/v1/completions",
			map[string]any{"model": modelName, "prompt": "Hello", "max_tokens": 4294967301}, "max_tokens"},
		{"max_completion_tokens past the model's context is refused", "/v1/chat/completions",
			map[string]any{"model": modelName, "messages": user("Hello"), "max_completion_tokens": 1 << 20}, "max_completion_tokens"},
		{"an unknown role is refused", "/v1/chat/completions",
			map[string]any{"model": modelName, "messages": []map[string]any{{"role": "hacker", "content": "hi"}}}, "messages[0].role"},
		{"a user message without content is refused", "/v1/chat/completions",
			map[string]any{"model": modelName, "messages": []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user"}}}, "messages[1].content"},
		{"a user message with null content is refused", "/v1/chat/completions",
			map[string]any{"model": modelName, "messages": []map[string]any{{"role": "user", "content": nil}}}, "messages[0].content"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, err := o.post(ctx, tc.path, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			var e struct {
				Error struct {
					Param *string `json:"param"`
					Type  string  `json:"type"`
				} `json:"error"`
			}
			_ = json.Unmarshal(body, &e)
			if status != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != tc.param || e.Error.Type != "invalid_request_error" {
				t.Errorf("status %d, body %s; want 400 invalid_request_error naming %s", status, body, tc.param)
			}
		})
	}

	t.Run("an assistant message without content is still taken", func(t *testing.T) {
		status, body, err := o.post(ctx, "/v1/chat/completions", map[string]any{"model": modelName, "max_tokens": 2,
			"messages": []map[string]any{{"role": "user", "content": "Hi"}, {"role": "assistant", "content": nil}, {"role": "user", "content": "Hi again"}}})
		if err != nil || status != http.StatusOK {
			t.Errorf("status %d, %v, body %s; want 200", status, err, body)
		}
	})

	t.Run("the server logs the memory settings it runs with", func(t *testing.T) {
		if !strings.Contains(o.out.String(), "Go memory settings") {
			t.Errorf("gollm-openai's log has no line on its memory settings:\n%s", o.out)
		}
	})

	t.Run("requests that arrive while tritonserver shuts down get 503, not 404", func(t *testing.T) {
		// A long request keeps the model (shutdown_grace_secs) while the server stops.
		long := make(chan error, 1)
		go func() {
			_, _, err := o.post(ctx, "/v1/completions", map[string]any{"model": modelName, "prompt": "Hello", "max_tokens": 900, "temperature": 0})
			long <- err
		}()
		time.Sleep(500 * time.Millisecond)
		stopped := make(chan struct{})
		go func() {
			_, _ = s.StopWith(syscall.SIGTERM)
			close(stopped)
		}()
		// tritonserver takes the signal in its own time: answers go on until its shutdown
		// begins, and from the first refusal on every request must get 503.
		seen := map[int]int{}
		refusing := false
		for done := false; !done; {
			select {
			case <-stopped:
				done = true
			case <-time.After(150 * time.Millisecond):
			}
			status, body, err := o.post(ctx, "/v1/chat/completions", map[string]any{"model": modelName, "messages": user("Hi"), "max_tokens": 2})
			if err != nil {
				t.Fatal(err)
			}
			seen[status]++
			if status == http.StatusOK && !refusing {
				continue
			}
			refusing = true
			if status != http.StatusServiceUnavailable {
				t.Errorf("during the shutdown: status %d, body %s; want 503", status, strings.TrimSpace(string(body)))
			}
		}
		<-long
		t.Logf("statuses during the shutdown: %v", seen)
		if seen[http.StatusServiceUnavailable] == 0 {
			t.Errorf("no request was refused with 503 while the server shut down: %v", seen)
		}
	})
}

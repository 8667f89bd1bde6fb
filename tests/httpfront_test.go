package tests

// The guard in front of tritonserver's HTTP API (issue 32, finding 3): tritonserver
// 2.51 dies of SIGSEGV on a form-encoded request body of about 4 MB or more (curl -d's
// default type), on any endpoint. `make serve` serves Triton's HTTP API through
// httpfront, as the harness's FrontURL does: bodies over 4 MiB are refused with 413
// before they reach Triton, the form type never reaches its parser, and requests and
// streams below the bound pass as they are.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
)

// postForm posts body to url with curl -d's Content-Type and returns the status and
// the response body.
func postForm(ctx context.Context, c *http.Client, url string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// generateBody is a generate request whose body is exactly size bytes: a text_input of
// repeated letters.
func generateBody(t *testing.T, size int) []byte {
	t.Helper()
	empty, err := json.Marshal(map[string]any{"text_input": "", "max_tokens": 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(map[string]any{"text_input": strings.Repeat("a", size-len(empty)), "max_tokens": 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != size {
		t.Fatalf("body of %d bytes, want %d", len(b), size)
	}
	return b
}

func TestHTTPFront(t *testing.T) {
	s := harness.Start(t, harness.Options{})
	ck := demoCheckpoint(t)
	c := s.HTTP()
	ctx := testContext(t, 5*time.Minute)
	live := func(t *testing.T) {
		t.Helper()
		if s.Exited() {
			t.Fatalf("tritonserver exited: %s", s.LogTail(4<<10))
		}
		r, err := s.Client(t).ServerLive(ctx, &kserve.ServerLiveRequest{})
		if err != nil || !r.GetLive() {
			t.Fatalf("the server is not live: %v, %v", r, err)
		}
	}

	for _, path := range []string{"/v2/models/" + modelName + "/generate", "/v2/models/no_such_model/generate_stream", "/v2/models/" + modelName + "/infer"} {
		t.Run("a 4.5 MB form body to "+path+" is refused with 413 and the server stays up", func(t *testing.T) {
			status, body, err := postForm(ctx, c, s.FrontURL()+path, generateBody(t, 4_500_000))
			if err != nil {
				t.Fatal(err)
			}
			if status != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), "over this server's bound of 4194304 bytes") {
				t.Errorf("status %d, body %s; want 413 naming the bound", status, body)
			}
			live(t)
		})
	}

	t.Run("a chunked body over the bound is refused too", func(t *testing.T) {
		// No Content-Length: the guard counts what it reads.
		pr, pw := io.Pipe()
		go func() {
			b := generateBody(t, 5_000_000)
			for i := 0; i < len(b); i += 64 << 10 {
				if _, err := pw.Write(b[i:min(i+64<<10, len(b))]); err != nil {
					return
				}
			}
			pw.Close()
		}()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.FrontURL()+"/v2/models/"+modelName+"/generate", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		pr.CloseWithError(io.ErrClosedPipe)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("status %s, want 413", resp.Status)
		}
		live(t)
	})

	t.Run("a form body just under the bound reaches Triton without its form type, and the server stays up", func(t *testing.T) {
		// Twice 4,190,000 bytes is more than Triton's HTTP thread's 8 MiB stack: sent
		// straight to Triton as a form, this body kills it.
		status, body, err := postForm(ctx, c, s.FrontURL()+"/v2/models/"+modelName+"/generate", generateBody(t, 4_190_000))
		if err != nil {
			t.Fatal(err)
		}
		// The prompt is far longer than the model takes: the backend refuses it.
		if status != http.StatusBadRequest {
			t.Errorf("status %d, body %.300s; want 400 from the backend", status, body)
		}
		live(t)
	})

	t.Run("generate through the guard gives what Triton gives", func(t *testing.T) {
		const n = 8
		want := ck.tok.Decode(greedyTokens(t, ck.dir, tokenPrompt, n))
		body, err := postJSON(ctx, c, s.FrontURL()+"/v2/models/"+modelName+"/generate",
			map[string]any{"text_input": testPrompt, "max_tokens": n})
		if err != nil {
			t.Fatal(err)
		}
		g, err := decodeGenerate(body)
		if err != nil {
			t.Fatal(err)
		}
		if excludeInputInOutput(t) && *g.TextOutput != want {
			t.Errorf("text_output %q, want %q", *g.TextOutput, want)
		}
	})

	t.Run("generate_stream through the guard streams its events", func(t *testing.T) {
		const n = 12
		want := ck.tok.Decode(greedyTokens(t, ck.dir, tokenPrompt, n))
		events, err := sseEvents(ctx, c, s.FrontURL()+"/v2/models/"+modelName+"/generate_stream",
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
		if len(events) < n/2 || sb.String() != want {
			t.Errorf("%d events adding up to %q, want about %d adding up to %q", len(events), sb.String(), n, want)
		}
	})
}

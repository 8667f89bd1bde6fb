package httpfront

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

func TestFront(t *testing.T) {
	var got struct {
		ct   string
		body []byte
		n    int
	}
	triton := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.n++
		got.ct = r.Header.Get("Content-Type")
		got.body, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: ok\n\n")
	}))
	defer triton.Close()
	target, _ := url.Parse(triton.URL)
	f, err := New(Config{Target: target, MaxBodyBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(f)
	defer front.Close()
	post := func(t *testing.T, ct string, body io.Reader) (*http.Response, string) {
		t.Helper()
		resp, err := http.Post(front.URL+"/v2/models/m/generate", ct, body)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	t.Run("a body over the bound is refused with 413 and never forwarded", func(t *testing.T) {
		got.n = 0
		resp, body := post(t, "application/json", bytes.NewReader(make([]byte, 1001)))
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, "request body of 1001 bytes is over this server's bound of 1000 bytes") {
			t.Errorf("%s %s", resp.Status, body)
		}
		if got.n != 0 {
			t.Error("the body was forwarded")
		}
	})
	t.Run("a chunked body over the bound is refused and never forwarded", func(t *testing.T) {
		got.n = 0
		// A reader of unknown length makes the client send it chunked.
		resp, body := post(t, "application/json", io.MultiReader(strings.NewReader(strings.Repeat("a", 600)), strings.NewReader(strings.Repeat("b", 600))))
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, "over this server's bound of 1000 bytes") {
			t.Errorf("%s %s", resp.Status, body)
		}
		if got.n != 0 {
			t.Error("the body was forwarded")
		}
	})
	t.Run("a form body within the bound is forwarded whole, without its form type", func(t *testing.T) {
		resp, body := post(t, "application/x-www-form-urlencoded; charset=utf-8", strings.NewReader(`{"text_input": "hi"}`))
		if resp.StatusCode != http.StatusOK || body != "data: ok\n\n" {
			t.Errorf("%s %q", resp.Status, body)
		}
		if got.ct != "" || string(got.body) != `{"text_input": "hi"}` {
			t.Errorf("Triton got type %q, body %q", got.ct, got.body)
		}
	})
	t.Run("other types are forwarded as they are", func(t *testing.T) {
		post(t, "application/octet-stream", strings.NewReader("xyz"))
		if got.ct != "application/octet-stream" || string(got.body) != "xyz" {
			t.Errorf("Triton got type %q, body %q", got.ct, got.body)
		}
	})
	t.Run("Triton not answering is a 502 that says so", func(t *testing.T) {
		dead, _ := url.Parse("http://127.0.0.1:1")
		g, err := New(Config{Target: dead})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v2/health/ready", nil))
		if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), "did not answer") {
			t.Errorf("%d %s", rec.Code, rec.Body)
		}
	})
}

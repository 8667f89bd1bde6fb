// Package httpfront puts a guard in front of tritonserver's HTTP API.
//
// tritonserver 2.51's HTTP frontend (libevhtp) parses a request body sent as
// application/x-www-form-urlencoded — curl -d's default — as a query string into two
// buffers on its thread's stack, each the body's size: with the usual 8 MiB thread
// stack, a body of about 4 MB or more overflows it and the whole server dies of SIGSEGV
// (triton-inference-server/server#5840; any endpoint, even an unknown model's). The
// release has no option that bounds a body (--http-max-input-size came later), so the
// guard sits in front: it refuses bodies over a bound with 413 before anything reaches
// Triton, takes the form content type off the bodies it forwards (Triton reads them as
// JSON or binary tensors whatever the type says), and leaves URLs and headers to Go's
// server, which refuses more than 1 MiB of them. Responses stream through as they come
// (generate_stream's server-sent events).
package httpfront

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"

	"go.uber.org/zap"
)

// DefaultMaxBodyBytes is the default bound on a request body: far above what a request
// of gollm's models carries (a 32k-token prompt as JSON is ~200 KB, an embedding bias
// over a 150k vocabulary ~1.5 MB), below what crashes tritonserver 2.51's parser.
const DefaultMaxBodyBytes = 4 << 20

// Config configures a Front.
type Config struct {
	// Target is Triton's HTTP endpoint, such as http://127.0.0.1:8010.
	Target *url.URL
	// MaxBodyBytes bounds a request body; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Log receives refusals and proxy errors; nil means none.
	Log *zap.Logger
}

// Front is an http.Handler that forwards requests to Triton's HTTP API within the bounds.
type Front struct {
	// max bounds a request body.
	max int64
	// proxy forwards what passes.
	proxy *httputil.ReverseProxy
	// transport carries the forwarded requests; CloseIdleConnections closes its idle
	// connections.
	transport *http.Transport
	// log receives refusals and errors.
	log *zap.Logger
}

// New makes a Front.
func New(cfg Config) (*Front, error) {
	if cfg.Target == nil || cfg.Target.Host == "" {
		return nil, errors.New("httpfront: no target (Triton's HTTP endpoint)")
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("httpfront: body bound %d is negative", cfg.MaxBodyBytes)
	}
	f := &Front{max: cfg.MaxBodyBytes, log: cfg.Log}
	if f.max == 0 {
		f.max = DefaultMaxBodyBytes
	}
	if f.log == nil {
		f.log = zap.NewNop()
	}
	f.transport = http.DefaultTransport.(*http.Transport).Clone()
	target := cfg.Target
	f.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
		},
		Transport: f.transport,
		// Server-sent events go out as Triton writes them.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			f.log.Warn("forward to Triton", zap.String("path", r.URL.Path), zap.Error(err))
			writeError(w, http.StatusBadGateway, fmt.Sprintf("Triton's HTTP endpoint did not answer: %v", err))
		},
	}
	return f, nil
}

// MaxBodyBytes is the bound on a request body.
func (f *Front) MaxBodyBytes() int64 { return f.max }

// CloseIdleConnections closes the idle connections to Triton, which tritonserver
// otherwise waits for when it stops.
func (f *Front) CloseIdleConnections() { f.transport.CloseIdleConnections() }

// ServeHTTP refuses a body over the bound, else forwards the request.
func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > f.max {
		f.refuse(w, r, strconv.FormatInt(r.ContentLength, 10)+" bytes")
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		// Read whole (at most the bound) before anything is sent on, so that a chunked
		// body over the bound never reaches Triton in part either.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, f.max))
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			f.refuse(w, r, "more than that")
			return
		case err != nil:
			writeError(w, http.StatusBadRequest, fmt.Sprintf("read the request body: %v", err))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.TransferEncoding = nil
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	if isForm(r.Header.Get("Content-Type")) {
		r.Header.Del("Content-Type")
	}
	f.proxy.ServeHTTP(w, r)
}

// refuse answers 413 for a body of size (in words) over the bound.
func (f *Front) refuse(w http.ResponseWriter, r *http.Request, size string) {
	f.log.Info("request body over the bound refused", zap.String("path", r.URL.Path), zap.String("size", size),
		zap.Int64("max_bytes", f.max))
	w.Header().Set("Connection", "close")
	writeError(w, http.StatusRequestEntityTooLarge,
		fmt.Sprintf("request body of %s is over this server's bound of %d bytes", size, f.max))
}

// isForm says whether a Content-Type is application/x-www-form-urlencoded, the type
// libevhtp parses as a query string.
func isForm(ct string) bool {
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		// Unparsable here may still read as the form type to libevhtp: it goes too.
		return true
	}
	return mt == "application/x-www-form-urlencoded"
}

// writeError writes Triton's error JSON ({"error": "…"}) with status.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

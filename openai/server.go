package openai

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"gollm/kserve"
)

// Limits of a request.
const (
	// maxBodyBytes bounds a request body.
	maxBodyBytes = 16 << 20
	// maxN bounds n (OpenAI's limit).
	maxN = 128
	// maxStops bounds the stop strings (OpenAI's limit).
	maxStops = 4
	// defaultCompletionTokens is max_tokens' default for completions (OpenAI's).
	defaultCompletionTokens = 16
	// DefaultWriteTimeout is Config.WriteTimeout's default.
	DefaultWriteTimeout = 15 * time.Second
)

// Config configures a Server.
type Config struct {
	// Triton is the gRPC client of the tritonserver that serves the models.
	Triton kserve.GRPCInferenceServiceClient
	// ModelRepository is the model repository's folder on this host, where checkpoints
	// given by relative paths (or by default) are found; "" when unknown.
	ModelRepository string
	// Checkpoints map model names to checkpoint folders, overriding what Triton's
	// configuration says.
	Checkpoints map[string]string
	// Log receives diagnostics; nil means none.
	Log *zap.Logger
	// WriteTimeout bounds each write of a response to its client (each event of a
	// stream): a client that stops reading fills its connection's buffers, its next
	// write fails after WriteTimeout, and its requests are stopped in Triton, their KV
	// blocks and batch slots freed. 0 means DefaultWriteTimeout; negative, none.
	WriteTimeout time.Duration
}

// Server is the OpenAI-compatible HTTP API.
type Server struct {
	// triton is Triton's gRPC client.
	triton kserve.GRPCInferenceServiceClient
	// models describes Triton's models.
	models *registry
	// log receives diagnostics.
	log *zap.Logger
	// mux routes the requests.
	mux *http.ServeMux
	// wg counts the requests in progress, for Wait.
	wg sync.WaitGroup
	// writeTimeout is Config.WriteTimeout, its default filled in (0: none).
	writeTimeout time.Duration
}

// New makes a Server.
func New(cfg Config) *Server {
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	wt := cfg.WriteTimeout
	switch {
	case wt == 0:
		wt = DefaultWriteTimeout
	case wt < 0:
		wt = 0
	}
	s := &Server{triton: cfg.Triton, log: log, mux: http.NewServeMux(), writeTimeout: wt,
		models: &registry{client: cfg.Triton, repository: cfg.ModelRepository, overrides: cfg.Checkpoints, log: log,
			models: map[string]*modelInfo{}, files: map[string]*checkpointFiles{}, refreshing: map[string]bool{}}}
	s.mux.HandleFunc("GET /health", s.health)
	s.mux.HandleFunc("GET /v1/models", s.listModels)
	s.mux.HandleFunc("GET /v1/models/{model...}", s.getModel)
	s.mux.HandleFunc("POST /v1/completions", s.completions)
	s.mux.HandleFunc("POST /v1/chat/completions", s.chat)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &APIError{Status: http.StatusNotFound, Type: "invalid_request_error",
			Message: fmt.Sprintf("no route %s %s: gollm serves GET /v1/models, POST /v1/completions, POST /v1/chat/completions and GET /health", r.Method, r.URL.Path)})
	})
	return s
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.wg.Add(1)
	defer s.wg.Done()
	if s.writeTimeout > 0 {
		w = &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: s.writeTimeout}
	}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("handler panicked", zap.Any("panic", v), zap.String("path", r.URL.Path))
			writeError(w, &APIError{Status: http.StatusInternalServerError, Type: "server_error", Message: fmt.Sprintf("internal error: %v", v)})
		}
	}()
	s.mux.ServeHTTP(w, r)
}

// deadlineWriter gives every write and flush of a response a deadline of d from its
// start, so that a client that stops reading cannot hold a handler — and the requests it
// runs in Triton, each holding a batch slot and KV blocks — for longer than that once its
// connection's buffers are full: the failed write ends the handler, which stops them.
type deadlineWriter struct {
	http.ResponseWriter
	// rc sets the deadlines on the response's connection.
	rc *http.ResponseController
	// d is the time one write may take.
	d time.Duration
}

// arm starts a write's deadline.
func (w *deadlineWriter) arm() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.d)) }

// Write writes under a deadline.
func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.arm()
	return w.ResponseWriter.Write(p)
}

// FlushError flushes under a deadline (http.ResponseController.Flush finds it).
func (w *deadlineWriter) FlushError() error {
	w.arm()
	return w.rc.Flush()
}

// Flush is FlushError without its error, for http.Flusher.
func (w *deadlineWriter) Flush() { _ = w.FlushError() }

// Unwrap is the response it wraps (http.ResponseController finds the rest there).
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// LimitSendBuffer makes every connection ln accepts keep at most bytes of unsent data in
// the kernel (SO_SNDBUF), so that a client that stops reading blocks the server's writes
// soon — and WriteTimeout ends them — rather than after megabytes of events; 0 keeps
// the system's default.
func LimitSendBuffer(ln net.Listener, bytes int) net.Listener {
	if bytes <= 0 {
		return ln
	}
	return sendBufferListener{Listener: ln, bytes: bytes}
}

// sendBufferListener is LimitSendBuffer's listener.
type sendBufferListener struct {
	net.Listener
	// bytes is the send buffer of each connection.
	bytes int
}

// Accept accepts a connection with the send buffer set.
func (l sendBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(l.bytes)
	}
	return c, err
}

// Wait waits for the requests in progress (after the HTTP server stopped taking new ones).
func (s *Server) Wait() { s.wg.Wait() }

// health answers 200 when Triton is ready, else 503.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	res, err := s.triton.ServerReady(ctx, &kserve.ServerReadyRequest{})
	if err != nil || !res.Ready {
		msg := "Triton is not ready"
		if err != nil {
			msg = fmt.Sprintf("Triton is not reachable: %v", err)
		}
		writeError(w, &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Message: msg})
		return
	}
	w.WriteHeader(http.StatusOK)
}

// listModels answers GET /v1/models: Triton's ready models that take text.
func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	models, api := s.models.list(r.Context())
	if api != nil {
		writeError(w, api)
		return
	}
	out := ModelList{Object: "list", Data: []Model{}}
	for _, m := range models {
		out.Data = append(out.Data, Model{ID: m.name, Object: "model", Created: m.created, OwnedBy: "gollm"})
	}
	writeJSON(w, out)
}

// getModel answers GET /v1/models/{model}.
func (s *Server) getModel(w http.ResponseWriter, r *http.Request) {
	mi, api := s.models.lookup(r.Context(), r.PathValue("model"))
	if api != nil {
		writeError(w, api)
		return
	}
	writeJSON(w, Model{ID: mi.name, Object: "model", Created: mi.created, OwnedBy: "gollm"})
}

// writeJSON writes v as a 200 JSON response.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// decodeBody reads a JSON body into v. A field outside known is refused as OpenAI
// refuses it; malformed JSON is a 400.
func decodeBody(r *http.Request, v any, known map[string]bool) *APIError {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	if err != nil {
		return invalid("", "read the request body: %v", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			// Field is the path through embedded structs; the last name is the JSON's.
			field := te.Field[strings.LastIndex(te.Field, ".")+1:]
			return invalid(field, "field %q: %v", field, err)
		}
		var fe *fieldError
		if errors.As(err, &fe) {
			return invalid(fe.field, "%v", fe)
		}
		return invalid("", "the request body is not valid JSON: %v", err)
	}
	if known != nil {
		var fields map[string]json.RawMessage
		if json.Unmarshal(body, &fields) == nil {
			names := make([]string, 0, len(fields))
			for k := range fields {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, k := range names {
				if why, unsupported := unsupportedFields[k]; unsupported {
					return invalid(k, "%s is not supported: %s", k, why)
				}
				if !known[k] {
					return invalid(k, "Unrecognized request argument supplied: %s", k)
				}
			}
		}
	}
	return nil
}

// sharedFields are the fields completions and chat both read, vLLM's sampling extras
// included, and OpenAI's that change nothing about the answer (accepted, unused).
var sharedFields = []string{"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
	"presence_penalty", "frequency_penalty", "logit_bias", "seed", "user",
	"top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
	"store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier"}

// fieldSet is a set of field names: shared plus more.
func fieldSet(more ...string) map[string]bool {
	m := map[string]bool{}
	for _, f := range append(append([]string{}, sharedFields...), more...) {
		m[f] = true
	}
	return m
}

var (
	// completionFields are /v1/completions' fields.
	completionFields = fieldSet("prompt", "echo", "logprobs", "suffix", "best_of")
	// chatFields are /v1/chat/completions' fields.
	chatFields = fieldSet("messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
		"parallel_tool_calls", "response_format")
)

// unsupportedFields are OpenAI's fields gollm knows and does not serve, with why.
var unsupportedFields = map[string]string{
	"functions":          "use tools",
	"function_call":      "use tool_choice",
	"audio":              "the models served take and give text only",
	"modalities":         "the models served take and give text only",
	"prediction":         "predicted outputs are not implemented",
	"reasoning_effort":   "the models served do not reason apart from their answer",
	"web_search_options": "there is no web search",
}

// requestID is the client's X-Request-Id (printable, at most 128 bytes) or a new one.
func requestID(r *http.Request) (string, *APIError) {
	id := r.Header.Get("X-Request-Id")
	if id == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:]), nil
	}
	if len(id) > 128 || strings.IndexFunc(id, func(c rune) bool { return c < 0x21 || c > 0x7e }) >= 0 {
		return "", invalid("", "header X-Request-Id must be at most 128 printable ASCII characters without spaces")
	}
	return id, nil
}

// params validates the fields completions and chat share and returns the settings
// every choice starts from, and n.
func (s *Server) params(mi *modelInfo, f *samplingFields, maxTokens *int, maxTokensName string) (*genParams, int, *APIError) {
	p := &genParams{}
	n := 1
	if f.N != nil {
		n = *f.N
		if n < 1 || n > maxN {
			return nil, 0, invalid("n", "n must be between 1 and %d, got %d", maxN, n)
		}
	}
	if maxTokens != nil {
		switch v := *maxTokens; {
		case v < 1:
			return nil, 0, invalid(maxTokensName, "%s must be at least 1, got %d", maxTokensName, v)
		case mi.maxSeqLen > 0 && v > mi.maxSeqLen:
			return nil, 0, invalid(maxTokensName, "%s is too large: %d. This model's maximum sequence length is %d tokens", maxTokensName, v, mi.maxSeqLen)
		case v > math.MaxInt32:
			// Triton's max_tokens is INT32: a larger number would wrap.
			return nil, 0, invalid(maxTokensName, "%s is too large: %d, more than %d", maxTokensName, v, math.MaxInt32)
		}
		p.maxTokens = *maxTokens
	}
	if f.Temperature != nil {
		t := *f.Temperature
		if !(t >= 0 && t <= 2) {
			return nil, 0, invalid("temperature", "temperature must be between 0 and 2, got %v", t)
		}
		p.temperature = ptr(float32(t))
	}
	if f.TopP != nil {
		tp := *f.TopP
		if !(tp >= 0 && tp <= 1) {
			return nil, 0, invalid("top_p", "top_p must be between 0 and 1, got %v", tp)
		}
		p.topP = ptr(float32(tp))
		if tp == 0 {
			// The smallest nucleus is the most likely token alone: greedy, exactly.
			p.temperature = ptr(float32(0))
		}
	}
	if p.temperature == nil && !mi.samples {
		// OpenAI's default temperature, where the checkpoint does not say to sample
		// (the backend would decode greedily); a checkpoint that does gives its own.
		p.temperature = ptr(float32(1))
	}
	for name, v := range map[string]*float64{"presence_penalty": f.PresencePenalty, "frequency_penalty": f.FrequencyPenalty} {
		if v != nil && !(*v >= -2 && *v <= 2) {
			return nil, 0, invalid(name, "%s must be between -2 and 2, got %v", name, *v)
		}
	}
	if f.PresencePenalty != nil {
		p.presence = float32(*f.PresencePenalty)
	}
	if f.FrequencyPenalty != nil {
		p.frequency = float32(*f.FrequencyPenalty)
	}
	if len(f.Stop) > maxStops {
		return nil, 0, invalid("stop", "at most %d stop strings, got %d", maxStops, len(f.Stop))
	}
	p.stop = f.Stop
	if !f.Stream && f.StreamOptions != nil {
		return nil, 0, invalid("stream_options", "stream_options is only allowed with \"stream\": true")
	}
	if len(f.LogitBias) > 0 {
		if mi.vocab == 0 {
			return nil, 0, invalid("logit_bias", "logit_bias needs the model's vocabulary size, from its checkpoint's config.json, which the frontend cannot read: %v", mi.tokErr)
		}
		p.bias = make([]float32, mi.vocab)
		for k, v := range f.LogitBias {
			id, err := strconv.Atoi(k)
			if err != nil || id < 0 || id >= mi.vocab {
				return nil, 0, invalid("logit_bias", "logit_bias key %q is not a token id in [0, %d)", k, mi.vocab)
			}
			if !(v >= -100 && v <= 100) {
				return nil, 0, invalid("logit_bias", "logit_bias[%s] = %v must be between -100 and 100", k, v)
			}
			p.bias[id] = float32(v)
		}
	}
	if f.TopK != nil {
		if *f.TopK < -1 {
			return nil, 0, invalid("top_k", "top_k must be -1 or 0 (no limit) or a positive number, got %d", *f.TopK)
		}
		p.topK = max(0, *f.TopK)
	}
	if f.MinP != nil {
		if !(*f.MinP >= 0 && *f.MinP <= 1) {
			return nil, 0, invalid("min_p", "min_p must be between 0 and 1, got %v", *f.MinP)
		}
		p.minP = float32(*f.MinP)
	}
	if f.RepetitionPenalty != nil {
		if !(*f.RepetitionPenalty > 0 && *f.RepetitionPenalty <= 100) {
			return nil, 0, invalid("repetition_penalty", "repetition_penalty must be in (0, 100] (1: none), got %v", *f.RepetitionPenalty)
		}
		p.repetition = float32(*f.RepetitionPenalty)
	}
	if f.MinTokens != nil {
		if *f.MinTokens < 0 || p.maxTokens > 0 && *f.MinTokens > p.maxTokens {
			return nil, 0, invalid("min_tokens", "min_tokens must be between 0 and max_tokens, got %d", *f.MinTokens)
		}
		p.minTokens = *f.MinTokens
	}
	p.ignoreEOS = f.IgnoreEOS
	if f.Seed != nil {
		p.seed = uint64(*f.Seed)
	} else {
		// OpenAI samples afresh without a seed; the backend's default seed is fixed.
		var b [8]byte
		_, _ = rand.Read(b[:])
		p.seed = binary.LittleEndian.Uint64(b[:])
	}
	return p, n, nil
}

// choiceParams is choice i's settings: the same as every choice's but the seed, which
// is seed + i (so n choices differ, and a request with the same seed repeats them).
func choiceParams(base *genParams, i int, id string, n int) *genParams {
	p := *base
	p.seed = base.seed + uint64(i)
	p.requestID = id
	if n > 1 {
		p.requestID = id + "-" + strconv.Itoa(i)
	}
	return &p
}

// generation runs the n choices of a request and hands their pieces to the handler.
// One choice runs in the handler's own goroutine (no hand-off per token: a frontend on a
// busy machine pays for every goroutine wake-up); several run one goroutine each and
// meet on a channel.
type generation struct {
	// ctx is the request's context; cancel ends every choice.
	ctx    context.Context
	cancel context.CancelFunc
	// runners run one choice each.
	runners []*choiceRunner
}

// start prepares the n choices of base on mi, each its own Triton request; each runs them.
func (s *Server) start(ctx context.Context, mi *modelInfo, base *genParams, n int, id string) *generation {
	ctx, cancel := context.WithCancel(ctx)
	g := &generation{ctx: ctx, cancel: cancel}
	for i := range n {
		g.runners = append(g.runners, &choiceRunner{client: s.triton, mi: mi, p: choiceParams(base, i, id, n), index: i, log: s.log})
	}
	return g
}

// each runs the choices and calls f with every piece (a choice's pieces in order) until
// all choices ended or f returns false; then every choice still running is cancelled,
// and each returns once all of them have.
func (g *generation) each(f func(piece) bool) {
	defer g.cancel()
	if len(g.runners) == 1 {
		stopped := false
		c := g.runners[0]
		c.emit = func(pc piece) {
			if !stopped && !f(pc) {
				stopped = true
				g.cancel()
			}
		}
		c.run(g.ctx)
		return
	}
	pieces := make(chan piece, 16*len(g.runners))
	var wg sync.WaitGroup
	for _, c := range g.runners {
		c.emit = func(pc piece) {
			select {
			case pieces <- pc:
			case <-g.ctx.Done():
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.run(g.ctx)
		}()
	}
	go func() {
		wg.Wait()
		close(pieces)
	}()
	for pc := range pieces {
		if !f(pc) {
			g.cancel()
			break
		}
	}
	for range pieces {
		// Drain until every choice's goroutine has returned.
	}
}

// choiceResult is one choice, collected.
type choiceResult struct {
	// text joins the choice's pieces.
	text strings.Builder
	// tokens are its tokens (with logprobs only).
	tokens []tokenInfo
	// finish holds the backend's finish_reason.
	finish string
	// prompt and completion count tokens for usage.
	prompt, completion int
}

// collect reads every piece of g into n results, or returns the first error.
func collect(g *generation, n int) ([]choiceResult, *APIError) {
	res := make([]choiceResult, n)
	var fail *APIError
	g.each(func(pc piece) bool {
		if pc.err != nil {
			fail = pc.err
			return false
		}
		c := &res[pc.index]
		c.text.WriteString(pc.text)
		c.tokens = append(c.tokens, pc.tokens...)
		if pc.finish != "" {
			c.finish, c.prompt, c.completion = pc.finish, pc.promptTokens, pc.completionTokens
		}
		return true
	})
	if fail != nil {
		return nil, fail
	}
	return res, nil
}

// usageOf sums the choices' counts: the prompt once, the completions all.
func usageOf(res []choiceResult) *Usage {
	u := &Usage{}
	for i, c := range res {
		if i == 0 {
			u.PromptTokens = c.prompt
		}
		u.CompletionTokens += c.completion
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// sseWriter writes Server-Sent Events.
type sseWriter struct {
	// w carries the events to the client; flush pushes each out.
	w http.ResponseWriter
	// flush pushes each event out at once; an error means the client is gone (or not
	// reading).
	flush func() error
	// started says the headers went out.
	started bool
	// buf holds one event while it is built, reused.
	buf bytes.Buffer
	// ev is buf for events appended by hand (chunkAppender).
	ev []byte
}

// start sends the headers of an event stream.
func (e *sseWriter) start(id string) {
	h := e.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Request-Id", id)
	e.w.WriteHeader(http.StatusOK)
	e.started = true
}

// event writes one data event holding v as JSON.
func (e *sseWriter) event(v any) error {
	if ca, ok := v.(chunkAppender); ok {
		b, ok := ca.appendChunk(append(e.ev[:0], "data: "...))
		if ok {
			e.ev = append(b, '\n', '\n')
			if _, err := e.w.Write(e.ev); err != nil {
				return err
			}
			e.flush()
			return nil
		}
	}
	e.buf.Reset()
	e.buf.WriteString("data: ")
	// Encode adds a newline; one more ends the event.
	if err := json.NewEncoder(&e.buf).Encode(v); err != nil {
		return err
	}
	e.buf.WriteByte('\n')
	if _, err := e.w.Write(e.buf.Bytes()); err != nil {
		return err
	}
	return e.flush()
}

// done writes the final "[DONE]" event.
func (e *sseWriter) done() {
	_, _ = io.WriteString(e.w, "data: [DONE]\n\n")
	_ = e.flush()
}

// newSSE wraps w.
func newSSE(w http.ResponseWriter) *sseWriter {
	rc := http.NewResponseController(w)
	flush := func() error {
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		return nil
	}
	return &sseWriter{w: w, flush: flush}
}

// streamPieces sends g's pieces as events made by chunk, then the usage chunk when
// asked and [DONE]. The headers wait for the first piece, so that a request the
// backend refuses at once gets a plain error response with its status.
func streamPieces(w http.ResponseWriter, g *generation, id string, n int, includeUsage bool,
	chunk func(pc piece) any, usageChunk func(u *Usage) any) {
	sse := newSSE(w)
	res := make([]choiceResult, n)
	failed, gone := false, false
	g.each(func(pc piece) bool {
		if pc.err != nil {
			failed = true
			if !sse.started {
				writeError(w, pc.err)
				return false
			}
			// Too late for a status: the error goes as an event, as OpenAI does.
			_ = sse.event(errorBody{Error: errorJSON{Message: pc.err.Message, Type: pc.err.Type}})
			return false
		}
		if !sse.started {
			sse.start(id)
		}
		if pc.finish != "" {
			res[pc.index].prompt, res[pc.index].completion = pc.promptTokens, pc.completionTokens
		}
		// A failed write means the client went away: stop, which cancels the requests.
		gone = sse.event(chunk(pc)) != nil
		return !gone
	})
	if failed || gone {
		return
	}
	if !sse.started {
		sse.start(id)
	}
	if includeUsage {
		if err := sse.event(usageChunk(usageOf(res))); err != nil {
			return
		}
	}
	sse.done()
}

// ptr returns a pointer to v.
func ptr[T any](v T) *T { return &v }

// finishPtr returns a pointer to the reason, nil for "".
func finishPtr(reason string) *string {
	if reason == "" {
		return nil
	}
	return &reason
}

// byteInts are s's bytes as ints, as OpenAI's logprobs give them.
func byteInts(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out
}

// round6 keeps JSON short; log-probabilities need no more digits.
func round6(v float64) float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return -9999
	}
	return math.Round(v*1e6) / 1e6
}

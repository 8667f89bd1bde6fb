// Command gollm-openai serves an OpenAI-compatible API (/v1/models, /v1/completions,
// /v1/chat/completions, /health) in front of a running tritonserver that serves gollm
// models, talking to it over gRPC. Chat prompts are rendered with each model's chat
// template, read from its checkpoint's tokenizer_config.json on this host.
//
// With -http-front LISTEN=TRITON it also serves tritonserver's own HTTP endpoints (its
// HTTP API, its metrics) on LISTEN through a guard that refuses request bodies over
// -max-request-bytes before they reach tritonserver 2.51's HTTP parser, which crashes on
// large form-encoded bodies (package httpfront).
//
//	gollm-openai -triton 127.0.0.1:8001 -listen :9000 -model-repository model_repository \
//	    -http-front :8000=127.0.0.1:8010 -http-front :8002=127.0.0.1:8012
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"gollm/httpfront"
	"gollm/kserve"
	"gollm/openai"
)

// defaultSendBuffer is -send-buffer's default: room for a few hundred events of a
// stream, and for a large answer at full speed on a local network.
const defaultSendBuffer = 256 << 10

// checkpointFlag collects -checkpoint MODEL=FOLDER.
type checkpointFlag map[string]string

// String lists the pairs.
func (c checkpointFlag) String() string {
	var parts []string
	for k, v := range c {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

// Set adds one MODEL=FOLDER.
func (c checkpointFlag) Set(v string) error {
	name, dir, ok := strings.Cut(v, "=")
	if !ok || name == "" || dir == "" {
		return fmt.Errorf("want MODEL=FOLDER, got %q", v)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	c[name] = abs
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gollm-openai:", err)
		os.Exit(1)
	}
}

// run parses the flags and serves until SIGINT or SIGTERM.
func run() error {
	checkpoints := checkpointFlag{}
	triton := flag.String("triton", "127.0.0.1:8001", "tritonserver's gRPC address")
	listen := flag.String("listen", ":9000", "the address to serve the OpenAI API on")
	repo := flag.String("model-repository", "", "the model repository tritonserver serves (on this host), where checkpoints given by relative or default paths are found")
	flag.Var(checkpoints, "checkpoint", "MODEL=FOLDER: the checkpoint folder of a model, overriding its gpt_model_path (repeatable)")
	writeTimeout := flag.Duration("write-timeout", openai.DefaultWriteTimeout, "how long one write of a response (one event of a stream) may wait for its client; a client that stops reading longer has its requests stopped in Triton, freeing their batch slots and KV blocks (negative: no limit)")
	sendBuffer := flag.Int("send-buffer", defaultSendBuffer, "the kernel's send buffer of each client connection, in bytes: a client that stops reading blocks the server's writes once this and its own receive buffer are full, and -write-timeout counts from then (0: the system's default, which grows to megabytes)")
	fronts := frontFlag{}
	flag.Var(&fronts, "http-front", "LISTEN=TRITON: serve tritonserver's HTTP endpoint at TRITON (host:port) on LISTEN through the guard (repeatable)")
	maxRequest := flag.Int64("max-request-bytes", httpfront.DefaultMaxBodyBytes, "the largest request body -http-front passes on to tritonserver")
	verbose := flag.Bool("v", false, "log every request")
	cpuProfile := flag.String("cpuprofile", "", "write a Go CPU profile of the whole run to this file (read it with go tool pprof)")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}

	zcfg := zap.NewProductionConfig()
	if *verbose {
		zcfg.Level = zap.NewAtomicLevelAt(zap.DebugLevel)
	}
	log, err := zcfg.Build()
	if err != nil {
		return fmt.Errorf("logger: %w", err)
	}
	defer func() { _ = log.Sync() }()
	if *repo != "" {
		if *repo, err = filepath.Abs(*repo); err != nil {
			return fmt.Errorf("-model-repository: %w", err)
		}
	}

	// Static, large flow-control windows: gRPC then skips its bandwidth-delay pings,
	// which a stream of one small response per token would otherwise keep sending.
	conn, err := grpc.NewClient(*triton, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)),
		grpc.WithInitialWindowSize(64<<20), grpc.WithInitialConnWindowSize(256<<20))
	if err != nil {
		return fmt.Errorf("dial Triton at %s: %w", *triton, err)
	}
	defer conn.Close()
	srv := openai.New(openai.Config{Triton: kserve.NewGRPCInferenceServiceClient(conn), ModelRepository: *repo,
		Checkpoints: checkpoints, Log: log, WriteTimeout: *writeTimeout})

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	ln = openai.LimitSendBuffer(ln, *sendBuffer)
	configureMemory(log)
	hs := &http.Server{Handler: &idleRelease{h: srv, log: log}, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving the OpenAI API", zap.String("listen", ln.Addr().String()), zap.String("triton", *triton), zap.String("model_repository", *repo))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1+len(fronts))
	go func() { errc <- hs.Serve(ln) }()
	var guards []*http.Server
	for _, fr := range fronts {
		g, err := serveFront(fr.target, fr.listen, *maxRequest, log, errc)
		if err != nil {
			_ = hs.Close()
			for _, g := range guards {
				_ = g.Close()
			}
			return err
		}
		guards = append(guards, g)
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, g := range guards {
		// Streams through a guard end when tritonserver ends them.
		_ = g.Close()
	}
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	srv.Wait()
	return nil
}

// frontFlag collects -http-front LISTEN=TRITON.
type frontFlag []struct{ listen, target string }

// String lists the pairs.
func (f *frontFlag) String() string {
	var parts []string
	for _, p := range *f {
		parts = append(parts, p.listen+"="+p.target)
	}
	return strings.Join(parts, ",")
}

// Set adds one LISTEN=TRITON.
func (f *frontFlag) Set(v string) error {
	listen, target, ok := strings.Cut(v, "=")
	if !ok || listen == "" || target == "" {
		return fmt.Errorf("want LISTEN=TRITON (such as :8000=127.0.0.1:8010), got %q", v)
	}
	*f = append(*f, struct{ listen, target string }{listen, target})
	return nil
}

// serveFront serves tritonserver's HTTP endpoint at tritonHTTP on listen through the
// guard (httpfront); a serving error goes to errc.
func serveFront(tritonHTTP, listen string, maxBody int64, log *zap.Logger, errc chan<- error) (*http.Server, error) {
	target, err := url.Parse("http://" + tritonHTTP)
	if err != nil {
		return nil, fmt.Errorf("-http-front %s=%s: %w", listen, tritonHTTP, err)
	}
	f, err := httpfront.New(httpfront.Config{Target: target, MaxBodyBytes: maxBody, Log: log.Named("http-front")})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", listen, err)
	}
	// No write timeout: generate_stream streams for as long as a generation runs.
	hs := &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving a tritonserver HTTP endpoint through the guard", zap.String("listen", ln.Addr().String()),
		zap.String("triton_http", tritonHTTP), zap.Int64("max_request_bytes", f.MaxBodyBytes()))
	go func() { errc <- hs.Serve(ln) }()
	return hs, nil
}

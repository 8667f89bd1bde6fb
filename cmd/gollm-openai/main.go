// Command gollm-openai serves an OpenAI-compatible API (/v1/models, /v1/completions,
// /v1/chat/completions, /health) in front of a running tritonserver that serves gollm
// models, talking to it over gRPC. Chat prompts are rendered with each model's chat
// template, read from its checkpoint's tokenizer_config.json on this host.
//
//	gollm-openai -triton 127.0.0.1:8001 -listen :9000 -model-repository model_repository
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
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
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving the OpenAI API", zap.String("listen", ln.Addr().String()), zap.String("triton", *triton), zap.String("model_repository", *repo))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	srv.Wait()
	return nil
}

// Package harness starts the installed tritonserver with the gollm backend for the
// integration tests, on loopback with free ports and a model repository prepared in a
// temporary folder, and stops it again.
//
// The backend's shared library is never loaded into the test process: a process holds
// one Go runtime, and the backend brings its own. Tests talk to the server only through
// its HTTP, gRPC and metrics endpoints.
package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"gollm/httpfront"
	"gollm/kserve"
)

// Paths below the repository root.
const (
	// serverBin is the tritonserver that scripts/deps.sh installs.
	serverBin = ".deps/bin/tritonserver"
	// perfAnalyzerBin is the perf_analyzer wrapper that scripts/deps.sh installs.
	perfAnalyzerBin = ".deps/bin/perf_analyzer"
	// backendDir is Triton's backend directory that `make build` installs into.
	backendDir = "build/install/backends"
	// backendLib is the backend library inside backendDir.
	backendLib = "gollm/libtriton_gollm.so"
	// shippedModel is the model folder whose config.pbtxt the harness copies.
	shippedModel = "model_repository/gpt2"
	// demoCheckpoint is where `make demo` writes the demo checkpoint.
	demoCheckpoint = "model_repository/gpt2/1"
)

// DefaultReadyTimeout bounds the wait for /v2/health/ready.
const DefaultReadyTimeout = 3 * time.Minute

// stopTimeout bounds the wait for the server to exit after SIGINT; tritonserver itself
// waits up to --exit-timeout-secs for in-flight requests, which the harness sets lower.
const stopTimeout = 60 * time.Second

// Model is one model of the prepared repository: a copy of the shipped
// model_repository/gpt2/config.pbtxt (or of Config) with these changes.
type Model struct {
	// Name is the model's name and folder; empty means "gpt2".
	Name string
	// NonDecoupled turns model_transaction_policy's decoupled off, so ModelInfer works.
	NonDecoupled bool
	// Parameters set (or add) config parameters, by key, as string values.
	Parameters map[string]string
	// InstanceCount sets instance_group's count when positive.
	InstanceCount int
	// MaxBatchSize sets max_batch_size when positive.
	MaxBatchSize int
	// Checkpoint is the checkpoint folder for gpt_model_path; empty means the demo
	// checkpoint. Relative paths are taken from the repository root.
	Checkpoint string
	// Outputs keeps only these of the config's outputs, in the config's order; nil
	// keeps all.
	Outputs []string
	// Config is the config.pbtxt to copy instead of the shipped gpt2 one, relative to
	// the repository root (examples/trtllm/preprocessing/config.pbtxt).
	Config string
	// Dir is a whole model folder (config.pbtxt and version folders) to copy as it is,
	// relative to the repository root, such as a model of another backend; the fields
	// above but Name are then not used.
	Dir string
}

// Options configure a server.
type Options struct {
	// Models are the repository's models; nil means the shipped gpt2 model as it is,
	// pointed at the demo checkpoint. Use Empty for a repository with no model.
	Models []Model
	// Empty prepares a repository without models (Models is ignored).
	Empty bool
	// Flags are extra tritonserver flags, such as "--model-control-mode=explicit".
	Flags []string
	// ReadyTimeout bounds the wait for readiness; zero means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// LogVerbose is tritonserver's --log-verbose level; zero takes the environment
	// variable GOLLM_TRITON_LOG_VERBOSE (for debugging a run), else 0.
	LogVerbose int
	// ExitTimeout is tritonserver's --exit-timeout-secs; zero means DefaultExitTimeout.
	ExitTimeout time.Duration
	// BackendDir is tritonserver's --backend-directory; empty means the one `make build`
	// installs gollm into. PythonBackendDir makes one that also holds Triton's Python
	// backend.
	BackendDir string
	// Env are extra environment variables of the server process ("NAME=value"), such
	// as MALLOC_CHECK_=3 or GOMEMLIMIT.
	Env []string
}

// DefaultExitTimeout is the harness's --exit-timeout-secs, lower than Triton's 30 s.
const DefaultExitTimeout = 20 * time.Second

// Server is a running tritonserver.
type Server struct {
	// Root locates the build and the .deps the server runs from.
	Root string
	// RepoDir holds a temporary copy that the test owns.
	RepoDir string
	// LogPath is the file that holds the server's stdout and stderr.
	LogPath string
	// HTTPPort, GRPCPort and MetricsPort were free loopback ports at start.
	HTTPPort, GRPCPort, MetricsPort int
	// cmd runs tritonserver until Stop.
	cmd *exec.Cmd
	// done is closed when the process has exited; waitErr is Wait's result then.
	done chan struct{}
	// waitErr is the error of cmd.Wait, valid once done is closed.
	waitErr error
	// logFile is the open log file, closed when the process has exited.
	logFile *os.File
	// tmp is the folder Launch created for the repository and log, removed by Close.
	tmp string
	// http is the client of HTTP and Stop closes its idle connections.
	http *http.Client
	// front is the guard in front of the HTTP endpoint (FrontURL), as `make serve` runs
	// it; frontSrv serves it.
	front    *httpfront.Front
	frontSrv *http.Server
	// FrontPort is the guard's loopback port.
	FrontPort int
}

// Root finds the repository root: the nearest parent folder of the working directory
// that holds go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find repository root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// DemoCheckpoint is the absolute path of the demo checkpoint that `make demo` writes.
func DemoCheckpoint() (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, demoCheckpoint)
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
		return "", fmt.Errorf("demo checkpoint missing in %s (run `make demo`): %w", dir, err)
	}
	return dir, nil
}

// PerfAnalyzer is the absolute path of the perf_analyzer wrapper.
func PerfAnalyzer() (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, perfAnalyzerBin)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("perf_analyzer missing at %s (run `make deps`): %w", p, err)
	}
	return p, nil
}

// Start launches a server for the test and stops it when the test ends: it prints the
// server log if the test failed and fails the test if the server did not exit with
// code 0. A missing tritonserver, backend or demo checkpoint fails the test with the
// make target that provides it.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := Launch(opts)
	if err != nil {
		t.Fatalf("start tritonserver: %v", err)
	}
	t.Cleanup(func() {
		code, err := s.Stop()
		if err != nil {
			t.Errorf("stop tritonserver: %v", err)
		} else if code != 0 {
			t.Errorf("tritonserver exited with code %d, want 0", code)
		}
		if t.Failed() {
			t.Logf("tritonserver log (%s):\n%s", s.LogPath, s.LogTail(256<<10))
		}
		s.Close()
	})
	return s
}

// Launch starts a server and waits until it is ready. The caller must Stop and Close
// it. On failure the error carries the tail of the server log.
func Launch(opts Options) (*Server, error) {
	root, err := Root()
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(root, serverBin)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("tritonserver missing at %s (run `make deps`): %w", bin, err)
	}
	// An empty repository needs no backend; it lets the harness test itself.
	if !opts.Empty {
		lib := filepath.Join(root, backendDir, backendLib)
		if _, err := os.Stat(lib); err != nil {
			return nil, fmt.Errorf("gollm backend missing at %s (run `make build`): %w", lib, err)
		}
	}
	tmp, err := os.MkdirTemp("", "gollm-triton-")
	if err != nil {
		return nil, fmt.Errorf("launch tritonserver: %w", err)
	}
	repo := filepath.Join(tmp, "models")
	if err := prepareRepository(root, repo, opts); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	// A free port found now may be taken before tritonserver binds it; try again with
	// fresh ports when that happens.
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		s := &Server{Root: root, RepoDir: repo, tmp: tmp,
			LogPath: filepath.Join(tmp, fmt.Sprintf("tritonserver-%d.log", attempt)),
			http:    &http.Client{Transport: &http.Transport{}}}
		err := s.start(bin, opts)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if !strings.Contains(s.LogTail(64<<10), "already in use") {
			break
		}
	}
	os.RemoveAll(tmp)
	return nil, lastErr
}

// start runs the process once and waits for readiness.
func (s *Server) start(bin string, opts Options) error {
	verbose := opts.LogVerbose
	if verbose == 0 {
		verbose, _ = strconv.Atoi(os.Getenv("GOLLM_TRITON_LOG_VERBOSE"))
	}
	exitTimeout := opts.ExitTimeout
	if exitTimeout == 0 {
		exitTimeout = DefaultExitTimeout
	}
	ports, err := freePorts(3)
	if err != nil {
		return fmt.Errorf("launch tritonserver: %w", err)
	}
	s.HTTPPort, s.GRPCPort, s.MetricsPort = ports[0], ports[1], ports[2]
	backends := opts.BackendDir
	if backends == "" {
		backends = filepath.Join(s.Root, backendDir)
	}
	args := []string{
		"--model-repository=" + s.RepoDir,
		"--backend-directory=" + backends,
		"--http-address=127.0.0.1", "--http-port=" + strconv.Itoa(s.HTTPPort),
		"--grpc-address=127.0.0.1", "--grpc-port=" + strconv.Itoa(s.GRPCPort),
		"--metrics-address=127.0.0.1", "--metrics-port=" + strconv.Itoa(s.MetricsPort),
		"--allow-gpu-metrics=false",
		"--exit-timeout-secs=" + strconv.Itoa(int(exitTimeout/time.Second)),
		"--log-verbose=" + strconv.Itoa(verbose),
	}
	if !nvidiaDriver() {
		// As `make serve` on a machine without a GPU: pinned host memory needs the CUDA
		// driver, and gollm's tensors are all in ordinary host memory.
		args = append(args, "--pinned-memory-pool-byte-size=0")
	}
	args = append(args, opts.Flags...)
	f, err := os.Create(s.LogPath)
	if err != nil {
		return fmt.Errorf("launch tritonserver: %w", err)
	}
	s.logFile = f
	fmt.Fprintf(f, "$ %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.tmp
	cmd.Env = append(os.Environ(), opts.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Kill the server if the test process dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("launch tritonserver: %w", err)
	}
	s.cmd = cmd
	s.done = make(chan struct{})
	go func() {
		s.waitErr = cmd.Wait()
		f.Close()
		close(s.done)
	}()
	timeout := opts.ReadyTimeout
	if timeout == 0 {
		timeout = DefaultReadyTimeout
	}
	if err := s.waitReady(timeout, !slices.Contains(opts.Flags, "--allow-metrics=false")); err != nil {
		s.kill()
		return fmt.Errorf("%w\n--- tritonserver log (%s) ---\n%s", err, s.LogPath, s.LogTail(32<<10))
	}
	if err := s.startFront(); err != nil {
		s.kill()
		return fmt.Errorf("launch tritonserver: %w", err)
	}
	return nil
}

// startFront serves the HTTP endpoint through the guard `make serve` puts in front of it
// (package httpfront, with its default bound), on a loopback port of its own.
func (s *Server) startFront() error {
	target, err := url.Parse(s.HTTPURL())
	if err != nil {
		return err
	}
	f, err := httpfront.New(httpfront.Config{Target: target})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("http front: %w", err)
	}
	s.front, s.FrontPort = f, ln.Addr().(*net.TCPAddr).Port
	s.frontSrv = &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.frontSrv.Serve(ln) }()
	return nil
}

// nvidiaDriver says whether the machine has an NVIDIA driver, as scripts/cuda.sh decides.
func nvidiaDriver() bool {
	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		return true
	}
	_, err := exec.LookPath("nvidia-smi")
	return err == nil
}

// waitReady polls /v2/health/ready, then the metrics page, until each answers 200, the
// process exits, or the timeout passes: tritonserver starts its metrics service after
// the HTTP one, so a test that reads /metrics first thing could find nothing listening.
func (s *Server) waitReady(timeout time.Duration, metrics bool) error {
	deadline := time.Now().Add(timeout)
	urls := []string{s.HTTPURL() + "/v2/health/ready"}
	if metrics {
		urls = append(urls, s.MetricsURL())
	}
	for _, url := range urls {
		for {
			select {
			case <-s.done:
				return fmt.Errorf("tritonserver exited before it was ready (%s)", describeExit(s.cmd.ProcessState))
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			resp, err := s.http.Do(req)
			cancel()
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("tritonserver not ready after %v (%s: %v)", timeout, url, statusOrErr(resp, err))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func statusOrErr(resp *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	return resp.Status
}

// kill ends the process at once and waits for it.
func (s *Server) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
}

// Stop sends SIGINT, waits for the server to exit and returns its exit code; a server
// killed by a signal reports 128 plus the signal number. If the server has not exited
// after a minute it is killed and Stop returns an error. Stop may be called again: it
// returns the same code.
func (s *Server) Stop() (int, error) { return s.StopWith(os.Interrupt) }

// StopWith is Stop with another signal, such as SIGTERM (what an orchestrator sends).
func (s *Server) StopWith(sig os.Signal) (int, error) {
	select {
	case <-s.done:
	default:
		// tritonserver waits for open HTTP connections to close before it exits, for up
		// to --exit-timeout-secs, so idle keep-alive connections would delay every stop.
		s.http.CloseIdleConnections()
		http.DefaultClient.CloseIdleConnections()
		if s.front != nil {
			_ = s.frontSrv.Close()
			s.front.CloseIdleConnections()
		}
		if err := s.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return -1, fmt.Errorf("stop tritonserver: %w", err)
		}
		select {
		case <-s.done:
		case <-time.After(stopTimeout):
			s.kill()
			return -1, fmt.Errorf("stop tritonserver: still running %v after %v; killed", stopTimeout, sig)
		}
	}
	return exitCode(s.cmd.ProcessState), nil
}

// Exited reports whether the server process has ended.
func (s *Server) Exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Close kills the server if it still runs and removes its temporary folder (the
// repository and the log).
func (s *Server) Close() {
	if !s.Exited() {
		s.kill()
	}
	if s.frontSrv != nil {
		_ = s.frontSrv.Close()
	}
	os.RemoveAll(s.tmp)
}

func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

func describeExit(ps *os.ProcessState) string {
	if ps == nil {
		return "no exit status"
	}
	return ps.String()
}

// RSS returns the server process's resident set size in bytes (ProcessRSS).
func (s *Server) RSS() (int64, error) {
	if s.cmd == nil || s.cmd.Process == nil || s.Exited() {
		return 0, errors.New("rss: tritonserver is not running")
	}
	return ProcessRSS(s.cmd.Process.Pid)
}

// ProcessRSS returns a process's resident set size in bytes (VmRSS of
// /proc/<pid>/status).
func ProcessRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("rss: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("rss: %q: %w", line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("rss: no VmRSS in /proc/<pid>/status")
}

// HTTPURL is the base URL of the HTTP endpoint, such as http://127.0.0.1:41234.
func (s *Server) HTTPURL() string { return "http://127.0.0.1:" + strconv.Itoa(s.HTTPPort) }

// FrontURL is the base URL of the HTTP endpoint through the guard that `make serve`
// puts in front of it (httpfront: request bodies over 4 MiB refused).
func (s *Server) FrontURL() string { return "http://127.0.0.1:" + strconv.Itoa(s.FrontPort) }

// HTTP is the HTTP client for this server: Stop closes its idle connections, which
// tritonserver would otherwise wait for on exit. Use it rather than
// http.DefaultClient.
func (s *Server) HTTP() *http.Client { return s.http }

// MetricsURL is the URL of the Prometheus metrics page.
func (s *Server) MetricsURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(s.MetricsPort) + "/metrics"
}

// GRPCAddr is the host:port of the gRPC endpoint.
func (s *Server) GRPCAddr() string { return "127.0.0.1:" + strconv.Itoa(s.GRPCPort) }

// Dial opens a gRPC connection to the server. The caller closes it.
func (s *Server) Dial() (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial tritonserver at %s: %w", s.GRPCAddr(), err)
	}
	return conn, nil
}

// Client returns a KServe gRPC client on a connection that closes when the test ends.
func (s *Server) Client(t testing.TB) kserve.GRPCInferenceServiceClient {
	t.Helper()
	conn, err := s.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return kserve.NewGRPCInferenceServiceClient(conn)
}

// Log returns the whole server log so far.
func (s *Server) Log() string {
	b, err := os.ReadFile(s.LogPath)
	if err != nil {
		return fmt.Sprintf("(read log: %v)", err)
	}
	return string(b)
}

// LogTail returns at most the last max bytes of the server log, cut at a line start.
func (s *Server) LogTail(max int) string {
	b, err := os.ReadFile(s.LogPath)
	if err != nil {
		return fmt.Sprintf("(read log: %v)", err)
	}
	if len(b) <= max {
		return string(b)
	}
	b = b[len(b)-max:]
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return "[...]\n" + string(b)
}

// WaitModelReady polls the gRPC ModelReady call until the model is ready or ctx ends.
func (s *Server) WaitModelReady(ctx context.Context, c kserve.GRPCInferenceServiceClient, name string) error {
	for {
		resp, err := c.ModelReady(ctx, &kserve.ModelReadyRequest{Name: name})
		if err == nil && resp.GetReady() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("model %s not ready: %w (last error: %v)", name, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freePorts reserves n distinct loopback ports by listening on port 0, then releases
// them for the server to bind.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// PythonBackendDir makes a backend directory in dir that holds gollm's backend (a link
// to the one `make build` installs) and Triton's Python backend from the nvidia-pytriton
// wheel (its library, utilities and the stub for this machine's python3, as pytriton
// lays them out), and returns it with the environment a Python model needs: the stub's
// libraries and PYTHONPATH's folders (the stub's embedded Python ignores PYTHONPATH; a
// model reads them from GOLLM_PYTHONPATH).
func PythonBackendDir(dir string) (string, []string, error) {
	root, err := Root()
	if err != nil {
		return "", nil, err
	}
	wheel := filepath.Join(root, ".deps/pytriton/pytriton/tritonserver")
	out, err := exec.Command("python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])").Output()
	if err != nil {
		return "", nil, fmt.Errorf("python backend: python3's version: %w", err)
	}
	stub := filepath.Join(wheel, "python_backend_stubs", strings.TrimSpace(string(out)), "triton_python_backend_stub")
	py := filepath.Join(dir, "python")
	if err := os.MkdirAll(py, 0o755); err != nil {
		return "", nil, fmt.Errorf("python backend: %w", err)
	}
	links := map[string]string{
		filepath.Join(dir, "gollm"):                         filepath.Join(root, backendDir, "gollm"),
		filepath.Join(py, "libtriton_python.so"):            filepath.Join(wheel, "backends/python/libtriton_python.so"),
		filepath.Join(py, "triton_python_backend_utils.py"): filepath.Join(wheel, "backends/python/triton_python_backend_utils.py"),
		filepath.Join(py, "triton_python_backend_stub"):     stub,
	}
	for link, target := range links {
		if _, err := os.Stat(target); err != nil {
			return "", nil, fmt.Errorf("python backend: %w (run `make deps`)", err)
		}
		if err := os.Symlink(target, link); err != nil {
			return "", nil, fmt.Errorf("python backend: %w", err)
		}
	}
	env := []string{
		"LD_LIBRARY_PATH=" + filepath.Join(root, ".deps/pytriton/nvidia_pytriton.libs"),
		"GOLLM_PYTHONPATH=" + filepath.Join(root, ".deps/py"),
	}
	return dir, env, nil
}

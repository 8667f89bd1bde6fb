package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Opt-in diagnostics for finding where the time goes inside tritonserver, off unless
// their environment variables are set (see README.md, "Profiling"):
//
//   - GOLLM_CPU_PROFILE=path: a Go CPU profile of the whole process's Go code from
//     TRITONBACKEND_Initialize to TRITONBACKEND_Finalize (go tool pprof reads it).
//   - GOLLM_ITER_TRACE=path: one line per engine iteration, per sender batch and per
//     execute, written at instance finalize: when each iteration started and ended, its
//     batch size, how long its engine step took, how long the sender took over each batch
//     of responses, and when each execute handed its requests to the batch manager.
const (
	envCPUProfile = "GOLLM_CPU_PROFILE"
	envIterTrace  = "GOLLM_ITER_TRACE"
)

// profMu guards profFile.
var profMu sync.Mutex

// profFile is the open CPU profile; nil when none is being written.
var profFile *os.File

// startCPUProfile starts the CPU profile GOLLM_CPU_PROFILE names, if any. A failure is
// logged, not returned: a diagnostic must not stop the backend.
func startCPUProfile(log *zap.Logger) {
	path := os.Getenv(envCPUProfile)
	if path == "" {
		return
	}
	profMu.Lock()
	defer profMu.Unlock()
	if profFile != nil {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		log.Warn("no CPU profile", zap.String("env", envCPUProfile), zap.Error(err))
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		log.Warn("no CPU profile", zap.String("env", envCPUProfile), zap.Error(err))
		return
	}
	profFile = f
	log.Info("writing a CPU profile", zap.String("path", path))
}

// stopCPUProfile ends the CPU profile, if one is being written.
func stopCPUProfile(log *zap.Logger) {
	profMu.Lock()
	defer profMu.Unlock()
	if profFile == nil {
		return
	}
	pprof.StopCPUProfile()
	if err := profFile.Close(); err != nil {
		log.Warn("close the CPU profile", zap.Error(err))
	}
	profFile = nil
}

// traceCap bounds the trace's memory (about 40 bytes a record).
const traceCap = 1 << 20

// traceRec is one trace record.
type traceRec struct {
	// kind is 'I' (an iteration), 'S' (a sender batch) or 'A' (an execute's arrivals).
	kind byte
	// start and end are nanoseconds since the trace began.
	start, end int64
	// n is the iteration's scheduled requests, the batch's responses or the requests
	// the execute queued.
	n int32
	// ctx is the iteration's context tokens (0 for a sender batch).
	ctx int32
	// eng is the iteration's engine step in nanoseconds (0 for a sender batch).
	eng int64
}

// iterTrace records iterations and sender batches in memory; nil when tracing is off.
// The manager's loop and the sender append under mu (a few records per iteration).
type iterTrace struct {
	// path is where write puts the trace.
	path string
	// t0 makes the records' times relative: nanoseconds since the trace began.
	t0 time.Time
	// mu guards recs.
	mu sync.Mutex
	// recs are the records, up to traceCap.
	recs []traceRec
}

// newIterTrace returns a trace writing to GOLLM_ITER_TRACE with the instance's name
// appended, or nil when the variable is unset.
func newIterTrace(instance string) *iterTrace {
	path := os.Getenv(envIterTrace)
	if path == "" {
		return nil
	}
	return &iterTrace{path: path + "." + instance, t0: time.Now(), recs: make([]traceRec, 0, 4096)}
}

// add records one span (eng: an iteration's engine step); a nil trace records nothing.
func (t *iterTrace) add(kind byte, start, end time.Time, n, ctx int, eng time.Duration) {
	if t == nil {
		return
	}
	t.mu.Lock()
	if len(t.recs) < traceCap {
		t.recs = append(t.recs, traceRec{kind: kind, start: start.Sub(t.t0).Nanoseconds(), end: end.Sub(t.t0).Nanoseconds(), n: int32(n), ctx: int32(ctx), eng: eng.Nanoseconds()})
	}
	t.mu.Unlock()
}

// write saves the trace as text: "kind start_us end_us n ctx" per line.
func (t *iterTrace) write() error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	f, err := os.Create(t.path)
	if err != nil {
		return fmt.Errorf("iteration trace %s: %w", t.path, err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "# kind start_us end_us n ctx engine_us (I: iteration, n scheduled, ctx context tokens, engine_us its Engine.Step; S: sender batch, n responses; A: an execute, n requests queued)")
	for _, r := range t.recs {
		fmt.Fprintf(w, "%c %.1f %.1f %d %d %.1f\n", r.kind, float64(r.start)/1e3, float64(r.end)/1e3, r.n, r.ctx, float64(r.eng)/1e3)
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return fmt.Errorf("iteration trace %s: %w", t.path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("iteration trace %s: %w", t.path, err)
	}
	return nil
}

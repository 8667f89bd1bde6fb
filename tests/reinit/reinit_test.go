// Package reinit shows that libtriton_gollm.so survives being unloaded by its host and
// initialized again. A Go runtime cannot be unloaded from a process, so the backend is
// linked with -z nodelete; tritonserver 2.51 never dlcloses a backend in our runs, so
// testdata/host.c, a small C program that plays tritonserver's part for the
// backend-level entry points, does it: dlopen, TRITONBACKEND_Initialize,
// TRITONBACKEND_Finalize, dlclose, again and again. The host runs as its own process:
// the test binary never loads the backend (one Go runtime per process). host.c sits in
// testdata/ because the go tool refuses C files in a package without cgo.
package reinit

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// installedLib is where `make build` installs the backend, relative to the module root.
const installedLib = "build/install/backends/gollm/libtriton_gollm.so"

// moduleRoot returns the folder holding go.mod, above the test's working directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("working directory: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod above the test's working directory")
		}
		dir = parent
	}
}

// backendLib returns the installed backend library; a missing one fails the test.
func backendLib(t *testing.T) string {
	t.Helper()
	lib := filepath.Join(moduleRoot(t), installedLib)
	if _, err := os.Stat(lib); err != nil {
		t.Fatalf("gollm backend missing at %s (run `make build`): %v", lib, err)
	}
	return lib
}

// buildHost compiles testdata/host.c into a temporary folder. -rdynamic exports the host's
// Triton functions, which the backend looks up with dlsym(RTLD_DEFAULT).
func buildHost(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Fatalf("a C compiler (cc) is needed to build the test host: %v", err)
	}
	host := filepath.Join(t.TempDir(), "host")
	cmd := exec.Command(cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1",
		"-o", host, filepath.Join("testdata", "host.c"), "-rdynamic", "-ldl")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the test host: %v\n%s", err, out)
	}
	return host
}

// hostRun is what a run of the host left.
type hostRun struct {
	// stdout holds the host's "round N: ..." lines.
	stdout string
	// stderr holds the backend's log lines.
	stderr string
	// err is the run's error: nil for exit code 0, an *exec.ExitError otherwise.
	err error
}

// runHost runs the host on lib for the given rounds ("BACKEND_API,SERVER_API").
func runHost(t *testing.T, host, lib string, rounds ...string) hostRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, host, append([]string{lib}, rounds...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("the test host did not finish in time\nstdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run the test host: %v", err)
	}
	return hostRun{stdout: stdout.String(), stderr: stderr.String(), err: err}
}

func TestBackendInitializesAgainAfterFinalizeAndDlclose(t *testing.T) {
	lib := backendLib(t)
	host := buildHost(t)
	// Each round loads, initializes, finalizes and dlcloses the library with the API
	// versions the host reports; refusals must leave the backend usable.
	rounds := []struct {
		// api is "BACKEND_API,SERVER_API" as the host reports them.
		api string
		// wantErr is part of Initialize's error message; empty for success.
		wantErr string
	}{
		{api: "1.19,1.34"},
		{api: "1.19,1.34"}, // the second Initialize after Finalize and dlclose
		{api: "2.0,1.34", wantErr: "tritonserver's backend API version is 2.0; gollm needs 1.19 or a later 1.x"},
		{api: "1.18,1.34", wantErr: "tritonserver's backend API version is 1.18; gollm needs 1.19 or a later 1.x"},
		{api: "1.19,1.33", wantErr: "tritonserver's server API version is 1.33; gollm needs 1.34 or a later 1.x"},
		{api: "1.20,1.35"}, // later minors of the same majors are compatible
		{api: "1.19,1.34"}, // and the backend still initializes after the refusals
	}
	args := make([]string, len(rounds))
	for i, r := range rounds {
		args[i] = r.api
	}
	run := runHost(t, host, lib, args...)
	defer func() {
		if t.Failed() {
			t.Logf("host stdout:\n%s\nhost stderr:\n%s", run.stdout, run.stderr)
		}
	}()
	if run.err != nil {
		t.Fatalf("the test host failed: %v", run.err)
	}

	lines := strings.Split(strings.TrimSuffix(run.stdout, "\n"), "\n")
	// Three lines per round (initialize, finalize, dlclose) and "reinit ok".
	if want := 3*len(rounds) + 1; len(lines) != want {
		t.Fatalf("the host wrote %d lines, want %d", len(lines), want)
	}
	okInit := regexp.MustCompile(`^round \d+: initialize: ok \((\d+) metric families\)$`)
	oks := 0
	for i, r := range rounds {
		n := i + 1
		init, fini, closed := lines[3*i], lines[3*i+1], lines[3*i+2]
		if r.wantErr == "" {
			m := okInit.FindStringSubmatch(init)
			if m == nil || !strings.HasPrefix(init, fmt.Sprintf("round %d:", n)) {
				t.Errorf("round %d (API %s): got %q, want a successful Initialize", n, r.api, init)
			} else if fams, _ := strconv.Atoi(m[1]); fams == 0 {
				t.Errorf("round %d (API %s): Initialize registered no metric families", n, r.api)
			}
			oks++
		} else {
			// 5 is TRITONSERVER_ERROR_UNSUPPORTED.
			prefix := fmt.Sprintf("round %d: initialize: error 5: ", n)
			if !strings.HasPrefix(init, prefix) || !strings.Contains(init, r.wantErr) {
				t.Errorf("round %d (API %s): got %q, want %q… containing %q", n, r.api, init, prefix, r.wantErr)
			}
		}
		if want := fmt.Sprintf("round %d: finalize: ok", n); fini != want {
			t.Errorf("round %d: got %q, want %q", n, fini, want)
		}
		if want := fmt.Sprintf("round %d: dlclose: still mapped", n); !strings.HasPrefix(closed, want) {
			t.Errorf("round %d: got %q, want %q…", n, closed, want)
		}
	}
	if last := lines[len(lines)-1]; last != "reinit ok" {
		t.Errorf("last line %q, want %q", last, "reinit ok")
	}
	// The backend logs through the host's TRITONSERVER_LogMessage once per successful
	// Initialize and Finalize; a Finalize after a refused Initialize has no logger.
	for _, msg := range []string{"gollm: backend initialized", "gollm: backend finalized"} {
		if got := strings.Count(run.stderr, msg); got != oks {
			t.Errorf("the backend logged %q %d times, want %d", msg, got, oks)
		}
	}
}

// The test above passes only because dlclose leaves the library mapped: with the
// NODELETE flag cleared from a copy, the host must fail, by its own check or by the
// crash of a Go runtime whose code is gone.
func TestHostFailsWhenTheLibraryCanBeUnloaded(t *testing.T) {
	lib := backendLib(t)
	host := buildHost(t)
	data, err := os.ReadFile(lib)
	if err != nil {
		t.Fatalf("read the backend: %v", err)
	}
	if err := clearNodelete(data); err != nil {
		t.Fatalf("%s: %v", lib, err)
	}
	unloadable := filepath.Join(t.TempDir(), "libtriton_gollm.so")
	if err := os.WriteFile(unloadable, data, 0o644); err != nil {
		t.Fatalf("write the copy without NODELETE: %v", err)
	}
	run := runHost(t, host, unloadable, "1.19,1.34", "1.19,1.34")
	if run.err == nil {
		t.Fatalf("the host succeeded with a library that dlclose unmaps\nstdout:\n%s", run.stdout)
	}
	if !strings.Contains(run.stdout, "round 1: initialize: ok") {
		t.Errorf("the first round did not initialize: the failure has another cause\nstdout:\n%s\nstderr:\n%s", run.stdout, run.stderr)
	}
	if strings.Contains(run.stdout, "reinit ok") || strings.Contains(run.stdout, "round 2: initialize") {
		t.Errorf("the host went on after unloading the library\nstdout:\n%s", run.stdout)
	}
	var exit *exec.ExitError
	if errors.As(run.err, &exit) && exit.ExitCode() == 1 &&
		!strings.Contains(run.stdout, "FAIL: the library is unmapped after dlclose") {
		t.Errorf("the host failed for another reason than the unmapping\nstdout:\n%s", run.stdout)
	}
	t.Logf("the host without NODELETE: %v", run.err)
}

// clearNodelete clears DF_1_NODELETE in the DT_FLAGS_1 entry of an ELF shared
// library's dynamic section, in place.
func clearNodelete(data []byte) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("parse ELF: %w", err)
	}
	if f.Class != elf.ELFCLASS64 {
		return fmt.Errorf("ELF class %v, want ELFCLASS64", f.Class)
	}
	dyn := f.Section(".dynamic")
	if dyn == nil {
		return errors.New("no .dynamic section")
	}
	// Elf64_Dyn is a tag and a value, 8 bytes each.
	for off := dyn.Offset; off+16 <= dyn.Offset+dyn.Size; off += 16 {
		tag := elf.DynTag(f.ByteOrder.Uint64(data[off:]))
		if tag != elf.DT_FLAGS_1 {
			continue
		}
		val := f.ByteOrder.Uint64(data[off+8:])
		if val&uint64(elf.DF_1_NODELETE) == 0 {
			return errors.New("DT_FLAGS_1 lacks NODELETE already")
		}
		f.ByteOrder.PutUint64(data[off+8:], val&^uint64(elf.DF_1_NODELETE))
		return nil
	}
	return errors.New("no DT_FLAGS_1 entry")
}

// The library's link properties that make the above hold in tritonserver too: NODELETE
// set, and nothing but the TRITONBACKEND_* entry points exported (the export map), so
// the Go runtime's symbols cannot clash with the server's.
func TestLibraryIsNodeleteAndExportsOnlyEntryPoints(t *testing.T) {
	lib := backendLib(t)
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatalf("open %s: %v", lib, err)
	}
	defer f.Close()
	flags, err := f.DynValue(elf.DT_FLAGS_1)
	if err != nil {
		t.Fatalf("read DT_FLAGS_1: %v", err)
	}
	if len(flags) != 1 || flags[0]&uint64(elf.DF_1_NODELETE) == 0 {
		t.Errorf("DT_FLAGS_1 = %#x, want NODELETE set (link with -z nodelete)", flags)
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatalf("read the dynamic symbols: %v", err)
	}
	exported := map[string]bool{}
	for _, s := range syms {
		bind := elf.ST_BIND(s.Info)
		if s.Section == elf.SHN_UNDEF || (bind != elf.STB_GLOBAL && bind != elf.STB_WEAK) {
			continue
		}
		if !strings.HasPrefix(s.Name, "TRITONBACKEND_") {
			t.Errorf("the library exports %s; only TRITONBACKEND_* should be", s.Name)
		}
		exported[s.Name] = true
	}
	for _, name := range []string{"TRITONBACKEND_Initialize", "TRITONBACKEND_Finalize",
		"TRITONBACKEND_ModelInitialize", "TRITONBACKEND_ModelFinalize",
		"TRITONBACKEND_ModelInstanceInitialize", "TRITONBACKEND_ModelInstanceFinalize",
		"TRITONBACKEND_ModelInstanceExecute"} {
		if !exported[name] {
			t.Errorf("the library does not export %s", name)
		}
	}
}

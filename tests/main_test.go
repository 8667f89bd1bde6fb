// Package tests drives gollm through a real tritonserver: the server is started by
// tests/harness with the backend that `make build` installs and the demo checkpoint
// that `make demo` writes, and the tests talk to it over gRPC (the project's KServe v2
// stubs), HTTP and the metrics endpoint. Expected tokens come from the CPU engine run
// directly in the test process on the same checkpoint.
package tests

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"gollm/tests/harness"
)

// modelName is the shipped model's name.
const modelName = "gpt2"

// shared is the server that tests share where they do not interfere: the shipped
// gpt2 model as it is (decoupled). It starts on first use and stops in TestMain.
var shared struct {
	// once starts the server once.
	once sync.Once
	// srv is the running server, nil if it failed to start.
	srv *harness.Server
	// err is why it failed to start.
	err error
}

// sharedServer returns the shared server, starting it on first use; a server that
// cannot start fails the test with the reason.
func sharedServer(t testing.TB) *harness.Server {
	t.Helper()
	shared.once.Do(func() {
		shared.srv, shared.err = harness.Launch(harness.Options{})
	})
	if shared.err != nil {
		t.Fatalf("start the shared tritonserver: %v", shared.err)
	}
	if shared.srv.Exited() {
		t.Fatalf("the shared tritonserver has exited (its log follows the test results); last lines:\n%s", shared.srv.LogTail(2<<10))
	}
	return shared.srv
}

func TestMain(m *testing.M) {
	code := m.Run()
	if s := shared.srv; s != nil {
		exit, err := s.Stop()
		switch {
		case err != nil:
			fmt.Fprintf(os.Stderr, "stop the shared tritonserver: %v\n", err)
			code = 1
		case exit != 0:
			fmt.Fprintf(os.Stderr, "the shared tritonserver exited with code %d, want 0\n", exit)
			code = 1
		}
		if code != 0 {
			fmt.Fprintf(os.Stderr, "--- shared tritonserver log (%s) ---\n%s\n", s.LogPath, s.LogTail(256<<10))
		}
		s.Close()
	}
	os.Exit(code)
}

package cuda

import (
	"runtime"
	"strings"
	"testing"

	"gollm/engine"
)

// TestGPUFailedCallLeavesNoErrorBehind: a step that fails on a real CUDA call
// (GOLLM_CUDA_FAIL_STEP=2:early, an invalid cudaMemcpyAsync) reports it, and the next
// engine loaded on the same host thread loads and steps: the failure is not left in the
// thread's last CUDA error for the new engine's first launch check to report as its own
// (as it once was, failing a tensor-parallel test after an injected one).
func TestGPUFailedCallLeavesNoErrorBehind(t *testing.T) {
	lib := gpuLibrary(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	open := func() *Engine {
		ck := invariantModel{fixture: "llama-tiny"}.open(t)
		defer ck.Close()
		e, err := New(ck, Options{Library: lib, NumBlocks: 8, TokensPerBlock: 8, MaxTokens: 64, MaxSeqs: 4})
		if err != nil {
			t.Fatalf("engine: %v", err)
		}
		return e
	}
	step := func(e *Engine, pos int) error {
		s := engine.Sequence{ID: 1, Tokens: []int32{1, 2, 3}, Pos: pos, Blocks: []int32{0, 1}, Sample: true,
			History: []int32{1, 2, 3}}
		_, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{s}})
		return err
	}
	t.Setenv(EnvFailStep, "2:early")
	e := open()
	var err error
	for k := 0; k < 5 && err == nil; k++ {
		err = step(e, 3*k)
	}
	if err == nil || !strings.Contains(err.Error(), "GOLLM_CUDA_FAIL_STEP=2:early") {
		t.Fatalf("five steps, then %v; want the injected failure", err)
	}
	_ = e.Close()
	t.Setenv(EnvFailStep, "")
	again := open()
	defer again.Close()
	if err := step(again, 0); err != nil {
		t.Fatalf("a new engine on the same thread after the failure: %v", err)
	}
}

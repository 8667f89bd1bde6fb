package tests

// Reloads after a cancelled refused request (issue 32, finding 9): a request Triton's
// core refuses, on a gRPC stream the client then cancels, keeps the model alive in
// tritonserver 2.51's frontend for good, so the model's unload never finishes and
// Finalize never comes. Each unload and load used to leave a whole instance behind (the
// demo model's 512 MiB KV pool); the instance must free its engine once its unload has
// begun and it is idle.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
)

// cancelRefusedRequest sends a request Triton's core refuses (input_ids as FP32) on a
// stream of its own, reads the error and cancels the stream.
func cancelRefusedRequest(t *testing.T, ctx context.Context, c kserve.GRPCInferenceServiceClient, id string) {
	t.Helper()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.ModelStreamInfer(sctx)
	if err != nil {
		t.Fatal(err)
	}
	req := inferRequest(modelName, id, []tensor{float32s("input_ids", []int64{1, 5}, 1, 2, 3, 4, 5),
		int32s("input_lengths", []int64{1, 1}, 5), int32s("request_output_len", []int64{1, 1}, 4)})
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	res, err := readStream(stream, id)
	if err != nil || !strings.Contains(res.errMsg, "expects 'INT32'") {
		t.Fatalf("want Triton's datatype error, got %+v, %v", res, err)
	}
}

func TestReloadsAfterCancelledRefusedRequests(t *testing.T) {
	ck := demoCheckpoint(t)
	// Launch, not Start: the model kept alive makes the exit wait out the exit timeout
	// (code 1), a known tritonserver 2.51 defect.
	s, err := harness.Launch(harness.Options{ExitTimeout: 3 * time.Second,
		Flags: []string{"--model-control-mode=explicit", "--load-model=" + modelName}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer func() {
		if code, err := s.Stop(); err != nil || (code != 0 && code != 1) {
			t.Errorf("stop: code %d, %v; want 0 or 1 (exit timeout)", code, err)
		}
		if t.Failed() {
			t.Logf("tritonserver log (%s):\n%s", s.LogPath, s.LogTail(64<<10))
		}
	}()
	c := s.Client(t)
	ctx := testContext(t, 10*time.Minute)
	const n = 6
	want := greedyTokens(t, ck.dir, tokenPrompt, n)
	serve := func(id string) {
		t.Helper()
		res, err := streamInfer(ctx, c, inferRequest(modelName, id, tokenInputs(tokenPrompt, n, true)))
		if err != nil || res.errMsg != "" || !slices.Equal(res.tokens, want) {
			t.Fatalf("request %s: tokens %v, %v, error %q; want %v", id, res.tokens, err, res.errMsg, want)
		}
	}
	// The Go runtime's memory (heap and the rest it holds from the OS) as the backend's
	// gauge shows it, sampled every second; and the process's RSS.
	memory := func() (goMem, rss float64) {
		t.Helper()
		time.Sleep(1500 * time.Millisecond)
		r, err := s.RSS()
		if err != nil {
			t.Fatal(err)
		}
		return mustModelMetric(t, ctx, s, modelName, "gollm_go_memory_bytes"), float64(r)
	}
	serve("warm")
	goBefore, rssBefore := memory()
	const cycles = 8
	const mib = 1 << 20
	for i := range cycles {
		cancelRefusedRequest(t, ctx, c, fmt.Sprintf("refused-%d", i))
		if _, err := c.RepositoryModelUnload(ctx, &kserve.RepositoryModelUnloadRequest{ModelName: modelName}); err != nil {
			t.Fatalf("cycle %d: unload: %v", i, err)
		}
		waitModelState(t, ctx, c, false)
		if _, err := c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: modelName}); err != nil {
			t.Fatalf("cycle %d: load: %v", i, err)
		}
		if err := s.WaitModelReady(ctx, c, modelName); err != nil {
			t.Fatal(err)
		}
		serve(fmt.Sprintf("cycle-%d", i))
		g, r := memory()
		t.Logf("after cycle %d: Go memory %+.0f MiB, RSS %+.0f MiB", i+1, (g-goBefore)/mib, (r-rssBefore)/mib)
	}
	goAfter, rssAfter := memory()
	perCycle := (goAfter - goBefore) / cycles / mib
	t.Logf("%d cycles: Go memory %.0f → %.0f MiB (%+.0f MiB a cycle), RSS %.0f → %.0f MiB",
		cycles, goBefore/mib, goAfter/mib, perCycle, rssBefore/mib, rssAfter/mib)
	// A leaked instance is its 512 MiB KV pool; what each cycle may leave is the
	// tritonserver-side model and the backend's small per-model state.
	if perCycle > 16 {
		t.Errorf("the backend's Go memory grew %.0f MiB a cycle over %d unload and load cycles; want at most 16", perCycle, cycles)
	}
	if !strings.Contains(s.Log(), "its engine and KV pool are freed now, before Triton finalizes it") {
		t.Error("the log does not show an instance freeing its engine at its model's unload")
	}
}

package tests

import (
	"strings"
	"testing"
	"time"

	"gollm/tests/harness"
)

// TestFailingEngineSteps drives the failure path of an engine step through tritonserver
// on the CPU engine, whose debugging switch GOLLM_CPU_FAIL_STEP fails a chosen step as
// GOLLM_CUDA_FAIL_STEP fails one in cuda/: the requests of the failed step get an error
// response, then the instance either serves on or, when its engine is lost, reports
// itself not ready and refuses every request — and the server neither crashes nor stops.
func TestFailingEngineSteps(t *testing.T) {
	t.Run("a failed step ends its requests with an error and the instance recovers", func(t *testing.T) {
		s := harness.Start(t, harness.Options{Env: []string{"GOLLM_CPU_FAIL_STEP=3"}})
		c := s.Client(t)
		ctx := testContext(t, 60*time.Second)
		// Steps 1 and 2 (the prompt, one decode) run; step 3 fails.
		inputs := append(tokenInputs(tokenPrompt, 5, true), int32s("end_id", []int64{1, 1}, -1))
		res, err := streamInfer(ctx, c, inferRequest(modelName, "fails", inputs))
		if err != nil {
			t.Fatal(err)
		}
		if !res.final || !strings.Contains(res.errMsg, "injected fault at step 3") {
			t.Fatalf("the failed step's request: final %v, error %q, tokens %v; want a final error naming the injected fault", res.final, res.errMsg, res.tokens)
		}
		if len(res.tokens) != 2 {
			t.Errorf("the request got %d tokens before the failure, want 2 (steps 1 and 2)", len(res.tokens))
		}
		res, err = streamInfer(ctx, c, inferRequest(modelName, "after", inputs))
		if err != nil || res.errMsg != "" || len(res.tokens) != 5 {
			t.Fatalf("after the failure: %+v, %v; want 5 tokens", res, err)
		}
		if v := mustMetric(t, ctx, s, "gollm_instance_ready"); v != 1 {
			t.Errorf("gollm_instance_ready %v after a recovered failure, want 1", v)
		}
		waitIdleGauges(t, s)
	})

	t.Run("an engine that cannot recover leaves the instance not ready, refusing requests", func(t *testing.T) {
		s := harness.Start(t, harness.Options{Env: []string{"GOLLM_CPU_FAIL_STEP=2:lost"}})
		c := s.Client(t)
		ctx := testContext(t, 60*time.Second)
		inputs := append(tokenInputs(tokenPrompt, 5, true), int32s("end_id", []int64{1, 1}, -1))
		res, err := streamInfer(ctx, c, inferRequest(modelName, "fails", inputs))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(res.errMsg, "injected fault at step 2") {
			t.Fatalf("the failed step's request: error %q, want the injected fault", res.errMsg)
		}
		for _, id := range []string{"later-1", "later-2"} {
			res, err = streamInfer(ctx, c, inferRequest(modelName, id, inputs))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(res.errMsg, "is not ready") || len(res.tokens) != 0 {
				t.Errorf("request %s on the broken instance: error %q, tokens %v; want it refused as not ready", id, res.errMsg, res.tokens)
			}
		}
		if v := mustMetric(t, ctx, s, "gollm_instance_ready"); v != 0 {
			t.Errorf("gollm_instance_ready %v, want 0", v)
		}
		waitIdleGauges(t, s)
		if s.Exited() {
			t.Fatal("tritonserver exited")
		}
		if !strings.Contains(s.Log(), "instance not ready") {
			t.Error("the server log does not say the instance is not ready")
		}
	})
}

// waitIdleGauges waits until the model's gauges show nothing in flight and an empty pool.
func waitIdleGauges(t *testing.T, s *harness.Server) {
	t.Helper()
	ctx := testContext(t, 10*time.Second)
	for {
		active := mustMetric(t, ctx, s, metricActiveRequests)
		used := mustMetric(t, ctx, s, metricKVBlocksUsed)
		if active == 0 && used == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("gauges not idle: %s %v, %s %v", metricActiveRequests, active, metricKVBlocksUsed, used)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestProcessGauges checks the process-wide gauges on a CPU-only server: the Go runtime's
// are there and plausible, and no per-GPU family appears without a GPU instance (here,
// without a driver).
func TestProcessGauges(t *testing.T) {
	s := sharedServer(t)
	ctx := testContext(t, 30*time.Second)
	// The gauges are sampled every second, and the live heap is known from the first
	// collection on: a server that has just started may show its start.
	var heap, live, held float64
	for deadline := time.Now().Add(10 * time.Second); ; {
		heap = mustMetric(t, ctx, s, "gollm_go_heap_bytes")
		live = mustMetric(t, ctx, s, "gollm_go_heap_live_bytes")
		held = mustMetric(t, ctx, s, "gollm_go_memory_bytes")
		// The demo model's float32 weights and KV pool are tens of MiB at least.
		if live >= 16<<20 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if live < 16<<20 || heap < live/2 || held < heap {
		t.Errorf("Go heap %v, live %v, held from the OS %v: want live ≥ 16 MiB and held ≥ heap", heap, live, held)
	}
	page, err := getBody(ctx, s.HTTP(), s.MetricsURL())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(page), "gollm_gpu_") {
		t.Errorf("a CPU-only server shows gollm_gpu_* families:\n%s", page)
	}
}

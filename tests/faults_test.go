package tests

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
)

// TestFailingEngineSteps drives the failure path of an engine step through tritonserver
// on the CPU engine, whose debugging switch GOLLM_CPU_FAIL_STEP fails a chosen step as
// GOLLM_CUDA_FAIL_STEP fails one in cuda/: the requests of the failed step get an error
// response, then the instance either serves on or, when its engine is lost, reports
// itself not ready and refuses every request — and the server neither crashes nor stops.
//
// After a recovered failure nothing may answer wrongly: the batch manager's failStep
// ends the requests of the failed step (its running requests) with the error and leaves
// the others where they were — requests still queued, and under max_utilization
// requests paused for KV blocks — so those, and every request sent afterwards, must get
// exactly the greedy tokens of the same request on a fault-free model (the CPU engine
// run in this process on the same checkpoint, greedyTokens). The failed request's
// tokens before the failure must be the fault-free ones too.
func TestFailingEngineSteps(t *testing.T) {
	t.Run("a failed step ends its running request; the paused and the queued one, and later ones, get fault-free greedy tokens", func(t *testing.T) {
		recoveredFault(t, false)
	})

	t.Run("overlap_scheduler: a failed step run ahead ends its running request; the queued one, and later ones, get fault-free greedy tokens", func(t *testing.T) {
		recoveredFault(t, true)
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

// The fault of recoveredFault: its step, and the long request that runs into it. The
// model's KV pool is 16 blocks of 16 positions; the long request's prompt and tokens
// need 254 of its 256 positions.
const (
	// faultStep is the engine step GOLLM_CPU_FAIL_STEP fails, counted from the
	// server's start.
	faultStep = 230
	// faultLongN is the long request's length: it is still running at faultStep.
	faultLongN = 250
)

// faultInputs are a streaming request of n tokens without an end token, so that it runs
// its whole length, as greedyTokens does.
func faultInputs(prompt []int32, n int) []tensor {
	return append(tokenInputs(prompt, n, true), int32s("end_id", []int64{1, 1}, -1))
}

// outcome is a request's result, delivered by inBackground.
type outcome struct {
	res streamResult
	err error
}

// inBackground sends req on a stream of its own and delivers its outcome on the channel.
func inBackground(ctx context.Context, c kserve.GRPCInferenceServiceClient, req *kserve.ModelInferRequest) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		res, err := streamInfer(ctx, c, req)
		ch <- outcome{res, err}
	}()
	return ch
}

// greedyJob is a request and the tokens a fault-free model gives it.
type greedyJob struct {
	id     string
	prompt []int32
	want   []int32
}

// checkGreedy fails the test unless a request that should have run to its end got
// exactly its fault-free greedy tokens, one response a token, without an error.
func checkGreedy(t *testing.T, j greedyJob, o outcome) {
	t.Helper()
	switch {
	case o.err != nil:
		t.Errorf("request %s: %v", j.id, o.err)
	case o.res.errMsg != "" || !o.res.final:
		t.Errorf("request %s: final %v, error %q after %d tokens; want all %d tokens", j.id, o.res.final, o.res.errMsg, len(o.res.tokens), len(j.want))
	case !slices.Equal(o.res.tokens, j.want):
		t.Errorf("request %s (prompt of %d): got %v, want the fault-free greedy %v", j.id, len(j.prompt), o.res.tokens, j.want)
	case o.res.withTokens != len(j.want):
		t.Errorf("request %s: %d responses with tokens, want %d", j.id, o.res.withTokens, len(j.want))
	}
}

// recoveredFault fails step faultStep of the CPU engine while a long greedy request
// runs alone in it, with other requests held back, and checks what the batch manager
// documents (failStep): the failed step's request ends with the error, after the
// fault-free tokens of the steps before; the engine recovers; the requests the step did
// not hold run on and, like the requests sent afterwards, get exactly the fault-free
// greedy tokens.
//
// Without the overlap schedule the model runs max_utilization: a request with a
// 200-token prompt joins the long one and, as the two grow, is paused for KV blocks (the
// most recently admitted request is the victim), and a third request is queued behind
// it (paused requests are admitted first); at the fault the long request is the step's
// only one, the second is paused with a few tokens streamed, the third queued. With
// overlap_scheduler on, under guaranteed_no_evict, the long request's worst case holds
// the whole pool, so a second request waits in the queue while every step after the
// first is launched ahead of the one before: the fault fails a step run ahead, and the
// steps launched after it are drained.
func recoveredFault(t *testing.T, overlap bool) {
	ck := demoCheckpoint(t)
	// A prompt of 200 tokens takes 13 of the 16 blocks at once, so the pause comes a few
	// dozen steps in, long before the fault.
	bigPrompt := make([]int32, 200)
	for i := range bigPrompt {
		bigPrompt[i] = int32((i*7919 + 13) % (ck.cfg.VocabSize - 1))
	}
	shortPrompt := []int32{464, 2068, 7586, 21831}
	long := greedyJob{"long", tokenPrompt, greedyTokens(t, ck.dir, tokenPrompt, faultLongN)}
	paused := greedyJob{"paused", bigPrompt, greedyTokens(t, ck.dir, bigPrompt, 50)}
	queued := greedyJob{"queued", shortPrompt, greedyTokens(t, ck.dir, shortPrompt, 8)}
	policy := "max_utilization"
	if overlap {
		policy = "guaranteed_no_evict"
	}
	s := harness.Start(t, harness.Options{
		Env: []string{fmt.Sprintf("GOLLM_CPU_FAIL_STEP=%d", faultStep)},
		Models: []harness.Model{{Parameters: map[string]string{
			"overlap_scheduler":            strconv.FormatBool(overlap),
			"batch_scheduler_policy":       policy,
			"tokens_per_block":             "16",
			"max_tokens_in_paged_kv_cache": "256",
		}}},
	})
	c := s.Client(t)
	ctx := testContext(t, 2*time.Minute)
	send := func(j greedyJob) <-chan outcome {
		return inBackground(ctx, c, inferRequest(modelName, j.id, faultInputs(j.prompt, len(j.want))))
	}

	longDone := send(long)
	waitMetric(t, ctx, s, metricActiveRequests, 1, 30*time.Second)
	var survivors []greedyJob
	var survived []<-chan outcome
	if !overlap {
		survivors, survived = append(survivors, paused), append(survived, send(paused))
		waitMetric(t, ctx, s, "gollm_requests_paused", 1, 30*time.Second)
	}
	survivors, survived = append(survivors, queued), append(survived, send(queued))
	waitMetric(t, ctx, s, "gollm_requests_queued", 1, 30*time.Second)
	// The fault is reported by iteration faultStep at the earliest (faultStep-1 under the
	// overlap schedule, whose first iteration runs two steps): the requests above were
	// paused and queued before it, as the test means them to be.
	it := mustMetric(t, ctx, s, "gollm_iterations")
	if it >= faultStep-2 {
		t.Fatalf("%v iterations had run when the requests held back were seen paused and queued; the fault at step %d may have come first (a slow machine: raise faultStep)", it, faultStep)
	}
	t.Logf("the requests held back were paused and queued after %v iterations; step %d fails", it, faultStep)

	o := <-longDone
	if o.err != nil {
		t.Fatal(o.err)
	}
	if want := fmt.Sprintf("injected fault at step %d", faultStep); !o.res.final || !strings.Contains(o.res.errMsg, want) {
		t.Fatalf("the failed step's request: final %v, error %q after %d tokens; want a final error naming %q", o.res.final, o.res.errMsg, len(o.res.tokens), want)
	}
	// Its first token came from the prompt's step, one more from each step after.
	if want := long.want[:faultStep-1]; !slices.Equal(o.res.tokens, want) {
		t.Errorf("the failed step's request got %d tokens before the failure, want the %d fault-free ones of the steps before:\ngot  %v\nwant %v", len(o.res.tokens), len(want), o.res.tokens, want)
	}
	for i, j := range survivors {
		checkGreedy(t, j, <-survived[i])
	}

	// After the recovery: the failed request again, a shorter one beside it.
	after := []greedyJob{
		{"long-again", tokenPrompt, long.want[:40]},
		{"after", shortPrompt, greedyTokens(t, ck.dir, shortPrompt, 24)},
	}
	var dones []<-chan outcome
	for _, j := range after {
		dones = append(dones, send(j))
	}
	for i, j := range after {
		checkGreedy(t, j, <-dones[i])
	}

	if v := mustMetric(t, ctx, s, "gollm_instance_ready"); v != 1 {
		t.Errorf("gollm_instance_ready %v after a recovered failure, want 1", v)
	}
	waitIdleGauges(t, s)
	// The instance line, quoted by Triton's log: the schedule and the pool as meant.
	log := s.Log()
	for _, want := range []string{fmt.Sprintf(`overlap_scheduler\": %v, \"kv_blocks\": 16,`, overlap),
		`\"tokens_per_block\": 16}`, "engine step failed", "the engine recovered from the failed step"} {
		if !strings.Contains(log, want) {
			t.Errorf("the server log does not say %q", want)
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

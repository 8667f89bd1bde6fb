package tests

// Through-Triton tests of in-flight batching (issue 3): concurrent streaming requests
// each get their solo greedy tokens, and a client that disconnects is cancelled and
// its KV blocks return to the pool, as the backend's metrics show.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
)

// The backend's Prometheus families on Triton's /metrics (gauges, labelled by model and
// version, one series per model instance).
const (
	// metricKVBlocksFree is the number of free KV cache blocks.
	metricKVBlocksFree = "gollm_kv_blocks_free"
	// metricKVBlocksUsed is the number of KV cache blocks held by requests.
	metricKVBlocksUsed = "gollm_kv_blocks_used"
	// metricActiveRequests is the number of admitted, unfinished requests.
	metricActiveRequests = "gollm_requests_active"
)

// modelMetricValue scrapes the metrics page and sums the family's series for the model;
// found is false when the page has no such series.
func modelMetricValue(ctx context.Context, s *harness.Server, model, family string) (sum float64, found bool, err error) {
	page, err := getBody(ctx, s.HTTP(), s.MetricsURL())
	if err != nil {
		return 0, false, err
	}
	sc := bufio.NewScanner(bytes.NewReader(page))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, family) {
			continue
		}
		rest := line[len(family):]
		var labels string
		switch {
		case strings.HasPrefix(rest, "{"):
			end := strings.Index(rest, "}")
			if end < 0 {
				return 0, false, fmt.Errorf("metrics line %q: unclosed labels", line)
			}
			labels, rest = rest[1:end], rest[end+1:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // a longer family name with this one as its prefix
		}
		if strings.Contains(labels, "model=") && !strings.Contains(labels, `model="`+model+`"`) {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return 0, false, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("metrics line %q: %w", line, err)
		}
		sum += v
		found = true
	}
	return sum, found, sc.Err()
}

// mustMetric reads a metric of the shipped model that must exist.
func mustMetric(t *testing.T, ctx context.Context, s *harness.Server, family string) float64 {
	t.Helper()
	return mustModelMetric(t, ctx, s, modelName, family)
}

// mustModelMetric is mustMetric for the named model.
func mustModelMetric(t *testing.T, ctx context.Context, s *harness.Server, model, family string) float64 {
	t.Helper()
	v, found, err := modelMetricValue(ctx, s, model, family)
	if err != nil {
		t.Fatalf("read %s: %v", family, err)
	}
	if !found {
		t.Fatalf("metric %s is not on %s (the backend must export it)", family, s.MetricsURL())
	}
	return v
}

func TestInflightBatchingThroughTriton(t *testing.T) {
	s := sharedServer(t)
	ck := demoCheckpoint(t)

	t.Run("16 concurrent streaming requests each get their solo greedy tokens", func(t *testing.T) {
		concurrentGreedy(t, s, ck, 16, 1)
	})

	t.Run("a client that disconnects mid-stream is cancelled and its KV blocks freed", func(t *testing.T) {
		ctx := testContext(t, 2*time.Minute)
		// Idle first: whatever ran before has finished.
		waitMetric(t, ctx, s, metricKVBlocksUsed, 0, 30*time.Second)
		freeIdle := mustMetric(t, ctx, s, metricKVBlocksFree)
		if freeIdle <= 0 {
			t.Fatalf("%s = %v when idle, want a positive pool", metricKVBlocksFree, freeIdle)
		}
		c := s.Client(t)
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := c.ModelStreamInfer(sctx)
		if err != nil {
			t.Fatal(err)
		}
		n := ck.cfg.MaxPositions - len(tokenPrompt)
		if err := stream.Send(inferRequest(modelName, "disconnect", tokenInputs(tokenPrompt, n, true))); err != nil {
			t.Fatal(err)
		}
		const seen = 10
		var first, last time.Time
		for i := range seen {
			msg, err := stream.Recv()
			if err != nil {
				t.Fatalf("response %d: %v", i, err)
			}
			if msg.GetErrorMessage() != "" {
				t.Fatalf("response %d: error %s", i, msg.GetErrorMessage())
			}
			if i == 1 {
				first = time.Now()
			}
			last = time.Now()
		}
		if used := mustMetric(t, ctx, s, metricKVBlocksUsed); used <= 0 {
			t.Errorf("%s = %v mid-generation, want the request's blocks", metricKVBlocksUsed, used)
		}
		if active := mustMetric(t, ctx, s, metricActiveRequests); active != 1 {
			t.Errorf("%s = %v mid-generation, want 1", metricActiveRequests, active)
		}
		// Finishing the request would take (n-seen) more steps; a cancelled one frees
		// its blocks within a few iterations. Allow half the remaining run time.
		perStep := last.Sub(first) / (seen - 2)
		limit := min(max(time.Duration(n-seen)*perStep/2, 2*time.Second), 30*time.Second)
		cancel()
		t.Logf("step time %v; waiting up to %v for the blocks", perStep, limit)
		waitMetric(t, ctx, s, metricKVBlocksUsed, 0, limit)
		waitMetric(t, ctx, s, metricActiveRequests, 0, limit)
		if free := mustMetric(t, ctx, s, metricKVBlocksFree); free != freeIdle {
			t.Errorf("%s = %v after the cancellation, want %v as before", metricKVBlocksFree, free, freeIdle)
		}
	})
}

// waitMetric polls a metric of the shipped model until it equals want or the limit
// passes.
func waitMetric(t *testing.T, ctx context.Context, s *harness.Server, family string, want float64, limit time.Duration) {
	t.Helper()
	waitModelMetric(t, ctx, s, modelName, family, want, limit)
}

// waitModelMetric is waitMetric for the named model.
func waitModelMetric(t *testing.T, ctx context.Context, s *harness.Server, model, family string, want float64, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		v := mustModelMetric(t, ctx, s, model, family)
		if v == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v after %v, want %v", family, v, limit, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// allAtOnce makes n calls of call, each over its own connection, as separate clients
// would, and releases them together once every connection is made; it returns each
// call's error, or its connection's.
func allAtOnce(s *harness.Server, n int, call func(i int, c kserve.GRPCInferenceServiceClient) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			conn, err := s.Dial()
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close()
			<-start
			errs[i] = call(i, kserve.NewGRPCInferenceServiceClient(conn))
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// concurrentGreedy sends clients streaming requests at once, each on its own
// connection, and checks that each gets its solo greedy tokens: the first in a response
// of its own, then every tokens a response (the model's stream_interval; the last
// response what is left).
func concurrentGreedy(t *testing.T, s *harness.Server, ck checkpointInfo, clients, every int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(16, 3))
	type job struct {
		prompt []int32
		n      int
		want   []int32
	}
	jobs := make([]job, clients)
	for i := range jobs {
		prompt := make([]int32, 3+rng.IntN(30))
		for j := range prompt {
			prompt[j] = int32(rng.IntN(ck.cfg.VocabSize - 1))
		}
		n := 8 + rng.IntN(25)
		jobs[i] = job{prompt, n, greedyTokens(t, ck.dir, prompt, n)}
	}
	ctx := testContext(t, 3*time.Minute)
	// Idle first, so that the iterations counted are these requests' alone.
	waitMetric(t, ctx, s, metricActiveRequests, 0, time.Minute)
	iterations := mustMetric(t, ctx, s, "gollm_iterations")
	results := make([]streamResult, clients)
	errs := allAtOnce(s, clients, func(i int, c kserve.GRPCInferenceServiceClient) (err error) {
		j := jobs[i]
		results[i], err = streamInfer(ctx, c, inferRequest(modelName, fmt.Sprintf("concurrent-%d", i), tokenInputs(j.prompt, j.n, true)))
		return err
	})
	for i, j := range jobs {
		switch {
		case errs[i] != nil:
			t.Errorf("request %d: %v", i, errs[i])
		case results[i].errMsg != "":
			t.Errorf("request %d: error response %s", i, results[i].errMsg)
		case !slices.Equal(results[i].tokens, j.want):
			t.Errorf("request %d (prompt of %d, %d tokens): got %v, want solo greedy %v", i, len(j.prompt), j.n, results[i].tokens, j.want)
		case results[i].withTokens != 1+(j.n-1+every-1)/every:
			t.Errorf("request %d: %d responses with tokens for %d tokens, want %d", i, results[i].withTokens, j.n, 1+(j.n-1+every-1)/every)
		}
	}
	// Each token takes an iteration of its own request: run one after another, the
	// requests would take at least as many iterations as tokens. Batched in flight, they
	// share them.
	tokens := 0
	for _, j := range jobs {
		tokens += j.n
	}
	ran := mustMetric(t, ctx, s, "gollm_iterations") - iterations
	t.Logf("%d concurrent requests of %d tokens in all ran in %v iterations", clients, tokens, ran)
	if ran > float64(tokens)/2 {
		t.Errorf("%v iterations for %d concurrent requests of %d tokens in all: they did not share iterations", ran, clients, tokens)
	}
}

// TestOverlapSchedulerThroughTriton serves the demo model with overlap_scheduler on:
// concurrent streams still get their solo greedy tokens.
func TestOverlapSchedulerThroughTriton(t *testing.T) {
	s := harness.Start(t, harness.Options{Models: []harness.Model{{Parameters: map[string]string{"overlap_scheduler": "true"}}}})
	concurrentGreedy(t, s, demoCheckpoint(t), 16, 1)
}

// TestStreamIntervalThroughTriton serves the demo model with stream_interval 4:
// concurrent streams get their solo greedy tokens, the first alone and then four a
// response.
func TestStreamIntervalThroughTriton(t *testing.T) {
	s := harness.Start(t, harness.Options{Models: []harness.Model{{Parameters: map[string]string{"stream_interval": "4"}}}})
	concurrentGreedy(t, s, demoCheckpoint(t), 8, 4)
}

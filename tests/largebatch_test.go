package tests

// Large batches (issue 34): a model with max_batch_size 256 runs iterations of more
// than 64 sequences when hundreds of streams arrive together — as the server's own
// gollm_sequences_per_iteration_max shows — each request gets its tokens (a sample of
// them its solo greedy tokens), and the KV pool is idle afterwards. A max_batch_size
// beyond what the KV pool holds loads, logs the limit and why, and never runs more
// sequences an iteration than the pool has blocks.

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
)

// metricSeqsMax is the most sequences one iteration ran since the instance started.
const metricSeqsMax = "gollm_sequences_per_iteration_max"

func TestLargeBatchThroughTriton(t *testing.T) {
	ck := demoCheckpoint(t)
	const tightBlocks = 40
	s := harness.Start(t, harness.Options{Models: []harness.Model{
		// The admission window gathers the streams that reach an idle instance over
		// milliseconds into one prompt step, so that a loaded test machine, slow to open
		// 300 streams, still runs them together.
		{Name: "wide", MaxBatchSize: 256, Parameters: map[string]string{
			"max_tokens_in_paged_kv_cache": "32768", "tokens_per_block": "16", "admission_window_us": "200000"}},
		{Name: "tight", MaxBatchSize: 512, Parameters: map[string]string{
			"max_tokens_in_paged_kv_cache": fmt.Sprint(tightBlocks * 16), "tokens_per_block": "16"}},
	}})

	t.Run("300 concurrent streams run iterations of more than 64 sequences, at most 256", func(t *testing.T) {
		ctx := testContext(t, 5*time.Minute)
		got := manyStreams(t, s, "wide", 300, 12, ck.cfg.VocabSize)
		// A sample checked against the engine alone: batching changes no token.
		rng := rand.New(rand.NewPCG(7, 7))
		for range 6 {
			i := rng.IntN(len(got))
			if want := greedyTokens(t, ck.dir, got[i].prompt, 12); !slices.Equal(got[i].tokens, want) {
				t.Errorf("request %d: %v, want its solo greedy %v", i, got[i].tokens, want)
			}
		}
		most := mustModelMetric(t, ctx, s, "wide", metricSeqsMax)
		t.Logf("the most sequences in one iteration: %v", most)
		if most <= 64 || most > 256 {
			t.Errorf("%s = %v, want more than 64 and at most max_batch_size 256", metricSeqsMax, most)
		}
		waitModelMetric(t, ctx, s, "wide", metricKVBlocksUsed, 0, 30*time.Second)
		waitModelMetric(t, ctx, s, "wide", metricActiveRequests, 0, 30*time.Second)
		if free, all := mustModelMetric(t, ctx, s, "wide", metricKVBlocksFree), mustModelMetric(t, ctx, s, "wide", "gollm_kv_blocks_max"); free != all || all != 32768/16 {
			t.Errorf("after the load: %v of %v blocks free, want all %d", free, all, 32768/16)
		}
	})

	t.Run("max_batch_size beyond the KV pool's blocks is limited to them, with the reason logged", func(t *testing.T) {
		ctx := testContext(t, 5*time.Minute)
		log := s.Log()
		for _, want := range []string{"batch size limited by the KV pool", "max_batch_size 512", fmt.Sprintf("%d blocks of 16 tokens", tightBlocks)} {
			if !strings.Contains(log, want) {
				t.Errorf("the server log does not say %q", want)
			}
		}
		manyStreams(t, s, "tight", 100, 8, ck.cfg.VocabSize)
		most := mustModelMetric(t, ctx, s, "tight", metricSeqsMax)
		if most < 1 || most > tightBlocks {
			t.Errorf("%s = %v, want 1 to the pool's %d blocks", metricSeqsMax, most, tightBlocks)
		}
		waitModelMetric(t, ctx, s, "tight", metricKVBlocksUsed, 0, 30*time.Second)
		waitModelMetric(t, ctx, s, "tight", metricKVBlocksFree, tightBlocks, 30*time.Second)
	})
}

// streamed is one request of manyStreams: its prompt and the tokens it got.
type streamed struct {
	prompt, tokens []int32
}

// manyStreams sends n streaming greedy requests of random 3- to 10-token prompts and
// out new tokens each to model, all at once over 8 connections, and fails the test
// unless every one gets out tokens.
func manyStreams(t *testing.T, s *harness.Server, model string, n, out, vocab int) []streamed {
	t.Helper()
	ctx := testContext(t, 4*time.Minute)
	rng := rand.New(rand.NewPCG(uint64(n), uint64(out)))
	reqs := make([]streamed, n)
	for i := range reqs {
		reqs[i].prompt = make([]int32, 3+rng.IntN(8))
		for j := range reqs[i].prompt {
			reqs[i].prompt[j] = int32(rng.IntN(vocab - 1))
		}
	}
	const conns = 8
	clients := make([]kserve.GRPCInferenceServiceClient, conns)
	for k := range clients {
		conn, err := s.Dial()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		clients[k] = kserve.NewGRPCInferenceServiceClient(conn)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range reqs {
		wg.Go(func() {
			<-start
			res, err := streamInfer(ctx, clients[i%conns], inferRequest(model, fmt.Sprintf("%s-%d", model, i), tokenInputs(reqs[i].prompt, out, true)))
			switch {
			case err != nil:
				errs[i] = err
			case res.errMsg != "":
				errs[i] = fmt.Errorf("error response %s", res.errMsg)
			case len(res.tokens) != out:
				errs[i] = fmt.Errorf("%d tokens, want %d", len(res.tokens), out)
			}
			reqs[i].tokens = res.tokens
		})
	}
	close(start)
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			if failed++; failed <= 5 {
				t.Errorf("%s request %d: %v", model, i, err)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d requests to %s failed", failed, n, model)
	}
	return reqs
}

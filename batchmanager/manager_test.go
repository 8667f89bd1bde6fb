package batchmanager

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/engine"
)

// eventually polls cond until it holds or a few seconds pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// poolWhole waits until the manager's last stats show every block free and no request.
func poolWhole(t *testing.T, m *Manager) {
	t.Helper()
	eventually(t, "the pool is whole and no request is left", func() bool {
		s := m.Stats()
		return s.FreeKVCacheBlocks == s.MaxKVCacheBlocks && s.ActiveRequestCount == 0 && s.WaitingRequests == 0
	})
}

func randPrompt(rng *rand.Rand, n, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(rng.IntN(vocab))
	}
	return p
}

func TestManagerOutputsMatchSoloGeneration(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Policy: MaxUtilization},
		{Policy: StaticBatch},
		{EnableChunkedContext: true, MaxNumTokens: 7},
		{EnableKVCacheReuse: true},
	} {
		t.Run(string(cfg.Policy)+"/"+map[bool]string{true: "chunked", false: "whole"}[cfg.EnableChunkedContext], func(t *testing.T) {
			eng := newFake(64, 4)
			m, c := start(t, eng, cfg)
			rng := rand.New(rand.NewPCG(1, 2))
			var reqs []*InferenceRequest
			for i := range 20 {
				reqs = append(reqs, &InferenceRequest{
					ID: uint64(i + 1), InputIDs: randPrompt(rng, 1+rng.IntN(12), 50), MaxNewTokens: 1 + rng.IntN(10),
					PadID: -1, Streaming: i%2 == 0, ExcludeInputInOutput: i%3 == 0,
				})
			}
			c.add(reqs...)
			c.wait(t, len(reqs))
			for _, r := range reqs {
				got, err := c.tokensOf(t, r.ID)
				if err != nil {
					t.Fatalf("request %d: %v", r.ID, err)
				}
				want := fakeGenerate(r.InputIDs, r.MaxNewTokens, 50, 128, -1, nil)
				if !r.Streaming && !r.ExcludeInputInOutput {
					want = append(slices.Clone(r.InputIDs), want...)
				}
				if !slices.Equal(got, want) {
					t.Errorf("request %d: got %v, want %v", r.ID, got, want)
				}
				rs := c.responses(r.ID)
				if !rs[len(rs)-1].final || c.finals[r.ID] != 1 {
					t.Errorf("request %d: want exactly one final response, the last", r.ID)
				}
				if !r.Streaming && len(rs) != 1 {
					t.Errorf("request %d: non-streaming got %d responses", r.ID, len(rs))
				}
			}
			poolWhole(t, m)
		})
	}
}

func TestStopConditions(t *testing.T) {
	eng := newFake(64, 4)
	_, c := start(t, eng, Config{})
	prompt := []int32{1, 2, 3}
	solo := fakeGenerate(prompt, 20, 50, 128, -1, nil)
	endID := solo[4]
	// The first position where endID appears decides where generation ends.
	endAt := slices.Index(solo, endID)
	stop := solo[5:7]
	stopAt := 7
	for i := 1; i+2 <= 7; i++ {
		if slices.Equal(solo[i:i+2], stop) {
			stopAt = i + 2
			break
		}
	}
	c.add(
		&InferenceRequest{ID: 1, InputIDs: prompt, MaxNewTokens: 20, EndIDs: []int32{endID}, PadID: -1, ExcludeInputInOutput: true},
		&InferenceRequest{ID: 2, InputIDs: prompt, MaxNewTokens: 20, PadID: -1, StopWords: [][]int32{stop}, ExcludeInputInOutput: true},
		&InferenceRequest{ID: 3, InputIDs: randPrompt(rand.New(rand.NewPCG(3, 3)), 120, 50), MaxNewTokens: 50, PadID: -1, ExcludeInputInOutput: true},
		&InferenceRequest{ID: 4, InputIDs: prompt, MaxNewTokens: 20, EndIDs: []int32{endID}, PadID: -1, Streaming: true},
		&InferenceRequest{ID: 5, InputIDs: randPrompt(rand.New(rand.NewPCG(3, 3)), 120, 50), MaxNewTokens: 8, PadID: -1, ExcludeInputInOutput: true},
	)
	c.wait(t, 5)
	check := func(id uint64, want []int32) {
		t.Helper()
		got, err := c.tokensOf(t, id)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("request %d: got %v (%v), want %v", id, got, err, want)
		}
	}
	t.Run("end id ends it and is left out", func(t *testing.T) { check(1, solo[:endAt]) })
	t.Run("a stop word ends it and is kept", func(t *testing.T) { check(2, solo[:stopAt]) })
	t.Run("a prompt and output over the model's max sequence length are refused, not cut", func(t *testing.T) {
		_, err := c.tokensOf(t, 3)
		if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "request_output_len: prompt length 120 + 50 exceeds the model's maximum sequence length 128 (at most 8 new tokens fit)") {
			t.Errorf("error %v", err)
		}
	})
	t.Run("the model's max sequence length is reached", func(t *testing.T) {
		got, err := c.tokensOf(t, 5)
		rs := c.responses(5)
		if err != nil || len(got) != 128-120 || rs[len(rs)-1].out.Finish != FinishedLength {
			t.Errorf("got %d tokens (%v), finish %v, want %d", len(got), err, rs[len(rs)-1].out.Finish, 8)
		}
	})
	t.Run("streaming end id sends an empty final response", func(t *testing.T) {
		check(4, solo[:endAt])
		rs := c.responses(4)
		last := rs[len(rs)-1]
		if !last.final || len(last.out.Tokens) != 0 {
			t.Errorf("final response: %+v", last)
		}
		if len(rs) != endAt+1 {
			t.Errorf("%d responses, want %d tokens and a final", len(rs), endAt)
		}
	})
}

func TestDuplicateIDRejectedAndReusableAfterFinal(t *testing.T) {
	eng := newFake(64, 4)
	eng.delay = 2 * time.Millisecond
	m, c := start(t, eng, Config{})
	c.add(&InferenceRequest{ID: 7, InputIDs: []int32{1, 2}, MaxNewTokens: 30, PadID: -1})
	eventually(t, "request 7 runs", func() bool { return m.Stats().ActiveRequestCount == 1 })
	c.add(&InferenceRequest{ID: 7, InputIDs: []int32{3}, MaxNewTokens: 1, PadID: -1})
	c.wait(t, 1)
	rs := c.responses(7)
	if len(rs) != 1 || !rs[0].final || !errors.Is(rs[0].err, ErrDuplicateID) {
		t.Fatalf("duplicate: got %+v, want one final ErrDuplicateID", rs)
	}
	c.wait(t, 1)
	// Now the first has finished: the ID may be used again.
	c.add(&InferenceRequest{ID: 7, InputIDs: []int32{3}, MaxNewTokens: 2, PadID: -1, ExcludeInputInOutput: true})
	c.wait(t, 1)
	rs = c.responses(7)
	last := rs[len(rs)-1]
	if last.err != nil || !slices.Equal(last.out.Tokens, fakeGenerate([]int32{3}, 2, 50, 128, -1, nil)) {
		t.Fatalf("reused ID: got %+v", last)
	}
	poolWhole(t, m)
}

func TestCancellationFreesEveryBlock(t *testing.T) {
	eng := newFake(40, 4)
	eng.delay = time.Millisecond
	m, c := start(t, eng, Config{})
	for i := range 5 {
		c.add(&InferenceRequest{ID: uint64(i), InputIDs: []int32{1, 2, 3, 4, 5}, MaxNewTokens: 25, PadID: -1, Streaming: true})
	}
	eventually(t, "every request has streamed a token", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i := range 5 {
			if len(c.resp[uint64(i)]) == 0 {
				return false
			}
		}
		return true
	})
	// Stats are published at the end of an iteration, after its responses went out: the
	// first streamed tokens can arrive before the stats that show their blocks.
	eventually(t, "blocks in use mid-generation", func() bool { return m.Stats().UsedKVCacheBlocks > 0 })
	c.stop(0, 1, 2, 3, 4)
	c.wait(t, 5)
	for i := range 5 {
		rs := c.responses(uint64(i))
		last := rs[len(rs)-1]
		if !last.final || !errors.Is(last.err, ErrCancelled) || !strings.Contains(last.err.Error(), "cancelled") {
			t.Errorf("request %d: last response %+v, want a final cancelled error", i, last)
		}
		if len(rs) >= 26 {
			t.Errorf("request %d was not stopped early: %d responses", i, len(rs))
		}
	}
	poolWhole(t, m)
}

func TestEngineErrorFailsTheBatchAndTheLoopGoesOn(t *testing.T) {
	eng := newFake(64, 4)
	m, c := start(t, eng, Config{})
	eng.mu.Lock()
	eng.failNext = true
	eng.mu.Unlock()
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{1}, MaxNewTokens: 3, PadID: -1})
	c.wait(t, 1)
	if rs := c.responses(1); len(rs) != 1 || !errors.Is(rs[0].err, ErrEngine) {
		t.Fatalf("got %+v, want one final ErrEngine", rs)
	}
	c.add(&InferenceRequest{ID: 2, InputIDs: []int32{1}, MaxNewTokens: 3, PadID: -1})
	c.wait(t, 1)
	if rs := c.responses(2); len(rs) != 1 || rs[0].err != nil {
		t.Fatalf("after the failure: got %+v, want a good answer", rs)
	}
	poolWhole(t, m)
}

func TestPanicInTheLoopFailsRequestsAndTheLoopGoesOn(t *testing.T) {
	eng := newFake(64, 4)
	m, c := start(t, eng, Config{})
	eng.mu.Lock()
	eng.panicNext = true
	eng.mu.Unlock()
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{1}, MaxNewTokens: 3, PadID: -1})
	c.wait(t, 1)
	if rs := c.responses(1); len(rs) != 1 || !errors.Is(rs[0].err, ErrInternal) {
		t.Fatalf("got %+v, want one final ErrInternal", rs)
	}
	c.add(&InferenceRequest{ID: 2, InputIDs: []int32{1}, MaxNewTokens: 3, PadID: -1})
	c.wait(t, 1)
	if rs := c.responses(2); len(rs) != 1 || rs[0].err != nil {
		t.Fatalf("after the panic: got %+v", rs)
	}
	poolWhole(t, m)
}

func TestShutdownFailsEveryRequestInFlight(t *testing.T) {
	eng := newFake(64, 4)
	eng.delay = time.Millisecond
	m, c := start(t, eng, Config{MaxBatchSize: 2})
	for i := range 4 {
		c.add(&InferenceRequest{ID: uint64(i), InputIDs: []int32{1}, MaxNewTokens: 100, PadID: -1})
	}
	eventually(t, "two requests run", func() bool { return m.Stats().ActiveRequestCount == 2 })
	m.Shutdown()
	c.wait(t, 4)
	for i := range 4 {
		rs := c.responses(uint64(i))
		if len(rs) != 1 || !rs[0].final || !errors.Is(rs[0].err, ErrShuttingDown) || !strings.Contains(rs[0].err.Error(), "shutting down") {
			t.Errorf("request %d: got %+v", i, rs)
		}
	}
	m.Shutdown() // idempotent
}

func TestInvalidRequestsGetAClearError(t *testing.T) {
	eng := newFake(8, 4)
	_, c := start(t, eng, Config{MaxNumTokens: 10})
	cases := []struct {
		req  *InferenceRequest
		want string
	}{
		{&InferenceRequest{ID: 1, MaxNewTokens: 1}, "input_ids: the prompt is empty"},
		{&InferenceRequest{ID: 2, InputIDs: []int32{50}, MaxNewTokens: 1}, "input_ids[0] = 50 is outside the vocabulary"},
		{&InferenceRequest{ID: 3, InputIDs: []int32{1}, MaxNewTokens: 0}, "request_output_len: must be at least 1"},
		{&InferenceRequest{ID: 4, InputIDs: make([]int32, 11), MaxNewTokens: 1}, "exceeds max_num_tokens 10"},
		{&InferenceRequest{ID: 5, InputIDs: make([]int32, 5), MaxNewTokens: 100}, "the pool has 8"},
		{&InferenceRequest{ID: 6, InputIDs: []int32{1}, MaxNewTokens: 1, StopWords: [][]int32{{}}}, "stop_words_list[0]: empty"},
		{&InferenceRequest{ID: 7, InputIDs: []int32{1}, MaxNewTokens: 1, Sampling: engine.SamplingParams{EmbeddingBias: []float32{1}}}, "embedding_bias has 1 values, want the vocabulary size 50"},
		{&InferenceRequest{ID: 8, InputIDs: []int32{1}, MaxNewTokens: 1, Sampling: engine.SamplingParams{TopP: 1.5}}, "top_p 1.5 must be in [0, 1]"},
		{&InferenceRequest{ID: 9, InputIDs: []int32{1}, MaxNewTokens: 1, EndIDs: []int32{50}}, "end_id 50 must be in [0, 50)"},
	}
	for _, tc := range cases {
		c.add(tc.req)
	}
	c.wait(t, len(cases))
	for _, tc := range cases {
		rs := c.responses(tc.req.ID)
		if len(rs) != 1 || !rs[0].final || !errors.Is(rs[0].err, ErrInvalidRequest) || !strings.Contains(rs[0].err.Error(), tc.want) {
			t.Errorf("request %d: got %+v, want an error containing %q", tc.req.ID, rs, tc.want)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	eng := newFake(8, 4)
	cb := newClient().callbacks()
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown model type", Config{ModelType: "V2"}, "gpt_model_type"},
		{"unknown policy", Config{Policy: "fifo"}, "batch_scheduler_policy"},
		{"negative batch size", Config{MaxBatchSize: -1}, "max_batch_size"},
		{"negative token budget", Config{MaxNumTokens: -1}, "max_num_tokens"},
		{"V1 with chunked context", Config{ModelType: V1, EnableChunkedContext: true}, "enable_chunked_context"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(eng, tc.cfg, cb, nil)
			if err == nil {
				m.Shutdown()
				t.Fatal("New accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
	if _, err := New(eng, Config{}, Callbacks{}, nil); err == nil {
		t.Error("New accepted missing callbacks")
	}
}

package batchmanager

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"gollm/engine"
)

func TestPrefixReuseOfAThreeBlockPrefix(t *testing.T) {
	const T = 8
	rng := rand.New(rand.NewPCG(11, 11))
	prefix := randPrompt(rng, 3*T, 1000)
	first := append(slices.Clone(prefix), randPrompt(rng, 5, 1000)...)
	second := append(slices.Clone(prefix), randPrompt(rng, 3, 1000)...)
	want := soloGreedy(t, second, 10)

	m, c := start(t, cpuEngine(t, 32, T), Config{EnableKVCacheReuse: true})
	c.add(&InferenceRequest{ID: 1, InputIDs: first, MaxNewTokens: 4, PadID: -1})
	c.wait(t, 1)
	before := m.Stats().ReusedKVCacheBlocks
	c.add(&InferenceRequest{ID: 2, InputIDs: second, MaxNewTokens: 10, PadID: -1, ExcludeInputInOutput: true})
	c.wait(t, 1)
	got, err := c.tokensOf(t, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("with reuse got %v, without %v", got, want)
	}
	c.mu.Lock()
	var reused uint64
	ctxTokens := 0
	for _, s := range c.stats {
		var f map[string]any
		if err := json.Unmarshal([]byte(s), &f); err != nil {
			t.Fatal(err)
		}
		reused = uint64(f["Reused KV cache blocks"].(float64))
	}
	for _, s := range c.typed {
		if s.ContextRequests > 0 && s.IterationCounter > 1 {
			ctxTokens = s.TotalContextTokens
		}
	}
	c.mu.Unlock()
	if reused-before != 3 {
		t.Errorf("stats say %d blocks reused by the second request, want 3", reused-before)
	}
	if ctxTokens != len(second)-3*T {
		t.Errorf("the second request computed %d context tokens, want %d (the prefix came from the cache)", ctxTokens, len(second)-3*T)
	}
	poolWhole(t, m)
}

func TestThousandRandomRequestsWithCancellationsLeaveNothingBehind(t *testing.T) {
	eng := cpuEngine(t, 48, 4)
	m, c := start(t, eng, Config{Policy: MaxUtilization, MaxBatchSize: 24, EnableKVCacheReuse: true, EnableChunkedContext: true, MaxNumTokens: 64})
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 1000
	shared := randPrompt(rng, 8, 1000)
	cancelled := 0
	for i := range n {
		prompt := randPrompt(rng, 1+rng.IntN(12), 1000)
		if rng.IntN(4) == 0 {
			prompt = append(slices.Clone(shared), prompt...)
		}
		c.add(&InferenceRequest{ID: uint64(i), InputIDs: prompt, MaxNewTokens: 1 + rng.IntN(8), EndIDs: []int32{int32(rng.IntN(1000))}, PadID: -1, Streaming: rng.IntN(2) == 0})
		if rng.IntN(5) == 0 {
			c.stop(uint64(i - rng.IntN(min(i+1, 40))))
			cancelled++
		}
		if i%50 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	c.wait(t, n)
	poolWhole(t, m)
	c.mu.Lock()
	defer c.mu.Unlock()
	gotCancelled := 0
	for i := range uint64(n) {
		if c.finals[i] != 1 {
			t.Fatalf("request %d got %d final responses", i, c.finals[i])
		}
		rs := c.resp[i]
		if !rs[len(rs)-1].final {
			t.Fatalf("request %d: a response after the final one", i)
		}
		if err := rs[len(rs)-1].err; err != nil {
			if !errors.Is(err, ErrCancelled) {
				t.Fatalf("request %d: %v", i, err)
			}
			gotCancelled++
		}
	}
	if gotCancelled == 0 {
		t.Error("no request was cancelled mid-flight; the test wants some")
	}
	t.Logf("%d stop signals, %d requests cancelled in flight", cancelled, gotCancelled)
}

func TestStatsJSONHasEverySeedField(t *testing.T) {
	m, c := start(t, cpuEngine(t, 32, 8), Config{MaxBatchSize: 8})
	for i := range 4 {
		c.add(&InferenceRequest{ID: uint64(i), InputIDs: []int32{1, 2, 3, int32(i)}, MaxNewTokens: 5, PadID: -1})
	}
	c.wait(t, 4)
	poolWhole(t, m)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.stats) == 0 || len(c.stats) != len(c.typed) {
		t.Fatalf("%d JSON stats and %d typed", len(c.stats), len(c.typed))
	}
	var prevIter float64
	for k, s := range c.stats {
		var f map[string]any
		if err := json.Unmarshal([]byte(s), &f); err != nil {
			t.Fatalf("stats %d: %v: %s", k, err, s)
		}
		num := func(name string) float64 {
			v, ok := f[name].(float64)
			if !ok {
				t.Fatalf("stats %d: field %q missing or not a number: %s", k, name, s)
			}
			return v
		}
		ts, ok := f["Timestamp"].(string)
		if !ok {
			t.Fatalf("no Timestamp: %s", s)
		}
		if when, err := time.ParseInLocation(timestampLayout, ts, time.Local); err != nil || time.Since(when) > time.Minute || time.Until(when) > time.Second {
			t.Errorf("Timestamp %q: %v, want %%m-%%d-%%Y %%H:%%M:%%S of now", ts, err)
		}
		iter := num("Iteration Counter")
		if iter <= prevIter {
			t.Errorf("Iteration Counter %v after %v", iter, prevIter)
		}
		prevIter = iter
		active, maxReq := num("Active Request Count"), num("Max Request Count")
		maxB, free, used, tpb := num("Max KV cache blocks"), num("Free KV cache blocks"), num("Used KV cache blocks"), num("Tokens per KV cache block")
		sched, ctx, gen, ctxTok := num("Scheduled Requests"), num("Context Requests"), num("Generation Requests"), num("Total Context Tokens")
		num("MicroBatch ID")
		paused, reused := num("Paused Requests"), num("Reused KV cache blocks")
		switch {
		case maxReq != 8 || maxB != 32 || tpb != 8:
			t.Errorf("limits: %s", s)
		case free+used != maxB || free < 0 || used < 0:
			t.Errorf("blocks do not add up: %s", s)
		case sched != ctx+gen || sched < 1 || sched > maxReq:
			t.Errorf("scheduled requests: %s", s)
		case active < 0 || active > maxReq || paused != 0 || reused != 0:
			t.Errorf("counts: %s", s)
		case ctx > 0 && ctxTok < ctx:
			t.Errorf("context tokens: %s", s)
		}
	}
	first := c.typed[0]
	if first.ContextRequests != 4 || first.TotalContextTokens != 16 || first.UsedKVCacheBlocks != 4 {
		t.Errorf("first iteration: %+v, want 4 contexts of 4 tokens in 4 blocks", first)
	}
}

func TestStatsEngineTimeIsTheStep(t *testing.T) {
	eng := newFake(32, 8)
	const pause = 3 * time.Millisecond
	eng.onStep = func(*engine.Batch) { time.Sleep(pause) }
	_, c := start(t, eng, Config{MaxBatchSize: 4})
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 3, PadID: -1})
	c.wait(t, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.typed) == 0 {
		t.Fatal("no iteration stats")
	}
	for k, s := range c.typed {
		if s.EngineTime < pause || s.EngineTime > time.Since(s.Time) {
			t.Errorf("iteration %d: EngineTime %v, want at least the step's %v and at most the iteration's %v", k, s.EngineTime, pause, time.Since(s.Time))
		}
	}
}

package batchmanager

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/engine"
)

// poison sets every field of v, recursively, to a non-zero value.
func poison(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			poison(v.Field(i))
		}
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(7777)
	case reflect.Uint64:
		v.SetUint(7777)
	case reflect.Float32:
		v.SetFloat(77.5)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		poison(s.Index(0))
		v.Set(s)
	default:
		panic(fmt.Sprintf("poison: no value for kind %v", v.Kind()))
	}
}

func TestFillBatchRewritesEveryFieldOfAReusedSlot(t *testing.T) {
	m, err := newManager(newFake(32, 4), Config{}, Callbacks{
		GetInferenceRequests: func(int) []*InferenceRequest { return nil },
		SendResponse:         func(uint64, Result, bool, error) {},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(id uint64, prompt []int32, ir InferenceRequest) *request {
		ir.ID, ir.InputIDs, ir.MaxNewTokens, ir.PadID = id, prompt, 8, -1
		r, err := m.newRequest(&ir)
		if err != nil {
			t.Fatal(err)
		}
		r.kv = m.pool.Add(r.tokens[:r.promptLen], false)
		return r
	}
	// One request mid-generation with every sampling and output option set, one whose
	// prompt is in its second chunk, all defaults.
	gen := mk(1, []int32{1, 2, 3}, InferenceRequest{EndIDs: []int32{9}, Streaming: true, ReturnGenerationLogits: true,
		Sampling: engine.SamplingParams{Temperature: 0.7, TopK: 5, TopP: 0.9, Seed: 3, BadWords: [][]int32{{4, 5}}, EmbeddingBias: make([]float32, 50)}})
	gen.tokens = append(gen.tokens, 11, 12)
	gen.generated, gen.computed, gen.n = 2, 4, 1
	ctx := mk(2, []int32{5, 6, 7, 8, 9, 10}, InferenceRequest{ReturnContextLogits: true})
	ctx.computed, ctx.n = 4, 2
	for _, r := range []*request{gen, ctx} {
		if err := r.kv.Reserve(r.computed + r.n); err != nil {
			t.Fatal(err)
		}
	}
	want := func(r *request) engine.Sequence {
		start, end := r.computed, r.computed+r.n
		return engine.Sequence{ID: r.id, Tokens: r.tokens[start:end], Pos: start, Blocks: r.kv.Blocks(),
			Sample: end == len(r.tokens), Sampling: r.sampling, History: r.tokens[:end], NumGenerated: r.generated,
			ReturnLogits: r.req.ReturnGenerationLogits, ContextLogits: r.ctxLogits != nil && start < r.promptLen && !r.ctxSent}
	}
	// Each order puts each request in a slot that last held the other one (or poison).
	for k, sched := range [][]*request{{gen, ctx}, {ctx, gen}, {gen, ctx}} {
		m.sched = sched
		for i := range m.batch.Seqs[:cap(m.batch.Seqs)] {
			poison(reflect.ValueOf(&m.batch.Seqs[:cap(m.batch.Seqs)][i]).Elem())
		}
		m.it = iterCounts{}
		m.fillBatch()
		if len(m.batch.Seqs) != len(sched) {
			t.Fatalf("fill %d: %d sequences for %d scheduled", k, len(m.batch.Seqs), len(sched))
		}
		for i, r := range sched {
			if got, w := m.batch.Seqs[i], want(r); !reflect.DeepEqual(got, w) {
				t.Errorf("fill %d, slot %d: a field keeps an old value (is a new engine.Sequence field missing from fillBatch?)\n got %+v\nwant %+v", k, i, got, w)
			}
		}
		if m.it.genReqs != 1 || m.it.ctxReqs != 1 || m.it.ctxTokens != 2 {
			t.Errorf("fill %d: counts %+v, want one generation step and one context of 2 tokens", k, m.it)
		}
	}
}

func TestStreamedResultsAreCappedViewsThatNeverChange(t *testing.T) {
	m, c := start(t, newFake(64, 4), Config{})
	_ = m
	const n = 40
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{1, 2, 3}, MaxNewTokens: n, PadID: -1, Streaming: true, ReturnLogProbs: true})
	c.wait(t, 1)
	rs := c.responses(1)
	// Each response's token and log-probability as they are now: a later step would have
	// changed an earlier response's view had the manager reused its memory.
	want := fakeGenerate([]int32{1, 2, 3}, n, 50, 128, -1, nil)
	if len(rs) != n {
		t.Fatalf("%d responses, want %d", len(rs), n)
	}
	for i, r := range rs {
		res := r.out
		if len(res.Tokens) != 1 || res.Tokens[0] != want[i] || res.Length != 1 {
			t.Fatalf("response %d: tokens %v (length %d), want [%d]", i, res.Tokens, res.Length, want[i])
		}
		if cap(res.Tokens) != 1 || cap(res.LogProbs) != 1 {
			t.Fatalf("response %d: views of capacity %d and %d, want 1: a receiver's append would reach the next token", i, cap(res.Tokens), cap(res.LogProbs))
		}
		if res.PromptLen != 3 || res.Generated != i+1 {
			t.Errorf("response %d: counts %d prompt, %d generated; want 3 and %d", i, res.PromptLen, res.Generated, i+1)
		}
		if final := i == n-1; r.final != final || (res.Finish == NotFinished) == final {
			t.Errorf("response %d: final %v, finish %v", i, r.final, res.Finish)
		}
	}
	if rs[n-1].out.Finish != FinishedLength {
		t.Errorf("finish reason %v, want LENGTH", rs[n-1].out.Finish)
	}
}

func TestCompactKeepsTheOrderAndLeavesNoDepartedRequestBehind(t *testing.T) {
	// k: the request stays (running), d: it departed (done).
	for _, tc := range []struct {
		name, pattern string
		// inPlace: the kept requests stay where they were (nothing moved).
		inPlace bool
	}{
		{"nobody left", "kkkkk", true},
		{"the oldest left", "ddkkk", true},
		{"the newest left", "kkkdd", true},
		{"some in the middle left", "kdkdk", false},
		{"the oldest and one in the middle left", "ddkdk", false},
		{"everyone left", "ddddd", true},
		{"an empty list", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			full := make([]*request, len(tc.pattern))
			var want []*request
			for i, c := range tc.pattern {
				full[i] = &request{id: uint64(i), phase: phaseRunning}
				if c == 'd' {
					full[i].phase = phaseDone
				} else {
					want = append(want, full[i])
				}
			}
			departed := func(r *request) bool { return r != nil && r.phase == phaseDone }
			got := compact(slices.Clone(full), phaseRunning)
			got2 := compact(full, phaseRunning)
			if !slices.Equal(got, want) || !slices.Equal(got2, want) {
				t.Fatalf("compact(%s) = %v, want %v", tc.pattern, ids(got), ids(want))
			}
			if slices.ContainsFunc(full, departed) {
				t.Errorf("compact(%s): the list's array still holds departed requests: %v", tc.pattern, ids(full))
			}
			if tc.inPlace && len(want) > 0 {
				if i := slices.Index(full, want[0]); i < 0 || &got2[0] != &full[i] {
					t.Errorf("compact(%s) moved the requests it kept", tc.pattern)
				}
			}
			if again := compact(got2, phaseRunning); !slices.Equal(again, want) {
				t.Errorf("compacting a compacted list changed it: %v", ids(again))
			}
		})
	}
}

// ids lists the IDs of requests (nil as -1), for messages.
func ids(rs []*request) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = -1
		if r != nil {
			out[i] = int64(r.id)
		}
	}
	return out
}

func TestStatsEncoderWritesWhatMarshalJSONWrites(t *testing.T) {
	var e statsEncoder
	base := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	east := time.FixedZone("east", 5*3600)
	s := Stats{IterationCounter: 3, ActiveRequestCount: 4, MaxRequestCount: 64, MaxKVCacheBlocks: 100,
		FreeKVCacheBlocks: 60, UsedKVCacheBlocks: 40, TokensPerKVCacheBlock: 16, ScheduledRequests: 4,
		ContextRequests: 1, GenerationRequests: 3, TotalContextTokens: 9, TotalGenerationTokens: 4,
		EmptyGenerationSlots: 2, PausedRequests: 1, WaitingRequests: 5, ReusedKVCacheBlocks: 7}
	// The same second twice (the cached timestamp), the next second, the same instant
	// in another zone, then V1 and back.
	for k, step := range []struct {
		when time.Time
		v1   bool
	}{
		{base, false}, {base.Add(900 * time.Millisecond), false}, {base.Add(time.Second), false},
		{base.Add(time.Second).In(east), false}, {base.Add(time.Second), true}, {base.Add(2 * time.Second), false},
	} {
		s.Time, s.V1 = step.when, step.v1
		s.IterationCounter++
		want, err := s.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.encode(&s)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("step %d: encoder wrote\n%s\nMarshalJSON\n%s", k, got, want)
		}
		if stamp := step.when.Format(timestampLayout); !strings.Contains(string(got), `"Timestamp":"`+stamp+`"`) {
			t.Errorf("step %d: want Timestamp %q in %s", k, stamp, got)
		}
	}
}

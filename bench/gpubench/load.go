package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"gollm/batchmanager"
	"gollm/bench/loadstat"
)

// runLoadWorkload runs a load workload once, after a warm-up load of its shape (a few
// requests, so that the cuBLAS shapes of its prompt chunks are met), and prints its
// rows.
func runLoadWorkload(eng benchEngine, l loadstat.Load, name, dtype, impl string) error {
	warm := l
	warm.Requests = min(l.Requests, 8)
	warm.Concurrency = 0
	warm.Out = min(l.Out, 8)
	if _, err := runLoad(eng, warm, nil); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	start := time.Now()
	var it iterations
	reqs, err := runLoad(eng, l, &it)
	if err != nil {
		return err
	}
	s := loadstat.Summarize(reqs)
	if want := l.Requests * l.Out; s.Tokens != want {
		return fmt.Errorf("%d tokens streamed, want %d", s.Tokens, want)
	}
	fmt.Fprintf(os.Stderr, "gpubench: %s: %d requests in %.1f s\n", l.Name, l.Requests, time.Since(start).Seconds())
	base := map[string]any{"model": name, "dtype": dtype, "impl": impl, "max_batch_size": maxBatch,
		"max_num_tokens": maxNumTokens, "kv_blocks": eng.Info().NumBlocks}
	rows := s.Rows(l, base)
	if len(rows) > 0 && it.n > 0 {
		// What the run's steps were: how many, how full, and the engine's share of them
		// (Engine.Step's wall time, or the wait for a step launched ahead).
		rows[0]["iterations"] = it.n
		rows[0]["seqs_per_iteration_mean"] = float64(it.seqs) / float64(it.n)
		rows[0]["seqs_per_iteration_max"] = it.most
		rows[0]["engine_ms_per_iteration"] = it.engine.Seconds() * 1e3 / float64(it.n)
		// Steps with prompt tokens apart from decode-only ones: how many, and the time
		// from each one's start to the next's (the last one's is not known).
		for _, k := range []struct {
			name string
			kind *iterKind
		}{{"context", &it.ctx}, {"decode", &it.gen}} {
			rows[0]["iterations_"+k.name] = k.kind.n
			if k.kind.timed > 0 {
				rows[0]["wall_ms_per_iteration_"+k.name] = k.kind.wall.Seconds() * 1e3 / float64(k.kind.timed)
			}
		}
	}
	for _, r := range rows {
		j, _ := json.Marshal(r)
		fmt.Println(string(j))
	}
	return nil
}

// iterations sums the batch manager's iteration stats of a run.
type iterations struct {
	n, seqs, most int
	engine        time.Duration
	// ctx and gen: the iterations with prompt (context) tokens and the decode-only ones.
	ctx, gen iterKind
	// last is the previous iteration's start and kind (nil before the first).
	last     time.Time
	lastKind *iterKind
}

// iterKind sums one kind of iteration: how many, and over the timed ones (those another
// iteration followed) their wall time from start to the next's start.
type iterKind struct {
	n, timed int
	wall     time.Duration
}

// add records one iteration's stats.
func (it *iterations) add(st batchmanager.Stats) {
	it.n++
	it.seqs += st.ScheduledRequests
	it.most = max(it.most, st.ScheduledRequests)
	it.engine += st.EngineTime
	if it.lastKind != nil {
		it.lastKind.timed++
		it.lastKind.wall += st.Time.Sub(it.last)
	}
	k := &it.gen
	if st.TotalContextTokens > 0 {
		k = &it.ctx
	}
	k.n++
	it.last, it.lastKind = st.Time, k
}

// runLoad offers l's requests to a batch manager (random prompts, greedy, no end token,
// streamed) and returns each one's timeline; it (optional) gets the iterations' stats.
func runLoad(eng benchEngine, l loadstat.Load, it *iterations) ([]loadstat.Request, error) {
	vocab := eng.Info().VocabSize
	rng := rand.New(rand.NewPCG(uint64(l.Requests), uint64(l.In)))
	queue := make([]*batchmanager.InferenceRequest, l.Requests)
	for i := range queue {
		p := make([]int32, l.In)
		for j := range p {
			p[j] = int32(rng.IntN(vocab))
		}
		queue[i] = &batchmanager.InferenceRequest{ID: uint64(i + 1), InputIDs: p, MaxNewTokens: l.Out, PadID: -1,
			ExcludeInputInOutput: true, Streaming: true}
	}
	reqs := make([]loadstat.Request, l.Requests)
	var mu sync.Mutex
	// released is how many requests the client has sent: C at first, one more as each
	// ends (all N at once under max load).
	released := l.InFlight()
	next := 0
	done := make(chan error, l.Requests)
	start := time.Now()
	for i := range released {
		reqs[i].Offered = start
	}
	// wake cuts the manager's idle wait short when a request is released (under mu: set
	// once the manager exists).
	var wake func()
	cfg := batchmanager.Config{MaxBatchSize: maxBatch, Overlap: overlap, MaxNumTokens: maxNumTokens,
		EnableChunkedContext: true}
	m, err := batchmanager.New(eng, cfg, batchmanager.Callbacks{
		GetInferenceRequests: func(most int) []*batchmanager.InferenceRequest {
			mu.Lock()
			defer mu.Unlock()
			k := released - next
			if most >= 0 {
				k = min(k, most)
			}
			q := queue[next : next+k]
			next += k
			return q
		},
		SendResponse: func(id uint64, res batchmanager.Result, final bool, err error) {
			now := time.Now()
			mu.Lock()
			r := &reqs[id-1]
			if err == nil && res.Length > 0 {
				r.Times = append(r.Times, now)
				r.Tokens = append(r.Tokens, res.Length)
			}
			more := final && released < l.Requests
			if more {
				reqs[released].Offered = now
				released++
			}
			w := wake
			mu.Unlock()
			if more && w != nil {
				w()
			}
			if err != nil {
				done <- fmt.Errorf("request %d: %w", id, err)
			} else if final {
				done <- nil
			}
		},
		IterationStats: func(st batchmanager.Stats) {
			if it == nil {
				return
			}
			mu.Lock()
			it.add(st)
			mu.Unlock()
		},
	}, nil)
	if err != nil {
		return nil, err
	}
	mu.Lock()
	wake = m.Wake
	mu.Unlock()
	defer m.Shutdown()
	for range l.Requests {
		if err := <-done; err != nil {
			return nil, err
		}
	}
	return reqs, nil
}

package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"gollm/bench/loadstat"
	"gollm/kserve"
)

// runLoadWorkload runs the load workload w once, after a warm-up of a few requests of
// its shape, and prints its rows.
func runLoadWorkload(cs []kserve.GRPCInferenceServiceClient, modelName, name, w string, vocab int, opts options) error {
	l, err := loadstat.Parse(w)
	if err != nil {
		return err
	}
	warm := loadstat.Load{Requests: min(l.Requests, 8), In: l.In, Out: min(l.Out, 8)}
	if _, err := runLoad(cs, modelName, warm, vocab, opts); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	start := time.Now()
	reqs, err := runLoad(cs, modelName, l, vocab, opts)
	if err != nil {
		return err
	}
	s := loadstat.Summarize(reqs)
	if want := l.Requests * l.Out; s.Tokens != want {
		return fmt.Errorf("%d tokens streamed, want %d", s.Tokens, want)
	}
	fmt.Fprintf(os.Stderr, "tritonbench: %s: %d requests in %.1f s\n", w, l.Requests, time.Since(start).Seconds())
	base := map[string]any{"model": name, "dtype": opts.dtype, "impl": opts.impl(), "conns": len(cs)}
	for _, r := range s.Rows(l, base) {
		j, _ := json.Marshal(r)
		fmt.Println(string(j))
	}
	return nil
}

// runLoad sends l's requests (random prompts, greedy, no end token), each on its own
// stream, InFlight at a time, and returns each one's timeline.
func runLoad(cs []kserve.GRPCInferenceServiceClient, modelName string, l loadstat.Load, vocab int, opts options) ([]loadstat.Request, error) {
	rng := rand.New(rand.NewPCG(uint64(l.Requests), uint64(l.In)))
	prompts := make([][]int32, l.Requests)
	for i := range prompts {
		prompts[i] = make([]int32, l.In)
		for j := range prompts[i] {
			prompts[i][j] = int32(rng.IntN(vocab))
		}
	}
	reqs := make([]loadstat.Request, l.Requests)
	errs := make([]error, l.Requests)
	next := make(chan int, l.Requests)
	for i := range l.Requests {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for k := range l.InFlight() {
		wg.Go(func() {
			for i := range next {
				reqs[i].Offered = time.Now()
				res, err := stream(cs[k%len(cs)], modelName, fmt.Sprintf("load-%d", i), prompts[i], l.Out, opts.streaming)
				reqs[i].Times, reqs[i].Tokens = res.times, res.counts
				if err == nil && len(res.tokens) != l.Out {
					err = fmt.Errorf("stream %d: %d tokens, want %d", i, len(res.tokens), l.Out)
				}
				errs[i] = err
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return reqs, nil
}

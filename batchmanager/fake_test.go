package batchmanager

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"gollm/engine"
)

// fakeEngine is a deterministic stand-in engine with a simulated paged KV cache: it
// stores each fed token in the block and slot the block table names, and samples from
// what it reads back out of the cache, so a wrong block table gives wrong tokens (or an
// error) exactly as a real KV cache would.
type fakeEngine struct {
	// mu guards the fields below (Step runs on the manager goroutine, tests poke it).
	mu sync.Mutex
	// info is what Info returns.
	info engine.Info
	// kv holds the token stored in every block slot (-1: never written).
	kv [][]int32
	// steps counts Step calls.
	steps int
	// failNext makes the next Step return an error.
	failNext bool
	// panicNext makes the next Step panic.
	panicNext bool
	// onStep, when set, sees every batch (under mu).
	onStep func(b *engine.Batch)
	// delay sleeps in every Step.
	delay time.Duration
}

// newFake makes a fake engine with vocab 50, max sequence length 128.
func newFake(numBlocks, tpb int) *fakeEngine {
	f := &fakeEngine{info: engine.Info{VocabSize: 50, MaxSeqLen: 128, Layers: 1, KVHeads: 1, HeadDim: 1,
		NumBlocks: numBlocks, TokensPerBlock: tpb}}
	f.kv = make([][]int32, numBlocks)
	for i := range f.kv {
		f.kv[i] = slices.Repeat([]int32{-1}, tpb)
	}
	return f
}

func (f *fakeEngine) Info() engine.Info { return f.info }
func (f *fakeEngine) Close() error      { return nil }

// fakeNext is the fake model: the next token after a sequence.
func fakeNext(hist []int32, vocab int) int32 {
	h := uint32(len(hist)) * 2654435761
	for _, t := range hist[max(0, len(hist)-6):] {
		h = h*31 + uint32(t) + 7
		h ^= h >> 13
	}
	return int32(h % uint32(vocab))
}

// fakeGenerate is the reference: what a request generates alone.
func fakeGenerate(prompt []int32, maxNew, vocab, maxSeqLen int, endID int32, stops [][]int32) []int32 {
	toks := slices.Clone(prompt)
	var out []int32
	for len(out) < maxNew && len(toks) < maxSeqLen {
		t := fakeNext(toks, vocab)
		if endID >= 0 && t == endID {
			break
		}
		toks = append(toks, t)
		out = append(out, t)
		if hitsStopWord(toks, stops) {
			break
		}
	}
	return out
}

func (f *fakeEngine) Step(b *engine.Batch) ([]engine.Output, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps++
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	if f.onStep != nil {
		f.onStep(b)
	}
	if f.failNext {
		f.failNext = false
		return nil, errors.New("fake: injected failure")
	}
	if f.panicNext {
		f.panicNext = false
		panic("fake: injected panic")
	}
	T := f.info.TokensPerBlock
	// The copy-on-write of beams, before anything is written.
	for _, c := range b.BlockCopies {
		copy(f.kv[c.Dst], f.kv[c.Src])
	}
	writers := map[int32]uint64{}
	outs := make([]engine.Output, len(b.Seqs))
	for i, s := range b.Seqs {
		end := s.Pos + len(s.Tokens)
		if len(s.Blocks)*T < end {
			return nil, fmt.Errorf("fake: seq %d: %d blocks cannot hold %d positions", s.ID, len(s.Blocks), end)
		}
		if len(s.History) != end || !slices.Equal(s.History[s.Pos:], s.Tokens) {
			return nil, fmt.Errorf("fake: seq %d: history does not end with the tokens", s.ID)
		}
		for p := 0; p < s.Pos; p++ {
			if got := f.kv[s.Blocks[p/T]][p%T]; got != s.History[p] {
				return nil, fmt.Errorf("fake: seq %d: KV at position %d (block %d) holds %d, history has %d", s.ID, p, s.Blocks[p/T], got, s.History[p])
			}
		}
		for j, t := range s.Tokens {
			p := s.Pos + j
			blk := s.Blocks[p/T]
			if w, ok := writers[blk]; ok && w != s.ID {
				return nil, fmt.Errorf("fake: block %d written by seqs %d and %d in one step", blk, w, s.ID)
			}
			writers[blk] = s.ID
			f.kv[blk][p%T] = t
		}
		outs[i].Token = -1
		if s.ContextLogits {
			for j := range s.Tokens {
				row := make([]float32, f.info.VocabSize)
				row[fakeNext(s.History[:s.Pos+j+1], f.info.VocabSize)] = 1
				outs[i].ContextLogits = append(outs[i].ContextLogits, row...)
			}
		}
		if !s.Sample && !s.ReturnLogits {
			continue
		}
		// Read the sequence back out of the cache: this is what catches bad tables.
		hist := make([]int32, end)
		for p := range end {
			hist[p] = f.kv[s.Blocks[p/T]][p%T]
		}
		t := fakeNext(hist, f.info.VocabSize)
		if s.Sample {
			outs[i].Token = t
			outs[i].LogProb = -float32(t%7) / 10
		}
		if s.ReturnLogits {
			outs[i].Logits = make([]float32, f.info.VocabSize)
			outs[i].Logits[t] = 1
		}
	}
	return outs, nil
}

// response is one SendResponse call.
type response struct {
	// out is SendResponse's result.
	out Result
	// final marks the request's last response.
	final bool
	// err fails the request (with final).
	err error
}

// client implements the callbacks over a queue, recording every response.
type client struct {
	// mu guards everything below.
	mu sync.Mutex
	// queue are requests not handed out yet.
	queue []*InferenceRequest
	// resp are the responses by request ID, in order.
	resp map[uint64][]response
	// finals counts final responses by ID.
	finals map[uint64]int
	// stops are the IDs to report at every poll until their final response.
	stops map[uint64]struct{}
	// stats hold ReturnBatchManagerStats' JSON, in order.
	stats []string
	// typed hold IterationStats' structs, in order.
	typed []Stats
	// maxSeen records every max passed to GetInferenceRequests.
	maxSeen []int
	// done is signalled on every final response.
	done chan uint64
	// m, once set, is woken by add.
	m *Manager
}

func newClient() *client {
	return &client{resp: map[uint64][]response{}, finals: map[uint64]int{}, stops: map[uint64]struct{}{}, done: make(chan uint64, 100000)}
}

func (c *client) callbacks() Callbacks {
	return Callbacks{
		GetInferenceRequests: func(max int) []*InferenceRequest {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.maxSeen = append(c.maxSeen, max)
			n := len(c.queue)
			if max >= 0 && max < n {
				n = max
			}
			out := c.queue[:n:n]
			c.queue = slices.Clone(c.queue[n:])
			return out
		},
		SendResponse: func(id uint64, out Result, final bool, err error) {
			c.mu.Lock()
			c.resp[id] = append(c.resp[id], response{out, final, err})
			if final {
				c.finals[id]++
				delete(c.stops, id)
			}
			c.mu.Unlock()
			if final {
				c.done <- id
			}
		},
		PollStopSignal: func() map[uint64]struct{} {
			c.mu.Lock()
			defer c.mu.Unlock()
			if len(c.stops) == 0 {
				return nil
			}
			// Like a cancelled flag, a stop stays raised until the request has ended.
			s := make(map[uint64]struct{}, len(c.stops))
			for id := range c.stops {
				s[id] = struct{}{}
			}
			return s
		},
		ReturnBatchManagerStats: func(s string) {
			c.mu.Lock()
			c.stats = append(c.stats, s)
			c.mu.Unlock()
		},
		IterationStats: func(s Stats) {
			c.mu.Lock()
			c.typed = append(c.typed, s)
			c.mu.Unlock()
		},
	}
}

// add queues requests and wakes the manager.
func (c *client) add(rs ...*InferenceRequest) {
	c.mu.Lock()
	c.queue = append(c.queue, rs...)
	m := c.m
	c.mu.Unlock()
	if m != nil {
		m.Wake()
	}
}

// stop asks for requests to be stopped at the next poll.
func (c *client) stop(ids ...uint64) {
	c.mu.Lock()
	for _, id := range ids {
		c.stops[id] = struct{}{}
	}
	c.mu.Unlock()
}

// wait waits for n final responses.
func (c *client) wait(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for range n {
		select {
		case <-c.done:
		case <-timeout:
			t.Fatalf("timed out waiting for %d final responses", n)
		}
	}
}

// responses returns a copy of one request's responses.
func (c *client) responses(id uint64) []response {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.resp[id])
}

// tokensOf joins the output_ids of a request's responses (streamed or not).
func (c *client) tokensOf(t *testing.T, id uint64) ([]int32, error) {
	t.Helper()
	var toks []int32
	for _, r := range c.responses(id) {
		if r.err != nil {
			return toks, r.err
		}
		if r.out.Length > len(r.out.Tokens) {
			t.Fatalf("request %d: Length %d > %d tokens", id, r.out.Length, len(r.out.Tokens))
		}
		toks = append(toks, r.out.Tokens[:r.out.Length]...)
	}
	return toks, nil
}

// start makes a manager over eng with a fresh client.
func start(t *testing.T, eng engine.Engine, cfg Config) (*Manager, *client) {
	t.Helper()
	c := newClient()
	if cfg.IdleWait == 0 {
		cfg.IdleWait = time.Millisecond
	}
	m, err := New(eng, cfg, c.callbacks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.m = m
	c.mu.Unlock()
	t.Cleanup(m.Shutdown)
	return m, c
}

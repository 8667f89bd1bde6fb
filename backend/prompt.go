package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"go.uber.org/zap"

	"gollm/bridge/triton"
)

// Text prompts are tokenized off Execute when they are long. Triton calls an instance's
// Execute for every request it hands over, one call at a time: a long tokenization there
// would hold every request that arrives behind it (a 5 MB prompt took 11.6 s before the
// limits below). A text longer than the model can take is refused by its bytes alone
// (limits.MaxPromptBytes) and tokenization stops once past the tokens that fit, so a
// tokenization is bounded by the model's maximum sequence length, not by the text; a
// prompt of more than inlinePromptBytes is still tokenized on a goroutine of its model's
// tokenizer pool, at most tokenizeWorkers at once, and at most tokenizeQueue of them may
// wait (past that, Execute waits for a place: the pool's memory stays bounded).

const (
	// inlinePromptBytes is the longest text prompt tokenized inside Execute (well under
	// a millisecond).
	inlinePromptBytes = 8 << 10
	// tokenizeQueue bounds the long prompts a model holds while they wait for, or go
	// through, tokenization.
	tokenizeQueue = 64
)

// tokenizeWorkers is how many long prompts a model tokenizes at once: a quarter of the
// cores (at least one), so that the engines keep the rest.
var tokenizeWorkers = max(1, runtime.GOMAXPROCS(0)/4)

// tokenizerPool bounds a model's long tokenizations.
type tokenizerPool struct {
	// queued holds a place per long prompt accepted and not yet tokenized.
	queued chan struct{}
	// running holds a place per tokenization in progress.
	running chan struct{}
}

// newTokenizerPool makes a model's pool.
func newTokenizerPool() *tokenizerPool {
	return &tokenizerPool{queued: make(chan struct{}, tokenizeQueue), running: make(chan struct{}, tokenizeWorkers)}
}

// tokenizeLater queues f, whose text prompt p still has to be tokenized, for a
// goroutine of the model's pool; that queues the request for the batch manager, or
// answers it with the error (the request itself is released already). It returns once
// the pool has a place for it.
func (in *instance) tokenizeLater(f *inflight, p *parsedRequest) {
	pool := in.ms.tokenizers
	pool.queued <- struct{}{}
	in.tokenizing.Add(1)
	go func() {
		defer in.tokenizing.Done()
		defer func() { <-pool.queued }()
		start := time.Now()
		err := in.tokenize(pool, p)
		in.mu.Lock()
		if in.inflight[f.id] != f {
			// The instance closed meanwhile and answered it.
			in.mu.Unlock()
			return
		}
		if err == nil {
			in.queue = append(in.queue, &p.Req)
			in.mu.Unlock()
			in.mgr.Wake()
			in.log.Debug("long prompt tokenized", zap.Uint64("id", f.id), zap.String("request_id", f.tritonID),
				zap.Int("prompt", len(p.Req.InputIDs)), zap.Duration("took", time.Since(start)))
			return
		}
		in.forgetLocked(f.id)
		in.mu.Unlock()
		in.log.Debug("request refused", zap.Uint64("id", f.id), zap.String("request_id", f.tritonID), zap.Error(err))
		in.sendFinal(f.factory, triton.WithCode(triton.CodeInvalidArg, err), f.tritonID)
		if derr := f.factory.Delete(); derr != nil {
			in.log.Error("delete response factory", zap.Uint64("id", f.id), zap.Error(derr))
		}
		in.ms.untrack(f)
	}()
}

// tokenize runs p's tokenization in one of the pool's places, a panic in it becoming
// an error.
func (in *instance) tokenize(pool *tokenizerPool, p *parsedRequest) (err error) {
	pool.running <- struct{}{}
	defer func() { <-pool.running }()
	defer func() {
		if v := recover(); v != nil {
			in.log.Error("panic while tokenizing a prompt", zap.Any("panic", v), zap.ByteString("stack", debug.Stack()))
			err = fmt.Errorf("input %q: gollm: internal error while tokenizing: %v", inTextInput, v)
		}
	}()
	return p.tokenizePrompt(in.ms.lim)
}

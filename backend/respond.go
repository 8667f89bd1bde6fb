package main

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"gollm/batchmanager"
	"gollm/bridge/triton"
)

// The sending side of an instance: the batch manager's SendResponse queues each
// response for a sender goroutine, which turns it into Triton responses off the
// manager's loop, in order per request.

// sender is one sender goroutine's queue.
type sender struct {
	// mu guards q and closed; cond signals the goroutine.
	mu   sync.Mutex
	cond *sync.Cond
	// q are the responses to send, in order.
	q []sendItem
	// closed stops the goroutine once q is empty.
	closed bool
}

// sendItem is one SendResponse call waiting for a sender goroutine.
type sendItem struct {
	// id keys the request in the instance's inflight map.
	id uint64
	// res is sent as it came from the batch manager.
	res batchmanager.Result
	// final marks the last response.
	final bool
	// err makes it an error response.
	err error
	// held marks a final response already held back once (cancelfinal.go).
	held bool
}

// sendResponse is the batch manager's SendResponse: it queues the response for the
// sender goroutine and returns at once.
func (in *instance) sendResponse(id uint64, res batchmanager.Result, final bool, err error) {
	item := sendItem{id: id, res: res, final: final, err: err}
	if final && errors.Is(err, batchmanager.ErrCancelled) {
		if at, ok := in.heldFinals.cancelledAt(id); ok {
			in.heldFinals.after(cancelledFinalDelay-time.Since(at), item, in.enqueue)
			return
		}
	}
	in.enqueue(item)
}

// enqueue queues a response for its request's sender goroutine.
func (in *instance) enqueue(item sendItem) {
	// One request's responses all go through one sender, so they stay in order.
	sd := in.senders[item.id%uint64(len(in.senders))]
	sd.mu.Lock()
	sd.q = append(sd.q, item)
	sd.mu.Unlock()
	sd.cond.Signal()
}

// send is a sender goroutine: it sends sd's queued responses in order, off the batch
// manager's loop.
func (in *instance) send(sd *sender) {
	defer in.sendersDone.Done()
	for {
		sd.mu.Lock()
		for len(sd.q) == 0 && !sd.closed {
			sd.cond.Wait()
		}
		if len(sd.q) == 0 {
			sd.mu.Unlock()
			return
		}
		batch := sd.q
		sd.q = nil
		sd.mu.Unlock()
		start := time.Now()
		for _, item := range batch {
			in.deliver(item)
		}
		in.trace.add('S', start, time.Now(), len(batch), 0, 0)
	}
}

// stopSender lets the senders finish what is queued and waits for them.
func (in *instance) stopSender() {
	for _, sd := range in.senders {
		sd.mu.Lock()
		sd.closed = true
		sd.mu.Unlock()
		sd.cond.Broadcast()
	}
	in.sendersDone.Wait()
}

// deliver sends one response of the batch manager to its request's client.
func (in *instance) deliver(item sendItem) {
	in.mu.Lock()
	f := in.inflight[item.id]
	// A streaming request's final response follows its previous one after
	// final_flag_delay_ms at the least (cancelfinal.go); it stays in flight until then.
	var hold time.Duration
	if f != nil && item.final && !item.held && item.err == nil && f.streaming && f.responses > 0 {
		hold = in.ms.cfg.FinalFlagDelay - time.Since(f.lastSent)
	}
	if f != nil && item.final && hold <= 0 {
		in.forgetLocked(item.id)
	}
	in.mu.Unlock()
	if f == nil {
		in.log.Warn("response for a request that is not in flight", zap.Uint64("id", item.id), zap.Bool("final", item.final), zap.Error(item.err))
		return
	}
	if hold > 0 {
		item.held = true
		in.heldFinals.after(hold, item, in.enqueue)
		return
	}
	defer func() {
		if p := recover(); p != nil {
			in.log.Error("panic while sending a response", zap.Uint64("id", f.id), zap.String("request_id", f.tritonID),
				zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
			if item.final {
				// The factory may or may not have sent the final flag; try once more.
				_ = f.factory.SendFlags(triton.ResponseFinal)
				_ = f.factory.Delete()
				in.ms.untrack(f)
			}
		}
	}()
	if item.err != nil || item.final {
		in.finish(f, &item.res, responseError(clientError(item.err, f)))
		return
	}
	if err := in.respond(f, &item.res, 0); err != nil {
		in.log.Error("send response", zap.Uint64("id", f.id), zap.String("request_id", f.tritonID), zap.Error(err))
	}
}

// forgetLocked takes a request out of inflight at its final response (mu held).
func (in *instance) forgetLocked(id uint64) {
	// Out of inflight before the factory goes: pollStop reads factories under mu.
	delete(in.inflight, id)
	in.heldFinals.cancelledAt(id)
	requestEnded()
	if len(in.inflight) == 0 {
		// The manager reports stats only for iterations that ran the engine, so a
		// request it ended otherwise (cancelled while waiting, a failed iteration) would
		// leave the gauges as they were. With nothing in flight the manager holds
		// nothing: the idle values are the truth. Under mu, so a request accepted after
		// this is not hidden.
		in.metrics.idle()
	}
}

// finish sends a request's final response (res, or err) and forgets the request.
func (in *instance) finish(f *inflight, res *batchmanager.Result, err error) {
	if err == nil {
		err = in.respond(f, res, triton.ResponseFinal)
		if err != nil {
			// The outputs could not be sent; the client still gets a final answer.
			in.log.Error("send final response", zap.Uint64("id", f.id), zap.String("request_id", f.tritonID), zap.Error(err))
			err = triton.Errorf(triton.CodeInternal, "gollm: sending the response failed: %v", err)
		}
	}
	if err != nil && f.departing.Load() {
		if l := in.away.left(); l != nil {
			err = l.err
		}
	}
	if err != nil {
		in.log.Debug("request failed", zap.Uint64("id", f.id), zap.String("request_id", f.tritonID), zap.Error(err))
		in.sendFinal(f.factory, err, f.tritonID)
	}
	if derr := f.factory.Delete(); derr != nil {
		in.log.Error("delete response factory", zap.Uint64("id", f.id), zap.Error(derr))
	}
	in.ms.untrack(f)
	in.log.Debug("request done", zap.Uint64("id", f.id), zap.String("request_id", f.tritonID),
		zap.Int("responses", f.responses), zap.Bool("error", err != nil))
}

// respond sends one response with res's outputs; flags is ResponseFinal for the last. A
// streaming response with nothing new becomes the final flag alone, or nothing.
func (in *instance) respond(f *inflight, res *batchmanager.Result, flags uint32) error {
	final := flags&triton.ResponseFinal != 0
	outs, empty := convertOutputs(res, &f.spec, final)
	if f.spec.asked.finishReason && res.Finish != batchmanager.NotFinished && ended(res, final) {
		// The reason goes out even when nothing else does (the end token).
		empty = false
	}
	if f.spec.counts != nil {
		// The first response always goes out, so that the prompt's count arrives even
		// when the request ends at once with its end token.
		empty = empty && f.responses > 0
	}
	if f.streaming && empty {
		if flags == 0 {
			return nil
		}
		return f.factory.SendFlags(flags)
	}
	resp, err := triton.NewResponse(f.factory)
	if err != nil {
		return err
	}
	for _, o := range outs {
		if err := resp.AddOutput(o.Name, o.DataType, o.Shape, o.Data); err != nil {
			_ = resp.Delete()
			return err
		}
	}
	f.responses++
	f.lastSent = time.Now()
	return resp.Send(flags, nil)
}

// clientError names the client's request id in a batch manager error, in place of the
// backend's own request number ("request 7: …" becomes `request "abc": …`, or "request:
// …" when the client gave no id).
func clientError(err error, f *inflight) error {
	if err == nil {
		return nil
	}
	msg, ok := strings.CutPrefix(err.Error(), fmt.Sprintf("request %d: ", f.id))
	if !ok {
		return err
	}
	name := "request: "
	if f.tritonID != "" {
		name = fmt.Sprintf("request %q: ", f.tritonID)
	}
	return &renamedError{msg: name + msg, err: err}
}

// renamedError is an error with a new message that still unwraps to the original.
type renamedError struct {
	// msg names the client's request id in place of the backend's number.
	msg string
	// err keeps errors.Is working on the renamed error.
	err error
}

// Error returns the new message.
func (e *renamedError) Error() string { return e.msg }

// Unwrap returns the original error.
func (e *renamedError) Unwrap() error { return e.err }

// responseError gives a batch manager error its Triton code.
func responseError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, batchmanager.ErrCancelled):
		return triton.WithCode(triton.CodeCancelled, err)
	case errors.Is(err, batchmanager.ErrInvalidRequest), errors.Is(err, batchmanager.ErrDuplicateID):
		return triton.WithCode(triton.CodeInvalidArg, err)
	case errors.Is(err, batchmanager.ErrShuttingDown), errors.Is(err, batchmanager.ErrEngineBroken):
		return triton.WithCode(triton.CodeUnavailable, err)
	}
	return triton.WithCode(triton.CodeInternal, err)
}

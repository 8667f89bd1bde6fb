package main

import (
	"sync"
	"time"
)

// Why final flags wait a moment (issue 32, finding 8):
//
// tritonserver 2.51's gRPC stream frontend releases a request's state, and recycles it
// for the next stream, on the first of two events to reach its completion queue when the
// client cancels the stream: the failed write of a response, or the alarm that the final
// flag's callback raises. When the final flag comes while a write is still in flight,
// both events are queued and the second runs on a state already given to another
// stream — a use after free that kills the server with SIGSEGV or a gRPC "too many
// operations" abort. A stress test of cancelled streams (tests/cancel_stress_test.go)
// crashed it within a dozen rounds of mid-stream cancellations; Triton's own Python
// backend, streaming the same way, crashes it too (TestTritonPythonModelCancelStress).
//
// The backend cannot see the frontend's writes, but a write on a cancelled stream fails
// as soon as the completion-queue thread gets to it. So the final response of a
// streaming request follows its previous response after final_flag_delay_ms at the
// least (it carries its outputs and the flag together, as before), and the final
// response of a request the client cancelled waits cancelledFinalDelay after the
// cancellation was seen. The request's engine state and KV blocks are freed at once
// either way; only the Triton response factory lives on.

// cancelledFinalDelay is how long the final response of a request that Triton reported
// cancelled waits before it is sent: its client is gone, so nothing waits for it, and
// under a burst of cancellations the frontend's thread can lag tens of milliseconds.
const cancelledFinalDelay = 100 * time.Millisecond

// heldFinals holds final responses until their delay passes.
type heldFinals struct {
	// mu guards the fields below.
	mu sync.Mutex
	// cancelled are the requests Triton reported cancelled whose final response has not
	// come yet, with when that was seen.
	cancelled map[uint64]time.Time
	// held are the waiting responses, by request, with their timers.
	held map[uint64]heldItem
	// flushed is set once flush ran: later finals go out at once.
	flushed bool
}

// heldItem is one waiting response.
type heldItem struct {
	// item is the response.
	item sendItem
	// timer sends it when due.
	timer *time.Timer
}

// markCancelled records that Triton reported request id cancelled at now.
func (h *heldFinals) markCancelled(id uint64, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cancelled == nil {
		h.cancelled = map[uint64]time.Time{}
	}
	h.cancelled[id] = now
}

// cancelledAt says when request id was seen cancelled, and forgets it.
func (h *heldFinals) cancelledAt(id uint64) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.cancelled[id]
	delete(h.cancelled, id)
	return at, ok
}

// after hands item to send once d has passed (at once after flush, or when d ≤ 0).
func (h *heldFinals) after(d time.Duration, item sendItem, send func(sendItem)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.flushed || d <= 0 {
		send(item)
		return
	}
	if h.held == nil {
		h.held = map[uint64]heldItem{}
	}
	id := item.id
	h.held[id] = heldItem{item: item, timer: time.AfterFunc(d, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		hi, ok := h.held[id]
		if !ok {
			return // flushed
		}
		delete(h.held, id)
		send(hi.item)
	})}
}

// flush hands every held response to send at once, and every later one goes at once:
// the instance is closing, and its senders must see them before they stop.
func (h *heldFinals) flush(send func(sendItem)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.flushed = true
	for _, hi := range h.held {
		hi.timer.Stop()
		send(hi.item)
	}
	clear(h.held)
	clear(h.cancelled)
}

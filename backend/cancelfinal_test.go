package main

import (
	"sync"
	"testing"
	"time"
)

func TestHeldFinals(t *testing.T) {
	var mu sync.Mutex
	var sent []uint64
	send := func(it sendItem) {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, it.id)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(sent)
	}
	var h heldFinals

	t.Run("a held response goes once its delay has passed, not before", func(t *testing.T) {
		h.after(50*time.Millisecond, sendItem{id: 1, final: true}, send)
		if n := count(); n != 0 {
			t.Fatalf("%d sent at once", n)
		}
		deadline := time.Now().Add(5 * time.Second)
		for count() == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := count(); n != 1 {
			t.Fatalf("%d sent after the delay, want 1", n)
		}
	})
	t.Run("a response with no delay left goes at once", func(t *testing.T) {
		h.after(-time.Millisecond, sendItem{id: 2, final: true}, send)
		if n := count(); n != 2 {
			t.Fatalf("%d sent, want 2", n)
		}
	})
	t.Run("cancellations are remembered until asked once", func(t *testing.T) {
		at := time.Now()
		h.markCancelled(7, at)
		if got, ok := h.cancelledAt(7); !ok || !got.Equal(at) {
			t.Fatalf("cancelledAt = %v, %v", got, ok)
		}
		if _, ok := h.cancelledAt(7); ok {
			t.Fatal("a cancellation was reported twice")
		}
	})
	t.Run("flush sends what is held at once, and everything after it", func(t *testing.T) {
		h.after(time.Hour, sendItem{id: 3, final: true}, send)
		h.after(time.Hour, sendItem{id: 4, final: true}, send)
		h.flush(send)
		if n := count(); n != 4 {
			t.Fatalf("%d sent after flush, want 4", n)
		}
		h.after(time.Hour, sendItem{id: 5, final: true}, send)
		if n := count(); n != 5 {
			t.Fatalf("%d sent after a hold that followed flush, want 5", n)
		}
	})
}

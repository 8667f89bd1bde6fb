package main

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"go.uber.org/zap"
)

// heldFromOS is what the Go runtime holds from the OS: all its memory less what it has
// returned.
func heldFromOS() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() - s[1].Value.Uint64()
}

var sink [][]byte

func TestIdleReleaseReturnsABurstsGarbage(t *testing.T) {
	// A burst of requests that each leave 4 MiB of garbage, as a burst of streams leaves
	// buffers and encoded chunks behind.
	h := &idleRelease{log: zap.NewNop(), h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 4<<20)
		for i := range b {
			b[i] = byte(i)
		}
		sink = append(sink, b)
	})}
	before := heldFromOS()
	for range 64 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	}
	sink = nil
	runtime.GC() // garbage now, but still held from the OS
	peak := heldFromOS()
	time.Sleep(idleReleaseAfter + time.Second)
	after := heldFromOS()
	const mib = 1 << 20
	t.Logf("held from the OS: %d MiB before the burst, %d MiB after it and a collection, %d MiB once idle", before/mib, peak/mib, after/mib)
	if peak < before+128*mib {
		t.Fatalf("the burst held only %d MiB more; the test needs it to hold more", (peak-before)/mib)
	}
	if after > before+32*mib {
		t.Errorf("%d MiB still held %v after the last request; want the burst's garbage returned", (after-before)/mib, idleReleaseAfter+time.Second)
	}
}

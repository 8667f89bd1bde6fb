package main

import (
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"go.uber.org/zap"

	"gollm/hostmem"
)

// The server's memory, set as the backend's is (backend/memory.go): a stream holds
// little, but a burst of hundreds of them leaves up to the heap's size in garbage, which
// Go's collector (GOGC=100) lets the heap double into and its scavenger returns to the
// OS only over minutes — 200 concurrent streams left 1.9 GB of RSS on a 96 MB live heap.
// So a soft memory limit (GOMEMLIMIT, else 90% of a container's memory limit), and once
// no request has been in progress for idleReleaseAfter, a collection that returns the
// freed memory to the OS at once.

// cgroupLimitShare is the part of a container's memory limit the heap is held to when
// GOMEMLIMIT is not set.
const cgroupLimitShare = 0.9

// idleReleaseAfter is how long the server must have had no request in progress, after
// having had some, before it returns freed memory to the OS.
const idleReleaseAfter = 2 * time.Second

// configureMemory sets the soft memory limit and logs the runtime's memory settings.
func configureMemory(log *zap.Logger) {
	if env, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		log.Info("Go memory settings", zap.String("GOMEMLIMIT", env))
		return
	}
	if limit, file := hostmem.CgroupLimit(); limit > 0 {
		soft := int64(float64(limit) * cgroupLimitShare)
		debug.SetMemoryLimit(soft)
		log.Info("Go memory settings: soft limit 90% of the container's memory limit (set GOMEMLIMIT to choose another, or off)",
			zap.String("cgroup", file), zap.String("soft_limit", hostmem.GiB(soft)))
		return
	}
	log.Info("Go memory settings: no soft limit (no GOMEMLIMIT, no container memory limit)")
}

// idleRelease counts the requests in progress through h and returns freed memory to the
// OS once none has been for idleReleaseAfter.
type idleRelease struct {
	// h serves the requests.
	h http.Handler
	// log receives the releases, at debug level.
	log *zap.Logger
	// mu guards the fields below.
	mu sync.Mutex
	// inProgress counts the requests being served.
	inProgress int
	// dirty says requests ran since the last release.
	dirty bool
	// timer fires idleReleaseAfter after the count last fell to 0; nil before.
	timer *time.Timer
}

// ServeHTTP serves r, counting it.
func (ir *idleRelease) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ir.mu.Lock()
	ir.inProgress++
	ir.dirty = true
	if ir.timer != nil {
		ir.timer.Stop()
	}
	ir.mu.Unlock()
	defer ir.done()
	ir.h.ServeHTTP(w, r)
}

// done counts a request that ended.
func (ir *idleRelease) done() {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	ir.inProgress--
	if ir.inProgress > 0 {
		return
	}
	if ir.timer == nil {
		ir.timer = time.AfterFunc(idleReleaseAfter, ir.release)
		return
	}
	ir.timer.Reset(idleReleaseAfter)
}

// release returns freed memory to the OS if the server is still idle.
func (ir *idleRelease) release() {
	ir.mu.Lock()
	if ir.inProgress > 0 || !ir.dirty {
		ir.mu.Unlock()
		return
	}
	ir.dirty = false
	ir.mu.Unlock()
	start := time.Now()
	debug.FreeOSMemory()
	ir.log.Debug("returned freed memory to the OS, once idle", zap.Duration("took", time.Since(start)))
}

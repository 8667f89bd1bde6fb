package main

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"gollm/hostmem"
)

// The Go runtime's memory, set deliberately (issue 11). The backend's heap holds large
// long-lived blocks (float32 weights, the CPU engine's KV pool, which counts as live
// whether or not it has been touched), and with GOGC=100 the collector lets the heap
// grow to twice what is live before it collects: a model with a 512 MiB KV pool can
// carry half a gigabyte of garbage. What a failed load or an unloaded model built is
// garbage that nothing allocates after, so no collection comes for it, and freed pages
// go back to the OS only slowly. So:
//
//   - a soft memory limit: GOMEMLIMIT when the tritonserver process has it (the Go
//     runtime reads it when the library loads; "off" for none); otherwise, in a
//     container with a memory limit (cgroup v2 memory.max, or v1
//     memory.limit_in_bytes), 90% of that limit, so that the collector works harder
//     before the container is killed instead of after;
//   - after a failed model or instance load, after a model is unloaded, and once no
//     request has been in flight for idleReleaseAfter, a collection that returns the
//     freed memory to the OS at once (debug.FreeOSMemory).

// cgroupLimitShare is the part of a container's memory limit the Go heap is held to
// when GOMEMLIMIT is not set: the rest is tritonserver's own memory and the page cache
// of the memory-mapped checkpoint, which the cgroup counts too.
const cgroupLimitShare = 0.9

// configureMemory sets the soft memory limit (see above) and logs the runtime's memory
// settings.
func configureMemory(log *zap.Logger) {
	gogc := os.Getenv("GOGC")
	if gogc == "" {
		gogc = "100"
	}
	if env, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		log.Info("Go memory settings", zap.String("GOMEMLIMIT", env), zap.String("soft_limit", limitString(debug.SetMemoryLimit(-1))),
			zap.String("GOGC", gogc))
		return
	}
	if limit, file := hostmem.CgroupLimit(); limit > 0 {
		soft := int64(float64(limit) * cgroupLimitShare)
		debug.SetMemoryLimit(soft)
		log.Info("Go memory settings: soft limit 90% of the container's memory limit (set GOMEMLIMIT to choose another, or off)",
			zap.String("cgroup", file), zap.String("container_limit", limitString(limit)), zap.String("soft_limit", limitString(soft)),
			zap.String("GOGC", gogc))
		return
	}
	log.Info("Go memory settings: no soft limit (no GOMEMLIMIT, no container memory limit); set GOMEMLIMIT to bound the heap",
		zap.String("GOGC", gogc))
}

// limitString writes a byte count for the log: MiB, or "none" for no limit.
func limitString(b int64) string {
	if b <= 0 || b == math.MaxInt64 {
		return "none"
	}
	return strconv.FormatInt(b>>20, 10) + " MiB"
}

// releaseMemory collects now and returns the freed memory to the OS: after a failed
// load or an unload, whose garbage no later allocation would collect. It costs one
// collection, in a load or unload that took longer.
func releaseMemory(log *zap.Logger, why string) {
	start := time.Now()
	debug.FreeOSMemory()
	if ce := log.Check(zap.DebugLevel, "returned freed memory to the OS"); ce != nil {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		ce.Write(zap.String("after", why), zap.Duration("took", time.Since(start)),
			zap.Uint64("heap_in_use_mib", ms.HeapInuse>>20), zap.Uint64("heap_released_mib", ms.HeapReleased>>20),
			zap.Uint64("sys_mib", ms.Sys>>20))
	}
}

// idleReleaseAfter is how long the backend must have had no request in flight, after
// having had some, before it returns freed memory to the OS: a burst of requests leaves
// up to the heap's size in garbage, which an idle server would otherwise keep for
// minutes (until the runtime's forced collection every two minutes and the scavenger).
const idleReleaseAfter = 2 * time.Second

// idle counts the requests in flight in all instances and returns freed memory once
// none has been for idleReleaseAfter.
var idle struct {
	// mu guards the fields below.
	mu sync.Mutex
	// inflight counts requests from their acceptance to their final response.
	inflight int
	// dirty says requests ran since the last release.
	dirty bool
	// timer fires idleReleaseAfter after the count last fell to 0; nil before.
	timer *time.Timer
}

// requestStarted counts a request accepted into an instance.
func requestStarted() {
	idle.mu.Lock()
	defer idle.mu.Unlock()
	idle.inflight++
	idle.dirty = true
	if idle.timer != nil {
		idle.timer.Stop()
	}
}

// requestEnded counts a request that got its final response.
func requestEnded() {
	idle.mu.Lock()
	defer idle.mu.Unlock()
	idle.inflight--
	if idle.inflight > 0 || !idle.dirty {
		return
	}
	if idle.timer == nil {
		idle.timer = time.AfterFunc(idleReleaseAfter, releaseWhenIdle)
		return
	}
	idle.timer.Reset(idleReleaseAfter)
}

// releaseWhenIdle returns freed memory if the backend is still idle.
func releaseWhenIdle() {
	idle.mu.Lock()
	if idle.inflight > 0 || !idle.dirty {
		idle.mu.Unlock()
		return
	}
	idle.dirty = false
	idle.mu.Unlock()
	if log := currentLogger(); log != nil {
		releaseMemory(log, "requests, once idle")
	}
}

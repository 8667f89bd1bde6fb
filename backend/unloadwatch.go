package main

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// Why an instance watches for its model's unload while it is idle (issue 32, finding 9):
//
// TRITONBACKEND_ModelInstanceFinalize comes only once nothing holds the model. After a
// request that Triton's core refused on a gRPC stream the client then cancelled,
// tritonserver 2.51's frontend keeps that request's state, and with it the model, alive
// for good (README, Known limits): an unload never finishes, the model stays UNLOADING,
// and the instance would keep its engine — the KV pool, 512 MiB for the demo model — while
// a load of the same model makes a new one beside it, cycle after cycle. The departure
// watch of the stop poll (shutdown.go) sees an unload only while requests are in flight;
// here none are.
//
// So each instance asks Triton every unloadCheck, and at once when a model of the same
// name and version starts to load, whether its model is still served. Once it has been
// ready and is not any more (its unload has begun, or the server is stopping), the
// instance refuses new requests, lets those in flight end as the stop poll ends them, and
// as soon as it is idle frees its engine; when every instance of the model has, the
// model's reference to the weights goes too. Finalize, if it ever comes, frees the rest.

// unloadCheck is how often an instance asks whether its model is still served: two
// cheap calls into Triton.
const unloadCheck = 250 * time.Millisecond

// unloadWatch is an instance's watch for its model's unload.
type unloadWatch struct {
	// mu serializes checks and guards the fields below.
	mu sync.Mutex
	// seenReady is set once Triton reported the model ready.
	seenReady bool
	// freed is set once the engine was freed (or the instance is closing).
	freed bool
	// stop ends the watcher goroutine; exited is closed when it has.
	stop, exited chan struct{}
	// stopOnce guards stop.
	stopOnce sync.Once
}

// live are the instances whose engines may still be freed early, for the check a model
// of the same name and version makes when it starts to load.
var live struct {
	mu  sync.Mutex
	set map[*instance]struct{}
}

// startWatch starts the instance's unload watcher.
func (in *instance) startWatch() {
	in.watch.stop, in.watch.exited = make(chan struct{}), make(chan struct{})
	live.mu.Lock()
	if live.set == nil {
		live.set = map[*instance]struct{}{}
	}
	live.set[in] = struct{}{}
	live.mu.Unlock()
	go func() {
		defer close(in.watch.exited)
		t := time.NewTicker(unloadCheck)
		defer t.Stop()
		for {
			select {
			case <-in.watch.stop:
				return
			case <-t.C:
				if in.checkUnload() {
					return
				}
			}
		}
	}()
}

// stopWatch stops the watcher (at finalize) and waits for it.
func (in *instance) stopWatch() {
	if in.watch.stop == nil {
		return
	}
	in.watch.stopOnce.Do(func() { close(in.watch.stop) })
	<-in.watch.exited
	in.watch.mu.Lock()
	in.watch.freed = true
	in.watch.mu.Unlock()
	forgetLive(in)
}

// forgetLive takes an instance out of live.
func forgetLive(in *instance) {
	live.mu.Lock()
	delete(live.set, in)
	live.mu.Unlock()
}

// checkUnloads makes the instances of model name, version check now: a model of that
// name and version is starting to load, which it does beside one whose unload has begun
// (which then reads not ready), or in the background of one still served (which reads
// ready and goes on).
func checkUnloads(name string, version uint64) {
	live.mu.Lock()
	var ins []*instance
	for in := range live.set {
		if in.ms.cfg.Name == name && in.ms.version == version {
			ins = append(ins, in)
		}
	}
	live.mu.Unlock()
	for _, in := range ins {
		in.checkUnload()
	}
}

// checkUnload asks whether the instance's model is still served and frees the engine
// once it is not and the instance is idle. It reports whether the watch is over.
func (in *instance) checkUnload() bool {
	w := &in.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.freed {
		return true
	}
	if in.away.left() == nil {
		err := in.away.probe()
		if err == nil {
			w.seenReady = true
			return false
		}
		if !w.seenReady {
			return false // still loading
		}
		in.away.mark(err)
	}
	if !in.goneIfIdle() {
		// The stop poll ends them (after shutdown_grace_secs); then the engine goes.
		return false
	}
	w.freed = true
	forgetLive(in)
	in.log.Info("the model's unload has begun and the instance is idle: its engine and KV pool are freed now, before Triton finalizes it")
	if err := in.stopEngine(); err != nil {
		in.log.Warn("free the engine", zap.Error(err))
	}
	in.ms.engineFreed()
	releaseMemory(in.log, "an instance freed at its model's unload")
	return true
}

// goneIfIdle marks the engine gone if the instance has no request queued or in flight,
// and says whether it did: from then on accept refuses what it has not queued.
func (in *instance) goneIfIdle() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.inflight) > 0 || len(in.queue) > 0 {
		return false
	}
	in.engineGone = true
	return true
}

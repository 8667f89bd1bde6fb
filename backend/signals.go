package main

import (
	"encoding/json"
	"time"

	"go.uber.org/zap"

	"gollm/batchmanager"
	"gollm/bridge/triton"
)

// The batch manager's other callbacks into an instance: stop and end signals, iteration
// statistics, and the engine's failure.

// pollStop is the batch manager's PollStopSignal: the requests whose client cancelled
// (one crossing into Triton for all of them) or that a stop request named.
func (in *instance) pollStop() map[uint64]struct{} {
	var stop map[uint64]struct{}
	add := func(id uint64) {
		if stop == nil {
			stop = map[uint64]struct{}{}
		}
		stop[id] = struct{}{}
	}
	in.mu.Lock()
	busy := len(in.inflight) > 0
	in.mu.Unlock()
	// Asked outside the lock: Execute and the senders need not wait for Triton's answer.
	ending := in.away.due(time.Now(), busy)
	in.mu.Lock()
	// The lock is held across the Triton call: the sender deletes a factory only after
	// taking its request out of inflight under this lock.
	defer in.mu.Unlock()
	if ending != nil {
		// Requests the manager has not taken yet end here, without an engine step.
		for _, r := range in.queue {
			if f := in.inflight[r.ID]; f != nil {
				f.departing.Store(true)
			}
			in.sendResponse(r.ID, batchmanager.Result{}, true, ending.err)
		}
		clear(in.queue)
		in.queue = in.queue[:0]
	}
	in.pollIDs, in.pollFactories = in.pollIDs[:0], in.pollFactories[:0]
	for id, f := range in.inflight {
		if ending != nil {
			f.departing.Store(true)
			add(id)
			continue
		}
		if f.stop.Load() || f.cancelSeen {
			// A stop request ends it with a normal final response (pollEnd); a
			// cancelled one is ending (its final response may be held a moment).
			continue
		}
		in.pollIDs = append(in.pollIDs, id)
		in.pollFactories = append(in.pollFactories, f.factory)
	}
	if len(in.pollFactories) == 0 {
		return stop
	}
	if cap(in.pollCancelled) < len(in.pollFactories) {
		in.pollCancelled = make([]bool, len(in.pollFactories), 2*len(in.pollFactories))
	}
	in.pollCancelled = in.pollCancelled[:len(in.pollFactories)]
	if err := triton.Cancelled(in.pollFactories, in.pollCancelled); err != nil {
		in.log.Error("poll cancellation", zap.Error(err))
		return stop
	}
	now := time.Now()
	for i, c := range in.pollCancelled {
		if c {
			id := in.pollIDs[i]
			in.inflight[id].cancelSeen = true
			in.heldFinals.markCancelled(id, now)
			add(id)
		}
	}
	return stop
}

// pollEnd is the batch manager's PollEndSignal: the requests a stop request named,
// which end as TensorRT-LLM's do, with a normal final response carrying what they
// generated.
func (in *instance) pollEnd() map[uint64]struct{} {
	in.mu.Lock()
	defer in.mu.Unlock()
	var ids map[uint64]struct{}
	for id, f := range in.inflight {
		if f.stop.Load() {
			if ids == nil {
				ids = map[uint64]struct{}{}
			}
			ids[id] = struct{}{}
		}
	}
	return ids
}

// iterationStats is the batch manager's IterationStats: it logs the stats as JSON at
// verbose level and updates the metrics. The requests still in the backend's queue
// count as queued.
func (in *instance) iterationStats(s batchmanager.Stats) {
	in.trace.add('I', s.Time, time.Now(), s.ScheduledRequests, s.TotalContextTokens, s.EngineTime)
	if ce := in.log.Check(zap.DebugLevel, "batch manager stats"); ce != nil {
		b, err := s.MarshalJSON()
		if err != nil {
			in.log.Error("encoding stats", zap.Error(err))
		} else {
			ce.Write(zap.Any("stats", json.RawMessage(b)))
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	v := statsValues(s, len(in.queue))
	if in.broken.Load() != nil {
		// The iteration whose step broke the engine reports after EngineFailed.
		v[metricInstanceReady] = 0
	}
	in.metrics.observe(v)
}

// engineFailed is the batch manager's EngineFailed: the engine failed a step and cannot
// recover. The instance reports itself not ready — an error in the log, 0 on
// gollm_instance_ready — and refuses every request from now on; the model must be
// reloaded (or the server restarted) to serve again.
func (in *instance) engineFailed(err error) {
	in.broken.Store(&err)
	in.log.Error("instance not ready: its engine failed and cannot recover; every request is refused until the model is reloaded",
		zap.Error(err))
	in.mu.Lock()
	defer in.mu.Unlock()
	in.metrics.notReady()
}

// notReady is the error of a request refused by a broken instance.
func (in *instance) notReady(err error) error {
	return triton.Errorf(triton.CodeUnavailable, "instance %s of model %q is not ready: %v", in.name, in.ms.cfg.Name, err)
}

package main

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"gollm/bridge/triton"
)

// Why the backend watches for the server stopping and the model unloading:
//
// The backend releases each request at once and keeps only its response factory, and
// a response factory holds a reference to Triton's model. So while a request is in
// flight Triton cannot destroy the model, and TRITONBACKEND_ModelInstanceFinalize —
// where the batch manager used to end what was left — never comes first. At shutdown
// tritonserver counts "0 in-flight inferences" (the requests were released), unloads
// the models, then waits for them to go; with streams longer than --exit-timeout-secs
// it gives up and calls exit(1) while the backend's goroutines still generate and send
// into objects exit is destroying (heap corruption, aborts, hangs).
//
// So the batch manager's stop poll asks Triton, while requests are in flight, whether
// the server is stopping or the model's unload has begun. From then on new requests
// are refused, and once shutdown_grace_secs has passed every request in flight ends
// with an UNAVAILABLE error response, flagged final; its factory goes with it, the
// model's last reference drops, and Triton finalizes the instance, which stops the
// batch manager and the senders before it returns.

// departureCheck is how often, at most, the manager goroutine asks Triton while
// requests are in flight: two cheap calls, so a stop is seen within an iteration or
// two without costing every iteration a crossing.
const departureCheck = 50 * time.Millisecond

// departure watches whether Triton is taking an instance's model away.
type departure struct {
	// probe returns why the model is going away, nil while Triton serves it
	// (modelProbe; tests give their own).
	probe func() error
	// grace is how long requests in flight may go on once the departure is seen.
	grace time.Duration
	// log receives the departure, once.
	log *zap.Logger
	// next is when the manager goroutine may ask Triton again (its goroutine only).
	next time.Time
	// seen is set once the server is stopping or the model unloading; read by Execute
	// and the senders.
	seen atomic.Pointer[leaving]
}

// leaving is a departure once seen.
type leaving struct {
	// at is when it was seen.
	at time.Time
	// err ends the requests in flight and refuses new ones.
	err error
}

// newDeparture watches the model of instance ti.
func newDeparture(ti triton.ModelInstance, ms *modelState, log *zap.Logger) (*departure, error) {
	m, err := ti.Model()
	if err != nil {
		return nil, err
	}
	srv, err := m.Server()
	if err != nil {
		return nil, err
	}
	mp := modelProbe{server: srv, model: ms.cfg.Name, version: ms.version, log: log}
	return &departure{probe: mp.probe, grace: ms.cfg.ShutdownGrace, log: log}, nil
}

// left returns the departure once seen, nil before.
func (d *departure) left() *leaving { return d.seen.Load() }

// mark records a departure err seen outside the stop poll (unloadwatch.go), unless one
// was seen already.
func (d *departure) mark(err error) {
	if d.seen.CompareAndSwap(nil, &leaving{at: time.Now(), err: err}) {
		d.log.Info("the model is going away", zap.NamedError("reason", err))
	}
}

// due is called from the batch manager's stop poll (its goroutine): it asks Triton, at
// most every departureCheck and only while busy (requests are in flight), whether the
// model is going away, and returns the departure once its grace has run out — the
// requests in flight are to end now — or nil.
func (d *departure) due(now time.Time, busy bool) *leaving {
	l := d.seen.Load()
	if l == nil {
		if !busy || now.Before(d.next) {
			return nil
		}
		d.next = now.Add(departureCheck)
		err := d.probe()
		if err == nil {
			return nil
		}
		l = &leaving{at: now, err: err}
		d.seen.Store(l)
		d.log.Info("ending the requests in flight", zap.NamedError("reason", err), zap.Duration("shutdown_grace", d.grace))
	}
	if now.Sub(l.at) < d.grace {
		return nil
	}
	return l
}

// modelProbe asks Triton about one model.
type modelProbe struct {
	// server is the server the model runs in.
	server triton.Server
	// model and version name what to ask Triton about.
	model string
	// version identifies which of the model's versions to ask about.
	version uint64
	// log receives why a readiness question failed.
	log *zap.Logger
}

// probe returns why the model is going away, or nil while Triton serves it. A model
// with requests in flight was ready when Triton routed them, so "not ready" means its
// unload has begun.
func (p modelProbe) probe() error {
	if p.server.Stopping() {
		return triton.Errorf(triton.CodeUnavailable, "gollm: the server is shutting down; the request was not finished")
	}
	ready, err := p.server.ModelReady(p.model, p.version)
	if err == nil && ready {
		return nil
	}
	if err != nil {
		p.log.Debug("model readiness", zap.Error(err))
	}
	return triton.Errorf(triton.CodeUnavailable, "gollm: model %q version %d is shutting down (unloading); the request was not finished", p.model, p.version)
}

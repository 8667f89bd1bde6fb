package main

import (
	"errors"
	"runtime/metrics"
	"sync"
	"time"

	"go.uber.org/zap"

	"gollm/bridge/triton"
)

// gaugeInterval is how often the process-wide gauges are sampled: Triton's own CPU and
// GPU metrics default to 2 s (--metrics-interval-ms), and a scrape every few seconds
// sees a value at most this old.
const gaugeInterval = time.Second

// runtimeDefs are the Go runtime's gauges: process-wide series without labels, for
// telling a leak in the backend's heap from one in tritonserver (the soak harness,
// bench/soak, samples them beside the process's RSS).
var runtimeDefs = []metricDef{
	{"gollm_go_heap_bytes", triton.MetricGauge,
		"Bytes of Go heap objects in the backend, live and not yet swept"},
	{"gollm_go_heap_live_bytes", triton.MetricGauge,
		"Bytes of the backend's Go heap that were live at the last garbage collection"},
	{"gollm_go_memory_bytes", triton.MetricGauge,
		"Bytes the backend's Go runtime holds from the OS (heap, stacks, metadata), less what it has returned"},
}

// runtimeSamples are the runtime/metrics the gauges are made of.
var runtimeSamples = []string{
	"/memory/classes/heap/objects:bytes",
	"/gc/heap/live:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
}

// readRuntime reads the gauges' values, in runtimeDefs' order.
func readRuntime(s []metrics.Sample) [3]float64 {
	for i, name := range runtimeSamples {
		s[i].Name = name
	}
	metrics.Read(s)
	u := func(i int) float64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return float64(s[i].Value.Uint64())
	}
	return [3]float64{u(0), u(1), u(2) - u(3)}
}

// processGauges are the backend's process-wide series, sampled every gaugeInterval
// from TRITONBACKEND_Initialize to TRITONBACKEND_Finalize by one goroutine.
type processGauges struct {
	// fams and series are the Go runtime's families and their one series each.
	fams   []*triton.MetricFamily
	series []*triton.Metric
	// gpu samples the GPUs the backend's instances run on (gpumetrics.go).
	gpu *gpuGauges
	// quit stops the goroutine; done is closed when it has exited.
	quit, done chan struct{}
	// stopOnce makes stop idempotent.
	stopOnce sync.Once
}

// startProcessGauges registers the families and starts sampling.
func startProcessGauges(log *zap.Logger) (*processGauges, error) {
	g := &processGauges{quit: make(chan struct{}), done: make(chan struct{})}
	for _, d := range runtimeDefs {
		fam, err := triton.NewMetricFamily(d.kind, d.name, d.help)
		if err != nil {
			return nil, errors.Join(err, g.delete())
		}
		g.fams = append(g.fams, fam)
		m, err := fam.NewMetric()
		if err != nil {
			return nil, errors.Join(err, g.delete())
		}
		g.series = append(g.series, m)
	}
	g.gpu = newGPUGauges(log)
	go g.run(log)
	return g, nil
}

// run samples until stop.
func (g *processGauges) run(log *zap.Logger) {
	defer close(g.done)
	samples := make([]metrics.Sample, len(runtimeSamples))
	var batch triton.MetricBatch
	warned := false
	t := time.NewTicker(gaugeInterval)
	defer t.Stop()
	for {
		v := readRuntime(samples)
		for i, m := range g.series {
			batch.Set(m, v[i])
		}
		if err := batch.Flush(); err != nil && !warned {
			warned = true
			log.Warn("updating the Go runtime gauges failed; later failures are not logged", zap.Error(err))
		}
		g.gpu.sample()
		select {
		case <-g.quit:
			return
		case <-t.C:
		}
	}
}

// stop ends the sampling and deletes the series and families.
func (g *processGauges) stop() error {
	if g == nil {
		return nil
	}
	g.stopOnce.Do(func() { close(g.quit) })
	<-g.done
	return g.delete()
}

// delete removes the series and families (the goroutine must not be running).
func (g *processGauges) delete() error {
	errs := []error{g.gpu.close()}
	for _, m := range g.series {
		errs = append(errs, m.Delete())
	}
	for _, f := range g.fams {
		errs = append(errs, f.Delete())
	}
	g.series, g.fams = nil, nil
	return errors.Join(errs...)
}

package main

import (
	"errors"
	"strconv"
	"sync"

	"go.uber.org/zap"

	"gollm/bridge/nvml"
	"gollm/bridge/triton"
	"gollm/engines"
)

// The per-GPU families, labelled gpu (the CUDA ordinal), uuid and name. They are
// registered when the first KIND_GPU instance starts, so a server without one — every
// server without a driver — shows none of them; the NVML ones only where NVML loads.
const (
	gpuMemoryTotal = iota
	gpuMemoryUsed
	gpuUtilization
	gpuPower
	gpuTemperature
	gpuOwnMemory
	numGPUMetrics
)

// gpuMetricDefs are the families, by the constants above.
var gpuMetricDefs = [numGPUMetrics]metricDef{
	gpuMemoryTotal: {"gollm_gpu_memory_total_bytes", triton.MetricGauge, "The GPU's memory (NVML)"},
	gpuMemoryUsed: {"gollm_gpu_memory_used_bytes", triton.MetricGauge,
		"GPU memory in use by every process and the driver (NVML)"},
	gpuUtilization: {"gollm_gpu_utilization", triton.MetricGauge,
		"Share of the last sample period in which a kernel ran on the GPU, 0 to 1 (NVML)"},
	gpuPower:       {"gollm_gpu_power_watts", triton.MetricGauge, "The GPU board's power draw (NVML)"},
	gpuTemperature: {"gollm_gpu_temperature_celsius", triton.MetricGauge, "The GPU's temperature (NVML)"},
	gpuOwnMemory: {"gollm_gpu_gollm_memory_bytes", triton.MetricGauge,
		"GPU memory gollm's engines in this process hold, by use: weights (each model's once), kv, scratch"},
}

// gpuDefs are the GPU families, for the README test.
func gpuDefs() []metricDef { return gpuMetricDefs[:] }

// ownUses are the values of gpuOwnMemory's use label.
var ownUses = [3]string{"weights", "kv", "scratch"}

// gpuUsers are the engines on one GPU: what each model's weights and each instance's KV
// pool and scratch take.
type gpuUsers struct {
	// weights are the weights' bytes by model (one copy per model and GPU).
	weights map[string]int64
	// instances are each instance's model, KV and scratch bytes, by instance name.
	instances map[string]engines.GPUUse
	// models are each instance's model, by instance name.
	models map[string]string
}

// own sums the GPU memory the engines hold: weights, kv, scratch.
func (u *gpuUsers) own() [3]float64 {
	var v [3]float64
	for _, w := range u.weights {
		v[0] += float64(w)
	}
	for _, in := range u.instances {
		v[1] += float64(in.KV)
		v[2] += float64(in.Scratch)
	}
	return v
}

// add records an instance; remove forgets it (and its model's weights with its last).
func (u *gpuUsers) add(model, instance string, use engines.GPUUse) {
	u.weights[model] = use.Weights
	u.instances[instance] = use
	u.models[instance] = model
}

func (u *gpuUsers) remove(instance string) {
	model := u.models[instance]
	delete(u.instances, instance)
	delete(u.models, instance)
	for _, m := range u.models {
		if m == model {
			return
		}
	}
	delete(u.weights, model)
}

// gpuDev is one GPU's series.
type gpuDev struct {
	// use names the device.
	use engines.GPUUse
	// users track the models and instances on the device and the memory each holds.
	users gpuUsers
	// nv is the device in NVML; nil without NVML.
	nv *nvml.Device
	// series are the NVML series, by family (nil without NVML).
	series [gpuOwnMemory]*triton.Metric
	// own are gpuOwnMemory's series, by ownUses.
	own [3]*triton.Metric
	// warned is set once a failed NVML read was logged.
	warned bool
}

// gpuGauges are the per-GPU series of the backend: NVML's readings, sampled with the
// process-wide gauges, and gollm's own share of each GPU.
type gpuGauges struct {
	// log reports NVML's absence and failures.
	log *zap.Logger
	// mu guards the fields below (instances come and go on Triton's threads).
	mu sync.Mutex
	// fams are the families, registered at the first GPU instance.
	fams [numGPUMetrics]*triton.MetricFamily
	// nv is NVML; nil until the first GPU instance, or without NVML.
	nv *nvml.Lib
	// nvTried says NVML was tried.
	nvTried bool
	// devs are the GPUs with instances, by UUID.
	devs map[string]*gpuDev
	// batch applies a sample's updates in one crossing into Triton.
	batch triton.MetricBatch
}

// newGPUGauges returns the GPU gauges, with nothing registered yet.
func newGPUGauges(log *zap.Logger) *gpuGauges {
	return &gpuGauges{log: log, devs: map[string]*gpuDev{}}
}

// attach records a KIND_GPU instance: the first on a GPU adds its series.
func (g *gpuGauges) attach(model, instance string, use engines.GPUUse) {
	if g == nil || use.UUID == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.nvTried {
		g.nvTried = true
		nv, err := nvml.Open("")
		if err != nil {
			g.log.Warn("no gollm_gpu_* NVML metrics: NVML is unavailable; gollm_gpu_gollm_memory_bytes only", zap.Error(err))
		} else {
			g.nv = nv
		}
	}
	d := g.devs[use.UUID]
	if d == nil {
		d = &gpuDev{use: use, users: gpuUsers{weights: map[string]int64{}, instances: map[string]engines.GPUUse{}, models: map[string]string{}}}
		if err := g.addSeries(d); err != nil {
			g.log.Warn("the GPU has no gollm_gpu_* metrics", zap.String("uuid", use.UUID), zap.Error(err))
		}
		g.devs[use.UUID] = d
	}
	d.users.add(model, instance, use)
	g.update(d)
}

// addSeries registers what the families need and adds d's series.
func (g *gpuGauges) addSeries(d *gpuDev) error {
	labels := []triton.Label{{Name: "gpu", Value: strconv.Itoa(d.use.Ordinal)}, {Name: "uuid", Value: d.use.UUID}, {Name: "name", Value: d.use.Name}}
	family := func(id int) (*triton.MetricFamily, error) {
		if g.fams[id] == nil {
			def := gpuMetricDefs[id]
			f, err := triton.NewMetricFamily(def.kind, def.name, def.help)
			if err != nil {
				return nil, err
			}
			g.fams[id] = f
		}
		return g.fams[id], nil
	}
	f, err := family(gpuOwnMemory)
	if err != nil {
		return err
	}
	for i, use := range ownUses {
		if d.own[i], err = f.NewMetric(append(labels[:2:2], triton.Label{Name: "use", Value: use})...); err != nil {
			return err
		}
	}
	if g.nv == nil {
		return nil
	}
	if d.nv, err = g.nv.DeviceByUUID(d.use.UUID); err != nil {
		g.log.Warn("NVML does not know the GPU; no NVML metrics for it", zap.String("uuid", d.use.UUID), zap.Error(err))
		d.nv = nil
		return nil
	}
	for id := range gpuOwnMemory {
		f, err := family(id)
		if err != nil {
			return err
		}
		if d.series[id], err = f.NewMetric(labels...); err != nil {
			return err
		}
	}
	return nil
}

// detach forgets an instance: the last on a GPU removes its series.
func (g *gpuGauges) detach(instance, uuid string) {
	if g == nil || uuid == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	d := g.devs[uuid]
	if d == nil {
		return
	}
	d.users.remove(instance)
	if len(d.users.instances) > 0 {
		g.update(d)
		return
	}
	if err := d.deleteSeries(); err != nil {
		g.log.Warn("delete the GPU's metrics", zap.String("uuid", uuid), zap.Error(err))
	}
	delete(g.devs, uuid)
}

// deleteSeries removes d's series.
func (d *gpuDev) deleteSeries() error {
	var errs []error
	for _, m := range append(d.series[:], d.own[:]...) {
		errs = append(errs, m.Delete())
	}
	return errors.Join(errs...)
}

// sample reads every GPU with instances.
func (g *gpuGauges) sample() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, d := range g.devs {
		g.update(d)
	}
}

// update sets d's series (under mu).
func (g *gpuGauges) update(d *gpuDev) {
	for i, v := range d.users.own() {
		g.batch.Set(d.own[i], v)
	}
	if d.nv != nil {
		r, err := d.nv.Read()
		if err != nil && !d.warned {
			d.warned = true
			g.log.Warn("reading the GPU with NVML failed; later failures are not logged", zap.String("uuid", d.use.UUID), zap.Error(err))
		}
		if r.MemoryTotal > 0 {
			g.batch.Set(d.series[gpuMemoryTotal], float64(r.MemoryTotal))
			g.batch.Set(d.series[gpuMemoryUsed], float64(r.MemoryUsed))
		}
		if r.HasUtilization {
			g.batch.Set(d.series[gpuUtilization], r.Utilization)
		}
		if r.HasPower {
			g.batch.Set(d.series[gpuPower], r.PowerWatts)
		}
		if r.HasTemperature {
			g.batch.Set(d.series[gpuTemperature], r.TemperatureC)
		}
	}
	if err := g.batch.Flush(); err != nil && !d.warned {
		d.warned = true
		g.log.Warn("updating the GPU metrics failed; later failures are not logged", zap.Error(err))
	}
}

// close deletes every series and family and shuts NVML down.
func (g *gpuGauges) close() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	for uuid, d := range g.devs {
		errs = append(errs, d.deleteSeries())
		delete(g.devs, uuid)
	}
	for i, f := range g.fams {
		errs = append(errs, f.Delete())
		g.fams[i] = nil
	}
	if g.nv != nil {
		errs = append(errs, g.nv.Close())
		g.nv, g.nvTried = nil, false
	}
	return errors.Join(errs...)
}

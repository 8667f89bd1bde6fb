package main

import (
	"errors"
	"fmt"
	"strconv"

	"go.uber.org/zap"

	"gollm/batchmanager"
	"gollm/bridge/triton"
)

// metricID names one of the backend's metric families; it indexes metricDefs and
// metricValues.
type metricID int

// The backend's metrics. Every series is labelled model, version and instance: each
// instance has its own batch manager and KV pool.
const (
	metricRequestsActive metricID = iota
	metricRequestsPaused
	metricRequestsQueued
	metricKVBlocksUsed
	metricKVBlocksFree
	metricKVBlocksMax
	metricTokensPerIteration
	metricIterations
	metricKVBlocksReused
	metricInstanceReady
	metricSpecDraftTokens
	metricSpecAcceptedTokens
	metricSpecSteps
	metricSpecAcceptanceRate
	metricSpecAcceptedLength
	metricSequencesPerIterationMax
	metricSpecHeldOff
	metricSpecHeldOffSteps
	numMetrics
)

// metricDef describes one metric family.
type metricDef struct {
	// name is what Prometheus scrapes (gollm_…).
	name string
	// kind is gauge or counter.
	kind triton.MetricKind
	// help becomes the family's # HELP line on /metrics.
	help string
}

// metricDefs are the families, by metricID. README.md documents them; a test checks
// that it names each one.
var metricDefs = [numMetrics]metricDef{
	metricRequestsActive: {"gollm_requests_active", triton.MetricGauge,
		"Requests admitted by the batch manager and not finished (paused ones included)"},
	metricRequestsPaused: {"gollm_requests_paused", triton.MetricGauge,
		"Requests paused by max_utilization, waiting to recompute their context"},
	metricRequestsQueued: {"gollm_requests_queued", triton.MetricGauge,
		"Requests accepted but not admitted yet"},
	metricKVBlocksUsed: {"gollm_kv_blocks_used", triton.MetricGauge,
		"KV cache blocks held by requests"},
	metricKVBlocksFree: {"gollm_kv_blocks_free", triton.MetricGauge,
		"KV cache blocks free (reusable prefix blocks included)"},
	metricKVBlocksMax: {"gollm_kv_blocks_max", triton.MetricGauge,
		"KV cache blocks in the pool"},
	metricTokensPerIteration: {"gollm_tokens_per_iteration", triton.MetricGauge,
		"Tokens the last iteration ran through the model (context plus generation); 0 when idle"},
	metricIterations: {"gollm_iterations", triton.MetricCounter,
		"Iterations of the batch manager that ran the engine"},
	metricKVBlocksReused: {"gollm_kv_blocks_reused", triton.MetricCounter,
		"KV cache blocks reused from shared prompt prefixes instead of computed"},
	metricInstanceReady: {"gollm_instance_ready", triton.MetricGauge,
		"1 while the instance serves; 0 once its engine failed and could not recover (it refuses every request)"},
	metricSpecDraftTokens: {"gollm_speculative_draft_tokens", triton.MetricCounter,
		"Tokens proposed by speculative decoding"},
	metricSpecAcceptedTokens: {"gollm_speculative_accepted_tokens", triton.MetricCounter,
		"Proposed tokens the model accepted"},
	metricSpecSteps: {"gollm_speculative_steps", triton.MetricCounter,
		"Steps of a sequence that verified proposed tokens"},
	metricSpecAcceptanceRate: {"gollm_speculative_acceptance_rate", triton.MetricGauge,
		"Share of the proposed tokens accepted since the instance started"},
	metricSpecAcceptedLength: {"gollm_speculative_mean_accepted_length", triton.MetricGauge,
		"Tokens a sequence gains per step that verifies proposals (accepted ones plus one), since the instance started"},
	metricSequencesPerIterationMax: {"gollm_sequences_per_iteration_max", triton.MetricGauge,
		"The most sequences one iteration has run since the instance started (at most max_batch_size)"},
	metricSpecHeldOff: {"gollm_speculative_held_off", triton.MetricGauge,
		"1 when the last iteration ran without proposals because speculation does not pay at its batch size (speculative_adaptive); else 0"},
	metricSpecHeldOffSteps: {"gollm_speculative_held_off_steps", triton.MetricCounter,
		"Iterations run without proposals, where requests could have speculated, because speculation did not pay at their batch size"},
}

// metricValues are the values of one instance's series. Counters hold the batch
// manager's running totals; the series are incremented by the difference.
type metricValues [numMetrics]float64

// statsValues maps an iteration's stats to metric values. queued is the number of
// requests the backend holds that the manager has not taken yet; prev are the values
// shown before (the running maximum goes on from them).
func statsValues(s batchmanager.Stats, queued int, prev metricValues) metricValues {
	var v metricValues
	v[metricSequencesPerIterationMax] = max(prev[metricSequencesPerIterationMax], float64(s.ScheduledRequests))
	v[metricRequestsActive] = float64(s.ActiveRequestCount)
	v[metricRequestsPaused] = float64(s.PausedRequests)
	v[metricRequestsQueued] = float64(s.WaitingRequests + queued)
	v[metricKVBlocksUsed] = float64(s.UsedKVCacheBlocks)
	v[metricKVBlocksFree] = float64(s.FreeKVCacheBlocks)
	v[metricKVBlocksMax] = float64(s.MaxKVCacheBlocks)
	// A generation step runs one token through the model, and its proposals
	// (speculative decoding) one each (TotalGenerationTokens counts sampled tokens, which
	// includes the last chunk of each prompt). The manager
	// reports no idle iterations, so once nothing is left the gauge drops to 0 instead
	// of showing the last iteration forever.
	if s.ActiveRequestCount > 0 || s.WaitingRequests+queued > 0 {
		v[metricTokensPerIteration] = float64(s.TotalContextTokens + s.GenerationRequests + s.DraftTokens)
	}
	v[metricIterations] = float64(s.IterationCounter)
	v[metricKVBlocksReused] = float64(s.ReusedKVCacheBlocks)
	// An iteration ran, so the engine serves: a broken one never reports again.
	v[metricInstanceReady] = 1
	v[metricSpecDraftTokens] = float64(s.DraftTokensTotal)
	v[metricSpecAcceptedTokens] = float64(s.AcceptedDraftTokensTotal)
	v[metricSpecSteps] = float64(s.SpeculativeStepsTotal)
	if s.DraftTokensTotal > 0 {
		v[metricSpecAcceptanceRate] = float64(s.AcceptedDraftTokensTotal) / float64(s.DraftTokensTotal)
	}
	if s.SpeculationHeldOff {
		v[metricSpecHeldOff] = 1
	}
	v[metricSpecHeldOffSteps] = float64(s.SpeculationHeldOffTotal)
	if s.SpeculativeStepsTotal > 0 {
		v[metricSpecAcceptedLength] = float64(s.AcceptedDraftTokensTotal+s.SpeculativeStepsTotal) / float64(s.SpeculativeStepsTotal)
	}
	return v
}

// initialValues are the values of an instance before its first request: an empty pool
// of kvBlocks blocks.
func initialValues(kvBlocks int) metricValues {
	var v metricValues
	v[metricKVBlocksFree] = float64(kvBlocks)
	v[metricKVBlocksMax] = float64(kvBlocks)
	v[metricInstanceReady] = 1
	return v
}

// idleValues are the values once no request is left: prev with no request, every
// block free, no tokens, the counters as they were.
func idleValues(prev metricValues) metricValues {
	v := prev
	v[metricRequestsActive] = 0
	v[metricRequestsPaused] = 0
	v[metricRequestsQueued] = 0
	v[metricKVBlocksUsed] = 0
	v[metricKVBlocksFree] = prev[metricKVBlocksMax]
	v[metricTokensPerIteration] = 0
	return v
}

// metricUpdate is one change to a series.
type metricUpdate struct {
	// id picks the family, hence the series, to change.
	id metricID
	// value is the gauge's new value, or the counter's increment.
	value float64
	// add says value is an increment (counters).
	add bool
}

// metricUpdates appends to dst the changes that take the series from prev to next:
// each gauge whose value changed is set, each counter that grew is incremented. A
// counter total that went down (the manager started a fresh pool after a failure)
// counts from 0 again.
func metricUpdates(dst []metricUpdate, prev, next metricValues) []metricUpdate {
	for id := range numMetrics {
		if next[id] == prev[id] {
			continue
		}
		if metricDefs[id].kind == triton.MetricGauge {
			dst = append(dst, metricUpdate{id: id, value: next[id]})
			continue
		}
		delta := next[id] - prev[id]
		if delta < 0 {
			delta = next[id]
		}
		if delta > 0 {
			dst = append(dst, metricUpdate{id: id, value: delta, add: true})
		}
	}
	return dst
}

// metricFamilies are the backend's families, registered once in TRITONBACKEND_Initialize
// and deleted in TRITONBACKEND_Finalize, so models and instances can come and go.
type metricFamilies struct {
	// fams are indexed by metricID, as metricDefs.
	fams [numMetrics]*triton.MetricFamily
}

// newMetricFamilies registers the families.
func newMetricFamilies() (*metricFamilies, error) {
	f := &metricFamilies{}
	for id, d := range metricDefs {
		fam, err := triton.NewMetricFamily(d.kind, d.name, d.help)
		if err != nil {
			return nil, errors.Join(err, f.delete())
		}
		f.fams[id] = fam
	}
	return f, nil
}

// delete frees the families; their metrics must be gone.
func (f *metricFamilies) delete() error {
	var errs []error
	for _, fam := range f.fams {
		if fam != nil {
			errs = append(errs, fam.Delete())
		}
	}
	return errors.Join(errs...)
}

// instanceMetrics are one instance's series. Its methods must be called under the
// instance's mu (they compare with and update last); a nil *instanceMetrics does
// nothing, for a server whose metrics are off.
type instanceMetrics struct {
	// series are indexed by metricID, as metricDefs.
	series [numMetrics]*triton.Metric
	// last holds what the series show, so that only changes cross into Triton.
	last metricValues
	// batch applies an observation's updates in one crossing into Triton.
	batch triton.MetricBatch
	// scratch is metricUpdates' buffer.
	scratch []metricUpdate
	// log reports failures.
	log *zap.Logger
	// warned is set once a failed update has been logged: no flood per iteration.
	warned bool
}

// newInstanceMetrics adds an instance's series to the families and shows initial.
func newInstanceMetrics(f *metricFamilies, model string, version uint64, instance string, initial metricValues, log *zap.Logger) (*instanceMetrics, error) {
	labels := []triton.Label{
		{Name: "model", Value: model},
		{Name: "version", Value: strconv.FormatUint(version, 10)},
		{Name: "instance", Value: instance},
	}
	im := &instanceMetrics{log: log}
	for id, fam := range f.fams {
		m, err := fam.NewMetric(labels...)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("instance %s: %w", instance, err), im.close())
		}
		im.series[id] = m
	}
	im.observe(initial)
	return im, nil
}

// observe makes the series show next, crossing into Triton only when something
// changed.
func (im *instanceMetrics) observe(next metricValues) {
	if im == nil {
		return
	}
	im.scratch = metricUpdates(im.scratch[:0], im.last, next)
	im.last = next
	if len(im.scratch) == 0 {
		return
	}
	for _, u := range im.scratch {
		if u.add {
			im.batch.Increment(im.series[u.id], u.value)
		} else {
			im.batch.Set(im.series[u.id], u.value)
		}
	}
	if err := im.batch.Flush(); err != nil && !im.warned {
		im.warned = true
		im.log.Warn("updating the metrics failed; later failures are not logged", zap.Error(err))
	}
}

// idle shows the values of an instance with no request left.
func (im *instanceMetrics) idle() {
	if im == nil {
		return
	}
	im.observe(idleValues(im.last))
}

// notReady shows an instance whose engine cannot recover: idle (the manager has ended
// every request) and not ready.
func (im *instanceMetrics) notReady() {
	if im == nil {
		return
	}
	v := idleValues(im.last)
	v[metricInstanceReady] = 0
	im.observe(v)
}

// close removes the instance's series from /metrics.
func (im *instanceMetrics) close() error {
	if im == nil {
		return nil
	}
	var errs []error
	for i, m := range im.series {
		if m != nil {
			errs = append(errs, m.Delete())
			im.series[i] = nil
		}
	}
	return errors.Join(errs...)
}

package triton

/*
#include <stdlib.h>
#include "api.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// MetricKind is TRITONSERVER_MetricKind.
type MetricKind int32

// The values of TRITONSERVER_MetricKind that gollm uses.
const (
	// MetricCounter only goes up (Increment by a non-negative amount).
	MetricCounter MetricKind = 0
	// MetricGauge is set to any value.
	MetricGauge MetricKind = 1
)

// String returns the kind's Prometheus name.
func (k MetricKind) String() string {
	switch k {
	case MetricCounter:
		return "counter"
	case MetricGauge:
		return "gauge"
	}
	return fmt.Sprintf("MetricKind(%d)", int32(k))
}

// MetricFamily is a TRITONSERVER_MetricFamily: one Prometheus metric name on Triton's
// /metrics page, whose series are its Metrics. Delete it after all of its metrics.
type MetricFamily struct {
	// p is Triton's object.
	p *C.TRITONSERVER_MetricFamily
	// kind decides whether the family's metrics are set or added to.
	kind MetricKind
	// name is kept for Name and error messages.
	name string
}

// NewMetricFamily registers a metric family. Triton's registry never forgets a name:
// registering the same name and kind again (after Delete, or twice) gives the same
// Prometheus family, so a backend loaded again can do it without error.
func NewMetricFamily(kind MetricKind, name, description string) (*MetricFamily, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	cdesc := C.CString(description)
	defer C.free(unsafe.Pointer(cdesc))
	var p *C.TRITONSERVER_MetricFamily
	if err := goError(C.gt_TRITONSERVER_MetricFamilyNew(&p, C.int(kind), cname, cdesc)); err != nil {
		return nil, fmt.Errorf("metric family %s (%v): %w", name, kind, err)
	}
	return &MetricFamily{p: p, kind: kind, name: name}, nil
}

// Name returns the family's name.
func (f *MetricFamily) Name() string { return f.name }

// Kind returns the family's kind.
func (f *MetricFamily) Kind() MetricKind { return f.kind }

// Delete frees the family; its metrics must have been deleted before. Later calls do
// nothing.
func (f *MetricFamily) Delete() error {
	if f == nil || f.p == nil {
		return nil
	}
	p := f.p
	f.p = nil
	if err := goError(C.gt_TRITONSERVER_MetricFamilyDelete(p)); err != nil {
		return fmt.Errorf("delete metric family %s: %w", f.name, err)
	}
	return nil
}

// Label is one Prometheus label of a metric.
type Label struct {
	// Name is the label's name (model, version, instance).
	Name string
	// Value is its value.
	Value string
}

// maxLabels is the most labels gt_metric_new takes.
const maxLabels = 16

// NewMetric adds the series with the given labels to the family; Delete removes it.
// Its value starts at 0.
func (f *MetricFamily) NewMetric(labels ...Label) (*Metric, error) {
	if f == nil || f.p == nil {
		return nil, errors.New("new metric: the metric family is deleted")
	}
	if len(labels) > maxLabels {
		return nil, fmt.Errorf("metric %s: %d labels, at most %d", f.name, len(labels), maxLabels)
	}
	// The strings go in C memory: the array of their pointers is passed to C.
	cs := C.malloc(C.size_t(2*len(labels)+1) * C.size_t(unsafe.Sizeof((*C.char)(nil))))
	defer C.free(cs)
	strs := unsafe.Slice((**C.char)(cs), 2*len(labels)+1)
	for i, l := range labels {
		strs[i] = C.CString(l.Name)
		strs[len(labels)+i] = C.CString(l.Value)
	}
	defer func() {
		for _, s := range strs[:2*len(labels)] {
			C.free(unsafe.Pointer(s))
		}
	}()
	var p *C.TRITONSERVER_Metric
	err := goError(C.gt_metric_new(f.p, &strs[0], &strs[len(labels)], C.size_t(len(labels)), &p))
	if err != nil {
		return nil, fmt.Errorf("metric %s%s: %w", f.name, formatLabels(labels), err)
	}
	return &Metric{p: p, kind: f.kind}, nil
}

// formatLabels writes labels as Prometheus does: {a="x",b="y"}.
func formatLabels(labels []Label) string {
	if len(labels) == 0 {
		return ""
	}
	s := "{"
	for i, l := range labels {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf("%s=%q", l.Name, l.Value)
	}
	return s + "}"
}

// Metric is a TRITONSERVER_Metric: one labelled series of a family.
type Metric struct {
	// p is Triton's object; nil once deleted.
	p *C.TRITONSERVER_Metric
	// kind is its family's kind.
	kind MetricKind
}

// Set sets a gauge.
func (m *Metric) Set(v float64) error {
	if err := goError(C.gt_TRITONSERVER_MetricSet(m.p, C.double(v))); err != nil {
		return fmt.Errorf("set metric: %w", err)
	}
	return nil
}

// Increment adds v to the metric (v ≥ 0 for a counter).
func (m *Metric) Increment(v float64) error {
	if err := goError(C.gt_TRITONSERVER_MetricIncrement(m.p, C.double(v))); err != nil {
		return fmt.Errorf("increment metric: %w", err)
	}
	return nil
}

// Delete removes the series from its family. Later calls do nothing.
func (m *Metric) Delete() error {
	if m == nil || m.p == nil {
		return nil
	}
	p := m.p
	m.p = nil
	if err := goError(C.gt_TRITONSERVER_MetricDelete(p)); err != nil {
		return fmt.Errorf("delete metric: %w", err)
	}
	return nil
}

// MetricBatch collects metric updates and applies them in one crossing into C. Its
// buffers are reused, so a batch kept for the life of its metrics allocates nothing per
// Flush. Not safe for concurrent use.
type MetricBatch struct {
	// metrics, values and add are the pending updates, index by index.
	metrics []*C.TRITONSERVER_Metric
	values  []C.double
	add     []C.bool
}

// Set queues setting gauge m to v.
func (b *MetricBatch) Set(m *Metric, v float64) { b.queue(m, v, false) }

// Increment queues adding v to m.
func (b *MetricBatch) Increment(m *Metric, v float64) { b.queue(m, v, true) }

// queue adds one update; deleted metrics are skipped.
func (b *MetricBatch) queue(m *Metric, v float64, add bool) {
	if m == nil || m.p == nil {
		return
	}
	b.metrics = append(b.metrics, m.p)
	b.values = append(b.values, C.double(v))
	b.add = append(b.add, C.bool(add))
}

// Len returns the number of updates queued.
func (b *MetricBatch) Len() int { return len(b.metrics) }

// Flush applies the queued updates, in order, and empties the batch. It stops at the
// first update Triton refuses.
func (b *MetricBatch) Flush() error {
	n := len(b.metrics)
	if n == 0 {
		return nil
	}
	// The slices hold C pointers and C values only, so C may read them.
	err := goError(C.gt_metrics_update(&b.metrics[0], &b.values[0], &b.add[0], C.size_t(n)))
	b.metrics, b.values, b.add = b.metrics[:0], b.values[:0], b.add[:0]
	if err != nil {
		return fmt.Errorf("update %d metrics: %w", n, err)
	}
	return nil
}

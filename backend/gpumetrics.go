package main

import "go.uber.org/zap"

// gpuGauges are the per-GPU series (filled in by the NVML bridge).
type gpuGauges struct{}

// newGPUGauges returns the GPU gauges.
func newGPUGauges(*zap.Logger) *gpuGauges { return &gpuGauges{} }

// sample updates the GPU series.
func (g *gpuGauges) sample() {}

// close deletes the GPU series and families.
func (g *gpuGauges) close() error { return nil }

// gpuDefs are the GPU families.
func gpuDefs() []metricDef { return nil }

package engines

import (
	"fmt"
	"os"
	"strings"

	"gollm/bridge/cuda"
	"gollm/bridge/nvml"
	"gollm/engine"
)

// gpuShare is gpu_memory_utilization's arithmetic (vLLM's meaning) for one model on one
// GPU: the model may hold Utilization × the GPU's total memory, its weights (one copy,
// shared by its instances on the GPU) included; each of its instances there gets an
// equal part of the rest for its scratch buffers and KV pool. Models that ask for 0.45
// each both get what they asked, whichever loads first — unlike
// kv_cache_free_gpu_mem_fraction, a share of what is free when the instance loads.
type gpuShare struct {
	// Utilization is the fraction of the GPU's total memory, 0 < u ≤ 1.
	Utilization float64
	// Total counts the device's whole memory, in bytes.
	Total int64
	// Weights are the model's weights on the GPU, in bytes.
	Weights int64
	// Instances is the number of the model's instances on the GPU.
	Instances int
}

// budget is the bytes the model may hold on the GPU.
func (g gpuShare) budget() int64 { return int64(g.Utilization * float64(g.Total)) }

// perInstance is each instance's budget for its scratch buffers and KV pool; an error when
// the weights alone exceed the model's budget.
func (g gpuShare) perInstance() (int64, error) {
	switch {
	case !(g.Utilization > 0 && g.Utilization <= 1):
		return 0, fmt.Errorf("gpu_memory_utilization %g is not in (0, 1]", g.Utilization)
	case g.Instances < 1:
		return 0, fmt.Errorf("%d instances on the GPU", g.Instances)
	}
	b := g.budget()
	if g.Weights >= b {
		return 0, fmt.Errorf("gpu_memory_utilization %g of the GPU's %s is %s, which the weights (%s) leave nothing of; raise it",
			g.Utilization, gib(g.Total), gib(b), gib(g.Weights))
	}
	return (b - g.Weights) / int64(g.Instances), nil
}

// checkFree fails when an instance's budget exceeds the free memory, saying how much it
// wanted and how much was free, and what else holds the GPU.
func (g gpuShare) checkFree(per, free int64, others string) error {
	if per <= free {
		return nil
	}
	return fmt.Errorf("gpu_memory_utilization %g: this instance wants %s (%s of the GPU's %s, less the weights' %s, over %d instance(s)), but %s is free; %s",
		g.Utilization, gib(per), gib(g.budget()), gib(g.Total), gib(g.Weights), g.Instances, gib(free), others)
}

// gib formats bytes in GiB.
func gib(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }

// gpuHolders describes what holds memory on the GPU with uuid, from NVML: every compute
// process with its share (this one marked), or why NVML cannot say.
func gpuHolders(uuid string) string {
	l, err := nvml.Open("")
	if err != nil {
		return fmt.Sprintf("NVML cannot list the GPU's processes (%v)", err)
	}
	defer l.Close()
	d, err := l.DeviceByUUID(uuid)
	if err != nil {
		return fmt.Sprintf("NVML cannot list the GPU's processes (%v)", err)
	}
	ps, err := d.Processes()
	if err != nil {
		return fmt.Sprintf("NVML cannot list the GPU's processes (%v)", err)
	}
	if len(ps) == 0 {
		return "NVML lists no process on the GPU"
	}
	var parts []string
	for _, p := range ps {
		s := fmt.Sprintf("pid %d", p.PID)
		if p.Name != "" {
			s += " " + p.Name
		}
		if p.PID == os.Getpid() {
			s += " (this process)"
		}
		if p.HasUsed {
			s += " " + gib(int64(p.UsedBytes))
		} else {
			s += " (size not available)"
		}
		parts = append(parts, s)
	}
	return "processes on the GPU (NVML): " + strings.Join(parts, ", ")
}

// GPUUse describes a GPU engine's device and the device memory it uses.
type GPUUse struct {
	// Ordinal numbers the device as CUDA does (CUDA_VISIBLE_DEVICES applied).
	Ordinal int
	// Name and UUID identify the device ("GPU-…", as NVML and nvidia-smi show it).
	Name, UUID string
	// Weights, KV and Scratch are bytes: the model's weights on the device (shared by its
	// instances there), this engine's KV pool and its scratch buffers.
	Weights, KV, Scratch int64
}

// GPUOf describes e's GPU, or reports false for an engine that runs on none; for a
// tensor-parallel engine, its first GPU's (rank 0's; GPUsOf gives every rank's).
func GPUOf(e engine.Engine) (GPUUse, bool) {
	us := GPUsOf(e)
	if len(us) == 0 {
		return GPUUse{}, false
	}
	return us[0], true
}

// GPUsOf describes each GPU e runs on, in rank order: one for a GPU engine, every rank's
// for a tensor-parallel one, none for the CPU engine.
func GPUsOf(e engine.Engine) []GPUUse {
	switch g := e.(type) {
	case *cuda.Engine:
		return []GPUUse{{Ordinal: g.Device.Ordinal, Name: g.Device.Name, UUID: g.Device.UUID,
			Weights: g.WeightBytes, KV: g.KVBytes, Scratch: g.ScratchBytes}}
	case *cuda.TPEngine:
		var us []GPUUse
		for r, d := range g.Devices() {
			w, kv, scratch := g.Memory(r)
			us = append(us, GPUUse{Ordinal: d.Ordinal, Name: d.Name, UUID: d.UUID, Weights: w, KV: kv, Scratch: scratch})
		}
		return us
	}
	return nil
}

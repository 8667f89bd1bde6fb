package main

import (
	"fmt"
	"sync"

	"go.uber.org/zap"

	"gollm/bridge/cuda"
	"gollm/engine"
	"gollm/model"
)

// gpuShare keeps one copy of a model's weights per GPU for its KIND_GPU instances
// (AITemplate's shared constants): the first instance on a device loads them, the others
// make their engines on the same copy.
type gpuShare struct {
	// mu guards byDevice.
	mu sync.Mutex
	// byDevice holds the model's reference to its weights on each device.
	byDevice map[int]*cuda.Weights
}

// newGPUEngine makes a KIND_GPU instance's engine on device. libgollm_cuda.so is opened
// here, not when the backend loads, so a server without a GPU still serves KIND_CPU.
func (ms *modelState) newGPUEngine(device int, log *zap.Logger) (engine.Engine, error) {
	ms.gpu.mu.Lock()
	defer ms.gpu.mu.Unlock()
	dtype := ms.cfg.DataType
	if dtype == "" {
		dtype = "float16"
		if ms.ckpt.DType == "bfloat16" {
			dtype = "bfloat16"
		}
	}
	w := ms.gpu.byDevice[device]
	if w == nil {
		ckpt, err := model.Open(ms.cfg.ModelPath)
		if err != nil {
			return nil, err
		}
		w, err = cuda.LoadWeights(ckpt, cuda.Options{Device: device, DType: dtype, Logger: log})
		if cerr := ckpt.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		if ms.gpu.byDevice == nil {
			ms.gpu.byDevice = map[int]*cuda.Weights{}
		}
		ms.gpu.byDevice[device] = w
	}
	opts := cuda.Options{Device: device, DType: dtype, TokensPerBlock: ms.cfg.TokensPerBlock,
		KVFreeFraction: ms.cfg.KVCacheFreeGPUMemFraction, MaxSeqs: ms.cfg.MaxBatchSize, Logger: log}
	if t := ms.cfg.MaxTokensInPagedKVCache; t > 0 {
		opts.NumBlocks = (t + ms.cfg.TokensPerBlock - 1) / ms.cfg.TokensPerBlock
	}
	e, err := cuda.NewEngine(w, opts)
	if err != nil {
		return nil, fmt.Errorf("GPU engine on device %d: %w", device, err)
	}
	return e, nil
}

// releaseGPU drops the model's references to its GPU weights; each copy is freed once
// the engines made on it are closed too.
func (ms *modelState) releaseGPU() {
	ms.gpu.mu.Lock()
	defer ms.gpu.mu.Unlock()
	for d, w := range ms.gpu.byDevice {
		w.Release()
		delete(ms.gpu.byDevice, d)
	}
}

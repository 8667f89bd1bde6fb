// Package engines makes the engine a model instance asks for — the pure-Go CPU engine or
// the CUDA engine — from one checkpoint folder, sharing weights between the instances of
// a model: one float32 copy for its KIND_CPU instances, one device copy per GPU for its
// KIND_GPU ones (AITemplate's shared constants). The backend names a kind, never a
// concrete engine or loader.
package engines

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"go.uber.org/zap"

	"gollm/bridge/cuda"
	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/model"
)

// Kind is the kind of engine an instance runs.
type Kind int

const (
	// CPU is the pure-Go engine (Triton's KIND_CPU).
	CPU Kind = iota
	// GPU is the CUDA engine (Triton's KIND_GPU).
	GPU
)

// String names the kind as Triton does.
func (k Kind) String() string {
	if k == GPU {
		return "KIND_GPU"
	}
	return "KIND_CPU"
}

// Settings size an instance's engine.
type Settings struct {
	// DataType is the GPU engine's compute type, "float16" or "bfloat16"; empty means the
	// checkpoint's own when it is one of them, else float16. The CPU engine computes in
	// float32.
	DataType string
	// TokensPerBlock is the positions per KV block.
	TokensPerBlock int
	// KVTokens is the KV pool's size in tokens (rounded up to whole blocks); 0 sizes it:
	// on the GPU from KVFreeFraction, on the CPU to MaxSeqs sequences of MaxSeqLen
	// within a quarter of the machine's memory.
	KVTokens int
	// KVFreeFraction is the share of the GPU's free memory the KV pool takes.
	KVFreeFraction float64
	// MaxSeqs is the most sequences in one step (max_batch_size).
	MaxSeqs int
	// MaxSeqLen is the longest sequence served (at most the model's positions).
	MaxSeqLen int
	// Logger receives load messages.
	Logger *zap.Logger
}

// Model is one checkpoint folder, its descriptor read and its weights checked, with the
// weights its engines share.
type Model struct {
	// dir is the checkpoint folder.
	dir string
	// cfg is the architecture descriptor.
	cfg model.Config
	// mu guards cpu and gpu.
	mu sync.Mutex
	// cpu holds the CPU engines' weights, loaded by the first.
	cpu *cpu.Weights
	// gpu holds the model's reference to its weights on each device.
	gpu map[int]*cuda.Weights
}

// Open reads the checkpoint folder's config and checks every weight's name, dtype and
// shape against it, without converting any: a bad checkpoint fails here, and the weights
// wait for the first instance of each kind.
func Open(dir string) (*Model, error) {
	c, err := model.Open(dir)
	if err != nil {
		return nil, err
	}
	_, werr := c.Weights()
	cerr := c.Close()
	if werr != nil {
		return nil, fmt.Errorf("%s: %w", dir, werr)
	}
	if cerr != nil {
		return nil, fmt.Errorf("%s: close: %w", dir, cerr)
	}
	return &Model{dir: dir, cfg: c.Config}, nil
}

// Config is the model's descriptor.
func (m *Model) Config() model.Config { return m.cfg }

// NewEngine makes an engine of kind on device (GPU only) with its own KV pool, on the
// model's shared weights (loading them if it is the first of its kind and device).
func (m *Model) NewEngine(kind Kind, device int, s Settings) (engine.Engine, error) {
	if s.Logger == nil {
		s.Logger = zap.NewNop()
	}
	switch kind {
	case CPU:
		return m.newCPU(s)
	case GPU:
		return m.newGPU(device, s)
	}
	return nil, fmt.Errorf("engines: kind %d is neither CPU nor GPU", kind)
}

// newCPU makes a CPU engine; the first one converts the weights to float32.
func (m *Model) newCPU(s Settings) (engine.Engine, error) {
	m.mu.Lock()
	if m.cpu == nil {
		f, err := model.LoadFloat32(m.dir)
		if err != nil {
			m.mu.Unlock()
			return nil, err
		}
		w, err := cpu.NewWeights(f)
		if err != nil {
			m.mu.Unlock()
			return nil, fmt.Errorf("load %s: %w", m.dir, err)
		}
		m.cpu = w
	}
	w := m.cpu
	m.mu.Unlock()
	tokens := s.KVTokens
	if tokens == 0 {
		tokens = m.defaultCPUTokens(s)
	}
	blocks := (tokens + s.TokensPerBlock - 1) / s.TokensPerBlock
	return cpu.New(w, engine.KVConfig{NumBlocks: blocks, TokensPerBlock: s.TokensPerBlock, MaxSeqLen: s.MaxSeqLen})
}

// defaultCPUTokens sizes a CPU pool that nobody sized: MaxSeqs sequences of MaxSeqLen,
// but no more than a quarter of the machine's memory (and never less than one longest
// sequence), so that a model with a long context does not take the machine's memory by
// default.
func (m *Model) defaultCPUTokens(s Settings) int {
	want := int64(s.MaxSeqs) * int64(s.MaxSeqLen)
	perToken := int64(m.cfg.Layers) * 2 * int64(m.cfg.KVHeads) * int64(m.cfg.HeadDim) * 4
	budget := int64(2 << 30)
	if total, err := memTotal(); err == nil {
		budget = total / 4
	}
	if fit := budget / perToken; want > fit {
		want = fit
	}
	return int(max(want, int64(s.MaxSeqLen)))
}

// memTotal reads the machine's memory from /proc/meminfo.
func memTotal() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no MemTotal in /proc/meminfo")
}

// newGPU makes a GPU engine on device. libgollm_cuda.so is opened here, not when the
// backend loads, so a server without a GPU still serves KIND_CPU.
func (m *Model) newGPU(device int, s Settings) (engine.Engine, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	dtype := s.DataType
	if dtype == "" {
		dtype = "float16"
		if m.cfg.DType == "bfloat16" {
			dtype = "bfloat16"
		}
	}
	w := m.gpu[device]
	if w == nil {
		ckpt, err := model.Open(m.dir)
		if err != nil {
			return nil, err
		}
		w, err = cuda.LoadWeights(ckpt, cuda.Options{Device: device, DType: dtype, Logger: s.Logger})
		if cerr := ckpt.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		if m.gpu == nil {
			m.gpu = map[int]*cuda.Weights{}
		}
		m.gpu[device] = w
	}
	opts := cuda.Options{Device: device, DType: dtype, TokensPerBlock: s.TokensPerBlock,
		KVFreeFraction: s.KVFreeFraction, MaxSeqs: s.MaxSeqs, MaxSeqLen: s.MaxSeqLen, Logger: s.Logger}
	if s.KVTokens > 0 {
		opts.NumBlocks = (s.KVTokens + s.TokensPerBlock - 1) / s.TokensPerBlock
	}
	e, err := cuda.NewEngine(w, opts)
	if err != nil {
		return nil, fmt.Errorf("GPU engine on device %d: %w", device, err)
	}
	return e, nil
}

// Release drops the model's references to its shared weights: the GPU copies are freed
// once the engines made on them are closed too, the CPU copy once they are collected.
func (m *Model) Release() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for d, w := range m.gpu {
		w.Release()
		delete(m.gpu, d)
	}
	m.cpu = nil
}

// Package engines makes the engine a model instance asks for — the pure-Go CPU engine or
// the CUDA engine — from one checkpoint folder, sharing weights between the instances of
// a model: one host copy per weight format for its KIND_CPU instances (mapped from the
// checkpoint's files where the format is the stored one), one device copy per GPU for
// its KIND_GPU ones (AITemplate's shared constants). The backend names a kind, never a
// concrete engine or loader.
package engines

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"gollm/bridge/cuda"
	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/hostmem"
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
	// Quantization "fp8" quantizes the projections of a float checkpoint to FP8 at load
	// (model.QuantizeFP8); empty serves the weights as stored.
	Quantization string
	// KVCacheDType is the KV pool's element type (kv_cache_dtype); under engine.KVFP8 the
	// checkpoint's KV scales, where it has them, scale it.
	KVCacheDType engine.KVDType
	// BatchInvariant asks the GPU engine for a sequence's logits bitwise independent of
	// the rest of its step (batch_invariant; the CPU engine always gives them).
	BatchInvariant bool
	// CPUWeightFormat is how the CPU engine stores the weight matrices
	// (cpu_weight_format: cpu.ParseWeightFormat); empty means as the checkpoint stores
	// them.
	CPUWeightFormat string
	// TokensPerBlock sets the KV block size in positions.
	TokensPerBlock int
	// KVTokens is the KV pool's size in tokens (rounded up to whole blocks); 0 sizes it:
	// on the GPU from KVFreeFraction, on the CPU to MaxSeqs sequences of MaxSeqLen
	// within a quarter of the machine's memory.
	KVTokens int
	// KVFreeFraction is the share of the GPU's free memory the KV pool takes.
	KVFreeFraction float64
	// GPUMemUtilization, when positive, is the share of the GPU's total memory the model
	// may hold, weights included (gpu_memory_utilization; gpuShare), and KVFreeFraction is
	// not used.
	GPUMemUtilization float64
	// GPUInstances gives the number of the model's instances on a device (for
	// GPUMemUtilization's split); nil or a result below 1 counts 1.
	GPUInstances func(device int) int
	// MaxSeqs is the most sequences in one step (max_batch_size).
	MaxSeqs int
	// MaxSeqLen is the longest sequence served (at most the model's positions).
	MaxSeqLen int
	// TensorParallel is tensor_parallel_size: a GPU engine on device d spreads the model
	// over GPUs d, d+1, …, d+TensorParallel-1 (0 and 1: one GPU). The CPU engine runs a
	// model whole.
	TensorParallel int
	// ExpertParallel is expert_parallel: under TensorParallel > 1, each GPU holds E/N of a
	// mixture of experts' experts whole (model.Config.ExpertParallel).
	ExpertParallel bool
	// Logger receives load messages.
	Logger *zap.Logger
}

// Model is one checkpoint folder, its descriptor read and its weights checked, with the
// weights its engines share. Every Open of one folder (the same files, unchanged) in the
// process returns the same Model until each has been released: Triton models that
// serve one checkpoint under several names (TensorRT-LLM's "ensemble" and
// "tensorrt_llm", say) hold one copy of its weights.
type Model struct {
	// dir is read again by each instance, for the weights its kind needs.
	dir string
	// key is the folder's registry key (fingerprint).
	key string
	// refs counts the Opens not yet released (guarded by openMu).
	refs int
	// cfg is read from the checkpoint (config.json, or a GGUF file's metadata) at Open.
	cfg model.Config
	// gguf is the GGUF file of a GGUF checkpoint, "" for a Hugging Face folder.
	gguf string
	// elems counts the elements of the weights, and stored their bytes as the checkpoint
	// stores them, for the memory checks before a load (memcheck.go).
	elems, stored int64
	// mu guards cpu and gpu.
	mu sync.Mutex
	// cpu holds the CPU engines' weights by format (and FP8 quantization at load), loaded
	// by the first of each.
	cpu map[cpuKey]*cpu.Weights
	// gpu holds the model's reference to its weights on each device, by compute type.
	gpu map[gpuKey]*cuda.Weights
	// kScales and vScales are the checkpoint's KV cache scales (nil: none), read at Open
	// with the rest of it; kvScaleErr is why they could not be, returned only to an
	// engine that asks for an FP8 KV cache.
	kScales, vScales []float32
	kvScaleErr       error
}

// gpuKey names one device copy of the weights: the whole model (tp 1), or rank's share of
// a tp-way tensor-parallel split.
type gpuKey struct {
	device   int
	dtype    string
	tp, rank int
	// quant is the weights' Settings.Quantization.
	quant string
	// ep is the split's Settings.ExpertParallel.
	ep bool
}

var (
	// openMu guards opened and every Model's refs.
	openMu sync.Mutex
	// opened are the open Models by fingerprint.
	opened = map[string]*Model{}
)

// fingerprint names a checkpoint folder's contents: its real path and the size and
// modification time of its config and weight files, so that a folder whose files were
// replaced opens afresh rather than sharing the weights read before.
func fingerprint(dir string) (string, error) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	if real, err = filepath.Abs(real); err != nil {
		return "", err
	}
	if fi, err := os.Stat(real); err != nil {
		return "", err
	} else if !fi.IsDir() { // a GGUF file
		return fmt.Sprintf("%s\x00%d:%d", real, fi.Size(), fi.ModTime().UnixNano()), nil
	}
	ents, err := os.ReadDir(real)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(real)
	for _, e := range ents {
		n := e.Name()
		if n != "config.json" && !strings.HasSuffix(n, ".safetensors") && !strings.HasSuffix(n, ".safetensors.index.json") &&
			!strings.HasSuffix(n, ".gguf") {
			continue
		}
		fi, err := os.Stat(filepath.Join(real, n))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "\x00%s:%d:%d", n, fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String(), nil
}

// CheckCPUWeightFormat says whether s is a cpu_weight_format the CPU engine takes
// (auto, fp32, fp16, bf16, q8_0, q4_k), naming them when it is not.
func CheckCPUWeightFormat(s string) error {
	_, err := cpu.ParseWeightFormat(s)
	return err
}

// Open reads the checkpoint folder's config and checks every weight's name, dtype and
// shape against it, without converting any: a bad checkpoint fails here, and the weights
// wait for the first instance of each kind. A folder already open is shared (Model);
// each Open needs its Release.
func Open(dir string) (*Model, error) {
	m, _, err := OpenShared(dir)
	return m, err
}

// OpenShared is Open, and says whether this Open found the folder open already (by
// another model): read under the lock Open takes, so that of two models opening one
// folder at once exactly one is told it shares, where Users read afterwards tells both.
func OpenShared(dir string) (_ *Model, shared bool, _ error) {
	key, err := fingerprint(dir)
	if err != nil {
		return nil, false, fmt.Errorf("checkpoint folder %s: %w", dir, err)
	}
	openMu.Lock()
	defer openMu.Unlock()
	if m := opened[key]; m != nil {
		m.refs++
		return m, true, nil
	}
	c, err := model.Open(dir)
	if err != nil {
		return nil, false, err
	}
	ws, werr := c.Weights()
	ks, vs, kerr := c.KVScales()
	cerr := c.Close()
	if werr != nil {
		return nil, false, fmt.Errorf("%s: %w", dir, werr)
	}
	if cerr != nil {
		return nil, false, fmt.Errorf("%s: close: %w", dir, cerr)
	}
	m := &Model{dir: dir, key: key, refs: 1, cfg: c.Config, gguf: c.GGUF, elems: weightElements(ws), stored: storedBytes(ws),
		kScales: ks, vScales: vs, kvScaleErr: kerr}
	opened[key] = m
	return m, false, nil
}

// Users is the number of Opens of the model's folder not yet released: above 1, the
// weights are shared with another Triton model.
func (m *Model) Users() int {
	openMu.Lock()
	defer openMu.Unlock()
	return m.refs
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

// cpuKey names a set of CPU weights: their format, and whether they were rounded to FP8
// at load (quantization fp8).
type cpuKey struct {
	format cpu.WeightFormat
	fp8    bool
}

// keepCPU holds w as the CPU weights of key; m.mu is held.
func (m *Model) keepCPU(key cpuKey, w *cpu.Weights) {
	if m.cpu == nil {
		m.cpu = map[cpuKey]*cpu.Weights{}
	}
	m.cpu[key] = w
}

// newCPU makes a CPU engine; the first one of its weight format loads the weights.
// Before it allocates, it checks that the weights it would hold (in that format) and its
// KV pool fit in what the process may still take of the host's memory.
func (m *Model) newCPU(s Settings) (engine.Engine, error) {
	format, err := cpu.ParseWeightFormat(s.CPUWeightFormat)
	if err != nil {
		return nil, fmt.Errorf("parameter \"cpu_weight_format\": %w", err)
	}
	if s.Quantization == "fp8" && format != cpu.FormatAuto && format != cpu.FormatF32 {
		return nil, fmt.Errorf("parameters \"quantization\" fp8 and \"cpu_weight_format\" %s: the CPU engine computes FP8-rounded weights in float32; set one of the two", format)
	}
	tokens := s.KVTokens
	if tokens == 0 {
		tokens = m.defaultCPUTokens(s)
	}
	blocks := (tokens + s.TokensPerBlock - 1) / s.TokensPerBlock
	m.mu.Lock()
	key := cpuKey{format: format, fp8: s.Quantization == "fp8"}
	w := m.cpu[key]
	weights := int64(0)
	if w == nil {
		weights = m.cpuWeightBytes(format)
		if key.fp8 {
			weights = m.elems * 4
		}
	}
	kv := int64(blocks) * int64(s.TokensPerBlock) * m.kvBytesPerToken(cpuKVElem(s.KVCacheDType))
	if err := fitsHost(weights, string(format), kv, blocks*s.TokensPerBlock, hostmem.Read()); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	if w == nil && key.fp8 {
		// quantization fp8: the weights rounded as FP8 stores them, computed in float32.
		f, err := model.LoadFloat32FP8(m.dir)
		if err == nil {
			w, err = cpu.NewWeights(f)
		}
		if err != nil {
			m.mu.Unlock()
			return nil, fmt.Errorf("load %s: %w", m.dir, err)
		}
		m.keepCPU(key, w)
	}
	if w == nil {
		c, err := model.Open(m.dir)
		if err != nil {
			m.mu.Unlock()
			return nil, err
		}
		start := time.Now()
		if w, err = cpu.LoadWeights(c, format); err != nil {
			m.mu.Unlock()
			return nil, err
		}
		m.keepCPU(key, w)
		fields := []zap.Field{zap.String("path", m.dir), zap.String("cpu_weight_format", string(format)),
			zap.Float64("weights_gb", float64(w.Bytes())/1e9), zap.Duration("took", time.Since(start))}
		for f, rows := range w.Formats() {
			fields = append(fields, zap.Int("rows_"+f, rows))
		}
		s.Logger.Info("CPU weights loaded", fields...)
	}
	m.mu.Unlock()
	kvc := engine.KVConfig{NumBlocks: blocks, TokensPerBlock: s.TokensPerBlock, MaxSeqLen: s.MaxSeqLen, DType: s.KVCacheDType}
	if s.KVCacheDType == engine.KVFP8 {
		if kvc.KScales, kvc.VScales, err = m.kvScales(s.Logger); err != nil {
			return nil, err
		}
	}
	e, err := cpu.New(w, kvc)
	if err != nil {
		return nil, err
	}
	fe, err := withFaults(e)
	if err != nil {
		_ = e.Close()
		return nil, err
	}
	return fe, nil
}

// cpuKVElem is the bytes of one element of a CPU engine's KV pool of type d.
func cpuKVElem(d engine.KVDType) int64 {
	if d == engine.KVFP8 {
		return 1
	}
	return 4
}

// kvScales returns the checkpoint's FP8 KV cache scales (nil where it has none: the
// engines take 1, as vLLM does without calibration) and logs which.
func (m *Model) kvScales(log *zap.Logger) (k, v []float32, err error) {
	if m.kvScaleErr != nil {
		return nil, nil, fmt.Errorf("%s: %w", m.dir, m.kvScaleErr)
	}
	if m.kScales == nil {
		log.Info("FP8 KV cache with scales of 1: the checkpoint has no k_scale and v_scale tensors", zap.String("path", m.dir))
	} else {
		log.Info("FP8 KV cache with the checkpoint's per-layer k_scale and v_scale", zap.String("path", m.dir), zap.Int("layers", len(m.kScales)))
	}
	return m.kScales, m.vScales, nil
}

// defaultCPUTokens sizes a CPU pool that nobody sized: MaxSeqs sequences of MaxSeqLen,
// but no more than a quarter of the machine's memory (and never less than one longest
// sequence), so that a model with a long context does not take the machine's memory by
// default.
func (m *Model) defaultCPUTokens(s Settings) int {
	want := int64(s.MaxSeqs) * int64(s.MaxSeqLen)
	perToken := m.kvBytesPerToken(cpuKVElem(s.KVCacheDType))
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

// computeType is the GPU engine's compute type: the one set, else bfloat16 for a
// checkpoint stored in bfloat16 (its range does not fit float16's) and float16 for the
// rest.
func computeType(set, stored string) string {
	switch {
	case set != "":
		return set
	case stored == "bfloat16":
		return "bfloat16"
	default:
		return "float16"
	}
}

// newGPU makes a GPU engine on device. libgollm_cuda.so is opened here, not when the
// backend loads, so a server without a GPU still serves KIND_CPU.
func (m *Model) newGPU(device int, s Settings) (engine.Engine, error) {
	if m.gguf != "" {
		return nil, fmt.Errorf("%s is a GGUF file, which KIND_CPU instances serve; KIND_GPU instances serve Hugging Face checkpoints (safetensors)", m.gguf)
	}
	// An FP8 pool takes the checkpoint's per-layer scales (1 where it has none), the same
	// on every tensor-parallel rank.
	var ks, vs []float32
	if s.KVCacheDType == engine.KVFP8 {
		var err error
		if ks, vs, err = m.kvScales(s.Logger); err != nil {
			return nil, err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	dtype := computeType(s.DataType, m.cfg.DType)
	if s.TensorParallel > 1 {
		return m.newGPUTP(device, dtype, s, ks, vs)
	}
	w := m.gpu[gpuKey{device: device, dtype: dtype, tp: 1, quant: s.Quantization}]
	if w == nil {
		if err := fitsDevice(device, m.elems*2, "the weights in "+dtype); err != nil {
			return nil, err
		}
		ckpt, err := model.Open(m.dir)
		if err != nil {
			return nil, err
		}
		w, err = cuda.LoadWeights(ckpt, cuda.Options{Device: device, DType: dtype, Quantization: s.Quantization, Logger: s.Logger})
		if cerr := ckpt.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		if m.gpu == nil {
			m.gpu = map[gpuKey]*cuda.Weights{}
		}
		m.gpu[gpuKey{device: device, dtype: dtype, tp: 1, quant: s.Quantization}] = w
	}
	opts := cuda.Options{Device: device, DType: dtype, TokensPerBlock: s.TokensPerBlock,
		KVFreeFraction: s.KVFreeFraction, MaxSeqs: s.MaxSeqs, MaxSeqLen: s.MaxSeqLen,
		BatchInvariant: s.BatchInvariant, KVDType: s.KVCacheDType, KScales: ks, VScales: vs, Logger: s.Logger}
	switch {
	case s.KVTokens > 0:
		opts.NumBlocks = (s.KVTokens + s.TokensPerBlock - 1) / s.TokensPerBlock
	case s.GPUMemUtilization > 0:
		dev, err := cuda.Device("", device)
		if err != nil {
			return nil, fmt.Errorf("GPU engine on device %d: %w", device, err)
		}
		n := 1
		if s.GPUInstances != nil {
			n = max(1, s.GPUInstances(device))
		}
		g := gpuShare{Utilization: s.GPUMemUtilization, Total: dev.Total, Weights: w.Bytes(), Instances: n}
		per, err := g.perInstance()
		if err == nil {
			err = g.checkFree(per, dev.Free, gpuHolders(dev.UUID))
		}
		if err != nil {
			return nil, fmt.Errorf("GPU engine on device %d (%s, %s): %w", device, dev.Name, dev.UUID, err)
		}
		opts.MemBudget = per
	}
	e, err := cuda.NewEngine(w, opts)
	if err != nil {
		return nil, fmt.Errorf("GPU engine on device %d: %w", device, err)
	}
	return e, nil
}

// newGPUTP makes a tensor-parallel engine over GPUs device … device+n-1 (n =
// s.TensorParallel), loading each rank's share of the weights there unless an instance
// before it did (m.mu held); ks and vs are an FP8 pool's scales.
func (m *Model) newGPUTP(device int, dtype string, s Settings, ks, vs []float32) (engine.Engine, error) {
	n := s.TensorParallel
	if _, err := m.cfg.Parallel(n, s.ExpertParallel); err != nil {
		return nil, err
	}
	count, err := cuda.DeviceCount("")
	if err != nil {
		return nil, fmt.Errorf("tensor_parallel_size %d on GPU %d: %w", n, device, err)
	}
	if device < 0 || device+n > count {
		return nil, fmt.Errorf("tensor_parallel_size %d on GPU %d needs GPUs %d to %d, but this machine has %d (CUDA ordinals 0 to %d); an instance on GPU d drives GPUs d to d+%d, so list the first GPU of each group of %d in the instance group's gpus",
			n, device, device, device+n-1, count, count-1, n-1, n)
	}
	shares := make([]*cuda.Weights, n)
	var ckpt *model.Checkpoint
	defer func() {
		if ckpt != nil {
			_ = ckpt.Close()
		}
	}()
	for r := range n {
		key := gpuKey{device: device + r, dtype: dtype, tp: n, rank: r, quant: s.Quantization, ep: s.ExpertParallel}
		if w := m.gpu[key]; w != nil {
			shares[r] = w
			continue
		}
		// Each rank holds about its share of the weights (more where heads are few).
		if err := fitsDevice(device+r, m.elems*2/int64(n), fmt.Sprintf("rank %d's share of the weights in %s", r, dtype)); err != nil {
			return nil, fmt.Errorf("tensor_parallel_size %d: %w", n, err)
		}
		if ckpt == nil {
			if ckpt, err = model.Open(m.dir); err != nil {
				return nil, err
			}
		}
		w, err := cuda.LoadShard(ckpt, n, r, cuda.Options{Device: device + r, DType: dtype, Quantization: s.Quantization,
			ExpertParallel: s.ExpertParallel, Logger: s.Logger})
		if err != nil {
			return nil, fmt.Errorf("tensor_parallel_size %d: rank %d on GPU %d: %w", n, r, device+r, err)
		}
		if m.gpu == nil {
			m.gpu = map[gpuKey]*cuda.Weights{}
		}
		m.gpu[key] = w
		shares[r] = w
	}
	opts := cuda.Options{DType: dtype, TokensPerBlock: s.TokensPerBlock, KVFreeFraction: s.KVFreeFraction,
		MaxSeqs: s.MaxSeqs, MaxSeqLen: s.MaxSeqLen, BatchInvariant: s.BatchInvariant,
		KVDType: s.KVCacheDType, KScales: ks, VScales: vs, Logger: s.Logger}
	switch {
	case s.KVTokens > 0:
		opts.NumBlocks = (s.KVTokens + s.TokensPerBlock - 1) / s.TokensPerBlock
	case s.GPUMemUtilization > 0:
		// Each rank's budget on its GPU; the pools then take the fewest blocks of any.
		for r, w := range shares {
			d := device + r
			dev, err := cuda.Device("", d)
			if err != nil {
				return nil, fmt.Errorf("tensor_parallel_size %d: rank %d on GPU %d: %w", n, r, d, err)
			}
			inst := 1
			if s.GPUInstances != nil {
				inst = max(1, s.GPUInstances(d))
			}
			g := gpuShare{Utilization: s.GPUMemUtilization, Total: dev.Total, Weights: w.Bytes(), Instances: inst}
			per, err := g.perInstance()
			if err == nil {
				err = g.checkFree(per, dev.Free, gpuHolders(dev.UUID))
			}
			if err != nil {
				return nil, fmt.Errorf("tensor_parallel_size %d: rank %d on GPU %d (%s, %s): %w", n, r, d, dev.Name, dev.UUID, err)
			}
			if opts.MemBudget == 0 || per < opts.MemBudget {
				opts.MemBudget = per
			}
		}
	}
	e, err := cuda.NewTensorParallelEngine(shares, opts)
	if err != nil {
		return nil, fmt.Errorf("GPU engine over GPUs %d to %d (tensor_parallel_size %d): %w", device, device+n-1, n, err)
	}
	return e, nil
}

// Release ends one Open. The last drops the model's references to its shared weights:
// the GPU copies are freed once the engines made on them are closed too, the CPU copy
// once they are collected.
func (m *Model) Release() {
	openMu.Lock()
	if m.refs <= 0 {
		openMu.Unlock()
		return
	}
	m.refs--
	last := m.refs == 0
	if last && opened[m.key] == m {
		delete(opened, m.key)
	}
	openMu.Unlock()
	if !last {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for d, w := range m.gpu {
		w.Release()
		delete(m.gpu, d)
	}
	for f, w := range m.cpu {
		_ = w.Release()
		delete(m.cpu, f)
	}
}

// NewEagle3Head makes an EAGLE-3 head h for this model (its target) on the CPU, with a
// KV pool of kv: it reads the model's embedding unless it has its own, so the model's
// CPU weights are loaded if no CPU instance has loaded them yet.
func (m *Model) NewEagle3Head(h *model.Eagle3, kv engine.KVConfig) (engine.Head, error) {
	c := &h.Config
	switch {
	case c.VocabSize != m.cfg.VocabSize:
		return nil, fmt.Errorf("EAGLE-3 head: its vocabulary has %d tokens, the model's %d", c.VocabSize, m.cfg.VocabSize)
	case c.TargetHidden != m.cfg.Hidden:
		return nil, fmt.Errorf("EAGLE-3 head: it reads hidden states of width %d, the model's are %d wide", c.TargetHidden, m.cfg.Hidden)
	}
	var embed []float32
	if h.Embed == nil {
		m.mu.Lock()
		var w *cpu.Weights
		for _, loaded := range m.cpu {
			w = loaded
			break
		}
		if w == nil {
			c, err := model.Open(m.dir)
			if err == nil {
				w, err = cpu.LoadWeights(c, cpu.FormatAuto)
			}
			if err != nil {
				m.mu.Unlock()
				return nil, fmt.Errorf("EAGLE-3 head: the model's embedding: %w", err)
			}
			m.keepCPU(cpuKey{format: cpu.FormatAuto}, w)
		}
		embed = w.Embedding()
		m.mu.Unlock()
	}
	return cpu.NewEagle3(h, m.cfg.Layers, embed, kv)
}

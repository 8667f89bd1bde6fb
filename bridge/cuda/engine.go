package cuda

/*
#include "trampoline.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"go.uber.org/zap"

	"gollm/engine"
	"gollm/model"
)

// Options configure a GPU engine. Zero fields take the defaults in their comments.
type Options struct {
	// Device is the CUDA device ordinal.
	Device int
	// DType is the compute type of weights, activations and KV cache: "float16" (default)
	// or "bfloat16"; "fp16" and "bf16" are accepted too.
	DType string
	// TokensPerBlock is the number of positions per KV block (default 64).
	TokensPerBlock int
	// NumBlocks sets the KV pool's size in blocks; 0 sizes it from KVFreeFraction.
	NumBlocks int
	// KVFreeFraction is the share of the GPU memory left free after the weights and the
	// scratch buffers that the KV pool takes (kv_cache_free_gpu_mem_fraction, default 0.9).
	KVFreeFraction float64
	// MaxTokens is the most new tokens one library call handles (default 8192); larger
	// batches are split into several calls.
	MaxTokens int
	// MaxSeqs is the most sequences one library call handles (default 256).
	MaxSeqs int
	// MaxLogitRows is how many LM-head rows are computed at once (default MaxSeqs);
	// context logits of longer prompts come in several passes.
	MaxLogitRows int
	// DisableCUDAGraphs runs decode steps kernel by kernel instead of replaying graphs.
	DisableCUDAGraphs bool
	// SkipWarmup returns the engine without its warm-up (every padded cuBLAS shape called
	// once, every decode graph captured; well under a second). Served engines warm up:
	// otherwise the first step of each new token count or batch bucket pays milliseconds.
	SkipWarmup bool
	// Library is the path of libgollm_cuda.so; "" searches as the package doc says.
	Library string
	// Logger receives load and sizing messages; nil discards them.
	Logger *zap.Logger
}

// withDefaults fills the zero fields.
func (o Options) withDefaults() Options {
	if o.DType == "" {
		o.DType = "float16"
	}
	if o.TokensPerBlock == 0 {
		o.TokensPerBlock = 64
	}
	if o.KVFreeFraction == 0 {
		o.KVFreeFraction = 0.9
	}
	if o.MaxTokens == 0 {
		o.MaxTokens = 8192
	}
	if o.MaxSeqs == 0 {
		o.MaxSeqs = 256
	}
	if o.MaxLogitRows == 0 {
		o.MaxLogitRows = o.MaxSeqs
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// dtypeCode maps a dtype name to gollm_dtype.
func dtypeCode(name string) (C.int32_t, error) {
	switch name {
	case "float16", "fp16", "half":
		return C.GOLLM_DTYPE_F16, nil
	case "bfloat16", "bf16":
		return C.GOLLM_DTYPE_BF16, nil
	}
	return 0, fmt.Errorf("data_type %q is not float16 or bfloat16", name)
}

// tensorDType maps a safetensors dtype to gollm_dtype.
func tensorDType(name string) (C.int32_t, bool) {
	switch name {
	case "F32":
		return C.GOLLM_DTYPE_F32, true
	case "F16":
		return C.GOLLM_DTYPE_F16, true
	case "BF16":
		return C.GOLLM_DTYPE_BF16, true
	}
	return 0, false
}

// activationCode maps config.json's activation_function to gollm_activation.
func activationCode(name string) (C.int32_t, error) {
	switch name {
	case "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "":
		return C.GOLLM_ACT_GELU_TANH, nil
	case "gelu":
		return C.GOLLM_ACT_GELU_ERF, nil
	case "relu":
		return C.GOLLM_ACT_RELU, nil
	}
	return 0, fmt.Errorf("activation_function %q is not supported (gelu_new, gelu_pytorch_tanh, gelu_fast, gelu, relu)", name)
}

// Weights are a checkpoint's weights on one GPU, shared by every engine made on them
// (the instances of a model on one device). They are freed when Release has been called
// and every engine on them is closed.
type Weights struct {
	// lib is the library that owns them.
	lib *lib
	// ptr is the gollm_weights handle.
	ptr *C.gollm_weights
	// cfg is the model's configuration.
	cfg model.Config
	// device is the CUDA ordinal.
	device int
	// dtype is the compute type's name, as given.
	dtype string
	// once makes Release idempotent.
	once sync.Once
}

// layerTensors are the per-layer tensor names in gollm.h's order.
var layerTensors = [C.GOLLM_LAYER_TENSORS]string{
	"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
	"attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
	"mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
}

// LoadWeights copies ckpt's GPT-2 weights onto opts.Device, converted to opts.DType.
// The checkpoint may be closed afterwards. Only Device, DType, Library and Logger of
// opts are read.
func LoadWeights(ckpt *model.Checkpoint, opts Options) (*Weights, error) {
	opts = opts.withDefaults()
	if ckpt == nil {
		return nil, errors.New("cuda: LoadWeights: nil checkpoint")
	}
	cfg := ckpt.Config
	if cfg.Arch != "gpt2" {
		return nil, fmt.Errorf("cuda: load %s: model_type %q is not gpt2", ckpt.Dir, cfg.Arch)
	}
	dt, err := dtypeCode(opts.DType)
	if err != nil {
		return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
	}
	act, err := activationCode(cfg.Activation)
	if err != nil {
		return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
	}
	if cfg.KVHeads != cfg.Heads {
		return nil, fmt.Errorf("cuda: load %s: KVHeads %d differs from n_head %d", ckpt.Dir, cfg.KVHeads, cfg.Heads)
	}
	l, err := openLib(opts.Library)
	if err != nil {
		return nil, err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	tensor := func(name string, shape ...int) (C.gollm_tensor, error) {
		t, err := ckpt.Tensor(name)
		if err != nil {
			return C.gollm_tensor{}, err
		}
		code, ok := tensorDType(t.DType)
		if !ok {
			return C.gollm_tensor{}, fmt.Errorf("tensor %s: dtype %s, expected F32, F16 or BF16", name, t.DType)
		}
		want := 1
		for _, d := range shape {
			want *= d
		}
		if len(t.Shape) != len(shape) || t.NumElements() != want {
			return C.gollm_tensor{}, fmt.Errorf("tensor %s: shape %v, expected %v", name, t.Shape, shape)
		}
		for i := range shape {
			if t.Shape[i] != shape[i] {
				return C.gollm_tensor{}, fmt.Errorf("tensor %s: shape %v, expected %v", name, t.Shape, shape)
			}
		}
		if len(t.Data) == 0 {
			return C.gollm_tensor{}, fmt.Errorf("tensor %s: no data", name)
		}
		pin.Pin(&t.Data[0])
		return C.gollm_tensor{data: unsafe.Pointer(&t.Data[0]), numel: C.int64_t(want), dtype: code}, nil
	}
	H, I, V, P := cfg.Hidden, cfg.Inner, cfg.VocabSize, cfg.MaxPositions
	p := &C.gollm_weights_params{device: C.int32_t(opts.Device), dtype: dt}
	p.config = C.gollm_model_config{
		vocab_size: C.int32_t(V), max_positions: C.int32_t(P), hidden: C.int32_t(H),
		layers: C.int32_t(cfg.Layers), heads: C.int32_t(cfg.Heads), head_dim: C.int32_t(cfg.HeadDim),
		inner: C.int32_t(I), activation: act, layer_norm_eps: C.float(cfg.LayerNormEps),
	}
	var errs []error
	add := func(dst *C.gollm_tensor, name string, shape ...int) {
		t, err := tensor(name, shape...)
		if err != nil {
			errs = append(errs, err)
		}
		*dst = t
	}
	add(&p.wte, "wte.weight", V, H)
	add(&p.wpe, "wpe.weight", P, H)
	add(&p.lnf_w, "ln_f.weight", H)
	add(&p.lnf_b, "ln_f.bias", H)
	layers := make([]C.gollm_tensor, cfg.Layers*C.GOLLM_LAYER_TENSORS)
	shapes := [C.GOLLM_LAYER_TENSORS][]int{{H}, {H}, {H, 3 * H}, {3 * H}, {H, H}, {H}, {H}, {H}, {H, I}, {I}, {I, H}, {H}}
	for li := 0; li < cfg.Layers; li++ {
		for k, name := range layerTensors {
			add(&layers[li*C.GOLLM_LAYER_TENSORS+k], fmt.Sprintf("h.%d.%s", li, name), shapes[k]...)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
	}
	if head, err := ckpt.Tensor("lm_head.weight"); err == nil {
		// GPT-2 ties the LM head to wte; an untied head would be silently ignored.
		wte, _ := ckpt.Tensor("wte.weight")
		if head.DType != wte.DType || string(head.Data) != string(wte.Data) {
			return nil, fmt.Errorf("cuda: load %s: tensor lm_head.weight differs from wte.weight; only a tied LM head is supported", ckpt.Dir)
		}
	}
	pin.Pin(&layers[0])
	p.layers = &layers[0]
	var w *C.gollm_weights
	var st C.gollm_status
	if err := statusErr("gollm_weights_create", C.call_weights_create(l.weightsCreate, p, &w, &st), &st); err != nil {
		return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
	}
	opts.Logger.Info("gpu weights loaded", zap.String("checkpoint", ckpt.Dir), zap.Int("device", opts.Device),
		zap.String("dtype", opts.DType), zap.String("library", l.path))
	return &Weights{lib: l, ptr: w, cfg: cfg, device: opts.Device, dtype: opts.DType}, nil
}

// Config returns the model's configuration.
func (w *Weights) Config() model.Config { return w.cfg }

// Release drops the caller's reference; the memory goes when the engines on w are closed
// too. Calling it again does nothing.
func (w *Weights) Release() {
	w.once.Do(func() { C.call_weights_release(w.lib.weightsRelease, w.ptr) })
}

// Engine is a GPU engine: engine.Engine over the CUDA library. Every library call runs
// on one goroutine locked to its OS thread, so the CUDA stream and device binding stay
// with one thread; Step may be called from any goroutine, one at a time.
type Engine struct {
	// lib is the library in use.
	lib *lib
	// ptr is the gollm_engine handle; nil once closed.
	ptr *C.gollm_engine
	// info is what Info returns.
	info engine.Info
	// opts are the options with defaults filled.
	opts Options
	// calls carries work to the locked goroutine.
	calls chan func()
	// done is closed when the locked goroutine exits.
	done chan struct{}
	// mu serialises Step and Close.
	mu sync.Mutex
	// closed is set by Close.
	closed bool
	// prep holds the host buffers of one step, reused.
	prep stepPrep
	// check validates each batch as every engine does.
	check *engine.BatchChecker
	// DeviceName is the GPU's name.
	DeviceName string
	// WeightBytes, KVBytes and ScratchBytes are the device memory in use.
	WeightBytes, KVBytes, ScratchBytes int64
	// WarmupGEMMShapes and WarmupGraphs count what the warm-up readied, in WarmupTime.
	WarmupGEMMShapes, WarmupGraphs int
	WarmupTime                     time.Duration
}

// New loads ckpt and makes one engine on it; the weights go with the engine.
func New(ckpt *model.Checkpoint, opts Options) (*Engine, error) {
	w, err := LoadWeights(ckpt, opts)
	if err != nil {
		return nil, err
	}
	defer w.Release() // the engine holds its own reference
	return NewEngine(w, opts)
}

// NewEngine makes an engine on shared weights (Device and DType come from w).
func NewEngine(w *Weights, opts Options) (*Engine, error) {
	opts = opts.withDefaults()
	switch {
	case w == nil:
		return nil, errors.New("cuda: NewEngine: nil weights")
	case opts.TokensPerBlock < 1:
		return nil, fmt.Errorf("cuda: NewEngine: TokensPerBlock %d must be at least 1", opts.TokensPerBlock)
	case opts.NumBlocks < 0:
		return nil, fmt.Errorf("cuda: NewEngine: NumBlocks %d must not be negative", opts.NumBlocks)
	case opts.NumBlocks == 0 && !(opts.KVFreeFraction > 0 && opts.KVFreeFraction <= 1):
		return nil, fmt.Errorf("cuda: NewEngine: KVFreeFraction %g must be in (0, 1]", opts.KVFreeFraction)
	case opts.MaxTokens < 1 || opts.MaxSeqs < 1 || opts.MaxLogitRows < 1:
		return nil, fmt.Errorf("cuda: NewEngine: MaxTokens %d, MaxSeqs %d and MaxLogitRows %d must be at least 1", opts.MaxTokens, opts.MaxSeqs, opts.MaxLogitRows)
	}
	e := &Engine{lib: w.lib, opts: opts, calls: make(chan func()), done: make(chan struct{})}
	go e.loop()
	var err error
	e.call(func() {
		p := C.gollm_engine_params{
			tokens_per_block: C.int32_t(opts.TokensPerBlock), num_blocks: C.int32_t(opts.NumBlocks),
			kv_free_fraction: C.float(opts.KVFreeFraction), max_tokens: C.int32_t(opts.MaxTokens),
			max_seqs: C.int32_t(opts.MaxSeqs), max_logit_rows: C.int32_t(opts.MaxLogitRows),
		}
		if !opts.DisableCUDAGraphs {
			p.cuda_graphs = 1
		}
		if !opts.SkipWarmup {
			p.warmup = 1
		}
		var info C.gollm_engine_info
		var st C.gollm_status
		err = statusErr("gollm_engine_create", C.call_engine_create(e.lib.engineCreate, w.ptr, &p, &e.ptr, &info, &st), &st)
		if err == nil {
			e.DeviceName = C.GoString(&info.device_name[0])
			e.WeightBytes, e.KVBytes, e.ScratchBytes = int64(info.weight_bytes), int64(info.kv_bytes), int64(info.scratch_bytes)
			e.info.NumBlocks = int(info.num_blocks)
			e.info.TokensPerBlock = int(info.tokens_per_block)
			e.WarmupGEMMShapes, e.WarmupGraphs = int(info.warmup_gemm_shapes), int(info.warmup_graphs)
			e.WarmupTime = time.Duration(float64(info.warmup_ms) * float64(time.Millisecond))
		}
	})
	if err != nil {
		close(e.calls)
		<-e.done
		return nil, err
	}
	cfg := w.cfg
	e.info.Arch = "gpt2"
	e.info.VocabSize = cfg.VocabSize
	e.info.MaxSeqLen = cfg.MaxPositions
	e.info.Layers, e.info.KVHeads, e.info.HeadDim = cfg.Layers, cfg.KVHeads, cfg.HeadDim
	e.info.EndID = cfg.EOSID
	if e.info.EndID >= int32(cfg.VocabSize) {
		e.info.EndID = -1
	}
	e.prep.init(cfg.VocabSize)
	e.check = engine.NewBatchChecker(e.info, "cuda")
	opts.Logger.Info("gpu engine ready", zap.String("device", e.DeviceName), zap.Int("kv_blocks", e.info.NumBlocks),
		zap.Int("tokens_per_block", e.info.TokensPerBlock), zap.Int64("weight_bytes", e.WeightBytes),
		zap.Int64("kv_bytes", e.KVBytes), zap.Int64("scratch_bytes", e.ScratchBytes),
		zap.Int("warmup_gemm_shapes", e.WarmupGEMMShapes), zap.Int("warmup_graphs", e.WarmupGraphs),
		zap.Duration("warmup", e.WarmupTime))
	return e, nil
}

// loop runs the library calls on one locked OS thread until calls is closed.
func (e *Engine) loop() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(e.done)
	for f := range e.calls {
		f()
	}
}

// call runs f on the locked goroutine and waits for it.
func (e *Engine) call(f func()) {
	ch := make(chan struct{})
	e.calls <- func() {
		defer close(ch)
		f()
	}
	<-ch
}

// Info describes the model and the KV pool.
func (e *Engine) Info() engine.Info { return e.info }

// Close frees the engine's device memory and its reference to the weights.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	e.call(func() { C.call_engine_destroy(e.lib.engineDestroy, e.ptr) })
	e.ptr = nil
	close(e.calls)
	<-e.done
	return nil
}

// Step runs one iteration (engine.Engine): the batch is checked as the CPU engine checks
// it, flattened, and run in one library call, or in several when it exceeds MaxTokens or
// MaxSeqs (prompts are then split into chunks, which the KV cache joins).
func (e *Engine) Step(b *engine.Batch) ([]engine.Output, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("cuda: Step on a closed engine")
	}
	if b == nil {
		return nil, errors.New("cuda: Step: nil batch")
	}
	if _, err := e.check.Check(b); err != nil {
		return nil, err
	}
	outs := make([]engine.Output, len(b.Seqs))
	if len(b.Seqs) == 0 {
		return outs, nil
	}
	for _, part := range splitBatch(b, e.opts.MaxTokens, e.opts.MaxSeqs) {
		if err := e.runPart(b, part, outs); err != nil {
			return nil, err
		}
	}
	return outs, nil
}

// runPart runs one library call over pieces of b's sequences and fills their outputs.
func (e *Engine) runPart(b *engine.Batch, part []piece, outs []engine.Output) error {
	p := &e.prep
	p.build(b, part, e.info)
	var pin runtime.Pinner
	defer pin.Unpin()
	ptr := func(n int, first unsafe.Pointer) unsafe.Pointer {
		if n == 0 {
			return nil
		}
		pin.Pin(first)
		return first
	}
	in := &C.gollm_step_in{
		num_seqs:      C.int32_t(len(p.seqs)),
		num_tokens:    C.int32_t(len(p.tokens)),
		num_block_ids: C.int32_t(len(p.blocks)),
		num_penalties: C.int32_t(len(p.penTok)),
		num_masks:     C.int32_t(len(p.masks)),
		num_bias:      C.int64_t(len(p.bias)),
	}
	in.seqs = (*C.gollm_seq)(ptr(len(p.seqs), unsafe.Pointer(unsafe.SliceData(p.seqs))))
	in.tokens = (*C.int32_t)(ptr(len(p.tokens), unsafe.Pointer(unsafe.SliceData(p.tokens))))
	in.block_ids = (*C.int32_t)(ptr(len(p.blocks), unsafe.Pointer(unsafe.SliceData(p.blocks))))
	in.penalty_tokens = (*C.int32_t)(ptr(len(p.penTok), unsafe.Pointer(unsafe.SliceData(p.penTok))))
	in.penalty_counts = (*C.int32_t)(ptr(len(p.penCnt), unsafe.Pointer(unsafe.SliceData(p.penCnt))))
	in.mask_tokens = (*C.int32_t)(ptr(len(p.masks), unsafe.Pointer(unsafe.SliceData(p.masks))))
	in.bias = (*C.float)(ptr(len(p.bias), unsafe.Pointer(unsafe.SliceData(p.bias))))
	logits := make([]float32, p.logitsLen)
	out := &C.gollm_step_out{logits_len: C.int64_t(len(logits))}
	out.tokens = (*C.int32_t)(ptr(len(p.outTok), unsafe.Pointer(unsafe.SliceData(p.outTok))))
	out.log_probs = (*C.float)(ptr(len(p.outLP), unsafe.Pointer(unsafe.SliceData(p.outLP))))
	out.logits = (*C.float)(ptr(len(logits), unsafe.Pointer(unsafe.SliceData(logits))))
	var st C.gollm_status
	var code C.int32_t
	e.call(func() { code = C.call_step(e.lib.step, e.ptr, in, out, &st) })
	if err := statusErr("gollm_step", code, &st); err != nil {
		var ce *Error
		if errors.As(err, &ce) && ce.Code == CodeAllMasked {
			return fmt.Errorf("cuda: %s (sequence IDs of this call: %v)", ce.Message, p.ids)
		}
		return err
	}
	p.collect(b, part, logits, outs, e.info.VocabSize)
	return nil
}

package cuda

/*
#include "trampoline.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
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
	// Quantization "fp8" quantizes a float checkpoint's projections to FP8 at load
	// (model.QuantizeFP8), as an FP8 checkpoint's are stored; empty loads them as stored.
	Quantization string
	// KVDType is the KV pool's element type: engine.KVAuto keeps the compute type (two
	// bytes an element); engine.KVFP8 stores float8_e4m3fn codes (one byte: twice the
	// blocks from the same memory), each layer's keys divided by KScales[layer] and its
	// values by VScales[layer], rounded to nearest even and saturated at ±448, as the CPU
	// engine stores them.
	KVDType engine.KVDType
	// KScales and VScales are each layer's KV scales under KVFP8 (the checkpoint's k_scale
	// and v_scale); nil means 1 for every layer.
	KScales, VScales []float32
	// ExpertParallel spreads a mixture of experts' experts whole over the ranks of a
	// tensor-parallel split (LoadShard, NewTensorParallel), E/N a rank, rather than each
	// rank's units of every expert (model.Config.ExpertParallel).
	ExpertParallel bool
	// TokensPerBlock is the number of positions per KV block (default 64).
	TokensPerBlock int
	// NumBlocks sets the KV pool's size in blocks; 0 sizes it from KVFreeFraction.
	NumBlocks int
	// KVFreeFraction is the share of the GPU memory left free after the weights and the
	// scratch buffers that the KV pool takes (kv_cache_free_gpu_mem_fraction, default 0.9).
	KVFreeFraction float64
	// MemBudget, when positive (and NumBlocks 0), bounds the engine's scratch buffers and
	// KV pool together, in bytes: the pool gets what the scratch leaves, and
	// KVFreeFraction is not used (gpu_memory_utilization; engines sizes it).
	MemBudget int64
	// MaxTokens is the most new tokens one library call handles (default 8192); larger
	// batches are split into several calls.
	MaxTokens int
	// MaxSeqs is the most sequences one library call handles (default 256).
	MaxSeqs int
	// MaxLogitRows is how many LM-head rows are computed at once (default MaxSeqs);
	// context logits of longer prompts come in several passes.
	MaxLogitRows int
	// MaxSeqLen is the longest sequence the engine serves: at most the model's maximum
	// positions and 32768 (decode attention keeps a row's scores in shared memory); 0
	// means the model's maximum, at most 8192.
	MaxSeqLen int
	// DisableCUDAGraphs runs every step kernel by kernel instead of replaying graphs (decode
	// steps' by batch bucket, prompt steps' by padded shape).
	DisableCUDAGraphs bool
	// SkipWarmup returns the engine without its warm-up (every padded cuBLAS shape called
	// once, its cuBLASLt algorithms timed where the process has not timed them, up to 4 s;
	// every decode graph captured). Served engines warm up:
	// otherwise the first step of each new token count or batch bucket pays milliseconds.
	SkipWarmup bool
	// BatchInvariant makes a sequence's logits bitwise independent of the rest of its
	// step (cuda/README.md's guarantee): every projection then takes the tiled kernel at
	// every row count, which costs decode speed, so it is the model's choice
	// (batch_invariant), off by default.
	BatchInvariant bool
	// Tuning turns kernel paths off, for A/B tests; the zero value keeps every path the
	// GPU has.
	Tuning Tuning
	// Library is the path of libgollm_cuda.so; "" searches as the package doc says.
	Library string
	// Logger receives load and sizing messages; nil discards them.
	Logger *zap.Logger
}

// Tuning selects the CUDA engine's kernel paths (gollm_tuning). The paths give the same
// results within rounding; these exist to measure one against another. The zero value
// keeps every default, batch invariance included; the other switches and the row limits
// move the paths of an engine without it (NoInvariant).
type Tuning struct {
	// NoPDL turns programmatic dependent launch off (sm_90 and later use it).
	NoPDL bool
	// NoBulk stages the decode kernels' weights with cp.async instead of bulk (TMA) copies.
	NoBulk bool
	// NoFused runs decode steps' MLP as two gemv kernels instead of one.
	NoFused bool
	// NoGrouped runs decode attention a block per query head instead of per KV head.
	NoGrouped bool
	// NoStream runs few-row steps without the streaming gemv kernels: on the staged gemv
	// and fused MLP kernels (hidden up to 1024), or cuBLAS (wider models).
	NoStream bool
	// NoTiled runs the steps the tiled tensor-core projections take (5–16 rows on models
	// up to 1024 wide) on cuBLAS instead.
	NoTiled bool
	// NoPromptGraphs runs every step that is not decode-only kernel by kernel, instead of
	// replaying a graph of its padded shape.
	NoPromptGraphs bool
	// NoCtxMMA runs context attention on the WMMA kernel instead of the mma.sync one.
	NoCtxMMA bool
	// NoInvariant turns batch invariance off where Options.BatchInvariant asks for it
	// (cuda/README.md): projections then take the
	// kernel that suits the step's row count (the streaming and staged gemv, the fused
	// MLP, cuBLAS) and decode attention splits by the batch, so that a sequence's results
	// depend, within rounding, on what runs beside it. NoTiled turns it off too.
	NoInvariant bool
	// GemvRows is the most token rows on the staged gemv path (0..8); 0 keeps the default
	// (4 on models up to 1024 wide), and a negative value turns the path off.
	GemvRows int
	// TiledRows is the most token rows on the tiled projections (0..64); 0 keeps the
	// default (16 on models up to 1024 wide), and a negative value turns the path off.
	TiledRows int
	// TileBlocks makes the tiled launches aim at that many blocks a multiprocessor (1..4);
	// 0 keeps 1.
	TileBlocks int
	// DecodeParts splits decode attention that many ways at every batch size (1..16); 0
	// splits by the rows and their lengths.
	DecodeParts int
	// NoBLASLt runs the GEMMs of steps past the tiled rows through cublasGemmEx's default
	// algorithm instead of cuBLASLt with an algorithm timed per shape at the warm-up, and
	// FP8 weights' projections on gollm's weight-only kernels at every row count instead
	// of cuBLASLt's block-scaled FP8 GEMMs, which round the activations to e4m3 too.
	NoBLASLt bool
	// NoCustomAllReduce all-reduces tensor parallelism's sums with NCCL in fp32 instead of
	// the custom all-reduce over peer access (fused with the residual add and the norm).
	NoCustomAllReduce bool
	// AllReduceBytes is the largest payload (rows × hidden × 2 bytes) the custom
	// all-reduce takes (up to 4 MiB); 0 keeps 1 MiB. Larger ones go to NCCL.
	AllReduceBytes int
	// AllReduceTimeout is how long the custom all-reduce waits for a peer before the step
	// fails and the communicators are aborted (1 ms to 10 min); 0 keeps 20 s.
	AllReduceTimeout time.Duration
	// NoTPCandidates samples tensor parallelism's decode steps from the gathered
	// vocabulary instead of each rank's candidates (greedy rows: its maximum; sampled rows
	// with top-k up to 64 and nothing else that reads the whole row: its first 64).
	NoTPCandidates bool
	// AllReduceTwoBytes is the payload (rows × hidden × 2 bytes) from which the custom
	// all-reduce runs in two shots (each rank sums a slice of the rows, then gathers the
	// others' sums; up to 4 MiB); 0 or a negative value never: the one-shot measured
	// faster at every size at 2 and 4 ranks.
	AllReduceTwoBytes int
	// Skip leaves the stage kinds of its bits (1 << model.StageKind) out of every step, so
	// that a step's time without them says what they cost in place; the results are
	// wrong. Only a library built with GOLLM_MEASURE takes it.
	Skip int
}

// tuning is opts.Tuning with invariance off unless the engine asks for it.
func (opts Options) tuning() Tuning {
	t := opts.Tuning
	t.NoInvariant = t.NoInvariant || !opts.BatchInvariant
	return t
}

// TuningFromEnv reads the measuring switches, so that benchmarks and the GPU checks can
// compare kernel paths without a rebuild: GOLLM_CUDA_PDL=0, GOLLM_CUDA_BULK=0,
// GOLLM_CUDA_FUSED=0, GOLLM_CUDA_GROUPED=0, GOLLM_CUDA_STREAM=0, GOLLM_CUDA_TILED=0,
// GOLLM_CUDA_PROMPT_GRAPHS=0, GOLLM_CUDA_CTX_MMA=0, GOLLM_CUDA_INVARIANT=0, GOLLM_CUDA_CUSTOM_AR=0,
// GOLLM_CUDA_BLASLT=0 and GOLLM_CUDA_TP_CANDIDATES=0 turn a path off; GOLLM_CUDA_AR_BYTES=n
// sets the custom all-reduce's largest payload and GOLLM_CUDA_AR_TWO_BYTES=n the payload
// from which it runs in two shots (0, the default: never);
// GOLLM_CUDA_GEMV_ROWS=n and GOLLM_CUDA_TILED_ROWS=n (0: off), GOLLM_CUDA_TILE_BLOCKS=k,
// GOLLM_CUDA_DECODE_PARTS=n and GOLLM_CUDA_SKIP=bits set the numbers. The backend never
// reads them.
func TuningFromEnv() Tuning {
	off := func(name string) bool { v := os.Getenv(name); return v != "" && v[0] == '0' }
	num := func(name string, zero int) int {
		n, err := strconv.Atoi(os.Getenv(name))
		switch {
		case err != nil:
			return 0
		case n == 0:
			return zero
		}
		return n
	}
	return Tuning{NoPDL: off("GOLLM_CUDA_PDL"), NoBulk: off("GOLLM_CUDA_BULK"), NoFused: off("GOLLM_CUDA_FUSED"),
		NoGrouped: off("GOLLM_CUDA_GROUPED"), NoStream: off("GOLLM_CUDA_STREAM"),
		NoTiled: off("GOLLM_CUDA_TILED"), NoPromptGraphs: off("GOLLM_CUDA_PROMPT_GRAPHS"),
		NoCtxMMA: off("GOLLM_CUDA_CTX_MMA"), NoInvariant: off("GOLLM_CUDA_INVARIANT"), GemvRows: num("GOLLM_CUDA_GEMV_ROWS", -1),
		TiledRows: num("GOLLM_CUDA_TILED_ROWS", -1), TileBlocks: num("GOLLM_CUDA_TILE_BLOCKS", 0),
		DecodeParts: num("GOLLM_CUDA_DECODE_PARTS", 0), Skip: num("GOLLM_CUDA_SKIP", 0),
		NoCustomAllReduce: off("GOLLM_CUDA_CUSTOM_AR"), AllReduceBytes: num("GOLLM_CUDA_AR_BYTES", 0),
		NoBLASLt: off("GOLLM_CUDA_BLASLT"), AllReduceTwoBytes: num("GOLLM_CUDA_AR_TWO_BYTES", 0),
		NoTPCandidates: off("GOLLM_CUDA_TP_CANDIDATES")}
}

// c is t as gollm_tuning.
func (t Tuning) c() C.gollm_tuning {
	out := C.gollm_tuning{gemv_rows: -1, tiled_rows: -1, tile_blocks: C.int32_t(t.TileBlocks),
		decode_parts: C.int32_t(t.DecodeParts), skip: C.int32_t(t.Skip)}
	for _, b := range []struct {
		on  bool
		bit C.int32_t
	}{{t.NoPDL, C.GOLLM_TUNING_NO_PDL}, {t.NoBulk, C.GOLLM_TUNING_NO_BULK}, {t.NoFused, C.GOLLM_TUNING_NO_FUSED},
		{t.NoGrouped, C.GOLLM_TUNING_NO_GROUPED}, {t.NoStream, C.GOLLM_TUNING_NO_STREAM},
		{t.NoTiled, C.GOLLM_TUNING_NO_TILED}, {t.NoPromptGraphs, C.GOLLM_TUNING_NO_PROMPT_GRAPHS},
		{t.NoCtxMMA, C.GOLLM_TUNING_NO_CTX_MMA}, {t.NoCustomAllReduce, C.GOLLM_TUNING_NO_CUSTOM_AR},
		{t.NoInvariant, C.GOLLM_TUNING_NO_INVARIANT}, {t.NoBLASLt, C.GOLLM_TUNING_NO_BLASLT},
		{t.NoTPCandidates, C.GOLLM_TUNING_NO_TP_CANDIDATES}} {
		if b.on {
			out.off |= b.bit
		}
	}
	rows := func(n int) C.int32_t {
		switch {
		case n < 0:
			return 0
		case n > 0:
			return C.int32_t(n)
		}
		return -1
	}
	out.gemv_rows, out.tiled_rows = rows(t.GemvRows), rows(t.TiledRows)
	out.allreduce_bytes = C.int32_t(min(max(t.AllReduceBytes, 0), 1<<30))
	out.allreduce_two_bytes = C.int32_t(min(max(t.AllReduceTwoBytes, -1), 1<<30))
	if t.AllReduceTimeout > 0 {
		out.allreduce_timeout_ms = C.int32_t(min(max(t.AllReduceTimeout.Milliseconds(), 1), 1<<30))
	}
	return out
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
	case "F8_E4M3":
		return C.GOLLM_DTYPE_F8E4M3, true
	}
	return 0, false
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
	// dir is the checkpoint folder they were read from.
	dir string
	// tpSize and tpRank place a share of a tensor-parallel split (LoadShard): rank tpRank
	// of tpSize; tpSize is 1 for a whole model. ep says the split's experts are whole, a
	// rank's E/tpSize of them (Options.ExpertParallel).
	tpSize, tpRank int
	ep             bool
	// once makes Release idempotent.
	once sync.Once
}

// The roles follow the model package's too.
var (
	_ [int(C.GOLLM_ROLES) - int(model.NumRoles)]struct{}
	_ [int(model.NumRoles) - int(C.GOLLM_ROLES)]struct{}
	_ [int(C.GOLLM_FIRST_LAYER_ROLE) - int(model.FirstLayerRole)]struct{}
	_ [int(model.FirstLayerRole) - int(C.GOLLM_FIRST_LAYER_ROLE)]struct{}
)

// kvScales lays k and v (one a layer, or nil: 1) out as gollm_engine_params.kv_scales
// takes them: [layers][2], key then value.
func kvScales(k, v []float32, layers int) []C.float {
	out := make([]C.float, 2*layers)
	for l := range layers {
		out[2*l], out[2*l+1] = C.float(engine.Scale(k, l)), C.float(engine.Scale(v, l))
	}
	return out
}

// descriptor translates the model's shapes into gollm_model_config.
func descriptor(c *model.Config) C.gollm_model_config {
	d := C.gollm_model_config{
		vocab_size: C.int32_t(c.VocabSize), max_positions: C.int32_t(c.MaxPositions), hidden: C.int32_t(c.Hidden),
		layers: C.int32_t(c.Layers), heads: C.int32_t(c.Heads), kv_heads: C.int32_t(c.KVHeads),
		head_dim: C.int32_t(c.HeadDim), inner: C.int32_t(c.Inner), norm: normCode(c.Norm),
		gated_mlp: cbool(c.GatedMLP), tied_head: cbool(c.TiedHead), positions: C.GOLLM_POS_LEARNED,
		qk_norm: cbool(c.QKNorm), post_norms: cbool(c.PostNorms),
	}
	if c.Positions == model.RotaryPositions {
		d.positions = C.GOLLM_POS_ROTARY
	}
	if m := c.MoE; m != nil {
		d.experts, d.moe_inner, d.shared_inner = C.int32_t(m.Experts), C.int32_t(m.Inner), C.int32_t(m.SharedInner)
		d.expert_first, d.local_experts = C.int32_t(m.FirstLocal), C.int32_t(m.Local)
	}
	return d
}

// LoadWeights copies ckpt's weights onto opts.Device, converted to opts.DType: every
// role of the checkpoint's architecture, as model.Checkpoint.Weights resolves and checks
// them. The checkpoint may be closed afterwards. Only Device, DType, Library and Logger of
// opts are read.
func LoadWeights(ckpt *model.Checkpoint, opts Options) (*Weights, error) {
	return LoadShard(ckpt, 1, 0, opts)
}

// LoadShard copies rank's share of ckpt's weights under tensor parallelism over size
// ranks onto opts.Device, as LoadWeights copies the whole (size 1): model.ShardWeights'
// split — its heads, KV heads, MLP units and vocabulary rows — except that every rank
// holds the whole attention-output and MLP-down biases, which the GPU adds once, after
// the all-reduce of the ranks' partial sums; with opts.ExpertParallel its E/size experts
// whole (model.Config.ExpertParallel). NewTensorParallelEngine runs the shares.
func LoadShard(ckpt *model.Checkpoint, size, rank int, opts Options) (*Weights, error) {
	opts = opts.withDefaults()
	if ckpt == nil {
		return nil, errors.New("cuda: LoadWeights: nil checkpoint")
	}
	cfg := ckpt.Config
	dt, err := dtypeCode(opts.DType)
	if err != nil {
		return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
	}
	ws, err := ckpt.Weights()
	if err != nil {
		return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
	}
	if ws, err = fp8Weights(ws, ckpt, size, opts); err != nil {
		return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
	}
	rankCfg := cfg
	if size != 1 {
		l, err := cfg.Parallel(size, opts.ExpertParallel)
		if err != nil {
			return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
		}
		if ws, err = shardWeights(ws, &cfg, l, rank); err != nil {
			return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
		}
		rankCfg = cfg.RankConfig(l, rank)
	}
	rec, err := recipeOf(&rankCfg)
	if err != nil {
		return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
	}
	flt, err := faultsFromEnv()
	if err != nil {
		return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
	}
	l, err := openLib(opts.Library)
	if err != nil {
		return nil, err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	var parts []C.gollm_weight
	for _, w := range ws {
		for _, p := range w.Parts {
			code, ok := tensorDType(p.Tensor.DType)
			if !ok || len(p.Tensor.Data) == 0 {
				return nil, fmt.Errorf("cuda: load %s: %s: dtype %s with %d bytes", ckpt.Dir, &w, p.Tensor.DType, len(p.Tensor.Data))
			}
			pin.Pin(&p.Tensor.Data[0])
			t := C.gollm_tensor{data: unsafe.Pointer(&p.Tensor.Data[0]), rows: C.int64_t(p.Rows),
				cols: C.int64_t(w.Cols), dtype: code}
			if p.Transposed {
				t.transposed = 1
			}
			if p.Scale != nil {
				if len(p.Scale.Data) == 0 || p.Scale.DType != "F32" || len(p.Tensor.Data) != p.Rows*w.Cols {
					return nil, fmt.Errorf("cuda: load %s: %s: FP8 part of %d bytes with %s scales of %d bytes", ckpt.Dir, &w, len(p.Tensor.Data), p.Scale.DType, len(p.Scale.Data))
				}
				pin.Pin(&p.Scale.Data[0])
				t.scale = (*C.float)(unsafe.Pointer(&p.Scale.Data[0]))
				t.block_rows, t.block_cols = C.int32_t(p.BlockRows), C.int32_t(p.BlockCols)
			}
			parts = append(parts, C.gollm_weight{role: C.int32_t(w.Role), layer: C.int32_t(w.Layer), part: t})
		}
	}
	w, err := createWeights(l, opts.Device, dt, &rankCfg, rec, parts, flt, &pin)
	if err != nil {
		return nil, fmt.Errorf("cuda: load %s: %w", ckpt.Dir, err)
	}
	opts.Logger.Info("gpu weights loaded", zap.String("checkpoint", ckpt.Dir), zap.Int("device", opts.Device),
		zap.String("dtype", opts.DType), zap.String("family", cfg.Family), zap.String("library", l.path),
		zap.Int("tensor_parallel_rank", rank), zap.Int("tensor_parallel_size", size), zap.Bool("expert_parallel", opts.ExpertParallel))
	return &Weights{lib: l, ptr: w, cfg: cfg, device: opts.Device, dtype: opts.DType, dir: ckpt.Dir, tpSize: size, tpRank: rank,
		ep: opts.ExpertParallel && size != 1}, nil
}

// createWeights calls gollm_weights_create with the shapes of cfg, its recipe rec, the
// weights' pieces (pinned by the caller; their data too) and the injected faults.
func createWeights(l *lib, device int, dt C.int32_t, cfg *model.Config, rec cRecipe, parts []C.gollm_weight,
	flt faults, pin *runtime.Pinner) (*C.gollm_weights, error) {
	p := &C.gollm_weights_params{device: C.int32_t(device), dtype: dt, config: descriptor(cfg),
		num_weights: C.int32_t(len(parts)), num_stages: C.int32_t(len(rec.stages)),
		num_rope_freqs: C.int32_t(len(rec.freqs)), faults: flt.c()}
	defer freeFaults(&p.faults)
	if len(parts) > 0 {
		pin.Pin(&parts[0])
		p.weights = &parts[0]
	}
	if len(rec.stages) > 0 {
		pin.Pin(&rec.stages[0])
		p.stages = &rec.stages[0]
	}
	if len(rec.freqs) > 0 {
		pin.Pin(&rec.freqs[0])
		p.rope_freqs = (*C.float)(unsafe.Pointer(&rec.freqs[0]))
	}
	var w *C.gollm_weights
	var st C.gollm_status
	if err := statusErr("gollm_weights_create", C.call_weights_create(l.weightsCreate, p, &w, &st), &st); err != nil {
		return nil, err
	}
	return w, nil
}

// shardWeights is rank's share of ws for the GPU engine: model.ShardWeights (one share
// per weight, in ws's order), with the whole attention-output and MLP-down biases on
// every rank. The GPU all-reduces the projections' fp32 outputs and adds the bias after
// (the residual add and norm that follow run alike on every rank), where the CPU
// reference sums partials that include the bias, kept by rank 0 alone.
func shardWeights(ws []model.Weight, cfg *model.Config, l model.TPLayout, rank int) ([]model.Weight, error) {
	s, err := model.ShardWeights(ws, cfg, l, rank)
	if err != nil {
		return nil, err
	}
	if len(s) != len(ws) {
		return nil, fmt.Errorf("tensor parallel rank %d: %d shares of %d weights", rank, len(s), len(ws))
	}
	for i := range s {
		if r := ws[i].Role; r == model.RoleOutBias || r == model.RoleDownBias {
			s[i] = ws[i]
		}
	}
	return s, nil
}

// Shard returns the tensor-parallel split the weights are a share of: size ranks (1 for a
// whole model) and their rank.
func (w *Weights) Shard() (size, rank int) { return w.tpSize, w.tpRank }

// ExpertParallel says the split's experts are whole, E/size a rank (Options.ExpertParallel).
func (w *Weights) ExpertParallel() bool { return w.ep }

// Config returns the model's configuration.
func (w *Weights) Config() model.Config { return w.cfg }

// Bytes returns the device memory the weights take.
func (w *Weights) Bytes() int64 { return int64(C.call_weights_bytes(w.lib.weightsBytes, w.ptr)) }

// Device returns the CUDA ordinal the weights are on.
func (w *Weights) Device() int { return w.device }

// Release drops the caller's reference; the memory goes when the engines on w are closed
// too. Calling it again does nothing.
func (w *Weights) Release() {
	w.once.Do(func() { C.call_weights_release(w.lib.weightsRelease, w.ptr) })
}

// Engine is a GPU engine: engine.Engine over the CUDA library. Each library call sets its
// device itself and an engine is used by one call at a time (Step and Close take its
// mutex), so any goroutine may call it; one iteration is one cgo call.
type Engine struct {
	// lib is the library in use.
	lib *lib
	// ptr is the gollm_engine handle; nil once closed.
	ptr *C.gollm_engine
	// info is what Info returns.
	info engine.Info
	// opts are the options with defaults filled.
	opts Options
	// mu serialises Step and Close.
	mu sync.Mutex
	// closed is set by Close.
	closed bool
	// prep holds the host buffers of one step, reused.
	prep stepPrep
	// preps hold the arrays of launched calls (Launch): two, for two waiting at once.
	preps [2]stepPrep
	// queue are the launched iterations not waited for, oldest first.
	queue []*launchRec
	// check validates each batch's structure as every engine does.
	check *engine.BatchChecker
	// verifier decides the tokens of sequences with proposals; nil on a tensor-parallel
	// rank.
	verifier *engine.Sampler
	// rank is the engine's tensor-parallel rank (0 on one GPU): a rank past 0 gets no
	// logits back (rank 0's are every rank's).
	rank int
	// DeviceName is the GPU's name.
	DeviceName string
	// Device describes the GPU (its memory as at the engine's creation).
	Device DeviceInfo
	// WeightBytes, KVBytes and ScratchBytes are the device memory in use.
	WeightBytes, KVBytes, ScratchBytes int64
	// WarmupGEMMShapes and WarmupGraphs count what the warm-up readied, in WarmupTime;
	// WarmupGEMMTuned counts the shapes whose cuBLASLt algorithms it timed, in
	// WarmupTuneTime (part of WarmupTime; none where the process had timed them before).
	WarmupGEMMShapes, WarmupGraphs, WarmupGEMMTuned int
	WarmupTime, WarmupTuneTime                      time.Duration
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
	if w != nil && w.tpSize > 1 {
		return nil, fmt.Errorf("cuda: NewEngine: the weights are rank %d's share of a %d-way tensor-parallel split; NewTensorParallelEngine runs them", w.tpRank, w.tpSize)
	}
	return newEngine(w, opts, nil)
}

// newEngine makes an engine on w; with comm, the engine of w's tensor-parallel rank on
// those communicators (every rank's at the same time: NewTensorParallelEngine).
func newEngine(w *Weights, opts Options, comm *C.gollm_comm) (*Engine, error) {
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
	case opts.MaxSeqLen < 0:
		return nil, fmt.Errorf("cuda: NewEngine: MaxSeqLen %d must not be negative", opts.MaxSeqLen)
	case opts.MemBudget < 0:
		return nil, fmt.Errorf("cuda: NewEngine: MemBudget %d must not be negative", opts.MemBudget)
	case opts.KVDType != engine.KVAuto && opts.KVDType != engine.KVFP8:
		return nil, fmt.Errorf("cuda: NewEngine: KVDType %d is neither auto nor fp8", opts.KVDType)
	}
	kv := engine.KVConfig{KScales: opts.KScales, VScales: opts.VScales}
	if err := kv.CheckScales(w.cfg.Layers); err != nil {
		return nil, fmt.Errorf("cuda: NewEngine: %w", err)
	}
	e := &Engine{lib: w.lib, opts: opts}
	p := C.gollm_engine_params{
		tokens_per_block: C.int32_t(opts.TokensPerBlock), num_blocks: C.int32_t(opts.NumBlocks),
		kv_free_fraction: C.float(opts.KVFreeFraction), max_tokens: C.int32_t(opts.MaxTokens),
		max_seqs: C.int32_t(opts.MaxSeqs), max_logit_rows: C.int32_t(opts.MaxLogitRows),
		max_seq_len: C.int32_t(opts.MaxSeqLen), mem_budget: C.int64_t(opts.MemBudget),
		tuning: opts.tuning().c(),
	}
	if comm != nil {
		p.comm, p.tp_rank, p.tp_vocab = comm, C.int32_t(w.tpRank), C.int32_t(w.cfg.VocabSize)
		e.rank = w.tpRank
	}
	// The library copies the scales at creation: Go memory, pinned for the call.
	var pin runtime.Pinner
	defer pin.Unpin()
	if opts.KVDType == engine.KVFP8 {
		p.kv_dtype = C.GOLLM_DTYPE_F8E4M3
		if opts.KScales != nil || opts.VScales != nil {
			scales := kvScales(opts.KScales, opts.VScales, w.cfg.Layers)
			pin.Pin(&scales[0])
			p.kv_scales = &scales[0]
		}
	}
	if !opts.DisableCUDAGraphs {
		p.cuda_graphs = 1
	}
	if !opts.SkipWarmup {
		p.warmup = 1
	}
	flt, err := faultsFromEnv()
	if err != nil {
		return nil, fmt.Errorf("cuda: NewEngine: %w", err)
	}
	p.faults = flt.c()
	defer freeFaults(&p.faults)
	var info C.gollm_engine_info
	var st C.gollm_status
	if err := statusErr("gollm_engine_create", C.call_engine_create(e.lib.engineCreate, w.ptr, &p, &e.ptr, &info, &st), &st); err != nil {
		return nil, err
	}
	e.DeviceName = C.GoString(&info.device_name[0])
	e.Device = DeviceInfo{Ordinal: w.device, Name: e.DeviceName}
	var d C.gollm_device_info
	if err := statusErr("gollm_device_describe", C.call_device_info(e.lib.deviceInfo, C.int32_t(w.device), &d, &st), &st); err == nil {
		e.Device.UUID, e.Device.PCIBusID = C.GoString(&d.uuid[0]), C.GoString(&d.pci_bus_id[0])
		e.Device.Free, e.Device.Total = int64(d.free_bytes), int64(d.total_bytes)
	}
	e.WeightBytes, e.KVBytes, e.ScratchBytes = int64(info.weight_bytes), int64(info.kv_bytes), int64(info.scratch_bytes)
	e.WarmupGEMMShapes, e.WarmupGraphs = int(info.warmup_gemm_shapes), int(info.warmup_graphs)
	e.WarmupTime = time.Duration(float64(info.warmup_ms) * float64(time.Millisecond))
	e.WarmupGEMMTuned = int(info.warmup_gemm_tuned)
	e.WarmupTuneTime = time.Duration(float64(info.warmup_gemm_tune_ms) * float64(time.Millisecond))
	cfg := w.cfg
	e.info = engine.Info{
		VocabSize: cfg.VocabSize, MaxSeqLen: int(info.max_seq_len),
		Layers: cfg.Layers, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim,
		NumBlocks: int(info.num_blocks), TokensPerBlock: int(info.tokens_per_block),
		EndIDs: cfg.EOSIDs,
	}
	if comm == nil {
		// Proposals are verified in rows sampled on the GPU, or on the host from their rows'
		// logits (verifyDrafts); a tensor-parallel rank's engine has none of its own to
		// verify with.
		e.info.MaxDraft = engine.MaxDraftTokens
		e.verifier = engine.NewSampler(cfg.VocabSize)
	}
	e.prep.init(cfg.VocabSize)
	e.preps[0].init(cfg.VocabSize)
	e.preps[1].init(cfg.VocabSize)
	e.check = engine.NewBatchChecker(e.info, "cuda")
	opts.Logger.Info("gpu engine ready", zap.String("device", e.DeviceName), zap.String("uuid", e.Device.UUID), zap.Int("kv_blocks", e.info.NumBlocks),
		zap.Stringer("kv_cache_dtype", opts.KVDType),
		zap.Int("tokens_per_block", e.info.TokensPerBlock), zap.Int("max_seq_len", e.info.MaxSeqLen),
		zap.Int64("weight_bytes", e.WeightBytes), zap.Int64("kv_bytes", e.KVBytes), zap.Int64("scratch_bytes", e.ScratchBytes),
		zap.Int("warmup_gemm_shapes", e.WarmupGEMMShapes), zap.Int("warmup_graphs", e.WarmupGraphs),
		zap.Duration("warmup", e.WarmupTime), zap.Int("warmup_gemm_tuned", e.WarmupGEMMTuned),
		zap.Duration("warmup_gemm_tune", e.WarmupTuneTime))
	return e, nil
}

// Info describes the model and the KV pool.
func (e *Engine) Info() engine.Info { return e.info }

// Recover readies the engine after a failed Step (engine.Recoverer): the library waits
// for the failed step's work and resets what it left half done. An error means the CUDA
// context is lost; the engine must not be stepped again.
func (e *Engine) Recover(cause error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("cuda: Recover on a closed engine")
	}
	// The library forgets its launched calls; so does the queue.
	e.queue = e.queue[:0]
	var st C.gollm_status
	if err := statusErr("gollm_engine_reset", C.call_engine_reset(e.lib.engineReset, e.ptr, &st), &st); err != nil {
		e.opts.Logger.Error("gpu engine lost", zap.String("device", e.DeviceName), zap.NamedError("cause", cause), zap.Error(err))
		return err
	}
	e.opts.Logger.Warn("gpu engine recovered from a failed step", zap.String("device", e.DeviceName), zap.Error(cause))
	return nil
}

// Close frees the engine's device memory and its reference to the weights.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	C.call_engine_destroy(e.lib.engineDestroy, e.ptr)
	e.ptr = nil
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
	if len(e.queue) > 0 {
		return nil, fmt.Errorf("cuda: Step with %d launched iterations not waited for", len(e.queue))
	}
	if _, err := e.check.Check(b); err != nil {
		return nil, err
	}
	return e.stepParts(b, splitBatch(b, e.opts.MaxTokens, e.opts.MaxSeqs))
}

// stepParts runs b's library calls one after the other, each waited for.
func (e *Engine) stepParts(b *engine.Batch, parts [][]piece) ([]engine.Output, error) {
	outs := make([]engine.Output, len(b.Seqs))
	if len(b.Seqs) == 0 {
		return outs, nil
	}
	for i, part := range parts {
		// The block copies go with the first call, ahead of every forward pass.
		var copies []engine.BlockCopy
		if i == 0 {
			copies = b.BlockCopies
		}
		if err := e.runPart(b, part, copies, outs); err != nil {
			return nil, err
		}
	}
	if err := e.verifyDrafts(b, outs, parts); err != nil {
		return nil, err
	}
	return outs, nil
}

// verifyDrafts decides the tokens of b's sequences with proposals that were not
// verified in rows on the GPU (parts' pieces say which were: collect accepted those)
// from the logits of their rows, which the step returned as context logits, by the
// rules every engine follows (engine.Sampler.Verify): proposals drawn from a
// distribution, or rows whose logits are asked for, at the cost of copying Draft+1 rows
// of logits back per such sequence.
func (e *Engine) verifyDrafts(b *engine.Batch, outs []engine.Output, parts [][]piece) error {
	V := e.info.VocabSize
	onGPU := func(i int) bool {
		for _, part := range parts {
			for _, pc := range part {
				if pc.seq == i {
					return pc.rows
				}
			}
		}
		return false
	}
	for i := range b.Seqs {
		sq := &b.Seqs[i]
		if sq.Draft == 0 || onGPU(i) {
			continue
		}
		o := &outs[i]
		all := o.ContextLogits
		o.ContextLogits = nil
		if e.verifier == nil || len(all) != len(sq.Tokens)*V {
			return fmt.Errorf("cuda: sequence %d: %d logits for %d rows to verify", sq.ID, len(all), len(sq.Tokens))
		}
		first := len(sq.Tokens) - sq.Draft - 1
		rows := make([][]float32, sq.Draft+1)
		for r := range rows {
			at := (first + r) * V
			rows[r] = all[at : at+V : at+V]
		}
		if err := e.verifier.Verify(rows, sq, o); err != nil {
			if errors.Is(err, engine.ErrAllMasked) {
				// The sequence's own failure (Output.Err): the rest of the batch goes on.
				o.Token, o.Err = -1, fmt.Errorf("cuda: sequence %d: %w", sq.ID, err)
				continue
			}
			return fmt.Errorf("cuda: sequence %d: %w", sq.ID, err)
		}
	}
	return nil
}

// runPart runs one library call over pieces of b's sequences and fills their outputs.
func (e *Engine) runPart(b *engine.Batch, part []piece, copies []engine.BlockCopy, outs []engine.Output) error {
	p := &e.prep
	p.build(b, part, e.info)
	p.copies = p.copies[:0]
	for _, c := range copies {
		p.copies = append(p.copies, c.Src, c.Dst)
	}
	p.feed = p.feed[:0]
	var pin runtime.Pinner
	defer pin.Unpin()
	in := p.stepIn(&pin)
	logits := e.logitsBuffer(p.logitsLen)
	out := p.stepOut(&pin, logits, p.logitsLen)
	var st C.gollm_status
	if err := statusErr("gollm_step", C.call_step(e.lib.step, e.ptr, in, out, &st), &st); err != nil {
		return err
	}
	p.collect(b, part, logits, outs, e.info.VocabSize)
	return nil
}

// logitsBuffer is where a call's n floats of returned logits land: none on a
// tensor-parallel rank past 0, whose library call copies none back.
func (e *Engine) logitsBuffer(n int) []float32 {
	if e.rank > 0 {
		return nil
	}
	return make([]float32, n)
}

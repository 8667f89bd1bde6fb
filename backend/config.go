package main

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gollm/batchmanager"
	"gollm/engine"
	"gollm/engines"
)

// modelConfig is what gollm reads from a model's config.pbtxt (as Triton's JSON).
type modelConfig struct {
	// Name labels the model's logs, metrics and error messages.
	Name string
	// MaxBatchSize is max_batch_size: the most sequences in one iteration.
	MaxBatchSize int
	// Decoupled is model_transaction_policy.decoupled: responses may stream.
	Decoupled bool
	// ModelPath is gpt_model_path made absolute: the checkpoint folder.
	ModelPath string
	// ModelType is gpt_model_type.
	ModelType batchmanager.ModelType
	// Policy is batch_scheduler_policy.
	Policy batchmanager.SchedulerPolicy
	// MaxBeamWidth is max_beam_width: the widest beam search a request may ask for.
	MaxBeamWidth int
	// MaxTokensInPagedKVCache is max_tokens_in_paged_kv_cache, the CPU KV pool size in
	// tokens; 0 means max_batch_size × the model's maximum sequence length.
	MaxTokensInPagedKVCache int
	// KVCacheFreeGPUMemFraction is kv_cache_free_gpu_mem_fraction (GPU engine only).
	KVCacheFreeGPUMemFraction float64
	// GPUMemoryUtilization is gpu_memory_utilization: the share of a GPU's total memory
	// the model may hold there, weights included (vLLM's meaning); 0 when not set, and
	// then kv_cache_free_gpu_mem_fraction sizes the KV pool.
	GPUMemoryUtilization float64
	// GPUInstances counts the model's KIND_GPU instances on each device (instance_group;
	// under tensor parallelism an instance counts on each GPU it drives), among which
	// gpu_memory_utilization's share is split.
	GPUInstances map[int]int
	// TokensPerBlock is tokens_per_block, the positions per KV block.
	TokensPerBlock int
	// EnableKVCacheReuse is enable_kv_cache_reuse.
	EnableKVCacheReuse bool
	// EnableChunkedContext is enable_chunked_context.
	EnableChunkedContext bool
	// MaxNumTokens is max_num_tokens: the most tokens in one iteration; 0 means no limit.
	MaxNumTokens int
	// ExcludeInputInOutput is exclude_input_in_output: leave the prompt out of
	// non-streaming output_ids and text_output.
	ExcludeInputInOutput bool
	// DataType is data_type: the GPU engine's weight, activation and KV type, "float16" or
	// "bfloat16"; empty means the checkpoint's own when it is one of them, else float16.
	DataType string
	// Quantization is quantization: "fp8" quantizes a float checkpoint's projections to
	// FP8 at load (model.QuantizeFP8); empty serves the weights as stored.
	Quantization string
	// KVCacheDType is kv_cache_dtype: the KV pool's element type (engine.ParseKVDType).
	KVCacheDType engine.KVDType
	// BatchInvariant is batch_invariant: GPU engines give a sequence's logits bitwise
	// independent of what runs beside it, at a cost to speed.
	BatchInvariant bool
	// CPUWeightFormat is cpu_weight_format: how the CPU engine stores the weight matrices
	// (engines.CheckCPUWeightFormat); empty means as the checkpoint stores them.
	CPUWeightFormat string
	// ResponseSenders is response_senders: the goroutines per instance that send
	// responses to Triton (each request's in order).
	ResponseSenders int
	// MaxSeqLen is max_seq_len: the longest sequence (prompt and output) served; 0 means
	// the model's maximum positions, at most defaultMaxSeqLen.
	MaxSeqLen int
	// ShutdownGrace is shutdown_grace_secs: how long the requests in flight may go on
	// once the server is shutting down or the model unloading, before they end with an
	// error; 0 ends them at once.
	ShutdownGrace time.Duration
	// AdmissionWindow is admission_window_us: how long a request arriving at an idle
	// instance waits for others to start with (batchmanager.Config.AdmissionWindow).
	AdmissionWindow time.Duration
	// StreamInterval is stream_interval: a streaming request's responses after its first
	// carry this many tokens each (batchmanager.Config.StreamInterval).
	StreamInterval int
	// FinalFlagDelay is final_flag_delay_ms: how long at the least a streaming request's
	// final response follows its previous one (cancelfinal.go); 0: no wait.
	FinalFlagDelay time.Duration
	// TensorParallelSize is tensor_parallel_size: the GPUs one KIND_GPU instance spreads
	// the model over — the instance Triton puts on GPU d drives GPUs d to d+N-1 (NCCL).
	// Above 1, the instance groups' GPUs must start disjoint runs and no group may be
	// KIND_CPU (the CPU engine runs a model whole).
	TensorParallelSize int
	// ExpertParallel is expert_parallel: under tensor_parallel_size N, each GPU holds E/N
	// of a mixture of experts' experts whole rather than its share of every expert's units
	// (model.Config.ExpertParallel). It needs N > 1 and a model with experts.
	ExpertParallel bool
	// OverlapScheduler is overlap_scheduler: launch each iteration before the previous
	// one's outputs are read (batchmanager.Config.Overlap); nil means on for engines
	// that overlap on their own (the GPU engine), off for the others.
	OverlapScheduler *bool
	// Role is gollm_role: what the model serves — the model itself (engine, generation),
	// or, with no engine, only the tokenizer as TensorRT-LLM's preprocessing or
	// postprocessing model (tokmodel.go).
	Role modelRole
	// TokenizerDir is tokenizer_dir made absolute: where a tokenizer-only model reads
	// tokenizer.json and tokenizer_config.json; empty means ModelPath.
	TokenizerDir string
	// AddSpecialTokens is add_special_tokens (preprocessing): QUERY gets what the
	// checkpoint puts around a prompt (BOS), as text_input does.
	AddSpecialTokens bool
	// SkipSpecialTokens is skip_special_tokens (postprocessing): OUTPUT leaves special
	// tokens out, as text_output does.
	SkipSpecialTokens bool
	// Speculation is speculative decoding's settings (speculation.go); its Mode is
	// specNone when off.
	Speculation speculationConfig
	// Warnings are things to log that do not stop the load (unknown parameters).
	Warnings []string
}

// Defaults of the parameters (TensorRT-LLM's where it has the parameter).
const (
	defaultFreeGPUMemFraction = 0.9
	defaultTokensPerBlock     = 64
	// defaultResponseSenders: 1 falls behind 64 GPU streams, >4 gains nothing (bench/results/2026-11-26-senders-h100.jsonl).
	defaultResponseSenders = 4
	// defaultMaxSeqLen caps the longest sequence of a model whose context is longer, so
	// that a default KV pool and the GPU's decode attention stay modest; max_seq_len raises
	// it (the GPU engine serves up to 32768).
	defaultMaxSeqLen = 8192
)

// tritonConfig is the part of Triton's JSON model configuration gollm reads.
type tritonConfig struct {
	// Name labels the model in logs and messages.
	Name string `json:"name"`
	// MaxBatchSize is max_batch_size.
	MaxBatchSize int `json:"max_batch_size"`
	// TransactionPolicy is model_transaction_policy.
	TransactionPolicy struct {
		// Decoupled allows any number of responses per request.
		Decoupled bool `json:"decoupled"`
	} `json:"model_transaction_policy"`
	// InstanceGroup are the model's instance groups, as Triton completed them (a
	// KIND_GPU group lists its GPUs).
	InstanceGroup []struct {
		// Kind is KIND_CPU, KIND_GPU, ….
		Kind string `json:"kind"`
		// Count is the group's instances per listed GPU (or in all, off the GPU).
		Count int `json:"count"`
		// GPUs lists the CUDA devices of a KIND_GPU group.
		GPUs []int `json:"gpus"`
	} `json:"instance_group"`
	// Parameters are the model's parameters, each with a string_value.
	Parameters map[string]struct {
		// StringValue holds every gollm parameter's value; parsing it is paramSpec's job.
		StringValue string `json:"string_value"`
	} `json:"parameters"`
}

// paramSpec describes one parameter: its name and how to apply its value.
type paramSpec struct {
	// name is spelled as in TensorRT-LLM's config.pbtxt.
	name string
	// set parses a value (never "") into the config.
	set func(c *modelConfig, v string) error
}

// params are the parameters gollm knows, TensorRT-LLM's names.
var params = []paramSpec{
	{"gpt_model_path", func(c *modelConfig, v string) error { c.ModelPath = v; return nil }},
	{"gpt_model_type", func(c *modelConfig, v string) error {
		t, err := oneOf(v, batchmanager.V1, batchmanager.InflightBatching, batchmanager.InflightFusedBatching)
		c.ModelType = t
		return err
	}},
	{"batch_scheduler_policy", func(c *modelConfig, v string) error {
		p, err := oneOf(v, batchmanager.MaxUtilization, batchmanager.GuaranteedNoEvict, batchmanager.StaticBatch)
		c.Policy = p
		return err
	}},
	{"max_beam_width", func(c *modelConfig, v string) (err error) {
		if c.MaxBeamWidth, err = intAtLeast(v, 1); err != nil {
			return err
		}
		return nil
	}},
	{"max_tokens_in_paged_kv_cache", func(c *modelConfig, v string) (err error) {
		c.MaxTokensInPagedKVCache, err = intAtLeast(v, 1)
		return err
	}},
	{"kv_cache_free_gpu_mem_fraction", func(c *modelConfig, v string) error {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || f <= 0 || f > 1 {
			return fmt.Errorf("%q: want a fraction f with 0 < f ≤ 1", v)
		}
		c.KVCacheFreeGPUMemFraction = f
		return nil
	}},
	{"gpu_memory_utilization", func(c *modelConfig, v string) error {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || f <= 0 || f > 1 {
			return fmt.Errorf("%q: want a fraction f of the GPU's total memory with 0 < f ≤ 1", v)
		}
		c.GPUMemoryUtilization = f
		return nil
	}},
	{"tokens_per_block", func(c *modelConfig, v string) (err error) {
		c.TokensPerBlock, err = intAtLeast(v, 1)
		return err
	}},
	{"enable_kv_cache_reuse", func(c *modelConfig, v string) (err error) {
		c.EnableKVCacheReuse, err = parseBool(v)
		return err
	}},
	{"enable_chunked_context", func(c *modelConfig, v string) (err error) {
		c.EnableChunkedContext, err = parseBool(v)
		return err
	}},
	{"max_num_tokens", func(c *modelConfig, v string) (err error) {
		c.MaxNumTokens, err = intAtLeast(v, 0)
		return err
	}},
	{"exclude_input_in_output", func(c *modelConfig, v string) (err error) {
		c.ExcludeInputInOutput, err = parseBool(v)
		return err
	}},
	{"cpu_weight_format", func(c *modelConfig, v string) error {
		v = strings.ToLower(strings.TrimSpace(v))
		if err := engines.CheckCPUWeightFormat(v); err != nil {
			return err
		}
		c.CPUWeightFormat = v
		return nil
	}},
	{"data_type", func(c *modelConfig, v string) error {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "fp16", "float16", "half":
			c.DataType = "float16"
		case "bf16", "bfloat16":
			c.DataType = "bfloat16"
		case "fp8", "float8":
			return fmt.Errorf("%q: want fp16 or bf16 (float16, bfloat16): the activations' type; FP8 weights come from an FP8 checkpoint or quantization fp8", v)
		default:
			return fmt.Errorf("%q: want fp16 or bf16 (float16, bfloat16)", v)
		}
		return nil
	}},
	{"quantization", func(c *modelConfig, v string) error {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "", "none":
			c.Quantization = ""
		case "fp8":
			c.Quantization = "fp8"
		default:
			return fmt.Errorf("%q: want fp8 or none", v)
		}
		return nil
	}},
	{"kv_cache_dtype", func(c *modelConfig, v string) (err error) {
		c.KVCacheDType, err = engine.ParseKVDType(v)
		return err
	}},
	{"batch_invariant", func(c *modelConfig, v string) (err error) {
		c.BatchInvariant, err = parseBool(v)
		return err
	}},
	{"tensor_parallel_size", func(c *modelConfig, v string) (err error) {
		c.TensorParallelSize, err = intAtLeast(v, 1)
		return err
	}},
	{"expert_parallel", func(c *modelConfig, v string) (err error) {
		c.ExpertParallel, err = parseBool(v)
		return err
	}},
	{"max_seq_len", func(c *modelConfig, v string) (err error) {
		c.MaxSeqLen, err = intAtLeast(v, 2)
		return err
	}},
	{"response_senders", func(c *modelConfig, v string) (err error) {
		c.ResponseSenders, err = intBetween(v, 1, maxResponseSenders)
		return err
	}},
	{"overlap_scheduler", func(c *modelConfig, v string) error {
		on, err := parseBool(v)
		c.OverlapScheduler = &on
		return err
	}},
	{"admission_window_us", func(c *modelConfig, v string) error {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 || n > maxAdmissionWindow.Microseconds() {
			return fmt.Errorf("%q: want microseconds µs with 0 ≤ µs ≤ %d", v, maxAdmissionWindow.Microseconds())
		}
		c.AdmissionWindow = time.Duration(n) * time.Microsecond
		return nil
	}},
	{"stream_interval", func(c *modelConfig, v string) (err error) {
		c.StreamInterval, err = intBetween(v, 1, maxStreamInterval)
		return err
	}},
	{"final_flag_delay_ms", func(c *modelConfig, v string) error {
		n, err := intBetween(v, 0, int(maxFinalFlagDelay/time.Millisecond))
		c.FinalFlagDelay = time.Duration(n) * time.Millisecond
		return err
	}},
	{"gollm_role", func(c *modelConfig, v string) error {
		r, err := oneOf(v, roleModel, rolePreprocessing, rolePostprocessing)
		c.Role = r
		return err
	}},
	{"tokenizer_dir", func(c *modelConfig, v string) error { c.TokenizerDir = v; return nil }},
	{"add_special_tokens", func(c *modelConfig, v string) (err error) {
		c.AddSpecialTokens, err = parseBool(v)
		return err
	}},
	{"skip_special_tokens", func(c *modelConfig, v string) (err error) {
		c.SkipSpecialTokens, err = parseBool(v)
		return err
	}},
	{"shutdown_grace_secs", func(c *modelConfig, v string) error {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || f < 0 || f > maxShutdownGrace.Seconds() {
			return fmt.Errorf("%q: want seconds s with 0 ≤ s ≤ %g (keep it below tritonserver's --exit-timeout-secs)", v, maxShutdownGrace.Seconds())
		}
		c.ShutdownGrace = time.Duration(f * float64(time.Second))
		return nil
	}},
}

// maxAdmissionWindow bounds admission_window_us: a wait longer than a second before a
// first token is a misconfiguration, not a latency budget.
const maxAdmissionWindow = time.Second

// defaultFinalFlagDelay is final_flag_delay_ms's default: in a stress test of streams
// cancelled as their last token went out, 5 ms still let tritonserver 2.51 crash on a
// loaded 2-core machine, 20 ms did not in 1,000 rounds.
const defaultFinalFlagDelay = 20 * time.Millisecond

// maxFinalFlagDelay bounds final_flag_delay_ms.
const maxFinalFlagDelay = time.Second

// maxStreamInterval bounds stream_interval: past a few hundred tokens a client might as
// well not stream.
const maxStreamInterval = 1024

// maxShutdownGrace bounds shutdown_grace_secs: an hour is longer than any exit timeout
// worth having.
const maxShutdownGrace = time.Hour

// maxResponseSenders bounds response_senders (more goroutines than streams gain nothing).
const maxResponseSenders = 256

// parseModelConfig reads Triton's JSON model configuration. modelDir is the model's
// folder in the repository and version the version being loaded: the default
// gpt_model_path is <modelDir>/<version>, and a relative one is relative to modelDir.
// A parameter with a bad value fails with a message naming it and what it accepts.
func parseModelConfig(raw []byte, modelDir string, version uint64) (*modelConfig, error) {
	var tc tritonConfig
	if err := json.Unmarshal(raw, &tc); err != nil {
		return nil, fmt.Errorf("model configuration: %w", err)
	}
	c := &modelConfig{
		Name:                      tc.Name,
		MaxBatchSize:              tc.MaxBatchSize,
		Decoupled:                 tc.TransactionPolicy.Decoupled,
		ModelType:                 batchmanager.InflightFusedBatching,
		Policy:                    batchmanager.GuaranteedNoEvict,
		MaxBeamWidth:              1,
		KVCacheFreeGPUMemFraction: defaultFreeGPUMemFraction,
		TokensPerBlock:            defaultTokensPerBlock,
		ResponseSenders:           defaultResponseSenders,
		FinalFlagDelay:            defaultFinalFlagDelay,
		Role:                      roleModel,
		AddSpecialTokens:          true,
		SkipSpecialTokens:         true,
	}
	if c.MaxBatchSize < 1 {
		return nil, fmt.Errorf("max_batch_size is %d: it must be at least 1 (gollm's tensors carry a batch dimension, and it bounds the sequences per iteration)", c.MaxBatchSize)
	}
	known := map[string]bool{}
	for _, p := range params {
		known[p.name] = true
		v := strings.TrimSpace(tc.Parameters[p.name].StringValue)
		if v == "" {
			continue
		}
		if strings.HasPrefix(v, "${") {
			// TensorRT-LLM's config templates leave unset parameters as ${name}.
			c.Warnings = append(c.Warnings, fmt.Sprintf("parameter %q is the unfilled template value %s; using its default", p.name, v))
			continue
		}
		if err := p.set(c, v); err != nil {
			return nil, fmt.Errorf("parameter %q: %w", p.name, err)
		}
	}
	var unknown []string
	for k := range tc.Parameters {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		c.Warnings = append(c.Warnings, fmt.Sprintf("parameter %q is not one gollm knows; it is ignored", k))
	}
	switch {
	case c.ModelPath == "":
		c.ModelPath = filepath.Join(modelDir, strconv.FormatUint(version, 10))
	case !filepath.IsAbs(c.ModelPath):
		c.ModelPath = filepath.Join(modelDir, c.ModelPath)
	}
	if c.TokenizerDir != "" && !filepath.IsAbs(c.TokenizerDir) {
		c.TokenizerDir = filepath.Join(modelDir, c.TokenizerDir)
	}
	if c.GPUMemoryUtilization > 0 {
		if v := strings.TrimSpace(tc.Parameters["kv_cache_free_gpu_mem_fraction"].StringValue); v != "" && !strings.HasPrefix(v, "${") {
			c.Warnings = append(c.Warnings, `parameter "kv_cache_free_gpu_mem_fraction" is ignored: gpu_memory_utilization sizes the GPU memory`)
		}
	}
	c.GPUInstances = map[int]int{}
	tp := max(1, c.TensorParallelSize)
	var starts []int // the GPUs Triton puts instances on
	for _, g := range tc.InstanceGroup {
		if g.Kind == "KIND_CPU" && tp > 1 {
			return nil, fmt.Errorf(`parameter "tensor_parallel_size" %d applies to KIND_GPU instances; the CPU engine runs a model whole (use KIND_GPU, or tensor_parallel_size 1)`, tp)
		}
		if g.Kind != "KIND_GPU" {
			continue
		}
		for _, d := range g.GPUs {
			if !slices.Contains(starts, d) {
				starts = append(starts, d)
			}
			for r := range tp {
				c.GPUInstances[d+r] += max(1, g.Count)
			}
		}
	}
	slices.Sort(starts)
	for i := 1; i < len(starts); i++ {
		if a, b := starts[i-1], starts[i]; b < a+tp {
			return nil, fmt.Errorf(`parameter "tensor_parallel_size" %d: the instances on GPUs %d and %d would both drive GPU %d (an instance on GPU d drives GPUs d to d+%d); list the first GPU of each group of %d in the KIND_GPU instance group's gpus, as gpus: [%d] — Triton puts an instance on every GPU when gpus is not given`,
				tp, a, b, b, tp-1, tp, starts[0])
		}
	}
	if c.ExpertParallel && tp < 2 {
		return nil, fmt.Errorf(`parameter "expert_parallel": spreads a mixture of experts' experts over the GPUs of a tensor-parallel instance, and needs tensor_parallel_size above 1 (it is %d)`, tp)
	}
	if c.ModelType == batchmanager.V1 && c.EnableChunkedContext {
		return nil, fmt.Errorf(`parameter "enable_chunked_context": chunked context needs in-flight batching, but gpt_model_type is V1`)
	}
	if err := c.Speculation.finish(c, modelDir); err != nil {
		return nil, err
	}
	return c, nil
}

// oneOf returns v when it is one of the allowed values.
func oneOf[T ~string](v string, allowed ...T) (T, error) {
	names := make([]string, len(allowed))
	for i, a := range allowed {
		if string(a) == v {
			return a, nil
		}
		names[i] = string(a)
	}
	return "", fmt.Errorf("%q is not one of %s", v, strings.Join(names, ", "))
}

// intAtLeast parses a decimal integer that must be at least lo.
func intAtLeast(v string, lo int) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, fmt.Errorf("%q: want an integer ≥ %d", v, lo)
	}
	if n < lo {
		return 0, fmt.Errorf("%d: want an integer ≥ %d", n, lo)
	}
	return n, nil
}

// intBetween is intAtLeast(v, lo) that also refuses values above hi.
func intBetween(v string, lo, hi int) (int, error) {
	n, err := intAtLeast(v, lo)
	if err == nil && n > hi {
		return 0, fmt.Errorf("%d: want at most %d", n, hi)
	}
	return n, err
}

// parseBool parses true/false (any case) or 1/0.
func parseBool(v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, fmt.Errorf("%q: want true or false", v)
}

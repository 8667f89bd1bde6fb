package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"gollm/batchmanager"
	"gollm/engine"
)

// configJSON builds Triton's JSON model configuration with the given parameters.
func configJSON(t *testing.T, maxBatch int, decoupled bool, params map[string]string) []byte {
	t.Helper()
	ps := map[string]any{}
	for k, v := range params {
		ps[k] = map[string]string{"string_value": v}
	}
	raw, err := json.Marshal(map[string]any{
		"name":                     "gpt2",
		"backend":                  "gollm",
		"max_batch_size":           maxBatch,
		"model_transaction_policy": map[string]bool{"decoupled": decoupled},
		"input":                    []any{map[string]any{"name": "input_ids", "data_type": "TYPE_INT32", "dims": []string{"-1"}}},
		"parameters":               ps,
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestParseModelConfigDefaults(t *testing.T) {
	c, err := parseModelConfig(configJSON(t, 64, true, nil), "/repo/gpt2", 1)
	if err != nil {
		t.Fatal(err)
	}
	want := modelConfig{
		Name:                      "gpt2",
		MaxBatchSize:              64,
		Decoupled:                 true,
		ModelPath:                 "/repo/gpt2/1",
		ModelType:                 batchmanager.InflightFusedBatching,
		Policy:                    batchmanager.GuaranteedNoEvict,
		MaxBeamWidth:              1,
		KVCacheFreeGPUMemFraction: 0.9,
		TokensPerBlock:            64,
		ResponseSenders:           4,
		FinalFlagDelay:            20 * time.Millisecond,
		GPUInstances:              map[int]int{},
		Role:                      roleModel,
		AddSpecialTokens:          true,
		SkipSpecialTokens:         true,
	}
	if fmt.Sprint(*c) != fmt.Sprint(want) {
		t.Errorf("got  %+v\nwant %+v", *c, want)
	}
}

func TestParseModelConfigValues(t *testing.T) {
	c, err := parseModelConfig(configJSON(t, 8, false, map[string]string{
		"gpt_model_path":                 "ckpt",
		"gpt_model_type":                 "V1",
		"batch_scheduler_policy":         "max_utilization",
		"max_beam_width":                 "1",
		"max_tokens_in_paged_kv_cache":   "4096",
		"kv_cache_free_gpu_mem_fraction": "0.5",
		"tokens_per_block":               "16",
		"enable_kv_cache_reuse":          "true",
		"enable_chunked_context":         "${enable_chunked_context}",
		"max_num_tokens":                 "512",
		"exclude_input_in_output":        "TRUE",
		"response_senders":               "2",
		"shutdown_grace_secs":            "2.5",
		"data_type":                      "BF16",
		"quantization":                   " FP8",
		"kv_cache_dtype":                 "fp8_e4m3",
		"batch_invariant":                "True",
		"cpu_weight_format":              "Q8_0",
		"max_queue_delay_microseconds":   "100",
		"max_attention_window_size":      "${max_attention_window_size}", // unknown and unfilled
	}), "/repo/gpt2", 3)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"relative gpt_model_path is under the model folder", c.ModelPath, "/repo/gpt2/ckpt"},
		{"gpt_model_type", c.ModelType, batchmanager.V1},
		{"batch_scheduler_policy", c.Policy, batchmanager.MaxUtilization},
		{"max_tokens_in_paged_kv_cache", c.MaxTokensInPagedKVCache, 4096},
		{"kv_cache_free_gpu_mem_fraction", c.KVCacheFreeGPUMemFraction, 0.5},
		{"tokens_per_block", c.TokensPerBlock, 16},
		{"enable_kv_cache_reuse", c.EnableKVCacheReuse, true},
		{"max_num_tokens", c.MaxNumTokens, 512},
		{"exclude_input_in_output", c.ExcludeInputInOutput, true},
		{"response_senders", c.ResponseSenders, 2},
		{"shutdown_grace_secs", c.ShutdownGrace, 2500 * time.Millisecond},
		{"data_type", c.DataType, "bfloat16"},
		{"quantization", c.Quantization, "fp8"},
		{"kv_cache_dtype", c.KVCacheDType, engine.KVFP8},
		{"batch_invariant", c.BatchInvariant, true},
		{"cpu_weight_format", c.CPUWeightFormat, "q8_0"},
		{"max_batch_size", c.MaxBatchSize, 8},
		{"decoupled", c.Decoupled, false},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s: got %v, want %v", ch.name, ch.got, ch.want)
		}
	}
	warnings := strings.Join(c.Warnings, "\n")
	for _, w := range []string{`"max_queue_delay_microseconds" is not one gollm knows`, `"enable_chunked_context" is the unfilled template value ${enable_chunked_context}; using its default`, `"max_attention_window_size" is not one gollm knows`} {
		if !strings.Contains(warnings, w) {
			t.Errorf("warnings %q lack %q", warnings, w)
		}
	}

	tok, err := parseModelConfig(configJSON(t, 8, false, map[string]string{"gollm_role": "postprocessing", "tokenizer_dir": "tok",
		"add_special_tokens": "false", "skip_special_tokens": "0"}), "/repo/postprocessing", 1)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Role != rolePostprocessing || tok.TokenizerDir != "/repo/postprocessing/tok" || tok.AddSpecialTokens || tok.SkipSpecialTokens {
		t.Errorf("tokenizer-only model: role %q, tokenizer_dir %q, add_special_tokens %v, skip_special_tokens %v",
			tok.Role, tok.TokenizerDir, tok.AddSpecialTokens, tok.SkipSpecialTokens)
	}

	abs, err := parseModelConfig(configJSON(t, 8, false, map[string]string{"gpt_model_path": "/models/gpt2"}), "/repo/gpt2", 3)
	if err != nil || abs.ModelPath != "/models/gpt2" {
		t.Errorf("absolute gpt_model_path: got %q, %v", abs.ModelPath, err)
	}
}

func TestParseModelConfigErrors(t *testing.T) {
	tests := []struct {
		name     string
		maxBatch int
		params   map[string]string
		want     string
	}{
		{"an unknown model type names the allowed ones", 8, map[string]string{"gpt_model_type": "inflight"},
			`parameter "gpt_model_type": "inflight" is not one of V1, inflight_batching, inflight_fused_batching`},
		{"an unknown role names the allowed ones", 8, map[string]string{"gollm_role": "tokenizer"},
			`parameter "gollm_role": "tokenizer" is not one of model, preprocessing, postprocessing`},
		{"an unknown policy names the allowed ones", 8, map[string]string{"batch_scheduler_policy": "greedy"},
			`parameter "batch_scheduler_policy": "greedy" is not one of max_utilization, guaranteed_no_evict, static_batch`},
		{"a zero beam width is refused", 8, map[string]string{"max_beam_width": "0"},
			`parameter "max_beam_width": 0: want an integer ≥ 1`},
		{"a fraction above 1 is refused", 8, map[string]string{"kv_cache_free_gpu_mem_fraction": "1.5"},
			`parameter "kv_cache_free_gpu_mem_fraction": "1.5": want a fraction f with 0 < f ≤ 1`},
		{"a zero fraction is refused", 8, map[string]string{"kv_cache_free_gpu_mem_fraction": "0"},
			`want a fraction f with 0 < f ≤ 1`},
		{"a GPU memory utilization above 1 is refused", 8, map[string]string{"gpu_memory_utilization": "90%"},
			`parameter "gpu_memory_utilization": "90%": want a fraction f of the GPU's total memory with 0 < f ≤ 1`},
		{"a zero GPU memory utilization is refused", 8, map[string]string{"gpu_memory_utilization": "0"},
			`parameter "gpu_memory_utilization": "0": want a fraction`},
		{"a negative admission window is refused", 8, map[string]string{"admission_window_us": "-5"},
			`parameter "admission_window_us": "-5": want microseconds µs with 0 ≤ µs ≤ 1000000`},
		{"an admission window over a second is refused", 8, map[string]string{"admission_window_us": "2000000"},
			`parameter "admission_window_us": "2000000": want microseconds`},
		{"a non-number block size is refused", 8, map[string]string{"tokens_per_block": "many"},
			`parameter "tokens_per_block": "many": want an integer ≥ 1`},
		{"a bad bool is refused", 8, map[string]string{"enable_kv_cache_reuse": "yes"},
			`parameter "enable_kv_cache_reuse": "yes": want true or false`},
		{"a bad overlap_scheduler is refused", 8, map[string]string{"overlap_scheduler": "on"},
			`parameter "overlap_scheduler": "on": want true or false`},
		{"a zero tensor_parallel_size is refused", 8, map[string]string{"tensor_parallel_size": "0"},
			`parameter "tensor_parallel_size": 0: want an integer ≥ 1`},
		{"a bad expert_parallel is refused", 8, map[string]string{"expert_parallel": "maybe"},
			`parameter "expert_parallel": "maybe": want true or false`},
		{"expert_parallel without tensor parallelism is refused", 8, map[string]string{"expert_parallel": "true"},
			`parameter "expert_parallel": spreads a mixture of experts' experts over the GPUs of a tensor-parallel instance, and needs tensor_parallel_size above 1 (it is 1)`},
		{"a negative token limit is refused", 8, map[string]string{"max_num_tokens": "-1"},
			`parameter "max_num_tokens": -1: want an integer ≥ 0`},
		{"a zero KV pool is refused", 8, map[string]string{"max_tokens_in_paged_kv_cache": "0"},
			`parameter "max_tokens_in_paged_kv_cache": 0: want an integer ≥ 1`},
		{"chunked context under V1 is refused", 8, map[string]string{"gpt_model_type": "V1", "enable_chunked_context": "true"},
			`chunked context needs in-flight batching`},
		{"zero response senders are refused", 8, map[string]string{"response_senders": "0"},
			`parameter "response_senders": 0: want an integer ≥ 1`},
		{"too many response senders are refused", 8, map[string]string{"response_senders": "1000"},
			`parameter "response_senders": 1000: want at most 256`},
		{"a zero stream interval is refused", 8, map[string]string{"stream_interval": "0"},
			`parameter "stream_interval": 0: want an integer ≥ 1`},
		{"a stream interval past 1024 is refused", 8, map[string]string{"stream_interval": "5000"},
			`parameter "stream_interval": 5000: want at most 1024`},
		{"a final flag delay past a second is refused", 8, map[string]string{"final_flag_delay_ms": "5000"},
			`parameter "final_flag_delay_ms": 5000: want at most 1000`},
		{"a negative shutdown grace is refused", 8, map[string]string{"shutdown_grace_secs": "-1"},
			`parameter "shutdown_grace_secs": "-1": want seconds s with 0 ≤ s ≤ 3600`},
		{"a shutdown grace that is not a number is refused", 8, map[string]string{"shutdown_grace_secs": "soon"},
			`parameter "shutdown_grace_secs": "soon": want seconds`},
		{"an unknown data type is refused", 8, map[string]string{"data_type": "int8"},
			`parameter "data_type": "int8": want fp16 or bf16 (float16, bfloat16)`},
		{"data type fp8 points to quantization", 8, map[string]string{"data_type": "fp8"},
			`parameter "data_type": "fp8": want fp16 or bf16 (float16, bfloat16): the activations' type; FP8 weights come from an FP8 checkpoint or quantization fp8`},
		{"an unknown quantization is refused", 8, map[string]string{"quantization": "awq"},
			`parameter "quantization": "awq": want fp8 or none`},
		{"an e5m2 KV cache is refused by name", 8, map[string]string{"kv_cache_dtype": "fp8_e5m2"},
			`parameter "kv_cache_dtype": "fp8_e5m2" is not supported: gollm's FP8 KV cache is float8_e4m3fn`},
		{"an unknown KV cache type is refused", 8, map[string]string{"kv_cache_dtype": "int8"},
			`parameter "kv_cache_dtype": "int8": want auto or fp8 (fp8_e4m3)`},
		{"a batch_invariant that is not a boolean is refused", 8, map[string]string{"batch_invariant": "always"},
			`parameter "batch_invariant": "always"`},
		{"an unknown CPU weight format names the allowed ones", 8, map[string]string{"cpu_weight_format": "int4"},
			`parameter "cpu_weight_format": "int4" is not a weight format (want one of auto, fp32, fp16, bf16, q8_0, q4_k)`},
		{"max_batch_size 0 is refused", 0, nil, `max_batch_size is 0: it must be at least 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseModelConfig(configJSON(t, tt.maxBatch, true, tt.params), "/repo/gpt2", 1)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
	t.Run("malformed JSON is refused", func(t *testing.T) {
		if _, err := parseModelConfig([]byte("{"), "/repo/gpt2", 1); err == nil {
			t.Fatal("no error")
		}
	})
}

func TestAdmissionWindow(t *testing.T) {
	c, err := parseModelConfig(configJSON(t, 8, true, map[string]string{"admission_window_us": "2500"}), "/repo/gpt2", 1)
	if err != nil {
		t.Fatal(err)
	}
	if c.AdmissionWindow != 2500*time.Microsecond {
		t.Errorf("AdmissionWindow %v, want 2.5ms", c.AdmissionWindow)
	}
}

func TestStreamInterval(t *testing.T) {
	c, err := parseModelConfig(configJSON(t, 8, true, map[string]string{"stream_interval": "4"}), "/repo/gpt2", 1)
	if err != nil {
		t.Fatal(err)
	}
	if c.StreamInterval != 4 {
		t.Errorf("StreamInterval %d, want 4", c.StreamInterval)
	}
	if c, err = parseModelConfig(configJSON(t, 8, true, nil), "/repo/gpt2", 1); err != nil || c.StreamInterval != 0 {
		t.Errorf("without the parameter: StreamInterval %d (%v), want 0 (every token)", c.StreamInterval, err)
	}
}

func TestGPUMemoryUtilization(t *testing.T) {
	t.Run("it is read, and kv_cache_free_gpu_mem_fraction beside it is ignored with a warning", func(t *testing.T) {
		c, err := parseModelConfig(configJSON(t, 8, true, map[string]string{
			"gpu_memory_utilization": "0.45", "kv_cache_free_gpu_mem_fraction": "0.9"}), "/repo/gpt2", 1)
		if err != nil {
			t.Fatal(err)
		}
		if c.GPUMemoryUtilization != 0.45 {
			t.Errorf("GPUMemoryUtilization %v, want 0.45", c.GPUMemoryUtilization)
		}
		if w := strings.Join(c.Warnings, "\n"); !strings.Contains(w, `"kv_cache_free_gpu_mem_fraction" is ignored`) {
			t.Errorf("warnings %q", w)
		}
	})
	t.Run("the instances on each GPU are counted from instance_group", func(t *testing.T) {
		raw := []byte(`{"name": "m", "max_batch_size": 4, "instance_group": [
			{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]},
			{"kind": "KIND_GPU", "count": 1, "gpus": [1]},
			{"kind": "KIND_CPU", "count": 3}]}`)
		c, err := parseModelConfig(raw, "/repo/m", 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[int]int{0: 2, 1: 3}; fmt.Sprint(c.GPUInstances) != fmt.Sprint(want) {
			t.Errorf("GPUInstances %v, want %v", c.GPUInstances, want)
		}
	})
}

func TestTensorParallelInstanceGroups(t *testing.T) {
	parse := func(groups string) (*modelConfig, error) {
		raw := []byte(`{"name": "m", "max_batch_size": 4, "instance_group": [` + groups + `],
			"parameters": {"tensor_parallel_size": {"string_value": "2"}}}`)
		return parseModelConfig(raw, "/repo/m", 1)
	}
	t.Run("an instance counts on every GPU it drives", func(t *testing.T) {
		c, err := parse(`{"kind": "KIND_GPU", "count": 2, "gpus": [0, 2]}`)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[int]int{0: 2, 1: 2, 2: 2, 3: 2}; c.TensorParallelSize != 2 || fmt.Sprint(c.GPUInstances) != fmt.Sprint(want) {
			t.Errorf("tensor_parallel_size %d, GPUInstances %v; want 2, %v", c.TensorParallelSize, c.GPUInstances, want)
		}
	})
	t.Run("instances whose GPUs overlap are refused, naming the first GPU to list", func(t *testing.T) {
		_, err := parse(`{"kind": "KIND_GPU", "count": 1, "gpus": [1, 0]}`)
		want := `parameter "tensor_parallel_size" 2: the instances on GPUs 0 and 1 would both drive GPU 1 (an instance on GPU d drives GPUs d to d+1); list the first GPU of each group of 2 in the KIND_GPU instance group's gpus, as gpus: [0]`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want %q", err, want)
		}
	})
	t.Run("expert_parallel rides on it", func(t *testing.T) {
		raw := []byte(`{"name": "m", "max_batch_size": 4, "instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}],
			"parameters": {"tensor_parallel_size": {"string_value": "2"}, "expert_parallel": {"string_value": "true"}}}`)
		c, err := parseModelConfig(raw, "/repo/m", 1)
		if err != nil || !c.ExpertParallel || c.TensorParallelSize != 2 {
			t.Errorf("got %+v, %v", c, err)
		}
	})
	t.Run("KIND_CPU is refused", func(t *testing.T) {
		if _, err := parse(`{"kind": "KIND_CPU", "count": 1}`); err == nil || !strings.Contains(err.Error(), "applies to KIND_GPU instances") {
			t.Errorf("got %v", err)
		}
	})
}

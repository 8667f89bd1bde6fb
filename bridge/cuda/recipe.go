package cuda

/*
#include "trampoline.h"
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"

	"gollm/model"
)

// The C ABI's enums follow the model package's (checked at build time by the array sizes
// below, which fail to compile if the counts drift apart).
var (
	_ [int(C.GOLLM_STAGE_KINDS) - int(model.NumStageKinds)]struct{}
	_ [int(model.NumStageKinds) - int(C.GOLLM_STAGE_KINDS)]struct{}
)

// recipeStage is gollm_stage, for the tests (which cannot name C types).
type recipeStage = C.gollm_stage

// cRecipe is a model's recipe in the C ABI's terms: its stages, and the rotary
// frequencies its rotary stages index (each distinct rope's once; longrope's short set,
// then its long one).
type cRecipe struct {
	stages []C.gollm_stage
	freqs  []float32
}

// recipeOf translates the recipe of the descriptor c (a tensor-parallel rank's, whose
// stages are the whole model's) into gollm_stage entries.
func recipeOf(c *model.Config) (cRecipe, error) {
	var r cRecipe
	at := map[model.Rope]int{}
	for i, s := range c.Recipe() {
		if s.Layer < -1 || s.Layer >= c.Layers {
			return r, fmt.Errorf("recipe stage %d (%s): layer %d outside the model", i, s.Kind, s.Layer)
		}
		st := C.gollm_stage{kind: C.int32_t(s.Kind), layer: C.int32_t(s.Layer)}
		switch s.Kind {
		case model.StageNorm, model.StageQKNorm, model.StagePostNorm:
			st.weight, st.norm, st.eps = C.int32_t(s.Weight), normCode(s.Norm), C.float(s.Eps)
		case model.StageEmbed:
			st.scale = C.float(s.Scale)
		case model.StageRotary:
			off, ok := at[s.Rope]
			if !ok {
				off = len(r.freqs)
				at[s.Rope] = off
				r.freqs = append(r.freqs, s.Rope.InvFreq()...)
				r.freqs = append(r.freqs, s.Rope.LongInvFreq()...)
			}
			st.rope_dim, st.rope_freqs = C.int32_t(s.Rope.Dim), C.int32_t(off)
			st.rope_scale = C.float(s.Rope.CosSinScale())
			if s.Rope.Kind == model.RopeLongRope {
				st.rope_long = C.int32_t(min(s.Rope.OriginalMaxPositions, math.MaxInt32))
			}
		case model.StageAttention:
			st.window, st.scale, st.softcap = C.int32_t(s.Window), C.float(s.Scale), C.float(s.SoftCap)
		case model.StageMLP:
			st.activation, st.gated = C.int32_t(s.Act), cbool(s.Gated)
		case model.StageLMHead:
			st.softcap = C.float(s.SoftCap)
		case model.StageMoE:
			st.activation, st.gated = C.int32_t(s.Act), cbool(s.Gated)
			st.experts, st.top_k = C.int32_t(s.Experts), C.int32_t(s.TopK)
			st.norm_topk, st.shared = cbool(s.NormTopK), cbool(s.SharedExpert)
		}
		r.stages = append(r.stages, st)
	}
	return r, nil
}

// normCode is a NormKind's gollm_norm.
func normCode(k model.NormKind) C.int32_t {
	if k == model.RMSNorm {
		return C.GOLLM_NORM_RMS
	}
	return C.GOLLM_NORM_LAYER
}

// cbool is a C truth value.
func cbool(v bool) C.int32_t {
	if v {
		return 1
	}
	return 0
}

// abiLayout reports the size of each ABI struct this package fills and the offset of
// each field, by the names gollm.h gives them, for the test that pins them to ABI 16.
func abiLayout() map[string]uintptr {
	var st C.gollm_stage
	var f C.gollm_faults
	var tn C.gollm_tuning
	var wp C.gollm_weights_params
	var ep C.gollm_engine_params
	var mc C.gollm_model_config
	var ap C.gollm_allreduce_params
	var ar C.gollm_allreduce_result
	var in C.gollm_step_in
	var ts C.gollm_tensor
	var wt C.gollm_weight
	var ei C.gollm_engine_info
	return map[string]uintptr{
		"gollm_engine_info": unsafe.Sizeof(ei), "gollm_engine_info.max_seq_len": unsafe.Offsetof(ei.max_seq_len),
		"gollm_engine_info.warmup_gemm_tuned":   unsafe.Offsetof(ei.warmup_gemm_tuned),
		"gollm_engine_info.warmup_gemm_tune_ms": unsafe.Offsetof(ei.warmup_gemm_tune_ms),
		"gollm_tensor":                          unsafe.Sizeof(ts), "gollm_tensor.dtype": unsafe.Offsetof(ts.dtype),
		"gollm_tensor.scale": unsafe.Offsetof(ts.scale), "gollm_tensor.block_rows": unsafe.Offsetof(ts.block_rows),
		"gollm_tensor.block_cols": unsafe.Offsetof(ts.block_cols), "gollm_weight": unsafe.Sizeof(wt),
		"gollm_weight.part": unsafe.Offsetof(wt.part),
		"gollm_step_in":     unsafe.Sizeof(in), "gollm_step_in.num_allowed": unsafe.Offsetof(in.num_allowed),
		"gollm_step_in.feed": unsafe.Offsetof(in.feed), "gollm_step_in.late_allowed": unsafe.Offsetof(in.late_allowed),
		"gollm_stage": unsafe.Sizeof(st), "gollm_stage.kind": unsafe.Offsetof(st.kind),
		"gollm_stage.layer": unsafe.Offsetof(st.layer), "gollm_stage.weight": unsafe.Offsetof(st.weight),
		"gollm_stage.norm": unsafe.Offsetof(st.norm), "gollm_stage.eps": unsafe.Offsetof(st.eps),
		"gollm_stage.rope_dim": unsafe.Offsetof(st.rope_dim), "gollm_stage.rope_freqs": unsafe.Offsetof(st.rope_freqs),
		"gollm_stage.window": unsafe.Offsetof(st.window), "gollm_stage.scale": unsafe.Offsetof(st.scale),
		"gollm_stage.softcap": unsafe.Offsetof(st.softcap), "gollm_stage.activation": unsafe.Offsetof(st.activation),
		"gollm_stage.gated": unsafe.Offsetof(st.gated), "gollm_stage.rope_long": unsafe.Offsetof(st.rope_long),
		"gollm_stage.rope_scale": unsafe.Offsetof(st.rope_scale), "gollm_stage.experts": unsafe.Offsetof(st.experts),
		"gollm_stage.top_k": unsafe.Offsetof(st.top_k), "gollm_stage.norm_topk": unsafe.Offsetof(st.norm_topk),
		"gollm_stage.shared": unsafe.Offsetof(st.shared),
		"gollm_faults":       unsafe.Sizeof(f), "gollm_faults.fail_step": unsafe.Offsetof(f.fail_step),
		"gollm_faults.fail_mode": unsafe.Offsetof(f.fail_mode), "gollm_faults.fail_rank": unsafe.Offsetof(f.fail_rank),
		"gollm_faults.fail_alloc": unsafe.Offsetof(f.fail_alloc),
		"gollm_tuning":            unsafe.Sizeof(tn), "gollm_tuning.off": unsafe.Offsetof(tn.off),
		"gollm_tuning.gemv_rows": unsafe.Offsetof(tn.gemv_rows), "gollm_tuning.tiled_rows": unsafe.Offsetof(tn.tiled_rows),
		"gollm_tuning.tile_blocks": unsafe.Offsetof(tn.tile_blocks), "gollm_tuning.decode_parts": unsafe.Offsetof(tn.decode_parts),
		"gollm_tuning.skip": unsafe.Offsetof(tn.skip), "gollm_tuning.allreduce_bytes": unsafe.Offsetof(tn.allreduce_bytes),
		"gollm_tuning.allreduce_timeout_ms": unsafe.Offsetof(tn.allreduce_timeout_ms),
		"gollm_tuning.allreduce_two_bytes":  unsafe.Offsetof(tn.allreduce_two_bytes),
		"gollm_allreduce_params":            unsafe.Sizeof(ap), "gollm_allreduce_params.timeout_ms": unsafe.Offsetof(ap.timeout_ms),
		"gollm_allreduce_result": unsafe.Sizeof(ar), "gollm_allreduce_result.reason": unsafe.Offsetof(ar.reason),
		"gollm_model_config": unsafe.Sizeof(mc), "gollm_model_config.norm": unsafe.Offsetof(mc.norm),
		"gollm_model_config.tied_head": unsafe.Offsetof(mc.tied_head),
		"gollm_model_config.qk_norm":   unsafe.Offsetof(mc.qk_norm), "gollm_model_config.post_norms": unsafe.Offsetof(mc.post_norms),
		"gollm_model_config.experts": unsafe.Offsetof(mc.experts), "gollm_model_config.shared_inner": unsafe.Offsetof(mc.shared_inner),
		"gollm_model_config.expert_first":  unsafe.Offsetof(mc.expert_first),
		"gollm_model_config.local_experts": unsafe.Offsetof(mc.local_experts),
		"gollm_weights_params":             unsafe.Sizeof(wp), "gollm_weights_params.config": unsafe.Offsetof(wp.config),
		"gollm_weights_params.num_stages": unsafe.Offsetof(wp.num_stages), "gollm_weights_params.stages": unsafe.Offsetof(wp.stages),
		"gollm_weights_params.num_rope_freqs": unsafe.Offsetof(wp.num_rope_freqs),
		"gollm_weights_params.rope_freqs":     unsafe.Offsetof(wp.rope_freqs),
		"gollm_weights_params.num_weights":    unsafe.Offsetof(wp.num_weights),
		"gollm_weights_params.weights":        unsafe.Offsetof(wp.weights), "gollm_weights_params.faults": unsafe.Offsetof(wp.faults),
		"gollm_engine_params": unsafe.Sizeof(ep), "gollm_engine_params.tuning": unsafe.Offsetof(ep.tuning),
		"gollm_engine_params.faults": unsafe.Offsetof(ep.faults), "gollm_engine_params.mem_budget": unsafe.Offsetof(ep.mem_budget),
		"gollm_engine_params.comm": unsafe.Offsetof(ep.comm), "gollm_engine_params.tp_vocab": unsafe.Offsetof(ep.tp_vocab),
		"gollm_engine_params.kv_dtype": unsafe.Offsetof(ep.kv_dtype), "gollm_engine_params.kv_scales": unsafe.Offsetof(ep.kv_scales),
	}
}

// headerABI is the GOLLM_ABI_VERSION of the gollm.h this package is built with.
func headerABI() int { return int(C.GOLLM_ABI_VERSION) }

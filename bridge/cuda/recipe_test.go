package cuda

import (
	"errors"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/model"
)

// TestRecipeOfCarriesEveryStage translates the fixtures' recipes into gollm_stage: every
// stage in order with its layer and the values its kind reads — the q/k norms and
// post-norms with their weights, the embedding scale, the soft-caps, longrope's two
// frequency sets, its threshold and attention factor —, each rope's frequencies once in
// the table its rotary stages index, and nothing set that a kind does not read.
func TestRecipeOfCarriesEveryStage(t *testing.T) {
	for _, fixture := range []string{"gpt2-tiny", "llama3-tiny", "mistral-tiny", "phi3-tiny", "qwen3-tiny", "gemma2-tiny",
		"gemma3-tiny", "phi3-longrope-tiny", "phi4mini-tiny", "mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny"} {
		ck, err := model.Open(filepath.Join("..", "..", "testdata", fixture))
		if err != nil {
			t.Fatal(err)
		}
		cfg := ck.Config
		_ = ck.Close()
		want := cfg.Recipe()
		got, err := recipeOf(&cfg)
		if err != nil {
			t.Fatalf("%s: %v", fixture, err)
		}
		if len(got.stages) != len(want) {
			t.Fatalf("%s: %d stages, want %d", fixture, len(got.stages), len(want))
		}
		rotary, ropes := 0, map[model.Rope]bool{}
		for i, w := range want {
			g := got.stages[i]
			if int(g.kind) != int(w.Kind) || int(g.layer) != w.Layer {
				t.Fatalf("%s stage %d: kind %d layer %d, want %s of layer %d", fixture, i, g.kind, g.layer, w.Kind, w.Layer)
			}
			zero := g
			zero.kind, zero.layer = 0, 0
			switch w.Kind {
			case model.StageNorm, model.StageQKNorm, model.StagePostNorm:
				if int(g.weight) != int(w.Weight) || g.norm != normCode(w.Norm) || float32(g.eps) != w.Eps {
					t.Errorf("%s stage %d: norm weight %d kind %d eps %g, want %s %s %g", fixture, i, g.weight, g.norm, g.eps, w.Weight, w.Norm, w.Eps)
				}
				zero.weight, zero.norm, zero.eps = 0, 0, 0
			case model.StageRotary:
				rotary++
				ropes[w.Rope] = true
				inv := append(w.Rope.InvFreq(), w.Rope.LongInvFreq()...)
				off := int(g.rope_freqs)
				if int(g.rope_dim) != w.Rope.Dim || off < 0 || off+len(inv) > len(got.freqs) {
					t.Fatalf("%s stage %d: rope_dim %d frequencies from %d of %d, want %d dimensions", fixture, i, g.rope_dim, off, len(got.freqs), w.Rope.Dim)
				}
				for k, f := range inv {
					if got.freqs[off+k] != f {
						t.Fatalf("%s stage %d: frequency %d is %g, want %g", fixture, i, k, got.freqs[off+k], f)
					}
				}
				long := 0
				if w.Rope.Kind == model.RopeLongRope {
					long = w.Rope.OriginalMaxPositions
				}
				if int(g.rope_long) != long || float32(g.rope_scale) != w.Rope.CosSinScale() {
					t.Errorf("%s stage %d: rope_long %d scale %g, want %d %g", fixture, i, g.rope_long, g.rope_scale, long, w.Rope.CosSinScale())
				}
				zero.rope_dim, zero.rope_freqs, zero.rope_long, zero.rope_scale = 0, 0, 0, 0
			case model.StageAttention:
				if int(g.window) != w.Window || float32(g.scale) != w.Scale || float32(g.softcap) != w.SoftCap {
					t.Errorf("%s stage %d: window %d scale %g softcap %g, want %d %g %g", fixture, i, g.window, g.scale, g.softcap, w.Window, w.Scale, w.SoftCap)
				}
				zero.window, zero.scale, zero.softcap = 0, 0, 0
			case model.StageEmbed:
				if float32(g.scale) != w.Scale {
					t.Errorf("%s stage %d: embedding scale %g, want %g", fixture, i, g.scale, w.Scale)
				}
				zero.scale = 0
			case model.StageLMHead:
				if float32(g.softcap) != w.SoftCap {
					t.Errorf("%s stage %d: final soft-cap %g, want %g", fixture, i, g.softcap, w.SoftCap)
				}
				zero.softcap = 0
			case model.StageMLP:
				if int(g.activation) != int(w.Act) || (g.gated != 0) != w.Gated {
					t.Errorf("%s stage %d: activation %d gated %d, want %s %v", fixture, i, g.activation, g.gated, w.Act, w.Gated)
				}
				zero.activation, zero.gated = 0, 0
			case model.StageMoE:
				if int(g.activation) != int(w.Act) || g.gated != 1 || int(g.experts) != w.Experts || int(g.top_k) != w.TopK ||
					(g.norm_topk != 0) != w.NormTopK || (g.shared != 0) != w.SharedExpert {
					t.Errorf("%s stage %d: %+v, want %+v", fixture, i, g, w)
				}
				zero.activation, zero.gated, zero.experts, zero.top_k, zero.norm_topk, zero.shared = 0, 0, 0, 0, 0, 0
			}
			if zero != (recipeStage{}) {
				t.Errorf("%s stage %d (%s): fields its kind does not read are set: %+v", fixture, i, w.Kind, g)
			}
		}
		// The layers' rotaries share their ropes: each rope's frequencies appear once.
		freqs := 0
		for r := range ropes {
			freqs += len(r.InvFreq()) + len(r.LongInvFreq())
		}
		if cfg.Positions == model.RotaryPositions && (rotary != cfg.Layers || len(got.freqs) != freqs) {
			t.Errorf("%s: %d rotary stages, %d frequencies; want %d and %d", fixture, rotary, len(got.freqs), cfg.Layers, freqs)
		}
		if fixture == "phi3-tiny" && cfg.Rope.Dim != cfg.HeadDim/2 {
			t.Errorf("phi3-tiny rotates %d of %d dimensions", cfg.Rope.Dim, cfg.HeadDim)
		}
	}
}

// TestABILayoutIsVersion16 pins the structs this package fills to gollm.h's ABI 16 — sizes
// and field offsets as x86-64 and arm64 C compilers lay them out —, so that a field added,
// moved or resized without bumping GOLLM_ABI_VERSION fails here rather than in a library
// built from another header.
func TestABILayoutIsVersion16(t *testing.T) {
	if v := headerABI(); v != 16 {
		t.Fatalf("gollm.h has ABI %d: update this test's layout with the version", v)
	}
	want := map[string]uintptr{
		// ABI 16: a share's experts under expert parallelism.
		"gollm_model_config": 76, "gollm_model_config.expert_first": 68, "gollm_model_config.local_experts": 72,
		"gollm_weights_params": 152, "gollm_weights_params.config": 8, "gollm_weights_params.num_stages": 84,
		"gollm_weights_params.stages": 88, "gollm_weights_params.num_rope_freqs": 96,
		"gollm_weights_params.rope_freqs": 104, "gollm_weights_params.num_weights": 112,
		"gollm_weights_params.weights": 120, "gollm_weights_params.faults": 128,
		// ABI 15: what the warm-up's GEMM tuning timed, and how long it took.
		"gollm_engine_info": 312, "gollm_engine_info.max_seq_len": 300, "gollm_engine_info.warmup_gemm_tuned": 304,
		"gollm_engine_info.warmup_gemm_tune_ms": 308,
		// ABI 13: an FP8 tensor's scales and their block.
		"gollm_tensor": 48, "gollm_tensor.dtype": 24, "gollm_tensor.scale": 32, "gollm_tensor.block_rows": 40,
		"gollm_tensor.block_cols": 44, "gollm_weight": 56, "gollm_weight.part": 8,
		"gollm_stage": 72, "gollm_stage.kind": 0, "gollm_stage.layer": 4, "gollm_stage.weight": 8,
		"gollm_stage.norm": 12, "gollm_stage.eps": 16, "gollm_stage.rope_dim": 20, "gollm_stage.rope_freqs": 24,
		"gollm_stage.window": 28, "gollm_stage.scale": 32, "gollm_stage.softcap": 36,
		"gollm_stage.activation": 40, "gollm_stage.gated": 44, "gollm_stage.rope_long": 48, "gollm_stage.rope_scale": 52,
		"gollm_stage.experts": 56, "gollm_stage.top_k": 60, "gollm_stage.norm_topk": 64, "gollm_stage.shared": 68,
		"gollm_faults": 24, "gollm_faults.fail_step": 0, "gollm_faults.fail_mode": 4, "gollm_faults.fail_rank": 8,
		"gollm_faults.fail_alloc": 16,
		"gollm_tuning":            36, "gollm_tuning.off": 0, "gollm_tuning.gemv_rows": 4, "gollm_tuning.tiled_rows": 8,
		"gollm_tuning.tile_blocks": 12, "gollm_tuning.decode_parts": 16, "gollm_tuning.skip": 20,
		"gollm_tuning.allreduce_bytes": 24, "gollm_tuning.allreduce_timeout_ms": 28,
		"gollm_tuning.allreduce_two_bytes": 32, // ABI 16: the two-shot's smallest payload
		"gollm_allreduce_params":           32, "gollm_allreduce_params.timeout_ms": 28,
		"gollm_allreduce_result": 276, "gollm_allreduce_result.reason": 20,
		"gollm_model_config.norm": 32, "gollm_model_config.tied_head": 44,
		"gollm_model_config.qk_norm": 48, "gollm_model_config.post_norms": 52, "gollm_model_config.experts": 56,
		"gollm_model_config.shared_inner": 64,
		// ABI 16: the KV pool's element type and an FP8 pool's scales.
		"gollm_engine_params": 136, "gollm_engine_params.tuning": 36, "gollm_engine_params.faults": 72,
		"gollm_engine_params.mem_budget": 96, "gollm_engine_params.comm": 104, "gollm_engine_params.tp_vocab": 116,
		"gollm_engine_params.kv_dtype": 120, "gollm_engine_params.kv_scales": 128,
		"gollm_step_in": 152, "gollm_step_in.num_allowed": 120, "gollm_step_in.feed": 136, "gollm_step_in.late_allowed": 144,
	}
	got := abiLayout()
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s: %d, ABI 16 has %d", k, g, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("abiLayout reports %d entries, the test pins %d", len(got), len(want))
	}
}

// TestTuningCrossesAsItSays: each Tuning field reaches its gollm_tuning field, the zero
// value keeps every default (-1 for the row limits), and a negative row limit turns its
// path off (0).
func TestTuningCrossesAsItSays(t *testing.T) {
	z := Tuning{}.c()
	if z.off != 0 || z.gemv_rows != -1 || z.tiled_rows != -1 || z.tile_blocks != 0 || z.decode_parts != 0 || z.skip != 0 ||
		z.allreduce_bytes != 0 || z.allreduce_timeout_ms != 0 || z.allreduce_two_bytes != 0 {
		t.Fatalf("zero Tuning crosses as %+v", z)
	}
	all := Tuning{NoPDL: true, NoBulk: true, NoFused: true, NoGrouped: true, NoStream: true, NoTiled: true,
		NoPromptGraphs: true, NoCtxMMA: true, NoCustomAllReduce: true, NoBLASLt: true, NoTPCandidates: true, GemvRows: -1,
		TiledRows: 32, TileBlocks: 2, DecodeParts: 3, Skip: 1 << 7, AllReduceBytes: 65536,
		AllReduceTimeout: 1500 * time.Millisecond, AllReduceTwoBytes: -5}
	c := all.c()
	if c.off != 511|1024|2048 || c.gemv_rows != 0 || c.tiled_rows != 32 || c.tile_blocks != 2 || c.decode_parts != 3 || c.skip != 128 ||
		c.allreduce_bytes != 65536 || c.allreduce_timeout_ms != 1500 || c.allreduce_two_bytes != -1 {
		t.Fatalf("%+v crosses as %+v", all, c)
	}
}

// TestTuningFromEnv checks that each measuring switch reaches its field, that values other
// than a leading 0 leave a path on, and that 0 for a row limit turns its path off.
func TestTuningFromEnv(t *testing.T) {
	names := []string{"GOLLM_CUDA_PDL", "GOLLM_CUDA_BULK", "GOLLM_CUDA_FUSED", "GOLLM_CUDA_GROUPED", "GOLLM_CUDA_STREAM",
		"GOLLM_CUDA_TILED", "GOLLM_CUDA_PROMPT_GRAPHS", "GOLLM_CUDA_CTX_MMA", "GOLLM_CUDA_GEMV_ROWS", "GOLLM_CUDA_TILED_ROWS",
		"GOLLM_CUDA_TILE_BLOCKS", "GOLLM_CUDA_DECODE_PARTS", "GOLLM_CUDA_SKIP", "GOLLM_CUDA_CUSTOM_AR", "GOLLM_CUDA_AR_BYTES",
		"GOLLM_CUDA_BLASLT", "GOLLM_CUDA_AR_TWO_BYTES", "GOLLM_CUDA_TP_CANDIDATES"}
	for _, name := range names {
		t.Setenv(name, "")
	}
	if got := TuningFromEnv(); got != (Tuning{}) {
		t.Fatalf("no switches set: got %+v, want the zero Tuning", got)
	}
	for k, v := range map[string]string{"GOLLM_CUDA_GROUPED": "0", "GOLLM_CUDA_STREAM": "0", "GOLLM_CUDA_TILED": "0",
		"GOLLM_CUDA_PDL": "1", "GOLLM_CUDA_GEMV_ROWS": "0", "GOLLM_CUDA_PROMPT_GRAPHS": "0", "GOLLM_CUDA_CTX_MMA": "0",
		"GOLLM_CUDA_TILED_ROWS": "8", "GOLLM_CUDA_TILE_BLOCKS": "2", "GOLLM_CUDA_DECODE_PARTS": "1", "GOLLM_CUDA_SKIP": "256",
		"GOLLM_CUDA_CUSTOM_AR": "0", "GOLLM_CUDA_AR_BYTES": "131072", "GOLLM_CUDA_BLASLT": "0", "GOLLM_CUDA_AR_TWO_BYTES": "-1",
		"GOLLM_CUDA_TP_CANDIDATES": "0"} {
		t.Setenv(k, v)
	}
	want := Tuning{NoGrouped: true, NoStream: true, NoTiled: true, NoPromptGraphs: true, NoCtxMMA: true, GemvRows: -1,
		TiledRows: 8, TileBlocks: 2, DecodeParts: 1, Skip: 256, NoCustomAllReduce: true, AllReduceBytes: 131072,
		NoBLASLt: true, AllReduceTwoBytes: -1, NoTPCandidates: true}
	if got := TuningFromEnv(); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// TestFaultsFromEnv reads the fault switches as the library read them before ABI 8, and
// names a malformed one.
func TestFaultsFromEnv(t *testing.T) {
	for _, tc := range []struct {
		step, rank, alloc string
		want              faults
		err               string
	}{
		{want: faults{rank: -1}},
		{step: "70", want: faults{step: 70, rank: -1}},
		{step: "3:lost", want: faults{step: 3, mode: 1, rank: -1}},
		{step: "4:early", rank: "1", want: faults{step: 4, mode: 2, rank: 1}},
		{alloc: "KV pool", want: faults{rank: -1, alloc: "KV pool"}},
		{step: "0", err: "GOLLM_CUDA_FAIL_STEP=0: want N, N:lost or N:early"},
		{step: "4:", err: "GOLLM_CUDA_FAIL_STEP=4:"},
		{step: "4:later", err: "GOLLM_CUDA_FAIL_STEP=4:later"},
		{step: "x", err: "GOLLM_CUDA_FAIL_STEP=x"},
		{rank: "65", err: "GOLLM_CUDA_FAIL_RANK=65: want the tensor-parallel rank"},
	} {
		t.Setenv(EnvFailStep, tc.step)
		t.Setenv(EnvFailRank, tc.rank)
		t.Setenv(EnvFailAlloc, tc.alloc)
		got, err := faultsFromEnv()
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%+v: error %v, want %q", tc, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%+v: %+v, %v; want %+v", tc, got, err, tc.want)
		}
		if tc.err == "" {
			c := got.c()
			if int(c.fail_step) != got.step || int(c.fail_mode) != got.mode || int(c.fail_rank) != got.rank ||
				(c.fail_alloc != nil) != (got.alloc != "") {
				t.Errorf("%+v crosses as %+v", got, c)
			}
			freeFaults(&c)
		}
	}
}

// TestBuiltLibraryChecksTheRecipe hands the built library recipes it cannot walk: each is
// refused before any device work (so without a GPU too) with an invalid-argument error
// naming the stage; the fixtures' own recipes pass the check (the load then goes on to the
// GPU, or fails there without one).
func TestBuiltLibraryChecksTheRecipe(t *testing.T) {
	l, err := openLib(builtLibrary(t))
	if err != nil {
		t.Fatal(err)
	}
	configs := map[string]model.Config{}
	for _, fixture := range []string{"phi3-tiny", "qwen3-tiny", "gemma2-tiny", "phi3-longrope-tiny"} {
		ck, err := model.Open(filepath.Join("..", "..", "testdata", fixture))
		if err != nil {
			t.Fatal(err)
		}
		configs[fixture] = ck.Config
		_ = ck.Close()
	}
	// phi3-tiny's layer 0: NORM 1, QKV 2, ROTARY 3, KV_WRITE 4, ATTENTION 5, OUT 6, RESIDUAL 7,
	// NORM 8, MLP 9; qwen3-tiny's: QK_NORM 3 after QKV 2; gemma2-tiny's: OUT 6, POST_NORM 7,
	// RESIDUAL 8, NORM 9, MLP 10, POST_NORM 11.
	for _, tc := range []struct {
		fixture, name string
		edit          func(r *cRecipe)
		want          string
	}{
		{"phi3-tiny", "the rotary after the KV write", func(r *cRecipe) { r.stages[3], r.stages[4] = r.stages[4], r.stages[3] },
			"recipe stage 3 (kv_write, layer 0): out of place: the forward pass walks rotary of layer 0 here"},
		{"phi3-tiny", "a layer's MLP missing", func(r *cRecipe) { r.stages = append(r.stages[:9:9], r.stages[10:]...) },
			"recipe stage 9 (residual, layer 0): out of place: the forward pass walks mlp of layer 0 here"},
		{"phi3-tiny", "a stage past the LM head", func(r *cRecipe) { r.stages = append(r.stages, r.stages[len(r.stages)-1]) },
			"past the LM head"},
		{"phi3-tiny", "an odd rotary width", func(r *cRecipe) { r.stages[3].rope_dim = 7 }, "rope_dim 7 must be even"},
		{"phi3-tiny", "frequencies past the table", func(r *cRecipe) { r.freqs = r.freqs[:1] }, "its 4 frequencies from 0 pass the 1 given"},
		{"phi3-tiny", "a negative soft-cap", func(r *cRecipe) { r.stages[5].softcap = -30 }, "softcap must be 0 or positive"},
		{"phi3-tiny", "a norm kind that is not the config's", func(r *cRecipe) { r.stages[1].norm = 0 }, "its norm kind is not the config's"},
		{"phi3-tiny", "an MLP kind the weights do not have", func(r *cRecipe) { r.stages[9].gated = 0 }, "gated is not the config's gated_mlp"},
		{"phi3-tiny", "a q/k norm the config has not", func(r *cRecipe) {
			r.stages = slices.Insert(r.stages, 3, recipeStage{kind: 10, weight: 17, norm: 1, eps: 1e-6})
		}, "recipe stage 3 (qk_norm, layer 0): out of place: the forward pass walks rotary of layer 0 here"},
		{"qwen3-tiny", "the q/k norm missing", func(r *cRecipe) { r.stages = slices.Delete(r.stages, 3, 4) },
			"recipe stage 3 (rotary, layer 0): out of place: the forward pass walks qk_norm of layer 0 here"},
		{"qwen3-tiny", "a q/k norm on another weight", func(r *cRecipe) { r.stages[3].weight = 18 },
			"recipe stage 3 (qk_norm, layer 0): weight is not its role"},
		{"qwen3-tiny", "a q/k LayerNorm", func(r *cRecipe) { r.stages[3].norm = 0 }, "only RMSNorm is implemented for it"},
		{"gemma2-tiny", "a post-norm after the residual", func(r *cRecipe) { r.stages[7], r.stages[8] = r.stages[8], r.stages[7] },
			"recipe stage 7 (residual, layer 0): out of place: the forward pass walks post_norm of layer 0 here"},
		{"gemma2-tiny", "a post-norm on the MLP's input norm", func(r *cRecipe) { r.stages[11].weight = 11 },
			"recipe stage 11 (post_norm, layer 0): weight is not its role"},
		{"gemma2-tiny", "an embedding scale of NaN", func(r *cRecipe) {
			inf := r.stages[0].scale + 3e38
			inf *= 10 // past float32's range
			r.stages[0].scale = inf - inf
		}, "recipe stage 0 (embed, layer -1): scale must be 0 or positive"},
		{"gemma2-tiny", "an infinite final soft-cap", func(r *cRecipe) {
			s := &r.stages[len(r.stages)-1]
			s.softcap = 3e38
			s.softcap *= 10
		}, "(lm_head, layer -1): softcap must be 0 or positive and finite"},
		{"phi3-longrope-tiny", "longrope's long set past the table", func(r *cRecipe) { r.freqs = r.freqs[:6] },
			"its 8 frequencies from 0 pass the 6 given"},
		{"phi3-longrope-tiny", "a zero cos/sin scale", func(r *cRecipe) { r.stages[3].rope_scale = 0 },
			"rope_scale must be positive and finite"},
	} {
		cfg := configs[tc.fixture]
		rec, err := recipeOf(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		tc.edit(&rec)
		var pin runtime.Pinner
		_, err = createWeights(l, 0, 1, &cfg, rec, nil, faults{rank: -1}, &pin)
		pin.Unpin()
		var ce *Error
		if !errors.As(err, &ce) || ce.Code != CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %s: %v, want an invalid argument containing %q", tc.fixture, tc.name, err, tc.want)
		}
	}
	for fixture, cfg := range configs {
		rec, _ := recipeOf(&cfg)
		var pin runtime.Pinner
		_, err = createWeights(l, 0, 1, &cfg, rec, nil, faults{rank: -1}, &pin)
		pin.Unpin()
		if err == nil || strings.Contains(err.Error(), "recipe") {
			t.Errorf("%s: the derived recipe without weights: %v, want it past the recipe's check (a missing weight or no GPU)", fixture, err)
		}
	}
}

// TestBuiltLibraryChecksTheExperts hands the built library mixture-of-experts recipes it
// cannot run — routing values out of range or not the weights', experts where the config
// has none — each refused before any device work, naming the stage; Mixtral's and
// Qwen2-MoE's derived recipes pass the check.
func TestBuiltLibraryChecksTheExperts(t *testing.T) {
	l, err := openLib(builtLibrary(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, fixture := range []string{"mixtral-tiny", "qwen2moe-tiny"} {
		ck, err := model.Open(filepath.Join("..", "..", "testdata", fixture))
		if err != nil {
			t.Fatal(err)
		}
		cfg := ck.Config
		_ = ck.Close()
		// Layer 0's MOE stage: EMBED, then NORM QKV ROTARY KV_WRITE ATTENTION OUT RESIDUAL NORM.
		const moe = 9
		for _, tc := range []struct {
			name string
			edit func(r *cRecipe, c *model.Config)
			want string
		}{
			{"no expert a token", func(r *cRecipe, _ *model.Config) { r.stages[moe].top_k = 0 },
				"recipe stage 9 (moe, layer 0): top_k 0 must be in [1, min(experts 8, 64)]"},
			{"more experts a token than experts", func(r *cRecipe, _ *model.Config) { r.stages[moe].top_k = 9 },
				"top_k 9 must be in [1, min(experts 8, 64)]"},
			{"experts the config has not", func(r *cRecipe, _ *model.Config) { r.stages[moe].experts = 16 },
				"experts is not the config's"},
			{"a shared expert the config has not", func(r *cRecipe, _ *model.Config) {
				r.stages[moe].shared = 1 - r.stages[moe].shared
			}, "shared is not the config's shared_inner > 0"},
			{"experts that are not gated", func(r *cRecipe, _ *model.Config) { r.stages[moe].gated = 0 },
				"experts are gated MLPs"},
			{"a config without experts", func(_ *cRecipe, c *model.Config) { c.MoE = nil }, "the config has no experts"},
		} {
			c := cfg
			rec, err := recipeOf(&c)
			if err != nil {
				t.Fatal(err)
			}
			if int(rec.stages[moe].kind) != int(model.StageMoE) {
				t.Fatalf("%s: stage %d is kind %d", fixture, moe, rec.stages[moe].kind)
			}
			tc.edit(&rec, &c)
			var pin runtime.Pinner
			_, err = createWeights(l, 0, 1, &c, rec, nil, faults{rank: -1}, &pin)
			pin.Unpin()
			var ce *Error
			if !errors.As(err, &ce) || ce.Code != CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s, %s: %v, want an invalid argument containing %q", fixture, tc.name, err, tc.want)
			}
		}
		rec, _ := recipeOf(&cfg)
		var pin runtime.Pinner
		_, err = createWeights(l, 0, 1, &cfg, rec, nil, faults{rank: -1}, &pin)
		pin.Unpin()
		// Past the recipe's checks the weights' own come first: the embedding's rows are
		// missing here ("0 rows given, the config implies ..."), or there is no GPU.
		if err == nil || strings.Contains(err.Error(), "recipe") ||
			(strings.Contains(err.Error(), "config") && !strings.Contains(err.Error(), " 0 rows given")) {
			t.Errorf("%s's derived recipe without weights: %v, want it past the checks (a missing weight or no GPU)", fixture, err)
		}
	}
}

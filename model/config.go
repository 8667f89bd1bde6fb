// Package model is the one place that knows architectures. It reads Hugging Face
// checkpoints — config.json, safetensors weights (single or sharded, memory-mapped),
// tokenizer.json, tokenizer_config.json and generation_config.json — and describes each
// model to the engines as a Config (the architecture descriptor) and a list of
// role-tagged weights. Each family (gpt2.go, llama.go) is a config parser and a mapping
// of the checkpoint's tensor names onto the canonical roles (roles.go); nothing outside
// this package reads a tensor name or a model_type string to decide anything.
package model

// NormKind is how a block normalises its input.
type NormKind uint8

const (
	// LayerNorm is (x - mean) / sqrt(var + eps) · w + b (GPT-2).
	LayerNorm NormKind = iota
	// RMSNorm is x / sqrt(mean(x²) + eps) · w, without a bias (LLaMA).
	RMSNorm
)

// String names the kind.
func (k NormKind) String() string {
	if k == RMSNorm {
		return "RMSNorm"
	}
	return "LayerNorm"
}

// PosKind is how positions enter the model.
type PosKind uint8

const (
	// LearnedPositions adds a position embedding table to the token embedding (GPT-2).
	LearnedPositions PosKind = iota
	// RotaryPositions rotates queries and keys by their position (LLaMA).
	RotaryPositions
)

// String names the kind.
func (k PosKind) String() string {
	if k == RotaryPositions {
		return "rotary"
	}
	return "learned"
}

// Activation is an MLP nonlinearity.
type Activation uint8

const (
	// ActGeluTanh is GELU's tanh approximation (gelu_new, gelu_pytorch_tanh, gelu_fast).
	ActGeluTanh Activation = iota
	// ActGeluErf is the exact erf GELU ("gelu").
	ActGeluErf
	// ActReLU is max(x, 0).
	ActReLU
	// ActSiLU is x · sigmoid(x) ("silu", "swish").
	ActSiLU
)

// String names the activation.
func (a Activation) String() string {
	switch a {
	case ActGeluErf:
		return "gelu"
	case ActReLU:
		return "relu"
	case ActSiLU:
		return "silu"
	}
	return "gelu_tanh"
}

// activations maps config.json's activation names onto the kernels both engines have.
var activations = map[string]Activation{
	"gelu_new": ActGeluTanh, "gelu_pytorch_tanh": ActGeluTanh, "gelu_fast": ActGeluTanh,
	"gelu": ActGeluErf, "relu": ActReLU, "silu": ActSiLU, "swish": ActSiLU,
}

// RopeKind is a rotary embedding's frequency scaling.
type RopeKind uint8

const (
	// RopeDefault uses inv_freq[i] = theta^(-2i/d) unchanged.
	RopeDefault RopeKind = iota
	// RopeLinear divides every frequency by Factor (position interpolation).
	RopeLinear
	// RopeLlama3 is Llama 3.1's wavelength-dependent scaling: long wavelengths divided
	// by Factor, short ones kept, the band between interpolated.
	RopeLlama3
	// RopeLongRope is Phi-3's longrope: frequency i divided by a per-pair factor, the
	// short set for a sequence of at most OriginalMaxPositions positions and the long set
	// beyond, with cos and sin times an attention factor (Rope.LongRope).
	RopeLongRope
)

// String names the kind as config.json's rope_type does.
func (k RopeKind) String() string {
	switch k {
	case RopeLinear:
		return "linear"
	case RopeLlama3:
		return "llama3"
	case RopeLongRope:
		return "longrope"
	}
	return "default"
}

// Rope describes rotary position embeddings. Dims are rotated in halves: dimension i
// pairs with i + Dim/2 (Hugging Face's rotate_half), over the first Dim dimensions of
// each head.
type Rope struct {
	// Theta is the base of the frequencies (rope_theta).
	Theta float64
	// Dim is the number of rotated dimensions of a head (head_dim, or less with a
	// partial rotary factor).
	Dim int
	// Kind picks the frequency scaling.
	Kind RopeKind
	// Factor scales the frequencies (linear, llama3).
	Factor float64
	// LowFreqFactor and HighFreqFactor bound llama3's interpolated band.
	LowFreqFactor, HighFreqFactor float64
	// OriginalMaxPositions is the context the model was trained on (llama3; longrope's
	// sequences longer than it take the long factors).
	OriginalMaxPositions int
	// LongRope holds longrope's factors (RopeLongRope); nil otherwise. A pointer, so that
	// Rope stays comparable (the engines key their frequency tables by it).
	LongRope *LongRope
}

// LongRope is longrope's scaling: per-pair divisors of the frequencies, one set for
// sequences within the original context and one beyond it, and a factor on cos and sin.
type LongRope struct {
	// Short and Long are the divisors, one per rotated pair [Dim/2].
	Short, Long []float64
	// AttnFactor multiplies cos and sin: attention_factor, or √(1 + ln s / ln original)
	// with s the context's growth (1 when s ≤ 1).
	AttnFactor float64
}

// Config is the architecture descriptor and hyperparameters of a checkpoint: everything
// an engine needs to run it, with no architecture name to interpret.
type Config struct {
	// Family names the loader that read the checkpoint ("gpt2", "llama"), for logs.
	Family string
	// ModelType is config.json's model_type as given ("gpt2", "llama", "mistral", "qwen2").
	ModelType string
	// VocabSize is the number of tokens (rows of the embedding and the LM head).
	VocabSize int
	// MaxPositions is the longest sequence the model takes.
	MaxPositions int
	// Hidden: the model's width (hidden_size, n_embd).
	Hidden int
	// Layers counts the transformer blocks.
	Layers int
	// Heads counts the query heads.
	Heads int
	// KVHeads is the number of key/value heads (Heads without grouped-query attention);
	// it divides Heads.
	KVHeads int
	// HeadDim is the width of one head (Hidden / Heads unless config.json says).
	HeadDim int
	// Inner is the MLP's inner width (the gate's and the up-projection's each when
	// GatedMLP).
	Inner int
	// Norm is the normalisation of the blocks and of the final norm.
	Norm NormKind
	// NormEps keeps the norms' division finite.
	NormEps float32
	// Positions is how positions are encoded.
	Positions PosKind
	// Rope describes the rotary embedding (RotaryPositions only).
	Rope Rope
	// QKVBias says the query, key and value projections carry a bias.
	QKVBias bool
	// OutBias says the attention output projection carries a bias.
	OutBias bool
	// MLPBias says the MLP projections carry biases.
	MLPBias bool
	// GatedMLP says the MLP is act(gate(x)) · up(x) → down (SwiGLU); otherwise
	// act(up(x)) → down.
	GatedMLP bool
	// Act: the MLP's nonlinearity.
	Act Activation
	// MoE, when set, makes the MLPs of the layers it marks a mixture of experts, each
	// expert a gated MLP with Act (moe.go); nil: every MLP is dense.
	MoE *MoE
	// TiedHead says the LM head is the token embedding.
	TiedHead bool
	// SlidingWindow, when positive, limits attention to the last SlidingWindow positions
	// (the query's own included) in the layers from WindowFromLayer on.
	SlidingWindow int
	// WindowFromLayer is the first layer with the sliding window.
	WindowFromLayer int
	// BOSID is bos_token_id; -1 when absent.
	BOSID int32
	// EOSIDs are the end-of-sequence tokens (eos_token_id may be a list); empty when none.
	EOSIDs []int32
	// DType is the checkpoint's weight type as stored ("float32", "float16", "bfloat16").
	DType string

	// QKNorm says the queries and keys are normalised per head (over HeadDim, with the
	// model's Norm and NormEps) before rotary, by RoleQNorm and RoleKNorm (Qwen3, Gemma 3).
	QKNorm bool
	// PostNorms says attention's and the MLP's outputs are normalised (RolePostAttnNorm,
	// RolePostMLPNorm) before the residual stream adds them (Gemma 2 and 3).
	PostNorms bool
	// EmbedScale, when positive, multiplies the token embedding (Gemma's √hidden). An
	// engine rounds it and the product to its activations' type, as transformers does.
	EmbedScale float64
	// QueryScale, when positive, is attention's query·key scale in place of 1/√HeadDim
	// (Gemma's query_pre_attn_scalar^-½).
	QueryScale float64
	// AttnSoftcap and FinalSoftcap, when positive, bound the attention scores (after the
	// scale, before the mask and softmax) and the final logits by c·tanh(x/c) (Gemma 2).
	AttnSoftcap, FinalSoftcap float64
	// SlidingLayers, when set, marks the layers that have the sliding window, in any
	// pattern (Gemma's alternate); when nil the window covers the layers from
	// WindowFromLayer on.
	SlidingLayers []bool
	// LocalRope, when its Dim is positive, is the rotary embedding of the layers
	// SlidingLayers marks (Gemma 3's rope_local_base_freq); Rope is the others'.
	LocalRope Rope
}

// QKVWidth is the fused QKV projection's output width: queries, then keys, then values.
func (c *Config) QKVWidth() int { return (c.Heads + 2*c.KVHeads) * c.HeadDim }

// AttnWidth is the width of the attention output (all query heads).
func (c *Config) AttnWidth() int { return c.Heads * c.HeadDim }

// LayerWindow is layer l's sliding window, or 0 for full attention.
func (c *Config) LayerWindow(l int) int {
	if c.SlidingLayers != nil {
		if c.SlidingLayers[l] {
			return c.SlidingWindow
		}
		return 0
	}
	if c.SlidingWindow > 0 && l >= c.WindowFromLayer {
		return c.SlidingWindow
	}
	return 0
}

// LayerRope is layer l's rotary embedding: LocalRope in the sliding layers where the
// model has one, else Rope.
func (c *Config) LayerRope(l int) Rope {
	if c.LocalRope.Dim > 0 && c.SlidingLayers != nil && c.SlidingLayers[l] {
		return c.LocalRope
	}
	return c.Rope
}

// AttnScale is attention's query·key scale: QueryScale where the model sets one, else
// 1/√HeadDim (AttentionScale).
func (c *Config) AttnScale() float32 {
	if c.QueryScale > 0 {
		return float32(c.QueryScale)
	}
	return AttentionScale(c.HeadDim)
}

// HasBias says whether the norm carries a bias vector.
func (k NormKind) HasBias() bool { return k == LayerNorm }

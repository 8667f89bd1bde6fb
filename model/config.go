// Package model loads Hugging Face checkpoints: config.json, safetensors weights (single
// or sharded, memory-mapped) and tokenizer.json.
package model

// Config holds the hyperparameters of a checkpoint, architecture-neutral.
type Config struct {
	// Arch is the model_type of config.json ("gpt2").
	Arch string
	// VocabSize is the number of tokens.
	VocabSize int
	// MaxPositions is the longest sequence (n_positions).
	MaxPositions int
	// Hidden is the model width (n_embd).
	Hidden int
	// Layers is the number of transformer blocks (n_layer).
	Layers int
	// Heads is the number of attention heads (n_head).
	Heads int
	// KVHeads is the number of key/value heads (Heads for GPT-2).
	KVHeads int
	// HeadDim is Hidden / Heads.
	HeadDim int
	// Inner is the MLP width (n_inner, default 4*Hidden).
	Inner int
	// LayerNormEps is layer_norm_epsilon.
	LayerNormEps float32
	// Activation is activation_function ("gelu_new").
	Activation string
	// BOSID and EOSID are bos_token_id and eos_token_id; -1 when absent.
	BOSID, EOSID int32
	// DType is the checkpoint's weight type as stored ("float32", "float16", "bfloat16").
	DType string
}

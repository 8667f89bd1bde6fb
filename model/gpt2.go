package model

// GPT2 holds a GPT-2 checkpoint's weights in float32, as the CPU engine uses them.
// Matrices keep the checkpoint's Conv1D layout, [in][out] row-major, so x·W is a
// plain row-vector product.
type GPT2 struct {
	// Config holds the hyperparameters.
	Config Config
	// WTE is the token embedding, [vocab][hidden]; the LM head is its transpose (tied).
	WTE []float32 `tensor:"wte.weight"`
	// WPE is the position embedding, [max_positions][hidden].
	WPE []float32 `tensor:"wpe.weight"`
	// Layers are the transformer blocks, in order.
	Layers []GPT2Layer
	// LNFW and LNFB are the final LayerNorm's scale and shift, [hidden].
	LNFW []float32 `tensor:"ln_f.weight"`
	LNFB []float32 `tensor:"ln_f.bias"`
}

// GPT2Layer is one transformer block; tensor names are relative to "h.<i>.".
type GPT2Layer struct {
	// LN1W, LN1B: LayerNorm before attention, [hidden].
	LN1W []float32 `tensor:"ln_1.weight"`
	LN1B []float32 `tensor:"ln_1.bias"`
	// AttnW [hidden][3*hidden] and AttnB [3*hidden]: the fused Q, K, V projection.
	AttnW []float32 `tensor:"attn.c_attn.weight"`
	AttnB []float32 `tensor:"attn.c_attn.bias"`
	// ProjW [hidden][hidden] and ProjB [hidden]: the attention output projection.
	ProjW []float32 `tensor:"attn.c_proj.weight"`
	ProjB []float32 `tensor:"attn.c_proj.bias"`
	// LN2W, LN2B: LayerNorm before the MLP, [hidden].
	LN2W []float32 `tensor:"ln_2.weight"`
	LN2B []float32 `tensor:"ln_2.bias"`
	// FCW [hidden][inner] and FCB [inner]: the MLP's first projection.
	FCW []float32 `tensor:"mlp.c_fc.weight"`
	FCB []float32 `tensor:"mlp.c_fc.bias"`
	// MLPProjW [inner][hidden] and MLPProjB [hidden]: the MLP's second projection.
	MLPProjW []float32 `tensor:"mlp.c_proj.weight"`
	MLPProjB []float32 `tensor:"mlp.c_proj.bias"`
}

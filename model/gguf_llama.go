package model

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// GGUF checkpoints: a .gguf file, or a folder that holds one and no config.json, read
// through llama.cpp's metadata and tensor names for the LLaMA family (its "llama" and
// "qwen2" architectures). Their weights keep their stored types (F32, F16, BF16, and
// the quantized Q8_0, Q4_K, Q6_K the CPU engine computes on); their tokenizer and chat
// template come from the metadata (gguf_tokenizer.go).

// ggufArchs are the GGUF architectures loaded, with whether llama.cpp's converter
// stored their query and key rows permuted for its rotary layout (LlamaModel's
// permute: each head's rows interleaved in pairs, where Hugging Face's rotate_half
// pairs dimension i with i + head_dim/2).
var ggufArchs = map[string]bool{"llama": true, "qwen2": false}

// GGUFPath returns the GGUF file of a checkpoint path — path itself when it names a
// .gguf file, or the one .gguf file of a folder without a config.json — and "" for a
// Hugging Face folder. A folder with several .gguf files and no config.json is an error
// naming them.
func GGUFPath(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		if strings.HasSuffix(strings.ToLower(path), ".gguf") {
			return path, nil
		}
		return "", fmt.Errorf("%s is a file but not a .gguf file (a checkpoint is a folder or a GGUF file)", path)
	}
	if _, err := os.Stat(filepath.Join(path, "config.json")); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	matches, err := filepath.Glob(filepath.Join(path, "*.gguf"))
	if err != nil {
		return "", err
	}
	switch len(matches) {
	case 0:
		return "", nil
	case 1:
		return matches[0], nil
	}
	names := make([]string, len(matches))
	for i, m := range matches {
		names[i] = filepath.Base(m)
	}
	sort.Strings(names)
	return "", fmt.Errorf("%s holds several GGUF files (%s) and no config.json: point gpt_model_path at one of them", path, strings.Join(names, ", "))
}

// openGGUFCheckpoint opens the GGUF file at path as a checkpoint.
func openGGUFCheckpoint(dir, path string) (_ *Checkpoint, err error) {
	g, err := openGGUF(path)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %w", err)
	}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	cfg, fam, fields, err := g.llamaConfig()
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %s: %w", path, err)
	}
	if err := cfg.check(fields); err != nil {
		return nil, fmt.Errorf("open checkpoint: %s: %w", path, err)
	}
	c := &Checkpoint{Dir: dir, GGUF: path, Config: cfg, fam: fam, fields: fields, tensors: g.tensors, gguf: g}
	return c, nil
}

// ggufFamily is the tensor naming of llama.cpp's LLaMA-family architectures. permuted
// says the query and key rows are stored in llama.cpp's rotary order.
func ggufFamily(arch string, permuted bool) *family {
	return &family{
		name:        "llama",
		modelTypes:  []string{arch},
		layerPrefix: func(l int) string { return fmt.Sprintf("blk.%d.", l) },
		names: func(c *Config, r Role, l int) []partName {
			return ggufNames(c, r, l, permuted)
		},
	}
}

// ggufNames maps the roles onto llama.cpp's tensor names; q/k/v and gate/up are joined
// along their rows as the Hugging Face loader joins them.
func ggufNames(c *Config, r Role, l int, permuted bool) []partName {
	one := func(name string) []partName { return []partName{{name: name}} }
	if !r.PerLayer() {
		switch r {
		case RoleEmbed:
			return one("token_embd.weight")
		case RoleFinalNorm:
			return one("output_norm.weight")
		case RoleLMHead:
			return one("output.weight")
		}
		return nil
	}
	lp := fmt.Sprintf("blk.%d.", l)
	qkv := func(suffix string) []partName {
		q, k := 0, 0
		if permuted {
			q, k = c.Heads, c.KVHeads
		}
		return []partName{{name: lp + "attn_q." + suffix, ropeHeads: q}, {name: lp + "attn_k." + suffix, ropeHeads: k},
			{name: lp + "attn_v." + suffix}}
	}
	gateUp := func(suffix string) []partName {
		return []partName{{name: lp + "ffn_gate." + suffix}, {name: lp + "ffn_up." + suffix}}
	}
	switch r {
	case RoleAttnNorm:
		return one(lp + "attn_norm.weight")
	case RoleQKV:
		return qkv("weight")
	case RoleQKVBias:
		return qkv("bias")
	case RoleOut:
		return one(lp + "attn_output.weight")
	case RoleOutBias:
		return one(lp + "attn_output.bias")
	case RoleMLPNorm:
		return one(lp + "ffn_norm.weight")
	case RoleUp:
		return gateUp("weight")
	case RoleUpBias:
		return gateUp("bias")
	case RoleDown:
		return one(lp + "ffn_down.weight")
	case RoleDownBias:
		return one(lp + "ffn_down.bias")
	}
	return nil
}

// ropePerm is the row order of a part of heads heads stored as llama.cpp's converter
// permutes them: within each head of d rows, stored row 2i+s is canonical row
// s·d/2 + i.
func ropePerm(rows, heads int) ([]int32, error) {
	if heads < 1 || rows%heads != 0 || rows/heads%2 != 0 {
		return nil, fmt.Errorf("%d rows do not split into %d heads of an even size", rows, heads)
	}
	d := rows / heads
	perm := make([]int32, rows)
	for h := range heads {
		for i := range d / 2 {
			for s := range 2 {
				perm[h*d+2*i+s] = int32(h*d + s*d/2 + i)
			}
		}
	}
	return perm, nil
}

// llamaConfig reads the descriptor from the metadata of a LLaMA-family GGUF file. Every
// error names the metadata key (or tensor) it comes from.
func (g *ggufFile) llamaConfig() (Config, *family, map[string]string, error) {
	arch, err := g.str("general.architecture")
	if err != nil {
		return Config{}, nil, nil, err
	}
	permuted, ok := ggufArchs[arch]
	if !ok {
		var names []string
		for a := range ggufArchs {
			names = append(names, a)
		}
		sort.Strings(names)
		return Config{}, nil, nil, fmt.Errorf("metadata \"general.architecture\": %q is not supported (supported: %s)", arch, strings.Join(names, ", "))
	}
	key := func(k string) string { return arch + "." + k }
	fields := map[string]string{
		"positions": key("context_length"), "hidden": key("embedding_length"), "layers": key("block_count"),
		"heads": key("attention.head_count"), "kv_heads": key("attention.head_count_kv"), "inner": key("feed_forward_length"),
		"eps": key("attention.layer_norm_rms_epsilon"), "head_dim": key("attention.key_length"), "rope_theta": key("rope.freq_base"),
		"rope_factor": key("rope.scaling.factor"),
	}
	c := Config{Family: "llama", ModelType: arch, BOSID: -1, Norm: RMSNorm, Positions: RotaryPositions, GatedMLP: true, Act: ActSiLU}
	var first error
	need := func(k string) int {
		v, err := g.uint(k)
		if err == nil && v > 1<<31 {
			err = fmt.Errorf("metadata %q: %d is out of range", k, v)
		}
		if err != nil && first == nil {
			first = err
		}
		return int(v)
	}
	opt := func(k string, def int) int {
		if _, ok := g.meta[k]; !ok {
			return def
		}
		return need(k)
	}
	c.MaxPositions = need(key("context_length"))
	c.Hidden = need(key("embedding_length"))
	c.Layers = need(key("block_count"))
	c.Heads = need(key("attention.head_count"))
	c.KVHeads = opt(key("attention.head_count_kv"), c.Heads)
	c.Inner = need(key("feed_forward_length"))
	if first != nil {
		return Config{}, nil, nil, first
	}
	if c.Heads < 1 {
		return Config{}, nil, nil, fmt.Errorf("metadata %q: %d heads", key("attention.head_count"), c.Heads)
	}
	c.HeadDim = opt(key("attention.key_length"), c.Hidden/c.Heads)
	if v := opt(key("attention.value_length"), c.HeadDim); v != c.HeadDim && first == nil {
		first = fmt.Errorf("metadata %q: %d differs from the key length %d (not supported)", key("attention.value_length"), v, c.HeadDim)
	}
	eps, err := g.float(key("attention.layer_norm_rms_epsilon"))
	if err != nil && first == nil {
		first = err
	}
	c.NormEps = float32(eps)
	// The vocabulary: the model's own size where the file gives it, else the tokenizer's.
	if _, ok := g.meta[key("vocab_size")]; ok {
		c.VocabSize = need(key("vocab_size"))
		fields["vocab"] = key("vocab_size")
	} else if toks, err := g.array("tokenizer.ggml.tokens", ggufString); err == nil {
		c.VocabSize = toks.n
		fields["vocab"] = "tokenizer.ggml.tokens (its length)"
	} else if t := g.tensors["token_embd.weight"]; t != nil && len(t.Shape) == 2 {
		c.VocabSize = t.Shape[0]
		fields["vocab"] = "token_embd.weight (its rows)"
	}
	if first != nil {
		return Config{}, nil, nil, first
	}
	c.Rope = Rope{Theta: 10000, Dim: c.HeadDim, Factor: 1}
	if _, ok := g.meta[key("rope.freq_base")]; ok {
		if c.Rope.Theta, err = g.float(key("rope.freq_base")); err != nil {
			return Config{}, nil, nil, err
		}
	}
	if d := opt(key("rope.dimension_count"), c.HeadDim); d != c.HeadDim {
		return Config{}, nil, nil, fmt.Errorf("metadata %q: %d rotated dimensions of %d (partial rotary embeddings are not supported)", key("rope.dimension_count"), d, c.HeadDim)
	}
	if first != nil {
		return Config{}, nil, nil, first
	}
	switch typ, err := g.str(key("rope.scaling.type")); {
	case errors.Is(err, errNoKey), err == nil && (typ == "none" || typ == ""):
	case err != nil:
		return Config{}, nil, nil, err
	case typ == "linear":
		c.Rope.Kind = RopeLinear
		if c.Rope.Factor, err = g.float(key("rope.scaling.factor")); err != nil {
			return Config{}, nil, nil, err
		}
	default:
		return Config{}, nil, nil, fmt.Errorf("metadata %q: %q is not supported (supported: none, linear)", key("rope.scaling.type"), typ)
	}
	if t := g.tensors["rope_freqs.weight"]; t != nil {
		// Llama 3.1's frequency scaling, which llama.cpp's converter stores as each
		// frequency's divisor.
		if t.DType != "F32" || len(t.Shape) != 1 || t.Shape[0] != c.HeadDim/2 {
			return Config{}, nil, nil, fmt.Errorf("tensor rope_freqs.weight: %s %v, want F32 [%d]", t.DType, t.Shape, c.HeadDim/2)
		}
		v, err := t.Float32()
		if err != nil {
			return Config{}, nil, nil, err
		}
		div := make([]float64, len(v))
		for i, f := range v {
			if !(f > 0) {
				return Config{}, nil, nil, fmt.Errorf("tensor rope_freqs.weight: value %d is %g, want a positive divisor", i, f)
			}
			div[i] = float64(f)
		}
		// Longrope's per-pair divisors, the same set at any length, cos and sin unscaled.
		c.Rope.Kind, c.Rope.OriginalMaxPositions = RopeLongRope, c.MaxPositions
		c.Rope.LongRope = &LongRope{Short: div, Long: div, AttnFactor: 1}
	}
	has := func(name string) bool { return g.tensors[name] != nil }
	c.TiedHead = !has("output.weight")
	c.QKVBias = has("blk.0.attn_q.bias")
	c.OutBias = has("blk.0.attn_output.bias")
	c.MLPBias = has("blk.0.ffn_up.bias")
	if v, err := g.uint("tokenizer.ggml.bos_token_id"); err == nil && v < 1<<31 {
		c.BOSID = int32(v)
	}
	for _, k := range []string{"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		if v, err := g.uint(k); err == nil && v < 1<<31 && !containsID(c.EOSIDs, int32(v)) {
			c.EOSIDs = append(c.EOSIDs, int32(v))
		}
	}
	if t := g.tensors["token_embd.weight"]; t != nil {
		c.DType = torchDTypes[t.DType] // "" for the quantized types
	}
	return c, ggufFamily(arch, permuted), fields, nil
}

// containsID says whether ids holds id.
func containsID(ids []int32, id int32) bool {
	for _, v := range ids {
		if v == id {
			return true
		}
	}
	return false
}

// Package enginetest holds what the engines' tests and checks share: random models of
// any architecture the descriptor can express, the golden files transformers writes,
// and the error measures they are compared with.
package enginetest

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"gollm/model"
)

// RelL2 returns ‖got-want‖₂ / ‖want‖₂ (‖got-want‖₂ when want is zero), or +Inf for
// different lengths. Equal infinities (a logit masked in both) count as agreeing.
func RelL2(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range want {
		if math.IsInf(float64(want[i]), 0) && got[i] == want[i] {
			continue
		}
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// MaxAbsDiff returns the largest |got[i]-want[i]|, or +Inf for different lengths.
func MaxAbsDiff(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var m float64
	for i := range want {
		m = max(m, math.Abs(float64(got[i])-float64(want[i])))
	}
	return m
}

// GPT2 is a GPT-2-shaped descriptor: LayerNorm, learned positions, biases everywhere,
// a GELU MLP four times as wide as the model, a tied head.
func GPT2(vocab, positions, hidden, layers, heads int) model.Config {
	return model.Config{
		Family: "gpt2", ModelType: "gpt2", VocabSize: vocab, MaxPositions: positions, Hidden: hidden,
		Layers: layers, Heads: heads, KVHeads: heads, HeadDim: hidden / heads, Inner: 4 * hidden,
		Norm: model.LayerNorm, NormEps: 1e-5, Positions: model.LearnedPositions,
		QKVBias: true, OutBias: true, MLPBias: true, Act: model.ActGeluTanh, TiedHead: true,
		BOSID: 0, EOSIDs: []int32{int32(vocab - 1)}, DType: "float32",
	}
}

// Llama is a LLaMA-shaped descriptor: RMSNorm, rotary positions (theta 10000), grouped-
// query attention with kvHeads, a gated SiLU MLP of inner units, a separate head.
func Llama(vocab, positions, hidden, layers, heads, kvHeads, inner int) model.Config {
	hd := hidden / heads
	return model.Config{
		Family: "llama", ModelType: "llama", VocabSize: vocab, MaxPositions: positions, Hidden: hidden,
		Layers: layers, Heads: heads, KVHeads: kvHeads, HeadDim: hd, Inner: inner,
		Norm: model.RMSNorm, NormEps: 1e-6, Positions: model.RotaryPositions,
		Rope:     model.Rope{Theta: 10000, Dim: hd, Factor: 1},
		GatedMLP: true, Act: model.ActSiLU,
		BOSID: 1, EOSIDs: []int32{2}, DType: "float32",
	}
}

// Random fills every role of cfg with random weights, spread like the checkpoints the
// fixtures use (wide enough that logits are peaked, so that greedy choices differ by far
// more than rounding).
func Random(cfg model.Config, seed uint64) *model.Float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	normal := func(n int, mean, std float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = mean + std*float32(rng.NormFloat64())
		}
		return x
	}
	std := float32(1 / math.Sqrt(float64(cfg.Hidden)))
	fill := func(r model.Role, l int) []float32 {
		rows, cols, present := cfg.Shape(r)
		if l >= 0 {
			rows, cols, present = cfg.LayerShape(r, l)
		}
		if !present {
			return nil
		}
		n := rows * cols
		switch r {
		case model.RoleEmbed, model.RoleLMHead:
			return normal(n, 0, 0.3)
		case model.RolePosEmbed:
			return normal(n, 0, 0.1)
		case model.RoleFinalNorm, model.RoleAttnNorm, model.RoleMLPNorm:
			return normal(n, 1, 0.1)
		case model.RoleQKV:
			return normal(n, 0, 2*std)
		case model.RoleDown, model.RoleExpertDown, model.RoleSharedDown:
			return normal(n, 0, std/2)
		case model.RoleOut, model.RoleUp, model.RoleExpertUp, model.RoleSharedUp, model.RoleSharedGate:
			return normal(n, 0, std)
		case model.RoleRouter:
			return normal(n, 0, 4*std)
		}
		return normal(n, 0, 0.1) // biases
	}
	m := &model.Float32{Config: cfg, Layers: make([][model.NumRoles][]float32, cfg.Layers)}
	for r := model.Role(0); r < model.FirstLayerRole; r++ {
		m.Model[r] = fill(r, -1)
	}
	for l := range m.Layers {
		for r := model.FirstLayerRole; r < model.NumRoles; r++ {
			m.Layers[l][r] = fill(r, l)
		}
	}
	return m
}

// ReadSafetensors reads every tensor of one safetensors file (a golden file is a plain
// tensor dump, not a checkpoint folder, so it is read directly).
func ReadSafetensors(path string) (map[string]*model.Tensor, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(raw) < 8 {
		return nil, fmt.Errorf("%s: too short for a safetensors file", path)
	}
	n := binary.LittleEndian.Uint64(raw)
	if n > uint64(len(raw)-8) {
		return nil, fmt.Errorf("%s: header length %d beyond the file", path, n)
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+n], &header); err != nil {
		return nil, fmt.Errorf("%s: header: %w", path, err)
	}
	data := raw[8+n:]
	out := map[string]*model.Tensor{}
	for name, msg := range header {
		if name == "__metadata__" {
			continue
		}
		var info struct {
			DType   string `json:"dtype"`
			Shape   []int  `json:"shape"`
			Offsets [2]int `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &info); err != nil {
			return nil, fmt.Errorf("%s: tensor %s: %w", path, name, err)
		}
		if info.Offsets[0] < 0 || info.Offsets[1] > len(data) || info.Offsets[0] > info.Offsets[1] {
			return nil, fmt.Errorf("%s: tensor %s: offsets %v outside the data", path, name, info.Offsets)
		}
		out[name] = &model.Tensor{Name: name, DType: info.DType, Shape: info.Shape, Data: data[info.Offsets[0]:info.Offsets[1]]}
	}
	return out, nil
}

// Golden holds transformers' reference outputs for a fixture checkpoint.
type Golden struct {
	// PromptIDs were fed to transformers for the logits below.
	PromptIDs []int32
	// PromptLogits are the prompt's logits [len(PromptIDs)][vocab].
	PromptLogits []float32
	// Greedy are the greedy tokens after the prompt.
	Greedy []int32
	// DecodeLogits are the logits of each decode step [len(Greedy)][vocab].
	DecodeLogits []float32
}

// LoadGolden reads a golden file written by testdata/make_fixture.py.
func LoadGolden(path string) (Golden, error) {
	ts, err := ReadSafetensors(path)
	if err != nil {
		return Golden{}, err
	}
	var g Golden
	for _, f := range []struct {
		name string
		i32  *[]int32
		f32  *[]float32
	}{
		{"prompt_ids", &g.PromptIDs, nil}, {"greedy_tokens", &g.Greedy, nil},
		{"prompt_logits", nil, &g.PromptLogits}, {"decode_logits", nil, &g.DecodeLogits},
	} {
		x, ok := ts[f.name]
		if !ok {
			return Golden{}, fmt.Errorf("%s lacks %s", path, f.name)
		}
		if f.i32 != nil {
			*f.i32, err = x.Int32()
		} else {
			*f.f32, err = x.Float32()
		}
		if err != nil {
			return Golden{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	return g, nil
}

// BeamCase is one beam search transformers answered (testdata/beam-golden.json, written
// by testdata/make_beam_fixture.py): the checkpoint, the prompt, the search's settings
// and the sequences it returned, best first.
type BeamCase struct {
	Model         string  `json:"model"`
	Prompt        []int32 `json:"prompt"`
	Case          string  `json:"case"`
	Beams         int     `json:"beams"`
	EndID         int32   `json:"end_id"`
	LengthPenalty float32 `json:"length_penalty"`
	EarlyStopping int     `json:"early_stopping"`
	MaxNewTokens  int     `json:"max_new_tokens"`
	Sequences     []struct {
		// Tokens are the generated tokens, the end token included where one ended it.
		Tokens []int32 `json:"tokens"`
		// Score is transformers' sequence score: the sum over length^length_penalty.
		Score float64 `json:"score"`
	} `json:"sequences"`
}

// Name names the case for subtests.
func (c BeamCase) Name() string { return fmt.Sprintf("%s/%s/prompt%d", c.Model, c.Case, len(c.Prompt)) }

// LoadBeamGolden reads testdata/beam-golden.json's cases.
func LoadBeamGolden(path string) ([]BeamCase, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var g struct {
		Cases []BeamCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(g.Cases) == 0 {
		return nil, fmt.Errorf("%s: no cases", path)
	}
	return g.Cases, nil
}

// GGUFPythonPath is the PYTHONPATH testdata/make_gguf.py runs with: the gguf package and
// numpy that scripts/deps.sh installs into root/.deps.
func GGUFPythonPath(root string) string {
	return filepath.Join(root, ".deps", "gguf") + string(os.PathListSeparator) + filepath.Join(root, ".deps", "py")
}

// MakeGGUF runs testdata/make_gguf.py with args (its first the command: model, spm,
// bpe), root being the repository's root.
func MakeGGUF(root string, args ...string) error {
	cmd := exec.Command("python3", append([]string{filepath.Join(root, "testdata", "make_gguf.py")}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+GGUFPythonPath(root))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("python3 testdata/make_gguf.py %s (scripts/deps.sh installs the gguf package it needs): %w\n%s",
			strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

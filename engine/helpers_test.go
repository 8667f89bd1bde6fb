package engine

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"gollm/model"
)

// loadGPT2 opens a checkpoint folder and loads it as GPT-2.
func loadGPT2(t testing.TB, dir string) *model.GPT2 {
	t.Helper()
	m, err := model.LoadGPT2Dir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// readSafetensors reads every tensor of one safetensors file (the golden file is a
// plain tensor dump, not a checkpoint folder, so it is read directly).
func readSafetensors(t testing.TB, path string) map[string]*model.Tensor {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) < 8 {
		t.Fatalf("%s: too short for a safetensors file", path)
	}
	n := binary.LittleEndian.Uint64(raw)
	if n > uint64(len(raw)-8) {
		t.Fatalf("%s: header length %d beyond the file", path, n)
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+n], &header); err != nil {
		t.Fatalf("%s: header: %v", path, err)
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
			t.Fatalf("%s: tensor %s: %v", path, name, err)
		}
		if info.Offsets[0] < 0 || info.Offsets[1] > len(data) || info.Offsets[0] > info.Offsets[1] {
			t.Fatalf("%s: tensor %s: offsets %v outside the data", path, name, info.Offsets)
		}
		out[name] = &model.Tensor{Name: name, DType: info.DType, Shape: info.Shape, Data: data[info.Offsets[0]:info.Offsets[1]]}
	}
	return out
}

// golden holds transformers' reference outputs for the tiny fixture.
type golden struct {
	// promptIDs is the prompt [12].
	promptIDs []int32
	// promptLogits are the prompt's logits [12][vocab].
	promptLogits []float32
	// greedy are the 16 greedy tokens after the prompt.
	greedy []int32
	// decodeLogits are the logits of the 16 decode steps [16][vocab].
	decodeLogits []float32
}

// loadGolden reads testdata/gpt2-tiny-golden.safetensors.
func loadGolden(t testing.TB) golden {
	t.Helper()
	ts := readSafetensors(t, "../testdata/gpt2-tiny-golden.safetensors")
	get := func(name string) *model.Tensor {
		x, ok := ts[name]
		if !ok {
			t.Fatalf("golden file lacks %s", name)
		}
		return x
	}
	var g golden
	var err error
	if g.promptIDs, err = get("prompt_ids").Int32(); err != nil {
		t.Fatal(err)
	}
	if g.greedy, err = get("greedy_tokens").Int32(); err != nil {
		t.Fatal(err)
	}
	if g.promptLogits, err = get("prompt_logits").Float32(); err != nil {
		t.Fatal(err)
	}
	if g.decodeLogits, err = get("decode_logits").Float32(); err != nil {
		t.Fatal(err)
	}
	return g
}

// relL2 returns ‖got-want‖₂ / ‖want‖₂.
func relL2(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	return math.Sqrt(num / den)
}

// maxAbsDiff returns the largest |got[i]-want[i]|, or +Inf for different lengths.
func maxAbsDiff(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var m float64
	for i := range want {
		m = max(m, math.Abs(float64(got[i])-float64(want[i])))
	}
	return m
}

// randomGPT2 builds a GPT-2 of the given shape in memory with random weights, spread
// like the fixture's (wide enough that logits are peaked).
func randomGPT2(vocab, positions, hidden, layers, heads int, seed uint64) *model.GPT2 {
	rng := rand.New(rand.NewPCG(seed, 1))
	normal := func(n int, mean, std float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = mean + std*float32(rng.NormFloat64())
		}
		return x
	}
	inner := 4 * hidden
	std := float32(1 / math.Sqrt(float64(hidden)))
	m := &model.GPT2{
		Config: model.Config{
			Arch: "gpt2", VocabSize: vocab, MaxPositions: positions, Hidden: hidden,
			Layers: layers, Heads: heads, KVHeads: heads, HeadDim: hidden / heads,
			Inner: inner, LayerNormEps: 1e-5, Activation: "gelu_new",
			BOSID: 0, EOSID: int32(vocab - 1), DType: "float32",
		},
		WTE:  normal(vocab*hidden, 0, 0.3),
		WPE:  normal(positions*hidden, 0, 0.1),
		LNFW: normal(hidden, 1, 0.1),
		LNFB: normal(hidden, 0, 0.1),
	}
	for range layers {
		m.Layers = append(m.Layers, model.GPT2Layer{
			LN1W: normal(hidden, 1, 0.1), LN1B: normal(hidden, 0, 0.1),
			AttnW: normal(hidden*3*hidden, 0, 2*std), AttnB: normal(3*hidden, 0, 0.1),
			ProjW: normal(hidden*hidden, 0, std), ProjB: normal(hidden, 0, 0.1),
			LN2W: normal(hidden, 1, 0.1), LN2B: normal(hidden, 0, 0.1),
			FCW: normal(hidden*inner, 0, std), FCB: normal(inner, 0, 0.1),
			MLPProjW: normal(inner*hidden, 0, std/2), MLPProjB: normal(hidden, 0, 0.1),
		})
	}
	return m
}

// randomTokens returns n tokens below vocab.
func randomTokens(rng *rand.Rand, n, vocab int) []int32 {
	x := make([]int32, n)
	for i := range x {
		x[i] = int32(rng.IntN(vocab))
	}
	return x
}

// mustStep runs one step and fails the test on error.
func mustStep(t testing.TB, e Engine, seqs ...Sequence) []Output {
	t.Helper()
	outs, err := e.Step(&Batch{Seqs: seqs})
	if err != nil {
		t.Fatalf("step: %v", err)
	}
	if len(outs) != len(seqs) {
		t.Fatalf("step returned %d outputs for %d sequences", len(outs), len(seqs))
	}
	return outs
}

// newCPU builds an engine and fails the test on error.
func newCPU(t testing.TB, m *model.GPT2, blocks, perBlock int) *CPU {
	t.Helper()
	e, err := NewCPU(m, KVConfig{NumBlocks: blocks, TokensPerBlock: perBlock})
	if err != nil {
		t.Fatalf("NewCPU: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// kernelPath names one matmul kernel path and selects it for a test.
type kernelPath struct {
	// name describes the path in test names.
	name string
	// use selects the path until the test ends.
	use func(t testing.TB)
}

// kernelPaths lists the kernel paths this machine can run: the pure-Go loops always,
// the AVX2 assembly where the CPU has it.
func kernelPaths(t testing.TB) []kernelPath {
	t.Helper()
	choose := func(avx bool) func(t testing.TB) {
		return func(t testing.TB) {
			old := useAVX2
			useAVX2 = avx
			t.Cleanup(func() { useAVX2 = old })
		}
	}
	paths := []kernelPath{{"the pure-Go kernels", choose(false)}}
	if useAVX2 {
		paths = append(paths, kernelPath{"the AVX2 kernels", choose(true)})
	} else {
		t.Log("this CPU lacks AVX2/FMA: only the pure-Go kernels are tested")
	}
	return paths
}

// forEachKernelPath runs f as a subtest with each kernel path in use.
func forEachKernelPath(t *testing.T, f func(t *testing.T)) {
	for _, path := range kernelPaths(t) {
		t.Run("with "+path.name, func(t *testing.T) {
			path.use(t)
			f(t)
		})
	}
}

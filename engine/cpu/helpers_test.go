package cpu

import (
	"math/rand/v2"
	"testing"

	"gollm/engine"
	"gollm/engine/enginetest"
	"gollm/model"
)

// Engine-package types under short names, for the tests.
type (
	// Sequence is engine.Sequence.
	Sequence = engine.Sequence
	// SamplingParams is engine.SamplingParams.
	SamplingParams = engine.SamplingParams
	// Batch is engine.Batch.
	Batch = engine.Batch
	// Output is engine.Output.
	Output = engine.Output
	// KVConfig is engine.KVConfig.
	KVConfig = engine.KVConfig
	// BlockCopy is engine.BlockCopy.
	BlockCopy = engine.BlockCopy
)

// loadModel loads a checkpoint folder in float32.
func loadModel(t testing.TB, dir string) *model.Float32 {
	t.Helper()
	m, err := model.LoadFloat32(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// golden holds transformers' reference outputs for a fixture.
type golden struct {
	// promptIDs were fed to transformers for the logits below.
	promptIDs []int32
	// promptLogits are the prompt's logits [len(promptIDs)][vocab].
	promptLogits []float32
	// greedy are the greedy tokens after the prompt.
	greedy []int32
	// decodeLogits are the logits of the decode steps [len(greedy)][vocab].
	decodeLogits []float32
}

// loadGolden reads a golden file of testdata/.
func loadGolden(t testing.TB, path string) golden {
	t.Helper()
	g, err := enginetest.LoadGolden(path)
	if err != nil {
		t.Fatal(err)
	}
	return golden{promptIDs: g.PromptIDs, promptLogits: g.PromptLogits, greedy: g.Greedy, decodeLogits: g.DecodeLogits}
}

// relL2 and maxAbsDiff are enginetest's.
var (
	relL2      = enginetest.RelL2
	maxAbsDiff = enginetest.MaxAbsDiff
)

// randomGPT2 builds a GPT-2 of the given shape in memory with random weights.
func randomGPT2(vocab, positions, hidden, layers, heads int, seed uint64) *model.Float32 {
	return enginetest.Random(enginetest.GPT2(vocab, positions, hidden, layers, heads), seed)
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
func mustStep(t testing.TB, e engine.Engine, seqs ...Sequence) []Output {
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
func newCPU(t testing.TB, m *model.Float32, blocks, perBlock int) *Engine {
	t.Helper()
	e, err := NewFromModel(m, KVConfig{NumBlocks: blocks, TokensPerBlock: perBlock})
	if err != nil {
		t.Fatalf("NewFromModel: %v", err)
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
// the AVX2 assembly where the CPU has it, and with it the AVX-512 kernels (the register
// tile of prompt steps, VNNI's Q8_0, BF16's bfloat16 kernels) where the CPU has those
// too.
func kernelPaths(t testing.TB) []kernelPath {
	t.Helper()
	hasAVX2, hasVNNI, hasTile, hasBF16 := useAVX2, useVNNI, useTile, useBF16
	choose := func(avx, vnni, tile, bf bool) func(t testing.TB) {
		return func(t testing.TB) {
			oldA, oldV, oldT, oldB := useAVX2, useVNNI, useTile, useBF16
			useAVX2, useVNNI, useTile, useBF16 = avx, vnni, tile, bf
			t.Cleanup(func() { useAVX2, useVNNI, useTile, useBF16 = oldA, oldV, oldT, oldB })
		}
	}
	paths := []kernelPath{{"the pure-Go kernels", choose(false, false, false, false)}}
	if hasAVX2 {
		paths = append(paths, kernelPath{"the AVX2 kernels", choose(true, false, false, false)})
	} else {
		t.Log("this CPU lacks AVX2/FMA/F16C: only the pure-Go kernels are tested")
	}
	if hasTile || hasVNNI {
		paths = append(paths, kernelPath{"the AVX-512 kernels", choose(true, hasVNNI, hasTile, hasBF16)})
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

// randomLogits returns n logits with a spread like a real model's.
func randomLogits(rng *rand.Rand, n int, std float64) []float32 {
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(rng.NormFloat64() * std)
	}
	return l
}

package cuda

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"gollm/engine"
	"gollm/model"
)

func TestSplitBatch(t *testing.T) {
	b := &engine.Batch{Seqs: []engine.Sequence{
		{Tokens: make([]int32, 10)}, {Tokens: make([]int32, 1)}, {Tokens: make([]int32, 3)},
	}}
	tests := []struct {
		name              string
		maxTokens, maxSeq int
		want              [][]piece
	}{
		{"a batch within the limits is one call", 100, 10, [][]piece{{{0, 0, 10, true, false}, {1, 0, 1, true, false}, {2, 0, 3, true, false}}}},
		{"a long prompt is cut into chunks", 4, 10, [][]piece{
			{{0, 0, 4, false, false}}, {{0, 4, 8, false, false}}, {{0, 8, 10, true, false}, {1, 0, 1, true, false}, {2, 0, 1, false, false}}, {{2, 1, 3, true, false}},
		}},
		{"too many sequences start a new call", 100, 2, [][]piece{{{0, 0, 10, true, false}, {1, 0, 1, true, false}}, {{2, 0, 3, true, false}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := splitBatch(b, tc.maxTokens, tc.maxSeq)
			if !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Fatalf("splitBatch = %v, want %v", got, tc.want)
			}
		})
	}
}

func testInfo() engine.Info {
	return engine.Info{VocabSize: 50, MaxSeqLen: 64, NumBlocks: 8, TokensPerBlock: 4}
}

func TestBuildFlattensSequences(t *testing.T) {
	info := testInfo()
	var p stepPrep
	p.init(info.VocabSize)
	bias := make([]float32, info.VocabSize)
	b := &engine.Batch{Seqs: []engine.Sequence{
		{ID: 1, Tokens: []int32{1, 2, 3, 4, 5}, Pos: 0, Blocks: []int32{6, 2, 7}, ContextLogits: true, Sample: true,
			History: []int32{1, 2, 3, 4, 5}, Sampling: engine.SamplingParams{}},
		{ID: 2, Tokens: []int32{9}, Pos: 6, Blocks: []int32{0, 1, 3}, Sample: true, ReturnLogits: true, NumGenerated: 2,
			History: []int32{7, 9, 7, 8, 7, 9, 9}, Sampling: engine.SamplingParams{
				Temperature: 0.5, TopK: 3, TopP: 0.9, Seed: 11, RepetitionPenalty: 1.2, FrequencyPenalty: 0.1,
				MinLength: 5, EndIDs: []int32{49}, BadWords: [][]int32{{9, 4}, {8, 5}, {6}}, EmbeddingBias: bias}},
	}}
	if _, err := engine.NewBatchChecker(info, "cuda").Check(b); err != nil {
		t.Fatal(err)
	}
	part := splitBatch(b, 100, 10)[0]
	p.build(b, part, info)
	if got := p.tokens; !slices.Equal(got, []int32{1, 2, 3, 4, 5, 9}) {
		t.Errorf("tokens = %v", got)
	}
	// Sequence 1 covers positions [0, 5): 2 blocks; sequence 2 positions [0, 7): 2 blocks.
	if got := p.blocks; !slices.Equal(got, []int32{6, 2, 0, 1}) {
		t.Errorf("blocks = %v, want only the blocks the positions need", got)
	}
	s0, s1 := p.seqs[0], p.seqs[1]
	if s0.flags != 5 || s1.flags != 3 {
		t.Errorf("flags = %d, %d; want context+sample (5) and sample+return (3)", s0.flags, s1.flags)
	}
	if s0.logits_offset != 0 || s1.logits_offset != 5*50 || p.logitsLen != 6*50 {
		t.Errorf("logits offsets %d, %d and length %d; want 0, 250, 300", s0.logits_offset, s1.logits_offset, p.logitsLen)
	}
	if s0.penalty_count != 0 || s0.mask_count != 0 || s0.bias_offset != -1 {
		t.Errorf("greedy sequence has penalties %d, masks %d, bias %d", s0.penalty_count, s0.mask_count, s0.bias_offset)
	}
	pen := map[int32]int32{}
	for i := range int(s1.penalty_count) {
		pen[p.penTok[int(s1.penalty_offset)+i]] = p.penCnt[int(s1.penalty_offset)+i]
	}
	if want := map[int32]int32{7: 3, 8: 1, 9: 3}; len(pen) != 3 || pen[7] != want[7] || pen[8] != want[8] || pen[9] != want[9] {
		t.Errorf("penalty counts = %v, want %v", pen, want)
	}
	masks := p.masks[s1.mask_offset : s1.mask_offset+s1.mask_count]
	// min length masks 49; the history ends with 9, so bad word {9,4} masks 4; {6} always.
	if !slices.Equal(masks, []int32{49, 4, 6}) {
		t.Errorf("masks = %v, want [49 4 6]", masks)
	}
	if s1.bias_offset != 0 || len(p.bias) != 50 {
		t.Errorf("bias offset %d, %d biases", s1.bias_offset, len(p.bias))
	}
	if u := float64(s1.uniform); !(u >= 0 && u < 1) || u != engine.Uniform(11, 2) {
		t.Errorf("uniform = %g, want engine.Uniform(11, 2) = %g", u, engine.Uniform(11, 2))
	}
}

func TestCollectJoinsChunkedContextLogits(t *testing.T) {
	info := testInfo()
	V := info.VocabSize
	var p stepPrep
	p.init(V)
	b := &engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: []int32{1, 2, 3}, Blocks: []int32{0}, ContextLogits: true, Sample: true, ReturnLogits: true, Sampling: engine.SamplingParams{}}}}
	outs := make([]engine.Output, 1)
	for i, part := range splitBatch(b, 2, 10) {
		p.build(b, part, info)
		logits := make([]float32, p.logitsLen)
		for j := range logits {
			logits[j] = float32(i*1000 + j)
		}
		p.outTok[0], p.outLP[0] = 42, -0.5
		p.collect(b, part, logits, outs, V)
	}
	o := outs[0]
	if len(o.ContextLogits) != 3*V || o.ContextLogits[2*V] != 1000 || o.ContextLogits[V] != float32(V) {
		t.Errorf("context logits not joined in order: len %d", len(o.ContextLogits))
	}
	if len(o.Logits) != V || o.Logits[0] != float32(1000+V) {
		t.Errorf("returned logits should follow the last chunk's context rows")
	}
	if o.Token != 42 || o.LogProb != -0.5 {
		t.Errorf("token %d, log-prob %g", o.Token, o.LogProb)
	}
}

// TestCollectTurnsAMaskedTokenIntoTheSequencesError: the library's token -2 (every
// token masked) becomes that sequence's own error, and the others' outputs stand.
func TestCollectTurnsAMaskedTokenIntoTheSequencesError(t *testing.T) {
	info := testInfo()
	var p stepPrep
	p.init(info.VocabSize)
	b := &engine.Batch{Seqs: []engine.Sequence{
		{ID: 7, Tokens: []int32{1, 2}, Blocks: []int32{0}, Sample: true},
		{ID: 9, Tokens: []int32{3}, Blocks: []int32{1}, Sample: true},
	}}
	outs := make([]engine.Output, 2)
	for _, part := range splitBatch(b, 100, 10) {
		p.build(b, part, info)
		p.outTok[0], p.outLP[0] = -2, float32(math.NaN())
		p.outTok[1], p.outLP[1] = 5, -0.25
		p.collect(b, part, nil, outs, info.VocabSize)
	}
	if o := outs[0]; !errors.Is(o.Err, engine.ErrAllMasked) || !strings.Contains(o.Err.Error(), "sequence 7") || o.Token != -1 || o.LogProb != 0 {
		t.Errorf("the masked sequence: %+v", o)
	}
	if o := outs[1]; o.Err != nil || o.Token != 5 || o.LogProb != -0.25 {
		t.Errorf("the other sequence: %+v", o)
	}
}

func TestMissingLibraryIsAnError(t *testing.T) {
	ckpt, err := model.Open(filepath.Join("..", "..", "testdata", "gpt2-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	_, err = New(ckpt, Options{Library: "/nonexistent/libgollm_cuda.so"})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/libgollm_cuda.so") {
		t.Fatalf("New with a missing library = %v, want an error naming the path", err)
	}
}

func TestOptionsAreChecked(t *testing.T) {
	ckpt, err := model.Open(filepath.Join("..", "..", "testdata", "gpt2-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	if _, err := LoadWeights(ckpt, Options{DType: "int8"}); err == nil || !strings.Contains(err.Error(), `data_type "int8"`) {
		t.Errorf("LoadWeights with dtype int8 = %v", err)
	}
	if _, err := NewEngine(&Weights{}, Options{TokensPerBlock: -1}); err == nil || !strings.Contains(err.Error(), "TokensPerBlock -1") {
		t.Errorf("NewEngine with TokensPerBlock -1 = %v", err)
	}
}

// TestBuiltLibraryFailsCleanlyWithoutGPU opens the library CMake built, when there is one:
// on a machine without a GPU (or without cuBLAS on the loader's path) making an engine
// must return an error, never crash the process; with a GPU it must work.
func TestBuiltLibraryFailsCleanlyWithoutGPU(t *testing.T) {
	path, _ := filepath.Abs(filepath.Join("..", "..", "build", LibraryName))
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not built", path)
	}
	ckpt, err := model.Open(filepath.Join("..", "..", "testdata", "gpt2-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	e, err := New(ckpt, Options{Library: path, NumBlocks: 8, TokensPerBlock: 16, MaxTokens: 64, MaxSeqs: 4})
	if err != nil {
		var ce *Error
		if errors.As(err, &ce) && ce.Code != CodeCUDA && ce.Code != CodeOutOfMemory {
			t.Fatalf("New = %v, want a CUDA error on a machine without a GPU", err)
		}
		t.Logf("no GPU engine here: %v", err)
		return
	}
	defer e.Close()
	runtime.GC()
	outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{Tokens: []int32{1, 2, 3}, Blocks: []int32{0}, Sample: true, Sampling: engine.SamplingParams{}}}})
	if err != nil || len(outs) != 1 || outs[0].Token < 0 {
		t.Fatalf("Step = %v, %v", outs, err)
	}
}

// TestBuiltLibraryDescribesDevicesOrFailsCleanly calls ABI 5's gollm_device_describe on
// the built library: without a GPU an error, with one a name, a UUID in NVML's form and
// the memory.
func TestBuiltLibraryDescribesDevicesOrFailsCleanly(t *testing.T) {
	path, _ := filepath.Abs(filepath.Join("..", "..", "build", LibraryName))
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not built", path)
	}
	d, err := Device(path, 0)
	var ce *Error
	if err != nil && !errors.As(err, &ce) {
		t.Skipf("the library does not load here (cuBLAS not on the loader's path?): %v", err)
	}
	if err != nil {
		if ce.Code != CodeCUDA {
			t.Fatalf("Device = %v, want a CUDA error on a machine without a GPU", err)
		}
		t.Logf("no GPU here: %v", err)
		return
	}
	if d.Name == "" || len(d.UUID) != 40 || d.UUID[:4] != "GPU-" || d.Total <= 0 || d.Free <= 0 || d.Free > d.Total {
		t.Errorf("Device(0) = %+v", d)
	}
}

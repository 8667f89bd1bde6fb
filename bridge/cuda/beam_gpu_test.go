package cuda

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"gollm/batchmanager"
	"gollm/engine"
	"gollm/model"
)

// gpuEngine makes a GPU engine on the tiny GPT-2 fixture from the library at
// $GOLLM_CUDA_LIB or the one CMake built; it skips without a library or a GPU.
func gpuEngine(t *testing.T, blocks, perBlock int) *Engine {
	t.Helper()
	path := os.Getenv("GOLLM_CUDA_LIB")
	if path == "" {
		path, _ = filepath.Abs(filepath.Join("..", "..", "build", LibraryName))
	}
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not built", path)
	}
	ckpt, err := model.Open(filepath.Join("..", "..", "testdata", "gpt2-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	e, err := New(ckpt, Options{Library: path, NumBlocks: blocks, TokensPerBlock: perBlock, MaxTokens: 256, MaxSeqs: 16})
	if err != nil {
		t.Skipf("no GPU engine here: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func TestGPUBlockCopiesForkASequence(t *testing.T) {
	e := gpuEngine(t, 8, 4)
	step := func(b *engine.Batch) []engine.Output {
		t.Helper()
		outs, err := e.Step(b)
		if err != nil {
			t.Fatal(err)
		}
		return outs
	}
	step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: []int32{1, 2, 3, 4, 5, 6}, Blocks: []int32{0, 1}}}})
	fork := step(&engine.Batch{Seqs: []engine.Sequence{{ID: 2, Tokens: []int32{7}, Pos: 6, Blocks: []int32{0, 2}, ReturnLogits: true}},
		BlockCopies: []engine.BlockCopy{{Src: 1, Dst: 2}}})
	orig := step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: []int32{7}, Pos: 6, Blocks: []int32{0, 1}, ReturnLogits: true}}})
	if !slices.Equal(fork[0].Logits, orig[0].Logits) {
		t.Error("the fork's logits over a copied block differ from the original's")
	}
	blank := step(&engine.Batch{Seqs: []engine.Sequence{{ID: 3, Tokens: []int32{7}, Pos: 6, Blocks: []int32{0, 3}, ReturnLogits: true}}})
	if slices.Equal(blank[0].Logits, orig[0].Logits) {
		t.Error("an uncopied block gave the original's logits: the test shows nothing")
	}
	if _, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 4, Tokens: []int32{1}, Blocks: []int32{4}}},
		BlockCopies: []engine.BlockCopy{{Src: 1, Dst: 8}}}); err == nil {
		t.Error("a copy outside the pool was accepted")
	}
}

func TestGPUBeamSearch(t *testing.T) {
	e := gpuEngine(t, 64, 4)
	done := make(chan batchmanager.Result, 4)
	errs := make(chan error, 4)
	var queue []*batchmanager.InferenceRequest
	for i := range 3 {
		queue = append(queue, &batchmanager.InferenceRequest{ID: uint64(i + 1), InputIDs: []int32{5, 6, 7, 8, 9, int32(10 + i)},
			MaxNewTokens: 10, PadID: -1, BeamWidth: 4, EarlyStopping: 1, ReturnLogProbs: true, ExcludeInputInOutput: true})
	}
	m, err := batchmanager.New(e, batchmanager.Config{}, batchmanager.Callbacks{
		GetInferenceRequests: func(max int) []*batchmanager.InferenceRequest {
			q := queue
			queue = nil
			return q
		},
		SendResponse: func(id uint64, res batchmanager.Result, final bool, err error) {
			if err != nil {
				errs <- err
			} else if final {
				done <- res
			}
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	for range 3 {
		select {
		case err := <-errs:
			t.Fatal(err)
		case res := <-done:
			if len(res.Beams) != 4 {
				t.Fatalf("%d beams", len(res.Beams))
			}
			for i, b := range res.Beams {
				var sum float64
				for _, lp := range b.LogProbs {
					sum += float64(lp)
				}
				if len(b.Tokens) != 10 || math.Abs(sum-float64(b.CumLogProb)) > 1e-3 || i > 0 && b.CumLogProb > res.Beams[i-1].CumLogProb {
					t.Errorf("beam %d: %d tokens, cum %g, sum %g", i, len(b.Tokens), b.CumLogProb, sum)
				}
			}
		case <-time.After(time.Minute):
			t.Fatal("timed out")
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for s := m.Stats(); s.FreeKVCacheBlocks != s.MaxKVCacheBlocks; s = m.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("KV blocks left: %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
}

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
	"gollm/engine/enginetest"
	"gollm/model"
)

// gpuEngine makes a GPU engine on the tiny GPT-2 fixture from the library at
// $GOLLM_CUDA_LIB or the one CMake built; it skips without a library or a GPU.
func gpuEngine(t *testing.T, blocks, perBlock int) *Engine {
	t.Helper()
	return gpuEngineOn(t, "gpt2-tiny", blocks, perBlock)
}

// gpuEngineOn is gpuEngine on the fixture checkpoint testdata/<name>.
func gpuEngineOn(t *testing.T, name string, blocks, perBlock int) *Engine {
	t.Helper()
	return gpuEngineWith(t, name, Options{NumBlocks: blocks, TokensPerBlock: perBlock, MaxTokens: 256, MaxSeqs: 16})
}

// gpuEngineWith is gpuEngineOn with the options given (the library's path filled in).
func gpuEngineWith(t *testing.T, name string, o Options) *Engine {
	t.Helper()
	path := os.Getenv("GOLLM_CUDA_LIB")
	if path == "" {
		path, _ = filepath.Abs(filepath.Join("..", "..", "build", LibraryName))
	}
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not built", path)
	}
	ckpt, err := model.Open(filepath.Join("..", "..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	o.Library = path
	e, err := New(ckpt, o)
	if err != nil {
		t.Skipf("no GPU engine here: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// manage runs reqs through a batch manager on e; their final results, or their errors,
// arrive on the channels. The caller shuts the manager down.
func manage(t *testing.T, e *Engine, reqs []*batchmanager.InferenceRequest) (*batchmanager.Manager, <-chan batchmanager.Result, <-chan error) {
	t.Helper()
	done := make(chan batchmanager.Result, len(reqs))
	errs := make(chan error, len(reqs))
	m, err := batchmanager.New(e, batchmanager.Config{}, batchmanager.Callbacks{
		GetInferenceRequests: func(int) []*batchmanager.InferenceRequest {
			q := reqs
			reqs = nil
			return q
		},
		SendResponse: func(_ uint64, res batchmanager.Result, final bool, err error) {
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
	return m, done, errs
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
	var queue []*batchmanager.InferenceRequest
	for i := range 3 {
		queue = append(queue, &batchmanager.InferenceRequest{ID: uint64(i + 1), InputIDs: []int32{5, 6, 7, 8, 9, int32(10 + i)},
			MaxNewTokens: 10, PadID: -1, BeamWidth: 4, EarlyStopping: 1, ReturnLogProbs: true, ExcludeInputInOutput: true})
	}
	m, done, errs := manage(t, e, queue)
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

// TestGPUBeamSearchMatchesTransformers runs testdata/beam-golden.json's searches
// (transformers 5.17 in float32; executor/beam_hf_test.go wants the CPU engine to give
// them exactly) on the GPU engine in fp16. fp16 logits differ from fp32 by ~1e-3, so a
// beam may swap with one whose score is that close: each case must give transformers'
// best score within 0.02 and every beam's score must be its tokens' log-probabilities
// summed; the test reports how many beams equal transformers' exactly.
func TestGPUBeamSearchMatchesTransformers(t *testing.T) {
	cases, err := enginetest.LoadBeamGolden(filepath.Join("..", "..", "testdata", "beam-golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	engines := map[string]*Engine{}
	same, total := 0, 0
	for _, c := range cases {
		e := engines[c.Model]
		if e == nil {
			e = gpuEngineOn(t, c.Model, 64, 8)
			engines[c.Model] = e
		}
		name := c.Name()
		queue := []*batchmanager.InferenceRequest{{ID: 1, InputIDs: c.Prompt, MaxNewTokens: c.MaxNewTokens, PadID: -1,
			EndIDs: []int32{c.EndID}, BeamWidth: c.Beams, LengthPenalty: c.LengthPenalty, EarlyStopping: c.EarlyStopping,
			ReturnLogProbs: true, ExcludeInputInOutput: true}}
		if c.EndID < 0 {
			queue[0].EndIDs = nil
		}
		m, done, errs := manage(t, e, queue)
		var res batchmanager.Result
		select {
		case err := <-errs:
			t.Fatalf("%s: %v", name, err)
		case res = <-done:
		case <-time.After(time.Minute):
			t.Fatalf("%s: timed out", name)
		}
		m.Shutdown()
		if len(res.Beams) != len(c.Sequences) {
			t.Errorf("%s: %d beams, transformers %d", name, len(res.Beams), len(c.Sequences))
			continue
		}
		for i, b := range res.Beams {
			var sum float64
			for _, lp := range b.LogProbs {
				sum += float64(lp)
			}
			if math.Abs(sum-float64(b.CumLogProb)) > 1e-3 {
				t.Errorf("%s: beam %d: cum %g, its log-probabilities sum to %g", name, i, b.CumLogProb, sum)
			}
			got := b.Tokens
			if b.Finish == batchmanager.FinishedEndID {
				got = append(slices.Clone(got), c.EndID)
			}
			total++
			if slices.Equal(got, c.Sequences[i].Tokens) {
				same++
			}
		}
		if d := math.Abs(float64(res.Beams[0].Score) - c.Sequences[0].Score); d > 0.02 {
			t.Errorf("%s: best beam %v score %.4f, transformers' %v %.4f", name, res.Beams[0].Tokens, res.Beams[0].Score, c.Sequences[0].Tokens, c.Sequences[0].Score)
		}
	}
	t.Logf("fp16 GPU beams equal to transformers' fp32 beams: %d of %d", same, total)
}

// TestGPUEnginesOfTwoModelsInOneProcess makes an engine of the austen model, then one of
// the smaller GPT-2 fixture, then steps the first: kernels' shared-memory limits are the
// process's, so the second engine's set-up must not lower them under the first (it did:
// on an H100, GPT-2 124M and GPT-350M models loaded together failed with "mlp_kernel:
// invalid argument").
func TestGPUEnginesOfTwoModelsInOneProcess(t *testing.T) {
	big := gpuEngineOn(t, filepath.Join("..", "model_repository", "austen", "1"), 16, 16)
	small := gpuEngineOn(t, "gpt2-tiny", 16, 16)
	for i, e := range []*Engine{big, small, big} {
		prompt := []int32{5, 6, 7, 8}
		outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: prompt, History: prompt, Blocks: []int32{0}, Sample: true}}})
		if err != nil {
			t.Fatalf("engine %d, prompt step: %v", i, err)
		}
		hist := append(slices.Clone(prompt), outs[0].Token)
		if _, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{ID: 1, Tokens: hist[4:], Pos: 4, History: hist, Blocks: []int32{0}, Sample: true}}}); err != nil {
			t.Fatalf("engine %d, decode step: %v", i, err)
		}
	}
}

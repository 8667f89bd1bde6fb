package cuda

import (
	"slices"
	"testing"
	"time"

	"gollm/batchmanager"
	"gollm/engine"
	"gollm/speculate"
)

// gpuRun runs reqs through a batch manager with cfg on e and returns each request's
// generated tokens and the last stats.
func gpuRun(t *testing.T, e *Engine, cfg batchmanager.Config, reqs []*batchmanager.InferenceRequest) (map[uint64][]int32, batchmanager.Stats) {
	t.Helper()
	type final struct {
		id  uint64
		res batchmanager.Result
		err error
	}
	done := make(chan final, len(reqs))
	queue := slices.Clone(reqs)
	m, err := batchmanager.New(e, cfg, batchmanager.Callbacks{
		GetInferenceRequests: func(int) []*batchmanager.InferenceRequest {
			q := queue
			queue = nil
			return q
		},
		SendResponse: func(id uint64, res batchmanager.Result, final_ bool, err error) {
			if err != nil || final_ {
				done <- final{id, res, err}
			}
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	out := map[uint64][]int32{}
	for range reqs {
		select {
		case f := <-done:
			if f.err != nil {
				t.Fatalf("request %d: %v", f.id, f.err)
			}
			out[f.id] = slices.Clone(f.res.Tokens)
		case <-time.After(2 * time.Minute):
			t.Fatal("timed out")
		}
	}
	return out, m.Stats()
}

// TestGPUSpeculationKeepsGreedyOutput: on the GPU engine (verification rows computed on
// the GPU, acceptance on the host), prompt lookup and a draft model (the model itself,
// on a second GPU engine) give the greedy tokens decoding without speculation gives,
// on the GPT-2 and LLaMA fixtures, with proposals made and accepted; a sampled request
// with prompt lookup runs beside them.
func TestGPUSpeculationKeepsGreedyOutput(t *testing.T) {
	for _, fixture := range []string{"gpt2-tiny", "llama-tiny"} {
		t.Run(fixture, func(t *testing.T) {
			plain := gpuEngineOn(t, fixture, 64, 8)
			V := plain.Info().VocabSize
			var reqs []*batchmanager.InferenceRequest
			for i := range 4 {
				base := []int32{int32(5 + i), 17, 23, 42, int32(9 + i)}
				prompt := append(append(slices.Clone(base), base...), base...)
				r := &batchmanager.InferenceRequest{ID: uint64(i + 1), InputIDs: prompt, MaxNewTokens: 24, PadID: -1,
					ExcludeInputInOutput: true}
				if i == 3 {
					r.Sampling = engine.SamplingParams{Temperature: 0.8, Seed: 5}
				}
				reqs = append(reqs, r)
			}
			want, _ := gpuRun(t, plain, batchmanager.Config{}, reqs)
			g, err := speculate.NewNGram(1, 3)
			if err != nil {
				t.Fatal(err)
			}
			got, st := gpuRun(t, gpuEngineOn(t, fixture, 64, 8), batchmanager.Config{Speculation: batchmanager.Speculation{Proposer: g, MaxDraft: 4}}, reqs)
			for _, r := range reqs {
				// The sampled request's rows come from other kernels than one-token steps
				// (fp16 rounding may move a draw across a boundary): its length is checked.
				if r.Sampling.Temperature > 0 {
					if len(got[r.ID]) != len(want[r.ID]) {
						t.Errorf("prompt lookup, sampled request %d: %d tokens, want %d", r.ID, len(got[r.ID]), len(want[r.ID]))
					}
					continue
				}
				if !slices.Equal(got[r.ID], want[r.ID]) {
					t.Errorf("prompt lookup, request %d: %v, want %v", r.ID, got[r.ID], want[r.ID])
				}
			}
			t.Logf("prompt lookup: %d of %d proposals accepted", st.AcceptedDraftTokensTotal, st.DraftTokensTotal)
			if st.DraftTokensTotal == 0 {
				t.Error("prompt lookup made no proposals")
			}
			d, err := speculate.NewDraft(gpuEngineOn(t, fixture, 64, 8), V)
			if err != nil {
				t.Fatal(err)
			}
			greedy := reqs[:3]
			got, st = gpuRun(t, gpuEngineOn(t, fixture, 64, 8), batchmanager.Config{Speculation: batchmanager.Speculation{Proposer: d, MaxDraft: 4}}, greedy)
			for _, r := range greedy {
				if !slices.Equal(got[r.ID], want[r.ID]) {
					t.Errorf("draft model, request %d: %v, want %v", r.ID, got[r.ID], want[r.ID])
				}
			}
			t.Logf("the model as its own draft: %d of %d proposals accepted", st.AcceptedDraftTokensTotal, st.DraftTokensTotal)
			if st.DraftTokensTotal == 0 || st.AcceptedDraftTokensTotal < st.DraftTokensTotal*9/10 {
				t.Errorf("the model as its own draft had %d of %d proposals accepted; want nearly all", st.AcceptedDraftTokensTotal, st.DraftTokensTotal)
			}
		})
	}
}

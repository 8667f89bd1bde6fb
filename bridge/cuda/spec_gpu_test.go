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

// TestGPUSpeculationKeepsGreedyOutput: on the GPU engine (certain proposals verified in
// rows sampled on the GPU), prompt lookup and a draft model (the model itself, on a
// second GPU engine, its steps chained) give the greedy tokens decoding without
// speculation gives, on the GPT-2 and LLaMA fixtures, with and without the overlap
// schedule, with proposals made and accepted; a sampled request with prompt lookup runs
// beside them.
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
			for _, overlap := range []bool{false, true} {
				g, err := speculate.NewNGram(1, 3)
				if err != nil {
					t.Fatal(err)
				}
				got, st := gpuRun(t, gpuEngineOn(t, fixture, 64, 8), batchmanager.Config{Overlap: overlap, Speculation: batchmanager.Speculation{Proposer: g, MaxDraft: 4}}, reqs)
				for _, r := range reqs {
					// The sampled request's proposals are certain (prompt lookup): its rows are
					// sampled on the GPU as one-token steps are, but fp16 rounding in other
					// kernels may move a draw across a boundary: its length is checked.
					if r.Sampling.Temperature > 0 {
						if len(got[r.ID]) != len(want[r.ID]) {
							t.Errorf("prompt lookup (overlap %v), sampled request %d: %d tokens, want %d", overlap, r.ID, len(got[r.ID]), len(want[r.ID]))
						}
						continue
					}
					if !slices.Equal(got[r.ID], want[r.ID]) {
						t.Errorf("prompt lookup (overlap %v), request %d: %v, want %v", overlap, r.ID, got[r.ID], want[r.ID])
					}
				}
				t.Logf("prompt lookup (overlap %v): %d of %d proposals accepted", overlap, st.AcceptedDraftTokensTotal, st.DraftTokensTotal)
				if st.DraftTokensTotal == 0 {
					t.Error("prompt lookup made no proposals")
				}
				// The draft on a GPU engine chains its steps (engine.Pipeliner).
				d, err := speculate.NewDraft(gpuEngineOn(t, fixture, 64, 8), V)
				if err != nil {
					t.Fatal(err)
				}
				greedy := reqs[:3]
				got, st = gpuRun(t, gpuEngineOn(t, fixture, 64, 8), batchmanager.Config{Overlap: overlap, Speculation: batchmanager.Speculation{Proposer: d, MaxDraft: 4}}, greedy)
				for _, r := range greedy {
					if !slices.Equal(got[r.ID], want[r.ID]) {
						t.Errorf("draft model (overlap %v), request %d: %v, want %v", overlap, r.ID, got[r.ID], want[r.ID])
					}
				}
				t.Logf("the model as its own draft (overlap %v): %d of %d proposals accepted", overlap, st.AcceptedDraftTokensTotal, st.DraftTokensTotal)
				if st.DraftTokensTotal == 0 || st.AcceptedDraftTokensTotal < st.DraftTokensTotal*9/10 {
					t.Errorf("the model as its own draft had %d of %d proposals accepted; want nearly all", st.AcceptedDraftTokensTotal, st.DraftTokensTotal)
				}
			}
		})
	}
}

// TestGPUVerifyRowsMatchOneTokenSteps: proposals verified in rows on the GPU keep the
// tokens of greedy decoding one token a step — a wrong proposal cut off with the token
// the target samples in its place, a run of right ones kept whole with one more, the
// rejected proposals' keys and values overwritten by the next round, across blocks —
// beside a sequence decoding one token a step, on a decode graph, eagerly (CUDA graphs
// off), launched (Launch and Wait), and on the host from the rows' logits (ReturnLogits
// keeps a verification there), on the GPT-2 and LLaMA fixtures.
func TestGPUVerifyRowsMatchOneTokenSteps(t *testing.T) {
	for _, fixture := range []string{"gpt2-tiny", "llama-tiny"} {
		t.Run(fixture, func(t *testing.T) {
			const perBlock, rounds = 8, 4
			blocks := func(first int) []int32 {
				b := make([]int32, 8)
				for i := range b {
					b[i] = int32(first + i)
				}
				return b
			}
			promptA := []int32{5, 17, 23, 42, 9, 5, 17, 23, 42, 9, 11}
			promptB := []int32{7, 3, 30, 2}
			// The greedy tokens one a step, both sequences in every step.
			ref := gpuEngineOn(t, fixture, 64, perBlock)
			var wantA, wantB []int32
			{
				ta, tb := promptA, promptB
				pa, pb := 0, 0
				ha, hb := slices.Clone(promptA), slices.Clone(promptB)
				for range 24 {
					outs, err := ref.Step(&engine.Batch{Seqs: []engine.Sequence{
						{ID: 1, Tokens: ta, Pos: pa, Blocks: blocks(0), Sample: true, History: ha},
						{ID: 2, Tokens: tb, Pos: pb, Blocks: blocks(8), Sample: true, History: hb},
					}})
					if err != nil {
						t.Fatal(err)
					}
					pa, pb = pa+len(ta), pb+len(tb)
					ha, hb = append(ha, outs[0].Token), append(hb, outs[1].Token)
					ta, tb = ha[len(ha)-1:], hb[len(hb)-1:]
				}
				wantA, wantB = ha[len(promptA):], hb[len(promptB):]
			}
			V := ref.Info().VocabSize
			for _, variant := range []string{"graph", "eager", "launched", "host"} {
				t.Run(variant, func(t *testing.T) {
					e := gpuEngineWith(t, fixture, Options{NumBlocks: 64, TokensPerBlock: perBlock, MaxTokens: 256, MaxSeqs: 16,
						DisableCUDAGraphs: variant == "eager"})
					step := func(b *engine.Batch) []engine.Output {
						t.Helper()
						var outs []engine.Output
						var err error
						if variant == "launched" {
							if err = e.Launch(b); err == nil {
								outs, err = e.Wait()
							}
						} else {
							outs, err = e.Step(b)
						}
						if err != nil {
							t.Fatal(err)
						}
						return outs
					}
					outs := step(&engine.Batch{Seqs: []engine.Sequence{
						{ID: 1, Tokens: promptA, Pos: 0, Blocks: blocks(0), Sample: true, History: promptA},
						{ID: 2, Tokens: promptB, Pos: 0, Blocks: blocks(8), Sample: true, History: promptB},
					}})
					gotA := []int32{outs[0].Token}
					gotB := []int32{outs[1].Token}
					for round := range rounds {
						// Four proposals from A's greedy tokens; the third wrong in the first
						// and third rounds.
						n := len(gotA)
						drafts := slices.Clone(wantA[n : n+4])
						if round%2 == 0 {
							drafts[2] = (drafts[2] + 1) % int32(V)
						}
						hist := append(append(slices.Clone(promptA), gotA...), drafts...)
						a := engine.Sequence{ID: 1, Tokens: hist[len(promptA)+n-1:], Pos: len(promptA) + n - 1, Blocks: blocks(0),
							Sample: true, History: hist, NumGenerated: n, Draft: 4, ReturnLogits: variant == "host"}
						hb := append(slices.Clone(promptB), gotB...)
						b := engine.Sequence{ID: 2, Tokens: hb[len(hb)-1:], Pos: len(hb) - 1, Blocks: blocks(8), Sample: true,
							History: hb, NumGenerated: len(gotB)}
						outs := step(&engine.Batch{Seqs: []engine.Sequence{a, b}})
						kept := 3
						if round%2 == 1 {
							kept = 5
						}
						if !slices.Equal(outs[0].Tokens, wantA[n:n+kept]) {
							t.Fatalf("round %d: verified %v, want %v (proposals %v)", round, outs[0].Tokens, wantA[n:n+kept], drafts)
						}
						if outs[0].Token != outs[0].Tokens[0] || len(outs[0].LogProbs) != kept {
							t.Fatalf("round %d: token %d, %d log-probabilities for %d tokens", round, outs[0].Token, len(outs[0].LogProbs), kept)
						}
						gotA = append(gotA, outs[0].Tokens...)
						gotB = append(gotB, outs[1].Token)
					}
					if !slices.Equal(gotB, wantB[:len(gotB)]) {
						t.Fatalf("the sequence beside: %v, want %v", gotB, wantB[:len(gotB)])
					}
				})
			}
		})
	}
}

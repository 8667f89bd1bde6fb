package cuda

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"gollm/batchmanager"
	"gollm/engine"
)

// decodeRows is a batch of n sequences, each with its own prompt and blocks, half of
// them greedy and half sampled from their own seeds.
func decodeRows(n, perBlock, promptLen int, rng *rand.Rand, vocab int) []engine.Sequence {
	seqs := make([]engine.Sequence, n)
	for i := range seqs {
		prompt := make([]int32, promptLen)
		for j := range prompt {
			prompt[j] = int32(rng.IntN(vocab))
		}
		blocks := make([]int32, 4)
		for j := range blocks {
			blocks[j] = int32(i*4 + j)
		}
		sp := engine.SamplingParams{}
		if i%2 == 1 {
			sp = engine.SamplingParams{Temperature: 1.2, TopK: 30, TopP: 0.9, Seed: uint64(i) * 7919}
		}
		seqs[i] = engine.Sequence{ID: uint64(i + 1), Tokens: prompt, Blocks: blocks, Sample: true, Sampling: sp, History: slices.Clone(prompt)}
	}
	return seqs
}

// launchedMatchesStep runs seqs for steps iterations with Step, each sampled token fed
// from the host, and again launched two at a time with each step fed on the device by
// the one before: every token and log-probability must be the same.
func launchedMatchesStep(t *testing.T, e interface {
	engine.Engine
	engine.Pipeliner
}, seqs []engine.Sequence, steps int) {
	t.Helper()
	// Step, the reference: the token sampled at step k is fed at step k+1.
	want := make([][]engine.Output, steps)
	ref := slices.Clone(seqs)
	for k := range steps {
		outs, err := e.Step(&engine.Batch{Seqs: ref})
		if err != nil {
			t.Fatal(err)
		}
		want[k] = outs
		for i := range ref {
			s := &ref[i]
			s.Pos += len(s.Tokens)
			s.History = append(slices.Clone(s.History), outs[i].Token)
			s.Tokens = s.History[len(s.History)-1:]
			s.NumGenerated++
		}
	}

	// Launched: step k+1 launched before step k is waited for, its tokens fed.
	got := make([][]engine.Output, steps)
	cur := slices.Clone(seqs)
	if err := e.Launch(&engine.Batch{Seqs: cur}); err != nil {
		t.Fatal(err)
	}
	for k := range steps {
		if k+1 < steps {
			next := slices.Clone(cur)
			for i := range next {
				s := &next[i]
				s.Pos += len(s.Tokens)
				s.History = append(slices.Clone(s.History), 0)
				s.Tokens = []int32{0}
				s.NumGenerated++
				s.Feed = i + 1
			}
			if err := e.Launch(&engine.Batch{Seqs: next}); err != nil {
				t.Fatalf("launch of step %d: %v", k+1, err)
			}
			cur = next
		}
		outs, err := e.Wait()
		if err != nil {
			t.Fatalf("wait for step %d: %v", k, err)
		}
		got[k] = outs
	}
	for k := range steps {
		for i := range want[k] {
			if got[k][i].Token != want[k][i].Token || got[k][i].LogProb != want[k][i].LogProb {
				t.Fatalf("step %d, sequence %d: launched %d (%g), stepped %d (%g)", k, i,
					got[k][i].Token, got[k][i].LogProb, want[k][i].Token, want[k][i].LogProb)
			}
		}
	}
}

// TestGPULaunchFeedsTheSampledToken runs the same sequences step by step with Step,
// and launched two at a time with each step fed on the GPU by the one before: the
// tokens and log-probabilities must be the same, on GPT-2 and on a LLaMA-shaped model,
// with a batch that fits one library call and one that needs two (more sequences than
// MaxSeqs, fed on the host).
func TestGPULaunchFeedsTheSampledToken(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		n       int
	}{{"gpt2-tiny", 6}, {"llama-tiny", 6}, {"gpt2-tiny", 20}} {
		t.Run(tc.fixture, func(t *testing.T) {
			const perBlock, steps = 16, 24
			e := gpuEngineOn(t, tc.fixture, 4*tc.n, perBlock)
			vocab := e.Info().VocabSize
			seqs := decodeRows(tc.n, perBlock, 5, rand.New(rand.NewPCG(5, 5)), vocab)

			launchedMatchesStep(t, e, seqs, steps)
			// A launch may mix a fed row with a new prompt's rows (an arrival joining a
			// step launched ahead): both give what Step gives.
			if tc.n >= 3 && tc.n <= 16 {
				a := []engine.Sequence{seqs[0], seqs[1]}
				wantA, err := e.Step(&engine.Batch{Seqs: a})
				if err != nil {
					t.Fatal(err)
				}
				next := a[0]
				next.Pos, next.Tokens, next.NumGenerated = len(a[0].Tokens), []int32{wantA[0].Token}, 1
				wantB, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{next, seqs[2]}})
				if err != nil {
					t.Fatal(err)
				}
				if err := e.Launch(&engine.Batch{Seqs: a}); err != nil {
					t.Fatal(err)
				}
				fed := next
				fed.Tokens, fed.Feed = []int32{0}, 1
				if err := e.Launch(&engine.Batch{Seqs: []engine.Sequence{fed, seqs[2]}}); err != nil {
					t.Fatal(err)
				}
				gotA, errA := e.Wait()
				gotB, errB := e.Wait()
				if errA != nil || errB != nil {
					t.Fatal(errA, errB)
				}
				for k, pair := range [][2][]engine.Output{{gotA, wantA}, {gotB, wantB}} {
					for i := range pair[1] {
						if pair[0][i].Token != pair[1][i].Token || pair[0][i].LogProb != pair[1][i].LogProb {
							t.Errorf("mixed launch %d, row %d: %d (%g), Step %d (%g)", k, i, pair[0][i].Token, pair[0][i].LogProb, pair[1][i].Token, pair[1][i].LogProb)
						}
					}
				}
			}
			// The engine steps on afterwards, and refuses a feed with nothing launched.
			if _, err := e.Step(&engine.Batch{Seqs: seqs[:1]}); err != nil {
				t.Fatal(err)
			}
			fed := slices.Clone(seqs[:1])
			fed[0].Tokens, fed[0].Feed = []int32{0}, 1
			if err := e.Launch(&engine.Batch{Seqs: fed}); err == nil {
				t.Error("a fed launch with nothing launched before it was accepted")
			}
		})
	}
}

// TestGPUEveryTokenMaskedFailsTheSequenceAlone: a sequence whose bad words leave no
// token after its history (sampling writes -2) fails alone — its Output.Err — in a step
// and in a launch, while the other sequence gets the token it gets alone; a row fed from
// the failed one runs (on token 0) without failing its launch, and the engine steps on.
func TestGPUEveryTokenMaskedFailsTheSequenceAlone(t *testing.T) {
	e := gpuEngineOn(t, "gpt2-tiny", 16, 16)
	V := e.Info().VocabSize
	bad := make([][]int32, V)
	for i := range bad {
		bad[i] = []int32{7, int32(i)}
	}
	poisoned := engine.Sequence{ID: 9, Tokens: []int32{5, 6, 7}, Blocks: []int32{3}, Sample: true, History: []int32{5, 6, 7},
		Sampling: engine.SamplingParams{BadWords: bad}}
	other := engine.Sequence{ID: 1, Tokens: []int32{1, 2}, Blocks: []int32{0}, Sample: true, History: []int32{1, 2},
		Sampling: engine.SamplingParams{Temperature: 1, Seed: 3}}
	alone, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{other}})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, outs []engine.Output) {
		t.Helper()
		if outs[0].Err != nil || outs[0].Token != alone[0].Token {
			t.Errorf("%s: the other sequence %+v, alone %+v", what, outs[0], alone[0])
		}
		if !errors.Is(outs[1].Err, engine.ErrAllMasked) || outs[1].Token != -1 {
			t.Errorf("%s: the poisoned sequence %+v", what, outs[1])
		}
	}
	outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{other, poisoned}})
	if err != nil {
		t.Fatal(err)
	}
	check("step", outs)
	if err := e.Launch(&engine.Batch{Seqs: []engine.Sequence{other, poisoned}}); err != nil {
		t.Fatal(err)
	}
	fed := poisoned
	fed.Tokens, fed.Pos, fed.Feed, fed.NumGenerated, fed.Sampling = []int32{0}, 3, 2, 1, engine.SamplingParams{}
	fed.History = []int32{5, 6, 7, 0}
	if err := e.Launch(&engine.Batch{Seqs: []engine.Sequence{fed}}); err != nil {
		t.Fatal(err)
	}
	first, err1 := e.Wait()
	_, err2 := e.Wait()
	if err1 != nil || err2 != nil {
		t.Fatalf("launched steps: %v, %v", err1, err2)
	}
	check("launch", first)
	if outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{other}}); err != nil || outs[0].Token != alone[0].Token {
		t.Fatalf("the step after: %+v, %v", outs, err)
	}
}

// TestGPUOverlapScheduleGivesTheSameTokens runs requests through the batch manager on
// the GPU engine with and without the overlap schedule: every request's tokens must be
// the same.
func TestGPUOverlapScheduleGivesTheSameTokens(t *testing.T) {
	run := func(overlap bool) map[uint64][]int32 {
		e := gpuEngineOn(t, "llama-tiny", 256, 16)
		rng := rand.New(rand.NewPCG(9, 9))
		var reqs []*batchmanager.InferenceRequest
		for i := range 24 {
			r := &batchmanager.InferenceRequest{ID: uint64(i + 1), MaxNewTokens: 5 + rng.IntN(40), PadID: -1,
				ExcludeInputInOutput: true, Streaming: i%3 == 0}
			for range 3 + rng.IntN(20) {
				r.InputIDs = append(r.InputIDs, int32(rng.IntN(e.Info().VocabSize)))
			}
			if i%2 == 1 {
				r.Sampling = engine.SamplingParams{Temperature: 1, TopK: 20, Seed: uint64(i)}
				r.EndIDs = []int32{int32(rng.IntN(e.Info().VocabSize))}
			}
			reqs = append(reqs, r)
		}
		out := map[uint64][]int32{}
		done := make(chan uint64, len(reqs))
		errs := make(chan error, len(reqs))
		m, err := batchmanager.New(e, batchmanager.Config{Overlap: overlap}, batchmanager.Callbacks{
			// Four at a time, so that most arrive while steps run ahead and join them.
			GetInferenceRequests: func(int) []*batchmanager.InferenceRequest {
				n := min(4, len(reqs))
				q := reqs[:n]
				reqs = reqs[n:]
				return q
			},
			SendResponse: func(id uint64, res batchmanager.Result, final bool, err error) {
				if err != nil {
					errs <- err
					return
				}
				out[id] = append(out[id], res.Tokens[:res.Length]...)
				if final {
					done <- id
				}
			},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Shutdown()
		for range 24 {
			select {
			case <-done:
			case err := <-errs:
				t.Fatal(err)
			}
		}
		return out
	}
	want, got := run(false), run(true)
	if !reflect.DeepEqual(got, want) {
		for id := range want {
			if !slices.Equal(got[id], want[id]) {
				t.Errorf("request %d: with overlap %v, without %v", id, got[id], want[id])
			}
		}
	}
}

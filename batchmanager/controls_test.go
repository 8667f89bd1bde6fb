package batchmanager

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"

	"gollm/engine"
)

// decayedTokens draws n tokens after prompt on a fresh engine, by the definition of
// TensorRT-LLM's runtime top-p decay rather than by the manager's code: token k is
// drawn with top-p p_k, where p_0 is sp.TopP and p_{k+1} is resetTo when token k is
// reset (≥ 0), else max(p_k × decay, minP).
func decayedTokens(t *testing.T, prompt []int32, sp engine.SamplingParams, decay, minP float32, reset int32, resetTo float32, n int) []int32 {
	t.Helper()
	topP := sp.TopP
	return soloRunTopP(t, cpuEngine(t, 16, 8), prompt, n, sp, func(k int, out []int32) float32 {
		if k > 0 {
			if out[k-1] == reset {
				topP = resetTo
			} else {
				topP = max(topP*decay, minP)
			}
		}
		return topP
	})
}

func TestTopPResetIDRestoresTheInitialTopP(t *testing.T) {
	prompt := []int32{3, 1, 4, 1, 5}
	const n, decay, minP = 12, 0.5, 0.02
	// A low initial top-p and a high temperature: after a reset, top-p 0.3 (the
	// request's), the decayed top-p and no limit at all draw different tokens, so the
	// test tells a reset to the request's top-p from a reset to 1 or no reset.
	sp := engine.SamplingParams{Temperature: 2, TopP: 0.3, Seed: 11}
	plain := decayedTokens(t, prompt, sp, decay, minP, -1, 0, n)
	// The reset id: a token the decayed run first generates at step j ≥ 2, once the
	// top-p has decayed (a reset then differs from leaving the top-p as it is), chosen
	// so that resetting there changes what follows. Until step j the top-p is the same
	// with or without it, so the request does generate it.
	reset, want := int32(-1), []int32(nil)
	for j := 2; j < n-1; j++ {
		if slices.Contains(plain[:j], plain[j]) {
			continue
		}
		w := decayedTokens(t, prompt, sp, decay, minP, plain[j], sp.TopP, n)
		if !slices.Equal(w, plain) && !slices.Equal(w, decayedTokens(t, prompt, sp, decay, minP, plain[j], 1, n)) {
			reset, want = plain[j], w
			break
		}
	}
	if reset < 0 {
		t.Fatalf("no token of %v whose reset changes the draws; the test cannot tell a reset from none", plain)
	}
	m, c := start(t, cpuEngine(t, 64, 8), Config{})
	c.add(&InferenceRequest{ID: 1, InputIDs: prompt, MaxNewTokens: n, PadID: -1, Sampling: sp, ExcludeInputInOutput: true,
		TopPDecay: decay, TopPMin: minP, TopPResetID: reset},
		&InferenceRequest{ID: 2, InputIDs: prompt, MaxNewTokens: n, PadID: -1, Sampling: sp, ExcludeInputInOutput: true,
			TopPDecay: decay, TopPMin: minP, TopPResetID: -1, Streaming: true})
	c.wait(t, 2)
	got, err := c.tokensOf(t, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("reset id %d: %v; by the definition (top-p back to %g after it) %v", reset, got, sp.TopP, want)
	}
	if !slices.Contains(got, reset) {
		t.Errorf("the reset id %d was never generated: %v", reset, got)
	}
	if noReset, err := c.tokensOf(t, 2); err != nil || !slices.Equal(noReset, plain) {
		t.Errorf("without a reset id: %v (%v), by the definition %v", noReset, err, plain)
	}
	poolWhole(t, m)
}

// beamTokens are the generated tokens of a request's final beams, as comparable
// strings, and their cumulative log-probabilities.
func beamTokens(t *testing.T, c *client, id uint64) ([]string, []float32) {
	t.Helper()
	var toks []string
	var cums []float32
	for _, b := range finalOf(t, c, id).Beams {
		toks = append(toks, fmt.Sprint(b.Tokens))
		cums = append(cums, b.CumLogProb)
	}
	return toks, cums
}

func TestDiversityRateRanksSiblingsByItsDefinition(t *testing.T) {
	prompt := []int32{21, 8, 93, 400, 7, 15}
	const W, n = 3, 6
	ref := cpuEngine(t, 64, 4)
	m, c := start(t, cpuEngine(t, 64, 4), Config{})
	rates := []float32{0, -1000, -0.5, 0.5}
	for i, rate := range rates {
		c.add(&InferenceRequest{ID: uint64(i + 1), InputIDs: prompt, MaxNewTokens: n, PadID: -1, BeamWidth: W, EarlyStopping: 1,
			DiversityRate: rate, ReturnLogProbs: true, ExcludeInputInOutput: true})
	}
	c.wait(t, len(rates))
	none, _ := beamTokens(t, c, 1)

	t.Run("a rate far below zero keeps one child per beam: its best token", func(t *testing.T) {
		// Rate × k outweighs any difference of log-probabilities, so every live beam's
		// best continuation ranks before any beam's second: after the first step (one
		// beam, the prompt, whose W best tokens start the beams) each beam goes on
		// greedily. The beams are the W best first tokens, each followed by greedy.
		first := fullLogits(t, ref, prompt)
		engine.LogSoftmax(first, first, 1)
		var top []int32
		for _, x := range topK(first, W, new([]tokLP)) {
			top = append(top, x.tok)
		}
		var want []string
		for _, tok := range top {
			want = append(want, fmt.Sprint(append([]int32{tok}, soloGreedy(t, append(slices.Clone(prompt), tok), n-1)...)))
		}
		got, cums := beamTokens(t, c, 2)
		sort.Strings(want)
		sorted := slices.Clone(got)
		sort.Strings(sorted)
		if !slices.Equal(sorted, want) {
			t.Errorf("beams %v; by the definition (each of the best first tokens %v, then greedy) %v", got, top, want)
		}
		if slices.Equal(got, none) {
			t.Errorf("the rate changed nothing: %v", got)
		}
		for i := 1; i < len(cums); i++ {
			if cums[i] > cums[i-1] {
				t.Errorf("beam %d (cum %g) ranks after beam %d (cum %g)", i, cums[i], i-1, cums[i-1])
			}
		}
	})

	t.Run("every rate matches a plain search ranking by cum + rate × k", func(t *testing.T) {
		changed := false
		for i, rate := range rates {
			want := referenceBeamSearch(t, ref, prompt, W, n, -1, 0, rate)
			beams := finalOf(t, c, uint64(i+1)).Beams
			if len(beams) != len(want) {
				t.Fatalf("rate %g: %d beams, reference %d", rate, len(beams), len(want))
			}
			for k := range want {
				if !slices.Equal(beams[k].Tokens, want[k].toks) || math.Abs(float64(beams[k].CumLogProb-want[k].cum)) > 1e-4 {
					t.Errorf("rate %g beam %d: %v (cum %g), reference %v (cum %g)", rate, k, beams[k].Tokens, beams[k].CumLogProb, want[k].toks, want[k].cum)
				}
			}
			if got, _ := beamTokens(t, c, uint64(i+1)); i >= 2 && !slices.Equal(got, none) {
				changed = true
			}
		}
		if !changed {
			t.Errorf("neither rate ±0.5 changed the beams %v", none)
		}
	})
	poolWhole(t, m)
}

func TestNumReturnSequencesOfABeamSearchAreItsBestBeams(t *testing.T) {
	prompt := []int32{17, 260, 3, 99, 41}
	const W, n = 4, 8
	ref := cpuEngine(t, 64, 4)
	// An end token the beams meet (the greedy path's third) and a length penalty, so
	// that "best" is by score (cum / length), the order the beams come in.
	endID := soloGreedy(t, prompt, 3)[2]
	want := referenceBeamSearch(t, ref, prompt, W, n, endID, 1, 0)
	m, c := start(t, cpuEngine(t, 64, 4), Config{})
	for k := range W + 1 {
		// k 0: num_return_sequences unset, every beam.
		c.add(&InferenceRequest{ID: uint64(k + 1), InputIDs: prompt, MaxNewTokens: n, PadID: -1, BeamWidth: W, EarlyStopping: 1,
			LengthPenalty: 1, EndIDs: []int32{endID}, NumReturnSequences: k, ReturnLogProbs: true, ExcludeInputInOutput: true,
			Streaming: k == 2})
	}
	c.wait(t, W+1)
	if len(want) != W {
		t.Fatalf("the reference search returned %d beams, want %d", len(want), W)
	}
	for k := range W + 1 {
		beams := finalOf(t, c, uint64(k+1)).Beams
		wantN := k
		if k == 0 {
			wantN = W
		}
		if len(beams) != wantN {
			t.Fatalf("num_return_sequences %d: %d beams", k, len(beams))
		}
		for i, b := range beams {
			if !slices.Equal(b.Tokens, want[i].toks) || math.Abs(float64(b.CumLogProb-want[i].cum)) > 1e-4 ||
				math.Abs(float64(b.Score-want[i].score)) > 1e-4 {
				t.Errorf("num_return_sequences %d beam %d: %v (cum %g, score %g), the reference's %d-th best %v (cum %g, score %g)",
					k, i, b.Tokens, b.CumLogProb, b.Score, i, want[i].toks, want[i].cum, want[i].score)
			}
			if i > 0 && b.Score > beams[i-1].Score {
				t.Errorf("num_return_sequences %d: beam %d (score %g) ranks after beam %d (score %g)", k, i, b.Score, i-1, beams[i-1].Score)
			}
		}
	}
	poolWhole(t, m)
}

func TestStreamedBeamsKeepToNumReturnSequences(t *testing.T) {
	prompt := []int32{17, 260, 3, 99, 41}
	const W, N, n = 4, 2, 6
	m, c := start(t, cpuEngine(t, 64, 4), Config{})
	c.add(&InferenceRequest{ID: 1, InputIDs: prompt, MaxNewTokens: n, PadID: -1, BeamWidth: W, EarlyStopping: 1, Streaming: true},
		&InferenceRequest{ID: 2, InputIDs: prompt, MaxNewTokens: n, PadID: -1, BeamWidth: W, EarlyStopping: 1, Streaming: true,
			NumReturnSequences: N})
	c.wait(t, 2)
	all, some := c.responses(1), c.responses(2)
	if len(all) != n || len(some) != n {
		t.Fatalf("%d and %d streamed responses, want one per step (%d)", len(all), len(some), n)
	}
	// Every response carries the best N of the current beams: the first N of the same
	// search's beams, the final one too (TensorRT-LLM's getNumReturnBeams).
	for i := range n {
		a, s := all[i].out.Beams, some[i].out.Beams
		if len(a) != W || len(s) != N {
			t.Fatalf("response %d: %d and %d beams, want %d and %d", i, len(a), len(s), W, N)
		}
		for k := range N {
			if !slices.Equal(s[k].Tokens, a[k].Tokens) || s[k].CumLogProb != a[k].CumLogProb {
				t.Errorf("response %d beam %d: %v (cum %g); of all the beams %v (cum %g)", i, k, s[k].Tokens, s[k].CumLogProb, a[k].Tokens, a[k].CumLogProb)
			}
		}
	}
	poolWhole(t, m)
}

func TestAFailedSampleNamesItsRequestOnce(t *testing.T) {
	m, c := start(t, cpuEngine(t, 64, 8), Config{})
	maskAll := func(id uint64, logits []float32, tokens []int32) {
		for i := range logits {
			logits[i] = float32(math.Inf(-1))
		}
	}
	c.add(&InferenceRequest{ID: 7, InputIDs: []int32{1, 2, 3}, MaxNewTokens: 4, PadID: -1, LogitsPostProcessor: maskAll})
	c.wait(t, 1)
	rs := c.responses(7)
	err := rs[len(rs)-1].err
	// The backend swaps the leading "request 7: " for the client's request id; a second
	// one inside the message would leak the internal number to the client.
	if err == nil || !strings.HasPrefix(err.Error(), "request 7: ") || strings.Count(err.Error(), "request 7") != 1 ||
		!errors.Is(err, ErrEngine) || !strings.Contains(err.Error(), "masked") {
		t.Errorf("error %v; want it to name request 7 once, at the start, as an engine error about masked tokens", err)
	}
	poolWhole(t, m)
}

// TestASequenceWithEveryTokenMaskedFailsAlone: a request whose bad words, after its
// history, leave no token (which admission cannot foresee) fails alone with an error
// that says so; the requests of the same steps generate what they generate alone, and
// every KV block comes back.
func TestASequenceWithEveryTokenMaskedFailsAlone(t *testing.T) {
	for _, overlap := range []bool{false, true} {
		t.Run(fmt.Sprintf("overlap %v", overlap), func(t *testing.T) {
			eng := cpuEngine(t, 64, 8)
			m, c := start(t, eng, Config{Overlap: overlap})
			V := eng.Info().VocabSize
			bad := make([][]int32, V)
			for i := range bad {
				bad[i] = []int32{7, int32(i)}
			}
			prompts := [][]int32{{1, 2, 3}, {4, 5}, {9, 10, 11, 12}}
			var reqs []*InferenceRequest
			for i, p := range prompts {
				reqs = append(reqs, &InferenceRequest{ID: uint64(i + 1), InputIDs: p, MaxNewTokens: 6, PadID: -1, Streaming: i == 1})
			}
			reqs = append(reqs, &InferenceRequest{ID: 9, InputIDs: []int32{1, 2, 7}, MaxNewTokens: 6, PadID: -1,
				Sampling: engine.SamplingParams{BadWords: bad}})
			c.add(reqs...)
			c.wait(t, len(reqs))
			for i, p := range prompts {
				got, err := c.tokensOf(t, uint64(i+1))
				if err != nil {
					t.Fatalf("request %d failed beside the poisoned one: %v", i+1, err)
				}
				if i != 1 {
					got = got[len(p):]
				}
				if want := soloGreedy(t, p, 6); !slices.Equal(got, want) {
					t.Errorf("request %d: %v, alone %v", i+1, got, want)
				}
			}
			rs := c.responses(9)
			err := rs[len(rs)-1].err
			if !errors.Is(err, ErrInvalidRequest) || !errors.Is(err, engine.ErrAllMasked) || !strings.Contains(err.Error(), "generated token 1") {
				t.Errorf("the poisoned request: %v", err)
			}
			poolWhole(t, m)
		})
	}
}

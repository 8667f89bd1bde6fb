package cuda

import (
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"gollm/batchmanager"
	"gollm/engine"
	"gollm/guide"
	"gollm/tokenizer"
)

// TestBuildPacksAllowedMasks checks (no GPU) that a sequence's guided decoding mask
// reaches the library as 32-bit words at its offset, min_p beside it.
func TestBuildPacksAllowedMasks(t *testing.T) {
	info := engine.Info{VocabSize: 70, MaxSeqLen: 64, NumBlocks: 8, TokensPerBlock: 4}
	var p stepPrep
	p.init(info.VocabSize)
	allowed := make([]uint64, engine.MaskWords(70))
	for _, id := range []int{0, 33, 64, 69} {
		allowed[id/64] |= 1 << (id % 64)
	}
	b := &engine.Batch{Seqs: []engine.Sequence{
		{ID: 1, Tokens: []int32{1}, Blocks: []int32{0}, Sample: true, History: []int32{1}},
		{ID: 2, Tokens: []int32{2}, Blocks: []int32{1}, Sample: true, History: []int32{2}, Allowed: allowed,
			Sampling: engine.SamplingParams{Temperature: 1, MinP: 0.25}},
	}}
	p.build(b, splitBatch(b, 100, 10)[0], info)
	if p.seqs[0].allowed_offset != -1 || p.seqs[1].allowed_offset != 0 {
		t.Fatalf("allowed offsets %d, %d; want -1, 0", p.seqs[0].allowed_offset, p.seqs[1].allowed_offset)
	}
	if len(p.allowed) != 3 {
		t.Fatalf("%d words for a vocabulary of 70, want 3", len(p.allowed))
	}
	for id := range 70 {
		got := p.allowed[id/32]>>(id%32)&1 == 1
		want := id == 0 || id == 33 || id == 64 || id == 69
		if got != want {
			t.Fatalf("token %d: bit %v, want %v", id, got, want)
		}
	}
	if float32(p.seqs[1].min_p) != 0.25 {
		t.Fatalf("min_p %v, want 0.25", p.seqs[1].min_p)
	}
}

// TestGPUAllowedAndMinP samples under masks on the GPU, greedy and drawn, and checks each
// token against the logits the step returns: inside the mask, the best allowed one when
// greedy, within min-p's set when drawn, and a mask of one token taken at log-probability
// 0.
func TestGPUAllowedAndMinP(t *testing.T) {
	e := gpuEngine(t, 64, 8)
	V := e.Info().VocabSize
	rng := rand.New(rand.NewPCG(5, 6))
	var seqs []engine.Sequence
	masks := make([][]uint64, 12)
	for i := range masks {
		m := make([]uint64, engine.MaskWords(V))
		n := 1 + rng.IntN(40)
		if i%4 == 3 {
			n = 1
		}
		for range n {
			id := rng.IntN(V)
			m[id/64] |= 1 << (id % 64)
		}
		masks[i] = m
		sp := engine.SamplingParams{Seed: uint64(i)}
		if i%2 == 1 {
			sp.Temperature, sp.MinP = 1, 0.2
		}
		seqs = append(seqs, engine.Sequence{ID: uint64(i + 1), Tokens: []int32{int32(rng.IntN(V)), int32(rng.IntN(V))},
			Blocks: []int32{int32(i)}, Sample: true, ReturnLogits: true, Allowed: m, Sampling: sp,
			History: []int32{1, 2}})
	}
	for i := range seqs {
		seqs[i].History = seqs[i].Tokens
	}
	outs, err := e.Step(&engine.Batch{Seqs: seqs})
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		m, w := masks[i], o.Logits
		in := func(id int32) bool { return m[id/64]>>(id%64)&1 == 1 }
		if o.Token < 0 || !in(o.Token) {
			t.Fatalf("sequence %d: token %d outside its mask", i, o.Token)
		}
		best := int32(-1)
		for id := range int32(V) {
			if in(id) && (best < 0 || w[id] > w[best]) {
				best = id
			}
		}
		if only, ok := engine.OnlyAllowed(m); ok {
			if o.Token != only || math.Abs(float64(o.LogProb)) > 1e-6 {
				t.Fatalf("sequence %d: one allowed token %d: got %d at %v", i, only, o.Token, o.LogProb)
			}
			continue
		}
		if seqs[i].Sampling.Temperature == 0 && o.Token != best {
			t.Fatalf("sequence %d: greedy under a mask took %d, the best allowed is %d", i, o.Token, best)
		}
		if seqs[i].Sampling.MinP > 0 && float64(w[o.Token]-w[best]) < math.Log(0.2)-1e-4 {
			t.Fatalf("sequence %d: token %d is less than min_p 0.2 as likely as %d", i, o.Token, best)
		}
	}
}

// TestGPUGuidedRequests serves constrained requests, greedy and sampled with min-p,
// through the batch manager on the GPU engine (a synthetic vocabulary of one- and
// two-byte tokens): every text follows the constraint, complete.
func TestGPUGuidedRequests(t *testing.T) {
	e := gpuEngine(t, 256, 8)
	V := e.Info().VocabSize
	tb := &tokenizer.TokenBytes{Bytes: make([][]byte, V)}
	alpha := `ab01-{}":,[] `
	for i := range V - 1 {
		tb.Bytes[i] = []byte{alpha[i%len(alpha)], alpha[(i/len(alpha))%len(alpha)]}[:1+i%2]
	}
	v, err := guide.NewVocab(tb, V)
	if err != nil {
		t.Fatal(err)
	}
	re := `\{"a":\[(0|1)(,(0|1)){0,4}\],"b":"[ab]{1,6}"\}`
	g, err := guide.NewCompiler(v, 0).Guide(guide.KindRegex, re)
	if err != nil {
		t.Fatal(err)
	}
	reqs := func() []*batchmanager.InferenceRequest {
		var out []*batchmanager.InferenceRequest
		for i := range 8 {
			sp := engine.SamplingParams{}
			if i%2 == 1 {
				sp = engine.SamplingParams{Temperature: 1, Seed: uint64(i), MinP: 0.05}
			}
			out = append(out, &batchmanager.InferenceRequest{ID: uint64(i + 1), InputIDs: []int32{int32(i + 3), 7, 9},
				MaxNewTokens: 40, PadID: -1, EndIDs: []int32{int32(V - 1)}, Guide: g, ExcludeInputInOutput: true, Sampling: sp})
		}
		return out
	}
	run := func(eng engine.Engine) map[uint64]string {
		m, done, errs := manage(t, eng.(*Engine), reqs())
		defer m.Shutdown()
		got := map[uint64]string{}
		for range 8 {
			select {
			case err := <-errs:
				t.Fatal(err)
			case res := <-done:
				var sb strings.Builder
				for _, tok := range res.Tokens[:res.Length] {
					sb.Write(tb.Bytes[tok])
				}
				got[uint64(len(got))] = sb.String()
			}
		}
		return got
	}
	ok := regexp.MustCompile(`^` + re + `$`)
	for _, text := range run(e) {
		if !ok.MatchString(text) {
			t.Errorf("GPU: %q does not match %s", text, re)
		}
	}
}

package cuda

import (
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"gollm/batchmanager"
	"gollm/engine"
	"gollm/guide"
	"gollm/tokenizer"
)

// TestGPULateMasksMatchStep is launchedMatchesStep with masks: every row under a mask of
// its own (a few rows sharing one), the reference stepped with its masks at launch, the
// launched run with each step after the first launched with its masks late (fed on the
// device by the step before, its masks supplied after that step is waited for). Tokens
// must be the same and inside the masks, log-probabilities equal within rounding; with
// greedy and sampled rows, and with greedy rows alone (whose sampling reads the LM head's
// padded rows).
func TestGPULateMasksMatchStep(t *testing.T) {
	e := gpuEngine(t, 64, 8)
	V := e.Info().VocabSize
	for _, greedy := range []bool{false, true} {
		rng := rand.New(rand.NewPCG(7, 8))
		seqs := decodeRows(12, 8, 5, rng, V)
		if greedy {
			for i := range seqs {
				seqs[i].Sampling = engine.SamplingParams{}
			}
		}
		lateMasksMatchStep(t, e, seqs, rng)
	}
}

// lateMasksMatchStep is TestGPULateMasksMatchStep on seqs.
func lateMasksMatchStep(t *testing.T, e *Engine, seqs []engine.Sequence, rng *rand.Rand) {
	t.Helper()
	V := e.Info().VocabSize
	const steps = 6
	// masks[k][i] is row i's mask at step k; rows 0-2 share one slice.
	masks := make([][][]uint64, steps)
	for k := range masks {
		masks[k] = make([][]uint64, len(seqs))
		shared := randomMask(rng, V, 200)
		for i := range seqs {
			if i < 3 {
				masks[k][i] = shared
			} else {
				masks[k][i] = randomMask(rng, V, 1+rng.IntN(300))
			}
		}
	}
	want := make([][]engine.Output, steps)
	ref := slices.Clone(seqs)
	for k := range steps {
		for i := range ref {
			ref[i].Allowed = masks[k][i]
		}
		outs, err := e.Step(&engine.Batch{Seqs: ref})
		if err != nil {
			t.Fatal(err)
		}
		want[k] = slices.Clone(outs)
		for i := range ref {
			s := &ref[i]
			s.Pos += len(s.Tokens)
			s.History = append(slices.Clone(s.History), outs[i].Token)
			s.Tokens = s.History[len(s.History)-1:]
			s.NumGenerated++
		}
	}

	got := make([][]engine.Output, steps)
	cur := slices.Clone(seqs)
	for i := range cur {
		cur[i].Allowed = masks[0][i]
	}
	if err := e.Launch(&engine.Batch{Seqs: cur}); err != nil {
		t.Fatal(err)
	}
	curBatch := &engine.Batch{Seqs: cur}
	for k := range steps {
		var next *engine.Batch
		if k+1 < steps {
			n := slices.Clone(curBatch.Seqs)
			for i := range n {
				s := &n[i]
				s.Pos += len(s.Tokens)
				s.History = append(slices.Clone(s.History), 0)
				s.Tokens = []int32{0}
				s.NumGenerated++
				s.Feed = i + 1
				s.Allowed, s.LateMask = nil, true
			}
			next = &engine.Batch{Seqs: n}
			if err := e.Launch(next); err != nil {
				t.Fatalf("launch of step %d: %v", k+1, err)
			}
		}
		outs, err := e.Wait()
		if err != nil {
			t.Fatalf("wait for step %d: %v", k, err)
		}
		got[k] = slices.Clone(outs)
		if next != nil {
			for i := range next.Seqs {
				next.Seqs[i].Allowed = masks[k+1][i]
			}
			if err := e.SupplyMasks(next); err != nil {
				t.Fatalf("masks of step %d: %v", k+1, err)
			}
			curBatch = next
		}
	}
	for k := range steps {
		for i := range seqs {
			w, g := want[k][i], got[k][i]
			m := masks[k][i]
			if g.Token < 0 || m[g.Token/64]>>(g.Token%64)&1 == 0 {
				t.Fatalf("step %d row %d: token %d outside its mask", k, i, g.Token)
			}
			if g.Token != w.Token || math.Abs(float64(g.LogProb-w.LogProb)) > 1e-4 {
				t.Fatalf("step %d row %d: late masks gave %d (%v), Step %d (%v)", k, i, g.Token, g.LogProb, w.Token, w.LogProb)
			}
		}
	}
}

// TestGPULateMasksOrder checks the library's rules: no launch and no wait for a launch
// whose masks have not come, and an engine that recovers after such an error.
func TestGPULateMasksOrder(t *testing.T) {
	e := gpuEngine(t, 64, 8)
	V := e.Info().VocabSize
	rng := rand.New(rand.NewPCG(9, 10))
	seqs := decodeRows(4, 8, 3, rng, V)
	for i := range seqs {
		seqs[i].LateMask = true
	}
	b := &engine.Batch{Seqs: seqs}
	if err := e.Launch(b); err != nil {
		t.Fatal(err)
	}
	if err := e.Launch(&engine.Batch{Seqs: slices.Clone(seqs)}); err == nil {
		t.Fatal("a launch before the masks of the launch before it was accepted")
	}
	if _, err := e.Wait(); err == nil {
		t.Fatal("a wait for a launch whose masks never came returned outputs")
	}
	if err := e.Recover(nil); err != nil {
		t.Fatalf("recover: %v", err)
	}
	// Fit again: late, supplied, waited.
	if err := e.Launch(b); err != nil {
		t.Fatal(err)
	}
	m := randomMask(rng, V, 5)
	for i := range b.Seqs {
		b.Seqs[i].Allowed = m
	}
	if err := e.SupplyMasks(b); err != nil {
		t.Fatal(err)
	}
	outs, err := e.Wait()
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		if o.Token < 0 || m[o.Token/64]>>(o.Token%64)&1 == 0 {
			t.Fatalf("row %d: token %d outside the mask", i, o.Token)
		}
	}
}

// randomMask allows n random tokens of a vocabulary of V.
func randomMask(rng *rand.Rand, V, n int) []uint64 {
	m := make([]uint64, engine.MaskWords(V))
	for range n {
		id := rng.IntN(V)
		m[id/64] |= 1 << (id % 64)
	}
	return m
}

// lateCounter is the GPU engine counting the rows given their masks late.
type lateCounter struct {
	*Engine
	late atomic.Int64
}

func (c *lateCounter) SupplyMasks(b *engine.Batch) error {
	for _, s := range b.Seqs {
		if s.LateMask && s.Allowed != nil {
			c.late.Add(1)
		}
	}
	return c.Engine.SupplyMasks(b)
}

// TestGPUGuidedOverlapMatchesUnpipelined serves guided requests (greedy and sampled,
// a regex, beside unconstrained ones) through the batch manager on the GPU engine with
// and without the overlap schedule: the tokens must be the same, the guided rows must
// have taken their masks late, and every guided text must match.
func TestGPUGuidedOverlapMatchesUnpipelined(t *testing.T) {
	// The two schedules need not put a sequence beside the same rows at each step: only
	// batch invariance makes its logits, and so its sampled tokens, the same in both runs.
	// Without it a sampled draw near a boundary parted at step 28 on an H100.
	e := gpuEngineWith(t, "gpt2-tiny", Options{NumBlocks: 256, TokensPerBlock: 8, MaxTokens: 256, MaxSeqs: 16,
		BatchInvariant: true})
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
	re := `\{"a":\[(0|1)(,(0|1)){0,6}\],"b":"[ab]{1,9}"\}`
	g, err := guide.NewCompiler(v, 0).Guide(guide.KindRegex, re)
	if err != nil {
		t.Fatal(err)
	}
	reqs := func() []*batchmanager.InferenceRequest {
		var out []*batchmanager.InferenceRequest
		for i := range 12 {
			sp := engine.SamplingParams{}
			if i%2 == 1 {
				sp = engine.SamplingParams{Temperature: 1, Seed: uint64(i), MinP: 0.05}
			}
			r := &batchmanager.InferenceRequest{ID: uint64(i + 1), InputIDs: []int32{int32(i + 3), 7, 9},
				MaxNewTokens: 48, PadID: -1, EndIDs: []int32{int32(V - 1)}, ExcludeInputInOutput: true, Sampling: sp}
			if i%3 != 2 {
				r.Guide = g
			}
			out = append(out, r)
		}
		return out
	}
	run := func(overlap bool) map[uint64][]int32 {
		c := &lateCounter{Engine: e}
		queue := reqs()
		n := len(queue)
		type done struct {
			id   uint64
			toks []int32
			err  error
		}
		ch := make(chan done, n)
		m, err := batchmanager.New(c, batchmanager.Config{Overlap: overlap}, batchmanager.Callbacks{
			GetInferenceRequests: func(int) []*batchmanager.InferenceRequest {
				q := queue
				queue = nil
				return q
			},
			SendResponse: func(id uint64, res batchmanager.Result, final bool, err error) {
				if err != nil || final {
					ch <- done{id, slices.Clone(res.Tokens[:res.Length]), err}
				}
			},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Shutdown()
		got := map[uint64][]int32{}
		for range n {
			d := <-ch
			if d.err != nil {
				t.Fatalf("request %d: %v", d.id, d.err)
			}
			got[d.id] = d.toks
		}
		if late := c.late.Load(); overlap && late < 40 {
			t.Errorf("only %d rows took their masks late under the overlap schedule", late)
		} else if !overlap && late != 0 {
			t.Errorf("%d rows took their masks late without the overlap schedule", late)
		}
		return got
	}
	want, got := run(false), run(true)
	ok := regexp.MustCompile(`^` + re + `$`)
	for id, toks := range want {
		if !slices.Equal(got[id], toks) {
			t.Errorf("request %d: pipelined %v, unpipelined %v", id, got[id], toks)
		}
		if id%3 == 0 {
			continue // unconstrained (i%3 == 2)
		}
		var sb strings.Builder
		for _, tok := range got[id] {
			sb.Write(tb.Bytes[tok])
		}
		if !ok.MatchString(sb.String()) {
			t.Errorf("request %d: %q does not match %s", id, sb.String(), re)
		}
	}
}

// TestMasksUploadOncePerSlice checks (no GPU) that rows given the same mask slice share
// its words, in a step's arrays and in a late launch's, and that equal masks in other
// slices each get their own; a late launch's rows start with no words.
func TestMasksUploadOncePerSlice(t *testing.T) {
	info := engine.Info{VocabSize: 100, MaxSeqLen: 64, NumBlocks: 8, TokensPerBlock: 4}
	var p stepPrep
	p.init(info.VocabSize)
	shared := make([]uint64, engine.MaskWords(100))
	shared[1] = 1 << 35 // token 99
	other := slices.Clone(shared)
	row := func(id uint64, m []uint64) engine.Sequence {
		return engine.Sequence{ID: id, Tokens: []int32{1}, Blocks: []int32{int32(id)}, Sample: true, History: []int32{1}, Allowed: m}
	}
	b := &engine.Batch{Seqs: []engine.Sequence{row(0, shared), row(1, nil), row(2, shared), row(3, other)}}
	p.build(b, splitBatch(b, 100, 10)[0], info)
	offs := []int32{int32(p.seqs[0].allowed_offset), int32(p.seqs[1].allowed_offset), int32(p.seqs[2].allowed_offset), int32(p.seqs[3].allowed_offset)}
	if want := []int32{0, -1, 0, 4}; !slices.Equal(offs, want) || len(p.allowed) != 8 {
		t.Fatalf("offsets %v over %d words; want %v over 8", offs, len(p.allowed), want)
	}
	if p.allowed[3] != 1<<3 || p.allowed[7] != 1<<3 {
		t.Fatalf("token 99's bit is not bit 3 of word 3: %x", p.allowed)
	}
	// A late launch: no words at the launch, room for three masks, then the same layout.
	if n := p.lateRows(b); n != 3 || len(p.allowed) != 0 || p.seqs[0].allowed_offset != -1 || p.seqs[2].allowed_offset != -1 {
		t.Fatalf("late launch: %d rows with room, %d words, offsets %d and %d", n, len(p.allowed), p.seqs[0].allowed_offset, p.seqs[2].allowed_offset)
	}
	if got := p.supplyOffsets(b, 4, 4); !slices.Equal(got, []int32{0, -1, 0, 4}) || len(p.allowed) != 8 {
		t.Fatalf("supplied offsets %v over %d words", got, len(p.allowed))
	}
	if got := p.supplyOffsets(nil, 4, 4); !slices.Equal(got, []int32{-1, -1, -1, -1}) || len(p.allowed) != 0 {
		t.Fatalf("no masks: offsets %v over %d words", got, len(p.allowed))
	}
}

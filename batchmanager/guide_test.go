package batchmanager

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"gollm/engine"
	"gollm/guide"
	"gollm/tokenizer"
)

// tinyVocab gives the tiny model's 1000 tokens bytes: the printable ASCII characters
// one each, then pairs and triples of a small alphabet, and token 999 no text (the end
// token of these tests).
func tinyVocab(t testing.TB) (*guide.Vocab, [][]byte) {
	t.Helper()
	tb := &tokenizer.TokenBytes{Bytes: make([][]byte, 1000)}
	for i := range 95 {
		tb.Bytes[i] = []byte{byte(32 + i)}
	}
	alpha := `ab01-{}":,[] `
	k := 95
	for _, a := range alpha {
		for _, b := range alpha {
			if k < 999 {
				tb.Bytes[k] = []byte(string(a) + string(b))
				k++
			}
		}
	}
	for _, a := range alpha {
		for _, b := range alpha {
			for _, c := range alpha {
				if k < 999 {
					tb.Bytes[k] = []byte(string(a) + string(b) + string(c))
					k++
				}
			}
		}
	}
	v, err := guide.NewVocab(tb, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return v, tb.Bytes
}

// textOf joins tokens' bytes, stopping at the end token.
func textOf(toks []int32, bs [][]byte) string {
	var sb strings.Builder
	for _, tok := range toks {
		if tok == 999 {
			break
		}
		sb.Write(bs[tok])
	}
	return sb.String()
}

func TestGuidedRequestsFollowTheirConstraint(t *testing.T) {
	v, bs := tinyVocab(t)
	c := guide.NewCompiler(v, 0)
	re := `[ab]{2,5}(-[01]+)?`
	gRe, err := c.Guide(guide.KindRegex, re)
	if err != nil {
		t.Fatal(err)
	}
	schema := `{"type":"object","properties":{"a":{"type":"array","items":{"enum":["ab","b-"]},"maxItems":3},"b":{"type":"boolean"}},"required":["a"]}`
	gJSON, err := c.Guide(guide.KindJSONSchema, schema)
	if err != nil {
		t.Fatal(err)
	}
	reOK := regexp.MustCompile(`^` + re + `$`)
	jsonOK := func(s string) bool {
		return regexp.MustCompile(`^\{\s*"a"\s*:\s*\[\s*(("ab"|"b-")(\s*,\s*("ab"|"b-")){0,2})?\s*\](\s*,\s*"b"\s*:\s*(true|false))?\s*\}$`).MatchString(s)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"plain", Config{}},
		{"overlap", Config{Overlap: true}},
		{"max_utilization, chunked", Config{Policy: MaxUtilization, EnableChunkedContext: true, MaxNumTokens: 16}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, 12))
			var arrivals []arrival
			kinds := map[uint64]string{}
			for i := range 24 {
				r := &InferenceRequest{ID: uint64(i), InputIDs: randPrompt(rng, 1+rng.IntN(20), 999), PadID: -1,
					EndIDs: []int32{999}, Streaming: i%2 == 0, ExcludeInputInOutput: true,
					Sampling: engine.SamplingParams{Temperature: 1.5, Seed: uint64(i)}}
				switch i % 3 {
				case 0:
					r.Guide, r.MaxNewTokens, kinds[r.ID] = gRe, 12, "regex"
				case 1:
					r.Guide, r.MaxNewTokens, kinds[r.ID] = gJSON, 40, "json"
				default:
					r.MaxNewTokens, kinds[r.ID] = 1+rng.IntN(20), "free"
				}
				arrivals = append(arrivals, arrival{at: 1 + rng.IntN(10), req: r})
			}
			out, _ := runArrivals(t, cpuEngine(t, 256, 8), tc.cfg, arrivals)
			for id, toks := range out {
				text := textOf(toks, bs)
				switch kinds[id] {
				case "regex":
					if !reOK.MatchString(text) {
						t.Errorf("request %d: %q does not match %s", id, text, re)
					}
				case "json":
					if !jsonOK(text) {
						t.Errorf("request %d: %q does not follow the schema", id, text)
					}
				}
				if kinds[id] != "free" && len(toks) > 0 && toks[len(toks)-1] == 999 {
					t.Errorf("request %d: the end token is in the output", id)
				}
			}
		})
	}
}

func TestGuidedTextCompleteEndsWithoutAnEndToken(t *testing.T) {
	v, bs := tinyVocab(t)
	g, err := guide.NewCompiler(v, 0).Guide(guide.KindChoice, `["yes","no"]`)
	if err != nil {
		t.Fatal(err)
	}
	_, c := start(t, cpuEngine(t, 64, 8), Config{})
	// No end token at all: the text's end still ends the request.
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{5, 6, 7}, MaxNewTokens: 30, PadID: -1, Guide: g, ExcludeInputInOutput: true,
		Sampling: engine.SamplingParams{Temperature: 1, Seed: 3}})
	c.wait(t, 1)
	rs := c.responses(1)
	last := rs[len(rs)-1]
	if last.err != nil {
		t.Fatal(last.err)
	}
	text := textOf(last.out.Tokens, bs)
	if text != "yes" && text != "no" {
		t.Fatalf("text %q is not a choice", text)
	}
	if last.out.Finish != FinishedEndID {
		t.Fatalf("finish %v, want END_ID (the text is complete)", last.out.Finish)
	}
}

func TestGuidedBudgetFinishesTheText(t *testing.T) {
	v, bs := tinyVocab(t)
	schema := `{"type":"object","properties":{"k":{"type":"string"},"n":{"type":"array","items":{"type":"integer"}}},"required":["k","n"]}`
	g, err := guide.NewCompiler(v, 0).Guide(guide.KindJSONSchema, schema)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := g.Start()
	shortest := st.Rest() // bytes, one token each at most
	var arrivals []arrival
	for i := range 12 {
		arrivals = append(arrivals, arrival{at: 1, req: &InferenceRequest{ID: uint64(i), InputIDs: []int32{1, 2, 3},
			MaxNewTokens: shortest + i, PadID: -1, EndIDs: []int32{999}, Guide: g, ExcludeInputInOutput: true,
			Sampling: engine.SamplingParams{Temperature: 2, Seed: uint64(i)}}})
	}
	out, _ := runArrivals(t, cpuEngine(t, 256, 8), Config{}, arrivals)
	ok := regexp.MustCompile(`^\{\s*"k"\s*:\s*"[^"]*"\s*,\s*"n"\s*:\s*\[[-0-9 ,]*\]\s*\}$`)
	for id, toks := range out {
		if text := textOf(toks, bs); !ok.MatchString(text) {
			t.Errorf("request %d (max %d tokens): %q is not a finished object", id, shortest+int(id), text)
		}
	}
}

func TestGuidedBeamsAndSampledSequences(t *testing.T) {
	v, bs := tinyVocab(t)
	re := `(ab|b0|1-)+`
	g, err := guide.NewCompiler(v, 0).Guide(guide.KindRegex, re)
	if err != nil {
		t.Fatal(err)
	}
	ok := regexp.MustCompile(`^` + re + `$`)
	_, c := start(t, cpuEngine(t, 128, 8), Config{MaxBeamWidth: 3})
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{4, 5, 6}, MaxNewTokens: 8, PadID: -1, EndIDs: []int32{999}, Guide: g,
		BeamWidth: 3, ExcludeInputInOutput: true})
	c.add(&InferenceRequest{ID: 2, InputIDs: []int32{4, 5, 6}, MaxNewTokens: 8, PadID: -1, EndIDs: []int32{999}, Guide: g,
		NumReturnSequences: 3, ExcludeInputInOutput: true, Sampling: engine.SamplingParams{Temperature: 1, Seed: 9}})
	c.wait(t, 2)
	rs := c.responses(1)
	last := rs[len(rs)-1]
	if last.err != nil || len(last.out.Beams) == 0 {
		t.Fatalf("beams: %v, %d beams", last.err, len(last.out.Beams))
	}
	for i, b := range last.out.Beams {
		if text := textOf(b.Tokens, bs); !ok.MatchString(text) {
			t.Errorf("beam %d: %q does not match %s", i, text, re)
		}
	}
	seqs := map[int][]int32{}
	for _, r := range c.responses(2) {
		if r.err != nil {
			t.Fatal(r.err)
		}
		seqs[r.out.SequenceIndex] = append(seqs[r.out.SequenceIndex], r.out.Tokens[:r.out.Length]...)
	}
	if len(seqs) != 3 {
		t.Fatalf("%d sequences, want 3", len(seqs))
	}
	for i, toks := range seqs {
		if text := textOf(toks, bs); !ok.MatchString(text) {
			t.Errorf("sequence %d: %q does not match %s", i, text, re)
		}
	}
}

func TestGuidedRequestsLeaveOthersUntouched(t *testing.T) {
	v, _ := tinyVocab(t)
	g, err := guide.NewCompiler(v, 0).Guide(guide.KindRegex, `[ab]+`)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(21, 22))
	var arrivals []arrival
	want := map[uint64][]int32{}
	for i := range 10 {
		r := &InferenceRequest{ID: uint64(i), InputIDs: randPrompt(rng, 1+rng.IntN(10), 999), MaxNewTokens: 10, PadID: -1,
			ExcludeInputInOutput: true}
		if i%2 == 1 {
			r.Guide = g
		} else {
			want[r.ID] = soloGreedy(t, r.InputIDs, r.MaxNewTokens)
		}
		arrivals = append(arrivals, arrival{at: 1 + i/3, req: r})
	}
	out, _ := runArrivals(t, cpuEngine(t, 128, 8), Config{Overlap: true}, arrivals)
	for id, w := range want {
		if fmt.Sprint(out[id]) != fmt.Sprint(w) {
			t.Errorf("request %d (unguided): %v, alone %v", id, out[id], w)
		}
	}
}

func TestGuidedVocabularyMustMatch(t *testing.T) {
	tb := &tokenizer.TokenBytes{Bytes: [][]byte{[]byte("a"), []byte("b")}}
	v, err := guide.NewVocab(tb, 2)
	if err != nil {
		t.Fatal(err)
	}
	g, err := guide.NewCompiler(v, 0).Guide(guide.KindRegex, `a+`)
	if err != nil {
		t.Fatal(err)
	}
	_, c := start(t, cpuEngine(t, 16, 8), Config{})
	c.add(&InferenceRequest{ID: 1, InputIDs: []int32{1}, MaxNewTokens: 3, PadID: -1, Guide: g})
	c.wait(t, 1)
	if rs := c.responses(1); rs[0].err == nil || !strings.Contains(rs[0].err.Error(), "vocabulary has 2 tokens") {
		t.Fatalf("got %v, want a refusal naming the vocabulary sizes", rs[0].err)
	}
}

// TestGuidedEndTokenThatIsText: an end token the constraint also reads as text (a
// custom end_id) is allowed only where the text may end, so it never cuts it short.
func TestGuidedEndTokenThatIsText(t *testing.T) {
	v, bs := tinyVocab(t)
	g, err := guide.NewCompiler(v, 0).Guide(guide.KindRegex, `b[ab]{8,}`)
	if err != nil {
		t.Fatal(err)
	}
	var arrivals []arrival
	for i := range 48 {
		arrivals = append(arrivals, arrival{at: 1, req: &InferenceRequest{ID: uint64(i), InputIDs: []int32{3, 4}, MaxNewTokens: 16,
			PadID: -1, EndIDs: []int32{'a' - 32}, Guide: g, ExcludeInputInOutput: true,
			Sampling: engine.SamplingParams{Temperature: 3, Seed: uint64(i)}}})
	}
	out, _ := runArrivals(t, cpuEngine(t, 128, 8), Config{}, arrivals)
	ok := regexp.MustCompile(`^b[ab]{8,}$`)
	for id, toks := range out {
		if text := textOf(toks, bs); !ok.MatchString(text) {
			t.Errorf("request %d: %q (the end token 'a' cut it short?)", id, text)
		}
	}
}

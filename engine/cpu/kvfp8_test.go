package cpu

import (
	"slices"
	"strings"
	"testing"

	"gollm/engine"
	"gollm/model"
)

// newFP8KV makes an engine on m with an FP8 KV pool scaled by k and v.
func newFP8KV(t testing.TB, m *model.Float32, blocks, perBlock int, k, v []float32) *Engine {
	t.Helper()
	e, err := NewFromModel(m, KVConfig{NumBlocks: blocks, TokensPerBlock: perBlock, DType: engine.KVFP8, KScales: k, VScales: v})
	if err != nil {
		t.Fatalf("NewFromModel: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// TestFP8KVCacheFollowsTransformers runs compressed-tensors' fixture with an FP8 KV
// scheme on its own k_scale and v_scale, fed transformers' greedy tokens: logits near
// the float32 pool's (which match transformers', TestLogitsAndGreedyTokensMatchTransformers)
// and not equal to them (the pool is rounded). Greedy tokens are not compared: the
// random weights leave gaps of 0.08 between the top two logits, which FP8's rounding may
// cross; the held-out text of a trained model measures agreement (demo/austen).
func TestFP8KVCacheFollowsTransformers(t *testing.T) {
	const dir = "../../testdata/llama-fp8kv-tiny"
	ck, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ks, vs, err := ck.KVScales()
	ck.Close()
	if err != nil || ks == nil {
		t.Fatalf("KVScales: %v, %v", ks, err)
	}
	g := loadGolden(t, dir+"-golden.safetensors")
	m := loadModel(t, dir)
	V := m.Config.VocabSize
	blocks := []int32{7, 2, 11, 0, 5, 9, 3, 1}
	run := func(e *Engine) (logits [][]float32) {
		out := mustStep(t, e, Sequence{ID: 1, Tokens: g.promptIDs, Blocks: blocks, ContextLogits: true})[0]
		for i := range g.promptIDs {
			logits = append(logits, out.ContextLogits[i*V:(i+1)*V])
		}
		pos := len(g.promptIDs)
		for _, tok := range g.greedy {
			out = mustStep(t, e, Sequence{ID: 1, Tokens: []int32{tok}, Pos: pos, Blocks: blocks, ReturnLogits: true})[0]
			logits = append(logits, out.Logits)
			pos++
		}
		return logits
	}
	want := run(newCPU(t, m, 12, 16))
	got := run(newFP8KV(t, m, 12, 16, ks, vs))
	worst, same, top := 0.0, true, 0
	for i := range got {
		worst = max(worst, relL2(got[i], want[i]))
		same = same && slices.Equal(got[i], want[i])
		if argmax(got[i]) == argmax(want[i]) {
			top++
		}
	}
	t.Logf("FP8 KV cache: worst relative L2 error %.3g against the float32 cache over %d rows; the same top token in %d",
		worst, len(got), top)
	// e4m3 keeps 3 mantissa bits: a rounded element is off by up to 1/16 of itself.
	if worst > 0.1 || top < len(got)*9/10 {
		t.Errorf("FP8 KV cache: relative L2 error %.3g against the float32 cache (allowed 0.1), top token the same in %d of %d rows (at least 90%%)",
			worst, top, len(got))
	}
	if same {
		t.Error("FP8 KV cache: every logit equals the float32 cache's: the pool was not rounded")
	}
}

// TestFP8KVCacheHoldsCodes checks the pool itself: a byte an element, the keys and values
// of a step rounded as Float32ToE4M3 rounds them after division by their layer's scale.
func TestFP8KVCacheHoldsCodes(t *testing.T) {
	m := loadModel(t, "../../testdata/llama-tiny")
	cfg := &m.Config
	ks, vs := make([]float32, cfg.Layers), make([]float32, cfg.Layers)
	for l := range ks {
		ks[l], vs[l] = 0.01*float32(l+1), 0.02*float32(l+1)
	}
	e := newFP8KV(t, m, 4, 8, ks, vs)
	ref := newCPU(t, m, 4, 8)
	if e.kv != nil || len(e.kv8) != 4*8*cfg.Layers*2*cfg.KVHeads*cfg.HeadDim {
		t.Fatalf("pool: %d float32s and %d bytes", len(e.kv), len(e.kv8))
	}
	prompt := []int32{5, 9, 2, 7, 7, 1, 3, 8, 4, 6, 2}
	mustStep(t, e, Sequence{ID: 1, Tokens: prompt, Blocks: []int32{2, 0}})
	mustStep(t, ref, Sequence{ID: 1, Tokens: prompt, Blocks: []int32{2, 0}})
	// The float32 engine's pool holds the same keys and values unrounded: the first
	// layer's are computed from the embeddings alone, the same in both engines.
	for h := range cfg.KVHeads {
		for kind, s := range []float32{ks[0], vs[0]} {
			at := e.kvBase(2, 0, kind, h)
			for i := range 8 * cfg.HeadDim {
				if want := model.Float32ToE4M3(ref.kv[at+i] / s); e.kv8[at+i] != want {
					t.Fatalf("head %d kind %d element %d: code %#x, want %#x (of %g)", h, kind, i, e.kv8[at+i], want, ref.kv[at+i])
				}
			}
		}
	}
}

// TestFP8KVCacheCopiesBlocksAndBatches runs a beam's copy-on-write and a batch over an FP8
// pool: a fork in a copied block reads what the original does, and a sequence's logits
// are the same alone and beside others.
func TestFP8KVCacheCopiesBlocksAndBatches(t *testing.T) {
	m := loadModel(t, "../../testdata/llama-tiny")
	e := newFP8KV(t, m, 8, 4, nil, nil)
	mustStep(t, e, Sequence{ID: 1, Tokens: []int32{1, 2, 3, 4, 5, 6}, Blocks: []int32{0, 1}})
	fork, err := e.Step(&Batch{Seqs: []Sequence{{ID: 2, Tokens: []int32{7}, Pos: 6, Blocks: []int32{0, 2}, ReturnLogits: true}},
		BlockCopies: []BlockCopy{{Src: 1, Dst: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	orig := mustStep(t, e, Sequence{ID: 1, Tokens: []int32{7}, Pos: 6, Blocks: []int32{0, 1}, ReturnLogits: true})
	if !slices.Equal(fork[0].Logits, orig[0].Logits) {
		t.Error("the fork's logits in a copied FP8 block differ from the original's")
	}
	alone := mustStep(t, newFP8KV(t, m, 8, 4, nil, nil), Sequence{ID: 1, Tokens: []int32{9, 8, 7, 6, 5}, Blocks: []int32{3, 4}, ReturnLogits: true})
	b := newFP8KV(t, m, 8, 4, nil, nil)
	outs := mustStep(t, b,
		Sequence{ID: 2, Tokens: []int32{1, 2, 3}, Blocks: []int32{0}, ReturnLogits: true},
		Sequence{ID: 1, Tokens: []int32{9, 8, 7, 6, 5}, Blocks: []int32{3, 4}, ReturnLogits: true},
		Sequence{ID: 3, Tokens: []int32{4, 4, 4, 4, 4, 4}, Blocks: []int32{5, 6}, ReturnLogits: true})
	if !slices.Equal(outs[1].Logits, alone[0].Logits) {
		t.Error("FP8 KV cache: a sequence's logits beside others differ from its logits alone")
	}
}

func TestFP8KVCacheRefusesBadConfigs(t *testing.T) {
	m := loadModel(t, "../../testdata/llama-tiny")
	L := m.Config.Layers
	for _, c := range []struct {
		kv   KVConfig
		says string
	}{
		{KVConfig{NumBlocks: 1, TokensPerBlock: 4, DType: 9}, "neither auto nor fp8"},
		{KVConfig{NumBlocks: 1, TokensPerBlock: 4, DType: engine.KVFP8, KScales: make([]float32, L+1)}, "scales for"},
		{KVConfig{NumBlocks: 1, TokensPerBlock: 4, DType: engine.KVFP8, VScales: make([]float32, L)}, "not a finite positive number"},
	} {
		if _, err := NewFromModel(m, c.kv); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: %v; want an error saying %q", c.kv, err, c.says)
		}
	}
}

// TestFP8KVCacheChunkedPromptIsTheWholeOne checks that a prompt's rows read the rounded
// keys and values of their own step too: a prompt in chunks gives bitwise the logits of
// the prompt at once, and so does the decode step after it.
func TestFP8KVCacheChunkedPromptIsTheWholeOne(t *testing.T) {
	m := loadModel(t, "../../testdata/llama-tiny")
	prompt := []int32{5, 9, 2, 7, 7, 1, 3, 8, 4, 6, 2, 11, 12}
	blocks := []int32{3, 6, 1, 4}
	whole := newFP8KV(t, m, 8, 4, nil, nil)
	one := mustStep(t, whole, Sequence{ID: 1, Tokens: prompt, Blocks: blocks, ContextLogits: true})[0]
	chunked := newFP8KV(t, m, 8, 4, nil, nil)
	var ctx []float32
	for _, c := range [][2]int{{0, 5}, {5, 9}, {9, 13}} {
		out := mustStep(t, chunked, Sequence{ID: 1, Tokens: prompt[c[0]:c[1]], Pos: c[0], Blocks: blocks, ContextLogits: true})[0]
		ctx = append(ctx, out.ContextLogits...)
	}
	if !slices.Equal(ctx, one.ContextLogits) {
		t.Errorf("FP8 KV cache: chunked context logits differ from one step's by %g", maxAbsDiff(ctx, one.ContextLogits))
	}
	next := Sequence{ID: 1, Tokens: []int32{4}, Pos: len(prompt), Blocks: blocks, ReturnLogits: true}
	if a, b := mustStep(t, whole, next)[0], mustStep(t, chunked, next)[0]; !slices.Equal(a.Logits, b.Logits) {
		t.Errorf("FP8 KV cache: decode after the chunked prompt differs by %g", maxAbsDiff(a.Logits, b.Logits))
	}
}

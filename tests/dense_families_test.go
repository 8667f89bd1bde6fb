package tests

// The dense families of issue 37 through tritonserver on the CPU engine: the Qwen3,
// Gemma 2, Gemma 3, Phi-3 longrope and Phi-4-mini fixtures that transformers wrote, served
// as they are, give transformers' greedy tokens — streamed and not, with chunked prompts
// and KV reuse too —, sample by their generation_config.json where a request leaves the
// sampling to the model, and a checkpoint of theirs with an option the engines lack fails
// its own load, naming the field, while the server goes on serving.

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/engine/enginetest"
	"gollm/kserve"
	"gollm/tests/harness"
)

// denseFixtures are the fixtures served, and whether their prompts may be cut into
// chunks: longrope picks its frequencies by a sequence's length after each step, so
// phi3-longrope-tiny's 14-token prompt, which crosses its original context of 8, gives
// transformers' one-pass tokens only when it runs as one step.
var denseFixtures = []struct {
	name    string
	chunked bool
}{{"qwen3-tiny", true}, {"gemma2-tiny", true}, {"gemma3-tiny", true}, {"phi3-longrope-tiny", false},
	{"phi4mini-tiny", true}}

func TestDenseFamiliesServeTransformersTokens(t *testing.T) {
	var models []harness.Model
	variants := map[string][]string{}
	for _, f := range denseFixtures {
		// Prompts cut into chunks of 5 tokens where they may be, and prefixes shared
		// through KV reuse.
		variant := harness.Model{Name: f.name + "-reuse", Checkpoint: "testdata/" + f.name, Parameters: map[string]string{
			"enable_kv_cache_reuse": "true", "tokens_per_block": "4"}}
		if f.chunked {
			variant.Name = f.name + "-chunked"
			variant.Parameters["enable_chunked_context"] = "true"
			variant.Parameters["max_num_tokens"] = "5"
		}
		models = append(models, harness.Model{Name: f.name, Checkpoint: "testdata/" + f.name}, variant)
		variants[f.name] = []string{f.name, variant.Name}
	}
	s := harness.Start(t, harness.Options{Models: models})
	c := s.Client(t)
	for _, f := range denseFixtures {
		g, err := enginetest.LoadGolden("../testdata/" + f.name + "-golden.safetensors")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range variants[f.name] {
			for _, streaming := range []bool{true, false} {
				ctx := testContext(t, time.Minute)
				// Greedy asked for: Qwen3's and Gemma 3's generation_config.json sample.
				inputs := append(tokenInputs(g.PromptIDs, len(g.Greedy), streaming), int32s("end_id", []int64{1, 1}, -1),
					float32s("temperature", []int64{1, 1}, 0))
				// Twice: the second run finds the prompt's blocks cached where reuse is on.
				for run := range 2 {
					res, err := streamInfer(ctx, c, inferRequest(name, "golden", inputs))
					if err != nil || res.errMsg != "" {
						t.Fatalf("%s (streaming %v, run %d): %v %q", name, streaming, run, err, res.errMsg)
					}
					got := res.tokens
					if !streaming {
						// The shipped config leaves the prompt out of non-streaming output.
						got = got[len(got)-len(g.Greedy):]
					}
					if !slices.Equal(got, g.Greedy) {
						t.Errorf("%s (streaming %v, run %d): tokens %v, transformers' greedy %v", name, streaming, run, got, g.Greedy)
					}
				}
			}
		}
	}
	// The shipped sampling defaults: Qwen3's (temperature 0.6, top-k 20, top-p 0.95) where
	// the request names none — the same tokens for the same seed, not the greedy ones —,
	// and none for Gemma 2, whose generation_config.json does not sample.
	ctx := testContext(t, time.Minute)
	for _, tc := range []struct {
		model  string
		greedy bool
	}{{"qwen3-tiny", false}, {"gemma2-tiny", true}} {
		g, err := enginetest.LoadGolden("../testdata/" + tc.model + "-golden.safetensors")
		if err != nil {
			t.Fatal(err)
		}
		seed := tensor{"random_seed", "UINT64", []int64{1, 1}, binary.LittleEndian.AppendUint64(nil, 7)}
		var runs [][]int32
		for range 2 {
			res, err := streamInfer(ctx, c, inferRequest(tc.model, "defaults", append(tokenInputs(g.PromptIDs, len(g.Greedy), true),
				int32s("end_id", []int64{1, 1}, -1), seed)))
			if err != nil || res.errMsg != "" {
				t.Fatalf("%s with its defaults: %v %q", tc.model, err, res.errMsg)
			}
			runs = append(runs, res.tokens)
		}
		if !slices.Equal(runs[0], runs[1]) || slices.Equal(runs[0], g.Greedy) != tc.greedy {
			t.Errorf("%s with its generation_config.json's defaults: tokens %v and %v (greedy: %v); want them equal, greedy %v",
				tc.model, runs[0], runs[1], g.Greedy, tc.greedy)
		}
	}
}

// TestDenseFamiliesRefuseUnsupportedOptions loads copies of the fixtures whose
// config.json asks for what the engines do not compute: each load fails with an error
// naming the field, and the server stays live, serving the fixture beside them.
func TestDenseFamiliesRefuseUnsupportedOptions(t *testing.T) {
	root := t.TempDir()
	bad := []struct {
		name, fixture string
		edit          func(m map[string]any)
		says          string
	}{
		{"qwen3_yarn", "qwen3-tiny", func(m map[string]any) {
			m["rope_parameters"] = map[string]any{"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}
		}, `field rope_parameters: rope type "yarn" is not supported`},
		{"gemma2_gelu_accurate", "gemma2-tiny", func(m map[string]any) { m["hidden_activation"] = "gelu_accurate" },
			`field hidden_activation: "gelu_accurate" is not supported`},
		{"gemma3_bidirectional", "gemma3-tiny", func(m map[string]any) { m["use_bidirectional_attention"] = true },
			"field use_bidirectional_attention: true is not supported"},
		{"gemma3_chunked_layers", "gemma3-tiny", func(m map[string]any) {
			m["layer_types"] = []string{"sliding_attention", "chunked_attention", "full_attention"}
		}, `field layer_types: layer 1: "chunked_attention" is not supported`},
		{"phi3_llama3_rope", "phi3-longrope-tiny", func(m map[string]any) {
			m["rope_parameters"].(map[string]any)["rope_type"] = "llama3"
		}, `rope type "llama3" is not supported (supported: default, longrope, su)`},
		{"phi3_short_factors", "phi3-longrope-tiny", func(m map[string]any) {
			m["rope_parameters"].(map[string]any)["short_factor"] = []float64{1, 2}
		}, "field rope_parameters.short_factor: must be a list of 4 numbers"},
	}
	models := []harness.Model{{Name: "qwen3-tiny", Checkpoint: "testdata/qwen3-tiny"}}
	for _, b := range bad {
		models = append(models, harness.Model{Name: b.name, Checkpoint: editedFixture(t, root, b.name, b.fixture, b.edit)})
	}
	s := harness.Start(t, harness.Options{Models: models,
		Flags: []string{"--model-control-mode=explicit", "--load-model=qwen3-tiny"}})
	c := s.Client(t)
	ctx := testContext(t, 2*time.Minute)
	g, err := enginetest.LoadGolden("../testdata/qwen3-tiny-golden.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	serve := func(when string) {
		t.Helper()
		res, err := streamInfer(ctx, c, inferRequest("qwen3-tiny", when, append(tokenInputs(g.PromptIDs, len(g.Greedy), true),
			int32s("end_id", []int64{1, 1}, -1), float32s("temperature", []int64{1, 1}, 0))))
		if err != nil || res.errMsg != "" || !slices.Equal(res.tokens, g.Greedy) {
			t.Fatalf("%s: tokens %v, %v, %q; want %v", when, res.tokens, err, res.errMsg, g.Greedy)
		}
	}
	serve("before")
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			_, err := c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: b.name})
			if err == nil {
				t.Fatalf("model %s loaded; want a failed load", b.name)
			}
			if !strings.Contains(err.Error(), b.says) {
				t.Errorf("load %s: %v; want it to say %q", b.name, err, b.says)
			}
			live, err := c.ServerLive(ctx, &kserve.ServerLiveRequest{})
			if err != nil || !live.GetLive() {
				t.Fatalf("the server is not live after loading %s: %v, %v", b.name, live, err)
			}
		})
	}
	serve("after")
}

// editedFixture copies testdata/<fixture> into root/<name> with its config.json edited
// (the weights linked, not copied) and returns the folder.
func editedFixture(t *testing.T, root, name, fixture string, edit func(map[string]any)) string {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("..", "testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if raw, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"model.safetensors", "generation_config.json"} {
		if err := os.Symlink(filepath.Join(src, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

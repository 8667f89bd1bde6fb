package tests

// The LLaMA-shaped demo (model_repository/llama, issue 13), which make demo writes with
// a real 32,000-token SentencePiece tokenizer in Llama 2's layout: served through
// tritonserver, a text prompt must become the ids Hugging Face tokenizers gives it (BOS
// included), and the greedy tokens — streamed over gRPC, and as text over
// generate_stream — must be the CPU engine's, run in this process on the same
// checkpoint.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/tests/harness"
	"gollm/tokenizer"
)

// llamaDemo is the LLaMA demo's checkpoint folder, from the repository root.
const llamaDemo = "model_repository/llama/1"

// llamaPrompts cover plain English, digits (one token each in this vocabulary),
// characters spelled in byte-fallback tokens, whitespace runs and code, and the chat
// template's [INST] markers.
var llamaPrompts = []string{
	"The llama (Lama glama) is a domesticated South American camelid.",
	"Llamas 🦙 live 20–30 years; 𠜎 and ꙮ are spelled in bytes.\n\n    def f(x):\n\t\treturn  x * 1000",
	"[INST] Bonjour, ça va ? 你好 [/INST]",
}

func TestLlamaDemoServesTheRealTokenizer(t *testing.T) {
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, llamaDemo)
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
		t.Fatalf("the llama demo checkpoint is missing (`make demo` writes it): %v", err)
	}
	checkShippedLikeGPT2(t, root, "llama")
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	hf := hfPromptIDs(t, root, filepath.Join(dir, "tokenizer.json"), llamaPrompts)
	for i, p := range llamaPrompts {
		if hf[i][0] != 1 || len(hf[i]) < 10 {
			t.Fatalf("Hugging Face encodes %q as %v: want <s> (1) and more than a few tokens", p, hf[i])
		}
		if got := tok.EncodePrompt(p); !slices.Equal(got, hf[i]) {
			t.Errorf("gollm's tokenizer encodes %q as %v, Hugging Face as %v", p, got, hf[i])
		}
	}

	s := harness.Start(t, harness.Options{Models: []harness.Model{{Name: "llama", Checkpoint: llamaDemo}}})
	c := s.Client(t)
	const n = 12
	for i, p := range llamaPrompts {
		// No end token: random weights may pick </s>, and the reference does not stop.
		want := greedyTokens(t, dir, hf[i], n)
		noEnd := int32s("end_id", []int64{1, 1}, -1)
		ctx := testContext(t, time.Minute)

		res, err := streamInfer(ctx, c, inferRequest("llama", "prompt", []tensor{text("text_input", p),
			int32s("max_tokens", []int64{1, 1}, n), boolean("exclude_input_in_output", false), noEnd}))
		if err != nil || res.errMsg != "" {
			t.Fatalf("%q, not streaming: %v %q", p, err, res.errMsg)
		}
		if got := res.tokens; len(got) != len(hf[i])+n || !slices.Equal(got[:len(hf[i])], hf[i]) || !slices.Equal(got[len(hf[i]):], want) {
			t.Errorf("%q, not streaming: output_ids %v, want Hugging Face's prompt ids %v and the greedy tokens %v", p, got, hf[i], want)
		}

		res, err = streamInfer(ctx, c, inferRequest("llama", "stream", []tensor{text("text_input", p),
			int32s("max_tokens", []int64{1, 1}, n), boolean("stream", true), noEnd}))
		if err != nil || res.errMsg != "" {
			t.Fatalf("%q, streaming: %v %q", p, err, res.errMsg)
		}
		if !slices.Equal(res.tokens, want) || res.withTokens != n {
			t.Errorf("%q, streaming: %d responses with tokens %v, want %d with the greedy tokens %v", p, res.withTokens, res.tokens, n, want)
		}

		events, err := sseEvents(ctx, s.HTTP(), s.HTTPURL()+"/v2/models/llama/generate_stream",
			map[string]any{"text_input": p, "max_tokens": n, "stream": true, "end_id": -1})
		if err != nil {
			t.Fatal(err)
		}
		var sb strings.Builder
		for j, ev := range events {
			g, err := decodeGenerate([]byte(ev))
			if err != nil {
				t.Fatalf("%q: event %d: %v", p, j, err)
			}
			sb.WriteString(*g.TextOutput)
		}
		if wantText := tok.DecodeText(want); sb.String() != wantText {
			t.Errorf("%q: generate_stream's events add up to %q, want %q", p, sb.String(), wantText)
		}
		t.Logf("%q: %d prompt tokens as Hugging Face's; greedy %v %q", p, len(hf[i]), want, sb.String())
	}
}

// hfPromptIDs encodes each text with Hugging Face tokenizers (from .deps/py) as a
// prompt: add_special_tokens, so the file's post-processor puts <s> in front.
func hfPromptIDs(t *testing.T, root, tokenizerJSON string, texts []string) [][]int32 {
	t.Helper()
	const script = `
import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
json.dump([tok.encode(t).ids for t in json.loads(sys.stdin.read())], sys.stdout)
`
	in, err := json.Marshal(texts)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", "-c", script, tokenizerJSON)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, ".deps", "py"))
	cmd.Stdin = strings.NewReader(string(in))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 with Hugging Face tokenizers (make deps installs it in .deps/py): %v\n%s", err, stderr.String())
	}
	var ids [][]int32
	if err := json.Unmarshal(out, &ids); err != nil || len(ids) != len(texts) {
		t.Fatalf("reading python's ids: %v (%d lists for %d texts)", err, len(ids), len(texts))
	}
	return ids
}

// checkShippedLikeGPT2 fails the test when model_repository/<name>/config.pbtxt differs
// from gpt2's in more than its comments and name: the harness serves gpt2's config
// with the name changed, so this is what keeps the test serving what make serve does.
func checkShippedLikeGPT2(t *testing.T, root, name string) {
	t.Helper()
	comment := regexp.MustCompile(`(?m)^\s*#.*\n`)
	nameLine := regexp.MustCompile(`(?m)^name: ".*"$`)
	read := func(model string) string {
		raw, err := os.ReadFile(filepath.Join(root, "model_repository", model, "config.pbtxt"))
		if err != nil {
			t.Fatal(err)
		}
		return nameLine.ReplaceAllString(comment.ReplaceAllString(string(raw), ""), `name: ""`)
	}
	if read(name) != read("gpt2") {
		t.Errorf("model_repository/%s/config.pbtxt differs from gpt2's in more than comments and the name", name)
	}
}

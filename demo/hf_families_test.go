package demo

import (
	"encoding/json"
	"gollm/tokenizer"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// familyTexts are strings for the LLaMA-family pipelines' corners, beside handWritten's.
var familyTexts = []string{
	"<s>", "</s>", "<unk>", "<s>Hello", "Hello</s>", "a<s>b", " <s> ", "<s><s>", "<0x41>", "▁", "▁▁x", "x▁y",
	"<|begin_of_text|>Hi", "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>", "<|eot_id|><|eot_id|>",
	"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
	"call <tool_call> now", "call<tool_call>now", "  <tool_call>  ", "a [word] b", "a[word]b", "[word]", "é[word]", "x [word]_",
	"e\u0301", "A\u030a", "\u212b", "ﬁ ligature", "１２３ fullwidth", "x²", "Ⅳ",
	"12345", "1234567", "3.14159265", "2026-11-23", "version 10.0.1", "٣٤٥", "x\u00a0\u00a0y", "\u3000\u3000z",
	"def f(x):\n\treturn x  # comment\n\n\n", "if (a && b) { c(); }\r\n", "    indented", "trailing \n", " \n \n ",
	"'s 'S 'll 'LL 'Re", "I'M DON'T", "ſ long s's",
	"🙂🙂", "👩🏽‍💻", "\U0001F600x", "漢字かな交じり文", "中文，标点。", "Ελληνικά", "עִבְרִית",
	"HTTPServer XMLHttpRequest iPhone McDonald's O'NEILL's", "camelCaseWords snake_case", "ǅungla ǈ ǋ", "नमस्ते दुनिया",
	"a/b/c //x, ../y/", "it's THEY'RE we'Ve", "ǲ", "Ⅻ and ⅻ", "e\u0301\u0301", "ʰʲ ˢ", "x\r\n/\n",
}

func TestTokenizerFamiliesMatchHuggingFace(t *testing.T) {
	root := repoRoot(t)
	dir := t.TempDir()
	texts := append(append(slices.Clone(handWritten), familyTexts...), generated(200)...)
	textsPath := writeTexts(t, dir, texts)
	py := filepath.Join(root, ".deps", "py")
	out, stderr, err := runPython(py, filepath.Join(root, "demo", "hf_families.py"), dir, textsPath,
		filepath.Join(root, "demo", "austen", "heldout-sample.txt"))
	if err != nil {
		t.Fatalf("python3 demo/hf_families.py (tokenizers from %s; `make deps` installs it): %v\n%s", py, err, stderr)
	}
	var hf map[string]hfResult
	if err := json.Unmarshal(out, &hf); err != nil {
		t.Fatalf("reading python's output: %v", err)
	}
	for _, family := range []string{"sp-llama2", "sp-metaspace", "llama3", "qwen2", "o200k", "smollm"} {
		t.Run(family, func(t *testing.T) {
			want, ok := hf[family]
			if !ok || len(want.Plain) != len(texts) || len(want.DecodeKeep) != len(want.DecodeLists) {
				t.Fatalf("python gave no or short results for %s", family)
			}
			tk, err := tokenizer.Load(filepath.Join(dir, family, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			compareWithHF(t, tk, texts, want)
		})
	}
}

// hfResult is what Hugging Face tokenizers made of a list of texts with one tokenizer
// (hf_families.py's hf_results).
type hfResult struct {
	// Plain and Prompt are each text's ids without special tokens and as a prompt.
	Plain  [][]int32 `json:"plain"`
	Prompt [][]int32 `json:"prompt"`
	// DecodeLists are id lists, and DecodeKeep and DecodeSkip their decodes with the
	// special tokens kept and skipped.
	DecodeLists [][]int32 `json:"decode_lists"`
	DecodeKeep  []string  `json:"decode_keep"`
	DecodeSkip  []string  `json:"decode_skip"`
}

// compareWithHF checks gollm's tokenizer against the library's results on texts:
// encoding with and without the prompt's special tokens, decoding with and without
// them, and streamed decoding. It reports the first dozen differences and their count.
func compareWithHF(t *testing.T, tk *tokenizer.Tokenizer, texts []string, want hfResult) {
	t.Helper()
	bad := 0
	report := func(format string, args ...any) {
		bad++
		if bad <= 12 {
			t.Errorf(format, args...)
		}
	}
	for i, s := range texts {
		if got := tk.Encode(s); !slices.Equal(got, want.Plain[i]) {
			report("Encode(%q)\n  gollm %v\n     HF %v", s, got, want.Plain[i])
		}
		if got := tk.EncodePrompt(s); !slices.Equal(got, want.Prompt[i]) {
			report("EncodePrompt(%q)\n  gollm %v\n   want %v", s, got, want.Prompt[i])
		}
	}
	for i, ids := range want.DecodeLists {
		if got := tk.Decode(ids); got != want.DecodeKeep[i] {
			report("Decode(%v) = %q, HF %q", ids, got, want.DecodeKeep[i])
		}
		if got := tk.DecodeText(ids); got != want.DecodeSkip[i] {
			report("DecodeText(%v) = %q, HF %q", ids, got, want.DecodeSkip[i])
		}
		// Streamed, token by token: never a broken character, and the pieces make
		// the whole decode (random ids may hold invalid byte runs, which the
		// library replaces as one run and a stream as it goes).
		for _, skip := range []bool{false, true} {
			d, whole := tk.NewStreamDecoder(), want.DecodeKeep[i]
			if skip {
				d, whole = tk.NewTextStreamDecoder(), want.DecodeSkip[i]
			}
			var sb strings.Builder
			for _, id := range ids {
				p := d.Next(id)
				if !utf8.ValidString(p) {
					report("stream %v: piece %q is not UTF-8", ids, p)
				}
				sb.WriteString(p)
			}
			sb.WriteString(d.Flush())
			if sb.String() != whole && !strings.ContainsRune(whole, utf8.RuneError) {
				report("stream %v (skip special %v) = %q, HF decode %q", ids, skip, sb.String(), whole)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d differences from Hugging Face tokenizers", bad)
	}
}

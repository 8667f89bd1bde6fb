package demo

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"

	"gollm/model"
	"gollm/tokenizer"
	"slices"
	"strings"
	"testing"
)

// realTexts are strings for the corners of the two real vocabularies, beside
// handWritten's and familyTexts': characters Mistral's 32,000 pieces spell in bytes
// (byte fallback), its "▁▁…" whitespace pieces, digits (one by one in Mistral's, by
// three in Llama 3's), code, and Llama 3's chat markers.
var realTexts = []string{
	"Hello world", " Hello", "  Hello", "Hello  world", "   ", "\t\tx", "a\n\n\n\nb", strings.Repeat(" ", 17) + "x",
	"x" + strings.Repeat(" ", 40) + "y", strings.Repeat("\n", 9), "        return x\n", "\t\t\tif x:\n\t\t\t\tpass",
	"12345678901234567890", "3.14159 and 1,000,000", "0x7fff_ffff", "1e-9 2E+10 -0.5",
	"🦙 llama 🦙🦙", "𠜎𠜱𠝹", "\x00\x01\x7f", "ꙮ", "ᚠᛇᚻ", "한국어 텍스트", "ภาษาไทย", "ꦗꦮ", "🧑🏿‍🚀",
	"def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)\n",
	"for (int i = 0; i < n; ++i) { sum += a[i]; }", "SELECT * FROM t WHERE x = 'y';", "fn main() { println!(\"hi\"); }",
	"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
	"<|reserved_special_token_250|>", "<|python_tag|>print(1)<|eom_id|>", "[INST] Hello [/INST]", "<s>[INST] Hi [/INST] Hello</s>",
}

// TestRealTokenizersMatchHuggingFace converts two real tokenizers from the files their
// publishers ship (demo/real_tokenizers.py: Mistral 7B v0.1's SentencePiece model in Llama
// 2's tokenizer.json layout, and Llama 3's tiktoken ranks), checks each conversion
// against the original (sentencepiece, tiktoken), and then gollm's tokenizer against
// Hugging Face tokenizers on the converted files.
func TestRealTokenizersMatchHuggingFace(t *testing.T) {
	root := repoRoot(t)
	dir := t.TempDir()
	texts := append(append(append(slices.Clone(handWritten), familyTexts...), realTexts...), generated(200)...)
	textsPath := writeTexts(t, dir, texts)
	out, stderr, err := runPython(RealTokenizersPythonPath(root), filepath.Join(root, "demo", "real_tokenizers.py"), "compare", dir, textsPath)
	if err != nil {
		t.Fatalf("python3 demo/real_tokenizers.py compare (GOLLM_TEST_DEPS=1 bash scripts/deps.sh installs what it needs): %v\n%s", err, stderr)
	}
	t.Logf("%s", strings.TrimSpace(stderr))
	var hf map[string]hfResult
	if err := json.Unmarshal(out, &hf); err != nil {
		t.Fatalf("reading python's output: %v", err)
	}
	for _, tc := range []struct {
		name, vocab string
		// size, bos and eos are the vocabulary's size and its BOS and EOS ids.
		size     int
		bos, eos int32
	}{
		{"llama2", "Mistral 7B v0.1's SentencePiece BPE in Llama 2's layout", 32000, 1, 2},
		{"llama3", "Llama 3's byte-level BPE", 128256, 128000, 128001},
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
			if tk.VocabSize() != tc.size || !slices.Equal(prefix, []int32{tc.bos}) || len(suffix) != 0 || !tk.IsSpecial(tc.eos) {
				t.Errorf("%s: vocabulary %d, prompt affixes %v %v, eos %d special %v; want %d, [%d] [], special",
					tc.vocab, tk.VocabSize(), prefix, suffix, tc.eos, tk.IsSpecial(tc.eos), tc.size, tc.bos)
			}
			compareWithHF(t, tk, texts, want)
			// The same vocabulary as a GGUF file's tokenizer metadata, written as
			// llama.cpp's converter writes it (the SentencePiece model's pieces, scores
			// and types; the byte-level tokens and merges), read by gollm: the same ids.
			ggufPath := filepath.Join(dir, tc.name+".gguf")
			args := []string{"bpe", filepath.Join(dir, tc.name, "tokenizer.json"), filepath.Join(dir, tc.name, "tokenizer_config.json"), "llama-bpe", ggufPath}
			if tc.name == "llama2" {
				args = []string{"spm", filepath.Join(root, ".deps", "realtok", "mistral_common", "data", "tokenizer.model.v1"),
					filepath.Join(dir, tc.name, "tokenizer_config.json"), ggufPath}
			}
			cmd := exec.Command("python3", append([]string{filepath.Join(root, "testdata", "make_gguf.py")}, args...)...)
			cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, ".deps", "gguf")+":"+RealTokenizersPythonPath(root))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("python3 testdata/make_gguf.py %s (scripts/deps.sh installs the gguf package): %v\n%s", args[0], err, out)
			}
			gk, err := model.LoadTokenizer(ggufPath)
			if err != nil {
				t.Fatal(err)
			}
			compareWithHF(t, gk, texts, want)
		})
	}
}

package demo

import (
	"encoding/json"
	"gollm/tokenizer"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// hfEncode is run by python3: it encodes each string of a JSON list with Hugging Face's
// tokenizers and prints the id lists as JSON.
const hfEncode = `
import json, sys
try:
    import tokenizers
except ImportError as e:
    print("IMPORT-FAILED", e)
    sys.exit(3)
tok = tokenizers.Tokenizer.from_file(sys.argv[1])
texts = json.load(open(sys.argv[2], encoding="utf-8"))
json.dump({"version": tokenizers.__version__, "ids": [tok.encode(t).ids for t in texts]}, sys.stdout)
`

// handWritten are strings chosen for the pre-tokenizer's corners.
var handWritten = []string{
	"", " ", "  ", "\n", "\n\n", "\t", " \t \n ", "a", "Hello, world!", "Hello world",
	"Hello, my name is", "The quick brown fox jumps over the lazy dog.",
	"  leading spaces", "trailing spaces   ", "tabs\tin\tthe\tmiddle", "line\nbreaks\r\nand\rreturns",
	"multiple   spaces   between", "a \n b", "a\n\n\nb", "x \u00a0y", "ideographic\u3000space",
	"1234567890", "3.14159 is pi", "12,345,678.90", "v1.2.3-rc4", "0x7fff", "2024-11-21T19:05:00Z",
	"!!!???...", "(parenthesised) [bracketed] {braced}", "a+b=c; d-e*f/g", "@user #tag $100 50%",
	"don't", "I'm", "you're", "we've", "they'll", "he'd", "it's", "DON'T", "I'M", "'s'", "''quoted''",
	"rock 'n' roll", "O'Neil's", "can't've",
	"café", "naïve résumé", "Ångström", "São Paulo", "Zürich straße", "e\u0301", "ñandú",
	"日本語のテキスト", "中文字符", "한국어 텍스트", "Привет, мир!", "Γειά σου κόσμε", "مرحبا بالعالم", "שלום עולם",
	"नमस्ते दुनिया", "สวัสดีชาวโลก", "Hello 世界 мир 🌍",
	"🎉", "🎉🎉🎉", "👨‍👩‍👧‍👦 family", "🇫🇷🇩🇪 flags", "thumbs 👍🏽 up", "❤️", "emoji🙂inside",
	"<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", " <|endoftext|> ", "<|endoftext", "<|end|>",
	"text<|endoftext|>\nmore text", "<|endoftext|>Hello",
	strings.Repeat("a", 300), strings.Repeat("ab", 150), "antidisestablishmentarianism",
	"Pneumonoultramicroscopicsilicovolcanoconiosis", strings.Repeat("🙂", 40), strings.Repeat(" ", 40) + "x",
	"x²+y³=z½", "Ⅷ Ⅸ Ⅹ", "①②③", "def f(x):\n    return x + 1\n", "<html><body>Hi</body></html>",
	"{\"key\": [1, 2, 3]}", "C:\\path\\to\\file.txt", "https://example.com/a?b=c&d=e",
	"\x00\x01\x1c\x1d\x1e\x1f control", "zero\u200bwidth", "line\u2028separator", "soft\u00adhyphen",
	"\ufeffBOM", "tab\u000bvt\u000cff", "next\u0085line",
}

// fragments are the pieces the seeded generator strings together.
var fragments = []string{
	"the", " the", "The", " quick", " brown", "fox", " jumps", "Hello", "world", "GPT", "token", "izer",
	" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\u00a0", "\u3000", "\u2003",
	"0", "7", "42", "2024", "3.5", "1,000", "٣", "²",
	".", ",", "!", "?", "...", "—", "-", "_", "(", ")", "\"", "'", "`", "/", "\\", "#", "@", "&", "*",
	"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "n't",
	"é", "è", "ü", "ñ", "ç", "ø", "å", "ß", "e\u0301", "Œ",
	"日本", "語", "中文", "字", "こんにちは", "カタカナ", "한국", "Привет", "мир", "Ελλάδα", "عربى", "עברית", "हिन्दी", "ไทย",
	"🙂", "🎉", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "🚀",
	"<|endoftext|>", "<|", "|>", "endoftext",
}

// generated returns n strings drawn with a fixed seed: runs of fragments, random code
// points from long-assigned blocks, and long words.
func generated(n int) []string {
	rng := rand.New(rand.NewPCG(2026, 11))
	blocks := [][2]rune{
		{0x20, 0x7e}, {0xa0, 0xff}, {0x100, 0x17f}, {0x370, 0x3ff}, {0x400, 0x4ff}, {0x590, 0x5ff},
		{0x600, 0x6ff}, {0x900, 0x97f}, {0x2000, 0x206f}, {0x3040, 0x30ff}, {0x4e00, 0x9fff},
		{0xac00, 0xd7a3}, {0x1f300, 0x1f64f}, {0x0, 0x1f},
	}
	var out []string
	for len(out) < n {
		var sb strings.Builder
		switch rng.IntN(4) {
		case 0, 1:
			for range 1 + rng.IntN(20) {
				sb.WriteString(fragments[rng.IntN(len(fragments))])
			}
		case 2:
			for range 1 + rng.IntN(30) {
				b := blocks[rng.IntN(len(blocks))]
				sb.WriteRune(b[0] + rune(rng.IntN(int(b[1]-b[0]+1))))
			}
		case 3:
			for range 50 + rng.IntN(250) {
				sb.WriteByte(byte('a' + rng.IntN(26)))
			}
		}
		out = append(out, sb.String())
	}
	return out
}

// repoRoot is the module root, one folder above this package.
func repoRoot(t *testing.T) string {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// writeTexts checks that texts are UTF-8 (JSON would replace a bad byte, and the
// comparison with Python would be of other strings) and writes them to dir/texts.json
// for the Python side; it returns the file's path.
func writeTexts(t *testing.T, dir string, texts []string) string {
	t.Helper()
	for _, s := range texts {
		if !utf8.ValidString(s) {
			t.Fatalf("test string %q is not UTF-8", s)
		}
	}
	textsJSON, err := json.Marshal(texts)
	if err != nil {
		t.Fatal(err)
	}
	textsPath := filepath.Join(dir, "texts.json")
	if err := os.WriteFile(textsPath, textsJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	return textsPath
}

// runPython runs python3 with args and PYTHONPATH set to pythonPath; it returns what
// the script wrote to standard output and to standard error.
func runPython(pythonPath string, args ...string) ([]byte, string, error) {
	cmd := exec.Command("python3", args...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pythonPath)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	return out, stderr.String(), err
}

func TestTokenizerMatchesHuggingFace(t *testing.T) {
	dir := t.TempDir()
	tokPath := filepath.Join(dir, "tokenizer.json")
	if err := WriteGPT2Tokenizer(tokPath); err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.Load(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	texts := append(slices.Clone(handWritten), generated(300)...)
	textsPath := writeTexts(t, dir, texts)

	py := filepath.Join(repoRoot(t), ".deps", "py")
	out, stderr, err := runPython(py, "-c", hfEncode, tokPath, textsPath)
	if err != nil {
		if strings.Contains(string(out), "IMPORT-FAILED") {
			t.Fatalf("Hugging Face tokenizers is not installed in %s: run `make deps` (%s)", py, out)
		}
		t.Fatalf("python3 with tokenizers failed: %v\n%s%s", err, out, stderr)
	}
	var hf struct {
		Version string    `json:"version"`
		IDs     [][]int32 `json:"ids"`
	}
	if err := json.Unmarshal(out, &hf); err != nil || len(hf.IDs) != len(texts) {
		t.Fatalf("reading the ids from python: %v (%d lists for %d texts)", err, len(hf.IDs), len(texts))
	}
	t.Logf("compared %d strings with tokenizers %s", len(texts), hf.Version)

	mismatches := 0
	for i, s := range texts {
		ids := tk.Encode(s)
		if !slices.Equal(ids, hf.IDs[i]) {
			mismatches++
			if mismatches <= 10 {
				t.Errorf("Encode(%q)\n  gollm %v\n     HF %v", s, ids, hf.IDs[i])
			}
		}
		if back := tk.Decode(ids); back != s {
			t.Errorf("Decode(Encode(%q)) = %q", s, back)
		}
		d := tk.NewStreamDecoder()
		var streamed strings.Builder
		for _, id := range ids {
			piece := d.Next(id)
			if !utf8.ValidString(piece) {
				t.Errorf("streaming %q: Next(%d) returned incomplete UTF-8 %q", s, id, piece)
			}
			streamed.WriteString(piece)
		}
		streamed.WriteString(d.Flush())
		if streamed.String() != s {
			t.Errorf("streaming %q gave %q", s, streamed.String())
		}
	}
	if mismatches > 0 {
		t.Errorf("%d of %d strings tokenized differently from Hugging Face", mismatches, len(texts))
	}
}

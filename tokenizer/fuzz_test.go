package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// llama3Split is Llama 3's pre-tokenizer pattern.
const llama3Split = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// splitTokenizer is smallTokenizer with Llama 3's pipeline: a Split regex before a
// ByteLevel pre-tokenizer without its own regex, ignore_merges, and a BOS template.
func splitTokenizer() []byte {
	return smallTokenizer(testMerges, func(f map[string]any) {
		f["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": llama3Split}, "behavior": "Isolated"},
			map[string]any{"type": "ByteLevel", "use_regex": false}}}
		f["model"].(map[string]any)["ignore_merges"] = true
		f["post_processor"] = map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<|endoftext|>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}},
			"special_tokens": map[string]any{"<|endoftext|>": map[string]any{"ids": []any{256 + len(testMerges)}}}}
	})
}

// sentencePieceTokenizer is a Llama-2-style file: <unk> <s> </s>, the 256 byte tokens,
// "▁" and the letters a–z with a few merges, the Prepend/Replace normalizer and the
// Replace/ByteFallback/Fuse/Strip decoder.
func sentencePieceTokenizer() []byte {
	vocab := map[string]any{"<unk>": 0, "<s>": 1, "</s>": 2}
	for b := range 256 {
		vocab[byteToken(byte(b))] = 3 + b
	}
	next := 259
	for _, s := range []string{"▁", "a", "b", "c", "d", "e", "h", "l", "o", "t", "▁t", "he", "▁the", "ll", "llo"} {
		vocab[s] = next
		next++
	}
	f := map[string]any{
		"added_tokens": []any{
			map[string]any{"id": 0, "content": "<unk>", "special": true},
			map[string]any{"id": 1, "content": "<s>", "special": true},
			map[string]any{"id": 2, "content": "</s>", "special": true}},
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"}}},
		"pre_tokenizer": nil,
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}},
			"special_tokens": map[string]any{"<s>": map[string]any{"ids": []any{1}}}},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0}}},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
			"merges": []any{"▁ t", "h e", "▁t he", "l l", "ll o"}},
	}
	raw, err := json.Marshal(f)
	if err != nil {
		panic(err)
	}
	return raw
}

// FuzzTokenizer feeds arbitrary tokenizer.json files and texts: a file loads or fails
// with an error, and a loaded tokenizer encodes, decodes and streams any text without
// panicking, giving valid UTF-8.
func FuzzTokenizer(f *testing.F) {
	for _, raw := range [][]byte{smallTokenizer(testMerges, nil), splitTokenizer(), sentencePieceTokenizer()} {
		f.Add(raw, "Hello the world, it's 2026! <|endoftext|> 日本語 🎉\n\n  x")
		f.Add(raw, "<s>hello</s> \xff\xfe broken")
	}
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0}},"added_tokens":[{"id":5,"content":"b","single_word":true,"lstrip":true,"rstrip":true}]}`), " b a b ")
	f.Fuzz(func(t *testing.T, raw []byte, text string) {
		tk, err := parseTokenizer(raw)
		if err != nil {
			return
		}
		ids := tk.EncodePrompt(text)
		for _, id := range ids {
			if id < 0 || int(id) >= tk.VocabSize() {
				t.Fatalf("id %d outside the vocabulary of %d", id, tk.VocabSize())
			}
		}
		ids = append(ids, -1, int32(tk.VocabSize()), 1<<30)
		if s := tk.Decode(ids); !utf8.ValidString(s) {
			t.Fatalf("Decode gave invalid UTF-8 %q", s)
		}
		d := tk.NewTextStreamDecoder()
		var sb strings.Builder
		for _, id := range ids {
			sb.WriteString(d.Next(id))
		}
		sb.WriteString(d.Flush())
		if !utf8.ValidString(sb.String()) {
			t.Fatalf("stream gave invalid UTF-8 %q", sb.String())
		}
	})
}

// longText is about n bytes of mixed prose, code, numbers and CJK.
func longText(n int) string {
	parts := []string{"The quick brown fox jumps over the lazy dog. ", "It's 2026-11-23, 12:34:56.\n",
		"func f(x int) int {\n\treturn x * 2 // twice\n}\n\n", "日本語のテキスト、中文。 ", "   spaced   out   ", "🎉🙂 "}
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		sb.WriteString(parts[i%len(parts)])
	}
	return sb.String()
}

func TestLongInputsRoundTrip(t *testing.T) {
	text := longText(100_000)
	for name, raw := range map[string][]byte{"gpt2": smallTokenizer(testMerges, nil), "llama3": splitTokenizer()} {
		tk := mustTokenizer(t, raw)
		if got := tk.Decode(tk.Encode(text)); got != text {
			t.Errorf("%s: a 100 KB text does not survive Encode and Decode", name)
		}
	}
	sp := mustTokenizer(t, sentencePieceTokenizer())
	if got := sp.Decode(sp.Encode(text)); got != text {
		t.Errorf("sentencepiece: a 100 KB text does not survive Encode and Decode")
	}
}

// BenchmarkEncode100KB encodes a 100 KB prompt with each pipeline (the cache cleared
// each time, as for a prompt of new words).
func BenchmarkEncode100KB(b *testing.B) {
	text := longText(100_000)
	for name, raw := range map[string][]byte{"gpt2": smallTokenizer(testMerges, nil), "llama3": splitTokenizer(), "sentencepiece": sentencePieceTokenizer()} {
		tk, err := parseTokenizer(raw)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.mu.Lock()
				clear(tk.cache)
				tk.mu.Unlock()
				tk.Encode(text)
			}
		})
	}
}

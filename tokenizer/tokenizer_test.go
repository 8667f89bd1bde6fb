package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// smallTokenizer builds a tokenizer.json: the 256 byte tokens (id = byte value), then
// one token per merge in order, then <|endoftext|> as an added token. edit may change
// the decoded JSON before it is written.
func smallTokenizer(merges []string, edit func(map[string]any)) []byte {
	vocab := map[string]any{}
	for b := range 256 {
		vocab[string(byteRunes[b])] = b
	}
	for i, m := range merges {
		vocab[strings.Replace(m, " ", "", 1)] = 256 + i
	}
	eot := 256 + len(merges)
	vocab["<|endoftext|>"] = eot
	f := map[string]any{
		"version":        "1.0",
		"added_tokens":   []any{map[string]any{"id": eot, "content": "<|endoftext|>", "special": true}},
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"post_processor": map[string]any{"type": "ByteLevel"},
		"decoder":        map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "vocab": vocab, "merges": merges},
	}
	if edit != nil {
		edit(f)
	}
	raw, err := json.Marshal(f)
	if err != nil {
		panic(err)
	}
	return raw
}

// The test vocabulary's merges; ids are 256 onwards in this order.
var testMerges = []string{"Ġ t", "h e", "Ġt he", "l l", "ll o", "he llo", "a a", "aa aa"}

func mustTokenizer(t *testing.T, raw []byte) *Tokenizer {
	t.Helper()
	tk, err := parseTokenizer(raw)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestPreTokenization(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"words take their leading space", "Hello world", []string{"Hello", " world"}},
		{"contractions split off", "don't we'll I'M", []string{"don", "'t", " we", "'ll", " I", "'", "M"}},
		{"an apostrophe run is punctuation", "''s", []string{"''", "s"}},
		{"numbers and letters separate", "abc123def", []string{"abc", "123", "def"}},
		{"punctuation takes one leading space", "a ,.! b", []string{"a", " ,.!", " b"}},
		{"a space run leaves its last space to the next word", "a   b", []string{"a", "  ", " b"}},
		{"a newline before a word stands alone", "a\nb", []string{"a", "\n", "b"}},
		{"mixed whitespace keeps its last character apart", "a \n\tb", []string{"a", " \n", "\t", "b"}},
		{"trailing whitespace is one token", "a  \n ", []string{"a", "  \n "}},
		{"a lone trailing space is a token", "a ", []string{"a", " "}},
		{"non-ASCII letters are letters", " héllo 日本", []string{" héllo", " 日本"}},
		{"emoji are symbols", "hi 🎉🎉!", []string{"hi", " 🎉🎉!"}},
		{"other numbers are numbers", "x²½ Ⅷ", []string{"x", "²½", " Ⅷ"}},
		{"a no-break space is whitespace", "a\u00a0b", []string{"a", "\u00a0", "b"}},
		{"combining marks are symbols", "e\u0301", []string{"e", "\u0301"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for s := tc.in; len(s) > 0; {
				n := preTokenEnd(s)
				got = append(got, s[:n])
				s = s[n:]
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("split %q = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestEncode(t *testing.T) {
	tk := mustTokenizer(t, smallTokenizer(testMerges, nil))
	the, hello, aaaa := int32(258), int32(261), int32(263)
	for _, tc := range []struct {
		name, in string
		want     []int32
	}{
		{"merges apply by rank", " the", []int32{the}},
		{"a word builds from its merges", "hello", []int32{hello}},
		{"unmerged bytes stay bytes", "hex", []int32{257, 'x'}},
		{"equal pairs merge leftmost first", "aaa", []int32{262, 'a'}},
		{"merged pairs merge again", "aaaaa", []int32{aaaa, 'a'}},
		{"the special token is matched inside words", "hello<|endoftext|>hello", []int32{hello, 264, hello}},
		{"an empty string has no tokens", "", []int32{}},
		{"a partial special token is plain text", "<|endoftext", []int32{'<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't'}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tk.Encode(tc.in)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Encode(%q) = %v, want %v", tc.in, got, tc.want)
			}
			if back := tk.Decode(got); back != tc.in {
				t.Errorf("Decode(Encode(%q)) = %q", tc.in, back)
			}
		})
	}
	t.Run("a very long word encodes quickly", func(t *testing.T) {
		start := time.Now()
		ids := tk.Encode(strings.Repeat("a", 200000))
		if len(ids) != 50000 || ids[0] != aaaa {
			t.Errorf("%d ids starting %v, want 50000 of %d", len(ids), ids[:2], aaaa)
		}
		// The heap makes this a fraction of a second (a few under -race); rescanning every
		// pair after each merge would take minutes.
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("took %v", d)
		}
	})
	t.Run("lookups find added and byte-level tokens", func(t *testing.T) {
		if id, ok := tk.TokenID("<|endoftext|>"); !ok || id != 264 {
			t.Errorf("TokenID(<|endoftext|>) = %d, %v", id, ok)
		}
		if id, ok := tk.TokenID("Ġthe"); !ok || id != the {
			t.Errorf("TokenID(Ġthe) = %d, %v", id, ok)
		}
		if _, ok := tk.TokenID("nope"); ok {
			t.Error("TokenID(nope) found a token")
		}
		if tk.VocabSize() != 265 {
			t.Errorf("VocabSize() = %d, want 265", tk.VocabSize())
		}
	})
}

func TestStreamDecoder(t *testing.T) {
	tk := mustTokenizer(t, smallTokenizer(testMerges, nil))
	t.Run("a character split over tokens comes out whole", func(t *testing.T) {
		d := tk.NewStreamDecoder()
		var got []string
		for _, b := range []byte("a日b") { // 日 is three bytes, three byte tokens
			got = append(got, d.Next(int32(b)))
		}
		if want := []string{"a", "", "", "日", "b"}; !slices.Equal(got, want) {
			t.Errorf("pieces %q, want %q", got, want)
		}
		if rest := d.Flush(); rest != "" {
			t.Errorf("Flush() = %q", rest)
		}
	})
	t.Run("an unfinished character comes out at Flush as U+FFFD", func(t *testing.T) {
		d := tk.NewStreamDecoder()
		if s := d.Next(0xF0) + d.Next(0x9F); s != "" {
			t.Errorf("Next gave %q before the character was complete", s)
		}
		// One U+FFFD for the maximal invalid sequence, as Rust's from_utf8_lossy.
		if rest := d.Flush(); rest != "\uFFFD" {
			t.Errorf("Flush() = %q", rest)
		}
	})
	t.Run("bytes that can never be valid become U+FFFD", func(t *testing.T) {
		d := tk.NewStreamDecoder()
		if s := d.Next(0x80) + d.Next('a'); s != "\uFFFDa" {
			t.Errorf("got %q", s)
		}
	})
}

func TestMalformedTokenizers(t *testing.T) {
	set := func(path string, v any) func(map[string]any) {
		return func(f map[string]any) {
			keys := strings.Split(path, ".")
			m := f
			for _, k := range keys[:len(keys)-1] {
				m = m[k].(map[string]any)
			}
			if v == nil {
				delete(m, keys[len(keys)-1])
			} else {
				m[keys[len(keys)-1]] = v
			}
		}
	}
	for _, tc := range []struct {
		name string
		raw  []byte
		want string
	}{
		{"text that is not JSON fails", []byte(`{"model": `), "invalid JSON"},
		{"a WordPiece model is refused", smallTokenizer(testMerges, set("model.type", "WordPiece")), `model.type "WordPiece" is not supported`},
		{"a missing vocab is named", smallTokenizer(testMerges, set("model.vocab", nil)), "model.vocab is missing"},
		{"a Whitespace pre-tokenizer is refused", smallTokenizer(testMerges, set("pre_tokenizer", map[string]any{"type": "Whitespace"})), `pre_tokenizer: type "Whitespace"`},
		{"a pre-tokenizer inside a Sequence is named", smallTokenizer(testMerges, set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "ByteLevel"}, map[string]any{"type": "Punctuation"}}})), `pre_tokenizer.pretokenizers[1]: type "Punctuation"`},
		{"a BERT normalizer is refused", smallTokenizer(testMerges, set("normalizer", map[string]any{"type": "BertNormalizer"})), `normalizer: type "BertNormalizer"`},
		{"an inverted Split is refused", smallTokenizer(testMerges, set("pre_tokenizer", map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Isolated", "invert": true})), "invert"},
		{"a Split behavior is named", smallTokenizer(testMerges, set("pre_tokenizer", map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Sideways"})), `behavior "Sideways"`},
		{"a lookbehind is refused", smallTokenizer(testMerges, set("pre_tokenizer", map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `(?<=a)b`}, "behavior": "Isolated"})), "lookaround"},
		{"a bad expression is named", smallTokenizer(testMerges, set("pre_tokenizer", map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `[a`}, "behavior": "Isolated"})), `pattern "[a"`},
		{"a BERT post-processor is refused", smallTokenizer(testMerges, set("post_processor", map[string]any{"type": "BertProcessing"})), `post_processor: type "BertProcessing"`},
		{"a template without $A is named", smallTokenizer(testMerges, set("post_processor", map[string]any{"type": "TemplateProcessing", "single": []any{}})), "no $A"},
		{"a template's unknown special token is named", smallTokenizer(testMerges, set("post_processor", map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}}})), `special token "<s>" is not in special_tokens`},
		{"an unknown unk_token is named", smallTokenizer(testMerges, set("model.unk_token", "<unk>")), `model.unk_token "<unk>"`},
		{"a Metaspace replacement of two characters is refused", smallTokenizer(testMerges, set("pre_tokenizer", map[string]any{"type": "Metaspace", "replacement": "__"})), "one-character replacement"},
		{"another decoder is refused", smallTokenizer(testMerges, set("decoder", map[string]any{"type": "WordPiece"})), `decoder: type "WordPiece"`},
		{"a merge of unknown tokens is named", smallTokenizer(append(slices.Clone(testMerges), "zz qq"), nil), `model.merges[8] "zz" "qq"`},
		{"a merge without a space is named", smallTokenizer(testMerges, set("model.merges", []any{"Ġt"})), `model.merges[0]: "Ġt" is not two tokens`},
		{"a merge that is a number is named", smallTokenizer(testMerges, set("model.merges", []any{7})), "model.merges[0]: 7 is neither"},
		{"a missing byte token is named", smallTokenizer(testMerges, func(f map[string]any) {
			delete(f["model"].(map[string]any)["vocab"].(map[string]any), "Ġ")
		}), "no token for byte 0x20"},
		{"an added token without an id is named", smallTokenizer(testMerges, set("added_tokens", []any{map[string]any{"content": "x"}})), "added_tokens[0]"},
		{"an added token that contradicts the vocab is named", smallTokenizer(testMerges, set("added_tokens", []any{map[string]any{"id": 3, "content": "<|endoftext|>"}})), `"<|endoftext|>": id 3`},
		{"dropout is refused", smallTokenizer(testMerges, set("model.dropout", 0.1)), "model.dropout"},
		// Found by FuzzTokenizer: an id of 1.9e9 sized the id tables (a Go fatal error).
		{"a vocab id far beyond the tokens is named", smallTokenizer(testMerges, func(f map[string]any) {
			f["model"].(map[string]any)["vocab"].(map[string]any)["·"] = 1866666663
		}), `model.vocab "·" has id 1866666663, but there are only`},
		{"an added token's id far beyond the tokens is named", smallTokenizer(testMerges, set("added_tokens", []any{map[string]any{"id": 1 << 30, "content": "<big>"}})),
			`added_tokens[0] "<big>" has id 1073741824`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseTokenizer(tc.raw)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
	t.Run("a missing file is named", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tokenizer.json")
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("a file error names the file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tokenizer.json")
		if err := os.WriteFile(path, []byte("[]"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestTokenizerIsSafeForConcurrentUse(t *testing.T) {
	tk := mustTokenizer(t, smallTokenizer(testMerges, nil))
	want := tk.Encode("hello the aaaaa hello")
	done := make(chan []int32)
	for range 8 {
		go func() {
			var got []int32
			for range 200 {
				got = tk.Encode("hello the aaaaa hello")
			}
			done <- got
		}()
	}
	for range 8 {
		if got := <-done; !slices.Equal(got, want) {
			t.Errorf("concurrent Encode = %v, want %v", got, want)
		}
	}
}

// TestTokenizerConfigAffixes loads a Llama-2-style tokenizer.json (its post-processor
// puts <s> before a prompt) beside each tokenizer_config.json: add_bos_token and
// add_eos_token decide what EncodePrompt puts around the text, as transformers' Llama
// tokenizers do, and Encode is left alone.
func TestTokenizerConfigAffixes(t *testing.T) {
	load := func(t *testing.T, cfg string) (*Tokenizer, string, error) {
		t.Helper()
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), sentencePieceTokenizer(), 0o644); err != nil {
			t.Fatal(err)
		}
		cfgPath := filepath.Join(dir, "tokenizer_config.json")
		if cfg != "" {
			if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		tk, err := Load(filepath.Join(dir, "tokenizer.json"))
		return tk, cfgPath, err
	}
	const bos, eos = 1, 2
	plain, _, err := load(t, "")
	if err != nil {
		t.Fatal(err)
	}
	body := plain.Encode("hello the")
	if len(body) == 0 || slices.Contains(body, bos) || slices.Contains(body, eos) {
		t.Fatalf("Encode(%q) = %v: want the text's tokens alone", "hello the", body)
	}
	with := func(pre, post []int32) []int32 { return append(append(slices.Clone(pre), body...), post...) }
	for _, tc := range []struct {
		name, cfg string
		want      []int32
	}{
		{"without tokenizer_config.json the post-processor's <s> leads", "", with([]int32{bos}, nil)},
		{"add_eos_token appends </s>", `{"add_bos_token": true, "add_eos_token": true, "bos_token": "<s>", "eos_token": "</s>"}`,
			with([]int32{bos}, []int32{eos})},
		{"add_eos_token alone keeps the post-processor's <s>", `{"add_eos_token": true, "eos_token": {"content": "</s>", "special": true}}`,
			with([]int32{bos}, []int32{eos})},
		{"add_bos_token false and add_eos_token true give the text then </s>", `{"add_bos_token": false, "add_eos_token": true, "eos_token": "</s>"}`,
			with(nil, []int32{eos})},
		{"add_eos_token false adds nothing", `{"add_eos_token": false, "eos_token": "</s>"}`, with([]int32{bos}, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk, _, err := load(t, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := tk.EncodePrompt("hello the"); !slices.Equal(got, tc.want) {
				t.Errorf("EncodePrompt = %v, want %v", got, tc.want)
			}
			if got := tk.Encode("hello the"); !slices.Equal(got, body) {
				t.Errorf("Encode = %v, want %v without special tokens", got, body)
			}
			// A prompt written with its own <s> (a chat template's) gets no second one, and
			// still gets the </s> the config asks for.
			pre, post := tk.PromptAffixes()
			if got, want := tk.EncodePrompt("<s>hello the"), with([]int32{bos}, post); len(pre) > 0 && !slices.Equal(got, want) {
				t.Errorf("EncodePrompt(<s>…) = %v, want %v", got, want)
			}
		})
	}
	for _, tc := range []struct{ name, cfg, want string }{
		{"add_eos_token without an eos_token is named", `{"add_eos_token": true}`, "add_eos_token is true but eos_token is missing"},
		{"an eos_token outside the vocabulary is named", `{"add_eos_token": true, "eos_token": "<|eot_id|>"}`, `eos_token "<|eot_id|>" is not in the tokenizer's vocabulary`},
		{"an eos_token of the wrong type is named", `{"add_eos_token": true, "eos_token": 2}`, "add_eos_token is true but eos_token"},
		{"a file that is not JSON is named", `{"add_eos_token": tru`, "invalid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, path, err := load(t, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("err = %v, want one naming %s and containing %q", err, path, tc.want)
			}
		})
	}
}

func TestEncodePromptUpToStopsPastTheLimit(t *testing.T) {
	tk := mustTokenizer(t, smallTokenizer(testMerges, nil))
	// The longest vocabulary entry is the 13 bytes of <|endoftext|>, which is also added.
	if tk.pieceBytes != len("<|endoftext|>") || tk.MaxTokenBytes() != len("<|endoftext|>") {
		t.Fatalf("pieceBytes %d, MaxTokenBytes %d", tk.pieceBytes, tk.MaxTokenBytes())
	}
	texts := []string{"hello the world", " the hello<|endoftext|>aaaaa hex", strings.Repeat("aaaaaaa ", 40), "x"}
	for _, text := range texts {
		want := tk.EncodePrompt(text)
		if got, ok := tk.EncodePromptUpTo(text, len(want)); !ok || !slices.Equal(got, want) {
			t.Errorf("%q up to its %d tokens: %v, %v; want %v", text, len(want), got, ok, want)
		}
		if got, ok := tk.EncodePromptUpTo(text, len(want)-1); ok || got != nil {
			t.Errorf("%q up to %d tokens: %v, %v; want none", text, len(want)-1, got, ok)
		}
		// No text is fewer tokens than its bytes over MaxTokenBytes.
		if n := (len(text) + tk.MaxTokenBytes() - 1) / tk.MaxTokenBytes(); len(want) < n {
			t.Errorf("%q: %d tokens, fewer than %d bytes / %d", text, len(want), len(text), tk.MaxTokenBytes())
		}
	}
	t.Run("a giant word is refused without its BPE", func(t *testing.T) {
		text := strings.Repeat("a", 4<<20)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		ids, ok := tk.EncodePromptUpTo(text, 1000)
		runtime.ReadMemStats(&after)
		// Its BPE would allocate a symbol per byte (tens of bytes each).
		if ok || ids != nil || after.TotalAlloc-before.TotalAlloc > uint64(len(text)) {
			t.Errorf("%v, %v after allocating %d bytes for a %d-byte text", len(ids), ok, after.TotalAlloc-before.TotalAlloc, len(text))
		}
	})
}

package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadSpecialTokens reads eos_token and pad_token as transformers does:
// tokenizer_config.json first, special_tokens_map.json for what it leaves out, -1 for a
// token neither names; a name outside the vocabulary is an error naming it.
func TestLoadSpecialTokens(t *testing.T) {
	tk := mustTokenizer(t, sentencePieceTokenizer())
	for _, tc := range []struct {
		name          string
		config, smap  string
		want          SpecialTokens
		wantErrSubstr string
	}{
		{name: "no files name none", want: SpecialTokens{EOS: -1, Pad: -1}},
		{name: "tokenizer_config.json's strings", config: `{"eos_token": "</s>", "pad_token": "<unk>"}`,
			want: SpecialTokens{EOS: 2, Pad: 0}},
		{name: "objects with content, and a null pad", config: `{"eos_token": {"content": "</s>", "special": true}, "pad_token": null}`,
			want: SpecialTokens{EOS: 2, Pad: -1}},
		{name: "special_tokens_map.json fills what the config leaves out", config: `{"eos_token": "</s>"}`, smap: `{"eos_token": "<s>", "pad_token": "<unk>"}`,
			want: SpecialTokens{EOS: 2, Pad: 0}},
		{name: "a name outside the vocabulary", config: `{"eos_token": "<|im_end|>"}`,
			wantErrSubstr: `eos_token "<|im_end|>" is not in the tokenizer's vocabulary`},
		{name: "a token that is neither a string nor an object", config: `{"pad_token": 7}`,
			wantErrSubstr: "pad_token: 7 is neither a string nor an object with content"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for file, text := range map[string]string{"tokenizer_config.json": tc.config, "special_tokens_map.json": tc.smap} {
				if text == "" {
					continue
				}
				if err := os.WriteFile(filepath.Join(dir, file), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := tk.LoadSpecialTokens(dir)
			switch {
			case tc.wantErrSubstr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSubstr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErrSubstr)
				}
			case err != nil:
				t.Fatal(err)
			case got != tc.want:
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

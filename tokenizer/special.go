package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// SpecialTokens are the end and padding tokens a checkpoint's tokenizer files name:
// transformers' tokenizer.eos_token and tokenizer.pad_token, which TensorRT-LLM's
// preprocessing model hands on as a request's default end_id and pad_id. An id is -1
// where the files name no such token.
type SpecialTokens struct {
	// EOS is the end-of-sequence token (eos_token).
	EOS int32
	// Pad is the padding token (pad_token).
	Pad int32
}

// LoadSpecialTokens reads eos_token and pad_token from dir's tokenizer_config.json and,
// for a name that file leaves out, from special_tokens_map.json, as transformers does;
// a folder with neither names none. A named token must be one of t's.
func (t *Tokenizer) LoadSpecialTokens(dir string) (SpecialTokens, error) {
	st := SpecialTokens{EOS: -1, Pad: -1}
	// The first file that names a token decides it.
	var eosName, padName string
	for _, file := range []string{"tokenizer_config.json", "special_tokens_map.json"} {
		path := filepath.Join(dir, file)
		raw, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return st, fmt.Errorf("special tokens: %w", err)
		}
		var f struct {
			EOS json.RawMessage `json:"eos_token"`
			Pad json.RawMessage `json:"pad_token"`
		}
		if err := json.Unmarshal(raw, &f); err != nil {
			return st, fmt.Errorf("special tokens: %s: invalid JSON: %w", path, err)
		}
		for _, tk := range []struct {
			field string
			raw   json.RawMessage
			name  *string
		}{{"eos_token", f.EOS, &eosName}, {"pad_token", f.Pad, &padName}} {
			if *tk.name != "" {
				continue
			}
			n, err := specialTokenName(tk.raw)
			if err != nil {
				return st, fmt.Errorf("special tokens: %s: %s: %w", path, tk.field, err)
			}
			*tk.name = n
		}
	}
	for _, tk := range []struct {
		field, name string
		id          *int32
	}{{"eos_token", eosName, &st.EOS}, {"pad_token", padName, &st.Pad}} {
		if tk.name == "" {
			continue
		}
		id, ok := t.TokenID(tk.name)
		if !ok {
			return st, fmt.Errorf("special tokens: %s %q is not in the tokenizer's vocabulary", tk.field, tk.name)
		}
		*tk.id = id
	}
	return st, nil
}

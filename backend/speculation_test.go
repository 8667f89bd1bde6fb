package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gollm/tokenizer"
)

// TestSpeculationParameters: the speculation parameters parse with their defaults, a
// draft path alone means a draft model (relative to the model's folder), and what does
// not go together is refused naming the parameters.
func TestSpeculationParameters(t *testing.T) {
	parse := func(params map[string]string) (*modelConfig, error) {
		return parseModelConfig(configJSON(t, 8, true, params), "/repo/m", 1)
	}
	c, err := parse(map[string]string{"speculative_decoding_mode": "prompt_lookup"})
	if err != nil {
		t.Fatal(err)
	}
	if s := c.Speculation; s.Mode != specPromptLookup || s.NumTokens != 4 || s.LookupMin != 2 || s.LookupMax != 4 || s.MaxStepTokens != 0 || s.Pinned {
		t.Errorf("prompt_lookup's defaults: %+v", s)
	}
	c, err = parse(map[string]string{"speculative_draft_model_path": "draft", "num_speculative_tokens": "6", "speculative_max_step_tokens": "48"})
	if err != nil {
		t.Fatal(err)
	}
	if s := c.Speculation; s.Mode != specDraftModel || s.DraftPath != "/repo/m/draft" || s.NumTokens != 6 || s.MaxStepTokens != 48 {
		t.Errorf("a draft path alone: %+v", s)
	}
	c, err = parse(map[string]string{"speculative_decoding_mode": "prompt_lookup", "speculative_adaptive": "false"})
	if err != nil || !c.Speculation.Pinned {
		t.Errorf("speculative_adaptive false: %+v, %v", c.Speculation, err)
	}
	c, err = parse(map[string]string{"speculative_decoding_mode": "prompt_lookup", "prompt_lookup_max": "1"})
	if err != nil || c.Speculation.LookupMin != 1 || c.Speculation.LookupMax != 1 {
		t.Errorf("prompt_lookup_max 1: %+v, %v", c.Speculation, err)
	}
	if c, err = parse(nil); err != nil || c.Speculation.Mode != specNone {
		t.Errorf("no parameters: %+v, %v", c.Speculation, err)
	}
	for _, tt := range []struct {
		name   string
		params map[string]string
		want   string
	}{
		{"an unknown mode", map[string]string{"speculative_decoding_mode": "medusa"}, `"medusa" is not one of prompt_lookup, draft_model, eagle3`},
		{"k of 0", map[string]string{"speculative_decoding_mode": "prompt_lookup", "num_speculative_tokens": "0"}, `parameter "num_speculative_tokens": 0: want an integer ≥ 1`},
		{"k above 16", map[string]string{"speculative_decoding_mode": "prompt_lookup", "num_speculative_tokens": "17"}, `parameter "num_speculative_tokens": 17: want at most 16`},
		{"k without a mode", map[string]string{"num_speculative_tokens": "3"}, `parameter "num_speculative_tokens" needs speculative decoding`},
		{"adaptive without a mode", map[string]string{"speculative_adaptive": "false"}, `parameter "speculative_adaptive" needs speculative decoding`},
		{"adaptive not a bool", map[string]string{"speculative_decoding_mode": "prompt_lookup", "speculative_adaptive": "sometimes"}, `"sometimes": want true or false`},
		{"a draft model without its path", map[string]string{"speculative_decoding_mode": "draft_model"}, `needs "speculative_draft_model_path"`},
		{"prompt lookup with a draft", map[string]string{"speculative_decoding_mode": "prompt_lookup", "speculative_draft_model_path": "d"}, `prompt_lookup uses no draft model`},
		{"lookup sizes with a draft", map[string]string{"speculative_draft_model_path": "d", "prompt_lookup_min": "1"}, `"prompt_lookup_min" applies to prompt_lookup`},
		{"min above max", map[string]string{"speculative_decoding_mode": "prompt_lookup", "prompt_lookup_min": "5", "prompt_lookup_max": "3"}, `the minimum exceeds the maximum`},
		{"V1", map[string]string{"speculative_decoding_mode": "prompt_lookup", "gpt_model_type": "V1"}, `speculative decoding needs in-flight batching`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parse(tt.params); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestSameTokenizer: a tokenizer is its own match; the Austen model's and GPT-2's
// demo tokenizers differ, and the difference is named.
func TestSameTokenizer(t *testing.T) {
	a, err := tokenizer.Load("../model_repository/austen/1/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	b, err := tokenizer.Load("../model_repository/llama/1/tokenizer.json")
	if err != nil {
		t.Skipf("the LLaMA demo's tokenizer (make demo): %v", err)
	}
	if err := sameTokenizer(a, a); err != nil {
		t.Errorf("a tokenizer against itself: %v", err)
	}
	// The same vocabulary size, two tokens' texts swapped: a different tokenizer.
	raw, err := os.ReadFile("../model_repository/austen/1/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	vocab := doc["model"].(map[string]any)["vocab"].(map[string]any)
	var x, y string
	for k, v := range vocab {
		switch v.(float64) {
		case 300:
			x = k
		case 301:
			y = k
		}
	}
	vocab[x], vocab[y] = 301.0, 300.0
	swapped, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, swapped, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := tokenizer.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := sameTokenizer(a, c); err == nil || !strings.Contains(err.Error(), "token 300 is") {
		t.Errorf("two tokenizers with two tokens swapped: %v", err)
	}
	if err := sameTokenizer(a, b); err == nil || !strings.Contains(err.Error(), "tokens against") {
		t.Errorf("two tokenizers of different sizes: %v", err)
	}
}

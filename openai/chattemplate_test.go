package openai

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// expectedCase is one entry of testdata/chat/expected.json, which gen.py writes with
// Python's Jinja2 rendering as transformers' apply_chat_template does.
type expectedCase struct {
	// Config names a tokenizer_config.json in testdata/chat.
	Config string `json:"config"`
	// Conversation names the conversation.
	Conversation string `json:"conversation"`
	// Messages are rendered in order.
	Messages []struct {
		// Role is system, user or assistant.
		Role string `json:"role"`
		// Content is its text.
		Content string `json:"content"`
	} `json:"messages"`
	// AddGenerationPrompt is passed to the template as add_generation_prompt.
	AddGenerationPrompt bool `json:"add_generation_prompt"`
	// Output is the rendered prompt, when the template accepts the conversation.
	Output *string `json:"output"`
	// Error is the message of the template's raise_exception otherwise.
	Error string `json:"error"`
}

// TestChatTemplatesMatchJinja2 renders the published chat templates of Llama-3,
// Mistral, Qwen2, TinyLlama, SmolLM and SmolLM2 (and the named-list form) and compares
// with what Python's Jinja2 renders, byte for byte, refusals included.
func TestChatTemplatesMatchJinja2(t *testing.T) {
	raw, err := os.ReadFile("testdata/chat/expected.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []expectedCase
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	templates := map[string]*ChatTemplate{}
	for _, c := range cases {
		ct := templates[c.Config]
		if ct == nil {
			cfg, err := os.ReadFile(filepath.Join("testdata/chat", c.Config))
			if err != nil {
				t.Fatal(err)
			}
			if ct, err = ParseChatTemplate(cfg); err != nil {
				t.Fatalf("%s: %v", c.Config, err)
			}
			templates[c.Config] = ct
		}
		msgs := make([]TemplateMessage, len(c.Messages))
		for i, m := range c.Messages {
			msgs[i] = TemplateMessage{Role: m.Role, Content: m.Content}
		}
		got, err := ct.Render(msgs, c.AddGenerationPrompt)
		name := c.Config + "/" + c.Conversation
		if c.AddGenerationPrompt {
			name += "/generation_prompt"
		}
		switch {
		case c.Output == nil && err == nil:
			t.Errorf("%s: rendered %q, want the template's error %q", name, got, c.Error)
		case c.Output == nil && !strings.Contains(err.Error(), c.Error):
			t.Errorf("%s: error %v, want one with %q", name, err, c.Error)
		case c.Output != nil && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.Output != nil && got != *c.Output:
			t.Errorf("%s:\n got %q\nwant %q", name, got, *c.Output)
		}
	}
	if len(templates) < 7 {
		t.Errorf("%d templates tested, want 7", len(templates))
	}
}

// TestChatTemplateMissing checks the errors for a config without a template and a
// named list without a default.
func TestChatTemplateMissing(t *testing.T) {
	for _, cfg := range []string{`{"bos_token": "<s>"}`, `{"chat_template": null}`, `{"chat_template": ""}`} {
		if _, err := ParseChatTemplate([]byte(cfg)); !errors.Is(err, ErrNoChatTemplate) {
			t.Errorf("%s: error %v, want ErrNoChatTemplate", cfg, err)
		}
	}
	_, err := ParseChatTemplate([]byte(`{"chat_template": [{"name": "tool_use", "template": "x"}]}`))
	if err == nil || !strings.Contains(err.Error(), `"default"`) {
		t.Errorf("named list without default: error %v", err)
	}
	_, err = ParseChatTemplate([]byte(`{"chat_template": 3}`))
	if err == nil || !strings.Contains(err.Error(), "neither a string nor a list") {
		t.Errorf("a number: error %v", err)
	}
	_, err = ParseChatTemplate([]byte(`{"chat_template": "{% for %}"}`))
	if err == nil || !strings.Contains(err.Error(), "compile") {
		t.Errorf("bad Jinja: error %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token": "</s>"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadChatTemplate(dir); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("folder without template: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte(`{{ messages[0].content }}{{ eos_token }}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ct, err := LoadChatTemplate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ct.Render([]TemplateMessage{{Role: "user", Content: "hi"}}, true); err != nil || got != "hi</s>" {
		t.Errorf("chat_template.jinja: %q, %v; want \"hi</s>\"", got, err)
	}
}

package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ardanlabs/jinja"
)

// ErrNoChatTemplate says a checkpoint has no chat template.
var ErrNoChatTemplate = errors.New("the checkpoint has no chat template")

// specialTokenKeys are the special tokens of tokenizer_config.json a template may read,
// as transformers' apply_chat_template passes them.
var specialTokenKeys = []string{"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}

// ChatTemplate is a checkpoint's compiled chat template and the special tokens it reads.
type ChatTemplate struct {
	// tmpl is compiled once and rendered per request.
	tmpl *jinja.Template
	// tokens are the special tokens by name (bos_token, eos_token, ...), as strings.
	tokens map[string]string
	// src is the template's source (the tool-call format is read from it).
	src string
}

// tokenizerConfig is the part of tokenizer_config.json a chat template needs.
type tokenizerConfig struct {
	// ChatTemplate is a string, or a list of {name, template} (the named form).
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// namedTemplate is one entry of the named-template list form.
type namedTemplate struct {
	// Name is the template's name; "default" is the one chat uses.
	Name string `json:"name"`
	// Template is its Jinja source.
	Template string `json:"template"`
}

// LoadChatTemplate reads the chat template of the checkpoint folder dir: the
// chat_template of tokenizer_config.json or, when it has none, the file
// chat_template.jinja (where newer transformers versions save it). It returns an error
// wrapping ErrNoChatTemplate when there is neither.
func LoadChatTemplate(dir string) (*ChatTemplate, error) {
	path := filepath.Join(dir, "tokenizer_config.json")
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		raw, err = []byte("{}"), nil // chat_template.jinja may still be there
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	ct, err := ParseChatTemplate(raw)
	if errors.Is(err, ErrNoChatTemplate) {
		src, ferr := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
		if ferr != nil {
			return nil, fmt.Errorf("neither %s nor chat_template.jinja beside it holds one: %w", path, err)
		}
		return compileTemplate(string(src), raw)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ct, nil
}

// ParseChatTemplate compiles the chat template of a tokenizer_config.json's content:
// chat_template as a string, or the named list form, of which the "default" entry is
// used (as transformers does when none is named).
func ParseChatTemplate(tokenizerConfigJSON []byte) (*ChatTemplate, error) {
	var cfg tokenizerConfig
	if err := json.Unmarshal(tokenizerConfigJSON, &cfg); err != nil {
		return nil, fmt.Errorf("parse tokenizer config: %w", err)
	}
	if len(cfg.ChatTemplate) == 0 || string(cfg.ChatTemplate) == "null" {
		return nil, ErrNoChatTemplate
	}
	var src string
	if err := json.Unmarshal(cfg.ChatTemplate, &src); err != nil {
		var named []namedTemplate
		if err := json.Unmarshal(cfg.ChatTemplate, &named); err != nil {
			return nil, fmt.Errorf("chat_template is neither a string nor a list of {name, template}: %w", err)
		}
		found := false
		names := make([]string, 0, len(named))
		for _, n := range named {
			names = append(names, n.Name)
			if n.Name == "default" {
				src, found = n.Template, true
			}
		}
		if !found {
			return nil, fmt.Errorf("chat_template lists the templates %q but none named \"default\"", names)
		}
	}
	if src == "" {
		return nil, ErrNoChatTemplate
	}
	return compileTemplate(src, tokenizerConfigJSON)
}

// compileTemplate compiles src and reads the special tokens from the tokenizer config.
func compileTemplate(src string, tokenizerConfigJSON []byte) (*ChatTemplate, error) {
	tmpl, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("compile the chat template: %w", err)
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(tokenizerConfigJSON, &all); err != nil {
		return nil, fmt.Errorf("parse tokenizer config: %w", err)
	}
	ct := &ChatTemplate{tmpl: tmpl, tokens: map[string]string{}, src: src}
	for _, k := range specialTokenKeys {
		if s, ok := specialToken(all[k]); ok {
			ct.tokens[k] = s
		}
	}
	return ct, nil
}

// specialToken reads a special token: a string, or the {"content": ...} object form
// (transformers' AddedToken) that some checkpoints write.
func specialToken(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		// Content holds the token's text.
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}

// TemplateMessage is one chat message as the template sees it.
type TemplateMessage struct {
	// Role is system, user, assistant, ...
	Role string
	// Content holds the text, its parts joined (other part types are refused on decoding).
	Content string
	// Name is the optional participant name; left out of the template's view when empty.
	Name string
	// ToolCalls are an assistant message's calls, as templates read them ({"id", "type",
	// "function": {"name", "arguments"}}, arguments a JSON object where they parse as one).
	ToolCalls []any
	// ToolCallID is the call a tool message answers.
	ToolCallID string
}

// Render renders the conversation into a prompt. With addGenerationPrompt the prompt
// ends where the assistant's answer starts. A template's raise_exception, or any other
// failure, is returned as an error.
func (c *ChatTemplate) Render(messages []TemplateMessage, addGenerationPrompt bool) (string, error) {
	return c.RenderTools(messages, nil, addGenerationPrompt)
}

// RenderTools is Render with tools ({"type": "function", "function": {…}}) for the
// template to show the model; none: the template sees no tools variable.
func (c *ChatTemplate) RenderTools(messages []TemplateMessage, tools []any, addGenerationPrompt bool) (string, error) {
	msgs := make([]any, len(messages))
	for i, m := range messages {
		v := map[string]any{"role": m.Role, "content": m.Content}
		if m.Name != "" {
			v["name"] = m.Name
		}
		if len(m.ToolCalls) > 0 {
			v["tool_calls"] = m.ToolCalls
		}
		if m.ToolCallID != "" {
			v["tool_call_id"] = m.ToolCallID
		}
		msgs[i] = v
	}
	data := map[string]any{"messages": msgs, "add_generation_prompt": addGenerationPrompt}
	if len(tools) > 0 {
		data["tools"] = tools
	}
	for k, v := range c.tokens {
		data[k] = v
	}
	out, err := c.tmpl.Render(data)
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	return out, nil
}

package openai

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// Tools and function calling. The tools go to the checkpoint's chat template (which
// renders them as the model family expects), the model writes its calls as text in the
// family's format, and the frontend parses that text into tool_calls. Three formats
// are read, each found in the chat template's text:
//
//   - hermes (Qwen2.5, Qwen3, Hermes): <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>,
//     one block a call, anywhere in the answer;
//   - mistral: [TOOL_CALLS][{"name": …, "arguments": {…}}, …] at the answer's start;
//   - llama3_json (Llama 3.1, 3.2): the answer is {"name": …, "parameters": {…}}, or
//     several separated by "; ", optionally after <|python_tag|>.
//
// tool_choice required or a named function is enforced, not hoped for: the backend's
// guided decoding gets a grammar of the format's calls whose arguments follow each
// function's parameters schema (guide's EBNF with embedded JSON schemas).

// Tool is one tool of a chat request.
type Tool struct {
	// Type is "function".
	Type string `json:"type"`
	// Function describes it.
	Function ToolFunction `json:"function"`
}

// ToolFunction is a function a model may call.
type ToolFunction struct {
	// Name is the function's name.
	Name string `json:"name"`
	// Description says what it does (for the template).
	Description string `json:"description,omitempty"`
	// Parameters is the JSON schema of its arguments (an object).
	Parameters json.RawMessage `json:"parameters,omitempty"`
	// Strict asks for OpenAI's strict schema rules.
	Strict *bool `json:"strict,omitempty"`
}

// ToolCall is a call a model made (in a response, or an assistant message sent back).
type ToolCall struct {
	// Index orders the calls of a streamed delta.
	Index *int `json:"index,omitempty"`
	// ID names the call; a tool message answers it.
	ID string `json:"id,omitempty"`
	// Type is "function".
	Type string `json:"type,omitempty"`
	// Function is the call.
	Function ToolCallFunction `json:"function"`
}

// ToolCallFunction is a call's function and its arguments as JSON text.
type ToolCallFunction struct {
	// Name is the function's name.
	Name string `json:"name,omitempty"`
	// Arguments are the arguments, a JSON object as text.
	Arguments string `json:"arguments"`
}

// toolFormat is a family's way of writing tool calls.
type toolFormat string

const (
	formatNone   toolFormat = ""
	formatHermes toolFormat = "hermes"
	formatMist   toolFormat = "mistral"
	formatLlama  toolFormat = "llama3_json"
)

// detectToolFormat reads a chat template's source for the tool-call format it renders.
func detectToolFormat(src string) toolFormat {
	switch {
	case strings.Contains(src, "<tool_call>"):
		return formatHermes
	case strings.Contains(src, "[TOOL_CALLS]"):
		return formatMist
	case strings.Contains(src, "<|python_tag|>"), strings.Contains(src, "ipython") && strings.Contains(src, "parameters"):
		return formatLlama
	}
	return formatNone
}

// toolChoice is a request's tool_choice, read.
type toolChoice struct {
	// mode is "none", "auto" or "required" (a named function is required too).
	mode string
	// name is the function a named choice calls.
	name string
}

// parseToolChoice reads tool_choice: "none", "auto", "required" or
// {"type": "function", "function": {"name": …}}.
func parseToolChoice(raw json.RawMessage, tools []Tool) (toolChoice, *APIError) {
	if len(bytes.TrimSpace(raw)) == 0 || string(raw) == "null" {
		if len(tools) == 0 {
			return toolChoice{mode: "none"}, nil
		}
		return toolChoice{mode: "auto"}, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "none", "auto", "required":
			if s != "none" && len(tools) == 0 {
				return toolChoice{}, invalid("tool_choice", "tool_choice %q needs tools", s)
			}
			return toolChoice{mode: s}, nil
		}
		return toolChoice{}, invalid("tool_choice", "tool_choice %q is not none, auto, required or a function", s)
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" {
		return toolChoice{}, invalid("tool_choice", "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": …}}")
	}
	for _, t := range tools {
		if t.Function.Name == named.Function.Name {
			return toolChoice{mode: "required", name: named.Function.Name}, nil
		}
	}
	return toolChoice{}, invalid("tool_choice", "tool_choice names function %q, which is not among the tools", named.Function.Name)
}

// checkTools validates the tools.
func checkTools(tools []Tool) *APIError {
	seen := map[string]bool{}
	for i, t := range tools {
		if t.Type != "function" {
			return invalid("tools", "tools[%d]: type %q is not \"function\"", i, t.Type)
		}
		if !schemaName.MatchString(t.Function.Name) {
			return invalid("tools", "tools[%d]: function name %q must be 1 to 64 letters, digits, _ or -", i, t.Function.Name)
		}
		if seen[t.Function.Name] {
			return invalid("tools", "tools[%d]: function %q is given twice", i, t.Function.Name)
		}
		seen[t.Function.Name] = true
		p := bytes.TrimSpace(t.Function.Parameters)
		if len(p) > 0 && p[0] != '{' {
			return invalid("tools", "tools[%d]: parameters must be a JSON schema object", i)
		}
		if t.Function.Strict != nil && *t.Function.Strict && len(p) > 0 {
			if err := checkStrict(p); err != nil {
				return invalid("tools", "Invalid schema for function '%s': %v", t.Function.Name, err)
			}
		}
	}
	return nil
}

// toolGrammar is the grammar (guide's EBNF with %json) of the calls a request requires:
// one or more (one, unless parallel) calls of the named function or of any tool.
func toolGrammar(format toolFormat, tools []Tool, choice toolChoice, parallel bool) (string, error) {
	argKey := "arguments"
	if format == formatLlama {
		argKey = "parameters"
	}
	var alts []any
	for _, t := range tools {
		if choice.name != "" && t.Function.Name != choice.name {
			continue
		}
		var params any = map[string]any{"type": "object"}
		if p := bytes.TrimSpace(t.Function.Parameters); len(p) > 0 {
			params = json.RawMessage(p)
		}
		alts = append(alts, map[string]any{
			"type":                 "object",
			"properties":           map[string]any{"name": map[string]any{"const": t.Function.Name}, argKey: params},
			"required":             []string{"name", argKey},
			"additionalProperties": false,
		})
	}
	call, err := json.Marshal(map[string]any{"anyOf": alts})
	if err != nil {
		return "", err
	}
	switch format {
	case formatHermes:
		g := "call ::= \"<tool_call>\\n\" %json " + string(call) + " \"\\n</tool_call>\"\n"
		if parallel {
			return "root ::= call (\"\\n\" call)*\n" + g, nil
		}
		return "root ::= call\n" + g, nil
	case formatMist:
		list := map[string]any{"type": "array", "items": json.RawMessage(call), "minItems": 1}
		if !parallel {
			list["maxItems"] = 1
		}
		l, err := json.Marshal(list)
		if err != nil {
			return "", err
		}
		return "root ::= \"[TOOL_CALLS]\" %json " + string(l) + "\n", nil
	case formatLlama:
		if parallel {
			return "root ::= call (\"; \" call)*\ncall ::= %json " + string(call) + "\n", nil
		}
		return "root ::= %json " + string(call) + "\n", nil
	}
	return "", fmt.Errorf("no tool-call format")
}

// parsedCall is one call read from the model's text.
type parsedCall struct {
	name string
	args string
}

// parseToolCalls reads a whole answer in format: the calls and the content around them
// (nil calls: the answer is content as it is).
func parseToolCalls(format toolFormat, text string) ([]parsedCall, string) {
	switch format {
	case formatHermes:
		var calls []parsedCall
		var content strings.Builder
		rest := text
		for {
			i := strings.Index(rest, "<tool_call>")
			if i < 0 {
				content.WriteString(rest)
				break
			}
			j := strings.Index(rest[i:], "</tool_call>")
			if j < 0 {
				return nil, text // an unfinished call: content
			}
			c, ok := readCall(rest[i+len("<tool_call>"):i+j], "arguments")
			if !ok {
				return nil, text
			}
			content.WriteString(rest[:i])
			calls = append(calls, c)
			rest = rest[i+j+len("</tool_call>"):]
		}
		if calls == nil {
			return nil, text
		}
		return calls, strings.TrimSpace(content.String())
	case formatMist:
		t := strings.TrimSpace(text)
		if !strings.HasPrefix(t, "[TOOL_CALLS]") {
			return nil, text
		}
		var list []json.RawMessage
		if err := json.Unmarshal([]byte(strings.TrimPrefix(t, "[TOOL_CALLS]")), &list); err != nil || len(list) == 0 {
			return nil, text
		}
		var calls []parsedCall
		for _, raw := range list {
			c, ok := readCall(string(raw), "arguments")
			if !ok {
				return nil, text
			}
			calls = append(calls, c)
		}
		return calls, ""
	case formatLlama:
		t := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "<|python_tag|>"))
		if !strings.HasPrefix(t, "{") {
			return nil, text
		}
		dec := json.NewDecoder(strings.NewReader(t))
		var calls []parsedCall
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return nil, text
			}
			c, ok := readCall(string(raw), "parameters")
			if !ok {
				return nil, text
			}
			calls = append(calls, c)
			rest := strings.TrimSpace(t[dec.InputOffset():])
			if rest == "" {
				return calls, ""
			}
			if !strings.HasPrefix(rest, ";") {
				return nil, text
			}
			t = strings.TrimSpace(rest[1:])
			dec = json.NewDecoder(strings.NewReader(t))
		}
	}
	return nil, text
}

// readCall reads {"name": …, argKey: {…}} ("arguments" is read too, as vLLM reads both).
func readCall(s, argKey string) (parsedCall, bool) {
	var c map[string]json.RawMessage
	if err := json.Unmarshal([]byte(strings.TrimSpace(s)), &c); err != nil {
		return parsedCall{}, false
	}
	var name string
	if err := json.Unmarshal(c["name"], &name); err != nil || name == "" {
		return parsedCall{}, false
	}
	args, ok := c[argKey]
	if !ok {
		args, ok = c["arguments"]
	}
	if !ok {
		args = json.RawMessage("{}")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, args); err != nil {
		return parsedCall{}, false
	}
	return parsedCall{name: name, args: compact.String()}, true
}

// toolCallID names a call.
func toolCallID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "call_" + hex.EncodeToString(b[:])
}

// toolCallsOut are the calls as a response's tool_calls.
func toolCallsOut(calls []parsedCall, withIndex bool) []ToolCall {
	out := make([]ToolCall, len(calls))
	for i, c := range calls {
		out[i] = ToolCall{ID: toolCallID(), Type: "function", Function: ToolCallFunction{Name: c.name, Arguments: c.args}}
		if withIndex {
			idx := i
			out[i].Index = &idx
		}
	}
	return out
}

// toolStream follows one choice's streamed text in a format: text that is content goes
// on at once; text that may be (part of) a call is held back until it is known; a
// finished call comes out as a tool-call delta.
type toolStream struct {
	format toolFormat
	// held is text not sent yet.
	held strings.Builder
	// calls counts the calls sent.
	calls int
	// whole says the answer is being read whole (mistral, llama3_json: its start looked
	// like calls), decided at its end.
	whole bool
	// started says the answer's first text has been seen.
	started bool
}

// push takes new text (final: the answer's last) and returns the content to send and
// the calls finished.
func (ts *toolStream) push(text string, final bool) (string, []parsedCall) {
	ts.held.WriteString(text)
	buf := ts.held.String()
	if !ts.started {
		t := strings.TrimLeft(buf, " \n\t\r")
		if t == "" && !final {
			return "", nil
		}
		undecided := func(marker string) bool { return !final && len(t) < len(marker) && strings.HasPrefix(marker, t) }
		switch ts.format {
		case formatMist:
			if undecided("[TOOL_CALLS]") {
				return "", nil
			}
			ts.whole = strings.HasPrefix(t, "[TOOL_CALLS]")
		case formatLlama:
			if undecided("<|python_tag|>") {
				return "", nil
			}
			ts.whole = strings.HasPrefix(t, "{") || strings.HasPrefix(t, "<|python_tag|>")
		}
		ts.started = true
	}
	if ts.whole {
		if !final {
			return "", nil
		}
		ts.held.Reset()
		calls, content := parseToolCalls(ts.format, buf)
		ts.calls += len(calls)
		return content, calls
	}
	if ts.format != formatHermes {
		ts.held.Reset()
		return buf, nil
	}
	// hermes: content up to a <tool_call>, held from a possible start of one.
	var content strings.Builder
	var calls []parsedCall
	for {
		i := strings.Index(buf, "<tool_call>")
		if i < 0 {
			keep := 0
			if !final {
				keep = partialSuffix(buf, "<tool_call>")
			}
			content.WriteString(buf[:len(buf)-keep])
			buf = buf[len(buf)-keep:]
			break
		}
		j := strings.Index(buf[i:], "</tool_call>")
		if j < 0 {
			if final {
				content.WriteString(buf)
				buf = ""
			} else {
				content.WriteString(buf[:i])
				buf = buf[i:]
			}
			break
		}
		c, ok := readCall(buf[i+len("<tool_call>"):i+j], "arguments")
		content.WriteString(buf[:i])
		if ok {
			calls = append(calls, c)
		} else {
			content.WriteString(buf[i : i+j+len("</tool_call>")])
		}
		buf = buf[i+j+len("</tool_call>"):]
	}
	ts.held.Reset()
	ts.held.WriteString(buf)
	out := content.String()
	if len(calls) > 0 || ts.calls > 0 {
		// Between and around calls, only what is more than whitespace is content.
		if strings.TrimSpace(out) == "" {
			out = ""
		}
	}
	ts.calls += len(calls)
	return out, calls
}

// partialSuffix is the length of the longest end of s that starts marker.
func partialSuffix(s, marker string) int {
	for k := min(len(marker)-1, len(s)); k > 0; k-- {
		if strings.HasSuffix(s, marker[:k]) {
			return k
		}
	}
	return 0
}

package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseToolCalls(t *testing.T) {
	for _, tc := range []struct {
		format  toolFormat
		text    string
		calls   []parsedCall
		content string
	}{
		{formatHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>", []parsedCall{{"f", `{"a":1}`}}, ""},
		{formatHermes, "Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {\"x\": \"y\"}}\n</tool_call>",
			[]parsedCall{{"f", `{}`}, {"g", `{"x":"y"}`}}, "Let me look."},
		{formatHermes, "no calls here", nil, "no calls here"},
		{formatHermes, "<tool_call>\n{\"name\": \"f\"", nil, "<tool_call>\n{\"name\": \"f\""},
		{formatMist, `[TOOL_CALLS][{"name": "f", "arguments": {"a": [1, 2]}}, {"name": "g", "arguments": {}}]`,
			[]parsedCall{{"f", `{"a":[1,2]}`}, {"g", `{}`}}, ""},
		{formatMist, `Plain answer.`, nil, "Plain answer."},
		{formatLlama, `{"name": "f", "parameters": {"q": "x"}}`, []parsedCall{{"f", `{"q":"x"}`}}, ""},
		{formatLlama, `<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"n": 2}}`,
			[]parsedCall{{"f", `{}`}, {"g", `{"n":2}`}}, ""},
		{formatLlama, `{"not": "a call"}`, nil, `{"not": "a call"}`},
	} {
		calls, content := parseToolCalls(tc.format, tc.text)
		if len(calls) != len(tc.calls) || content != tc.content {
			t.Errorf("%s %q: got %v %q, want %v %q", tc.format, tc.text, calls, content, tc.calls, tc.content)
			continue
		}
		for i := range calls {
			if calls[i] != tc.calls[i] {
				t.Errorf("%s %q: call %d %v, want %v", tc.format, tc.text, i, calls[i], tc.calls[i])
			}
		}
	}
}

func TestToolStreamHoldsBackCalls(t *testing.T) {
	for _, tc := range []struct {
		format  toolFormat
		pieces  []string
		content string
		calls   int
	}{
		{formatHermes, []string{"Hi", " there <to", "ol_call>\n{\"name\": \"f\", ", "\"arguments\": {}}\n</tool", "_call>"}, "Hi there ", 1},
		{formatHermes, []string{"a <b> c", " <", "x"}, "a <b> c <x", 0},
		{formatMist, []string{"[TOOL", "_CALLS][{\"name\": \"f\", \"arguments\": {}}]"}, "", 1},
		{formatMist, []string{"[Not", " a call]"}, "[Not a call]", 0},
		{formatLlama, []string{" {\"name\": \"f\",", " \"parameters\": {}}"}, "", 1},
		{formatLlama, []string{"Well", ", {json}"}, "Well, {json}", 0},
	} {
		ts := &toolStream{format: tc.format}
		var content strings.Builder
		calls := 0
		for i, p := range tc.pieces {
			c, cs := ts.push(p, i == len(tc.pieces)-1)
			content.WriteString(c)
			calls += len(cs)
		}
		if content.String() != tc.content || calls != tc.calls {
			t.Errorf("%s %q: content %q and %d calls, want %q and %d", tc.format, tc.pieces, content.String(), calls, tc.content, tc.calls)
		}
	}
}

func TestToolGrammarsCompile(t *testing.T) {
	tools := []Tool{{Type: "function", Function: ToolFunction{Name: "get_weather",
		Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)}},
		{Type: "function", Function: ToolFunction{Name: "now"}}}
	for _, f := range []toolFormat{formatHermes, formatMist, formatLlama} {
		for _, par := range []bool{false, true} {
			g, err := toolGrammar(f, tools, toolChoice{mode: "required"}, par)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := guideCompileEBNF(g); err != nil {
				t.Errorf("%s parallel %v: %v\n%s", f, par, err, g)
			}
		}
	}
	if _, api := parseToolChoice(json.RawMessage(`{"type":"function","function":{"name":"nope"}}`), tools); api == nil {
		t.Error("a tool_choice naming no tool was accepted")
	}
}

func TestToolStreamCountsWholeAnswers(t *testing.T) {
	ts := &toolStream{format: formatMist}
	if _, calls := ts.push(`[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]`, true); len(calls) != 2 || ts.calls != 2 {
		t.Fatalf("%d calls, counted %d; want 2", len(calls), ts.calls)
	}
}

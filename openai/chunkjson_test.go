package openai

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestChunksAppendAsEncodingJSONWrites: the hand-written chunks decode to the values
// encoding/json's encoding of the same responses decodes to.
func TestChunksAppendAsEncodingJSONWrites(t *testing.T) {
	s := func(v string) *string { return &v }
	texts := []string{"", " Darcy", "say \"hi\"\n\tback\\", "\x01\x1f", "é 🦙 \u2028", "bad \xff byte", "<&>"}
	var cases []chunkAppender
	for _, text := range texts {
		cases = append(cases,
			&ChatResponse{ID: "chatcmpl-1", Object: "chat.completion.chunk", Created: 7, Model: "m",
				Choices: []ChatChoice{{Index: 2, Delta: &ChatMessageOut{Role: "assistant", Content: s(text)}}}, SystemFingerprint: "fp", nullUsage: true},
			&ChatResponse{ID: "chatcmpl-1", Object: "chat.completion.chunk", Created: 7, Model: "m",
				Choices: []ChatChoice{{Index: 0, Delta: &ChatMessageOut{Content: s(text)}, FinishReason: s("stop")}}},
			&CompletionResponse{ID: "cmpl-1", Object: "text_completion", Created: 9, Model: "m",
				Choices: []CompletionChoice{{Index: 1, Text: text, FinishReason: s("length")}}, nullUsage: true})
	}
	cases = append(cases,
		&ChatResponse{ID: "c", Object: "chat.completion.chunk", Choices: []ChatChoice{{Delta: &ChatMessageOut{}, FinishReason: s("stop")}}},
		&ChatResponse{ID: "c", Object: "chat.completion.chunk", Choices: []ChatChoice{}, Usage: &Usage{1, 2, 3}, SystemFingerprint: "fp"},
		&CompletionResponse{ID: "c", Object: "text_completion", Choices: []CompletionChoice{}, Usage: &Usage{4, 5, 9}})
	for i, c := range cases {
		got, ok := c.appendChunk(nil)
		if !ok {
			t.Fatalf("case %d: not appended", i)
		}
		want, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("case %d: %s is not JSON: %v", i, got, err)
		}
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("case %d:\n got %s\nwant %s", i, got, want)
		}
	}
	// Logprobs and tool calls are left to encoding/json.
	lp := &ChatResponse{Choices: []ChatChoice{{Delta: &ChatMessageOut{}, Logprobs: &ChatLogprobs{}}}}
	if _, ok := lp.appendChunk(nil); ok {
		t.Error("a chunk with logprobs was appended by hand")
	}
}

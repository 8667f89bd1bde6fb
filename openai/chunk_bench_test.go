package openai

import (
	"net/http"
	"testing"
)

// discardWriter is an http.ResponseWriter that keeps nothing (and flushes nothing).
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}

// BenchmarkChatChunk is the frontend's work for one streamed token of a chat answer: the
// chunk built from the piece, encoded as JSON, framed as an SSE event and written.
func BenchmarkChatChunk(b *testing.B) {
	sse := newSSE(&discardWriter{h: http.Header{}})
	created := int64(1795471119)
	for b.Loop() {
		text := " Darcy"
		delta := &ChatMessageOut{Content: &text}
		ch := ChatChoice{Index: 0, Delta: delta}
		resp := &ChatResponse{ID: "chatcmpl-ebfc35df817bf4bbf7efe65d", Object: "chat.completion.chunk", Created: created,
			Model: "austen", Choices: []ChatChoice{ch}, SystemFingerprint: systemFingerprint, nullUsage: true}
		if err := sse.event(resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCompletionChunk is BenchmarkChatChunk for /v1/completions.
func BenchmarkCompletionChunk(b *testing.B) {
	sse := newSSE(&discardWriter{h: http.Header{}})
	for b.Loop() {
		ch := CompletionChoice{Index: 0, Text: " Darcy"}
		resp := &CompletionResponse{ID: "cmpl-ebfc35df817bf4bbf7efe65d", Object: "text_completion", Created: 1795471119,
			Model: "austen", Choices: []CompletionChoice{ch}, SystemFingerprint: systemFingerprint}
		if err := sse.event(resp); err != nil {
			b.Fatal(err)
		}
	}
}

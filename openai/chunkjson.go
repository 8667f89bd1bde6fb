package openai

import (
	"strconv"
	"unicode/utf8"
)

// Streamed chunks are most of what the frontend writes: one per token of every
// answer. The common ones — a piece of text, a role, a finish reason, usage — are
// appended as JSON by hand rather than through encoding/json's reflection (which took
// several microseconds and six allocations a chunk); the others (logprobs, tool calls)
// go through encoding/json. Both write the same JSON values.

// chunkAppender is a response that can append itself as JSON.
type chunkAppender interface {
	// appendChunk appends the JSON of the response to b; false when it holds fields
	// appendChunk does not write (the caller encodes it with encoding/json).
	appendChunk(b []byte) ([]byte, bool)
}

// appendJSONString appends s as a JSON string (invalid UTF-8 as U+FFFD, as
// encoding/json writes it; <, > and & as they are).
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(append(b, s[start:]...), '"')
}

// appendUsage appends "usage" as the response would write it.
func appendUsage(b []byte, u *Usage, null bool) []byte {
	switch {
	case u != nil:
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, int64(u.TotalTokens), 10)
		b = append(b, '}')
	case null:
		b = append(b, `,"usage":null`...)
	}
	return b
}

// appendHead appends the fields every response starts with.
func appendHead(b []byte, id, object string, created int64, model string) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, id)
	b = append(b, `,"object":`...)
	b = appendJSONString(b, object)
	b = append(b, `,"created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	return appendJSONString(b, model)
}

// appendFinish appends "finish_reason".
func appendFinish(b []byte, f *string) []byte {
	b = append(b, `,"finish_reason":`...)
	if f == nil {
		return append(b, "null"...)
	}
	return appendJSONString(b, *f)
}

func (r *ChatResponse) appendChunk(b []byte) ([]byte, bool) {
	for i := range r.Choices {
		c := &r.Choices[i]
		if c.Message != nil || c.Logprobs != nil || c.Delta != nil && len(c.Delta.ToolCalls) > 0 {
			return b, false
		}
	}
	b = appendHead(b, r.ID, r.Object, r.Created, r.Model)
	b = append(b, `,"choices":[`...)
	for i := range r.Choices {
		c := &r.Choices[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(c.Index), 10)
		if d := c.Delta; d != nil {
			b = append(b, `,"delta":{`...)
			sep := false
			if d.Role != "" {
				b = append(b, `"role":`...)
				b = appendJSONString(b, d.Role)
				sep = true
			}
			if d.Content != nil {
				if sep {
					b = append(b, ',')
				}
				b = append(b, `"content":`...)
				b = appendJSONString(b, *d.Content)
			}
			b = append(b, '}')
		}
		b = append(b, `,"logprobs":null`...)
		b = appendFinish(b, c.FinishReason)
		b = append(b, '}')
	}
	b = append(b, ']')
	b = appendUsage(b, r.Usage, r.nullUsage)
	if r.SystemFingerprint != "" {
		b = append(b, `,"system_fingerprint":`...)
		b = appendJSONString(b, r.SystemFingerprint)
	}
	return append(b, '}'), true
}

func (r *CompletionResponse) appendChunk(b []byte) ([]byte, bool) {
	for i := range r.Choices {
		if r.Choices[i].Logprobs != nil {
			return b, false
		}
	}
	b = appendHead(b, r.ID, r.Object, r.Created, r.Model)
	b = append(b, `,"choices":[`...)
	for i := range r.Choices {
		c := &r.Choices[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(c.Index), 10)
		b = append(b, `,"text":`...)
		b = appendJSONString(b, c.Text)
		b = append(b, `,"logprobs":null`...)
		b = appendFinish(b, c.FinishReason)
		b = append(b, '}')
	}
	b = append(b, ']')
	b = appendUsage(b, r.Usage, r.nullUsage)
	if r.SystemFingerprint != "" {
		b = append(b, `,"system_fingerprint":`...)
		b = appendJSONString(b, r.SystemFingerprint)
	}
	return append(b, '}'), true
}

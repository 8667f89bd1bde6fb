package openai

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The request and response bodies of the OpenAI API, the fields gollm reads or writes.

// fieldError is a field's value that its own decoder refused.
type fieldError struct {
	// field is named in the error message.
	field string
	// msg says what is wrong.
	msg string
}

// Error names the field.
func (e *fieldError) Error() string { return fmt.Sprintf("field %q: %s", e.field, e.msg) }

// StopList is "stop": one string or a list of strings.
type StopList []string

// UnmarshalJSON accepts a string, a list of strings or null.
func (s *StopList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = StopList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return &fieldError{"stop", "want a string or a list of strings"}
	}
	*s = many
	return nil
}

// StreamOptions are a streaming request's options.
type StreamOptions struct {
	// IncludeUsage adds a last chunk with usage and no choices.
	IncludeUsage bool `json:"include_usage"`
}

// samplingFields are the request fields completions and chat share.
type samplingFields struct {
	// Model names the Triton model.
	Model string `json:"model"`
	// MaxTokens bounds the generated tokens (max_tokens).
	MaxTokens *int `json:"max_tokens"`
	// Temperature is in [0, 2]; 0 is greedy. Default 1.
	Temperature *float64 `json:"temperature"`
	// TopP is in (0, 1]. Default 1.
	TopP *float64 `json:"top_p"`
	// N is the number of choices, ≥ 1.
	N *int `json:"n"`
	// Stream answers with Server-Sent Events.
	Stream bool `json:"stream"`
	// StreamOptions need "stream": true.
	StreamOptions *StreamOptions `json:"stream_options"`
	// Stop are strings that end the generation; at most 4.
	Stop StopList `json:"stop"`
	// PresencePenalty is in [-2, 2].
	PresencePenalty *float64 `json:"presence_penalty"`
	// FrequencyPenalty is in [-2, 2].
	FrequencyPenalty *float64 `json:"frequency_penalty"`
	// LogitBias maps token ids (as strings) to a bias in [-100, 100].
	LogitBias map[string]float64 `json:"logit_bias"`
	// Seed makes sampling repeatable.
	Seed *int64 `json:"seed"`
	// User is the end user's id (accepted, unused).
	User string `json:"user"`

	// vLLM's extra sampling parameters.

	// TopK keeps the k most likely tokens (-1 or 0: no limit).
	TopK *int `json:"top_k"`
	// MinP keeps the tokens at least this share as likely as the most likely one.
	MinP *float64 `json:"min_p"`
	// RepetitionPenalty divides the logits of tokens seen (1: none).
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	// MinTokens forbids the end token before this many tokens.
	MinTokens *int `json:"min_tokens"`
	// IgnoreEOS generates past the end token (benchmarks).
	IgnoreEOS bool `json:"ignore_eos"`
}

// CompletionRequest is the body of POST /v1/completions.
type CompletionRequest struct {
	samplingFields
	// Prompt is a string or a list of one string.
	Prompt json.RawMessage `json:"prompt"`
	// Echo puts the prompt before the completion.
	Echo bool `json:"echo"`
	// Logprobs asks for this many alternatives per token (0..5) with their log-probabilities.
	Logprobs *int `json:"logprobs"`
	// Suffix is not supported.
	Suffix *string `json:"suffix"`
	// BestOf is supported only as n (or unset).
	BestOf *int `json:"best_of"`
}

// ContentPart is one part of a message's content in the list form.
type ContentPart struct {
	// Type is "text" (the only type a text model takes).
	Type string `json:"type"`
	// Text holds the part's text (type "text").
	Text string `json:"text"`
}

// MessageContent is a message's content: a string or a list of text parts.
type MessageContent struct {
	// Text is the content, parts joined.
	Text string
	// Null says the content was null or absent.
	Null bool
	// Set says the content was given and not null.
	Set bool
}

// UnmarshalJSON accepts a string, null or a list of text parts.
func (c *MessageContent) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		c.Null = true
		return nil
	}
	c.Set = true
	if err := json.Unmarshal(b, &c.Text); err == nil {
		return nil
	}
	var parts []ContentPart
	if err := json.Unmarshal(b, &parts); err != nil {
		return &fieldError{"messages", "a message's content must be a string or a list of content parts"}
	}
	var sb strings.Builder
	for i, p := range parts {
		if p.Type != "text" {
			return &fieldError{"messages", fmt.Sprintf("content part %d has type %q; this model takes only \"text\"", i, p.Type)}
		}
		sb.WriteString(p.Text)
	}
	c.Text = sb.String()
	return nil
}

// ChatMessage is one message of a chat request.
type ChatMessage struct {
	// Role is system, developer, user, assistant or tool.
	Role string `json:"role"`
	// Content may be a string or a list of text parts.
	Content MessageContent `json:"content"`
	// Name is passed to the chat template.
	Name string `json:"name"`
	// ToolCalls are an assistant message's calls (tools.go).
	ToolCalls []ToolCall `json:"tool_calls"`
	// ToolCallID is the call a tool message answers.
	ToolCallID string `json:"tool_call_id"`
}

// ChatRequest is the body of POST /v1/chat/completions.
type ChatRequest struct {
	samplingFields
	// Messages are rendered in order by the chat template.
	Messages []ChatMessage `json:"messages"`
	// MaxCompletionTokens is max_tokens under its newer name.
	MaxCompletionTokens *int `json:"max_completion_tokens"`
	// Logprobs asks for the chosen tokens' log-probabilities.
	Logprobs bool `json:"logprobs"`
	// TopLogprobs asks for this many alternatives per token (0..20); needs logprobs.
	TopLogprobs *int `json:"top_logprobs"`
	// Tools are the functions the model may call (tools.go).
	Tools []Tool `json:"tools"`
	// ToolChoice is none, auto, required or a named function.
	ToolChoice json.RawMessage `json:"tool_choice"`
	// ParallelToolCalls allows several calls in one answer (default true).
	ParallelToolCalls *bool `json:"parallel_tool_calls"`
	// ResponseFormat is text, json_object or json_schema (structured.go).
	ResponseFormat *ResponseFormat `json:"response_format"`
}

// Usage counts tokens.
type Usage struct {
	// PromptTokens is the prompt's length in tokens (once, however many choices).
	PromptTokens int `json:"prompt_tokens"`
	// CompletionTokens is the tokens generated over all choices.
	CompletionTokens int `json:"completion_tokens"`
	// TotalTokens sums the two counts.
	TotalTokens int `json:"total_tokens"`
}

// CompletionLogprobs are the legacy completions' log-probabilities.
type CompletionLogprobs struct {
	// Tokens hold each token's text.
	Tokens []string `json:"tokens"`
	// TokenLogprobs are their log-probabilities.
	TokenLogprobs []float64 `json:"token_logprobs"`
	// TopLogprobs map the most likely tokens' texts to their log-probabilities, per token.
	TopLogprobs []map[string]float64 `json:"top_logprobs"`
	// TextOffset is each token's byte offset in the choice's text.
	TextOffset []int `json:"text_offset"`
}

// CompletionChoice is one choice of a completion.
type CompletionChoice struct {
	// Index says which of the n choices this is.
	Index int `json:"index"`
	// Text is the completion (or, streaming, its new part).
	Text string `json:"text"`
	// Logprobs are present when asked.
	Logprobs *CompletionLogprobs `json:"logprobs"`
	// FinishReason is "stop" or "length"; null until the choice ends.
	FinishReason *string `json:"finish_reason"`
}

// CompletionResponse is a completion, or one chunk of a streamed one.
type CompletionResponse struct {
	// ID is "cmpl-" and the request id.
	ID string `json:"id"`
	// Object is "text_completion".
	Object string `json:"object"`
	// Created is the Unix time of the request.
	Created int64 `json:"created"`
	// Model echoes the request's model.
	Model string `json:"model"`
	// Choices are the choices (streaming: the one that moved).
	Choices []CompletionChoice `json:"choices"`
	// Usage is the token counts (streaming: only in the usage chunk).
	Usage *Usage `json:"usage,omitempty"`
	// SystemFingerprint names the serving configuration.
	SystemFingerprint string `json:"system_fingerprint,omitempty"`
	// nullUsage writes "usage": null when Usage is nil (the chunks before a stream's
	// usage chunk, as OpenAI writes them).
	nullUsage bool
}

// MarshalJSON writes "usage": null where nullUsage asks.
func (r *CompletionResponse) MarshalJSON() ([]byte, error) {
	type plain CompletionResponse
	if r.Usage == nil && r.nullUsage {
		return json.Marshal(struct {
			*plain
			Usage *Usage `json:"usage"`
		}{(*plain)(r), nil})
	}
	return json.Marshal((*plain)(r))
}

// TopLogprob is one alternative token.
type TopLogprob struct {
	// Token holds the alternative's text.
	Token string `json:"token"`
	// Logprob is its log-probability.
	Logprob float64 `json:"logprob"`
	// Bytes hold the text's bytes, for tokens that split a character.
	Bytes []int `json:"bytes"`
}

// TokenLogprob is one generated token with its log-probability and alternatives.
type TokenLogprob struct {
	// Token holds the token's text.
	Token string `json:"token"`
	// Logprob is its log-probability.
	Logprob float64 `json:"logprob"`
	// Bytes hold the text's bytes, for tokens that split a character.
	Bytes []int `json:"bytes"`
	// TopLogprobs are the most likely tokens at this position.
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// ChatLogprobs are a chat choice's log-probabilities.
type ChatLogprobs struct {
	// Content holds one entry per generated token.
	Content []TokenLogprob `json:"content"`
}

// ChatMessageOut is the assistant's message (or, streaming, its delta).
type ChatMessageOut struct {
	// Role is "assistant" (streaming: in the first delta only).
	Role string `json:"role,omitempty"`
	// Content is the text (streaming: its new part).
	Content *string `json:"content,omitempty"`
	// ToolCalls are the model's calls (streaming: each call whole, in one delta).
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	// Index says which of the n choices this is.
	Index int `json:"index"`
	// Message is the answer (non-streaming).
	Message *ChatMessageOut `json:"message,omitempty"`
	// Delta is the new part (streaming).
	Delta *ChatMessageOut `json:"delta,omitempty"`
	// Logprobs are present when asked.
	Logprobs *ChatLogprobs `json:"logprobs"`
	// FinishReason is "stop" or "length"; null until the choice ends.
	FinishReason *string `json:"finish_reason"`
}

// ChatResponse is a chat completion, or one chunk of a streamed one.
type ChatResponse struct {
	// ID is "chatcmpl-" and the request id.
	ID string `json:"id"`
	// Object is "chat.completion" or "chat.completion.chunk".
	Object string `json:"object"`
	// Created is the Unix time of the request.
	Created int64 `json:"created"`
	// Model echoes the request's model.
	Model string `json:"model"`
	// Choices are the choices (streaming: the one that moved).
	Choices []ChatChoice `json:"choices"`
	// Usage is the token counts (streaming: only in the usage chunk).
	Usage *Usage `json:"usage,omitempty"`
	// SystemFingerprint names the serving configuration.
	SystemFingerprint string `json:"system_fingerprint,omitempty"`
	// nullUsage writes "usage": null when Usage is nil.
	nullUsage bool
}

// MarshalJSON writes "usage": null where nullUsage asks.
func (r *ChatResponse) MarshalJSON() ([]byte, error) {
	type plain ChatResponse
	if r.Usage == nil && r.nullUsage {
		return json.Marshal(struct {
			*plain
			Usage *Usage `json:"usage"`
		}{(*plain)(r), nil})
	}
	return json.Marshal((*plain)(r))
}

// systemFingerprint is every response's system_fingerprint.
const systemFingerprint = "fp_gollm"

// Model is one entry of /v1/models.
type Model struct {
	// ID names the Triton model.
	ID string `json:"id"`
	// Object is "model".
	Object string `json:"object"`
	// Created is when the frontend first saw the model (Unix time).
	Created int64 `json:"created"`
	// OwnedBy is "gollm".
	OwnedBy string `json:"owned_by"`
}

// ModelList is the body of GET /v1/models.
type ModelList struct {
	// Object is "list".
	Object string `json:"object"`
	// Data holds one entry per ready model.
	Data []Model `json:"data"`
}

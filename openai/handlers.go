package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"
)

// Maximum alternatives per token.
const (
	// maxCompletionLogprobs bounds completions' logprobs (OpenAI's limit).
	maxCompletionLogprobs = 5
	// maxTopLogprobs bounds chat's top_logprobs (OpenAI's limit).
	maxTopLogprobs = 20
)

// completions answers POST /v1/completions.
func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	id, api := requestID(r)
	if api != nil {
		writeError(w, api)
		return
	}
	var req CompletionRequest
	if api := decodeBody(r, &req); api != nil {
		writeError(w, api)
		return
	}
	mi, api := s.models.lookup(r.Context(), req.Model)
	if api != nil {
		writeError(w, api)
		return
	}
	prompt, api := completionPrompt(req.Prompt)
	if api != nil {
		writeError(w, api)
		return
	}
	switch {
	case req.Suffix != nil && *req.Suffix != "":
		writeError(w, invalid("suffix", "suffix is not supported"))
		return
	case req.BestOf != nil && (req.N == nil && *req.BestOf != 1 || req.N != nil && *req.BestOf != *req.N):
		writeError(w, invalid("best_of", "best_of is supported only equal to n"))
		return
	}
	if _, api := promptTokens(mi, prompt, "prompt"); api != nil {
		writeError(w, api)
		return
	}
	base, n, api := s.params(mi, &req.samplingFields, req.MaxTokens, "max_tokens")
	if api != nil {
		writeError(w, api)
		return
	}
	if base.maxTokens == 0 {
		base.maxTokens = defaultCompletionTokens
	}
	base.prompt = prompt
	if req.Logprobs != nil {
		k := *req.Logprobs
		if k < 0 || k > maxCompletionLogprobs {
			writeError(w, invalid("logprobs", "logprobs must be between 0 and %d, got %d", maxCompletionLogprobs, k))
			return
		}
		if req.Echo {
			writeError(w, invalid("logprobs", "logprobs with echo (the prompt's log-probabilities) is not supported"))
			return
		}
		if api := needTokenizer(mi, "logprobs"); api != nil {
			writeError(w, api)
			return
		}
		base.logprobs, base.topLogprobs = true, k
	}
	created := time.Now().Unix()
	resp := func(choices []CompletionChoice, u *Usage) *CompletionResponse {
		return &CompletionResponse{ID: "cmpl-" + id, Object: "text_completion", Created: created, Model: mi.name, Choices: choices, Usage: u}
	}
	s.log.Debug("completion", zap.String("request_id", id), zap.String("model", mi.name), zap.Int("n", n), zap.Bool("stream", req.Stream))
	g := s.start(r.Context(), mi, base, n, id)
	if req.Stream {
		echoed := make([]bool, n)
		offsets := make([]int, n)
		streamPieces(w, g, id, n, req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
			func(pc piece) any {
				text := pc.text
				if req.Echo && !echoed[pc.index] {
					text, echoed[pc.index] = prompt+text, true
				}
				ch := CompletionChoice{Index: pc.index, Text: text, FinishReason: finishPtr(pc.finish)}
				if base.logprobs {
					ch.Logprobs = completionLogprobs(pc.tokens, offsets[pc.index])
					for _, t := range pc.tokens {
						offsets[pc.index] += len(t.text)
					}
				}
				return resp([]CompletionChoice{ch}, nil)
			},
			func(u *Usage) any { return resp([]CompletionChoice{}, u) })
		return
	}
	res, api := collect(g, n)
	if api != nil {
		writeError(w, api)
		return
	}
	choices := make([]CompletionChoice, n)
	for i := range res {
		text := res[i].text.String()
		if req.Echo {
			text = prompt + text
		}
		choices[i] = CompletionChoice{Index: i, Text: text, FinishReason: finishPtr(res[i].finish)}
		if base.logprobs {
			choices[i].Logprobs = completionLogprobs(res[i].tokens, 0)
		}
	}
	w.Header().Set("X-Request-Id", id)
	writeJSON(w, resp(choices, usageOf(res)))
}

// completionPrompt reads "prompt": a string, or a list of one string.
func completionPrompt(raw json.RawMessage) (string, *APIError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", invalid("prompt", "missing \"prompt\"")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return "", invalid("prompt", "the prompt is empty")
		}
		return s, nil
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		if len(list) != 1 {
			return "", invalid("prompt", "one prompt per request: got a list of %d", len(list))
		}
		return completionPrompt(json.RawMessage(mustJSON(list[0])))
	}
	return "", invalid("prompt", "prompt must be a string (token-id prompts are not supported)")
}

// promptTokens counts a prompt's tokens, once per request however many choices it asks
// for, and refuses one that leaves no room for a new token under the model's maximum
// sequence length (param names the field it came from) — by its bytes alone when it is
// longer than any prompt of that many tokens, else as soon as its tokens pass the limit,
// so that the work is bounded by the model, not by the prompt. It returns -1 when the
// frontend cannot tell (no tokenizer, or no known length); the backend checks anyway.
func promptTokens(mi *modelInfo, prompt, param string) (int, *APIError) {
	if mi.tok == nil || mi.maxSeqLen <= 0 {
		return -1, nil
	}
	tooLong := func(what string) *APIError {
		return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Code: "context_length_exceeded",
			Message: fmt.Sprintf("the prompt is %s; model %q takes at most %d tokens, prompt and completion together", what, mi.name, mi.maxSeqLen)}
	}
	if b := mi.tok.MaxTokenBytes(); b > 0 && len(prompt) > mi.maxSeqLen*b {
		return -1, tooLong(fmt.Sprintf("%d bytes, more than %d tokens can be", len(prompt), mi.maxSeqLen))
	}
	ids, ok := mi.tok.EncodePromptUpTo(prompt, mi.maxSeqLen-1)
	if !ok {
		return -1, tooLong(fmt.Sprintf("more than %d tokens, which leaves no room for a completion", mi.maxSeqLen-1))
	}
	return len(ids), nil
}

// mustJSON encodes a string.
func mustJSON(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

// needTokenizer refuses a feature that needs the checkpoint's tokenizer when the
// frontend could not read it.
func needTokenizer(mi *modelInfo, param string) *APIError {
	if mi.tok == nil {
		return invalid(param, "%s needs the checkpoint's tokenizer.json, which the frontend cannot read: %v", param, mi.tokErr)
	}
	return nil
}

// completionLogprobs is the legacy logprobs object of tokens; offsets count from base.
func completionLogprobs(tokens []tokenInfo, base int) *CompletionLogprobs {
	lp := &CompletionLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	off := base
	for _, t := range tokens {
		lp.Tokens = append(lp.Tokens, t.text)
		lp.TokenLogprobs = append(lp.TokenLogprobs, round6(t.logprob))
		top := map[string]float64{}
		for _, a := range t.top {
			if _, dup := top[a.text]; !dup {
				top[a.text] = round6(a.logprob)
			}
		}
		lp.TopLogprobs = append(lp.TopLogprobs, top)
		lp.TextOffset = append(lp.TextOffset, off)
		off += len(t.text)
	}
	return lp
}

// chat answers POST /v1/chat/completions.
func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	id, api := requestID(r)
	if api != nil {
		writeError(w, api)
		return
	}
	var req ChatRequest
	if api := decodeBody(r, &req); api != nil {
		writeError(w, api)
		return
	}
	mi, api := s.models.lookup(r.Context(), req.Model)
	if api != nil {
		writeError(w, api)
		return
	}
	if req.TopLogprobs != nil {
		k := *req.TopLogprobs
		if k < 0 || k > maxTopLogprobs {
			writeError(w, invalid("top_logprobs", "top_logprobs must be between 0 and %d, got %d", maxTopLogprobs, k))
			return
		}
		if !req.Logprobs {
			writeError(w, invalid("top_logprobs", "top_logprobs needs \"logprobs\": true"))
			return
		}
	}
	prompt, api := chatPrompt(mi, &req)
	if api != nil {
		writeError(w, api)
		return
	}
	promptLen, api := promptTokens(mi, prompt, "messages")
	if api != nil {
		writeError(w, api)
		return
	}
	maxTokens, name := req.MaxCompletionTokens, "max_completion_tokens"
	if maxTokens == nil {
		maxTokens, name = req.MaxTokens, "max_tokens"
	}
	base, n, api := s.params(mi, &req.samplingFields, maxTokens, name)
	if api != nil {
		writeError(w, api)
		return
	}
	base.prompt = prompt
	if base.maxTokens == 0 {
		// OpenAI's default: up to the context's end.
		base.maxTokens = defaultCompletionTokens
		if promptLen > 0 {
			base.maxTokens = mi.maxSeqLen - promptLen
		}
	}
	if req.TopLogprobs != nil {
		base.topLogprobs = *req.TopLogprobs
	}
	if req.Logprobs {
		if api := needTokenizer(mi, "logprobs"); api != nil {
			writeError(w, api)
			return
		}
		base.logprobs = true
	}
	created := time.Now().Unix()
	resp := func(object string, choices []ChatChoice, u *Usage) *ChatResponse {
		return &ChatResponse{ID: "chatcmpl-" + id, Object: object, Created: created, Model: mi.name, Choices: choices, Usage: u}
	}
	s.log.Debug("chat", zap.String("request_id", id), zap.String("model", mi.name), zap.Int("n", n), zap.Bool("stream", req.Stream))
	g := s.start(r.Context(), mi, base, n, id)
	if req.Stream {
		roleSent := make([]bool, n)
		streamPieces(w, g, id, n, req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
			func(pc piece) any {
				text := pc.text
				delta := &ChatMessageOut{Content: &text}
				if !roleSent[pc.index] {
					delta.Role, roleSent[pc.index] = "assistant", true
				}
				ch := ChatChoice{Index: pc.index, Delta: delta, FinishReason: finishPtr(pc.finish)}
				if base.logprobs {
					ch.Logprobs = chatLogprobs(pc.tokens)
				}
				return resp("chat.completion.chunk", []ChatChoice{ch}, nil)
			},
			func(u *Usage) any { return resp("chat.completion.chunk", []ChatChoice{}, u) })
		return
	}
	res, api := collect(g, n)
	if api != nil {
		writeError(w, api)
		return
	}
	choices := make([]ChatChoice, n)
	for i := range res {
		text := res[i].text.String()
		choices[i] = ChatChoice{Index: i, Message: &ChatMessageOut{Role: "assistant", Content: &text}, FinishReason: finishPtr(res[i].finish)}
		if base.logprobs {
			choices[i].Logprobs = chatLogprobs(res[i].tokens)
		}
	}
	w.Header().Set("X-Request-Id", id)
	writeJSON(w, resp("chat.completion", choices, usageOf(res)))
}

// chatPrompt checks the messages and renders them with the model's chat template.
func chatPrompt(mi *modelInfo, req *ChatRequest) (string, *APIError) {
	if len(req.Messages) == 0 {
		return "", invalid("messages", "messages must hold at least one message")
	}
	if len(req.Tools) > 0 && string(req.Tools) != "null" && string(req.Tools) != "[]" {
		return "", invalid("tools", "tools are not supported")
	}
	if req.ResponseFormat != nil && req.ResponseFormat.Type != "" && req.ResponseFormat.Type != "text" {
		return "", invalid("response_format", "response_format %q is not supported; only \"text\"", req.ResponseFormat.Type)
	}
	msgs := make([]TemplateMessage, len(req.Messages))
	for i, m := range req.Messages {
		switch {
		case m.Role == "":
			return "", invalid("messages", "messages[%d] has no role", i)
		case len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null":
			return "", invalid("messages", "messages[%d]: tool_calls are not supported", i)
		}
		msgs[i] = TemplateMessage{Role: m.Role, Content: m.Content.Text, Name: m.Name}
	}
	if mi.chat == nil {
		return "", invalid("model", "model %q has no chat template (%v); use /v1/completions, or serve a checkpoint whose tokenizer_config.json has a chat_template", mi.name, mi.chatErr)
	}
	prompt, err := mi.chat.Render(msgs, true)
	if err != nil {
		return "", invalid("messages", "the model's chat template refused the messages: %v", err)
	}
	return prompt, nil
}

// chatLogprobs is a chat choice's logprobs object.
func chatLogprobs(tokens []tokenInfo) *ChatLogprobs {
	lp := &ChatLogprobs{Content: []TokenLogprob{}}
	for _, t := range tokens {
		tl := TokenLogprob{Token: t.text, Logprob: round6(t.logprob), Bytes: byteInts(t.text), TopLogprobs: []TopLogprob{}}
		for _, a := range t.top {
			tl.TopLogprobs = append(tl.TopLogprobs, TopLogprob{Token: a.text, Logprob: round6(a.logprob), Bytes: byteInts(a.text)})
		}
		lp.Content = append(lp.Content, tl)
	}
	return lp
}

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
	if api := decodeBody(r, &req, completionFields); api != nil {
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
	includeUsage := req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	resp := func(choices []CompletionChoice, u *Usage) *CompletionResponse {
		return &CompletionResponse{ID: "cmpl-" + id, Object: "text_completion", Created: created, Model: mi.name, Choices: choices, Usage: u,
			SystemFingerprint: systemFingerprint, nullUsage: includeUsage}
	}
	s.log.Debug("completion", zap.String("request_id", id), zap.String("model", mi.name), zap.Int("n", n), zap.Bool("stream", req.Stream))
	g := s.start(r.Context(), mi, base, n, id)
	if req.Stream {
		echoed := make([]bool, n)
		offsets := make([]int, n)
		// One chunk, reused: each is written before the next is made.
		chunk := resp(make([]CompletionChoice, 1), nil)
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
				chunk.Choices[0] = ch
				return chunk
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
	if api := decodeBody(r, &req, chatFields); api != nil {
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
	guideType, guideText, api := req.ResponseFormat.guide()
	if api != nil {
		writeError(w, api)
		return
	}
	if api := checkTools(req.Tools); api != nil {
		writeError(w, api)
		return
	}
	choice, api := parseToolChoice(req.ToolChoice, req.Tools)
	if api != nil {
		writeError(w, api)
		return
	}
	format := formatNone
	if choice.mode != "none" {
		if mi.chat == nil {
			writeError(w, invalid("tools", "model %q has no chat template to render tools with (%v)", mi.name, mi.chatErr))
			return
		}
		if format = detectToolFormat(mi.chat.src); format == formatNone {
			writeError(w, invalid("tools", "model %q's chat template writes no tool calls gollm reads (hermes <tool_call>, mistral [TOOL_CALLS], llama3_json <|python_tag|>)", mi.name))
			return
		}
	}
	if choice.mode == "required" {
		if guideType != "" {
			writeError(w, invalid("tool_choice", "tool_choice %q with response_format %q: give one of them", choice.mode, req.ResponseFormat.Type))
			return
		}
		parallel := req.ParallelToolCalls == nil || *req.ParallelToolCalls
		g, err := toolGrammar(format, req.Tools, choice, parallel)
		if err != nil {
			writeError(w, invalid("tools", "%v", err))
			return
		}
		guideType, guideText = "ebnf_grammar", g
	}
	if guideType != "" && !mi.inputs[inGuideType] {
		param := "response_format"
		if choice.mode == "required" {
			param = "tool_choice"
		}
		writeError(w, invalid(param, "model %q does not take guided decoding (its configuration has no input %q)", mi.name, inGuideType))
		return
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
	base.guideType, base.guide = guideType, guideText
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
	includeUsage := req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	resp := func(object string, choices []ChatChoice, u *Usage) *ChatResponse {
		return &ChatResponse{ID: "chatcmpl-" + id, Object: object, Created: created, Model: mi.name, Choices: choices, Usage: u,
			SystemFingerprint: systemFingerprint, nullUsage: includeUsage}
	}
	s.log.Debug("chat", zap.String("request_id", id), zap.String("model", mi.name), zap.Int("n", n), zap.Bool("stream", req.Stream))
	g := s.start(r.Context(), mi, base, n, id)
	if req.Stream {
		roleSent := make([]bool, n)
		// One chunk, its delta and text, reused: each is written before the next is made.
		chunk := resp("chat.completion.chunk", make([]ChatChoice, 1), nil)
		var deltaBuf ChatMessageOut
		var textBuf string
		var ts []*toolStream
		if format != formatNone {
			ts = make([]*toolStream, n)
			for i := range ts {
				ts[i] = &toolStream{format: format}
			}
		}
		streamPieces(w, g, id, n, req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
			func(pc piece) any {
				text := pc.text
				var calls []parsedCall
				finish := pc.finish
				if ts != nil {
					s := ts[pc.index]
					text, calls = s.push(text, pc.finish != "")
					if pc.finish != "" && s.calls > 0 {
						// The answer's calls are whole (its text parsed): they end it.
						finish = "tool_calls"
					}
				}
				textBuf = text
				deltaBuf = ChatMessageOut{Content: &textBuf}
				delta := &deltaBuf
				if text == "" && (pc.finish != "" || len(calls) > 0) {
					delta.Content = nil // the last chunk's delta is {}, as OpenAI's
				}
				if len(calls) > 0 {
					out := toolCallsOut(calls, true)
					for k := range out {
						idx := ts[pc.index].calls - len(calls) + k
						out[k].Index = &idx
					}
					delta.ToolCalls = out
				}
				if !roleSent[pc.index] {
					delta.Role, roleSent[pc.index] = "assistant", true
				}
				ch := ChatChoice{Index: pc.index, Delta: delta, FinishReason: finishPtr(finish)}
				if base.logprobs {
					ch.Logprobs = chatLogprobs(pc.tokens)
				}
				chunk.Choices[0] = ch
				return chunk
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
		msg := &ChatMessageOut{Role: "assistant", Content: &text}
		finish := res[i].finish
		if format != formatNone {
			if calls, content := parseToolCalls(format, text); calls != nil {
				msg.ToolCalls = toolCallsOut(calls, false)
				msg.Content = nil
				if content != "" {
					msg.Content = &content
				}
				// The answer's calls are whole (its text parsed): they end it.
				finish = "tool_calls"
			}
		}
		choices[i] = ChatChoice{Index: i, Message: msg, FinishReason: finishPtr(finish)}
		if base.logprobs {
			choices[i].Logprobs = chatLogprobs(res[i].tokens)
		}
	}
	w.Header().Set("X-Request-Id", id)
	writeJSON(w, resp("chat.completion", choices, usageOf(res)))
}

// chatPrompt checks the messages and renders them, with the tools when given, with the
// model's chat template.
func chatPrompt(mi *modelInfo, req *ChatRequest) (string, *APIError) {
	if len(req.Messages) == 0 {
		return "", invalid("messages", "messages must hold at least one message")
	}
	msgs := make([]TemplateMessage, len(req.Messages))
	for i, m := range req.Messages {
		if api := checkMessage(i, &m); api != nil {
			return "", api
		}
		switch {
		case m.Role == "":
			return "", invalid("messages", "messages[%d] has no role", i)
		case m.Role == "tool" && m.ToolCallID == "":
			return "", invalid("messages", "messages[%d]: a tool message needs tool_call_id", i)
		case len(m.ToolCalls) > 0 && m.Role != "assistant":
			return "", invalid("messages", "messages[%d]: only assistant messages carry tool_calls", i)
		}
		tm := TemplateMessage{Role: m.Role, Content: m.Content.Text, Name: m.Name, ToolCallID: m.ToolCallID}
		for j, c := range m.ToolCalls {
			if c.Function.Name == "" {
				return "", invalid("messages", "messages[%d].tool_calls[%d] has no function name", i, j)
			}
			// Templates read the arguments as an object (tojson, items()).
			var args any = c.Function.Arguments
			var obj map[string]any
			if json.Unmarshal([]byte(c.Function.Arguments), &obj) == nil {
				args = obj
			}
			tm.ToolCalls = append(tm.ToolCalls, map[string]any{"id": c.ID, "type": "function",
				"function": map[string]any{"name": c.Function.Name, "arguments": args}})
		}
		msgs[i] = tm
	}
	if mi.chat == nil {
		return "", invalid("model", "model %q has no chat template (%v); use /v1/completions, or serve a checkpoint whose tokenizer_config.json has a chat_template", mi.name, mi.chatErr)
	}
	var tools []any
	for _, t := range req.Tools {
		f := map[string]any{"name": t.Function.Name}
		if t.Function.Description != "" {
			f["description"] = t.Function.Description
		}
		if len(t.Function.Parameters) > 0 {
			var p any
			if err := json.Unmarshal(t.Function.Parameters, &p); err != nil {
				return "", invalid("tools", "function %q: parameters are not valid JSON: %v", t.Function.Name, err)
			}
			f["parameters"] = p
		}
		tools = append(tools, map[string]any{"type": "function", "function": f})
	}
	prompt, err := mi.chat.RenderTools(msgs, tools, true)
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

// messageRoles are the roles OpenAI's chat API takes, each with whether its messages
// must carry content (an assistant's may be left out).
var messageRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": false, "tool": true, "function": true}

// checkMessage refuses a message as OpenAI does: an unknown role, or a missing or null
// content where the role needs one.
func checkMessage(i int, m *ChatMessage) *APIError {
	if m.Role == "" {
		return nil // said by the caller
	}
	needsContent, ok := messageRoles[m.Role]
	switch {
	case !ok:
		return invalid(fmt.Sprintf("messages[%d].role", i), "Invalid value for 'messages[%d].role': %q. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.", i, m.Role)
	case needsContent && !m.Content.Set:
		return invalid(fmt.Sprintf("messages[%d].content", i), "Missing required parameter: 'messages[%d].content'.", i)
	}
	return nil
}

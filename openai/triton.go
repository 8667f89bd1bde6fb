package openai

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"gollm/kserve"
)

// The model's tensors the frontend uses (backend/README.md describes them).
const (
	inTextInput         = "text_input"
	inMaxTokens         = "max_tokens"
	inStream            = "stream"
	inTemperature       = "temperature"
	inTopP              = "runtime_top_p"
	inSeed              = "random_seed"
	inPresence          = "presence_penalty"
	inFrequency         = "frequency_penalty"
	inEmbeddingBias     = "embedding_bias"
	inReturnTopLogprobs = "return_top_logprobs"
	inReturnNumInput    = "return_num_input_tokens"
	inReturnNumOutput   = "return_num_output_tokens"
	inReturnFinish      = "return_finish_reason"
	inStopWords         = "stop_words"
	inStop              = "stop"
	inTopK              = "runtime_top_k"
	inMinP              = "min_p"
	inRepetition        = "repetition_penalty"
	inMinLength         = "min_length"
	inEndID             = "end_id"
	inGuideType         = "guided_decoding_guide_type"
	inGuide             = "guided_decoding_guide"

	outTextOutput    = "text_output"
	outOutputIDs     = "output_ids"
	outTokenLogprobs = "token_logprobs"
	outTopLogprobs   = "top_logprobs"
	outTopLogprobIDs = "top_logprob_ids"
	outNumInput      = "num_input_tokens"
	outNumOutput     = "num_output_tokens"
	outFinishReason  = "finish_reason"
)

// genParams are one choice's generation settings, validated.
type genParams struct {
	// prompt goes to text_input as it is.
	prompt string
	// maxTokens bounds the generated tokens.
	maxTokens int
	// temperature is the sampling temperature, 0 greedy; nil leaves it to the model's
	// default (its generation_config.json's).
	temperature *float32
	// topP is the nucleus; nil leaves it to the model's default.
	topP *float32
	// seed goes to random_seed when sampling.
	seed uint64
	// presence and frequency go to the penalties of those names.
	presence, frequency float32
	// bias is the logit bias per vocabulary entry; nil for none.
	bias []float32
	// stop are the stop strings, which the backend matches on the text it generates.
	stop []string
	// logprobs asks for the chosen tokens' log-probabilities.
	logprobs bool
	// topLogprobs asks for this many alternatives per token too.
	topLogprobs int
	// requestID names the request in Triton, for stop requests and logs.
	requestID string
	// topK, minP and repetition are vLLM's sampling extras (0: none).
	topK       int
	minP       float32
	repetition float32
	// minTokens forbids the end token before this many tokens.
	minTokens int
	// ignoreEOS sends end_id -1: no end token.
	ignoreEOS bool
	// guideType and guide are guided decoding's constraint ("": none).
	guideType, guide string
}

// tokenInfo is one generated token, for logprobs.
type tokenInfo struct {
	// id indexes the vocabulary.
	id int32
	// text is the token's bytes as text (possibly part of a character).
	text string
	// logprob is its log-probability.
	logprob float64
	// top are the most likely tokens, best first.
	top []altToken
	// end is where the token's own text ends, counted in bytes from the start of the
	// generated tokens' texts: the token goes out once the text has come that far.
	end int
}

// altToken is one alternative token.
type altToken struct {
	// text is its bytes as text.
	text string
	// logprob is its log-probability.
	logprob float64
}

// piece is what one choice adds in one step: text, the tokens it holds (with
// logprobs), and at the end the finish reason and counts.
type piece struct {
	// index says which choice the piece belongs to.
	index int
	// text is new text.
	text string
	// tokens are the tokens whose text is now complete (with logprobs only).
	tokens []tokenInfo
	// finish is the backend's finish_reason ("stop", "length", "abort") on the choice's
	// last piece, else "".
	finish string
	// promptTokens and completionTokens are the counts, on the last piece.
	promptTokens, completionTokens int
	// err ends the choice with an error.
	err *APIError
	// first says no piece came before (an error then is the request's fault).
	first bool
}

// tensor is one input with its raw little-endian contents.
type tensor struct {
	// name and datatype are sent as the KServe input's.
	name, datatype string
	// shape is its shape, batch dimension first.
	shape []int64
	// raw is its contents.
	raw []byte
}

// buildRequest turns a choice's settings into a Triton request on mi's tensors.
func buildRequest(mi *modelInfo, p *genParams) (*kserve.ModelInferRequest, error) {
	var ts []tensor
	add := func(name, dt string, shape []int64, raw []byte) error {
		if !mi.inputs[name] {
			return fmt.Errorf("model %q has no input %q", mi.name, name)
		}
		ts = append(ts, tensor{name, dt, shape, raw})
		return nil
	}
	one := []int64{1, 1}
	text := make([]byte, 4+len(p.prompt))
	binary.LittleEndian.PutUint32(text, uint32(len(p.prompt)))
	copy(text[4:], p.prompt)
	if err := add(inTextInput, "BYTES", one, text); err != nil {
		return nil, err
	}
	if err := add(inMaxTokens, "INT32", one, binary.LittleEndian.AppendUint32(nil, uint32(p.maxTokens))); err != nil {
		return nil, err
	}
	if mi.decoupled {
		if err := add(inStream, "BOOL", one, []byte{1}); err != nil {
			return nil, err
		}
	}
	f32 := func(v float32) []byte { return binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)) }
	// Greedy (temperature 0) is sent too: the model's default may be to sample.
	if p.temperature != nil {
		if err := add(inTemperature, "FP32", one, f32(*p.temperature)); err != nil {
			return nil, err
		}
	}
	if p.temperature == nil || *p.temperature != 0 {
		if err := add(inSeed, "UINT64", one, binary.LittleEndian.AppendUint64(nil, p.seed)); err != nil {
			return nil, err
		}
		if p.topP != nil {
			if err := add(inTopP, "FP32", one, f32(*p.topP)); err != nil {
				return nil, err
			}
		}
	}
	if p.presence != 0 {
		if err := add(inPresence, "FP32", one, f32(p.presence)); err != nil {
			return nil, err
		}
	}
	if p.frequency != 0 {
		if err := add(inFrequency, "FP32", one, f32(p.frequency)); err != nil {
			return nil, err
		}
	}
	if p.bias != nil {
		raw := make([]byte, 0, 4*len(p.bias))
		for _, b := range p.bias {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(b))
		}
		if err := add(inEmbeddingBias, "FP32", []int64{1, int64(len(p.bias))}, raw); err != nil {
			return nil, err
		}
	}
	if stops := nonEmpty(p.stop); len(stops) > 0 {
		if err := add(inStopWords, "BYTES", []int64{1, int64(len(stops))}, bytesElements(stops)); err != nil {
			return nil, err
		}
	}
	i32 := func(v int32) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(v)) }
	if p.topK > 0 {
		if err := add(inTopK, "INT32", one, i32(int32(p.topK))); err != nil {
			return nil, err
		}
	}
	if p.minP > 0 {
		if err := add(inMinP, "FP32", one, f32(p.minP)); err != nil {
			return nil, err
		}
	}
	if p.repetition != 0 && p.repetition != 1 {
		if err := add(inRepetition, "FP32", one, f32(p.repetition)); err != nil {
			return nil, err
		}
	}
	if p.minTokens > 0 {
		if err := add(inMinLength, "INT32", one, i32(int32(p.minTokens))); err != nil {
			return nil, err
		}
	}
	if p.ignoreEOS {
		if err := add(inEndID, "INT32", one, i32(-1)); err != nil {
			return nil, err
		}
	}
	if p.guideType != "" {
		if err := add(inGuideType, "BYTES", one, bytesElement(p.guideType)); err != nil {
			return nil, err
		}
		if p.guide != "" {
			if err := add(inGuide, "BYTES", one, bytesElement(p.guide)); err != nil {
				return nil, err
			}
		}
	}
	// The counts and the finish reason are the backend's, which knows them: the frontend
	// does not count tokens again.
	for _, name := range []string{inReturnNumInput, inReturnNumOutput, inReturnFinish} {
		if err := add(name, "BOOL", one, []byte{1}); err != nil {
			return nil, err
		}
	}
	outs := []string{outTextOutput, outOutputIDs, outNumInput, outNumOutput, outFinishReason}
	if p.logprobs {
		if err := add(inReturnTopLogprobs, "INT32", one, binary.LittleEndian.AppendUint32(nil, uint32(p.topLogprobs))); err != nil {
			return nil, err
		}
		outs = append(outs, outTokenLogprobs, outTopLogprobs, outTopLogprobIDs)
	}
	req := &kserve.ModelInferRequest{
		ModelName: mi.name,
		Id:        p.requestID,
		// An empty final response tells when a streaming request is over even when its
		// last step produced no text (the end token).
		Parameters: map[string]*kserve.InferParameter{
			"triton_enable_empty_final_response": {ParameterChoice: &kserve.InferParameter_BoolParam{BoolParam: true}},
		},
	}
	for _, t := range ts {
		req.Inputs = append(req.Inputs, &kserve.ModelInferRequest_InferInputTensor{Name: t.name, Datatype: t.datatype, Shape: t.shape})
		req.RawInputContents = append(req.RawInputContents, t.raw)
	}
	for _, o := range outs {
		req.Outputs = append(req.Outputs, &kserve.ModelInferRequest_InferRequestedOutputTensor{Name: o})
	}
	return req, nil
}

// bytesElement is one BYTES element: a 4-byte length, then the bytes.
func bytesElement(s string) []byte {
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, 4+len(s)), uint32(len(s)))
	return append(b, s...)
}

// response is one Triton response, decoded.
type response struct {
	// text is text_output.
	text string
	// ids are output_ids.
	ids []int32
	// logprobs are token_logprobs: the log-probability of each generated token of the
	// response, which are the last len(logprobs) of ids.
	logprobs []float32
	// topLogprobs and topIDs are top_logprobs and top_logprob_ids: k per token, best first.
	topLogprobs []float32
	topIDs      []int32
	// numInput and numOutput are the counts; -1 when absent.
	numInput, numOutput int
	// finish is finish_reason: why the request ended, on its last response.
	finish string
	// final says it is the request's last response.
	final bool
}

// decodeResponse reads the outputs gollm's model sends.
func decodeResponse(r *kserve.ModelInferResponse) (*response, error) {
	out := &response{numInput: -1, numOutput: -1}
	if p, ok := r.GetParameters()["triton_final_response"]; ok {
		out.final = p.GetBoolParam()
	}
	raw := r.GetRawOutputContents()
	for i, o := range r.GetOutputs() {
		if i >= len(raw) {
			return nil, fmt.Errorf("output %q has no contents", o.GetName())
		}
		b := raw[i]
		switch o.GetName() {
		case outTextOutput, outFinishReason:
			// BYTES elements: a 4-byte length, then the bytes; a response has one.
			var s strings.Builder
			for len(b) >= 4 {
				n := int(binary.LittleEndian.Uint32(b))
				if 4+n > len(b) {
					return nil, fmt.Errorf("output %q: element of %d bytes in %d", o.GetName(), n, len(b)-4)
				}
				s.Write(b[4 : 4+n])
				b = b[4+n:]
			}
			if o.GetName() == outTextOutput {
				out.text = s.String()
			} else {
				out.finish = s.String()
			}
		case outOutputIDs:
			for ; len(b) >= 4; b = b[4:] {
				out.ids = append(out.ids, int32(binary.LittleEndian.Uint32(b)))
			}
		case outTokenLogprobs:
			out.logprobs = float32s(b)
		case outTopLogprobs:
			out.topLogprobs = float32s(b)
		case outTopLogprobIDs:
			for ; len(b) >= 4; b = b[4:] {
				out.topIDs = append(out.topIDs, int32(binary.LittleEndian.Uint32(b)))
			}
		case outNumInput, outNumOutput:
			if len(b) < 4 {
				return nil, fmt.Errorf("output %q: %d bytes, want 4", o.GetName(), len(b))
			}
			v := int(int32(binary.LittleEndian.Uint32(b)))
			if o.GetName() == outNumInput {
				out.numInput = v
			} else {
				out.numOutput = v
			}
		}
	}
	return out, nil
}

// choiceRunner runs one choice on Triton and reports its pieces.
type choiceRunner struct {
	// client is Triton's gRPC client.
	client kserve.GRPCInferenceServiceClient
	// mi describes the model's tensors and tokenizer.
	mi *modelInfo
	// p holds the choice's validated settings.
	p *genParams
	// index says which choice it runs.
	index int
	// emit receives the pieces, in order; the last has finish or err set.
	emit func(piece)
	// log receives diagnostics.
	log *zap.Logger
}

// stopGrace bounds the wait for a stopped request's final response before its stream is
// cancelled after all.
const stopGrace = 5 * time.Second

// run sends the request and reads its responses until the final one, an error, or ctx's
// end (the client went away). The backend ends the request at a stop string and says
// why it ended (finish_reason); text_output never holds a stop string, nor the text
// that may begin one. When the client goes away the request is stopped in Triton, which
// frees its KV blocks: with a stop request naming it where the model has a "stop" input
// (gollm's do; the request then ends with a normal final response and its stream is read
// to the end), else by cancelling its stream. tritonserver 2.51 keeps a model busy for
// good when a stream is cancelled as its last response is written (README, Known
// limits), which a stop request never does.
func (c *choiceRunner) run(ctx context.Context) {
	req, err := buildRequest(c.mi, c.p)
	if err != nil {
		c.emit(piece{index: c.index, first: true, err: invalid("", "%v", err)})
		return
	}
	reqCtx := ctx
	// The stream outlives ctx: it ends when read to its end, or by cancel.
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var stopOnce sync.Once
	// halt stops the request in Triton (once); cancel is the fallback.
	halt := func() {
		stopOnce.Do(func() {
			if !c.mi.inputs[inStop] || !c.stopInTriton() {
				cancel()
				return
			}
			time.AfterFunc(stopGrace, cancel)
		})
	}
	defer context.AfterFunc(reqCtx, halt)()
	stream, err := c.client.ModelStreamInfer(ctx)
	if err != nil {
		c.emit(piece{index: c.index, first: true, err: fromTriton("open a stream to Triton", err)})
		return
	}
	if err := stream.Send(req); err != nil {
		c.emit(piece{index: c.index, first: true, err: fromTriton("send the request to Triton", err)})
		return
	}
	// Half-close: the request is the stream's only one, and a stream closed this way
	// ends cleanly after the final response (tritonserver 2.51 keeps a model busy when
	// a stream is cancelled after it).
	if err := stream.CloseSend(); err != nil {
		c.emit(piece{index: c.index, first: true, err: fromTriton("send the request to Triton", err)})
		return
	}
	var (
		text      int // bytes of generated text received
		tokText   int // bytes of the generated tokens' own texts (logprobs)
		pending   []tokenInfo
		numInput  int
		numOutput int
		first     = true
		// done says the final response (or an error response) has been read.
		done bool
		// failure is the error response, reported once the stream has ended.
		failure *APIError
	)
	emit := func(pc piece) {
		pc.index, pc.first = c.index, first
		first = false
		c.emit(pc)
	}
	// release returns the pending tokens whose text has come.
	release := func() []tokenInfo {
		k := 0
		for k < len(pending) && pending[k].end <= text {
			k++
		}
		out := pending[:k:k]
		pending = pending[k:]
		return out
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			switch {
			case reqCtx.Err() != nil || ctx.Err() != nil:
				// The client went away (or another choice failed): the cancelled
				// stream cancels the request in Triton; nobody reads what would be
				// emitted.
				c.log.Debug("request cancelled", zap.String("request_id", c.p.requestID))
				return
			case errors.Is(err, io.EOF):
				switch {
				case failure != nil:
					emit(piece{err: failure})
				case !done:
					emit(piece{err: &APIError{Status: http.StatusBadGateway, Type: "server_error", Message: "Triton closed the stream before the request's final response"}})
				}
				return
			default:
				if s, ok := status.FromError(err); ok && s.Code() == codes.Canceled {
					return
				}
				emit(piece{err: notServing(reqCtx, c.client, fromTriton("generate", err))})
				return
			}
		}
		if done || reqCtx.Err() != nil {
			continue // read the stream to its end after the final response or a stop
		}
		if m := msg.GetErrorMessage(); m != "" {
			// An error is the request's final response: read the stream to its end
			// rather than cancel it (tritonserver 2.51 keeps a model busy when a stream
			// is cancelled after its final response), then report it.
			failure, done = notServing(reqCtx, c.client, tritonRequestError(m, first)), true
			continue
		}
		r, err := decodeResponse(msg.GetInferResponse())
		if err != nil {
			emit(piece{err: &APIError{Status: http.StatusBadGateway, Type: "server_error", Message: "decode Triton's response: " + err.Error()}})
			cancel()
			return
		}
		if r.numInput >= 0 {
			numInput = r.numInput
		}
		if r.numOutput > 0 {
			numOutput += r.numOutput
		}
		if !c.mi.decoupled {
			r.final = true
		}
		if c.p.logprobs && len(r.ids) > 0 {
			toks, err := c.tokenLogprobs(r)
			if err != nil {
				emit(piece{err: &APIError{Status: http.StatusBadGateway, Type: "server_error", Message: err.Error()}})
				cancel()
				return
			}
			for i := range toks {
				tokText += len(toks[i].text)
				toks[i].end = tokText
			}
			pending = append(pending, toks...)
		}
		text += len(r.text)
		toks := release()
		if r.final {
			if r.finish == "" {
				emit(piece{err: &APIError{Status: http.StatusBadGateway, Type: "server_error", Message: "Triton's final response carries no finish_reason"}})
				done = true
				continue
			}
			if r.finish != "stop" || len(nonEmpty(c.p.stop)) == 0 {
				// Only a stop string leaves tokens whose text is not returned.
				toks = append(toks, pending...)
			}
			pending = nil
		}
		if r.text != "" || len(toks) > 0 {
			emit(piece{text: r.text, tokens: toks})
		}
		if r.final {
			done = true
			emit(piece{finish: r.finish, promptTokens: numInput, completionTokens: numOutput})
		}
	}
}

// tritonRequestError turns an error response into an APIError: before any output the
// backend refused the request (a 400 naming the tensor and rule), later it failed.
func tritonRequestError(msg string, first bool) *APIError {
	switch {
	case strings.Contains(msg, "unknown model"):
		return &APIError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found", Message: msg}
	case strings.Contains(msg, "is shutting down"):
		// The backend's refusal while the server stops or the model unloads.
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Message: msg}
	case first && !strings.Contains(msg, "cancel"):
		e := &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: msg}
		switch {
		case strings.Contains(msg, "exceeds the model's maximum sequence length"), strings.Contains(msg, "leaves no room under the model's max sequence length"):
			e.Param, e.Code = "messages", "context_length_exceeded"
		case strings.Contains(msg, `"max_tokens"`):
			e.Param = "max_tokens"
		case strings.Contains(msg, inGuide), strings.Contains(msg, inGuideType):
			e.Param = "response_format"
		}
		return e
	}
	return &APIError{Status: http.StatusInternalServerError, Type: "server_error", Message: msg}
}

// tokenLogprobs reads the log-probabilities of a response's generated tokens and
// their alternatives from the backend's token_logprobs, top_logprobs and
// top_logprob_ids (backend/README.md: a log-softmax of the model's logits, in float64).
func (c *choiceRunner) tokenLogprobs(r *response) ([]tokenInfo, error) {
	n, k := len(r.logprobs), c.p.topLogprobs
	switch {
	case n > len(r.ids):
		return nil, fmt.Errorf("token_logprobs has %d values for %d tokens", n, len(r.ids))
	case len(r.topLogprobs) != n*k || len(r.topIDs) != n*k:
		return nil, fmt.Errorf("top_logprobs and top_logprob_ids have %d and %d values for %d tokens of %d alternatives", len(r.topLogprobs), len(r.topIDs), n, k)
	}
	ids := r.ids[len(r.ids)-n:]
	out := make([]tokenInfo, n)
	for i, id := range ids {
		out[i] = tokenInfo{id: id, text: c.tokenText(id), logprob: float64(r.logprobs[i])}
		for j := range k {
			alt := r.topIDs[i*k+j]
			out[i].top = append(out[i].top, altToken{text: c.tokenText(alt), logprob: float64(r.topLogprobs[i*k+j])})
		}
	}
	return out, nil
}

// tokenText is a token's bytes as text (a byte-level token may hold part of a character).
func (c *choiceRunner) tokenText(id int32) string {
	return c.mi.tok.Decode([]int32{id})
}

// nonEmpty drops empty strings: an empty stop string stops nothing.
func nonEmpty(ss []string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// bytesElements serializes BYTES elements: each a 4-byte little-endian length, then its
// bytes.
func bytesElements(ss []string) []byte {
	var b []byte
	for _, s := range ss {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return b
}

// float32s reads little-endian FP32 values.
func float32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// stopInTriton sends a stop request for the choice's request id on a stream of its own
// (TensorRT-LLM's stop input: the backend ends the named request at its next iteration
// with a normal final response) and reads the stop request's own answer; false when that
// failed, and the caller cancels instead.
func (c *choiceRunner) stopInTriton() bool {
	ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	defer cancel()
	req := &kserve.ModelInferRequest{
		ModelName: c.mi.name,
		Id:        c.p.requestID,
		Inputs: []*kserve.ModelInferRequest_InferInputTensor{
			{Name: inStop, Datatype: "BOOL", Shape: []int64{1, 1}},
		},
		RawInputContents: [][]byte{{1}},
	}
	stream, err := c.client.ModelStreamInfer(ctx)
	if err == nil {
		err = stream.Send(req)
	}
	if err == nil {
		err = stream.CloseSend()
	}
	for err == nil {
		var msg *kserve.ModelStreamInferResponse
		if msg, err = stream.Recv(); err == nil && msg.GetErrorMessage() != "" {
			err = errors.New(msg.GetErrorMessage())
		}
	}
	if !errors.Is(err, io.EOF) {
		c.log.Warn("stop request failed; cancelling the request's stream", zap.String("request_id", c.p.requestID), zap.Error(err))
		return false
	}
	c.log.Debug("request stopped", zap.String("request_id", c.p.requestID))
	return true
}

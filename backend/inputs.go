package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"gollm/batchmanager"
	"gollm/bridge/triton"
	"gollm/model"
)

// The input and output tensor names (TensorRT-LLM's, plus the text ones of Triton's
// generate endpoint).
const (
	inInputIDs          = "input_ids"
	inTextInput         = "text_input"
	inInputLengths      = "input_lengths"
	inRequestOutputLen  = "request_output_len"
	inMaxTokens         = "max_tokens"
	inEndID             = "end_id"
	inPadID             = "pad_id"
	inStreaming         = "streaming"
	inStream            = "stream"
	inTemperature       = "temperature"
	inTopK              = "runtime_top_k"
	inTopP              = "runtime_top_p"
	inRandomSeed        = "random_seed"
	inRepetitionPenalty = "repetition_penalty"
	inPresencePenalty   = "presence_penalty"
	inFrequencyPenalty  = "frequency_penalty"
	inMinLength         = "min_length"
	inStopWords         = "stop_words_list"
	inBadWords          = "bad_words_list"
	inEmbeddingBias     = "embedding_bias"
	inBeamWidth         = "beam_width"
	inReturnLogProbs    = "return_log_probs"
	inReturnCtxLogits   = "return_context_logits"
	inReturnGenLogits   = "return_generation_logits"
	inStop              = "stop"
	inExcludeInput      = "exclude_input_in_output"
	inNumReturnSeqs     = "num_return_sequences"
	inLenPenalty        = "len_penalty"
	inLengthPenalty     = "length_penalty"
	inEarlyStopping     = "early_stopping"
	inDiversityRate     = "beam_search_diversity_rate"
	inTopPDecay         = "runtime_top_p_decay"
	inTopPMin           = "runtime_top_p_min"
	inTopPResetIDs      = "runtime_top_p_reset_ids"
	inTopKAlias         = "top_k"
	inTopPAlias         = "top_p"
	inReturnPerf        = "return_perf_metrics"
	inStopText          = "stop_words"
	inBadText           = "bad_words"
	inBiasWords         = "embedding_bias_words"
	inBiasWeights       = "embedding_bias_weights"
	inReturnNumInput    = "return_num_input_tokens"
	inReturnNumOutput   = "return_num_output_tokens"
	inReturnTopLogprobs = "return_top_logprobs"
	inReturnFinish      = "return_finish_reason"
	inDecoderInputIDs   = "decoder_input_ids"
	inMinP              = "min_p"
	inSpeculative       = "speculative_decoding"

	outOutputIDs      = "output_ids"
	outSequenceLength = "sequence_length"
	outCumLogProbs    = "cum_log_probs"
	outOutputLogProbs = "output_log_probs"
	outContextLogits  = "context_logits"
	outGenLogits      = "generation_logits"
	outTextOutput     = "text_output"
	outSequenceIndex  = "sequence_index"
	outBatchIndex     = "batch_index"

	outKVAllocNewBlocks         = "kv_cache_alloc_new_blocks"
	outKVReusedBlocks           = "kv_cache_reused_blocks"
	outKVAllocTotalBlocks       = "kv_cache_alloc_total_blocks"
	outArrivalTime              = "arrival_time_ns"
	outFirstScheduledTime       = "first_scheduled_time_ns"
	outFirstTokenTime           = "first_token_time_ns"
	outLastTokenTime            = "last_token_time_ns"
	outAcceptanceRate           = "acceptance_rate"
	outTotalAcceptedDraftTokens = "total_accepted_draft_tokens"
	outTotalDraftTokens         = "total_draft_tokens"
	outNumInput                 = "num_input_tokens"
	outNumOutput                = "num_output_tokens"
	outTokenLogprobs            = "token_logprobs"
	outTopLogprobs              = "top_logprobs"
	outTopLogprobIDs            = "top_logprob_ids"
	outFinishReason             = "finish_reason"
)

// knownInputs are the inputs parseRequest reads; any other is refused (Triton checks
// names against config.pbtxt, so this catches a config that declares more).
var knownInputs = map[string]bool{
	inInputIDs: true, inTextInput: true, inInputLengths: true, inRequestOutputLen: true,
	inMaxTokens: true, inEndID: true, inPadID: true, inStreaming: true, inStream: true,
	inTemperature: true, inTopK: true, inTopP: true, inRandomSeed: true,
	inRepetitionPenalty: true, inPresencePenalty: true, inFrequencyPenalty: true,
	inMinLength: true, inStopWords: true, inBadWords: true, inEmbeddingBias: true,
	inBeamWidth: true, inReturnLogProbs: true, inReturnCtxLogits: true,
	inReturnGenLogits: true, inStop: true, inExcludeInput: true, inNumReturnSeqs: true,
	inLenPenalty: true, inLengthPenalty: true, inEarlyStopping: true, inDiversityRate: true,
	inTopPDecay: true, inTopPMin: true, inTopPResetIDs: true, inTopKAlias: true, inTopPAlias: true,
	inReturnPerf: true, inStopText: true, inBadText: true, inBiasWords: true, inBiasWeights: true,
	inReturnNumInput: true, inReturnNumOutput: true, inReturnTopLogprobs: true, inReturnFinish: true,
	inDecoderInputIDs: true, inGuideType: true, inGuide: true, inMinP: true, inSpeculative: true,
}

// maxTopLogprobs bounds return_top_logprobs (OpenAI's top_logprobs allows 20).
const maxTopLogprobs = 20

// encoder turns text into token ids (the checkpoint's tokenizer).
type encoder interface {
	// Encode tokenizes text as it is (words: stop, bad and bias words).
	Encode(text string) []int32
	// EncodePrompt tokenizes a prompt with what the checkpoint puts around one (BOS).
	EncodePrompt(text string) []int32
	// EncodePromptUpTo is EncodePrompt stopping, false, once past n tokens.
	EncodePromptUpTo(text string, n int) ([]int32, bool)
}

// maxTextWords bounds the strings of stop_words, bad_words and embedding_bias_words,
// and maxTextWordBytes each one's length: the stop strings are searched in the text
// after every token.
const (
	maxTextWords     = 256
	maxTextWordBytes = 1024
)

// limits are what a request is checked against.
type limits struct {
	// VocabSize bounds token ids: [0, VocabSize).
	VocabSize int
	// MaxSeqLen bounds prompt plus output length.
	MaxSeqLen int
	// EndIDs are the checkpoint's end tokens (generation_config.json's, else config.json's),
	// the default when a request gives no end_id; empty for none.
	EndIDs []int32
	// Gen holds generation_config.json's sampling defaults.
	Gen model.Generation
	// Decoupled says streaming is possible.
	Decoupled bool
	// ExcludeInputInOutput is the model's exclude_input_in_output (the default of the
	// input of that name).
	ExcludeInputInOutput bool
	// MaxBeamWidth bounds beam_width (the model's max_beam_width).
	MaxBeamWidth int
	// Tokenizer encodes text_input; nil when the checkpoint has no tokenizer.json.
	Tokenizer encoder
	// MaxPromptBytes is the longest text_input that can fit MaxSeqLen tokens (MaxSeqLen
	// × the tokenizer's MaxTokenBytes), refused at once when longer; 0: no such bound.
	MaxPromptBytes int
	// Guides compiles guided decoding's constraints; nil: not available.
	Guides *guides
}

// parsedRequest is a validated request.
type parsedRequest struct {
	// Req is the batch manager's request (its ID is set when it is queued).
	Req batchmanager.InferenceRequest
	// Text says the response carries text_output: the prompt came as text_input.
	// (Asking for text_output is not enough: Triton asks for every output of the
	// model when the client names none.)
	Text bool
	// Outputs are the outputs the request asks for; nil means all that apply.
	Outputs map[string]bool
	// Stop says the request asks to stop the in-flight requests with its request id
	// rather than to generate.
	Stop bool
	// StopStrings are the stop_words strings, matched on the generated text.
	StopStrings []string
	// Perf says the request asked for the perf metrics outputs.
	Perf bool
	// Counts are the token counts the request asks for; nil for none.
	Counts *tokenCounts
	// GenerationLogits says the client asked for generation_logits (Req's flag is also
	// set for TopLogprobs, which are computed from them).
	GenerationLogits bool
	// TopLogprobs is return_top_logprobs: -1 for none, else the alternatives per token.
	TopLogprobs int
	// FinishReason asks for finish_reason (return_finish_reason).
	FinishReason bool
	// PromptText is text_input while it waits to be tokenized (tokenizePrompt), which
	// readRequest leaves for its caller to do off Execute; "" once Req.InputIDs hold it.
	PromptText string
	// inputLen is input_lengths, -1 when absent; promptName and outName are the inputs
	// the prompt and the output length came in.
	inputLen            int
	promptName, outName string
}

// inputs indexes a request's tensors by name.
type inputs map[string]*triton.Tensor

// parseRequest validates a request's inputs (copied out of Triton) and the outputs it
// asks for, and builds the batch manager's request, its text prompt tokenized. Errors
// name the tensor and the rule.
func parseRequest(tensors []triton.Tensor, requested []string, lim limits) (*parsedRequest, error) {
	p, err := readRequest(tensors, requested, lim)
	if err != nil || p.PromptText == "" {
		return p, err
	}
	return p, p.tokenizePrompt(lim)
}

// readRequest is parseRequest without the tokenization of a text prompt, which it
// leaves in PromptText (after refusing a text too long to fit, by its bytes alone):
// that can take a while, and its caller runs it off the path that feeds the batch
// manager.
func readRequest(tensors []triton.Tensor, requested []string, lim limits) (*parsedRequest, error) {
	in := inputs{}
	for i := range tensors {
		t := &tensors[i]
		if !knownInputs[t.Name] {
			return nil, fmt.Errorf("input %q is not one gollm reads", t.Name)
		}
		if _, dup := in[t.Name]; dup {
			return nil, fmt.Errorf("input %q is given twice", t.Name)
		}
		in[t.Name] = t
	}
	p := &parsedRequest{}

	stop, err := in.flag(inStop)
	if err != nil {
		return nil, err
	}
	if stop {
		p.Stop = true
		return p, nil
	}

	if len(requested) > 0 {
		p.Outputs = map[string]bool{}
		for _, name := range requested {
			p.Outputs[name] = true
		}
	}

	// The prompt.
	r := &p.Req
	switch ids, text := in[inInputIDs], in[inTextInput]; {
	case ids != nil && text != nil:
		return nil, fmt.Errorf("inputs %q and %q are both given: send one", inInputIDs, inTextInput)
	case ids != nil:
		if r.InputIDs, err = in.int32s(inInputIDs); err != nil {
			return nil, err
		}
	case text != nil:
		if lim.Tokenizer == nil {
			return nil, fmt.Errorf("input %q: the checkpoint has no tokenizer.json, so only %q can be served", inTextInput, inInputIDs)
		}
		if n := len(text.Data) - 4; lim.MaxPromptBytes > 0 && n > lim.MaxPromptBytes {
			// Refused by its size, before it is read: no token of the tokenizer stands for
			// more than MaxPromptBytes / MaxSeqLen bytes.
			return nil, fmt.Errorf("input %q: %d bytes of text cannot fit the model's maximum sequence length %d (a token stands for at most %d bytes of this tokenizer, so at most %d bytes can)",
				inTextInput, n, lim.MaxSeqLen, lim.MaxPromptBytes/lim.MaxSeqLen, lim.MaxPromptBytes)
		}
		s, err := in.text(inTextInput)
		if err != nil {
			return nil, err
		}
		if s == "" {
			return nil, fmt.Errorf("input %q: the prompt is empty", inTextInput)
		}
		p.PromptText = s
		p.Text = true
	default:
		return nil, fmt.Errorf("missing input: one of %q or %q is required", inInputIDs, inTextInput)
	}
	p.promptName, p.inputLen = inInputIDs, -1
	if p.Text {
		p.promptName = inTextInput
	}
	if in[inInputLengths] != nil {
		n, err := in.int32Scalar(inInputLengths)
		if err != nil {
			return nil, err
		}
		p.inputLen = int(n)
	}
	// An encoder-decoder model's decoder prompt: TensorRT-LLM's preprocessing model always
	// makes one (the pad token) and its end_to_end_test.py hands it on. gollm serves
	// decoder-only models, for which TensorRT-LLM ignores it too; only its type is checked.
	if in[inDecoderInputIDs] != nil {
		if _, err := in.int32s(inDecoderInputIDs); err != nil {
			return nil, err
		}
	}

	// The output length.
	outName, err := in.oneOfNames(inRequestOutputLen, inMaxTokens)
	if err != nil {
		return nil, err
	}
	if outName == "" {
		return nil, fmt.Errorf("missing input: one of %q or %q is required", inRequestOutputLen, inMaxTokens)
	}
	n, err := in.int32Scalar(outName)
	if err != nil {
		return nil, err
	}
	r.MaxNewTokens, p.outName = int(n), outName
	if !p.Text {
		// The lengths are checked once the prompt's tokens are known.
		if err := p.checkPrompt(lim); err != nil {
			return nil, err
		}
	}

	// Streaming.
	streamName, err := in.oneOfNames(inStreaming, inStream)
	if err != nil {
		return nil, err
	}
	if streamName != "" {
		if r.Streaming, err = in.flag(streamName); err != nil {
			return nil, err
		}
		if r.Streaming && !lim.Decoupled {
			return nil, fmt.Errorf("input %q: streaming needs a decoupled model (model_transaction_policy { decoupled: true } in config.pbtxt)", streamName)
		}
	}

	// End and pad tokens: end_id names one end token (or, -1, none) instead of the
	// checkpoint's; pad_id defaults to the first end token.
	r.EndIDs = lim.EndIDs
	if in[inEndID] != nil {
		id, err := in.tokenID(inEndID, -1, lim.VocabSize)
		if err != nil {
			return nil, err
		}
		r.EndIDs = nil
		if id >= 0 {
			r.EndIDs = []int32{id}
		}
	}
	pad := int32(-1)
	if len(r.EndIDs) > 0 {
		pad = r.EndIDs[0]
	}
	if r.PadID, err = in.tokenID(inPadID, pad, lim.VocabSize); err != nil {
		return nil, err
	}

	if err := in.sampling(p, lim); err != nil {
		return nil, err
	}
	// Speculative decoding, where the model runs it, unless the request turns it off.
	if in[inSpeculative] != nil {
		on, err := in.flag(inSpeculative)
		if err != nil {
			return nil, err
		}
		r.NoSpeculation = !on
	}

	// Output options. Naming an output does not ask for it: the generate endpoint
	// names every output of the model.
	r.ExcludeInputInOutput = lim.ExcludeInputInOutput
	if in[inExcludeInput] != nil {
		if r.ExcludeInputInOutput, err = in.flag(inExcludeInput); err != nil {
			return nil, err
		}
	}
	if p.Perf, err = in.flag(inReturnPerf); err != nil {
		return nil, err
	}
	r.ReturnPerfMetrics = p.Perf
	if r.ReturnLogProbs, err = in.flag(inReturnLogProbs); err != nil {
		return nil, err
	}
	if r.ReturnContextLogits, err = in.flag(inReturnCtxLogits); err != nil {
		return nil, err
	}
	if p.GenerationLogits, err = in.flag(inReturnGenLogits); err != nil {
		return nil, err
	}
	k, err := in.int32Opt(inReturnTopLogprobs, -1)
	if err != nil {
		return nil, err
	}
	if k < -1 || k > maxTopLogprobs || int(k) > lim.VocabSize {
		return nil, fmt.Errorf("input %q: must be between -1 (none) and %d, got %d", inReturnTopLogprobs, min(maxTopLogprobs, lim.VocabSize), k)
	}
	if k >= 0 && r.BeamWidth > 1 {
		return nil, fmt.Errorf("input %q: not available with beam search (%q %d)", inReturnTopLogprobs, inBeamWidth, r.BeamWidth)
	}
	p.TopLogprobs = int(k)
	// Top log-probabilities come from the batch manager, which takes them from each
	// position's logits at its step and keeps nothing more of the row.
	r.ReturnGenerationLogits = p.GenerationLogits
	r.ReturnTopLogprobs, r.TopLogprobs = k >= 0, max(int(k), 0)
	if r.BeamWidth > 1 && r.ReturnGenerationLogits {
		return nil, fmt.Errorf("input %q: not available with beam search (%q %d)", inReturnGenLogits, inBeamWidth, r.BeamWidth)
	}
	if err := in.textWords(p, lim); err != nil {
		return nil, err
	}
	if err := in.guided(p, lim); err != nil {
		return nil, err
	}
	var c tokenCounts
	if c.Input, err = in.flag(inReturnNumInput); err != nil {
		return nil, err
	}
	if c.Output, err = in.flag(inReturnNumOutput); err != nil {
		return nil, err
	}
	if c.Input || c.Output {
		p.Counts = &c
	}
	if p.FinishReason, err = in.flag(inReturnFinish); err != nil {
		return nil, err
	}
	return p, nil
}

// tokenizePrompt tokenizes PromptText into Req.InputIDs — stopping once it is sure to
// leave no room for the output length asked for — and checks the prompt.
func (p *parsedRequest) tokenizePrompt(lim limits) error {
	r := &p.Req
	most := lim.MaxSeqLen - max(r.MaxNewTokens, 1)
	if p.inputLen >= 0 {
		// input_lengths may cut the prompt: it needs the whole.
		most = lim.MaxSeqLen
	}
	ids, ok := lim.Tokenizer.EncodePromptUpTo(p.PromptText, max(most, 0))
	if !ok {
		return fmt.Errorf("input %q: the prompt is more than %d tokens: with %q %d it exceeds the model's maximum sequence length %d",
			inTextInput, max(most, 0), p.outName, r.MaxNewTokens, lim.MaxSeqLen)
	}
	r.InputIDs, p.PromptText = ids, ""
	return p.checkPrompt(lim)
}

// checkPrompt checks the prompt's tokens: input_lengths (which may leave the rest of
// input_ids out, as padding of prompts to a common length), the vocabulary, and the
// length rule (batchmanager.CheckLengths, the one every door applies).
func (p *parsedRequest) checkPrompt(lim limits) error {
	r := &p.Req
	if len(r.InputIDs) == 0 {
		// The length rule's words for it, before input_lengths can say less.
		return batchmanager.CheckLengths(0, r.MaxNewTokens, lim.MaxSeqLen, fmt.Sprintf("input %q", p.promptName), "")
	}
	if p.inputLen >= 0 {
		if p.inputLen < 1 || p.inputLen > len(r.InputIDs) {
			return fmt.Errorf("input %q: %d must be between 1 and the prompt's length %d", inInputLengths, p.inputLen, len(r.InputIDs))
		}
		r.InputIDs = r.InputIDs[:p.inputLen]
	}
	for i, id := range r.InputIDs {
		if id < 0 || int(id) >= lim.VocabSize {
			return fmt.Errorf("input %q: token id %d at position %d is outside the vocabulary [0, %d)", p.promptName, id, i, lim.VocabSize)
		}
	}
	return batchmanager.CheckLengths(len(r.InputIDs), r.MaxNewTokens, lim.MaxSeqLen,
		fmt.Sprintf("input %q", p.promptName), fmt.Sprintf("input %q", p.outName))
}

// textWords reads the text-level inputs of TensorRT-LLM's ensemble: stop_words (stop
// strings, matched on the text), bad_words and embedding_bias_words with
// embedding_bias_weights (each string tokenized as its preprocessing model does).
func (in inputs) textWords(p *parsedRequest, lim limits) error {
	r := &p.Req
	stops, err := in.strings(inStopText)
	if err != nil {
		return err
	}
	allBad, err := in.strings(inBadText)
	if err != nil {
		return err
	}
	// An empty string is no word: TensorRT-LLM's preprocessing drops words that tokenize
	// to nothing, and its clients send [[""]] for "none" (end_to_end_test.py).
	p.StopStrings = nonEmpty(stops)
	bad := nonEmpty(allBad)
	words, err := in.strings(inBiasWords)
	if err != nil {
		return err
	}
	if (in[inBiasWords] == nil) != (in[inBiasWeights] == nil) {
		return fmt.Errorf("inputs %q and %q go together: send both or neither", inBiasWords, inBiasWeights)
	}
	if len(p.StopStrings)+len(bad)+len(nonEmpty(words)) > 0 && lim.Tokenizer == nil {
		return fmt.Errorf("inputs %q, %q and %q need the checkpoint's tokenizer.json, which it does not have", inStopText, inBadText, inBiasWords)
	}
	for _, w := range bad {
		ids := lim.Tokenizer.Encode(w)
		if len(ids) == 0 {
			continue
		}
		for i, id := range ids {
			if id < 0 || int(id) >= lim.VocabSize {
				return fmt.Errorf("input %q: %q tokenizes to id %d at %d, outside the vocabulary [0, %d)", inBadText, w, id, i, lim.VocabSize)
			}
		}
		r.Sampling.BadWords = append(r.Sampling.BadWords, ids)
	}
	if in[inBiasWords] != nil {
		weights, err := in.float32s(inBiasWeights)
		if err != nil {
			return err
		}
		if len(weights) != len(words) {
			return fmt.Errorf("input %q: %d weights for %d %q; want one per word", inBiasWeights, len(weights), len(words), inBiasWords)
		}
		if r.Sampling.EmbeddingBias != nil {
			return fmt.Errorf("inputs %q and %q are both given: send one", inEmbeddingBias, inBiasWords)
		}
		bias := make([]float32, lim.VocabSize)
		for i, w := range words {
			if !(weights[i] > -math.MaxFloat32 && weights[i] < math.MaxFloat32) {
				return fmt.Errorf("input %q: weight %d is %v; want a finite number", inBiasWeights, i, weights[i])
			}
			if w == "" {
				continue
			}
			for _, id := range lim.Tokenizer.Encode(w) {
				if id >= 0 && int(id) < lim.VocabSize {
					bias[id] += weights[i]
				}
			}
		}
		r.Sampling.EmbeddingBias = bias
	}
	return nil
}

// strings returns an optional BYTES input of strings, any shape after the batch
// dimension ([1, n] or [1, 1, n]); nil when absent. Each must be valid UTF-8, at most
// maxTextWords of at most maxTextWordBytes bytes; an empty one is returned as it is,
// for the caller to drop (it keeps embedding_bias_words aligned with their weights).
func (in inputs) strings(name string) ([]string, error) {
	t := in[name]
	if t == nil {
		return nil, nil
	}
	if err := in.check(name, triton.TypeBytes); err != nil {
		return nil, err
	}
	d := t.Data
	var out []string
	for len(d) > 0 {
		if len(d) < 4 {
			return nil, fmt.Errorf("input %q: %d bytes left after %d strings, too few for a length", name, len(d), len(out))
		}
		n := binary.LittleEndian.Uint32(d)
		if uint64(n) > uint64(len(d)-4) {
			return nil, fmt.Errorf("input %q: string %d claims %d bytes, %d are left", name, len(out), n, len(d)-4)
		}
		w := d[4 : 4+n]
		d = d[4+n:]
		switch {
		case len(out) == maxTextWords:
			return nil, fmt.Errorf("input %q: more than %d strings", name, maxTextWords)
		case n > maxTextWordBytes:
			return nil, fmt.Errorf("input %q: string %d has %d bytes, the most is %d", name, len(out), n, maxTextWordBytes)
		}
		if at := invalidUTF8(w); at >= 0 {
			return nil, fmt.Errorf("input %q: string %d is not valid UTF-8 (byte offset %d)", name, len(out), at)
		}
		out = append(out, string(w))
	}
	if n := numElements(t.Shape); n != int64(len(out)) {
		return nil, fmt.Errorf("input %q: shape %v holds %d strings, the data %d", name, t.Shape, n, len(out))
	}
	return out, nil
}

// nonEmpty is ss without its empty strings; nil when none is left.
func nonEmpty(ss []string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// numElements is the number of elements of a shape (-1 for a negative dimension).
func numElements(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return -1
		}
		n *= d
	}
	return n
}

// sampling reads the sampling inputs into p.Req. Where the checkpoint samples by default
// (generation_config.json's do_sample), its temperature, top-k, top-p and repetition
// penalty are the defaults of the inputs; otherwise decoding is greedy unless asked.
func (in inputs) sampling(p *parsedRequest, lim limits) error {
	s := &p.Req.Sampling
	var def model.Generation
	if lim.Gen.Sample {
		def = lim.Gen
	}
	var err error
	if s.Temperature, err = in.float32Scalar(inTemperature, def.Temperature, func(v float32) bool { return v >= 0 }, "must be ≥ 0"); err != nil {
		return err
	}
	topKName, err := in.oneOfNames(inTopK, inTopKAlias)
	if err != nil {
		return err
	}
	topK := int32(def.TopK)
	if topKName != "" {
		if topK, err = in.int32Scalar(topKName); err != nil {
			return err
		}
		if topK < 0 {
			return fmt.Errorf("input %q: must be ≥ 0, got %d", topKName, topK)
		}
	}
	s.TopK = int(topK)
	topPName, err := in.oneOfNames(inTopP, inTopPAlias)
	if err != nil {
		return err
	}
	s.TopP = def.TopP
	if topPName != "" {
		if s.TopP, err = in.float32Scalar(topPName, def.TopP, func(v float32) bool { return v >= 0 && v <= 1 }, "must be between 0 and 1"); err != nil {
			return err
		}
	}
	if s.MinP, err = in.float32Scalar(inMinP, 0, func(v float32) bool { return v >= 0 && v <= 1 }, "must be between 0 and 1 (0: none)"); err != nil {
		return err
	}
	if t := in[inRandomSeed]; t != nil {
		if err := in.check(inRandomSeed, triton.TypeUint64); err != nil {
			return err
		}
		v, err := in.scalarBytes(inRandomSeed)
		if err != nil {
			return err
		}
		s.Seed = binary.LittleEndian.Uint64(v)
	}
	if s.RepetitionPenalty, err = in.float32Scalar(inRepetitionPenalty, def.RepetitionPenalty, func(v float32) bool { return v >= 0 }, "must be ≥ 0 (0 or 1: none)"); err != nil {
		return err
	}
	finite := func(float32) bool { return true }
	if s.PresencePenalty, err = in.float32Scalar(inPresencePenalty, 0, finite, ""); err != nil {
		return err
	}
	if s.FrequencyPenalty, err = in.float32Scalar(inFrequencyPenalty, 0, finite, ""); err != nil {
		return err
	}
	minLen, err := in.int32Opt(inMinLength, 0)
	if err != nil {
		return err
	}
	if minLen < 0 {
		return fmt.Errorf("input %q: must be ≥ 0, got %d", inMinLength, minLen)
	}
	s.MinLength = int(minLen)
	if err := in.search(p, lim); err != nil {
		return err
	}
	if p.Req.StopWords, err = in.wordList(inStopWords, lim.VocabSize); err != nil {
		return err
	}
	if s.BadWords, err = in.wordList(inBadWords, lim.VocabSize); err != nil {
		return err
	}
	if t := in[inEmbeddingBias]; t != nil {
		bias, err := in.float32s(inEmbeddingBias)
		if err != nil {
			return err
		}
		switch len(bias) {
		case 0:
		case lim.VocabSize:
			for i, b := range bias {
				if math.IsNaN(float64(b)) || math.IsInf(float64(b), 1) {
					return fmt.Errorf("input %q: element %d is %v; want a number or -inf", inEmbeddingBias, i, b)
				}
			}
			s.EmbeddingBias = bias
		default:
			return fmt.Errorf("input %q: %d values; want one per vocabulary entry (%d) or none", inEmbeddingBias, len(bias), lim.VocabSize)
		}
	}
	return nil
}

// search reads beam search, num_return_sequences and the runtime top-p decay.
func (in inputs) search(p *parsedRequest, lim limits) error {
	r := &p.Req
	beam, err := in.int32Opt(inBeamWidth, 1)
	if err != nil {
		return err
	}
	maxBeam := max(1, lim.MaxBeamWidth)
	if beam < 1 || int(beam) > maxBeam {
		return fmt.Errorf("input %q: %d must be between 1 and the model's max_beam_width %d", inBeamWidth, beam, maxBeam)
	}
	r.BeamWidth = int(beam)
	// Absent, beam search returns all its beams (TensorRT-LLM's unset numReturnSequences).
	if in[inNumReturnSeqs] != nil {
		n, err := in.int32Scalar(inNumReturnSeqs)
		if err != nil {
			return err
		}
		if n < 1 {
			return fmt.Errorf("input %q: must be at least 1, got %d", inNumReturnSeqs, n)
		}
		if beam > 1 && n > beam {
			return fmt.Errorf("input %q: %d exceeds %q %d (beam search returns at most its beams)", inNumReturnSeqs, n, inBeamWidth, beam)
		}
		// Sampled sequences come as one response each (sequence_index), and a model that
		// is not decoupled may send only one: Triton would keep the first and drop the
		// rest without a word. Beams come together in one response.
		if beam == 1 && n > 1 && !lim.Decoupled {
			return fmt.Errorf("input %q: %d sampled sequences come as %d responses, which needs a decoupled model (model_transaction_policy { decoupled: true } in config.pbtxt); ask for 1, or for beams with %q", inNumReturnSeqs, n, n, inBeamWidth)
		}
		r.NumReturnSequences = int(n)
	}
	penName, err := in.oneOfNames(inLenPenalty, inLengthPenalty)
	if err != nil {
		return err
	}
	finite := func(float32) bool { return true }
	if penName != "" {
		if r.LengthPenalty, err = in.float32Scalar(penName, 0, finite, ""); err != nil {
			return err
		}
	}
	r.EarlyStopping = 1
	if t := in[inEarlyStopping]; t != nil {
		switch t.DataType {
		case triton.TypeBool:
			es, err := in.flag(inEarlyStopping)
			if err != nil {
				return err
			}
			r.EarlyStopping = 0
			if es {
				r.EarlyStopping = 1
			}
		default:
			v, err := in.int32Scalar(inEarlyStopping)
			if err != nil {
				return fmt.Errorf("%w (BOOL also works: true is 1, false 0)", err)
			}
			r.EarlyStopping = int(v)
		}
	}
	if r.DiversityRate, err = in.float32Scalar(inDiversityRate, 0, finite, ""); err != nil {
		return err
	}
	if in[inTopPDecay] != nil || in[inTopPMin] != nil || in[inTopPResetIDs] != nil {
		unit := func(v float32) bool { return v > 0 && v <= 1 }
		if r.TopPDecay, err = in.float32Scalar(inTopPDecay, 1, unit, "must be in (0, 1]"); err != nil {
			return err
		}
		if r.TopPMin, err = in.float32Scalar(inTopPMin, 1e-6, unit, "must be in (0, 1]"); err != nil {
			return err
		}
		if r.TopPResetID, err = in.tokenID(inTopPResetIDs, -1, lim.VocabSize); err != nil {
			return err
		}
	} else {
		r.TopPResetID = -1
	}
	return nil
}

// oneOfNames returns which of two alternative inputs is given ("" for neither), and an
// error when both are.
func (in inputs) oneOfNames(a, b string) (string, error) {
	switch {
	case in[a] != nil && in[b] != nil:
		return "", fmt.Errorf("inputs %q and %q are both given: send one", a, b)
	case in[a] != nil:
		return a, nil
	case in[b] != nil:
		return b, nil
	}
	return "", nil
}

// check verifies a tensor's data type and its batch dimension (1), and that its bytes
// fit its shape (fixed-size types).
func (in inputs) check(name string, dtype triton.DataType) error {
	t := in[name]
	if t.DataType != dtype {
		return fmt.Errorf("input %q: expected data type %v, got %v", name, dtype, t.DataType)
	}
	if len(t.Shape) == 0 {
		return fmt.Errorf("input %q: has no batch dimension (shape [])", name)
	}
	if t.Shape[0] != 1 {
		return fmt.Errorf("input %q: batch size %d; gollm takes one sequence per request (batch size 1)", name, t.Shape[0])
	}
	if size := dtype.Size(); size > 0 {
		n := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("input %q: shape %v has a negative dimension", name, t.Shape)
			}
			n *= d
		}
		if int64(len(t.Data)) != n*int64(size) {
			return fmt.Errorf("input %q: %d bytes for shape %v of %v (want %d)", name, len(t.Data), t.Shape, dtype, n*int64(size))
		}
	}
	return nil
}

// int32s returns an INT32 tensor's values.
func (in inputs) int32s(name string) ([]int32, error) {
	if err := in.check(name, triton.TypeInt32); err != nil {
		return nil, err
	}
	d := in[name].Data
	v := make([]int32, len(d)/4)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(d[4*i:]))
	}
	return v, nil
}

// float32s returns an FP32 tensor's values.
func (in inputs) float32s(name string) ([]float32, error) {
	if err := in.check(name, triton.TypeFP32); err != nil {
		return nil, err
	}
	d := in[name].Data
	v := make([]float32, len(d)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:]))
	}
	return v, nil
}

// scalarBytes returns the bytes of a tensor that must hold exactly one element (its type
// already checked).
func (in inputs) scalarBytes(name string) ([]byte, error) {
	t := in[name]
	size := t.DataType.Size()
	if len(t.Data) != size {
		return nil, fmt.Errorf("input %q: want one value, got shape %v", name, t.Shape)
	}
	return t.Data, nil
}

// int32Scalar returns the one value of an INT32 input that is present.
func (in inputs) int32Scalar(name string) (int32, error) {
	if err := in.check(name, triton.TypeInt32); err != nil {
		return 0, err
	}
	b, err := in.scalarBytes(name)
	if err != nil {
		return 0, err
	}
	return int32(binary.LittleEndian.Uint32(b)), nil
}

// int32Opt returns an optional INT32 scalar, def when absent.
func (in inputs) int32Opt(name string, def int32) (int32, error) {
	if in[name] == nil {
		return def, nil
	}
	return in.int32Scalar(name)
}

// float32Scalar returns an optional FP32 scalar (def when absent), which must be finite
// and satisfy ok (rule describes ok).
func (in inputs) float32Scalar(name string, def float32, ok func(float32) bool, rule string) (float32, error) {
	if in[name] == nil {
		return def, nil
	}
	if err := in.check(name, triton.TypeFP32); err != nil {
		return 0, err
	}
	b, err := in.scalarBytes(name)
	if err != nil {
		return 0, err
	}
	v := math.Float32frombits(binary.LittleEndian.Uint32(b))
	if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
		return 0, fmt.Errorf("input %q: must be a finite number, got %v", name, v)
	}
	if !ok(v) {
		return 0, fmt.Errorf("input %q: %s, got %v", name, rule, v)
	}
	return v, nil
}

// flag returns an optional BOOL scalar, false when absent.
func (in inputs) flag(name string) (bool, error) {
	if in[name] == nil {
		return false, nil
	}
	if err := in.check(name, triton.TypeBool); err != nil {
		return false, err
	}
	b, err := in.scalarBytes(name)
	if err != nil {
		return false, err
	}
	return b[0] != 0, nil
}

// tokenID returns an optional token-id scalar (end_id, pad_id): def when absent, else a
// vocabulary id or -1 for none.
func (in inputs) tokenID(name string, def int32, vocab int) (int32, error) {
	v, err := in.int32Opt(name, def)
	if err != nil {
		return 0, err
	}
	if v < -1 || int(v) >= vocab {
		return 0, fmt.Errorf("input %q: %d is outside the vocabulary [0, %d) (-1: none)", name, v, vocab)
	}
	return v, nil
}

// text returns the one string of a BYTES input.
func (in inputs) text(name string) (string, error) {
	t := in[name]
	if err := in.check(name, triton.TypeBytes); err != nil {
		return "", err
	}
	d := t.Data
	if len(d) < 4 {
		return "", fmt.Errorf("input %q: want one string, got %d bytes", name, len(d))
	}
	n := binary.LittleEndian.Uint32(d)
	if uint64(n) != uint64(len(d)-4) {
		return "", fmt.Errorf("input %q: want one string (a 4-byte length and %d bytes), got %d bytes", name, n, len(d))
	}
	text := d[4:]
	if at := invalidUTF8(text); at >= 0 {
		// The tokenizer would map the bytes to tokens anyway; a client that sends Latin-1
		// or binary by mistake should hear so instead of getting an answer to garbage.
		return "", fmt.Errorf("input %q: not valid UTF-8: byte offset %d (of %d) starts an invalid sequence (byte 0x%02x); send the text as UTF-8", name, at, len(text), text[at])
	}
	return string(text), nil
}

// invalidUTF8 returns the offset of the first byte of b that is not part of a valid
// UTF-8 encoding, or -1 when b is valid UTF-8.
func invalidUTF8(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return -1
}

// wordList decodes an optional stop_words_list/bad_words_list in TensorRT-LLM's
// encoding, shape [1, 2, L]: row 0 holds the words' tokens one after another (padded
// with anything), row 1 the end offset of each word in row 0, padded with -1.
func (in inputs) wordList(name string, vocab int) ([][]int32, error) {
	if in[name] == nil {
		return nil, nil
	}
	v, err := in.int32s(name)
	if err != nil {
		return nil, err
	}
	shape := in[name].Shape
	if len(shape) != 3 || shape[1] != 2 {
		return nil, fmt.Errorf("input %q: shape %v; want [1, 2, L] (row 0 tokens, row 1 end offsets padded with -1)", name, shape)
	}
	l := int(shape[2])
	tokens, offsets := v[:l], v[l:]
	var words [][]int32
	prev := int32(0)
	for i, off := range offsets {
		if off < 0 {
			for _, rest := range offsets[i:] {
				if rest >= 0 {
					return nil, fmt.Errorf("input %q: offset %d at position %d follows the -1 padding", name, rest, i)
				}
			}
			break
		}
		if off <= prev || int(off) > l {
			return nil, fmt.Errorf("input %q: end offset %d at position %d must be greater than %d and at most %d", name, off, i, prev, l)
		}
		word := tokens[prev:off]
		for _, id := range word {
			if id < 0 || int(id) >= vocab {
				return nil, fmt.Errorf("input %q: token id %d is outside the vocabulary [0, %d)", name, id, vocab)
			}
		}
		words = append(words, word)
		prev = off
	}
	return words, nil
}

// describe names the request's inputs for logs: "input_ids INT32 [1 9], …".
func describe(tensors []triton.Tensor) string {
	parts := make([]string, len(tensors))
	for i, t := range tensors {
		parts[i] = fmt.Sprintf("%s %v %v", t.Name, t.DataType, t.Shape)
	}
	return strings.Join(parts, ", ")
}

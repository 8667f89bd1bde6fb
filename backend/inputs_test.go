package main

import (
	"encoding/binary"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gollm/bridge/triton"
)

// i32 is an INT32 tensor of shape [1, len(v)].
func i32(name string, v ...int32) triton.Tensor {
	return triton.Tensor{Name: name, DataType: triton.TypeInt32, Shape: []int64{1, int64(len(v))}, Data: int32Bytes(v)}
}

// f32 is an FP32 tensor of shape [1, len(v)].
func f32(name string, v ...float32) triton.Tensor {
	return triton.Tensor{Name: name, DataType: triton.TypeFP32, Shape: []int64{1, int64(len(v))}, Data: float32Bytes(v)}
}

// boolean is a BOOL tensor of shape [1, 1].
func boolean(name string, v bool) triton.Tensor {
	b := byte(0)
	if v {
		b = 1
	}
	return triton.Tensor{Name: name, DataType: triton.TypeBool, Shape: []int64{1, 1}, Data: []byte{b}}
}

// str is a BYTES tensor of shape [1, 1].
func str(name, s string) triton.Tensor {
	return triton.Tensor{Name: name, DataType: triton.TypeBytes, Shape: []int64{1, 1}, Data: bytesElements([]string{s})}
}

// strs is a BYTES tensor of strings, shape [1, len(v)].
func strs(name string, v ...string) triton.Tensor {
	return triton.Tensor{Name: name, DataType: triton.TypeBytes, Shape: []int64{1, int64(len(v))}, Data: bytesElements(v)}
}

// words is a stop/bad words tensor of shape [1, 2, len(tokens)].
func words(name string, tokens, offsets []int32) triton.Tensor {
	t := i32(name, append(append([]int32{}, tokens...), offsets...)...)
	t.Shape = []int64{1, 2, int64(len(tokens))}
	return t
}

// fakeTokenizer encodes each byte as its value.
type fakeTokenizer struct{}

// Encode returns the bytes of text as token ids.
func (fakeTokenizer) Encode(text string) []int32 {
	ids := make([]int32, len(text))
	for i := range len(text) {
		ids[i] = int32(text[i])
	}
	return ids
}

// EncodePrompt is Encode: the fake puts nothing around a prompt.
func (f fakeTokenizer) EncodePrompt(text string) []int32 { return f.Encode(text) }

// EncodePromptUpTo is EncodePrompt, false past n tokens.
func (f fakeTokenizer) EncodePromptUpTo(text string, n int) ([]int32, bool) {
	if len(text) > n {
		return nil, false
	}
	return f.EncodePrompt(text), true
}

// testLimits are the limits of a 1000-token, 64-position model.
func testLimits() limits {
	return limits{VocabSize: 1000, MaxSeqLen: 64, EndIDs: []int32{999}, Decoupled: true, Tokenizer: fakeTokenizer{}}
}

func TestParseRequest(t *testing.T) {
	seed := triton.Tensor{Name: inRandomSeed, DataType: triton.TypeUint64, Shape: []int64{1, 1}, Data: binary.LittleEndian.AppendUint64(nil, 42)}
	p, err := parseRequest([]triton.Tensor{
		i32(inInputIDs, 5, 6, 7, 0), i32(inInputLengths, 3), i32(inRequestOutputLen, 10),
		i32(inEndID, 7), boolean(inStreaming, true), f32(inTemperature, 0.7), i32(inTopK, 40),
		f32(inTopP, 0.9), seed, f32(inRepetitionPenalty, 1.2), f32(inPresencePenalty, 0.5),
		f32(inFrequencyPenalty, -0.5), i32(inMinLength, 2), i32(inBeamWidth, 1),
		words(inStopWords, []int32{1, 2, 3}, []int32{2, 3, -1}), words(inBadWords, []int32{9, 0}, []int32{1, -1}),
		boolean(inReturnLogProbs, true), boolean(inReturnGenLogits, true),
	}, []string{outOutputIDs}, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	r := p.Req
	checks := []struct {
		name      string
		got, want any
	}{
		{"input_lengths cuts the padding", r.InputIDs, []int32{5, 6, 7}},
		{"request_output_len", r.MaxNewTokens, 10},
		{"end_id", r.EndIDs, []int32{7}},
		{"pad_id defaults to end_id", r.PadID, int32(7)},
		{"streaming", r.Streaming, true},
		{"temperature", r.Sampling.Temperature, float32(0.7)},
		{"top_k", r.Sampling.TopK, 40},
		{"top_p", r.Sampling.TopP, float32(0.9)},
		{"seed", r.Sampling.Seed, uint64(42)},
		{"repetition_penalty", r.Sampling.RepetitionPenalty, float32(1.2)},
		{"presence_penalty", r.Sampling.PresencePenalty, float32(0.5)},
		{"frequency_penalty", r.Sampling.FrequencyPenalty, float32(-0.5)},
		{"min_length", r.Sampling.MinLength, 2},
		{"stop words", r.StopWords, [][]int32{{1, 2}, {3}}},
		{"bad words", r.Sampling.BadWords, [][]int32{{9}}},
		{"return_log_probs", r.ReturnLogProbs, true},
		{"return_generation_logits", r.ReturnGenerationLogits, true},
		{"return_context_logits stays off", r.ReturnContextLogits, false},
		{"requested outputs", p.Outputs, map[string]bool{outOutputIDs: true}},
		{"token requests answer in tokens", p.Text, false},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestInvalidUTF8(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", -1}, {"plain", -1}, {"caf\u00e9 \u65e5\u672c \U0001F600", -1},
		{"\uFFFD is a valid character", -1},
		{"\xff", 0}, {"ab\xc3", 2}, {"ab\xc3(", 2}, {"\u00e9\x80", 2},
		{"\xed\xa0\x80 surrogate", 0}, {"\xc0\xaf overlong", 0},
	} {
		if got := invalidUTF8([]byte(tc.in)); got != tc.want {
			t.Errorf("invalidUTF8(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestParseTextRequest(t *testing.T) {
	lim := testLimits()
	lim.ExcludeInputInOutput = true
	p, err := parseRequest([]triton.Tensor{str(inTextInput, "Hi!"), i32(inMaxTokens, 4), boolean(inStream, true)}, nil, lim)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Req.InputIDs, []int32{'H', 'i', '!'}) || p.Req.MaxNewTokens != 4 || !p.Req.Streaming || !p.Text {
		t.Errorf("got %+v", p)
	}
	if !p.Req.ExcludeInputInOutput || !slices.Equal(p.Req.EndIDs, []int32{999}) || p.Req.PadID != 999 || p.Outputs != nil {
		t.Errorf("defaults: exclude %v, end %v, pad %d, outputs %v", p.Req.ExcludeInputInOutput, p.Req.EndIDs, p.Req.PadID, p.Outputs)
	}
}

func TestParseStopRequest(t *testing.T) {
	p, err := parseRequest([]triton.Tensor{boolean(inStop, true)}, nil, testLimits())
	if err != nil || !p.Stop {
		t.Fatalf("got %+v, %v; want a stop request", p, err)
	}
}

func TestParseRequestErrors(t *testing.T) {
	prompt := i32(inInputIDs, 1, 2, 3)
	n := i32(inRequestOutputLen, 4)
	badBytes := str(inTextInput, "abc")
	badBytes.Data = badBytes.Data[:5]
	batch2 := i32(inInputIDs, 1, 2, 3, 4)
	batch2.Shape = []int64{2, 2}
	noBatch := i32(inRequestOutputLen, 4)
	noBatch.Shape = nil
	lim := testLimits()
	notDecoupled := lim
	notDecoupled.Decoupled = false
	noTokenizer := lim
	beams := lim
	beams.MaxBeamWidth = 4
	noTokenizer.Tokenizer = nil
	boundedText := lim
	boundedText.MaxPromptBytes = 64 * 4
	tests := []struct {
		name   string
		inputs []triton.Tensor
		lim    limits
		want   string
	}{
		{"a request without a prompt", []triton.Tensor{n}, lim,
			`missing input: one of "input_ids" or "text_input" is required`},
		{"a request with both prompts", []triton.Tensor{prompt, str(inTextInput, "x"), n}, lim,
			`inputs "input_ids" and "text_input" are both given: send one`},
		{"input_ids of the wrong type", []triton.Tensor{f32(inInputIDs, 1, 2), n}, lim,
			`input "input_ids": expected data type INT32, got FP32`},
		{"an empty prompt", []triton.Tensor{i32(inInputIDs), n}, lim,
			`input "input_ids": the prompt is empty`},
		{"an empty text prompt", []triton.Tensor{str(inTextInput, ""), n}, lim,
			`input "text_input": the prompt is empty`},
		{"a token outside the vocabulary", []triton.Tensor{i32(inInputIDs, 1, 2, 1000), n}, lim,
			`input "input_ids": token id 1000 at position 2 is outside the vocabulary [0, 1000)`},
		{"a negative token", []triton.Tensor{i32(inInputIDs, -1), n}, lim,
			`input "input_ids": token id -1 at position 0 is outside the vocabulary [0, 1000)`},
		{"a batch of two", []triton.Tensor{batch2, n}, lim,
			`input "input_ids": batch size 2; gollm takes one sequence per request (batch size 1)`},
		{"input_lengths longer than the prompt", []triton.Tensor{prompt, i32(inInputLengths, 4), n}, lim,
			`input "input_lengths": 4 must be between 1 and the prompt's length 3`},
		{"no output length", []triton.Tensor{prompt}, lim,
			`missing input: one of "request_output_len" or "max_tokens" is required`},
		{"two output lengths", []triton.Tensor{prompt, n, i32(inMaxTokens, 4)}, lim,
			`inputs "request_output_len" and "max_tokens" are both given: send one`},
		{"request_output_len 0", []triton.Tensor{prompt, i32(inRequestOutputLen, 0)}, lim,
			`input "request_output_len": must be at least 1, got 0`},
		{"max_tokens beyond the maximum sequence length", []triton.Tensor{prompt, i32(inMaxTokens, 62)}, lim,
			`input "max_tokens": prompt length 3 + 62 exceeds the model's maximum sequence length 64`},
		{"two values for a scalar", []triton.Tensor{prompt, i32(inRequestOutputLen, 4, 5)}, lim,
			`input "request_output_len": want one value, got shape [1 2]`},
		{"a scalar without a batch dimension", []triton.Tensor{prompt, noBatch}, lim,
			`input "request_output_len": has no batch dimension`},
		{"streaming on a non-decoupled model", []triton.Tensor{prompt, n, boolean(inStreaming, true)}, notDecoupled,
			`input "streaming": streaming needs a decoupled model`},
		{"both streaming flags", []triton.Tensor{prompt, n, boolean(inStreaming, true), boolean(inStream, true)}, lim,
			`inputs "streaming" and "stream" are both given: send one`},
		{"text without a tokenizer", []triton.Tensor{str(inTextInput, "hi"), n}, noTokenizer,
			`input "text_input": the checkpoint has no tokenizer.json, so only "input_ids" can be served`},
		{"text that is not UTF-8", []triton.Tensor{str(inTextInput, "caf\xc3 \xff\xfe not utf-8 \x80\xc3\x28"), n}, lim,
			`input "text_input": not valid UTF-8: byte offset 3 (of 21) starts an invalid sequence (byte 0xc3)`},
		{"text with a stray continuation byte", []triton.Tensor{str(inTextInput, "ok \u00e9\x80"), n}, lim,
			`input "text_input": not valid UTF-8: byte offset 5 (of 6) starts an invalid sequence (byte 0x80)`},
		{"text ending in a cut character", []triton.Tensor{str(inTextInput, "caf\xc3"), n}, lim,
			`input "text_input": not valid UTF-8: byte offset 3 (of 4) starts an invalid sequence (byte 0xc3)`},
		{"text too long to fit, by its bytes alone (not even read)", []triton.Tensor{str(inTextInput, strings.Repeat("\xff", 257)), n}, boundedText,
			`input "text_input": 257 bytes of text cannot fit the model's maximum sequence length 64 (a token stands for at most 4 bytes of this tokenizer, so at most 256 bytes can)`},
		{"text of more tokens than leave room for the output", []triton.Tensor{str(inTextInput, strings.Repeat("a", 61)), i32(inMaxTokens, 4)}, boundedText,
			`input "text_input": the prompt is more than 60 tokens: with "max_tokens" 4 it exceeds the model's maximum sequence length 64`},
		{"a malformed string", []triton.Tensor{badBytes, n}, lim,
			`input "text_input": want one string (a 4-byte length and 3 bytes), got 5 bytes`},
		{"an end_id outside the vocabulary", []triton.Tensor{prompt, n, i32(inEndID, 1000)}, lim,
			`input "end_id": 1000 is outside the vocabulary [0, 1000) (-1: none)`},
		{"a negative temperature", []triton.Tensor{prompt, n, f32(inTemperature, -1)}, lim,
			`input "temperature": must be ≥ 0, got -1`},
		{"a NaN temperature", []triton.Tensor{prompt, n, f32(inTemperature, float32(math.NaN()))}, lim,
			`input "temperature": must be a finite number, got NaN`},
		{"top_p above 1", []triton.Tensor{prompt, n, f32(inTopP, 1.5)}, lim,
			`input "runtime_top_p": must be between 0 and 1, got 1.5`},
		{"a negative top_k", []triton.Tensor{prompt, n, i32(inTopK, -2)}, lim,
			`input "runtime_top_k": must be ≥ 0, got -2`},
		{"a negative min_length", []triton.Tensor{prompt, n, i32(inMinLength, -1)}, lim,
			`input "min_length": must be ≥ 0, got -1`},
		{"a beam wider than the model's", []triton.Tensor{prompt, n, i32(inBeamWidth, 2)}, lim,
			`input "beam_width": 2 must be between 1 and the model's max_beam_width 1`},
		{"a zero beam width", []triton.Tensor{prompt, n, i32(inBeamWidth, 0)}, beams,
			`input "beam_width": 0 must be between 1 and the model's max_beam_width 4`},
		{"more sequences than beams", []triton.Tensor{prompt, n, i32(inBeamWidth, 2), i32(inNumReturnSeqs, 3)}, beams,
			`input "num_return_sequences": 3 exceeds "beam_width" 2`},
		{"sampled sequences from a non-decoupled model", []triton.Tensor{prompt, n, i32(inNumReturnSeqs, 2)}, notDecoupled,
			`input "num_return_sequences": 2 sampled sequences come as 2 responses, which needs a decoupled model`},
		{"no sequences", []triton.Tensor{prompt, n, i32(inNumReturnSeqs, 0)}, lim,
			`input "num_return_sequences": must be at least 1, got 0`},
		{"generation logits of beams", []triton.Tensor{prompt, n, i32(inBeamWidth, 2), boolean(inReturnGenLogits, true)}, beams,
			`input "return_generation_logits": not available with beam search`},
		{"a NaN length penalty", []triton.Tensor{prompt, n, f32(inLenPenalty, float32(math.NaN()))}, lim,
			`input "len_penalty": must be a finite number, got NaN`},
		{"both length penalties", []triton.Tensor{prompt, n, f32(inLenPenalty, 1), f32(inLengthPenalty, 1)}, lim,
			`inputs "len_penalty" and "length_penalty" are both given: send one`},
		{"early stopping as FP32", []triton.Tensor{prompt, n, f32(inEarlyStopping, 1)}, lim,
			`input "early_stopping": expected data type INT32, got FP32 (BOOL also works`},
		{"a top-p decay of zero", []triton.Tensor{prompt, n, f32(inTopPDecay, 0)}, lim,
			`input "runtime_top_p_decay": must be in (0, 1], got 0`},
		{"a top-p minimum above one", []triton.Tensor{prompt, n, f32(inTopPMin, 1.5)}, lim,
			`input "runtime_top_p_min": must be in (0, 1], got 1.5`},
		{"a top-p reset id outside the vocabulary", []triton.Tensor{prompt, n, i32(inTopPResetIDs, 1000)}, lim,
			`input "runtime_top_p_reset_ids": 1000 is outside the vocabulary [0, 1000) (-1: none)`},
		{"both top_k names", []triton.Tensor{prompt, n, i32(inTopK, 1), i32(inTopKAlias, 2)}, lim,
			`inputs "runtime_top_k" and "top_k" are both given: send one`},
		{"exclude_input_in_output as INT32", []triton.Tensor{prompt, n, i32(inExcludeInput, 1)}, lim,
			`input "exclude_input_in_output": expected data type BOOL, got INT32`},
		{"a stop string that is not UTF-8", []triton.Tensor{prompt, n, strs(inStopText, "a\xff")}, lim,
			`input "stop_words": string 0 is not valid UTF-8 (byte offset 1)`},
		{"a truncated string list", []triton.Tensor{prompt, n, {Name: inBadText, DataType: triton.TypeBytes, Shape: []int64{1, 1}, Data: []byte{9, 0, 0, 0, 'a'}}}, lim,
			`input "bad_words": string 0 claims 9 bytes, 1 are left`},
		{"a string list shorter than its shape", []triton.Tensor{prompt, n, func() triton.Tensor { t := strs(inStopText, "a"); t.Shape = []int64{1, 2}; return t }()}, lim,
			`input "stop_words": shape [1 2] holds 2 strings, the data 1`},
		{"bias words without weights", []triton.Tensor{prompt, n, strs(inBiasWords, "a")}, lim,
			`inputs "embedding_bias_words" and "embedding_bias_weights" go together`},
		{"bias weights that do not match the words", []triton.Tensor{prompt, n, strs(inBiasWords, "a", "b"), f32(inBiasWeights, 1)}, lim,
			`input "embedding_bias_weights": 1 weights for 2 "embedding_bias_words"`},
		{"stop strings without a tokenizer", []triton.Tensor{prompt, n, strs(inStopText, "x")}, noTokenizer,
			`need the checkpoint's tokenizer.json`},
		{"stop words of one row", []triton.Tensor{prompt, n, i32(inStopWords, 1, 2)}, lim,
			`input "stop_words_list": shape [1 2]; want [1, 2, L]`},
		{"stop word offsets going back", []triton.Tensor{prompt, n, words(inStopWords, []int32{1, 2, 3}, []int32{2, 1, -1})}, lim,
			`input "stop_words_list": end offset 1 at position 1 must be greater than 2 and at most 3`},
		{"a stop word offset past the tokens", []triton.Tensor{prompt, n, words(inStopWords, []int32{1, 2}, []int32{3, -1})}, lim,
			`input "stop_words_list": end offset 3 at position 0 must be greater than 0 and at most 2`},
		{"an offset after the padding", []triton.Tensor{prompt, n, words(inBadWords, []int32{1, 2, 3}, []int32{1, -1, 3})}, lim,
			`input "bad_words_list": offset 3 at position 1 follows the -1 padding`},
		{"a bad word outside the vocabulary", []triton.Tensor{prompt, n, words(inBadWords, []int32{5000}, []int32{1})}, lim,
			`input "bad_words_list": token id 5000 is outside the vocabulary [0, 1000)`},
		{"an embedding bias of the wrong length", []triton.Tensor{prompt, n, f32(inEmbeddingBias, 1, 2)}, lim,
			`input "embedding_bias": 2 values; want one per vocabulary entry (1000) or none`},
		{"an input gollm does not read", []triton.Tensor{prompt, n, i32("lora_task_id", 4)}, lim,
			`input "lora_task_id" is not one gollm reads`},
		{"an input given twice", []triton.Tensor{prompt, prompt, n}, lim,
			`input "input_ids" is given twice`},
		{"an INT32 input with too few bytes", []triton.Tensor{{Name: inInputIDs, DataType: triton.TypeInt32, Shape: []int64{1, 2}, Data: make([]byte, 6)}, n}, lim,
			`input "input_ids": 6 bytes for shape [1 2] of INT32 (want 8)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseRequest(tt.inputs, nil, tt.lim)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestParseTheTensorRTLLMRequestInputs(t *testing.T) {
	lim := testLimits()
	lim.MaxBeamWidth = 4
	lim.ExcludeInputInOutput = false
	p, err := parseRequest([]triton.Tensor{
		str(inTextInput, "abc"), i32(inMaxTokens, 5), i32(inBeamWidth, 4), i32(inNumReturnSeqs, 2),
		f32(inLengthPenalty, 0.5), boolean(inEarlyStopping, false), f32(inDiversityRate, -0.5),
		i32(inTopKAlias, 3), f32(inTopPAlias, 0.5), boolean(inExcludeInput, true), boolean(inReturnPerf, true),
		strs(inStopText, "xy", "END"), strs(inBadText, "q"), strs(inBiasWords, "ab", "b"), f32(inBiasWeights, 1, 2),
	}, nil, lim)
	if err != nil {
		t.Fatal(err)
	}
	r := p.Req
	bias := make([]float32, 1000)
	bias['a'], bias['b'] = 1, 3
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"beam_width", r.BeamWidth, 4},
		{"num_return_sequences", r.NumReturnSequences, 2},
		{"length_penalty", r.LengthPenalty, float32(0.5)},
		{"early_stopping false", r.EarlyStopping, 0},
		{"diversity", r.DiversityRate, float32(-0.5)},
		{"top_k", r.Sampling.TopK, 3},
		{"top_p", r.Sampling.TopP, float32(0.5)},
		{"exclude_input_in_output overrides the model's", r.ExcludeInputInOutput, true},
		{"return_perf_metrics", r.ReturnPerfMetrics, true},
		{"stop strings", p.StopStrings, []string{"xy", "END"}},
		{"bad words, tokenized", r.Sampling.BadWords, [][]int32{{'q'}}},
		{"bias words, tokenized and weighted", r.Sampling.EmbeddingBias, bias},
		{"no top-p decay", r.TopPDecay, float32(0)},
		{"no top-p reset", r.TopPResetID, int32(-1)},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	p, err = parseRequest([]triton.Tensor{i32(inInputIDs, 1), i32(inRequestOutputLen, 2), f32(inTopPDecay, 0.5), i32(inTopPResetIDs, 7),
		i32(inEarlyStopping, 2)}, nil, lim)
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Req; r.TopPDecay != 0.5 || r.TopPMin != 1e-6 || r.TopPResetID != 7 || r.EarlyStopping != 2 {
		t.Errorf("decay %g, min %g, reset %d, early stopping %d", r.TopPDecay, r.TopPMin, r.TopPResetID, r.EarlyStopping)
	}
}

// TestEnsembleNoneInputs checks what TensorRT-LLM's end_to_end_test.py sends that asks
// for nothing: [[""]] as stop_words and bad_words (TensorRT-LLM's preprocessing drops
// words that tokenize to nothing) and the preprocessing model's decoder_input_ids, which
// a decoder-only model ignores; an empty bias word keeps its weight's place.
func TestEnsembleNoneInputs(t *testing.T) {
	noTokenizer := testLimits()
	noTokenizer.Tokenizer = nil
	for _, lim := range []limits{testLimits(), noTokenizer} {
		p, err := parseRequest([]triton.Tensor{i32(inInputIDs, 5, 6), i32(inRequestOutputLen, 2), i32(inDecoderInputIDs, 999),
			strs(inStopText, ""), strs(inBadText, ""), strs(inBiasWords, ""), f32(inBiasWeights, 2)}, nil, lim)
		if err != nil {
			t.Fatalf("tokenizer %v: %v", lim.Tokenizer != nil, err)
		}
		if p.StopStrings != nil || p.Req.Sampling.BadWords != nil || slices.ContainsFunc(p.Req.Sampling.EmbeddingBias, func(b float32) bool { return b != 0 }) {
			t.Errorf("tokenizer %v: stop %q, bad %v, bias not all zero: empty words asked for something", lim.Tokenizer != nil, p.StopStrings, p.Req.Sampling.BadWords)
		}
		if !slices.Equal(p.Req.InputIDs, []int32{5, 6}) {
			t.Errorf("prompt %v: decoder_input_ids changed it", p.Req.InputIDs)
		}
	}
	p, err := parseRequest([]triton.Tensor{str(inTextInput, "abc"), i32(inMaxTokens, 2), strs(inStopText, "", "c"),
		strs(inBiasWords, "", "b"), f32(inBiasWeights, 5, 1)}, nil, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.StopStrings, []string{"c"}) || p.Req.Sampling.EmbeddingBias['b'] != 1 {
		t.Errorf("stop %q, bias of 'b' %v: want [c] and 1 (the second weight)", p.StopStrings, p.Req.Sampling.EmbeddingBias['b'])
	}
	if _, err := parseRequest([]triton.Tensor{i32(inInputIDs, 5), i32(inRequestOutputLen, 2), f32(inDecoderInputIDs, 1)}, nil, testLimits()); err == nil ||
		err.Error() != `input "decoder_input_ids": expected data type INT32, got FP32` {
		t.Errorf("decoder_input_ids as FP32: %v", err)
	}
}

// TestTokenCountInputs checks that return_num_input_tokens and return_num_output_tokens
// ask for the counts, and only as BOOL.
func TestTokenCountInputs(t *testing.T) {
	base := []triton.Tensor{i32(inInputIDs, 1, 2, 3, 4), i32(inRequestOutputLen, 2)}
	p, err := parseRequest(base, nil, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	if p.Counts != nil {
		t.Errorf("counts %+v without asking for them", p.Counts)
	}
	p, err = parseRequest(append(base, boolean(inReturnNumInput, true), boolean(inReturnNumOutput, false)), nil, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	if want := (tokenCounts{Input: true}); p.Counts == nil || *p.Counts != want {
		t.Errorf("counts %+v, want %+v", p.Counts, want)
	}
	_, err = parseRequest(append(base, i32(inReturnNumOutput, 1)), nil, testLimits())
	if err == nil || !strings.Contains(err.Error(), inReturnNumOutput) {
		t.Errorf("an INT32 %s: error %v, want one naming it", inReturnNumOutput, err)
	}
}

// TestFinishReasonInput checks that return_finish_reason asks for finish_reason, and
// only as BOOL.
func TestFinishReasonInput(t *testing.T) {
	base := []triton.Tensor{i32(inInputIDs, 1, 2, 3, 4), i32(inRequestOutputLen, 2)}
	for _, c := range []struct {
		in   []triton.Tensor
		want bool
	}{{base, false}, {append(slices.Clone(base), boolean(inReturnFinish, false)), false}, {append(slices.Clone(base), boolean(inReturnFinish, true)), true}} {
		p, err := parseRequest(c.in, nil, testLimits())
		if err != nil {
			t.Fatal(err)
		}
		if p.FinishReason != c.want {
			t.Errorf("inputs %d: FinishReason %v, want %v", len(c.in), p.FinishReason, c.want)
		}
	}
	_, err := parseRequest(append(base, i32(inReturnFinish, 1)), nil, testLimits())
	if err == nil || !strings.Contains(err.Error(), inReturnFinish) {
		t.Errorf("an INT32 %s: error %v, want one naming it", inReturnFinish, err)
	}
}

// TestTopLogprobsInput checks return_top_logprobs: absent is none; k asks for the
// generation logits internally without sending generation_logits; out-of-range values,
// another type and beam search are refused, naming the input.
func TestTopLogprobsInput(t *testing.T) {
	base := []triton.Tensor{i32(inInputIDs, 1, 2, 3), i32(inRequestOutputLen, 2)}
	p, err := parseRequest(base, nil, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	if p.TopLogprobs != -1 || p.Req.ReturnGenerationLogits || p.Req.ReturnTopLogprobs {
		t.Errorf("absent: top %d, generation logits %v, top logprobs %v; want -1, false, false", p.TopLogprobs, p.Req.ReturnGenerationLogits, p.Req.ReturnTopLogprobs)
	}
	p, err = parseRequest(append(base, i32(inReturnTopLogprobs, 3)), nil, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	// The batch manager keeps the top 3 per token, never the generation logits.
	if p.TopLogprobs != 3 || !p.Req.ReturnTopLogprobs || p.Req.TopLogprobs != 3 || p.Req.ReturnGenerationLogits || p.GenerationLogits {
		t.Errorf("3: top %d, manager's top logprobs %v (%d), generation logits %v, sent %v; want 3, true (3), false, false",
			p.TopLogprobs, p.Req.ReturnTopLogprobs, p.Req.TopLogprobs, p.Req.ReturnGenerationLogits, p.GenerationLogits)
	}
	lim := testLimits()
	lim.MaxBeamWidth = 4
	for _, c := range []struct {
		name   string
		extra  []triton.Tensor
		lim    limits
		errHas string
	}{
		{"above 20", []triton.Tensor{i32(inReturnTopLogprobs, 21)}, testLimits(), `input "return_top_logprobs": must be between -1 (none) and 20, got 21`},
		{"below -1", []triton.Tensor{i32(inReturnTopLogprobs, -2)}, testLimits(), `got -2`},
		{"FP32", []triton.Tensor{f32(inReturnTopLogprobs, 2)}, testLimits(), `input "return_top_logprobs": expected data type INT32, got FP32`},
		{"with beams", []triton.Tensor{i32(inReturnTopLogprobs, 2), i32(inBeamWidth, 2)}, lim, `input "return_top_logprobs": not available with beam search`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseRequest(append(slices.Clone(base), c.extra...), nil, c.lim)
			if err == nil || !strings.Contains(err.Error(), c.errHas) {
				t.Errorf("error %v, want one containing %q", err, c.errHas)
			}
		})
	}
}

package main

import (
	"encoding/binary"
	"math"
	"reflect"
	"strings"
	"testing"

	"gollm/bridge/triton"
)

// shaped gives a tensor another shape (the tokenizer models take batches).
func shaped(t triton.Tensor, shape ...int64) triton.Tensor {
	t.Shape = shape
	return t
}

// bosTokenizer is fakeTokenizer with a BOS (id 1) before a prompt.
type bosTokenizer struct{ fakeTokenizer }

// EncodePrompt puts the BOS before the text's bytes.
func (b bosTokenizer) EncodePrompt(text string) []int32 { return append([]int32{1}, b.Encode(text)...) }

// fakeDecoder shows each id as its byte, and id 1 as "<s>", a special token.
type fakeDecoder struct{}

// Decode shows the special token.
func (fakeDecoder) Decode(ids []int32) string { return decodeFake(ids, false) }

// DecodeText leaves the special token out.
func (fakeDecoder) DecodeText(ids []int32) string { return decodeFake(ids, true) }

func decodeFake(ids []int32, skip bool) string {
	var sb strings.Builder
	for _, id := range ids {
		switch {
		case id == 1 && skip:
		case id == 1:
			sb.WriteString("<s>")
		default:
			sb.WriteByte(byte(id))
		}
	}
	return sb.String()
}

// outputsByName indexes outputs and fails on a name given twice.
func outputsByName(t *testing.T, outs []output) map[string]output {
	t.Helper()
	m := map[string]output{}
	for _, o := range outs {
		if _, dup := m[o.Name]; dup {
			t.Fatalf("output %s twice", o.Name)
		}
		m[o.Name] = o
	}
	return m
}

// int32sOf decodes an INT32 output.
func int32sOf(o output) []int32 {
	v := make([]int32, len(o.Data)/4)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(o.Data[4*i:]))
	}
	return v
}

// stringsOf decodes a BYTES output.
func stringsOf(o output) []string {
	var out []string
	for d := o.Data; len(d) >= 4; {
		n := binary.LittleEndian.Uint32(d)
		out = append(out, string(d[4:4+n]))
		d = d[4+n:]
	}
	return out
}

// checkOutput compares an output's type, shape and values.
func checkOutput(t *testing.T, outs map[string]output, name string, dt triton.DataType, shape []int64, want any) {
	t.Helper()
	o, ok := outs[name]
	if !ok {
		t.Errorf("no output %s", name)
		return
	}
	var got any
	switch dt {
	case triton.TypeInt32:
		got = int32sOf(o)
	case triton.TypeFP32:
		v := make([]float32, len(o.Data)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(o.Data[4*i:]))
		}
		got = v
	case triton.TypeBytes:
		got = stringsOf(o)
	}
	if o.DataType != dt || !reflect.DeepEqual(o.Shape, shape) || !reflect.DeepEqual(got, want) {
		t.Errorf("%s: %v %v %v, want %v %v %v", name, o.DataType, o.Shape, got, dt, shape, want)
	}
}

func testPreprocessor() *preprocessor {
	return &preprocessor{tok: bosTokenizer{}, addSpecial: true, endID: 999, padID: 998, vocab: 1000}
}

// TestPreprocessEndToEndRequest is the request end_to_end_test.py sends the
// preprocessing model: a prompt, [[""]] as both word lists, the output length.
func TestPreprocessEndToEndRequest(t *testing.T) {
	outs, err := testPreprocessor().run([]triton.Tensor{
		str(preQuery, "ab"), strs(preBadWords, ""), strs(preStopWords, ""), i32(preRequestOutputLen, 5),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := outputsByName(t, outs)
	if len(m) != 10 {
		t.Errorf("%d outputs, want the 10 of TensorRT-LLM's preprocessing model", len(m))
	}
	checkOutput(t, m, preInputID, triton.TypeInt32, []int64{1, 3}, []int32{1, 'a', 'b'})
	checkOutput(t, m, preRequestInputLen, triton.TypeInt32, []int64{1, 1}, []int32{3})
	checkOutput(t, m, preRequestOutputLen, triton.TypeInt32, []int64{1, 1}, []int32{5})
	checkOutput(t, m, preDecoderInputID, triton.TypeInt32, []int64{1, 1}, []int32{998})
	checkOutput(t, m, preRequestDecoderInputLen, triton.TypeInt32, []int64{1, 1}, []int32{1})
	// A given list without words is [1, 2, 1]: a 0 token and a -1 offset.
	checkOutput(t, m, preBadWordsIDs, triton.TypeInt32, []int64{1, 2, 1}, []int32{0, -1})
	checkOutput(t, m, preStopWordsIDs, triton.TypeInt32, []int64{1, 2, 1}, []int32{0, -1})
	checkOutput(t, m, preEmbeddingBias, triton.TypeFP32, []int64{1, 0}, []float32{})
	checkOutput(t, m, preOutEndID, triton.TypeInt32, []int64{1, 1}, []int32{999})
	checkOutput(t, m, preOutPadID, triton.TypeInt32, []int64{1, 1}, []int32{998})

	// Without the lists they are [1, 2, 0]; only the outputs named are sent.
	outs, err = testPreprocessor().run([]triton.Tensor{str(preQuery, "ab"), i32(preRequestOutputLen, 5)},
		map[string]bool{preStopWordsIDs: true, preInputID: true})
	if err != nil {
		t.Fatal(err)
	}
	m = outputsByName(t, outs)
	if len(m) != 2 {
		t.Errorf("outputs %v, want INPUT_ID and STOP_WORDS_IDS alone", m)
	}
	checkOutput(t, m, preStopWordsIDs, triton.TypeInt32, []int64{1, 2, 0}, []int32{})
}

// TestPreprocessBatch tokenizes two prompts at once, with per-item end and pad tokens,
// word lists and bias words, without special tokens.
func TestPreprocessBatch(t *testing.T) {
	p := testPreprocessor()
	p.addSpecial = false
	outs, err := p.run([]triton.Tensor{
		shaped(strs(preQuery, "a", "bcd"), 2, 1),
		shaped(i32(preRequestOutputLen, 4, 8), 2, 1),
		shaped(i32(preEndID, 7, -1), 2, 1),
		shaped(strs(preStopWords, "x", "yz", "", "w"), 2, 2),
		shaped(strs(preBiasWords, "a", "", "bb", "c"), 2, 2),
		shaped(f32(preBiasWeights, 1.5, 9, 2, -1), 2, 2),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := outputsByName(t, outs)
	checkOutput(t, m, preInputID, triton.TypeInt32, []int64{2, 3}, []int32{'a', 998, 998, 'b', 'c', 'd'})
	checkOutput(t, m, preRequestInputLen, triton.TypeInt32, []int64{2, 1}, []int32{1, 3})
	checkOutput(t, m, preRequestOutputLen, triton.TypeInt32, []int64{2, 1}, []int32{4, 8})
	checkOutput(t, m, preOutEndID, triton.TypeInt32, []int64{2, 1}, []int32{7, -1})
	checkOutput(t, m, preOutPadID, triton.TypeInt32, []int64{2, 1}, []int32{998, 998})
	checkOutput(t, m, preStopWordsIDs, triton.TypeInt32, []int64{2, 2, 3},
		[]int32{'x', 'y', 'z', 1, 3, -1, 'w', 0, 0, 1, -1, -1})
	checkOutput(t, m, preBadWordsIDs, triton.TypeInt32, []int64{2, 2, 0}, []int32{})
	bias := make([]float32, 2000)
	bias['a'] = 1.5
	bias[1000+'b'] = 4
	bias[1000+'c'] = -1
	checkOutput(t, m, preEmbeddingBias, triton.TypeFP32, []int64{2, 1000}, bias)
}

func TestPreprocessErrors(t *testing.T) {
	q, n := str(preQuery, "ab"), i32(preRequestOutputLen, 5)
	for _, tc := range []struct {
		name    string
		tensors []triton.Tensor
		want    string
	}{
		{"no prompt", []triton.Tensor{n}, `missing input "QUERY"`},
		{"no output length", []triton.Tensor{q}, `missing input "REQUEST_OUTPUT_LEN"`},
		{"a prompt that is not text", []triton.Tensor{i32(preQuery, 1), n}, `input "QUERY": expected data type BYTES, got INT32`},
		{"two strings in one item", []triton.Tensor{strs(preQuery, "a", "b"), n}, `input "QUERY": shape [1 2]; want one string per batch item ([1, 1])`},
		{"a prompt that is not UTF-8", []triton.Tensor{str(preQuery, "a\xc3"), n}, `input "QUERY": item 0, string 0 is not valid UTF-8 (byte offset 1)`},
		{"an empty prompt", []triton.Tensor{str(preQuery, ""), n}, `input "QUERY": item 0 tokenizes to no tokens`},
		{"an output length of 0", []triton.Tensor{q, i32(preRequestOutputLen, 0)}, `input "REQUEST_OUTPUT_LEN": item 0 is 0; must be at least 1`},
		{"two output lengths for one prompt", []triton.Tensor{q, i32(preRequestOutputLen, 1, 2)}, `input "REQUEST_OUTPUT_LEN": shape [1 2]; want one value per batch item ([1, 1])`},
		{"batch sizes that differ", []triton.Tensor{q, shaped(i32(preRequestOutputLen, 1, 2), 2, 1)}, `input "REQUEST_OUTPUT_LEN": shape [2 1]; want the batch size 1 first`},
		{"an end token outside the vocabulary", []triton.Tensor{q, n, i32(preEndID, 1000)}, `input "END_ID": item 0 is 1000, outside the vocabulary [0, 1000) (-1: none)`},
		{"a pad token as FP32", []triton.Tensor{q, n, f32(prePadID, 1)}, `input "PAD_ID": expected data type INT32, got FP32`},
		{"bias words without weights", []triton.Tensor{q, n, strs(preBiasWords, "a")}, `inputs "EMBEDDING_BIAS_WORDS" and "EMBEDDING_BIAS_WEIGHTS" go together`},
		{"weights that do not match the words", []triton.Tensor{q, n, strs(preBiasWords, "a", "b"), f32(preBiasWeights, 1)},
			`input "EMBEDDING_BIAS_WEIGHTS": 1 weights for 2 "EMBEDDING_BIAS_WORDS" per item; want one per word`},
		{"a NaN weight", []triton.Tensor{q, n, strs(preBiasWords, "a"), f32(preBiasWeights, float32(math.NaN()))},
			`input "EMBEDDING_BIAS_WEIGHTS": item 0, weight 0 is NaN; want a finite number`},
		{"an image", []triton.Tensor{q, n, str("IMAGE_URL", "http://x")}, `input "IMAGE_URL" is not supported: gollm serves text-only models`},
		{"an encoder-decoder prompt", []triton.Tensor{q, n, str("DECODER_QUERY", "x")}, `input "DECODER_QUERY" is not supported: it is an encoder-decoder model's decoder prompt`},
		{"a prompt table id", []triton.Tensor{q, n, i32("PROMPT_TABLE_EXTRA_ID", 1)}, `input "PROMPT_TABLE_EXTRA_ID" is not supported: gollm has no prompt tables`},
		{"an input the model does not know", []triton.Tensor{q, n, i32("input_ids", 1)}, `input "input_ids" is not one gollm's preprocessing model reads`},
		{"an input twice", []triton.Tensor{q, n, n}, `input "REQUEST_OUTPUT_LEN" is given twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPreprocessor()
			if tc.name == "an empty prompt" {
				p.addSpecial = false
			}
			_, err := p.run(tc.tensors, nil)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("error %v, want one starting %q", err, tc.want)
			}
		})
	}
}

// tokensBatch is a TOKENS_BATCH of shape [batch, beams, tokens].
func tokensBatch(batch, beams, tokens int64, ids ...int32) triton.Tensor {
	return shaped(i32(postTokensBatch, ids...), batch, beams, tokens)
}

// TestPostprocess decodes each row up to its length, with and without special tokens,
// flattened to [batch × beams], and hands the older models' pass-through inputs back.
func TestPostprocess(t *testing.T) {
	tensors := []triton.Tensor{
		tokensBatch(2, 2, 3, 1, 'a', 'b', 'x', 0, 0, 'c', 1, 'd', 'e', 'f', 'g'),
		shaped(i32(postSequenceLength, 3, 1, 3, 0), 2, 2),
		shaped(f32("CUM_LOG_PROBS", -1, -2, -3, -4), 2, 2),
	}
	p := &postprocessor{tok: fakeDecoder{}, skipSpecial: true}
	outs, err := p.run(tensors, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := outputsByName(t, outs)
	checkOutput(t, m, postOutput, triton.TypeBytes, []int64{4}, []string{"ab", "x", "cd", ""})
	checkOutput(t, m, "OUT_CUM_LOG_PROBS", triton.TypeFP32, []int64{2, 2}, []float32{-1, -2, -3, -4})

	p.skipSpecial = false
	outs, err = p.run(tensors, map[string]bool{postOutput: true})
	if err != nil {
		t.Fatal(err)
	}
	m = outputsByName(t, outs)
	if len(m) != 1 {
		t.Errorf("outputs %v, want OUTPUT alone", m)
	}
	checkOutput(t, m, postOutput, triton.TypeBytes, []int64{4}, []string{"<s>ab", "x", "c<s>d", ""})
}

func TestPostprocessErrors(t *testing.T) {
	tb, sl := tokensBatch(1, 1, 3, 'a', 'b', 'c'), shaped(i32(postSequenceLength, 2), 1, 1)
	for _, tc := range []struct {
		name    string
		tensors []triton.Tensor
		want    string
	}{
		{"no tokens", []triton.Tensor{sl}, `missing input "TOKENS_BATCH"`},
		{"no lengths", []triton.Tensor{tb}, `missing input "SEQUENCE_LENGTH"`},
		{"tokens without a beam dimension", []triton.Tensor{i32(postTokensBatch, 1, 2), sl},
			`input "TOKENS_BATCH": shape [1 2]; want [batch, beams, tokens]`},
		{"a length per item, not per beam", []triton.Tensor{tokensBatch(1, 2, 1, 'a', 'b'), sl},
			`input "SEQUENCE_LENGTH": shape [1 1]; want [1, 2], a length per row`},
		{"a length past the tokens", []triton.Tensor{tb, shaped(i32(postSequenceLength, 4), 1, 1)},
			`input "SEQUENCE_LENGTH": item 0, beam 0 is 4; want 0 to the 3 tokens of "TOKENS_BATCH"`},
		{"a negative token", []triton.Tensor{tokensBatch(1, 1, 2, 'a', -5), sl},
			`input "TOKENS_BATCH": item 0, beam 0: token id -5 at position 1 is negative`},
		{"tokens as FP32", []triton.Tensor{shaped(f32(postTokensBatch, 1), 1, 1, 1), sl},
			`input "TOKENS_BATCH": expected data type INT32, got FP32`},
		{"a pass-through of the wrong type", []triton.Tensor{tb, sl, i32("CUM_LOG_PROBS", 1)},
			`input "CUM_LOG_PROBS": expected data type FP32, got INT32`},
		{"an input the model does not know", []triton.Tensor{tb, sl, i32("output_ids", 1)},
			`input "output_ids" is not one gollm's postprocessing model reads`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := (&postprocessor{tok: fakeDecoder{}, skipSpecial: true}).run(tc.tensors, nil)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("error %v, want one starting %q", err, tc.want)
			}
		})
	}
}

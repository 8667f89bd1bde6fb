package main

import (
	"fmt"
	"math"

	"gollm/bridge/triton"
)

// The preprocessing model's tensors: TensorRT-LLM's preprocessing model's names, dtypes
// and shapes (after the batch dimension).
const (
	// preQuery is the prompt, BYTES [1].
	preQuery = "QUERY"
	// preRequestOutputLen is the tokens to generate, INT32 [1], handed on.
	preRequestOutputLen = "REQUEST_OUTPUT_LEN"
	// preBadWords and preStopWords are word lists, BYTES [-1].
	preBadWords  = "BAD_WORDS_DICT"
	preStopWords = "STOP_WORDS_DICT"
	// preBiasWords and preBiasWeights are the embedding bias as words, BYTES [-1] and FP32 [-1].
	preBiasWords   = "EMBEDDING_BIAS_WORDS"
	preBiasWeights = "EMBEDDING_BIAS_WEIGHTS"
	// preEndID and prePadID override the tokenizer's end and pad tokens, INT32 [1].
	preEndID = "END_ID"
	prePadID = "PAD_ID"

	// preInputID is the prompt's ids, INT32 [-1], padded to the batch's longest.
	preInputID = "INPUT_ID"
	// preRequestInputLen is the prompt's length, INT32 [1].
	preRequestInputLen = "REQUEST_INPUT_LEN"
	// preDecoderInputID and preRequestDecoderInputLen are an encoder-decoder model's
	// decoder prompt: the pad token, length 1, as TensorRT-LLM sends without a
	// DECODER_QUERY (the tensorrt_llm model ignores them for decoder-only models).
	preDecoderInputID         = "DECODER_INPUT_ID"
	preRequestDecoderInputLen = "REQUEST_DECODER_INPUT_LEN"
	// preBadWordsIDs and preStopWordsIDs are the word lists in the [2, L] encoding of
	// bad_words_list and stop_words_list, INT32 [2, -1].
	preBadWordsIDs  = "BAD_WORDS_IDS"
	preStopWordsIDs = "STOP_WORDS_IDS"
	// preEmbeddingBias is the bias per vocabulary entry, FP32 [-1] (empty without words).
	preEmbeddingBias = "EMBEDDING_BIAS"
	// preOutEndID and preOutPadID are the end and pad tokens, INT32 [1].
	preOutEndID = "OUT_END_ID"
	preOutPadID = "OUT_PAD_ID"
)

// preKnown are the inputs the preprocessing model reads.
var preKnown = map[string]bool{
	preQuery: true, preRequestOutputLen: true, preBadWords: true, preStopWords: true,
	preBiasWords: true, preBiasWeights: true, preEndID: true, prePadID: true,
}

// preRefused are inputs of TensorRT-LLM's preprocessing model that gollm has no use for,
// with the reason a request that sends one is refused (a config.pbtxt copied from
// TensorRT-LLM declares them).
var preRefused = map[string]string{
	"DECODER_QUERY":         "it is an encoder-decoder model's decoder prompt, and gollm serves decoder-only models",
	"IMAGE_BYTES":           "gollm serves text-only models (no images or video)",
	"IMAGE_URL":             "gollm serves text-only models (no images or video)",
	"VIDEO_BYTES":           "gollm serves text-only models (no images or video)",
	"PROMPT_TABLE_EXTRA_ID": "gollm has no prompt tables (p-tuning or multimodal embeddings)",
}

// preprocessor is the preprocessing model: TensorRT-LLM's preprocessing model's work
// with the checkpoint's tokenizer, so that what it hands the tensorrt_llm model is what
// gollm's model makes of the same text.
type preprocessor struct {
	// tok encodes QUERY and the word lists with the checkpoint's tokenizer.
	tok encoder
	// addSpecial is add_special_tokens: QUERY is encoded as a prompt (with BOS).
	addSpecial bool
	// endID and padID are the default end and pad tokens (-1: none).
	endID, padID int32
	// vocab is the model's vocabulary size: EMBEDDING_BIAS's length, the ids' bound.
	vocab int
}

// run tokenizes one request's batch.
func (p *preprocessor) run(tensors []triton.Tensor, want map[string]bool) ([]output, error) {
	in, err := newBatchInputs(tensors, rolePreprocessing, preQuery, preKnown, preRefused)
	if err != nil {
		return nil, err
	}
	B := in.batch
	queries, err := in.stringRows(preQuery)
	if err != nil {
		return nil, err
	}
	if in.t[preRequestOutputLen] == nil {
		return nil, fmt.Errorf("missing input %q", preRequestOutputLen)
	}
	outLens, err := in.int32PerItem(preRequestOutputLen)
	if err != nil {
		return nil, err
	}
	for i, n := range outLens {
		if n < 1 {
			return nil, fmt.Errorf("input %q: item %d is %d; must be at least 1", preRequestOutputLen, i, n)
		}
	}
	ends, err := p.tokenPerItem(in, preEndID, p.endID)
	if err != nil {
		return nil, err
	}
	pads, err := p.tokenPerItem(in, prePadID, p.padID)
	if err != nil {
		return nil, err
	}

	prompts := make([][]int32, B)
	longest := 0
	for i, q := range queries {
		if len(q) != 1 {
			return nil, fmt.Errorf("input %q: shape %v; want one string per batch item ([%d, 1])", preQuery, in.t[preQuery].Shape, B)
		}
		if p.addSpecial {
			prompts[i] = p.tok.EncodePrompt(q[0])
		} else {
			prompts[i] = p.tok.Encode(q[0])
		}
		if len(prompts[i]) == 0 {
			return nil, fmt.Errorf("input %q: item %d tokenizes to no tokens (an empty prompt)", preQuery, i)
		}
		longest = max(longest, len(prompts[i]))
	}
	// The batch's prompts padded to the longest with the tokenizer's pad token, as
	// TensorRT-LLM's; REQUEST_INPUT_LEN says where each ends.
	fill := max(p.padID, 0)
	ids := make([]int32, 0, B*longest)
	lens := make([]int32, B)
	for i, pr := range prompts {
		ids = append(ids, pr...)
		for range longest - len(pr) {
			ids = append(ids, fill)
		}
		lens[i] = int32(len(pr))
	}
	bad, badLen, err := p.wordLists(in, preBadWords)
	if err != nil {
		return nil, err
	}
	stop, stopLen, err := p.wordLists(in, preStopWords)
	if err != nil {
		return nil, err
	}
	bias, biasLen, err := p.bias(in)
	if err != nil {
		return nil, err
	}

	var outs []output
	add := func(name string, dt triton.DataType, data []byte, shape ...int64) {
		if want == nil || want[name] {
			outs = append(outs, output{Name: name, DataType: dt, Shape: shape, Data: data})
		}
	}
	b := int64(B)
	ones := make([]int32, B)
	for i := range ones {
		ones[i] = 1
	}
	add(preInputID, triton.TypeInt32, int32Bytes(ids), b, int64(longest))
	add(preRequestInputLen, triton.TypeInt32, int32Bytes(lens), b, 1)
	add(preDecoderInputID, triton.TypeInt32, int32Bytes(pads), b, 1)
	add(preRequestDecoderInputLen, triton.TypeInt32, int32Bytes(ones), b, 1)
	add(preRequestOutputLen, triton.TypeInt32, int32Bytes(outLens), b, 1)
	add(preBadWordsIDs, triton.TypeInt32, int32Bytes(bad), b, 2, int64(badLen))
	add(preStopWordsIDs, triton.TypeInt32, int32Bytes(stop), b, 2, int64(stopLen))
	add(preEmbeddingBias, triton.TypeFP32, float32Bytes(bias), b, int64(biasLen))
	add(preOutEndID, triton.TypeInt32, int32Bytes(ends), b, 1)
	add(preOutPadID, triton.TypeInt32, int32Bytes(pads), b, 1)
	return outs, nil
}

// tokenPerItem reads an optional token id per batch item (END_ID, PAD_ID): def for
// every item when absent, else each in the vocabulary or -1 (none).
func (p *preprocessor) tokenPerItem(in *batchInputs, name string, def int32) ([]int32, error) {
	if in.t[name] == nil {
		v := make([]int32, in.batch)
		for i := range v {
			v[i] = def
		}
		return v, nil
	}
	v, err := in.int32PerItem(name)
	if err != nil {
		return nil, err
	}
	for i, id := range v {
		if id < -1 || int(id) >= p.vocab {
			return nil, fmt.Errorf("input %q: item %d is %d, outside the vocabulary [0, %d) (-1: none)", name, i, id, p.vocab)
		}
	}
	return v, nil
}

// wordLists encodes each batch item's words in the [2, L] encoding of stop_words_list
// and bad_words_list: row 0 the words' tokens one after another, padded with 0, row 1
// each word's end offset in row 0, padded with -1. A word that tokenizes to nothing (the
// empty string, which TensorRT-LLM's clients send for "no words") is left out. Absent,
// L is 0; present, L is the longest item's token count and at least 1, as TensorRT-LLM's.
// The result is the [batch, 2, L] tensor's values and L.
func (p *preprocessor) wordLists(in *batchInputs, name string) ([]int32, int, error) {
	if in.t[name] == nil {
		return nil, 0, nil
	}
	rows, err := in.stringRows(name)
	if err != nil {
		return nil, 0, err
	}
	flat := make([][]int32, len(rows))
	offsets := make([][]int32, len(rows))
	L := 1
	for i, words := range rows {
		for _, w := range words {
			ids := p.tok.Encode(w)
			if len(ids) == 0 {
				continue
			}
			flat[i] = append(flat[i], ids...)
			offsets[i] = append(offsets[i], int32(len(flat[i])))
		}
		L = max(L, len(flat[i]))
	}
	out := make([]int32, 0, len(rows)*2*L)
	for i := range rows {
		out = append(out, flat[i]...)
		for range L - len(flat[i]) {
			out = append(out, 0)
		}
		out = append(out, offsets[i]...)
		for range L - len(offsets[i]) {
			out = append(out, -1)
		}
	}
	return out, L, nil
}

// bias builds EMBEDDING_BIAS from EMBEDDING_BIAS_WORDS and EMBEDDING_BIAS_WEIGHTS: per
// batch item a vocabulary-sized vector in which each word's tokens get its weight added.
// Words are tokenized without special tokens, as gollm's model does its
// embedding_bias_words (TensorRT-LLM's preprocessing adds a BOS to each, which biases
// the BOS token too), so that both routes bias the same tokens. Without words the bias
// is empty ([batch, 0]), which the model takes as none. The result is the tensor's
// values and its length per item.
func (p *preprocessor) bias(in *batchInputs) ([]float32, int, error) {
	wordsT, weightsT := in.t[preBiasWords], in.t[preBiasWeights]
	if wordsT == nil && weightsT == nil {
		return nil, 0, nil
	}
	if wordsT == nil || weightsT == nil {
		return nil, 0, fmt.Errorf("inputs %q and %q go together: send both or neither", preBiasWords, preBiasWeights)
	}
	words, err := in.stringRows(preBiasWords)
	if err != nil {
		return nil, 0, err
	}
	weights, err := in.float32Rows(preBiasWeights)
	if err != nil {
		return nil, 0, err
	}
	out := make([]float32, in.batch*p.vocab)
	for i := range words {
		if len(weights[i]) != len(words[i]) {
			return nil, 0, fmt.Errorf("input %q: %d weights for %d %q per item; want one per word", preBiasWeights, len(weights[i]), len(words[i]), preBiasWords)
		}
		row := out[i*p.vocab : (i+1)*p.vocab]
		for j, w := range words[i] {
			wt := weights[i][j]
			if !(wt > -math.MaxFloat32 && wt < math.MaxFloat32) {
				return nil, 0, fmt.Errorf("input %q: item %d, weight %d is %v; want a finite number", preBiasWeights, i, j, wt)
			}
			for _, id := range p.tok.Encode(w) {
				if id >= 0 && int(id) < p.vocab {
					row[id] += wt
				}
			}
		}
	}
	return out, p.vocab, nil
}

package main

import (
	"fmt"

	"gollm/bridge/triton"
)

// The postprocessing model's tensors: TensorRT-LLM's postprocessing model's names,
// dtypes and shapes (after the batch dimension).
const (
	// postTokensBatch is the tensorrt_llm model's output_ids, INT32 [beams, tokens].
	postTokensBatch = "TOKENS_BATCH"
	// postSequenceLength is its sequence_length, INT32 [beams]: the tokens of each row.
	postSequenceLength = "SEQUENCE_LENGTH"
	// postOutput is the text of each row, BYTES: [batch × beams], every row of every
	// batch item in order (TensorRT-LLM's flattened shape, like text_output's).
	postOutput = "OUTPUT"
)

// postPassThrough are the inputs older TensorRT-LLM postprocessing models hand back
// unchanged under an OUT_ name (the ensemble's route for log probabilities and logits),
// with their data types.
var postPassThrough = []struct {
	name  string
	dtype triton.DataType
}{
	{"CUM_LOG_PROBS", triton.TypeFP32},
	{"OUTPUT_LOG_PROBS", triton.TypeFP32},
	{"CONTEXT_LOGITS", triton.TypeFP32},
	{"GENERATION_LOGITS", triton.TypeFP32},
	{"BATCH_INDEX", triton.TypeInt32},
}

// postKnown are the inputs the postprocessing model reads.
var postKnown = func() map[string]bool {
	m := map[string]bool{postTokensBatch: true, postSequenceLength: true}
	for _, pt := range postPassThrough {
		m[pt.name] = true
	}
	return m
}()

// textDecoder is what the postprocessing model needs of the tokenizer.
type textDecoder interface {
	// Decode is the ids' text, special tokens included.
	Decode(ids []int32) string
	// DecodeText is the ids' text without special tokens.
	DecodeText(ids []int32) string
}

// postprocessor is the postprocessing model: TensorRT-LLM's postprocessing model's work
// with the checkpoint's tokenizer, decoding as gollm's text_output does, so that the two
// routes give the same text.
type postprocessor struct {
	// tok decodes TOKENS_BATCH with the checkpoint's tokenizer.
	tok textDecoder
	// skipSpecial is skip_special_tokens.
	skipSpecial bool
}

// run decodes one request's batch.
func (p *postprocessor) run(tensors []triton.Tensor, want map[string]bool) ([]output, error) {
	in, err := newBatchInputs(tensors, rolePostprocessing, postTokensBatch, postKnown, nil)
	if err != nil {
		return nil, err
	}
	tokens, err := in.int32Rows(postTokensBatch)
	if err != nil {
		return nil, err
	}
	shape := in.t[postTokensBatch].Shape
	if len(shape) != 3 {
		return nil, fmt.Errorf("input %q: shape %v; want [batch, beams, tokens] (the tensorrt_llm model's output_ids)", postTokensBatch, shape)
	}
	W, T := int(shape[1]), int(shape[2])
	if in.t[postSequenceLength] == nil {
		return nil, fmt.Errorf("missing input %q", postSequenceLength)
	}
	lens, err := in.int32Rows(postSequenceLength)
	if err != nil {
		return nil, err
	}
	if ls := in.t[postSequenceLength].Shape; len(ls) != 2 || ls[1] != int64(W) {
		return nil, fmt.Errorf("input %q: shape %v; want [%d, %d], a length per row of %q %v", postSequenceLength, ls, in.batch, W, postTokensBatch, shape)
	}
	texts := make([]string, 0, in.batch*W)
	for b, row := range tokens {
		for w := range W {
			n := int(lens[b][w])
			if n < 0 || n > T {
				return nil, fmt.Errorf("input %q: item %d, beam %d is %d; want 0 to the %d tokens of %q", postSequenceLength, b, w, n, T, postTokensBatch)
			}
			ids := row[w*T : w*T+n]
			for i, id := range ids {
				if id < 0 {
					return nil, fmt.Errorf("input %q: item %d, beam %d: token id %d at position %d is negative", postTokensBatch, b, w, id, i)
				}
			}
			// Both decodes give valid UTF-8 (U+FFFD for bytes that form no character),
			// as Hugging Face's; ids the tokenizer does not know are left out, as there.
			if p.skipSpecial {
				texts = append(texts, p.tok.DecodeText(ids))
			} else {
				texts = append(texts, p.tok.Decode(ids))
			}
		}
	}
	var outs []output
	if want == nil || want[postOutput] {
		outs = append(outs, output{Name: postOutput, DataType: triton.TypeBytes, Shape: []int64{int64(len(texts))}, Data: bytesElements(texts)})
	}
	for _, pt := range postPassThrough {
		t := in.t[pt.name]
		if t == nil {
			continue
		}
		if _, err := in.checkShape(pt.name, pt.dtype); err != nil {
			return nil, err
		}
		if want == nil || want["OUT_"+pt.name] {
			outs = append(outs, output{Name: "OUT_" + pt.name, DataType: pt.dtype, Shape: t.Shape, Data: t.Data})
		}
	}
	return outs, nil
}

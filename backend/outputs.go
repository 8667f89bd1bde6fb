package main

import (
	"encoding/binary"
	"math"

	"gollm/batchmanager"
	"gollm/bridge/triton"
)

// output is one tensor of a Triton response, serialized.
type output struct {
	// Name is the output's name.
	Name string
	// DataType is its element type.
	DataType triton.DataType
	// Shape is its shape, batch dimension (1) first.
	Shape []int64
	// Data is its bytes.
	Data []byte
}

// textState is what a request that answers in text needs.
type textState struct {
	// tok detokenizes non-streaming answers.
	tok interface{ Decode(ids []int32) string }
	// stream detokenizes streaming answers token by token (a *model.StreamDecoder).
	stream interface {
		// Next adds a token and returns the text it completes.
		Next(id int32) string
		// Flush returns what is held back at the end.
		Flush() string
	}
}

// askedOutputs are the optional outputs a request asked for.
type askedOutputs struct {
	// logProbs: cum_log_probs and output_log_probs.
	logProbs bool
	// contextLogits: context_logits.
	contextLogits bool
	// generationLogits: generation_logits.
	generationLogits bool
}

// convertOutputs turns the batch manager's result for one response into Triton outputs,
// each with the batch dimension: output_ids [1, 1, n] (beam 1), sequence_length [1, 1],
// and what the request asked for; only the outputs in want are kept (nil: all), and
// text_output is added when text is not nil. empty reports a response with no new token
// and no text (a streaming request's last, after its end token).
func convertOutputs(res *batchmanager.Result, vocab int, asked askedOutputs, want map[string]bool, text *textState, streaming, final bool) (outs []output, empty bool) {
	add := func(name string, dt triton.DataType, data []byte, shape ...int64) {
		if want == nil || want[name] {
			outs = append(outs, output{Name: name, DataType: dt, Shape: shape, Data: data})
		}
	}
	ids := res.Tokens
	add(outOutputIDs, triton.TypeInt32, int32Bytes(ids), 1, 1, int64(len(ids)))
	add(outSequenceLength, triton.TypeInt32, int32Bytes([]int32{int32(res.Length)}), 1, 1)
	if asked.logProbs {
		add(outCumLogProbs, triton.TypeFP32, float32Bytes([]float32{res.CumLogProb}), 1, 1)
		add(outOutputLogProbs, triton.TypeFP32, float32Bytes(res.LogProbs), 1, 1, int64(len(res.LogProbs)))
	}
	if asked.contextLogits && res.ContextLogits != nil {
		add(outContextLogits, triton.TypeFP32, float32Bytes(res.ContextLogits), 1, int64(res.PromptLen), int64(vocab))
	}
	if asked.generationLogits {
		rows := int64(len(res.GenerationLogits) / max(1, vocab))
		add(outGenLogits, triton.TypeFP32, float32Bytes(res.GenerationLogits), 1, 1, rows, int64(vocab))
	}
	empty = len(ids) == 0
	if text != nil && (want == nil || want[outTextOutput]) {
		var s string
		if streaming {
			for _, id := range ids {
				s += text.stream.Next(id)
			}
			if final {
				s += text.stream.Flush()
			}
		} else {
			// V1 pads output_ids past the sequence's end.
			s = text.tok.Decode(ids[:res.Length])
		}
		empty = empty && s == ""
		outs = append(outs, output{Name: outTextOutput, DataType: triton.TypeBytes, Shape: []int64{1, 1}, Data: bytesElement(s)})
	}
	return outs, empty
}

// int32Bytes serializes little-endian.
func int32Bytes(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

// float32Bytes serializes little-endian.
func float32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// bytesElement serializes one BYTES element: a 4-byte little-endian length, then s.
func bytesElement(s string) []byte {
	b := make([]byte, 4+len(s))
	binary.LittleEndian.PutUint32(b, uint32(len(s)))
	copy(b[4:], s)
	return b
}

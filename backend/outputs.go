package main

import (
	"encoding/binary"
	"fmt"
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

// convertOutputs turns the batch manager's tensors for one response into Triton
// outputs: each gets the batch dimension, only the outputs in want are kept (nil: all),
// and text_output is added when text is not nil. empty reports a response with no new
// token and no text (a streaming request's last, after its end token).
func convertOutputs(tensors []batchmanager.Tensor, want map[string]bool, text *textState, streaming, final bool) (outs []output, empty bool, err error) {
	var ids []int32
	seqLen := -1
	for _, t := range tensors {
		switch t.Name {
		case outOutputIDs:
			ids, _ = t.Data.([]int32)
		case outSequenceLength:
			if v, ok := t.Data.([]int32); ok && len(v) == 1 {
				seqLen = int(v[0])
			}
		}
		if want != nil && !want[t.Name] {
			continue
		}
		o := output{Name: t.Name, Shape: append([]int64{1}, t.Shape...)}
		switch d := t.Data.(type) {
		case []int32:
			o.DataType, o.Data = triton.TypeInt32, int32Bytes(d)
		case []float32:
			o.DataType, o.Data = triton.TypeFP32, float32Bytes(d)
		default:
			return nil, false, fmt.Errorf("output %q: unexpected data %T from the batch manager", t.Name, t.Data)
		}
		outs = append(outs, o)
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
			if seqLen >= 0 && seqLen < len(ids) {
				// V1 pads output_ids past the sequence's end.
				ids = ids[:seqLen]
			}
			s = text.tok.Decode(ids)
		}
		empty = empty && s == ""
		outs = append(outs, output{Name: outTextOutput, DataType: triton.TypeBytes, Shape: []int64{1, 1}, Data: bytesElement(s)})
	}
	return outs, empty, nil
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

// tokenCounts are the token counts a request asked for (return_num_input_tokens,
// return_num_output_tokens: the names Triton's OpenAI frontend uses) and what they are
// counted from.
type tokenCounts struct {
	// Input adds num_input_tokens, the prompt's length in tokens, to every response.
	Input bool
	// Output adds num_output_tokens: the tokens generated in this response (streaming)
	// or in all (otherwise); the end token is not counted, as output_ids leaves it out.
	Output bool
	// Prompt is the prompt's length in tokens.
	Prompt int
	// PromptInOutput says non-streaming output_ids start with the prompt.
	PromptInOutput bool
}

// outputs returns the count outputs c asks for, INT32 [1, 1], for a response made of
// the batch manager's tensors.
func (c *tokenCounts) outputs(tensors []batchmanager.Tensor, streaming bool) []output {
	var outs []output
	if c.Input {
		outs = append(outs, output{Name: outNumInput, DataType: triton.TypeInt32, Shape: []int64{1, 1}, Data: int32Bytes([]int32{int32(c.Prompt)})})
	}
	if c.Output {
		n, seqLen := 0, -1
		for _, t := range tensors {
			switch d := t.Data.(type) {
			case []int32:
				if t.Name == outOutputIDs {
					n = len(d)
				} else if t.Name == outSequenceLength && len(d) == 1 {
					seqLen = int(d[0])
				}
			}
		}
		if seqLen >= 0 && seqLen < n {
			n = seqLen // V1 pads output_ids past the sequence's end
		}
		if !streaming && c.PromptInOutput {
			n = max(0, n-c.Prompt)
		}
		outs = append(outs, output{Name: outNumOutput, DataType: triton.TypeInt32, Shape: []int64{1, 1}, Data: int32Bytes([]int32{int32(n)})})
	}
	return outs
}

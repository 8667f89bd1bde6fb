package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"testing"

	"gollm/batchmanager"
	"gollm/bridge/triton"
)

// fakeText decodes token id i as the i-th byte of a string, and streams like
// model.StreamDecoder: bytes of an unfinished UTF-8 character are held back.
type fakeText struct {
	// bytes maps token ids to bytes.
	bytes string
	// pending holds bytes not yet returned.
	pending []byte
}

// Decode joins the tokens' bytes.
func (f *fakeText) Decode(ids []int32) string {
	var b []byte
	for _, id := range ids {
		b = append(b, f.bytes[id])
	}
	return string(b)
}

// Next returns the text completed by id.
func (f *fakeText) Next(id int32) string {
	f.pending = append(f.pending, f.bytes[id])
	if f.pending[0] >= 0x80 && len(f.pending) < 2 {
		return ""
	}
	out := string(f.pending)
	f.pending = f.pending[:0]
	return out
}

// Flush returns what is held back.
func (f *fakeText) Flush() string {
	out := string(f.pending)
	f.pending = f.pending[:0]
	return out
}

// decodeBytes reads one BYTES element.
func decodeBytes(t *testing.T, b []byte) string {
	t.Helper()
	if len(b) < 4 || int(binary.LittleEndian.Uint32(b)) != len(b)-4 {
		t.Fatalf("malformed BYTES element %v", b)
	}
	return string(b[4:])
}

func TestConvertOutputs(t *testing.T) {
	tensors := []batchmanager.Tensor{
		{Name: outOutputIDs, Shape: []int64{1, 3}, Data: []int32{1, 2, 3}},
		{Name: outSequenceLength, Shape: []int64{1}, Data: []int32{3}},
		{Name: outCumLogProbs, Shape: []int64{1}, Data: []float32{-1.5}},
	}
	t.Run("every output gets the batch dimension", func(t *testing.T) {
		outs, empty, err := convertOutputs(tensors, nil, nil, false, true)
		if err != nil || empty {
			t.Fatalf("err %v, empty %v", err, empty)
		}
		want := []output{
			{outOutputIDs, triton.TypeInt32, []int64{1, 1, 3}, int32Bytes([]int32{1, 2, 3})},
			{outSequenceLength, triton.TypeInt32, []int64{1, 1}, int32Bytes([]int32{3})},
			{outCumLogProbs, triton.TypeFP32, []int64{1, 1}, float32Bytes([]float32{-1.5})},
		}
		if !reflect.DeepEqual(outs, want) {
			t.Errorf("got %+v\nwant %+v", outs, want)
		}
		if math.Float32frombits(binary.LittleEndian.Uint32(outs[2].Data)) != -1.5 {
			t.Error("FP32 bytes do not round-trip")
		}
	})
	t.Run("only the requested outputs are kept", func(t *testing.T) {
		outs, _, err := convertOutputs(tensors, map[string]bool{outSequenceLength: true, outTextOutput: true}, &textState{tok: &fakeText{bytes: "abcd"}}, false, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(outs) != 2 || outs[0].Name != outSequenceLength || outs[1].Name != outTextOutput {
			t.Fatalf("got %+v", outs)
		}
		if s := decodeBytes(t, outs[1].Data); s != "bcd" {
			t.Errorf("text %q, want bcd (decoded from output_ids even though they are not sent)", s)
		}
	})
	t.Run("non-streaming text stops at sequence_length", func(t *testing.T) {
		padded := []batchmanager.Tensor{
			{Name: outOutputIDs, Shape: []int64{1, 4}, Data: []int32{1, 2, 0, 0}},
			{Name: outSequenceLength, Shape: []int64{1}, Data: []int32{2}},
		}
		outs, _, err := convertOutputs(padded, nil, &textState{tok: &fakeText{bytes: "xyz"}}, false, true)
		if err != nil {
			t.Fatal(err)
		}
		if s := decodeBytes(t, outs[len(outs)-1].Data); s != "yz" {
			t.Errorf("text %q, want yz", s)
		}
	})
	t.Run("streaming text holds back a split character", func(t *testing.T) {
		// "é" is two bytes, \xc3\xa9, as tokens 1 and 2.
		text := &textState{stream: &fakeText{bytes: "a\xc3\xa9"}}
		var got []string
		for _, id := range []int32{0, 1, 2} {
			outs, empty, err := convertOutputs([]batchmanager.Tensor{{Name: outOutputIDs, Shape: []int64{1, 1}, Data: []int32{id}}}, nil, text, true, false)
			if err != nil || empty {
				t.Fatalf("err %v, empty %v", err, empty)
			}
			got = append(got, decodeBytes(t, outs[len(outs)-1].Data))
		}
		if !reflect.DeepEqual(got, []string{"a", "", "é"}) {
			t.Errorf("got %q", got)
		}
	})
	t.Run("a final streaming response with nothing new is empty", func(t *testing.T) {
		none := []batchmanager.Tensor{{Name: outOutputIDs, Shape: []int64{1, 0}, Data: []int32{}}}
		_, empty, err := convertOutputs(none, nil, &textState{stream: &fakeText{bytes: "a"}}, true, true)
		if err != nil || !empty {
			t.Fatalf("err %v, empty %v; want empty", err, empty)
		}
		held := &fakeText{bytes: "\xc3", pending: []byte{0xc3}}
		outs, empty, err := convertOutputs(none, nil, &textState{stream: held}, true, true)
		if err != nil || empty || decodeBytes(t, outs[len(outs)-1].Data) != "\xc3" {
			t.Fatalf("held-back bytes must be flushed on the final response: err %v, empty %v, %+v", err, empty, outs)
		}
	})
	t.Run("unexpected data is an error", func(t *testing.T) {
		if _, _, err := convertOutputs([]batchmanager.Tensor{{Name: "x", Shape: []int64{1}, Data: []int64{1}}}, nil, nil, false, true); err == nil {
			t.Fatal("no error")
		}
	})
}

func TestResponseError(t *testing.T) {
	tests := []struct {
		err  error
		want triton.Code
	}{
		{fmt.Errorf("request 1: %w", batchmanager.ErrCancelled), triton.CodeCancelled},
		{fmt.Errorf("request 1: %w: bad", batchmanager.ErrInvalidRequest), triton.CodeInvalidArg},
		{fmt.Errorf("request 1: %w", batchmanager.ErrDuplicateID), triton.CodeInvalidArg},
		{fmt.Errorf("request 1: %w", batchmanager.ErrShuttingDown), triton.CodeUnavailable},
		{fmt.Errorf("request 1: %w", batchmanager.ErrEngine), triton.CodeInternal},
	}
	for _, tt := range tests {
		err := responseError(tt.err)
		if triton.CodeOf(err) != tt.want || err.Error() != tt.err.Error() {
			t.Errorf("%v: got code %v, message %q; want %v and the same message", tt.err, triton.CodeOf(err), err, tt.want)
		}
	}
	if responseError(nil) != nil {
		t.Error("nil became an error")
	}
}

// TestTokenCounts checks num_input_tokens and num_output_tokens: per response when
// streaming, all generated tokens otherwise (the prompt taken off when output_ids
// carries it, V1 padding not counted).
func TestTokenCounts(t *testing.T) {
	value := func(outs []output, name string) int32 {
		t.Helper()
		for _, o := range outs {
			if o.Name == name {
				if o.DataType != triton.TypeInt32 || !reflect.DeepEqual(o.Shape, []int64{1, 1}) || len(o.Data) != 4 {
					t.Fatalf("%s: type %v shape %v, %d bytes; want INT32 [1, 1]", name, o.DataType, o.Shape, len(o.Data))
				}
				return int32(binary.LittleEndian.Uint32(o.Data))
			}
		}
		t.Fatalf("no output %s in %v", name, outs)
		return 0
	}
	ids := func(v ...int32) []batchmanager.Tensor {
		return []batchmanager.Tensor{
			{Name: outOutputIDs, Shape: []int64{1, int64(len(v))}, Data: v},
			{Name: outSequenceLength, Shape: []int64{1}, Data: []int32{int32(len(v))}},
		}
	}
	c := &tokenCounts{Input: true, Output: true, Prompt: 3, PromptInOutput: true}
	outs := c.outputs(ids(7), true)
	if got := value(outs, outNumInput); got != 3 {
		t.Errorf("streaming num_input_tokens = %d, want 3", got)
	}
	if got := value(outs, outNumOutput); got != 1 {
		t.Errorf("streaming num_output_tokens = %d, want 1", got)
	}
	if got := value(c.outputs(ids(), true), outNumOutput); got != 0 {
		t.Errorf("streaming end-token response: num_output_tokens = %d, want 0", got)
	}
	if got := value(c.outputs(ids(1, 2, 3, 7, 8), false), outNumOutput); got != 2 {
		t.Errorf("non-streaming with the prompt: num_output_tokens = %d, want 2", got)
	}
	excl := &tokenCounts{Output: true, Prompt: 3}
	outs = excl.outputs(ids(7, 8), false)
	if got := value(outs, outNumOutput); got != 2 || len(outs) != 1 {
		t.Errorf("non-streaming without the prompt: num_output_tokens = %d (%d outputs), want 2 (1)", got, len(outs))
	}
	padded := []batchmanager.Tensor{
		{Name: outOutputIDs, Shape: []int64{1, 4}, Data: []int32{7, 8, 0, 0}},
		{Name: outSequenceLength, Shape: []int64{1}, Data: []int32{2}},
	}
	if got := value(excl.outputs(padded, false), outNumOutput); got != 2 {
		t.Errorf("V1-padded: num_output_tokens = %d, want 2", got)
	}
}

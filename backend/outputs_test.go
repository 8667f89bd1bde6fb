package main

import (
	"encoding/binary"
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
	res := &batchmanager.Result{Tokens: []int32{1, 2, 3}, Length: 3, CumLogProb: -1.5, LogProbs: []float32{-0.5, -0.5, -0.5}}
	t.Run("every output gets the batch dimension, the optional ones when asked", func(t *testing.T) {
		outs, empty := convertOutputs(res, 10, askedOutputs{logProbs: true}, nil, nil, false, true)
		if empty {
			t.Fatal("empty")
		}
		want := []output{
			{outOutputIDs, triton.TypeInt32, []int64{1, 1, 3}, int32Bytes([]int32{1, 2, 3})},
			{outSequenceLength, triton.TypeInt32, []int64{1, 1}, int32Bytes([]int32{3})},
			{outCumLogProbs, triton.TypeFP32, []int64{1, 1}, float32Bytes([]float32{-1.5})},
			{outOutputLogProbs, triton.TypeFP32, []int64{1, 1, 3}, float32Bytes([]float32{-0.5, -0.5, -0.5})},
		}
		if !reflect.DeepEqual(outs, want) {
			t.Errorf("got %+v\nwant %+v", outs, want)
		}
		if math.Float32frombits(binary.LittleEndian.Uint32(outs[2].Data)) != -1.5 {
			t.Error("FP32 bytes do not round-trip")
		}
		if outs, _ := convertOutputs(res, 10, askedOutputs{}, nil, nil, false, true); len(outs) != 2 {
			t.Errorf("%d outputs for a request that asked for none of the optional ones, want 2", len(outs))
		}
	})
	t.Run("logits carry their shapes", func(t *testing.T) {
		r := &batchmanager.Result{Tokens: []int32{4, 5}, Length: 2, PromptLen: 3, Generated: 2,
			ContextLogits: make([]float32, 3*10), GenerationLogits: make([]float32, 2*10)}
		outs, _ := convertOutputs(r, 10, askedOutputs{contextLogits: true, generationLogits: true}, nil, nil, false, true)
		if len(outs) != 4 || !reflect.DeepEqual(outs[2].Shape, []int64{1, 3, 10}) || !reflect.DeepEqual(outs[3].Shape, []int64{1, 1, 2, 10}) {
			t.Errorf("got %+v", outs)
		}
		none := &batchmanager.Result{Tokens: []int32{}, GenerationLogits: []float32{}}
		outs, _ = convertOutputs(none, 10, askedOutputs{generationLogits: true}, nil, nil, true, true)
		if !reflect.DeepEqual(outs[2].Shape, []int64{1, 1, 0, 10}) {
			t.Errorf("no new token: generation_logits shape %v, want [1 1 0 10]", outs[2].Shape)
		}
	})
	t.Run("only the requested outputs are kept", func(t *testing.T) {
		outs, _ := convertOutputs(res, 10, askedOutputs{logProbs: true}, map[string]bool{outSequenceLength: true, outTextOutput: true}, &textState{tok: &fakeText{bytes: "abcd"}}, false, true)
		if len(outs) != 2 || outs[0].Name != outSequenceLength || outs[1].Name != outTextOutput {
			t.Fatalf("got %+v", outs)
		}
		if s := decodeBytes(t, outs[1].Data); s != "bcd" {
			t.Errorf("text %q, want bcd (decoded from output_ids even though they are not sent)", s)
		}
	})
	t.Run("non-streaming text stops at sequence_length", func(t *testing.T) {
		padded := &batchmanager.Result{Tokens: []int32{1, 2, 0, 0}, Length: 2}
		outs, _ := convertOutputs(padded, 10, askedOutputs{}, nil, &textState{tok: &fakeText{bytes: "xyz"}}, false, true)
		if s := decodeBytes(t, outs[len(outs)-1].Data); s != "yz" {
			t.Errorf("text %q, want yz", s)
		}
	})
	t.Run("streaming text holds back a split character", func(t *testing.T) {
		// "é" is two bytes, \xc3\xa9, as tokens 1 and 2.
		text := &textState{stream: &fakeText{bytes: "a\xc3\xa9"}}
		var got []string
		for _, id := range []int32{0, 1, 2} {
			outs, empty := convertOutputs(&batchmanager.Result{Tokens: []int32{id}, Length: 1}, 10, askedOutputs{}, nil, text, true, false)
			if empty {
				t.Fatal("empty")
			}
			got = append(got, decodeBytes(t, outs[len(outs)-1].Data))
		}
		if !reflect.DeepEqual(got, []string{"a", "", "é"}) {
			t.Errorf("got %q", got)
		}
	})
	t.Run("a final streaming response with nothing new is empty", func(t *testing.T) {
		none := &batchmanager.Result{Tokens: []int32{}}
		_, empty := convertOutputs(none, 10, askedOutputs{}, nil, &textState{stream: &fakeText{bytes: "a"}}, true, true)
		if !empty {
			t.Fatal("not empty")
		}
		held := &fakeText{bytes: "\xc3", pending: []byte{0xc3}}
		outs, empty := convertOutputs(none, 10, askedOutputs{}, nil, &textState{stream: held}, true, true)
		if empty || decodeBytes(t, outs[len(outs)-1].Data) != "\xc3" {
			t.Fatalf("held-back bytes must be flushed on the final response: empty %v, %+v", empty, outs)
		}
	})
}

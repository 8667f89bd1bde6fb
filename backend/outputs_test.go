package main

import (
	"encoding/binary"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gollm/batchmanager"
	"gollm/bridge/triton"
)

// fakeText decodes token id i as the i-th byte of a string, and streams like
// tokenizer.StreamDecoder: bytes of an unfinished UTF-8 character are held back.
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

// NewStream makes a fresh fakeText over the same bytes.
func (f *fakeText) NewStream() tokenStream { return &fakeText{bytes: f.bytes} }

// spec is an outputSpec over a vocabulary of 10.
func spec(asked askedOutputs, want map[string]bool, text *textState, streaming bool) *outputSpec {
	return &outputSpec{vocab: 10, asked: asked, want: want, text: text, streaming: streaming, padID: -1}
}

func TestConvertOutputs(t *testing.T) {
	res := &batchmanager.Result{Tokens: []int32{1, 2, 3}, Length: 3, CumLogProb: -1.5, LogProbs: []float32{-0.5, -0.5, -0.5}}
	t.Run("every output gets the batch dimension, the optional ones when asked", func(t *testing.T) {
		outs, empty := convertOutputs(res, spec(askedOutputs{logProbs: true}, nil, nil, false), true)
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
		if outs, _ := convertOutputs(res, spec(askedOutputs{}, nil, nil, false), true); len(outs) != 2 {
			t.Errorf("%d outputs for a request that asked for none of the optional ones, want 2", len(outs))
		}
	})
	t.Run("logits carry their shapes", func(t *testing.T) {
		r := &batchmanager.Result{Tokens: []int32{4, 5}, Length: 2, PromptLen: 3, Generated: 2,
			ContextLogits: make([]float32, 3*10), GenerationLogits: make([]float32, 2*10)}
		outs, _ := convertOutputs(r, spec(askedOutputs{contextLogits: true, generationLogits: true}, nil, nil, false), true)
		if len(outs) != 4 || !reflect.DeepEqual(outs[2].Shape, []int64{1, 3, 10}) || !reflect.DeepEqual(outs[3].Shape, []int64{1, 1, 2, 10}) {
			t.Errorf("got %+v", outs)
		}
		none := &batchmanager.Result{Tokens: []int32{}, GenerationLogits: []float32{}}
		outs, _ = convertOutputs(none, spec(askedOutputs{generationLogits: true}, nil, nil, true), true)
		if !reflect.DeepEqual(outs[2].Shape, []int64{1, 1, 0, 10}) {
			t.Errorf("no new token: generation_logits shape %v, want [1 1 0 10]", outs[2].Shape)
		}
	})
	t.Run("only the requested outputs are kept", func(t *testing.T) {
		outs, _ := convertOutputs(res, spec(askedOutputs{logProbs: true}, map[string]bool{outSequenceLength: true, outTextOutput: true}, &textState{d: &fakeText{bytes: "abcd"}}, false), true)
		if len(outs) != 2 || outs[0].Name != outSequenceLength || outs[1].Name != outTextOutput {
			t.Fatalf("got %+v", outs)
		}
		if s := decodeBytes(t, outs[1].Data); s != "bcd" {
			t.Errorf("text %q, want bcd (decoded from output_ids even though they are not sent)", s)
		}
		if !reflect.DeepEqual(outs[1].Shape, []int64{1}) {
			t.Errorf("text_output shape %v, want [1] as TensorRT-LLM's ensemble gives", outs[1].Shape)
		}
	})
	t.Run("non-streaming text stops at sequence_length", func(t *testing.T) {
		padded := &batchmanager.Result{Tokens: []int32{1, 2, 0, 0}, Length: 2}
		outs, _ := convertOutputs(padded, spec(askedOutputs{}, nil, &textState{d: &fakeText{bytes: "xyz"}}, false), true)
		if s := decodeBytes(t, outs[len(outs)-1].Data); s != "yz" {
			t.Errorf("text %q, want yz", s)
		}
	})
	t.Run("streaming text holds back a split character", func(t *testing.T) {
		// "é" is two bytes, \xc3\xa9, as tokens 1 and 2.
		text := &textState{d: &fakeText{bytes: "a\xc3\xa9"}}
		var got []string
		for _, id := range []int32{0, 1, 2} {
			outs, empty := convertOutputs(&batchmanager.Result{Tokens: []int32{id}, Length: 1}, spec(askedOutputs{}, nil, text, true), false)
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
		_, empty := convertOutputs(none, spec(askedOutputs{}, nil, &textState{d: &fakeText{bytes: "a"}}, true), true)
		if !empty {
			t.Fatal("not empty")
		}
		// Unless it carries the context logits, which every response does.
		withCtx := &batchmanager.Result{Tokens: []int32{}, PromptLen: 2, ContextLogits: make([]float32, 2*10)}
		outs, empty := convertOutputs(withCtx, spec(askedOutputs{contextLogits: true}, nil, nil, true), true)
		if empty || len(outs) != 3 || outs[2].Name != outContextLogits {
			t.Errorf("with context logits: empty %v, outputs %+v", empty, outs)
		}
		// The client did not name them among the outputs it wants: nothing to carry.
		if _, empty := convertOutputs(withCtx, spec(askedOutputs{contextLogits: true}, map[string]bool{outOutputIDs: true}, nil, true), true); !empty {
			t.Error("context logits the client did not name make a response")
		}
	})
	t.Run("text that can never be UTF-8 becomes U+FFFD", func(t *testing.T) {
		// Token 1 is a lone continuation byte, token 2 a lead byte the stream ends on.
		text := &textState{d: &fakeText{bytes: "a\xfc\xe2"}}
		var got string
		for i, id := range []int32{0, 1, 2} {
			outs, _ := convertOutputs(&batchmanager.Result{Tokens: []int32{id}, Length: 1}, spec(askedOutputs{}, nil, text, true), i == 2)
			got += decodeBytes(t, outs[len(outs)-1].Data)
		}
		if got != "a\uFFFD\uFFFD" {
			t.Errorf("streamed %q, want a and two U+FFFD", got)
		}
		whole := &batchmanager.Result{Tokens: []int32{0, 1, 2}, Length: 3}
		outs, _ := convertOutputs(whole, spec(askedOutputs{}, nil, &textState{d: &fakeText{bytes: "a\xfc\xe2"}}, false), true)
		if s := decodeBytes(t, outs[len(outs)-1].Data); s != "a\uFFFD\uFFFD" {
			t.Errorf("whole %q", s)
		}
	})
	t.Run("beams are rows padded to the longest, text one per beam", func(t *testing.T) {
		r := &batchmanager.Result{Beams: []batchmanager.BeamResult{{Tokens: []int32{1, 2, 3}, CumLogProb: -1, LogProbs: []float32{-0.5, -0.25, -0.25}},
			{Tokens: []int32{2}, CumLogProb: -2, LogProbs: []float32{-2}}}}
		outs, _ := convertOutputs(r, &outputSpec{vocab: 10, asked: askedOutputs{logProbs: true}, text: &textState{d: &fakeText{bytes: "wxyz"}}, padID: 9}, true)
		want := []output{
			{outOutputIDs, triton.TypeInt32, []int64{1, 2, 3}, int32Bytes([]int32{1, 2, 3, 2, 9, 9})},
			{outSequenceLength, triton.TypeInt32, []int64{1, 2}, int32Bytes([]int32{3, 1})},
			{outCumLogProbs, triton.TypeFP32, []int64{1, 2}, float32Bytes([]float32{-1, -2})},
			{outOutputLogProbs, triton.TypeFP32, []int64{1, 2, 3}, float32Bytes([]float32{-0.5, -0.25, -0.25, -2, 0, 0})},
			{outTextOutput, triton.TypeBytes, []int64{2}, bytesElements([]string{"xyz", "y"})},
		}
		if !reflect.DeepEqual(outs, want) {
			t.Errorf("got %+v\nwant %+v", outs, want)
		}
	})
}

func TestStopStringsEndTheText(t *testing.T) {
	d := &fakeText{bytes: "Hello, wor" + "ld! STOP here"}
	t.Run("a stop string split across tokens is cut, streaming", func(t *testing.T) {
		o := newTextOut(d, []string{"ST" + "OP", "lo, w"})
		var got []string
		for id := range int32(13) {
			got = append(got, o.push([]int32{id}, false))
		}
		// "lo, w" spans tokens 3-7: "Hel" goes out, the rest is held until it matches.
		if s := strings.Join(got, ""); s != "Hel" || !o.stopped {
			t.Errorf("streamed %q (stopped %v), want Hel then nothing", got, o.stopped)
		}
	})
	t.Run("held text goes out when it turns out not to be a stop string", func(t *testing.T) {
		o := newTextOut(d, []string{"! STOPPED"})
		var s string
		for id := range int32(len(d.bytes)) {
			s += o.push([]int32{id}, id == int32(len(d.bytes))-1)
		}
		if s != d.bytes || o.stopped {
			t.Errorf("streamed %q, want all of %q", s, d.bytes)
		}
	})
	t.Run("whole answers are cut after the prompt only", func(t *testing.T) {
		ids := make([]int32, len(d.bytes))
		for i := range ids {
			ids[i] = int32(i)
		}
		if s := wholeText(d, ids, 5, []string{"Hell", "! "}); s != "Hello, world" {
			t.Errorf("got %q", s)
		}
	})
	t.Run("the stopper sees beams change", func(t *testing.T) {
		st := &textStopper{d: d, stops: []string{"wor"}}
		if st.Stopped(0, []int32{0}) || st.Stopped(0, []int32{0, 1}) {
			t.Fatal("stopped early")
		}
		if !st.Stopped(1, []int32{7, 8, 9}) {
			t.Error("a new sequence ending in wor did not stop")
		}
		if st.Stopped(0, []int32{9, 8}) {
			t.Error("a changed beam kept its old text")
		}
	})
}

// TestTokenCounts checks num_input_tokens and num_output_tokens: per response when
// streaming, all generated tokens otherwise (the prompt and V1 padding not counted),
// the generated tokens so far for streamed beams, and only those named.
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
	counted := func(streaming bool, want map[string]bool) *outputSpec {
		s := spec(askedOutputs{}, want, nil, streaming)
		s.counts = &tokenCounts{Input: true, Output: true}
		return s
	}
	outs, _ := convertOutputs(&batchmanager.Result{Tokens: []int32{7}, Length: 1, PromptLen: 3, Generated: 5}, counted(true, nil), false)
	if got := value(outs, outNumInput); got != 3 {
		t.Errorf("streaming num_input_tokens = %d, want 3", got)
	}
	if got := value(outs, outNumOutput); got != 1 {
		t.Errorf("streaming num_output_tokens = %d, want 1 (this response's token)", got)
	}
	outs, _ = convertOutputs(&batchmanager.Result{Tokens: []int32{}, PromptLen: 3, Generated: 5}, counted(true, nil), true)
	if got := value(outs, outNumOutput); got != 0 {
		t.Errorf("streaming end-token response: num_output_tokens = %d, want 0", got)
	}
	whole := &batchmanager.Result{Tokens: []int32{1, 2, 3, 7, 8}, Length: 5, PromptLen: 3, Generated: 2}
	outs, _ = convertOutputs(whole, counted(false, nil), true)
	if got := value(outs, outNumOutput); got != 2 {
		t.Errorf("non-streaming with the prompt: num_output_tokens = %d, want 2", got)
	}
	padded := &batchmanager.Result{Tokens: []int32{7, 8, 0, 0}, Length: 2, PromptLen: 3, Generated: 2}
	outs, _ = convertOutputs(padded, counted(false, map[string]bool{outNumOutput: true}), true)
	if got := value(outs, outNumOutput); got != 2 || len(outs) != 1 {
		t.Errorf("V1-padded, only num_output_tokens named: %d (%d outputs), want 2 (1)", got, len(outs))
	}
	beams := &batchmanager.Result{Tokens: []int32{7, 8, 9}, Length: 3, PromptLen: 3, Generated: 3,
		Beams: []batchmanager.BeamResult{{Tokens: []int32{7, 8, 9}}, {Tokens: []int32{7, 8, 6}}}}
	outs, _ = convertOutputs(beams, counted(true, nil), false)
	if got := value(outs, outNumOutput); got != 3 {
		t.Errorf("streamed beams: num_output_tokens = %d, want 3 (every token so far)", got)
	}
}

// TestFinishReason checks finish_reason: one BYTES element per beam, named in vLLM's
// words on a sequence's last response ("" before it), and out only when asked.
func TestFinishReason(t *testing.T) {
	reasons := func(outs []output) []string {
		t.Helper()
		for _, o := range outs {
			if o.Name != outFinishReason {
				continue
			}
			if o.DataType != triton.TypeBytes || len(o.Shape) != 2 || o.Shape[0] != 1 {
				t.Fatalf("finish_reason: type %v shape %v, want BYTES [1, beams]", o.DataType, o.Shape)
			}
			var got []string
			for b := o.Data; len(b) >= 4; {
				n := int(binary.LittleEndian.Uint32(b))
				got = append(got, string(b[4:4+n]))
				b = b[4+n:]
			}
			if int64(len(got)) != o.Shape[1] {
				t.Fatalf("finish_reason: %d elements for shape %v", len(got), o.Shape)
			}
			return got
		}
		return nil
	}
	asked := spec(askedOutputs{finishReason: true}, nil, nil, true)
	for _, c := range []struct {
		finish batchmanager.FinishReason
		want   string
	}{
		{batchmanager.FinishedEndID, "stop"}, {batchmanager.FinishedStopWord, "stop"},
		{batchmanager.FinishedLength, "length"}, {batchmanager.FinishedCancelled, "abort"},
	} {
		outs, _ := convertOutputs(&batchmanager.Result{Tokens: []int32{4}, Length: 1, Finish: c.finish}, asked, true)
		if got := reasons(outs); !slices.Equal(got, []string{c.want}) {
			t.Errorf("final response ended by %v: finish_reason %q, want %q", c.finish, got, c.want)
		}
	}
	outs, _ := convertOutputs(&batchmanager.Result{Tokens: []int32{4}, Length: 1}, asked, false)
	if got := reasons(outs); !slices.Equal(got, []string{""}) {
		t.Errorf("a response before the last: finish_reason %q, want [\"\"]", got)
	}
	seq := &batchmanager.Result{Tokens: []int32{4}, Length: 1, Finish: batchmanager.FinishedLength, SequenceIndex: 1, SequenceFinal: true}
	if got := reasons(must(convertOutputs(seq, asked, false))); !slices.Equal(got, []string{"length"}) {
		t.Errorf("a sequence's last response (num_return_sequences): finish_reason %q, want [length]", got)
	}
	beams := &batchmanager.Result{Tokens: []int32{7, 8}, Length: 2, Finish: batchmanager.FinishedEndID,
		Beams: []batchmanager.BeamResult{{Tokens: []int32{7, 8}, Finish: batchmanager.FinishedEndID}, {Tokens: []int32{7, 9, 9}, Finish: batchmanager.FinishedLength}}}
	if got := reasons(must(convertOutputs(beams, asked, true))); !slices.Equal(got, []string{"stop", "length"}) {
		t.Errorf("finished beams: finish_reason %q, want [stop length]", got)
	}
	if got := reasons(must(convertOutputs(beams, asked, false))); !slices.Equal(got, []string{"", ""}) {
		t.Errorf("streamed beams before the end: finish_reason %q, want two empty", got)
	}
	if got := reasons(must(convertOutputs(&batchmanager.Result{Finish: batchmanager.FinishedLength}, spec(askedOutputs{}, nil, nil, true), true))); got != nil {
		t.Errorf("finish_reason %q without return_finish_reason", got)
	}
}

// must drops convertOutputs' empty flag.
func must(outs []output, _ bool) []output { return outs }

// TestTopLogprobs checks token_logprobs, top_logprobs and top_logprob_ids against a
// log-softmax computed here: the generated tokens' rows only (a non-streaming answer
// begins with the prompt), the k best ids best first with ties to the lower id, and no
// generation_logits unless asked.
func TestTopLogprobs(t *testing.T) {
	// The batch manager computes them (batchmanager.TestTopLogprobsMatchTheGenerationLogits);
	// the response carries them with their shapes: [1, tokens] and [1, tokens, k].
	res := &batchmanager.Result{Tokens: []int32{7, 8, 4, 9}, Length: 4, PromptLen: 2, Generated: 2,
		TokenLogprobs: []float32{-1.5, -0.25}, TopLogprobIDs: []int32{3, 4, 0, 9}, TopLogprobs: []float32{-1.5, -1.5, -0.125, -0.25}}
	s := spec(askedOutputs{tokenLogprobs: true, topLogprobs: 2}, nil, nil, false)
	outs, _ := convertOutputs(res, s, true)
	byName := map[string]output{}
	for _, o := range outs {
		byName[o.Name] = o
	}
	if _, ok := byName[outGenLogits]; ok {
		t.Error("generation_logits sent without being asked")
	}
	f32s := func(o output) []float32 {
		v := make([]float32, len(o.Data)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(o.Data[4*i:]))
		}
		return v
	}
	if o := byName[outTokenLogprobs]; !reflect.DeepEqual(o.Shape, []int64{1, 2}) || !reflect.DeepEqual(f32s(o), res.TokenLogprobs) {
		t.Errorf("token_logprobs %v %v, want [1 2] %v", o.Shape, f32s(o), res.TokenLogprobs)
	}
	if o := byName[outTopLogprobIDs]; !reflect.DeepEqual(o.Shape, []int64{1, 2, 2}) || !reflect.DeepEqual(o.Data, int32Bytes(res.TopLogprobIDs)) {
		t.Errorf("top_logprob_ids %v %v, want [1 2 2] %v", o.Shape, o.Data, res.TopLogprobIDs)
	}
	if o := byName[outTopLogprobs]; !reflect.DeepEqual(o.Shape, []int64{1, 2, 2}) || !reflect.DeepEqual(f32s(o), res.TopLogprobs) {
		t.Errorf("top_logprobs %v %v, want [1 2 2] %v", o.Shape, f32s(o), res.TopLogprobs)
	}

	// Streaming, k 0: this response's one token, no alternatives.
	one := &batchmanager.Result{Tokens: []int32{9}, Length: 1, Generated: 2, TokenLogprobs: []float32{-0.25}, TopLogprobIDs: []int32{}, TopLogprobs: []float32{}}
	outs, _ = convertOutputs(one, spec(askedOutputs{tokenLogprobs: true}, nil, nil, true), false)
	for _, o := range outs {
		if o.Name == outTopLogprobIDs && (!reflect.DeepEqual(o.Shape, []int64{1, 1, 0}) || len(o.Data) != 0) {
			t.Errorf("k 0: top_logprob_ids %v %v, want [1 1 0] and nothing", o.Shape, o.Data)
		}
		if o.Name == outTokenLogprobs && !reflect.DeepEqual(f32s(o), one.TokenLogprobs) {
			t.Errorf("streaming: token_logprobs %v, want %v", f32s(o), one.TokenLogprobs)
		}
	}
}

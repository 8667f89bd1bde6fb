package main

import (
	"encoding/binary"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"gollm/bridge/triton"
)

// fuzzNames are the input names the request fuzzer picks from: every input gollm reads
// and one it does not.
var fuzzNames = func() []string {
	var names []string
	for n := range knownInputs {
		names = append(names, n)
	}
	sort.Strings(names)
	return append(names, "lora_task_id")
}()

// decodeFuzzTensors reads tensors from fuzz bytes: per tensor a name index, a data
// type, a rank (0-3), that many dimensions (signed bytes), a data length and the data.
func decodeFuzzTensors(b []byte) []triton.Tensor {
	var ts []triton.Tensor
	for len(b) >= 3 {
		t := triton.Tensor{Name: fuzzNames[int(b[0])%len(fuzzNames)], DataType: triton.DataType(b[1] % 15)}
		rank := int(b[2] % 4)
		b = b[3:]
		for i := 0; i < rank && len(b) > 0; i++ {
			t.Shape = append(t.Shape, int64(int8(b[0])))
			b = b[1:]
		}
		if len(b) < 2 {
			break
		}
		n := min(int(binary.LittleEndian.Uint16(b)), len(b)-2)
		t.Data = b[2 : 2+n]
		b = b[2+n:]
		ts = append(ts, t)
	}
	return ts
}

// encodeFuzzTensor is decodeFuzzTensors' inverse for one tensor, for the seed corpus.
func encodeFuzzTensor(t triton.Tensor) []byte {
	b := []byte{byte(slices.Index(fuzzNames, t.Name)), byte(t.DataType), byte(len(t.Shape))}
	for _, d := range t.Shape {
		b = append(b, byte(int8(d)))
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(t.Data)))
	return append(b, t.Data...)
}

// FuzzParseRequest decodes arbitrary tensors as a request (tensors → request). It must
// never panic, and a request it accepts must satisfy every rule the batch manager and
// the engines rely on.
func FuzzParseRequest(f *testing.F) {
	seeds := [][]triton.Tensor{
		{i32(inInputIDs, 5, 6, 7), i32(inRequestOutputLen, 4)},
		{str(inTextInput, "Hello"), i32(inMaxTokens, 3), boolean(inStream, true), strs(inStopText, "lo", "x")},
		{i32(inInputIDs, 1, 2), i32(inRequestOutputLen, 2), i32(inBeamWidth, 4), i32(inNumReturnSeqs, 2), f32(inLenPenalty, 1), boolean(inEarlyStopping, false)},
		{i32(inInputIDs, 1), i32(inRequestOutputLen, 2), f32(inTopPDecay, 0.5), f32(inTopPMin, 0.1), i32(inTopPResetIDs, 3), f32(inTemperature, 1)},
		{i32(inInputIDs, 1), i32(inRequestOutputLen, 2), words(inStopWords, []int32{1, 2, 3}, []int32{2, 3, -1}), strs(inBiasWords, "a"), f32(inBiasWeights, 2)},
		{boolean(inStop, true)},
	}
	for _, s := range seeds {
		var b []byte
		for _, t := range s {
			b = append(b, encodeFuzzTensor(t)...)
		}
		f.Add(b)
	}
	lim := testLimits()
	lim.MaxBeamWidth = 4
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseRequest(decodeFuzzTensors(b), nil, lim)
		if err != nil {
			if !strings.Contains(err.Error(), "input") {
				t.Fatalf("error %q names no input", err)
			}
			return
		}
		if p.Stop {
			return
		}
		r := p.Req
		switch {
		case len(r.InputIDs) == 0:
			t.Fatal("accepted an empty prompt")
		case r.MaxNewTokens < 1 || len(r.InputIDs)+r.MaxNewTokens > lim.MaxSeqLen:
			t.Fatalf("accepted %d + %d tokens", len(r.InputIDs), r.MaxNewTokens)
		case r.BeamWidth < 1 || r.BeamWidth > lim.MaxBeamWidth || r.NumReturnSequences < 0:
			t.Fatalf("accepted beam width %d, %d sequences", r.BeamWidth, r.NumReturnSequences)
		case r.BeamWidth > 1 && r.NumReturnSequences > r.BeamWidth:
			t.Fatalf("accepted %d sequences of %d beams", r.NumReturnSequences, r.BeamWidth)
		}
		for _, id := range r.InputIDs {
			if id < 0 || int(id) >= lim.VocabSize {
				t.Fatalf("accepted token %d", id)
			}
		}
		for _, w := range append(slices.Clone(r.StopWords), r.Sampling.BadWords...) {
			if len(w) == 0 {
				t.Fatal("accepted an empty word")
			}
		}
		for _, s := range p.StopStrings {
			if s == "" || !utf8.ValidString(s) {
				t.Fatalf("accepted stop string %q", s)
			}
		}
		if err := r.Sampling.Validate(lim.VocabSize); err != nil {
			t.Fatalf("accepted sampling the engines refuse: %v", err)
		}
	})
}

// FuzzWordList decodes arbitrary [1, 2, L] stop/bad words lists. It must never panic,
// and the words it returns must be non-empty runs of row 0 in the vocabulary.
func FuzzWordList(f *testing.F) {
	f.Add(int64(1), int64(2), int64(3), int32Bytes([]int32{1, 2, 3, 2, 3, -1}))
	f.Add(int64(1), int64(2), int64(2), int32Bytes([]int32{7, 8, 1, -1}))
	f.Add(int64(1), int64(2), int64(4), int32Bytes([]int32{1, 2, 3, 4, 1, -1, 3, 4}))
	f.Fuzz(func(t *testing.T, d0, d1, d2 int64, data []byte) {
		in := inputs{inStopWords: &triton.Tensor{Name: inStopWords, DataType: triton.TypeInt32, Shape: []int64{d0, d1, d2}, Data: data}}
		ws, err := in.wordList(inStopWords, 1000)
		if err != nil {
			if !strings.Contains(err.Error(), inStopWords) {
				t.Fatalf("error %q does not name the input", err)
			}
			return
		}
		total := 0
		for _, w := range ws {
			if len(w) == 0 {
				t.Fatal("an empty word")
			}
			for _, id := range w {
				if id < 0 || id >= 1000 {
					t.Fatalf("token %d outside the vocabulary", id)
				}
			}
			total += len(w)
		}
		if len(ws) > 0 && int64(total) > d2 {
			t.Fatalf("%d tokens of words from a row of %d", total, d2)
		}
	})
}

// FuzzStopStrings streams arbitrary token bytes against arbitrary stop strings. The
// streamed text must be valid UTF-8, must equal the whole answer's text, and must hold
// no stop string.
func FuzzStopStrings(f *testing.F) {
	f.Add("Hello, world! STOP", "STOP", "lo, w", uint8(3))
	f.Add("a\xc3\xa9\xfc\xe2\x82", "\u00e9", "", uint8(1))
	f.Add("xxyxyz", "xyz", "yx", uint8(2))
	f.Fuzz(func(t *testing.T, text, stop1, stop2 string, chunk uint8) {
		var stops []string
		for _, s := range []string{stop1, stop2} {
			if s != "" && utf8.ValidString(s) {
				stops = append(stops, s)
			}
		}
		if len(text) > 256 {
			text = text[:256]
		}
		d := &fakeText{bytes: text}
		ids := make([]int32, len(text))
		for i := range ids {
			ids[i] = int32(i)
		}
		o := newTextOut(d, stops)
		var streamed strings.Builder
		step := max(1, int(chunk%8))
		for i := 0; i < len(ids); i += step {
			end := min(i+step, len(ids))
			streamed.WriteString(o.push(ids[i:end], end == len(ids)))
		}
		if len(ids) == 0 {
			streamed.WriteString(o.push(nil, true))
		}
		got := streamed.String()
		if !utf8.ValidString(got) {
			t.Fatalf("streamed invalid UTF-8 %q", got)
		}
		if whole := wholeText(d, ids, 0, stops); got != whole {
			t.Fatalf("streamed %q, whole %q", got, whole)
		}
		for _, s := range stops {
			if strings.Contains(got, s) {
				t.Fatalf("%q holds stop string %q", got, s)
			}
		}
	})
}

package main

import (
	"encoding/binary"
	"math"
	"time"

	"gollm/batchmanager"
	"gollm/bridge/triton"
)

// output is one tensor of a Triton response, serialized.
type output struct {
	// Name must be one of the model's outputs in config.pbtxt.
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
	// d detokenizes.
	d detokenizer
	// stops cut text_output before the first stop string.
	stops []string
	// seqs hold each streamed sequence's text state, by sequence index.
	seqs map[int]*textOut
}

// stream returns sequence seq's streaming text state.
func (t *textState) stream(seq int) *textOut {
	o := t.seqs[seq]
	if o == nil {
		o = newTextOut(t.d, t.stops)
		if t.seqs == nil {
			t.seqs = map[int]*textOut{}
		}
		t.seqs[seq] = o
	}
	return o
}

// askedOutputs are the optional outputs a request asked for.
type askedOutputs struct {
	// logProbs: cum_log_probs and output_log_probs.
	logProbs bool
	// contextLogits: context_logits.
	contextLogits bool
	// generationLogits: generation_logits.
	generationLogits bool
	// tokenLogprobs: token_logprobs, top_logprobs and top_logprob_ids.
	tokenLogprobs bool
	// topLogprobs is the alternatives per token in top_logprobs and top_logprob_ids.
	topLogprobs int
	// perf: the perf metrics outputs (return_perf_metrics).
	perf bool
	// sequences: sequence_index (num_return_sequences > 1).
	sequences bool
	// finishReason: finish_reason (return_finish_reason).
	finishReason bool
}

// outputSpec is what a request's responses carry.
type outputSpec struct {
	// vocab is the vocabulary size (logits shapes).
	vocab int
	// asked turns on the optional outputs.
	asked askedOutputs
	// want are the outputs the client named; nil means all.
	want map[string]bool
	// text makes text_output; nil when the request does not answer in text.
	text *textState
	// streaming says responses carry new tokens (beams: every generated token).
	streaming bool
	// padID pads the beams of output_ids to one length.
	padID int32
	// promptInOutput says non-streaming output_ids begin with the prompt.
	promptInOutput bool
	// counts are the token counts asked for; nil for none.
	counts *tokenCounts
}

// convertOutputs turns the batch manager's result for one response into Triton outputs,
// each with the batch dimension: output_ids [1, beams, n], sequence_length [1, beams],
// and what the request asked for; only the outputs the client named are kept (all when
// it named none; batch_index only when named), and text_output [beams] (TensorRT-LLM's
// flattened shape) is added for text requests. empty reports a response with no new
// token, no text and no context logits (a streaming request's last, after its end
// token), which a streaming request sends as the final flag alone.
func convertOutputs(res *batchmanager.Result, spec *outputSpec, final bool) (outs []output, empty bool) {
	want := spec.want
	add := func(name string, dt triton.DataType, data []byte, shape ...int64) {
		if want == nil || want[name] {
			outs = append(outs, output{Name: name, DataType: dt, Shape: shape, Data: data})
		}
	}
	vocab := int64(spec.vocab)
	beams := res.Beams
	if beams == nil {
		beams = []batchmanager.BeamResult{{Tokens: res.Tokens[:res.Length], CumLogProb: res.CumLogProb, LogProbs: res.LogProbs, Finish: res.Finish}}
	}
	W := int64(len(beams))
	if len(res.Beams) == 0 && res.Beams != nil {
		W = 0
	}
	if res.Beams == nil {
		// One sequence: its tokens as they are (V1 pads them past Length).
		add(outOutputIDs, triton.TypeInt32, int32Bytes(res.Tokens), 1, 1, int64(len(res.Tokens)))
		add(outSequenceLength, triton.TypeInt32, int32Bytes([]int32{int32(res.Length)}), 1, 1)
	} else {
		longest := 0
		for _, b := range beams {
			longest = max(longest, len(b.Tokens))
		}
		ids := make([]int32, 0, len(beams)*longest)
		lens := make([]int32, len(beams))
		for i, b := range beams {
			ids = append(ids, b.Tokens...)
			for range longest - len(b.Tokens) {
				ids = append(ids, max(spec.padID, 0))
			}
			lens[i] = int32(len(b.Tokens))
		}
		add(outOutputIDs, triton.TypeInt32, int32Bytes(ids), 1, W, int64(longest))
		add(outSequenceLength, triton.TypeInt32, int32Bytes(lens), 1, W)
	}
	if spec.asked.logProbs {
		cums := make([]float32, len(beams))
		longest := 0
		for i, b := range beams {
			cums[i] = b.CumLogProb
			longest = max(longest, len(b.LogProbs))
		}
		lps := make([]float32, 0, len(beams)*longest)
		for _, b := range beams {
			lps = append(lps, b.LogProbs...)
			lps = append(lps, make([]float32, longest-len(b.LogProbs))...)
		}
		add(outCumLogProbs, triton.TypeFP32, float32Bytes(cums), 1, W)
		add(outOutputLogProbs, triton.TypeFP32, float32Bytes(lps), 1, W, int64(longest))
	}
	if spec.asked.contextLogits && res.ContextLogits != nil {
		add(outContextLogits, triton.TypeFP32, float32Bytes(res.ContextLogits), 1, int64(res.PromptLen), vocab)
	}
	if spec.asked.generationLogits {
		rows := int64(len(res.GenerationLogits)) / max(1, vocab)
		add(outGenLogits, triton.TypeFP32, float32Bytes(res.GenerationLogits), 1, 1, rows, vocab)
	}
	if k := spec.asked.topLogprobs; spec.asked.tokenLogprobs && res.Beams == nil {
		rows := int64(len(res.TokenLogprobs))
		add(outTokenLogprobs, triton.TypeFP32, float32Bytes(res.TokenLogprobs), 1, rows)
		add(outTopLogprobs, triton.TypeFP32, float32Bytes(res.TopLogprobs), 1, rows, int64(k))
		add(outTopLogprobIDs, triton.TypeInt32, int32Bytes(res.TopLogprobIDs), 1, rows, int64(k))
	}
	if spec.asked.sequences || want[outSequenceIndex] {
		add(outSequenceIndex, triton.TypeInt32, int32Bytes([]int32{int32(res.SequenceIndex)}), 1, 1)
	}
	if want[outBatchIndex] {
		add(outBatchIndex, triton.TypeInt32, int32Bytes([]int32{0}), 1, 1)
	}
	if spec.asked.perf && res.Perf != nil {
		addPerf(add, res.Perf)
	}
	if spec.asked.finishReason {
		reasons := make([]string, len(beams))
		if ended(res, final) {
			for i, b := range beams {
				reasons[i] = finishReason(b.Finish)
			}
		}
		add(outFinishReason, triton.TypeBytes, bytesElements(reasons), 1, W)
	}
	if c := spec.counts; c != nil {
		if c.Input {
			add(outNumInput, triton.TypeInt32, int32Bytes([]int32{int32(res.PromptLen)}), 1, 1)
		}
		if c.Output {
			add(outNumOutput, triton.TypeInt32, int32Bytes([]int32{int32(c.generated(res, spec.streaming))}), 1, 1)
		}
	}
	empty = true
	for _, b := range beams {
		empty = empty && len(b.Tokens) == 0
	}
	if spec.asked.contextLogits && res.ContextLogits != nil && (want == nil || want[outContextLogits]) {
		// Context logits go with every response, the final one after an end token too,
		// as TensorRT-LLM's do: a client keeps the last response's, and a request that
		// ends at once at its end token has no other response to carry them.
		empty = false
	}
	if spec.text != nil && (want == nil || want[outTextOutput]) {
		texts := make([]string, len(beams))
		for i, b := range beams {
			switch {
			case spec.streaming && res.Beams == nil:
				texts[i] = spec.text.stream(res.SequenceIndex).push(b.Tokens, final || res.SequenceFinal)
			case spec.promptInOutput && !spec.streaming:
				texts[i] = wholeText(spec.text.d, b.Tokens, res.PromptLen, spec.text.stops)
			default:
				texts[i] = wholeText(spec.text.d, b.Tokens, 0, spec.text.stops)
			}
			empty = empty && texts[i] == ""
		}
		outs = append(outs, output{Name: outTextOutput, DataType: triton.TypeBytes, Shape: []int64{W}, Data: bytesElements(texts)})
	}
	return outs, empty
}

// ended says res is the last response of its sequence (or of the request), the one
// that carries why the sequence ended.
func ended(res *batchmanager.Result, final bool) bool {
	return final || res.SequenceFinal
}

// finishReason names why a sequence ended in finish_reason, with the words of vLLM's
// Triton backend and of OpenAI's API, which its clients compare against: an end token,
// a stop word and a stop string are all "stop"; a request ended by the stop input is
// "abort"; "" while the sequence goes on.
func finishReason(f batchmanager.FinishReason) string {
	switch f {
	case batchmanager.FinishedEndID, batchmanager.FinishedStopWord:
		return "stop"
	case batchmanager.FinishedLength:
		return "length"
	case batchmanager.FinishedCancelled:
		return "abort"
	}
	return ""
}

// addPerf adds the perf metrics outputs (TensorRT-LLM's names and types; the three of
// speculative decoding are 0 for a request that proposed nothing).
func addPerf(add func(string, triton.DataType, []byte, ...int64), p *batchmanager.PerfMetrics) {
	ns := func(t time.Time) []byte {
		v := int64(0)
		if !t.IsZero() {
			v = t.UnixNano()
		}
		return binary.LittleEndian.AppendUint64(nil, uint64(v))
	}
	add(outKVAllocNewBlocks, triton.TypeInt32, int32Bytes([]int32{int32(p.NewBlocks)}), 1, 1)
	add(outKVReusedBlocks, triton.TypeInt32, int32Bytes([]int32{int32(p.ReusedBlocks)}), 1, 1)
	add(outKVAllocTotalBlocks, triton.TypeInt32, int32Bytes([]int32{int32(p.NewBlocks + p.ReusedBlocks)}), 1, 1)
	add(outArrivalTime, triton.TypeInt64, ns(p.Arrival), 1, 1)
	add(outFirstScheduledTime, triton.TypeInt64, ns(p.FirstScheduled), 1, 1)
	add(outFirstTokenTime, triton.TypeInt64, ns(p.FirstToken), 1, 1)
	add(outLastTokenTime, triton.TypeInt64, ns(p.LastToken), 1, 1)
	rate := float32(0)
	if p.DraftTokens > 0 {
		rate = float32(p.AcceptedDraftTokens) / float32(p.DraftTokens)
	}
	add(outAcceptanceRate, triton.TypeFP32, float32Bytes([]float32{rate}), 1, 1)
	add(outTotalAcceptedDraftTokens, triton.TypeInt32, int32Bytes([]int32{int32(p.AcceptedDraftTokens)}), 1, 1)
	add(outTotalDraftTokens, triton.TypeInt32, int32Bytes([]int32{int32(p.DraftTokens)}), 1, 1)
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

// bytesElements serializes BYTES elements: each a 4-byte little-endian length, then
// its bytes.
func bytesElements(ss []string) []byte {
	var b []byte
	for _, s := range ss {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return b
}

// tokenCounts are the token counts a request asked for (return_num_input_tokens,
// return_num_output_tokens: the names Triton's OpenAI frontend uses).
type tokenCounts struct {
	// Input adds num_input_tokens, the prompt's length in tokens, to every response.
	Input bool
	// Output adds num_output_tokens: the tokens generated in this response (streaming)
	// or in all (otherwise); the end token is not counted, as output_ids leaves it out.
	Output bool
}

// generated is num_output_tokens for res. A streaming response of one sequence counts
// its new tokens; otherwise (the whole answer, or a beam search's streamed beams, which
// repeat every token) it is the sequence's generated tokens so far.
func (c *tokenCounts) generated(res *batchmanager.Result, streaming bool) int {
	if streaming && res.Beams == nil {
		return res.Length
	}
	return res.Generated
}

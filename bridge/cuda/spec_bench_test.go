package cuda

import (
	"fmt"
	"testing"

	"gollm/engine"
)

// BenchmarkVerifyOnHost and BenchmarkVerifyInRows are the host's share of verifying one
// sequence's four proposals at the vocabularies of the Austen model and Llama-3, greedy:
// on the host, the flattened arrays, the five rows' logits handed out and
// engine.Sampler.Verify run over them (the copy of those logits off the GPU, and the
// eager step that returns them, come on top); in rows, the arrays of five one-token rows
// and the acceptance from their sampled tokens.
func BenchmarkVerifyOnHost(b *testing.B) {
	for _, V := range []int{4096, 128256} {
		b.Run(fmt.Sprintf("vocab=%d", V), func(b *testing.B) { verifyBench(b, V, false) })
	}
}

func BenchmarkVerifyInRows(b *testing.B) {
	for _, V := range []int{4096, 128256} {
		b.Run(fmt.Sprintf("vocab=%d", V), func(b *testing.B) { verifyBench(b, V, true) })
	}
}

func verifyBench(b *testing.B, V int, rows bool) {
	const k, pos = 4, 300
	info := engine.Info{VocabSize: V, MaxSeqLen: 1024, NumBlocks: 16, TokensPerBlock: 64, MaxDraft: engine.MaxDraftTokens}
	hist := make([]int32, pos+k+1)
	for i := range hist {
		hist[i] = int32(i % 50)
	}
	sq := engine.Sequence{ID: 1, Tokens: hist[pos:], Pos: pos, Blocks: []int32{0, 1, 2, 3, 4, 5}, Sample: true,
		History: hist, NumGenerated: 10, Draft: k}
	if !rows {
		sq.ReturnLogits = true // keeps the verification on the host
	}
	batch := &engine.Batch{Seqs: []engine.Sequence{sq}}
	e := &Engine{info: info, verifier: engine.NewSampler(V)}
	var p stepPrep
	p.init(V)
	outs := make([]engine.Output, 1)
	logits := make([]float32, (k+1)*V)
	for i := range logits {
		logits[i] = float32(i%97) / 10
	}
	b.ReportAllocs()
	for b.Loop() {
		parts := splitBatch(batch, 8192, 256)
		for _, part := range parts {
			p.build(batch, part, info)
			for i := range p.outTok {
				p.outTok[i] = 7 // every proposal kept, then 7
				if pos+1+i < len(hist) {
					p.outTok[i] = hist[pos+1+i]
				}
			}
			p.collect(batch, part, logits[:p.logitsLen], outs, V)
		}
		if err := e.verifyDrafts(batch, outs, parts); err != nil {
			b.Fatal(err)
		}
	}
}

package cpu

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// BenchmarkDecodeDemoShape measures one decode step (forward pass, LM head and greedy
// sampling) of a random model with the demo checkpoint's shape: 4 layers, hidden 256,
// 4 heads, vocabulary 50257, 1024 positions. Every sequence has 128 tokens cached.
// Run with -cpu 1 for the single-core figure; each kernel path (pure Go, AVX2) is
// measured.
func BenchmarkDecodeDemoShape(b *testing.B) {
	m := randomGPT2(50257, 1024, 256, 4, 4, 7)
	const context, perBlock = 128, 64
	for _, batch := range []int{1, 8} {
		for _, path := range kernelPaths(b) {
			b.Run(fmt.Sprintf("batch=%d/%s", batch, strings.ReplaceAll(strings.TrimPrefix(path.name, "the "), " ", "_")), func(b *testing.B) {
				path.use(b)
				blocksPer := (context + 1 + perBlock - 1) / perBlock
				e := newCPU(b, m, batch*blocksPer, perBlock)
				rng := rand.New(rand.NewPCG(8, 8))
				seqs := make([]Sequence, batch)
				for i := range seqs {
					blocks := make([]int32, blocksPer)
					for j := range blocks {
						blocks[j] = int32(i*blocksPer + j)
					}
					prompt := randomTokens(rng, context, 50257)
					seqs[i] = Sequence{ID: uint64(i), Tokens: prompt, Blocks: blocks}
				}
				mustStep(b, e, seqs...)
				for i := range seqs {
					seqs[i].Tokens = []int32{int32(i)}
					seqs[i].Pos = context
					seqs[i].Sample = true
					seqs[i].History = []int32{int32(i)}
				}
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					mustStep(b, e, seqs...)
				}
				ms := float64(time.Since(start).Microseconds()) / 1000 / float64(b.N)
				b.ReportMetric(ms, "ms/step")
				b.ReportMetric(ms/float64(batch), "ms/token")
			})
		}
	}
}

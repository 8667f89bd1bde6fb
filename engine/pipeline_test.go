package engine

import (
	"math/bits"
	"testing"
)

// echoEngine samples, for each row, the first token its mask allows, else its last new
// token plus one.
type echoEngine struct{}

func (echoEngine) Info() Info   { return Info{VocabSize: 128} }
func (echoEngine) Close() error { return nil }
func (echoEngine) Step(b *Batch) ([]Output, error) {
	outs := make([]Output, len(b.Seqs))
	for i, s := range b.Seqs {
		outs[i].Token = s.Tokens[len(s.Tokens)-1] + 1
		for w, x := range s.Allowed {
			if x != 0 {
				outs[i].Token = int32(w*64 + bits.TrailingZeros64(x))
				break
			}
		}
	}
	return outs, nil
}

// TestSyncPipelineTakesMasksLate checks LateMasker's order on SyncPipeline: a late launch
// runs at SupplyMasks with its masks, fed from the launch before it even once that one
// was waited for; no launch comes before its masks; a wait for it without them fails.
func TestSyncPipelineTakesMasksLate(t *testing.T) {
	p := NewSyncPipeline(echoEngine{})
	if err := p.Launch(&Batch{Seqs: []Sequence{{Tokens: []int32{5}, Sample: true}}}); err != nil {
		t.Fatal(err)
	}
	late := &Batch{Seqs: []Sequence{{Tokens: []int32{0}, History: []int32{5, 0}, Sample: true, Feed: 1, LateMask: true}}}
	if err := p.Launch(late); err != nil {
		t.Fatal(err)
	}
	if err := p.Launch(&Batch{Seqs: []Sequence{{Tokens: []int32{1}, Sample: true}}}); err == nil {
		t.Fatal("a launch before the masks of the launch before it was accepted")
	}
	outs, err := p.Wait()
	if err != nil || outs[0].Token != 6 {
		t.Fatalf("first launch: %v, %v; want token 6", outs, err)
	}
	mask := make([]uint64, MaskWords(128))
	mask[1] = 1 << 3 // token 67
	late.Seqs[0].Allowed = mask
	if err := p.SupplyMasks(late); err != nil {
		t.Fatal(err)
	}
	if outs, err = p.Wait(); err != nil || outs[0].Token != 67 {
		t.Fatalf("late launch: %v, %v; want token 67 (its mask)", outs, err)
	}
	// Fed from the launch before, masked late, no mask given: its fed token plus one.
	if err := p.Launch(&Batch{Seqs: []Sequence{{Tokens: []int32{9}, Sample: true}}}); err != nil {
		t.Fatal(err)
	}
	late.Seqs[0].Allowed = nil
	if err := p.Launch(late); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := p.SupplyMasks(late); err != nil {
		t.Fatal(err)
	}
	if outs, err = p.Wait(); err != nil || outs[0].Token != 11 {
		t.Fatalf("late launch without masks: %v, %v; want token 11", outs, err)
	}
	// Never supplied: its wait fails, and the pipeline is empty after.
	if err := p.Launch(&Batch{Seqs: []Sequence{{Tokens: []int32{1}, Sample: true, LateMask: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err == nil {
		t.Fatal("a wait for a launch whose masks never came returned outputs")
	}
	if _, err := p.Wait(); err == nil {
		t.Fatal("a wait on an empty pipeline returned outputs")
	}
}

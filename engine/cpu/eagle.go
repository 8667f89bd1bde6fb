package cpu

import (
	"errors"
	"fmt"
	"math"

	"gollm/engine"
	"gollm/model"
)

// Eagle3 runs an EAGLE-3 head (model.Eagle3) on the CPU: its one decoder layer over a
// paged KV pool of its own, laid out [block][K,V][kv head][slot][head dim], in float32
// (engine.Head). Per row: the feature (fc of the target's three states) or the head's own
// previous output x; e, the embedding of the row's token; a = [norm(e), norm(x)]; Q, K, V
// from a (rotated at the row's position); attention over the sequence's positions so far;
// h = x + O·attention; out = h + MLP(norm(h)); logits = LM head(norm(out)).
type Eagle3 struct {
	// h is the head's weights; embed the embedding it reads [vocab][hidden].
	h     *model.Eagle3
	embed []float32
	// info is what HeadInfo returns.
	info engine.HeadInfo
	// invFreq are the rotary frequencies [head dim/2].
	invFreq []float32
	// kv is the pool.
	kv []float32
	// x, e, a, q, k, v, att, h1, n, gate, up are one row's scratch.
	x, e, a, q, k, v, att, h1, n, gate, up, scores []float32
}

// NewEagle3 makes a head on h for a target of targetLayers layers whose embedding is
// targetEmbed [vocab][hidden] (used when the head has none of its own), with a pool of
// kv.NumBlocks blocks of kv.TokensPerBlock positions (MaxSeqLen 0: the head's maximum).
func NewEagle3(h *model.Eagle3, targetLayers int, targetEmbed []float32, kv engine.KVConfig) (*Eagle3, error) {
	c := &h.Config
	aux, err := h.AuxLayersFor(targetLayers)
	if err != nil {
		return nil, err
	}
	embed := h.Embed
	if embed == nil {
		if len(targetEmbed) != c.VocabSize*c.Hidden {
			return nil, fmt.Errorf("EAGLE-3 head: it has no embedding of its own, and the target's holds %d values, not vocabulary %d × hidden %d (a head must be the target's)",
				len(targetEmbed), c.VocabSize, c.Hidden)
		}
		embed = targetEmbed
	}
	if kv.NumBlocks < 1 || kv.TokensPerBlock < 1 {
		return nil, errors.New("EAGLE-3 head: the KV pool needs at least one block of one position")
	}
	maxLen := kv.MaxSeqLen
	if maxLen == 0 {
		maxLen = c.MaxPositions
	}
	perBlock := int64(kv.TokensPerBlock) * 2 * int64(c.KVHeads) * int64(c.HeadDim)
	if int64(kv.NumBlocks) > maxKVFloats/perBlock {
		return nil, fmt.Errorf("EAGLE-3 head: a KV pool of %d blocks × %d floats is too large", kv.NumBlocks, perBlock)
	}
	e := &Eagle3{h: h, embed: embed, invFreq: c.Rope.InvFreq(), kv: make([]float32, int64(kv.NumBlocks)*perBlock)}
	e.info = engine.HeadInfo{Hidden: c.Hidden, TargetHidden: c.TargetHidden, Features: len(aux) * c.TargetHidden,
		AuxLayers: aux, DraftVocab: c.DraftVocab, D2T: h.D2T,
		NumBlocks: kv.NumBlocks, TokensPerBlock: kv.TokensPerBlock, MaxSeqLen: maxLen}
	H, D := c.Hidden, c.HeadDim
	e.x, e.e, e.a = make([]float32, H), make([]float32, H), make([]float32, 2*H)
	e.q, e.k, e.v = make([]float32, c.Heads*D), make([]float32, c.KVHeads*D), make([]float32, c.KVHeads*D)
	e.att, e.h1, e.n = make([]float32, c.Heads*D), make([]float32, H), make([]float32, H)
	e.gate, e.up, e.scores = make([]float32, c.Inner), make([]float32, c.Inner), make([]float32, maxLen)
	return e, nil
}

// HeadInfo describes the head (engine.Head).
func (e *Eagle3) HeadInfo() engine.HeadInfo { return e.info }

// Close frees the pool (engine.Head).
func (e *Eagle3) Close() error {
	e.kv = nil
	return nil
}

// kvAt is the offset of (block, kind, kv head)'s slot 0.
func (e *Eagle3) kvAt(block, kind, head int) int {
	c := &e.h.Config
	return ((block*2+kind)*c.KVHeads + head) * e.info.TokensPerBlock * c.HeadDim
}

// Forward runs rows in order (engine.Head).
func (e *Eagle3) Forward(rows []engine.HeadRow) error {
	if e.kv == nil {
		return errors.New("EAGLE-3 head: Forward after Close")
	}
	c := &e.h.Config
	H, D, T := c.Hidden, c.HeadDim, e.info.TokensPerBlock
	for i := range rows {
		r := &rows[i]
		switch {
		case r.Token < 0 || int(r.Token) >= c.VocabSize:
			return fmt.Errorf("EAGLE-3 head: row %d: token %d outside the vocabulary", i, r.Token)
		case r.Pos < 0 || r.Pos >= e.info.MaxSeqLen || len(r.Blocks)*T <= r.Pos:
			return fmt.Errorf("EAGLE-3 head: row %d: position %d outside its %d blocks (or the head's %d positions)", i, r.Pos, len(r.Blocks), e.info.MaxSeqLen)
		case r.Feature == nil && len(r.Own) != H || r.Feature != nil && len(r.Feature) != e.info.Features:
			return fmt.Errorf("EAGLE-3 head: row %d: a feature of %d or an own state of %d values", i, len(r.Feature), len(r.Own))
		case len(r.Out) != H || r.Logits != nil && len(r.Logits) != c.DraftVocab:
			return fmt.Errorf("EAGLE-3 head: row %d: output of %d and logits of %d values", i, len(r.Out), len(r.Logits))
		}
		for _, b := range r.Blocks[:r.Pos/T+1] {
			if b < 0 || int(b) >= e.info.NumBlocks {
				return fmt.Errorf("EAGLE-3 head: row %d: block %d outside the pool [0, %d)", i, b, e.info.NumBlocks)
			}
		}
		if r.Feature != nil {
			matmul([][]float32{e.x}, [][]float32{r.Feature}, e.h.FC, len(r.Feature), H, nil)
		} else {
			copy(e.x, r.Own)
		}
		rmsNorm(e.a[:H], e.embed[int(r.Token)*H:(int(r.Token)+1)*H], e.h.InputNorm, c.NormEps)
		rmsNorm(e.a[H:], e.x, e.h.HiddenNorm, c.NormEps)
		matmul([][]float32{e.q}, [][]float32{e.a}, e.h.Q, 2*H, c.Heads*D, nil)
		matmul([][]float32{e.k}, [][]float32{e.a}, e.h.K, 2*H, c.KVHeads*D, nil)
		matmul([][]float32{e.v}, [][]float32{e.a}, e.h.V, 2*H, c.KVHeads*D, nil)
		e.rotate(e.q, c.Heads, r.Pos)
		e.rotate(e.k, c.KVHeads, r.Pos)
		blk, slot := int(r.Blocks[r.Pos/T]), r.Pos%T
		for h := range c.KVHeads {
			copy(e.kv[e.kvAt(blk, 0, h)+slot*D:][:D], e.k[h*D:(h+1)*D])
			copy(e.kv[e.kvAt(blk, 1, h)+slot*D:][:D], e.v[h*D:(h+1)*D])
		}
		e.attend(r)
		matmul([][]float32{e.h1}, [][]float32{e.att}, e.h.O, c.Heads*D, H, nil)
		for j := range e.h1 {
			e.h1[j] += e.x[j]
		}
		rmsNorm(e.n, e.h1, e.h.PostNorm, c.NormEps)
		matmul([][]float32{e.gate}, [][]float32{e.n}, e.h.Gate, H, c.Inner, nil)
		matmul([][]float32{e.up}, [][]float32{e.n}, e.h.Up, H, c.Inner, nil)
		for j, g := range e.gate {
			e.gate[j] = g / float32(1+math.Exp(-float64(g))) * e.up[j]
		}
		matmul([][]float32{r.Out}, [][]float32{e.gate}, e.h.Down, c.Inner, H, nil)
		for j := range r.Out {
			r.Out[j] += e.h1[j]
		}
		if r.Logits != nil {
			rmsNorm(e.n, r.Out, e.h.FinalNorm, c.NormEps)
			matmul([][]float32{r.Logits}, [][]float32{e.n}, e.h.LMHead, H, c.DraftVocab, nil)
		}
	}
	return nil
}

// rotate applies the rotary embedding at pos to heads heads of x (rotate_half pairs).
func (e *Eagle3) rotate(x []float32, heads, pos int) {
	D, half := e.h.Config.HeadDim, len(e.invFreq)
	for i, f := range e.invFreq {
		ang := float64(f * float32(pos))
		cs, sn := float32(math.Cos(ang)), float32(math.Sin(ang))
		for h := range heads {
			y := x[h*D : h*D+2*half]
			a, b := y[i], y[i+half]
			y[i] = a*cs - b*sn
			y[i+half] = b*cs + a*sn
		}
	}
}

// attend computes causal attention for row r over its positions 0..Pos into e.att.
func (e *Eagle3) attend(r *engine.HeadRow) {
	c := &e.h.Config
	D, T := c.HeadDim, e.info.TokensPerBlock
	group := c.Heads / c.KVHeads
	scale := float32(1 / math.Sqrt(float64(D)))
	sc := e.scores[:r.Pos+1]
	for h := range c.Heads {
		kvh := h / group
		q := e.q[h*D : (h+1)*D]
		best := float32(math.Inf(-1))
		for t := 0; t <= r.Pos; t++ {
			at := e.kvAt(int(r.Blocks[t/T]), 0, kvh) + (t%T)*D
			s := dot(q, e.kv[at:at+D]) * scale
			sc[t] = s
			best = max(best, s)
		}
		var sum float32
		for t, s := range sc {
			p := float32(math.Exp(float64(s - best)))
			sc[t] = p
			sum += p
		}
		out := e.att[h*D : (h+1)*D]
		clear(out)
		for t, p := range sc {
			at := e.kvAt(int(r.Blocks[t/T]), 1, kvh) + (t%T)*D
			axpy(out, p/sum, e.kv[at:at+D])
		}
	}
}

// Embedding is the model's token embedding [vocab][hidden] in float32 (read-only): an
// EAGLE-3 head without its own reads the target's. Stored in float32 on the Go heap
// (NewWeights) it is the weights' own; otherwise a float32 copy, which outlives the
// mappings LoadWeights made when the weights are released.
func (w *Weights) Embedding() []float32 {
	m := w.embed
	if len(m.parts) == 1 && m.parts[0].f == fmtF32 && m.parts[0].perm == nil && w.ckpt == nil && w.bufs == nil {
		return m.parts[0].f32
	}
	out := make([]float32, m.rows*m.cols)
	for r := range m.rows {
		m.row(r, out[r*m.cols:(r+1)*m.cols])
	}
	return out
}

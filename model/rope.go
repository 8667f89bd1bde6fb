package model

import "math"

// InvFreq returns the rotary embedding's frequencies, one per rotated pair [Dim/2]:
// position p rotates pair i by the angle float32(InvFreq[i] · p). Both engines take
// them from here, so the scaling rules live in one place. They follow transformers'
// arithmetic (float32, as its rope initialisers compute them) so that the angles agree
// with its to the last bit or so.
//
// Under longrope they are the set of sequences within the original context (the short
// factors); LongInvFreq gives the other.
func (r Rope) InvFreq() []float32 {
	if r.Kind == RopeLongRope {
		return r.longRopeFreqs(r.LongRope.Short)
	}
	half := r.Dim / 2
	inv := make([]float32, half)
	for i := range inv {
		exp := float32(2*i) / float32(r.Dim)
		inv[i] = float32(1 / float64(float32(math.Pow(r.Theta, float64(exp)))))
	}
	switch r.Kind {
	case RopeLinear:
		for i := range inv {
			inv[i] = float32(float64(inv[i]) / r.Factor)
		}
	case RopeLlama3:
		// Wavelengths longer than the original context over low_freq_factor are divided
		// by factor, those shorter than it over high_freq_factor kept, and the band
		// between interpolated smoothly.
		old := float64(r.OriginalMaxPositions)
		lowWave, highWave := old/r.LowFreqFactor, old/r.HighFreqFactor
		for i, f := range inv {
			wave := 2 * math.Pi / float64(f)
			switch {
			case wave < highWave:
			case wave > lowWave:
				inv[i] = float32(float64(f) / r.Factor)
			default:
				smooth := (old/wave - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
				inv[i] = float32((1-smooth)*float64(f)/r.Factor + smooth*float64(f))
			}
		}
	}
	return inv
}

// LongInvFreq returns longrope's frequencies of sequences longer than the original
// context (the long factors); nil under any other scaling.
func (r Rope) LongInvFreq() []float32 {
	if r.Kind != RopeLongRope {
		return nil
	}
	return r.longRopeFreqs(r.LongRope.Long)
}

// UsesLong says whether a sequence of seqLen positions takes LongInvFreq: under longrope,
// when it is longer than the original context. transformers decides it for a whole
// forward pass by the sequence's length after it, keeping the keys cached before as they
// were; an engine that decides per sequence and step by its length after the step
// matches that (a prompt cut into chunks takes each chunk's set by its own end).
func (r Rope) UsesLong(seqLen int) bool {
	return r.Kind == RopeLongRope && seqLen > r.OriginalMaxPositions
}

// CosSinScale is the factor cos and sin are multiplied by: longrope's attention factor,
// 1 otherwise.
func (r Rope) CosSinScale() float32 {
	if r.Kind == RopeLongRope {
		return float32(r.LongRope.AttnFactor)
	}
	return 1
}

// longRopeFreqs is longrope's 1 / (factor[i] · θ^(2i/d)), each step in float32 as
// transformers' initialiser computes it.
func (r Rope) longRopeFreqs(factors []float64) []float32 {
	inv := make([]float32, r.Dim/2)
	for i := range inv {
		exp := float32(2*i) / float32(r.Dim)
		inv[i] = 1 / (float32(factors[i]) * float32(math.Pow(r.Theta, float64(exp))))
	}
	return inv
}

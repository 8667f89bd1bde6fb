package model

import "math"

// InvFreq returns the rotary embedding's frequencies, one per rotated pair [Dim/2]:
// position p rotates pair i by the angle float32(InvFreq[i] · p). Both engines take
// them from here, so the scaling rules live in one place. They follow transformers'
// arithmetic (float32, as its rope initialisers compute them) so that the angles agree
// with its to the last bit or so.
func (r Rope) InvFreq() []float32 {
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
	case RopeDivisors:
		for i := range inv {
			inv[i] = float32(float64(inv[i]) / float64(r.Divisors[i]))
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

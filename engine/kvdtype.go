package engine

import (
	"fmt"
	"math"
	"strings"
)

// KVDType is the element type of an engine's KV pool.
type KVDType uint8

const (
	// KVAuto stores keys and values in the engine's compute type: float32 on the CPU
	// engine, float16 or bfloat16 on the GPU.
	KVAuto KVDType = iota
	// KVFP8 stores them as float8_e4m3fn, each layer's keys divided by its key scale and
	// its values by its value scale (KVConfig.KScales, VScales; 1 where none is given),
	// rounded to nearest even and saturated at ±448: a quarter of the CPU pool's bytes,
	// half of the GPU's. Attention reads them back times the scale.
	KVFP8
)

// String names the type as kv_cache_dtype does.
func (d KVDType) String() string {
	if d == KVFP8 {
		return "fp8"
	}
	return "auto"
}

// ParseKVDType reads a kv_cache_dtype value: auto (or empty), or fp8 (fp8_e4m3). vLLM's
// names, so that a setting carries over; fp8_e5m2 is refused by name, its two mantissa
// bits halving e4m3's precision for a range the scales already give.
func ParseKVDType(s string) (KVDType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return KVAuto, nil
	case "fp8", "fp8_e4m3":
		return KVFP8, nil
	case "fp8_e5m2":
		return KVAuto, fmt.Errorf("%q is not supported: gollm's FP8 KV cache is float8_e4m3fn (fp8, fp8_e4m3) with per-layer scales", s)
	}
	return KVAuto, fmt.Errorf("%q: want auto or fp8 (fp8_e4m3)", s)
}

// checkScales says whether scales (one per layer, or none) can scale an FP8 KV pool of
// layers layers: each a finite positive number.
func checkScales(what string, scales []float32, layers int) error {
	if scales == nil {
		return nil
	}
	if len(scales) != layers {
		return fmt.Errorf("KVConfig.%s: %d scales for %d layers", what, len(scales), layers)
	}
	for l, s := range scales {
		if !(s > 0) || math.IsInf(float64(s), 1) {
			return fmt.Errorf("KVConfig.%s: layer %d's scale %g is not a finite positive number", what, l, s)
		}
	}
	return nil
}

// CheckScales checks the KV scales of kv for a model of layers layers.
func (kv *KVConfig) CheckScales(layers int) error {
	if err := checkScales("KScales", kv.KScales, layers); err != nil {
		return err
	}
	return checkScales("VScales", kv.VScales, layers)
}

// Scale returns scales[l], or 1 where there are none.
func Scale(scales []float32, l int) float32 {
	if scales == nil {
		return 1
	}
	return scales[l]
}

package cuda

import (
	"strings"
	"testing"

	"gollm/engine"
	"gollm/model"
)

// TestNewEngineChecksTheKVPool: a KV type other than auto and fp8, and FP8 scales that do
// not fit the model (a count other than its layers, a scale that is not a finite positive
// number), are refused before the library is called, naming what is wrong.
func TestNewEngineChecksTheKVPool(t *testing.T) {
	w := &Weights{cfg: model.Config{Layers: 2}}
	for _, c := range []struct {
		o    Options
		says string
	}{
		{Options{KVDType: 7}, "KVDType 7 is neither auto nor fp8"},
		{Options{KVDType: engine.KVFP8, KScales: []float32{1}}, "KVConfig.KScales: 1 scales for 2 layers"},
		{Options{KVDType: engine.KVFP8, VScales: []float32{1, 0}}, "layer 1's scale 0 is not a finite positive number"},
	} {
		if _, err := NewEngine(w, c.o); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: %v; want an error saying %q", c.o.KVDType, err, c.says)
		}
	}
}

// TestKVScalesLayout: gollm_engine_params.kv_scales is [layers][2], key then value, 1
// where a model has no scales.
func TestKVScalesLayout(t *testing.T) {
	got := kvScales([]float32{0.5, 2}, []float32{3, 0.25}, 2)
	want := []float32{0.5, 3, 2, 0.25}
	for i := range want {
		if float32(got[i]) != want[i] {
			t.Fatalf("kvScales: %v, want %v", got, want)
		}
	}
	for i, v := range kvScales(nil, nil, 3) {
		if float32(v) != 1 {
			t.Fatalf("kvScales(nil): element %d is %g", i, float32(v))
		}
	}
}

package engine

import (
	"math"
	"strings"
	"testing"
)

func TestParseKVDType(t *testing.T) {
	for in, want := range map[string]KVDType{"": KVAuto, "auto": KVAuto, " AUTO ": KVAuto, "fp8": KVFP8, "FP8_E4M3": KVFP8} {
		if got, err := ParseKVDType(in); err != nil || got != want {
			t.Errorf("ParseKVDType(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, says := range map[string]string{"fp8_e5m2": "float8_e4m3fn", "fp16": "want auto or fp8", "int8": "want auto or fp8"} {
		if _, err := ParseKVDType(in); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("ParseKVDType(%q): %v; want an error saying %q", in, err, says)
		}
	}
	if KVFP8.String() != "fp8" || KVAuto.String() != "auto" {
		t.Errorf("names %q, %q", KVFP8, KVAuto)
	}
}

func TestKVScalesChecked(t *testing.T) {
	inf := float32(math.Inf(1))
	for _, c := range []struct {
		k, v []float32
		says string
	}{
		{nil, nil, ""},
		{[]float32{1, 0.5}, []float32{2, 3}, ""},
		{[]float32{1}, nil, "1 scales for 2 layers"},
		{nil, []float32{1, -1}, "layer 1's scale -1"},
		{[]float32{inf, 1}, nil, "layer 0's scale +Inf"},
		{[]float32{1, float32(math.NaN())}, nil, "layer 1's scale NaN"},
	} {
		kv := KVConfig{KScales: c.k, VScales: c.v}
		err := kv.CheckScales(2)
		if c.says == "" && err != nil || c.says != "" && (err == nil || !strings.Contains(err.Error(), c.says)) {
			t.Errorf("%v, %v: %v; want %q", c.k, c.v, err, c.says)
		}
	}
	if Scale(nil, 3) != 1 || Scale([]float32{2, 4}, 1) != 4 {
		t.Error("Scale")
	}
}

package cuda

import (
	"strings"
	"testing"
)

// TestAllReduceRejectsBadInput: no devices, or a payload type the all-reduce does not
// carry, fail with what is wrong before the library is called.
func TestAllReduceRejectsBadInput(t *testing.T) {
	if _, err := NewAllReduceComm(nil, ""); err == nil || !strings.Contains(err.Error(), "no devices") {
		t.Fatalf("NewAllReduceComm(nil) = %v", err)
	}
	var c AllReduceComm
	if _, err := c.Run(AllReduceParams{DType: "float32", Rows: 1, Hidden: 8}); err == nil || !strings.Contains(err.Error(), `"float32"`) {
		t.Fatalf("Run with float32 = %v", err)
	}
	for m, want := range map[AllReduceMethod]string{AllReduceCustom: "custom", AllReduceNCCLF32: "nccl-f32", AllReduceNCCL: "nccl",
		AllReduceTwoShot: "two-shot", 7: "method 7"} {
		if m.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(m), m.String(), want)
		}
	}
}

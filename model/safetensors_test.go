package model

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeHeaderFile writes a safetensors file of header h and data bytes of zeros.
func writeHeaderFile(t *testing.T, path, h string, data int) {
	t.Helper()
	raw := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	raw = append(append(raw, h...), make([]byte, data)...)
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// emptyTensors is a header of n zero-size tensors named prefix.0, prefix.1, ….
func emptyTensors(prefix string, n int) string {
	var b bytes.Buffer
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"%s.%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}`, prefix, i)
	}
	b.WriteString("}")
	return b.String()
}

func TestSafetensorsHeaderBounds(t *testing.T) {
	dir := t.TempDir()
	t.Run("a header over 100 MiB names that bound, not the file's size", func(t *testing.T) {
		// A sparse file: its length field claims 110,690,320 bytes of header, and it is
		// longer than that, as the file was.
		path := filepath.Join(dir, "big.safetensors")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(binary.LittleEndian.AppendUint64(nil, 110690320)); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(140093976); err != nil {
			t.Fatal(err)
		}
		f.Close()
		_, err = openSafetensors(path)
		if err == nil || !strings.Contains(err.Error(), "header of 110690320 bytes is over the bound of 104857600 bytes (100 MiB)") {
			t.Fatalf("err = %v, want the 100 MiB bound named", err)
		}
	})
	t.Run("more tensors than a checkpoint may hold are refused, naming the bound, in bounded time", func(t *testing.T) {
		path := filepath.Join(dir, "many.safetensors")
		writeHeaderFile(t, path, emptyTensors("t", maxTensors+1), 0)
		start := time.Now()
		_, err := openSafetensors(path)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d tensors in the checkpoint", maxTensors)) {
			t.Fatalf("err = %v, want the tensor bound named", err)
		}
		// Measured: about a second on a 2-core machine; the bound catches a quadratic walk.
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("refusing %d tensors took %v", maxTensors+1, d)
		}
	})
	t.Run("the tensor and byte bounds hold across a checkpoint's files", func(t *testing.T) {
		a, b := filepath.Join(dir, "a.safetensors"), filepath.Join(dir, "b.safetensors")
		writeHeaderFile(t, a, emptyTensors("a", 6), 0)
		writeHeaderFile(t, b, emptyTensors("b", 6), 0)
		budget := &headerBudget{tensors: 10, bytes: 1 << 20}
		if _, err := openSafetensorsWithin(a, budget); err != nil {
			t.Fatal(err)
		}
		if _, err := openSafetensorsWithin(b, budget); err == nil || !strings.Contains(err.Error(), "tensors in the checkpoint") {
			t.Fatalf("the second file: err = %v, want the tensor bound", err)
		}
		budget = &headerBudget{tensors: 100, bytes: 500}
		if _, err := openSafetensorsWithin(a, budget); err != nil {
			t.Fatal(err)
		}
		if _, err := openSafetensorsWithin(b, budget); err == nil || !strings.Contains(err.Error(), "over the bound of 268435456 bytes (256 MiB) on all its files' headers") {
			t.Fatalf("the second file: err = %v, want the checkpoint's header bound", err)
		}
	})
	for _, tc := range []struct {
		name, header, want string
	}{
		{"a shape of more dimensions than any tensor has is refused before it is read",
			`{"x":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}`, "more than 8 dimensions"},
		{"long data_offsets are refused before they are read",
			`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4,4]}}`, "data_offsets must be [begin, end]"},
		{"a name given twice is refused",
			`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, "tensor x appears twice"},
		{"data after the header's object is refused",
			`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} {}`, "not valid JSON"},
		{"a header that is not an object is refused",
			`[1, 2]`, "not an object"},
		{"an unknown field of an entry is refused",
			`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}}`, `unknown field "extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "bad.safetensors")
			writeHeaderFile(t, path, tc.header, 4)
			_, err := openSafetensors(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
	t.Run("trailing spaces, metadata and a scalar read as before", func(t *testing.T) {
		path := filepath.Join(dir, "ok.safetensors")
		writeHeaderFile(t, path, `{"__metadata__":{"format":"pt"},"s":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}    `, 4)
		st, err := openSafetensors(path)
		if err != nil {
			t.Fatal(err)
		}
		defer st.close()
		if st.metadata["format"] != "pt" || len(st.tensors) != 1 || len(st.tensors["s"].Shape) != 0 {
			t.Errorf("read %+v, %+v", st.metadata, st.tensors)
		}
	})
}

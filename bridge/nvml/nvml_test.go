package nvml

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const fakeUUID = "GPU-00000000-1111-2222-3333-444444444444"

// fakeLibrary compiles testdata/fake_nvml.c, a one-GPU stand-in for libnvidia-ml.
func fakeLibrary(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build the fake NVML")
	}
	out := filepath.Join(t.TempDir(), "libfake-nvml.so")
	if b, err := exec.Command(cc, "-shared", "-fPIC", "-o", out, "testdata/fake_nvml.c").CombinedOutput(); err != nil {
		t.Fatalf("build the fake NVML: %v\n%s", err, b)
	}
	return out
}

func TestOpenWithoutTheLibrary(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "libnvidia-ml.so.1"))
	if err == nil || !strings.Contains(err.Error(), "cannot load") || !strings.Contains(err.Error(), "libnvidia-ml.so.1") {
		t.Fatalf("Open of a missing library: %v; want an error naming it", err)
	}
}

func TestFakeGPU(t *testing.T) {
	l, err := Open(fakeLibrary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.DeviceByUUID("GPU-ffffffff-0000-0000-0000-000000000000"); err == nil || !strings.Contains(err.Error(), "Not Found") {
		t.Errorf("an unknown UUID: %v, want NVML's Not Found", err)
	}
	d, err := l.DeviceByUUID(fakeUUID)
	if err != nil {
		t.Fatal(err)
	}
	if name, err := d.Name(); err != nil || name != "Fake GPU 80GB" {
		t.Errorf("Name() = %q, %v", name, err)
	}
	r, err := d.Read()
	if err != nil {
		t.Fatalf("Read: %v (power is unsupported, which is no error)", err)
	}
	want := Reading{MemoryTotal: 80 << 30, MemoryUsed: 30 << 30, Utilization: 0.42, HasUtilization: true,
		TemperatureC: 51, HasTemperature: true}
	if r != want {
		t.Errorf("Read() = %+v\nwant     %+v", r, want)
	}
	ps, err := d.Processes()
	if err != nil {
		t.Fatal(err)
	}
	wantPs := []Process{{PID: 1234, Name: "tritonserver", UsedBytes: 20 << 30, HasUsed: true}, {PID: 5678, Name: "python3"}}
	if len(ps) != 2 || ps[0] != wantPs[0] || ps[1] != wantPs[1] {
		t.Errorf("Processes() = %+v\nwant %+v", ps, wantPs)
	}
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := d.Read(); err == nil {
		t.Error("Read after Close succeeded")
	}
}

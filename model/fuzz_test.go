package model

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fuzzFixture is a checkpoint whose config.json and safetensors header the fuzzer mutates.
type fuzzFixture struct {
	// config is config.json's bytes.
	config []byte
	// header is the safetensors JSON header; data the data region after it.
	header, data []byte
}

// readFixture splits a fixture folder's files for the fuzzer.
func readFixture(f *testing.F, dir string) fuzzFixture {
	f.Helper()
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		f.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		f.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	return fuzzFixture{config: cfg, header: raw[8 : 8+n], data: raw[8+n:]}
}

// FuzzOpen mutates config.json and the safetensors header of the tiny GPT-2 and LLaMA
// fixtures and loads the result as the backend does (Open, then every weight checked and
// converted). Loading must never panic, must not allocate more than the files justify
// (a config or header that claims huge sizes is refused before anything proportional to
// it is allocated), and must fail with an error that names what it refuses.
func FuzzOpen(f *testing.F) {
	fixtures := []fuzzFixture{readFixture(f, tinyDir), readFixture(f, "../testdata/llama-tiny")}
	for i, fx := range fixtures {
		f.Add(uint8(i), fx.config, fx.header)
	}
	// Seeds the mutations start from: sizes that once reached an allocation.
	gpt2 := string(fixtures[0].config)
	for _, bomb := range []string{`"n_layer": 100000000`, `"n_layer": 1000000`, `"n_embd": 1000000000`,
		`"vocab_size": 4000000000`, `"n_positions": 2000000000`, `"n_inner": 99999999`} {
		field, _, _ := strings.Cut(bomb, ":")
		i := strings.Index(gpt2, field)
		j := i + strings.IndexAny(gpt2[i:], ",\n}")
		f.Add(uint8(0), []byte(gpt2[:i]+bomb+gpt2[j:]), fixtures[0].header)
	}
	f.Add(uint8(0), fixtures[0].config, []byte(`{"transformer.wte.weight": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}}`))
	f.Fuzz(func(t *testing.T, which uint8, config, header []byte) {
		fx := fixtures[int(which)%len(fixtures)]
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "config.json"), config, 0o644); err != nil {
			t.Fatal(err)
		}
		st := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
		st = append(append(st, header...), fx.data...)
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), st, 0o644); err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var m *Float32
		var err error
		done := make(chan struct{})
		go func() { m, err = LoadFloat32(dir); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("loading took over 5 s: config.json %q, header %q", config, header)
		}
		runtime.ReadMemStats(&after)
		// Float32 weights are at most twice the bytes of half-precision files; the JSON
		// decoders and error messages take a bounded amount on top.
		budget := 4*uint64(len(st)+len(config)) + 16<<20
		if got := after.TotalAlloc - before.TotalAlloc; got > budget {
			t.Fatalf("loading %d bytes of files allocated %d bytes (budget %d)", len(st)+len(config), got, budget)
		}
		if err != nil {
			msg := err.Error()
			if !strings.Contains(msg, dir) {
				t.Errorf("error %q does not name the checkpoint folder", msg)
			}
			return
		}
		if m == nil || len(m.Layers) != m.Config.Layers || m.Model[RoleEmbed] == nil {
			t.Fatalf("a successful load returned %+v", m)
		}
	})
}

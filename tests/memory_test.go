package tests

// Memory high-water (issue 11): checkpoints that fail to load must not leave the
// server's resident memory behind.

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
)

// badCheckpoint is a copy of the demo checkpoint spoilt one way.
type badCheckpoint struct {
	// name is the model's name in the repository.
	name string
	// dir holds the broken checkpoint.
	dir string
	// says is what the load error must mention.
	says string
}

// badCheckpoints writes three spoilt copies of the demo checkpoint in dir: the
// safetensors file cut short, the last tensor left out, and a tensor's shape
// transposed (same byte size).
func badCheckpoints(t *testing.T, demo, dir string) []badCheckpoint {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(demo, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	var header map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+n], &header); err != nil {
		t.Fatal(err)
	}
	data := raw[8+n:]
	type entry struct {
		DType   string  `json:"dtype"`
		Shape   []int64 `json:"shape"`
		Offsets [2]int  `json:"data_offsets"`
	}
	entries := map[string]entry{}
	last := ""
	for k, v := range header {
		if k == "__metadata__" {
			continue
		}
		var e entry
		if err := json.Unmarshal(v, &e); err != nil {
			t.Fatal(err)
		}
		entries[k] = e
		if last == "" || e.Offsets[1] > entries[last].Offsets[1] {
			last = k
		}
	}
	encode := func(es map[string]entry, data []byte) []byte {
		h := map[string]any{"__metadata__": header["__metadata__"]}
		for k, e := range es {
			h[k] = e
		}
		hb, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		out := binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))
		return append(append(out, hb...), data...)
	}
	write := func(name string, st []byte) string {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"config.json", "tokenizer.json"} {
			if err := os.Symlink(filepath.Join(demo, f), filepath.Join(d, f)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, "model.safetensors"), st, 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}

	missing := maps(entries)
	delete(missing, last)
	shape := maps(entries)
	const transposed = "transformer.h.3.attn.c_attn.weight"
	e, ok := shape[transposed]
	if !ok || len(e.Shape) != 2 {
		t.Fatalf("the demo checkpoint has no 2-d %s", transposed)
	}
	e.Shape = []int64{e.Shape[1], e.Shape[0]}
	shape[transposed] = e
	return []badCheckpoint{
		{"bad_truncated", write("truncated", raw[:len(raw)/2]), "safetensors"},
		{"bad_missing", write("missing", encode(missing, data[:entries[last].Offsets[0]])), strings.TrimPrefix(last, "transformer.")},
		{"bad_shape", write("shape", encode(shape, data)), "c_attn"},
	}
}

// maps returns a copy of m.
func maps[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func TestRSSAfterFailedLoads(t *testing.T) {
	ck := demoCheckpoint(t)
	bad := badCheckpoints(t, ck.dir, t.TempDir())
	models := []harness.Model{{}}
	for _, b := range bad {
		models = append(models, harness.Model{Name: b.name, Checkpoint: b.dir})
	}
	s := harness.Start(t, harness.Options{Models: models,
		Flags: []string{"--model-control-mode=explicit", "--load-model=" + modelName}})
	c := s.Client(t)
	ctx := testContext(t, 5*time.Minute)
	const n = 8
	want := greedyTokens(t, ck.dir, tokenPrompt, n)
	serve := func(id string) {
		t.Helper()
		res, err := streamInfer(ctx, c, inferRequest(modelName, id, tokenInputs(tokenPrompt, n, true)))
		if err != nil || res.errMsg != "" || !slices.Equal(res.tokens, want) {
			t.Fatalf("request %s: tokens %v, %v, error %q; want %v", id, res.tokens, err, res.errMsg, want)
		}
	}
	for i := range 4 {
		serve(fmt.Sprintf("warm-%d", i))
	}
	// The first failed load of each kind warms up whatever is loaded once (Triton's
	// model repository state, the backend's code paths); the next 20 must not grow.
	load := func(b badCheckpoint) {
		t.Helper()
		_, err := c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: b.name})
		if err == nil {
			t.Fatalf("model %s (%s) loaded; want a failed load", b.name, b.dir)
		}
		if !strings.Contains(err.Error(), b.says) {
			t.Errorf("load %s: %v; want it to mention %q", b.name, err, b.says)
		}
	}
	for _, b := range bad {
		load(b)
	}
	time.Sleep(200 * time.Millisecond)
	before, err := s.RSS()
	if err != nil {
		t.Fatal(err)
	}
	const loads = 20
	for i := range loads {
		load(bad[i%len(bad)])
	}
	time.Sleep(200 * time.Millisecond)
	after, err := s.RSS()
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	t.Logf("RSS %d MiB after the warm-up and a failed load of each kind, %d MiB after %d more failed loads (%+d MiB)",
		before/mib, after/mib, loads, (after-before)/mib)
	// One failed load of the demo checkpoint maps ~31 MiB of weights and builds a ~20 MiB
	// tokenizer; the bound allows less than one load's worth to stay.
	const bound = 32 * mib
	if after-before > bound {
		t.Errorf("RSS grew by %d MiB over %d failed loads; want at most %d MiB", (after-before)/mib, loads, bound/mib)
	}
	serve("after")

	// Unloading the model returns its weights, tokenizer and KV pool to the OS.
	loaded, err := s.RSS()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RepositoryModelUnload(ctx, &kserve.RepositoryModelUnloadRequest{ModelName: modelName}); err != nil {
		t.Fatalf("unload: %v", err)
	}
	waitModelState(t, ctx, c, false)
	time.Sleep(200 * time.Millisecond)
	unloaded, err := s.RSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RSS %d MiB with the model loaded, %d MiB once it is unloaded (%+d MiB)", loaded/mib, unloaded/mib, (unloaded-loaded)/mib)
	// The CPU engine computes on the weights where the file holds them (16-bit in place,
	// the transposed Conv1D matrices copied), so unloading frees at least most of the
	// file's size with the mapping and the copies.
	st, err := os.Stat(filepath.Join(ck.dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if freed := st.Size() * 8 / 10; loaded-unloaded < freed {
		t.Errorf("unloading the model freed %d MiB of RSS, want at least %d MiB (0.8 of the %d MiB weights file)",
			(loaded-unloaded)/mib, freed/mib, st.Size()/mib)
	}
}

func TestGoMemoryLimitFromEnvironment(t *testing.T) {
	s := harness.Start(t, harness.Options{Env: []string{"GOMEMLIMIT=3GiB"}})
	for _, line := range strings.Split(s.Log(), "\n") {
		if strings.Contains(line, "Go memory settings") {
			if !strings.Contains(line, "3GiB") || !strings.Contains(line, "3072 MiB") {
				t.Errorf("the backend's memory settings %q do not show GOMEMLIMIT's soft limit of 3072 MiB", line)
			}
			return
		}
	}
	t.Error("the log has no line on the backend's memory settings")
}

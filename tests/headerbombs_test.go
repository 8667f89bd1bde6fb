package tests

// Safetensors header bombs (issue 32, finding 5): headers that hold hundreds of
// thousands of tensors, or claim more than the 100 MiB a header may have, must fail
// their model's load in bounded time and memory, naming the bound hit, with the server
// up and the other models serving.

import (
	"bytes"
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

// manyTensorsCheckpoint writes the demo checkpoint into dir as shards of a sharded
// checkpoint: the first shard holds the demo's tensors and extra zero-size ones, the
// others only zero-size ones, perShard extra tensors each with names of about 300 bytes
// (issue 32's files: 1.15M such tensors in ~90 MB headers). The index names the demo's
// tensors and one of each other shard: a consistent checkpoint that Open reads whole.
func manyTensorsCheckpoint(t *testing.T, demo, dir string, shards, perShard int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "tokenizer.json"} {
		if err := os.Symlink(filepath.Join(demo, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
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
	index := map[string]string{}
	pad := strings.Repeat("x", 280)
	for s := range shards {
		file := fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, shards)
		var b bytes.Buffer
		b.WriteString("{")
		first := true
		entry := func(name string, v []byte) {
			if !first {
				b.WriteString(",")
			}
			first = false
			k, _ := json.Marshal(name)
			b.Write(k)
			b.WriteString(":")
			b.Write(v)
		}
		var shardData []byte
		if s == 0 {
			for k, v := range header {
				entry(k, v)
				if k != "__metadata__" {
					index[k] = file
				}
			}
			shardData = data
		}
		// Zero-size tensors at the end of the data, where they overlap nothing.
		empty := []byte(fmt.Sprintf(`{"dtype":"F32","shape":[0],"data_offsets":[%d,%d]}`, len(shardData), len(shardData)))
		for i := range perShard {
			name := fmt.Sprintf("junk.%s.%d.%d", pad, s, i)
			entry(name, empty)
			if i == 0 {
				index[name] = file
			}
		}
		b.WriteString("}")
		out := binary.LittleEndian.AppendUint64(nil, uint64(b.Len()))
		out = append(append(out, b.Bytes()...), shardData...)
		if err := os.WriteFile(filepath.Join(dir, file), out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ix, err := json.Marshal(map[string]any{"weight_map": index})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), ix, 0o644); err != nil {
		t.Fatal(err)
	}
}

// oversizedHeaderCheckpoint writes into dir the demo's config with a model.safetensors
// whose header length is 110,690,320 bytes in a (sparse) file of 140,093,976 bytes,
// the file.
func oversizedHeaderCheckpoint(t *testing.T, demo, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "tokenizer.json"} {
		if err := os.Symlink(filepath.Join(demo, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Create(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(binary.LittleEndian.AppendUint64(nil, 110690320)); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(140093976); err != nil {
		t.Fatal(err)
	}
}

func TestSafetensorsHeaderBombs(t *testing.T) {
	ck := demoCheckpoint(t)
	root := t.TempDir()
	// 4 shards of 80,000 tensors: 320,000 in all, over the 262,144 a checkpoint may
	// hold only together, in ~25 MB headers.
	manyTensorsCheckpoint(t, ck.dir, filepath.Join(root, "many"), 4, 80000)
	oversizedHeaderCheckpoint(t, ck.dir, filepath.Join(root, "oversized"))
	bombs := []struct {
		name, dir, says string
	}{
		{"bomb_many_tensors", "many", "more than 262144 tensors in the checkpoint, the bound on a checkpoint's tensors"},
		{"bomb_oversized_header", "oversized", "header of 110690320 bytes is over the bound of 104857600 bytes (100 MiB)"},
	}
	models := []harness.Model{{}}
	for _, b := range bombs {
		models = append(models, harness.Model{Name: b.name, Checkpoint: filepath.Join(root, b.dir)})
	}
	s := harness.Start(t, harness.Options{Models: models,
		Flags: []string{"--model-control-mode=explicit", "--load-model=" + modelName}})
	c := s.Client(t)
	ctx := testContext(t, 10*time.Minute)
	const n = 8
	want := greedyTokens(t, ck.dir, tokenPrompt, n)
	serve := func(id string) {
		t.Helper()
		res, err := streamInfer(ctx, c, inferRequest(modelName, id, tokenInputs(tokenPrompt, n, true)))
		if err != nil || res.errMsg != "" || !slices.Equal(res.tokens, want) {
			t.Fatalf("request %s: tokens %v, %v, error %q; want %v", id, res.tokens, err, res.errMsg, want)
		}
	}
	serve("before")
	before, err := s.RSS()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bombs {
		t.Run(b.name, func(t *testing.T) {
			// Bounded time: the four ~90 MB headers took 195 s to load.
			lctx := testContext(t, 60*time.Second)
			start := time.Now()
			_, err := c.RepositoryModelLoad(lctx, &kserve.RepositoryModelLoadRequest{ModelName: b.name})
			took := time.Since(start)
			if err == nil {
				t.Fatalf("model %s loaded in %v; want a failed load", b.name, took)
			}
			if !strings.Contains(err.Error(), b.says) {
				t.Errorf("load %s (%v): %v; want it to say %q", b.name, took, err, b.says)
			}
			t.Logf("load %s refused in %v", b.name, took.Round(time.Millisecond))
			live, err := c.ServerLive(ctx, &kserve.ServerLiveRequest{})
			if err != nil || !live.GetLive() {
				t.Fatalf("the server is not live after loading %s: %v, %v", b.name, live, err)
			}
			serve("after-" + b.name)
		})
	}
	after, err := s.RSS()
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	t.Logf("RSS %d MiB before the header bombs, %d MiB after (%+d MiB)", before/mib, after/mib, (after-before)/mib)
	if after-before > 256*mib {
		t.Errorf("RSS grew by %d MiB over the refused loads; want at most 256 MiB", (after-before)/mib)
	}
}

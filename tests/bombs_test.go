package tests

// Model-file bombs (issue 11): a config.json or safetensors header that claims huge
// sizes must fail its own load, naming the field, without taking the server's memory or
// the other models down.

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
)

// bomb is a copy of the demo checkpoint with one file changed.
type bomb struct {
	// name is the model's name in the repository.
	name string
	// config replaces a config.json field (`"n_layer": 4` → value), when set.
	field, value string
	// header replaces the safetensors header, when set.
	header string
	// says is what the load error must contain.
	says string
}

func TestModelFileBombs(t *testing.T) {
	ck := demoCheckpoint(t)
	bombs := []bomb{
		{name: "bomb_layers", field: "n_layer", value: "100000000", says: "field n_layer: 100000000 is outside [1, 1024]"},
		{name: "bomb_layers_present", field: "n_layer", value: "1000", says: "field n_layer: 1000, but the checkpoint's tensors hold layers h.0 … h.3 (4 layers)"},
		{name: "bomb_vocab", field: "vocab_size", value: "4000000000", says: "field vocab_size: 4000000000 is outside"},
		{name: "bomb_width", field: "n_embd", value: "1000000", says: "field n_embd: 1000000 is outside"},
		{name: "bomb_positions", field: "n_positions", value: "1000000000", says: "field n_positions: 1000000000 is outside"},
		{name: "bomb_inner", field: "n_inner", value: "200000", says: "transformer.h.0.mlp.c_fc.weight"},
		{name: "bomb_header", header: `{"transformer.wte.weight": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}}`,
			says: "shape [4294967296 4294967296] overflows"},
	}
	root := t.TempDir()
	models := []harness.Model{{}}
	for _, b := range bombs {
		models = append(models, harness.Model{Name: b.name, Checkpoint: writeBomb(t, ck.dir, filepath.Join(root, b.name), b)})
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
	serve("before")
	before, err := s.RSS()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bombs {
		t.Run(b.name, func(t *testing.T) {
			_, err := c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: b.name})
			if err == nil {
				t.Fatalf("model %s loaded; want a failed load", b.name)
			}
			if !strings.Contains(err.Error(), b.says) {
				t.Errorf("load %s: %v; want it to say %q", b.name, err, b.says)
			}
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
	t.Logf("RSS %d MiB before the bombs, %d MiB after (%+d MiB)", before/mib, after/mib, (after-before)/mib)
	// A bomb is refused before anything proportional to its sizes is allocated: the
	// checkpoint's own files are 33 MB, mapped and never converted.
	if after-before > 64*mib {
		t.Errorf("RSS grew by %d MiB over %d failed loads; want at most 64 MiB", (after-before)/mib, len(bombs))
	}
}

// writeBomb copies the demo checkpoint into dir with b's change.
func writeBomb(t *testing.T, demo, dir string, b bomb) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(demo, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if b.field != "" {
		re := regexp.MustCompile(fmt.Sprintf(`"%s": [^,\n}]+`, b.field))
		if !re.Match(cfg) {
			t.Fatalf("the demo config.json has no %s", b.field)
		}
		cfg = re.ReplaceAll(cfg, []byte(fmt.Sprintf(`"%s": %s`, b.field, b.value)))
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	st := filepath.Join(dir, "model.safetensors")
	if b.header == "" {
		if err := os.Symlink(filepath.Join(demo, "model.safetensors"), st); err != nil {
			t.Fatal(err)
		}
	} else {
		raw := binary.LittleEndian.AppendUint64(nil, uint64(len(b.header)))
		raw = append(append(raw, b.header...), make([]byte, 16)...)
		if err := os.WriteFile(st, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(demo, "tokenizer.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	return dir
}

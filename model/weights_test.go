package model

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestLoadFloat32(t *testing.T) {
	for _, dir := range []string{tinyDir, shardedDir} {
		t.Run("loads the same weights as Open and Float32Weights from "+filepath.Base(dir), func(t *testing.T) {
			c, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			want, err := c.Float32Weights()
			c.Close()
			if err != nil {
				t.Fatal(err)
			}
			got, err := LoadFloat32(dir)
			if err != nil {
				t.Fatal(err)
			}
			// The checkpoint is closed by now: comparing reads every weight, which
			// would fault if any still pointed into the unmapped files.
			if !reflect.DeepEqual(got, want) {
				t.Fatal("LoadFloat32's weights differ from Open + Float32Weights'")
			}
			if got.Config.Family != "gpt2" || got.Config.Layers != 2 || len(got.Layers) != 2 {
				t.Errorf("config %+v with %d layers, want the tiny gpt2's 2", got.Config, len(got.Layers))
			}
		})
	}

	t.Run("GPT-2's Conv1D matrices come out [out][in]", func(t *testing.T) {
		c, err := Open(tinyDir)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		stored, err := c.Tensor("h.0.attn.c_attn.weight") // [in 64][out 192]
		if err != nil {
			t.Fatal(err)
		}
		raw, err := stored.Float32()
		if err != nil {
			t.Fatal(err)
		}
		m, err := c.Float32Weights()
		if err != nil {
			t.Fatal(err)
		}
		qkv := m.Layers[0][RoleQKV] // [192][64]
		for _, at := range [][2]int{{0, 0}, {5, 17}, {191, 63}, {100, 3}} {
			out, in := at[0], at[1]
			if qkv[out*64+in] != raw[in*192+out] {
				t.Errorf("qkv[%d][%d] = %g, want the stored [%d][%d] = %g", out, in, qkv[out*64+in], in, out, raw[in*192+out])
			}
		}
	})

	t.Run("a missing folder's error names it and is fs.ErrNotExist", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "absent")
		_, err := LoadFloat32(dir)
		if err == nil {
			t.Fatal("loaded without error")
		}
		if !strings.HasPrefix(err.Error(), "load "+dir+": open checkpoint:") {
			t.Errorf("error %q does not start with load %s: open checkpoint:", err, dir)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("error %q is not fs.ErrNotExist", err)
		}
	})

	t.Run("an Open error that does not name the folder gains it", func(t *testing.T) {
		// Two shards with the same tensors: Open's error names the tensor and the
		// shard, not the folder.
		dir := t.TempDir()
		entries, err := os.ReadDir(shardedDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			src := e.Name()
			if src == "model-00002-of-00004.safetensors" {
				src = "model-00001-of-00004.safetensors"
			}
			raw, err := os.ReadFile(filepath.Join(shardedDir, src))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, e.Name()), raw, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		_, err = LoadFloat32(dir)
		if err == nil {
			t.Fatal("loaded without error")
		}
		for _, w := range []string{"load " + dir + ": ", "is in more than one shard"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not contain %q", err, w)
			}
		}
	})

	t.Run("a weight error names the folder once", func(t *testing.T) {
		cfg := tinyConfig(t)
		cfg["n_positions"] = 256
		dir := writeCheckpoint(t, cfg, tinyTensors(t))
		m, err := LoadFloat32(dir)
		if err == nil {
			t.Fatal("loaded without error")
		}
		if m != nil {
			t.Error("a failed load returned weights")
		}
		if n := strings.Count(err.Error(), dir); n != 1 || !strings.HasPrefix(err.Error(), "load "+dir+": ") {
			t.Errorf("error %q names %s %d times, want once, as its prefix", err, dir, n)
		}
		for _, w := range []string{"transformer.wpe.weight", "n_positions 256"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not contain %q", err, w)
			}
		}
	})
}

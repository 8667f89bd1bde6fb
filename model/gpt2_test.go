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

func TestLoadGPT2Dir(t *testing.T) {
	for _, dir := range []string{tinyDir, shardedDir} {
		t.Run("loads the same weights as Open and LoadGPT2 from "+filepath.Base(dir), func(t *testing.T) {
			c, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			want, err := LoadGPT2(c)
			c.Close()
			if err != nil {
				t.Fatal(err)
			}
			got, err := LoadGPT2Dir(dir)
			if err != nil {
				t.Fatal(err)
			}
			// The checkpoint is closed by now: comparing reads every weight, which
			// would fault if any still pointed into the unmapped files.
			if !reflect.DeepEqual(got, want) {
				t.Fatal("LoadGPT2Dir's weights differ from Open + LoadGPT2's")
			}
			if got.Config.Arch != "gpt2" || got.Config.Layers != 2 || len(got.Layers) != 2 {
				t.Errorf("config %+v with %d layers, want the tiny gpt2's 2", got.Config, len(got.Layers))
			}
		})
	}

	t.Run("a missing folder's error names it and is fs.ErrNotExist", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "absent")
		_, err := LoadGPT2Dir(dir)
		if err == nil {
			t.Fatal("loaded without error")
		}
		if !strings.HasPrefix(err.Error(), "load gpt2 "+dir+": open checkpoint:") {
			t.Errorf("error %q does not start with load gpt2 %s: open checkpoint:", err, dir)
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
		_, err = LoadGPT2Dir(dir)
		if err == nil {
			t.Fatal("loaded without error")
		}
		for _, w := range []string{"load gpt2 " + dir + ": ", "is in more than one shard"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not contain %q", err, w)
			}
		}
	})

	t.Run("a LoadGPT2 error names the folder once", func(t *testing.T) {
		cfg := tinyConfig(t)
		cfg["n_positions"] = 256
		dir := writeCheckpoint(t, cfg, tinyTensors(t))
		m, err := LoadGPT2Dir(dir)
		if err == nil {
			t.Fatal("loaded without error")
		}
		if m != nil {
			t.Error("a failed load returned weights")
		}
		if n := strings.Count(err.Error(), dir); n != 1 || !strings.HasPrefix(err.Error(), "load gpt2 "+dir+": ") {
			t.Errorf("error %q names %s %d times, want once, as its prefix", err, dir, n)
		}
		if !strings.Contains(err.Error(), "transformer.wpe.weight") {
			t.Errorf("error %q does not name transformer.wpe.weight", err)
		}
	})
}

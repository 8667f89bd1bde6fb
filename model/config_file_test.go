package model

import (
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
)

// TestReadConfig reads a checkpoint's descriptor without its weights, and says a
// folder without config.json is missing it.
func TestReadConfig(t *testing.T) {
	cfg, err := ReadConfig(filepath.Join("..", "testdata", "gpt2-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.VocabSize != 1000 || len(cfg.EOSIDs) != 1 || cfg.EOSIDs[0] != 999 {
		t.Errorf("vocabulary %d, end tokens %v; want 1000 and [999]", cfg.VocabSize, cfg.EOSIDs)
	}
	if _, err := ReadConfig(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a folder without config.json: %v, want fs.ErrNotExist", err)
	}
}

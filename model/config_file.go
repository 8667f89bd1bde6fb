package model

import (
	"fmt"
	"os"
	"path/filepath"
)

// ReadConfig reads dir/config.json into the architecture descriptor, checked as Open
// checks it, without opening the weights: for what needs a checkpoint's vocabulary and
// end tokens but not its tensors (the backend's tokenizer-only models). A folder
// without config.json gives an error wrapping fs.ErrNotExist.
func ReadConfig(dir string) (Config, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read model config: %w", err)
	}
	cfg, _, _, err := parseConfig(raw)
	if err != nil {
		return Config{}, fmt.Errorf("read model config: %s: %w", path, err)
	}
	return cfg, nil
}

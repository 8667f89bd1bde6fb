package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Generation holds the defaults a checkpoint's generation_config.json gives requests
// that do not set them.
type Generation struct {
	// EOSIDs are the end tokens (eos_token_id, a token or a list); nil when the file
	// names none, and then the config's are used.
	EOSIDs []int32
	// Sample says the checkpoint samples by default (do_sample); when false, the
	// temperature, top-k and top-p below are not applied (transformers decodes greedily).
	Sample bool
	// Temperature, TopK and TopP are the sampling defaults (0: none given).
	Temperature float32
	TopK        int
	TopP        float32
	// RepetitionPenalty is the default repetition penalty (0: none given).
	RepetitionPenalty float32
}

// LoadGeneration reads dir/generation_config.json; a folder without one gives the zero
// Generation. vocab bounds the end tokens. Errors name the file and the field.
func LoadGeneration(dir string, vocab int) (Generation, error) {
	if g, err := GGUFPath(dir); err == nil && g != "" {
		return Generation{}, nil // a GGUF file has no generation defaults; its end tokens are the config's
	}
	path := filepath.Join(dir, "generation_config.json")
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Generation{}, nil
	}
	if err != nil {
		return Generation{}, err
	}
	g, err := parseGeneration(raw, vocab)
	if err != nil {
		return Generation{}, fmt.Errorf("%s: %w", path, err)
	}
	return g, nil
}

// parseGeneration reads generation_config.json's fields.
func parseGeneration(raw []byte, vocab int) (Generation, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return Generation{}, fmt.Errorf("invalid JSON: %w", err)
	}
	p := &configParser{m: m}
	g := Generation{
		EOSIDs:            p.tokenIDs("eos_token_id"),
		Sample:            p.boolean("do_sample", false),
		Temperature:       float32(p.number("temperature", 0)),
		TopK:              p.nonNegative("top_k", 0),
		TopP:              float32(p.number("top_p", 0)),
		RepetitionPenalty: float32(p.number("repetition_penalty", 0)),
	}
	switch {
	case p.err != nil:
		return Generation{}, p.err
	case g.Temperature < 0:
		return Generation{}, fmt.Errorf("field temperature: %g is negative", g.Temperature)
	case g.TopP < 0 || g.TopP > 1:
		return Generation{}, fmt.Errorf("field top_p: %g is outside [0, 1]", g.TopP)
	case g.RepetitionPenalty < 0:
		return Generation{}, fmt.Errorf("field repetition_penalty: %g is negative", g.RepetitionPenalty)
	}
	for _, id := range g.EOSIDs {
		if int(id) >= vocab {
			return Generation{}, fmt.Errorf("field eos_token_id: %d is not below the vocabulary size %d", id, vocab)
		}
	}
	return g, nil
}

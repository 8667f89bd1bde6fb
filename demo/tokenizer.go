// Package demo writes gollm's demo checkpoint: a GPT-2 in the real Hugging Face format
// (config.json, model.safetensors, tokenizer.json) with GPT-2's real vocabulary and
// random weights from a fixed seed.
package demo

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"gollm/tokenizer"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/pkoukk/tiktoken-go-loader/assets"
)

// endOfText is GPT-2's only special token; its id follows the 50256 BPE tokens.
const endOfText = "<|endoftext|>"

// gpt2Vocab reads GPT-2's byte-level BPE vocabulary from the tiktoken-go-loader module,
// which embeds OpenAI's r50k_base.tiktoken: one "base64(token bytes) rank" per line,
// where the rank is GPT-2's token id. It returns the tokens' bytes indexed by id.
func gpt2Vocab() ([][]byte, error) {
	raw, err := assets.Assets.ReadFile("r50k_base.tiktoken")
	if err != nil {
		return nil, fmt.Errorf("read r50k_base.tiktoken: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	tokens := make([][]byte, len(lines))
	for i, line := range lines {
		b64, rankStr, ok := strings.Cut(line, " ")
		tok, err1 := base64.StdEncoding.DecodeString(b64)
		rank, err2 := strconv.Atoi(rankStr)
		if !ok || err1 != nil || err2 != nil || rank < 0 || rank >= len(tokens) || tokens[rank] != nil || len(tok) == 0 {
			return nil, fmt.Errorf("r50k_base.tiktoken line %d: %q is not a fresh \"base64 rank\" pair", i+1, line)
		}
		tokens[rank] = tok
	}
	// Ranks 0-255 must be the 256 single bytes: byte-level BPE starts from them.
	seen := map[byte]bool{}
	for r := range 256 {
		if len(tokens[r]) != 1 || seen[tokens[r][0]] {
			return nil, fmt.Errorf("r50k_base.tiktoken: rank %d is %q, not a new single byte", r, tokens[r])
		}
		seen[tokens[r][0]] = true
	}
	return tokens, nil
}

// recoverMerges rebuilds GPT-2's merge list from token ranks. Token r (r ≥ 256) was made
// by merge r-256; byte-pair encoding its bytes with only the tokens ranked below r stops
// at exactly two parts, and those are the merge's left and right sides.
func recoverMerges(tokens [][]byte) ([][2][]byte, error) {
	rank := make(map[string]int, len(tokens))
	for r, tok := range tokens {
		rank[string(tok)] = r
	}
	merges := make([][2][]byte, 0, len(tokens)-256)
	for r := 256; r < len(tokens); r++ {
		parts := make([][]byte, len(tokens[r]))
		for i := range tokens[r] {
			parts[i] = tokens[r][i : i+1]
		}
		for {
			best, bestRank := -1, r
			for i := 0; i+1 < len(parts); i++ {
				if pr, ok := rank[string(parts[i])+string(parts[i+1])]; ok && pr < bestRank {
					best, bestRank = i, pr
				}
			}
			if best < 0 {
				break
			}
			joined := append(append([]byte{}, parts[best]...), parts[best+1]...)
			parts = append(parts[:best], append([][]byte{joined}, parts[best+2:]...)...)
		}
		if len(parts) != 2 {
			return nil, fmt.Errorf("token %d %q: BPE with lower ranks ends in %d parts, not 2", r, tokens[r], len(parts))
		}
		merges = append(merges, [2][]byte{parts[0], parts[1]})
	}
	return merges, nil
}

// GPT2TokenizerJSON returns a Hugging Face tokenizer.json for GPT-2's 50257-token
// byte-level BPE, laid out like the one published with the gpt2 model (vocab in id
// order, merges as "left right" strings).
func GPT2TokenizerJSON() ([]byte, error) {
	raw, err := gpt2TokenizerJSON()
	return bytes.Clone(raw), err
}

// gpt2TokenizerJSON builds the file once per process: it is deterministic, and
// recovering 50000 merges is the slow part of writing a checkpoint.
var gpt2TokenizerJSON = sync.OnceValues(buildGPT2TokenizerJSON)

// buildGPT2TokenizerJSON builds GPT2TokenizerJSON's result.
func buildGPT2TokenizerJSON() ([]byte, error) {
	tokens, err := gpt2Vocab()
	if err != nil {
		return nil, err
	}
	merges, err := recoverMerges(tokens)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	// str writes s as a JSON string, leaving < > & as they are for readability.
	str := func(s string) {
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		enc.Encode(s)           // a string always encodes
		b.Truncate(b.Len() - 1) // Encode appends a newline
	}
	eotID := len(tokens)
	b.WriteString("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n")
	fmt.Fprintf(&b, "  \"added_tokens\": [\n    {\"id\": %d, \"content\": ", eotID)
	str(endOfText)
	b.WriteString(", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}\n  ],\n")
	b.WriteString("  \"normalizer\": null,\n")
	b.WriteString("  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true},\n")
	b.WriteString("  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false, \"use_regex\": true},\n")
	b.WriteString("  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n")
	b.WriteString("  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n")
	b.WriteString("    \"continuing_subword_prefix\": \"\",\n    \"end_of_word_suffix\": \"\",\n")
	b.WriteString("    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n")
	b.WriteString("    \"vocab\": {\n")
	for id, tok := range tokens {
		b.WriteString("      ")
		str(tokenizer.ByteLevelString(tok))
		fmt.Fprintf(&b, ": %d,\n", id)
	}
	b.WriteString("      ")
	str(endOfText)
	fmt.Fprintf(&b, ": %d\n    },\n    \"merges\": [\n", eotID)
	for i, m := range merges {
		b.WriteString("      ")
		str(tokenizer.ByteLevelString(m[0]) + " " + tokenizer.ByteLevelString(m[1]))
		if i+1 < len(merges) {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("    ]\n  }\n}\n")
	return b.Bytes(), nil
}

// WriteGPT2Tokenizer writes GPT2TokenizerJSON to path (through a temporary file, so a
// reader never sees half of it).
func WriteGPT2Tokenizer(path string) error {
	raw, err := GPT2TokenizerJSON()
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return writeFileAtomic(path, raw)
}

// writeFileAtomic writes data to a temporary file beside path and renames it.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

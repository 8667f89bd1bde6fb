package model

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"gollm/tokenizer"
)

// A GGUF file's tokenizer is its tokenizer.ggml.* metadata, as llama.cpp reads it. gollm
// turns it into the Hugging Face files the tokenizer package and the chat templates
// read — tokenizer.json and tokenizer_config.json — in the layouts Hugging Face's own
// converters give the same vocabularies:
//
//   - "llama" (SentencePiece BPE: tokens, scores, token types): Llama 2's layout, the
//     merges derived from the scores as transformers' SentencePiece extractor derives
//     them (every split of a piece into two pieces, ranked by the merged piece's score),
//     which llama.cpp's greedy merging by score reproduces; byte fallback through the
//     <0xXX> tokens, "▁" for spaces, a space prefix unless add_space_prefix is false;
//   - "gpt2" (byte-level BPE: tokens and merges), with the pre-tokenizer its
//     tokenizer.ggml.pre names (ggufPreTokenizers).
//
// Control, unknown and user-defined tokens become added tokens (control ones special).
// A prompt starts with BOS where tokenizer.ggml.add_bos_token says so (by default for
// "llama", not for "gpt2", as llama.cpp does) and ends with EOS where add_eos_token says.

// GGUF token types.
const (
	ggufTokNormal      = 1
	ggufTokUnknown     = 2
	ggufTokControl     = 3
	ggufTokUserDefined = 4
)

// Regular expressions of the byte-level pre-tokenizers, as Hugging Face's files hold
// them.
const (
	llama3Split = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Split  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// byteLevel is the ByteLevel pre-tokenizer, with GPT-2's regex or without one.
func byteLevel(regex bool) map[string]any {
	return map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": regex}
}

// splitThen is a Split on regex followed by ByteLevel without its own regex.
func splitThen(regex string) map[string]any {
	return map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": regex}, "behavior": "Isolated", "invert": false},
		byteLevel(false)}}
}

// ggufPreTokenizers are the byte-level pre-tokenizations llama.cpp names in
// tokenizer.ggml.pre that gollm implements: the normalizer (or nil) and pre-tokenizer of
// the Hugging Face files of those families.
var ggufPreTokenizers = map[string][2]any{
	"default":   {nil, byteLevel(true)},
	"gpt2":      {nil, byteLevel(true)},
	"gpt-2":     {nil, byteLevel(true)},
	"llama-bpe": {nil, splitThen(llama3Split)},
	"llama3":    {nil, splitThen(llama3Split)},
	"qwen2":     {map[string]any{"type": "NFC"}, splitThen(qwen2Split)},
	"smollm": {nil, map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Digits", "individual_digits": true}, byteLevel(true)}}},
}

// TokenizerFiles returns a checkpoint's tokenizer.json and tokenizer_config.json: the
// files of a Hugging Face folder (cfg nil when the folder has no tokenizer_config.json;
// an error wrapping fs.ErrNotExist when it has no tokenizer.json), or, for a GGUF
// checkpoint (GGUFPath), the two made from its metadata (an error wrapping
// fs.ErrNotExist when it holds no tokenizer).
func TokenizerFiles(path string) (tok, cfg []byte, err error) {
	g, err := GGUFPath(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	if g == "" {
		tok, err := os.ReadFile(filepath.Join(path, "tokenizer.json"))
		if err != nil {
			return nil, nil, err
		}
		cfg, err := os.ReadFile(filepath.Join(path, "tokenizer_config.json"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, nil, err
		}
		return tok, cfg, nil
	}
	f, err := openGGUF(g)
	if err != nil {
		return nil, nil, err
	}
	defer f.close()
	tok, cfg, err = f.tokenizerFiles()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", g, err)
	}
	return tok, cfg, nil
}

// LoadTokenizer reads a checkpoint's tokenizer (TokenizerFiles); an error wraps
// fs.ErrNotExist when the checkpoint has none.
func LoadTokenizer(path string) (*tokenizer.Tokenizer, error) {
	tok, cfg, err := TokenizerFiles(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	t, err := tokenizer.Parse(tok, cfg)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer of %s: %w", path, err)
	}
	return t, nil
}

// ggufTokenizer is what tokenizer.ggml.* holds.
type ggufTokenizer struct {
	// model is tokenizer.ggml.model; pre tokenizer.ggml.pre.
	model, pre string
	// tokens, types and scores are per id (scores and types may be empty).
	tokens []string
	types  []int32
	scores []float32
	// merges are "left right" pairs (gpt2).
	merges []string
	// bos, eos and unk are token ids, -1 when absent.
	bos, eos, unk int
	// addBOS, addEOS and addSpace are the prompt rules.
	addBOS, addEOS, addSpace bool
	// chat is the chat template, "" when absent.
	chat string
}

// readTokenizer reads the tokenizer metadata, checking its arrays against each other.
func (g *ggufFile) readTokenizer() (*ggufTokenizer, error) {
	t := &ggufTokenizer{bos: -1, eos: -1, unk: -1}
	var err error
	if t.model, err = g.str("tokenizer.ggml.model"); err != nil {
		if errors.Is(err, errNoKey) {
			return nil, fmt.Errorf("no tokenizer (metadata \"tokenizer.ggml.model\" is missing): %w", fs.ErrNotExist)
		}
		return nil, err
	}
	if t.model != "llama" && t.model != "gpt2" {
		return nil, fmt.Errorf("metadata \"tokenizer.ggml.model\": %q is not supported (supported: llama, gpt2)", t.model)
	}
	toks, err := g.array("tokenizer.ggml.tokens", ggufString)
	if err != nil {
		return nil, err
	}
	if toks.n == 0 || toks.n > maxVocab {
		return nil, fmt.Errorf("metadata \"tokenizer.ggml.tokens\": %d tokens (want 1 to %d)", toks.n, maxVocab)
	}
	t.tokens = toks.strs
	n := toks.n
	if a, err := g.array("tokenizer.ggml.token_type", ggufI32); err == nil {
		if a.n != n {
			return nil, fmt.Errorf("metadata \"tokenizer.ggml.token_type\": %d types for %d tokens", a.n, n)
		}
		t.types = a.i32s()
	} else if !errors.Is(err, errNoKey) {
		return nil, err
	}
	if a, err := g.array("tokenizer.ggml.scores", ggufF32); err == nil {
		if a.n != n {
			return nil, fmt.Errorf("metadata \"tokenizer.ggml.scores\": %d scores for %d tokens", a.n, n)
		}
		t.scores = a.f32s()
	} else if !errors.Is(err, errNoKey) {
		return nil, err
	}
	if t.model == "gpt2" {
		a, err := g.array("tokenizer.ggml.merges", ggufString)
		if err != nil {
			return nil, err
		}
		t.merges = a.strs
		if t.pre, err = g.str("tokenizer.ggml.pre"); errors.Is(err, errNoKey) {
			t.pre = "default"
		} else if err != nil {
			return nil, err
		}
	} else if t.scores == nil {
		return nil, errors.New("metadata \"tokenizer.ggml.scores\": missing (a \"llama\" tokenizer merges by score)")
	}
	id := func(key string) (int, error) {
		v, err := g.uint(key)
		if errors.Is(err, errNoKey) {
			return -1, nil
		}
		if err == nil && v >= uint64(n) {
			err = fmt.Errorf("metadata %q: %d is not a token (there are %d)", key, v, n)
		}
		return int(v), err
	}
	if t.bos, err = id("tokenizer.ggml.bos_token_id"); err != nil {
		return nil, err
	}
	if t.eos, err = id("tokenizer.ggml.eos_token_id"); err != nil {
		return nil, err
	}
	if t.unk, err = id("tokenizer.ggml.unknown_token_id"); err != nil {
		return nil, err
	}
	flag := func(key string, def bool) (bool, error) {
		v, err := g.boolean(key)
		if errors.Is(err, errNoKey) {
			return def, nil
		}
		return v, err
	}
	if t.addBOS, err = flag("tokenizer.ggml.add_bos_token", t.model == "llama"); err != nil {
		return nil, err
	}
	if t.addEOS, err = flag("tokenizer.ggml.add_eos_token", false); err != nil {
		return nil, err
	}
	if t.addSpace, err = flag("tokenizer.ggml.add_space_prefix", t.model == "llama"); err != nil {
		return nil, err
	}
	if (t.addBOS && t.bos < 0) || (t.addEOS && t.eos < 0) {
		return nil, errors.New("metadata \"tokenizer.ggml.add_bos_token\" or \"add_eos_token\" is true, but the token's id is missing")
	}
	if t.chat, err = g.str("tokenizer.chat_template"); err != nil && !errors.Is(err, errNoKey) {
		return nil, err
	}
	return t, nil
}

// typeOf is token id's type (normal where the file gives none).
func (t *ggufTokenizer) typeOf(id int) int32 {
	if t.types == nil {
		return ggufTokNormal
	}
	return t.types[id]
}

// tokenizerFiles makes tokenizer.json and tokenizer_config.json from the metadata.
func (g *ggufFile) tokenizerFiles() (tok, cfg []byte, err error) {
	t, err := g.readTokenizer()
	if err != nil {
		return nil, nil, err
	}
	vocab := make(map[string]int32, len(t.tokens))
	var added []map[string]any
	for id, s := range t.tokens {
		switch typ := t.typeOf(id); typ {
		case ggufTokControl, ggufTokUnknown, ggufTokUserDefined:
			added = append(added, map[string]any{"id": id, "content": s, "single_word": false, "lstrip": false,
				"rstrip": false, "normalized": false, "special": typ != ggufTokUserDefined})
		}
		if _, dup := vocab[s]; !dup {
			vocab[s] = int32(id)
		}
	}
	doc := map[string]any{"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added}
	bpe := map[string]any{"type": "BPE", "dropout": nil, "continuing_subword_prefix": nil, "end_of_word_suffix": nil,
		"ignore_merges": false, "vocab": vocab}
	switch t.model {
	case "llama":
		unk := "<unk>"
		if t.unk >= 0 {
			unk = t.tokens[t.unk]
		}
		bpe["unk_token"], bpe["fuse_unk"], bpe["byte_fallback"] = unk, true, true
		bpe["merges"] = spmMerges(t)
		replace := map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"}
		decoders := []any{map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"}}
		if t.addSpace {
			doc["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{
				map[string]any{"type": "Prepend", "prepend": "▁"}, replace}}
			decoders = append(decoders, map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0})
		} else {
			doc["normalizer"] = replace
		}
		doc["pre_tokenizer"] = nil
		doc["decoder"] = map[string]any{"type": "Sequence", "decoders": decoders}
	case "gpt2":
		pre, ok := ggufPreTokenizers[t.pre]
		if !ok {
			names := make([]string, 0, len(ggufPreTokenizers))
			for n := range ggufPreTokenizers {
				names = append(names, n)
			}
			sort.Strings(names)
			return nil, nil, fmt.Errorf("metadata \"tokenizer.ggml.pre\": %q is not supported (supported: %s)", t.pre, strings.Join(names, ", "))
		}
		for i, m := range t.merges {
			if strings.Count(m, " ") != 1 {
				return nil, nil, fmt.Errorf("metadata \"tokenizer.ggml.merges\": merge %d %q is not two tokens separated by a space", i, m)
			}
		}
		bpe["unk_token"], bpe["fuse_unk"], bpe["byte_fallback"] = nil, false, false
		bpe["merges"] = t.merges
		// Llama 3's pre-tokenization comes with ignore_merges (a word in the vocabulary
		// is one token), in Hugging Face's files and in llama.cpp alike.
		bpe["ignore_merges"] = t.pre == "llama-bpe" || t.pre == "llama3"
		doc["normalizer"], doc["pre_tokenizer"] = pre[0], pre[1]
		doc["decoder"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}
	}
	doc["model"] = bpe
	doc["post_processor"] = nil
	if t.addBOS || t.addEOS {
		single := []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}}
		specials := map[string]any{}
		for _, side := range []struct {
			on    bool
			id    int
			front bool
		}{{t.addBOS, t.bos, true}, {t.addEOS, t.eos, false}} {
			if !side.on {
				continue
			}
			name := t.tokens[side.id]
			piece := map[string]any{"SpecialToken": map[string]any{"id": name, "type_id": 0}}
			if side.front {
				single = append([]any{piece}, single...)
			} else {
				single = append(single, piece)
			}
			specials[name] = map[string]any{"id": name, "ids": []int{side.id}, "tokens": []string{name}}
		}
		doc["post_processor"] = map[string]any{"type": "TemplateProcessing", "single": single, "pair": single,
			"special_tokens": specials}
	}
	conf := map[string]any{"add_bos_token": t.addBOS, "add_eos_token": t.addEOS}
	if t.bos >= 0 {
		conf["bos_token"] = t.tokens[t.bos]
	}
	if t.eos >= 0 {
		conf["eos_token"] = t.tokens[t.eos]
	}
	if t.chat != "" {
		conf["chat_template"] = t.chat
	}
	if tok, err = json.Marshal(doc); err != nil {
		return nil, nil, err
	}
	if cfg, err = json.Marshal(conf); err != nil {
		return nil, nil, err
	}
	return tok, cfg, nil
}

// maxMergedPiece bounds the pieces spmMerges splits (SentencePiece's own limit on a
// piece is 16 characters).
const maxMergedPiece = 256

// spmMerges derives a SentencePiece vocabulary's merges as transformers'
// SentencePieceExtractor does: for every normal piece, each split into two normal
// pieces (the left one's id, then the right one's, ordering a piece's splits); pieces by
// score, highest first (ties by id). As [left, right] pairs (a piece may hold a space).
func spmMerges(t *ggufTokenizer) [][2]string {
	ids := make(map[string]int, len(t.tokens))
	for id, s := range t.tokens {
		if t.typeOf(id) == ggufTokNormal || t.typeOf(id) == ggufTokUserDefined {
			if _, dup := ids[s]; !dup {
				ids[s] = id
			}
		}
	}
	order := make([]int, 0, len(t.tokens))
	for id := range t.tokens {
		if t.typeOf(id) == ggufTokNormal {
			order = append(order, id)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(t.scores[b], t.scores[a]) })
	type split struct{ l, r int }
	var merges [][2]string
	var local []split
	for _, id := range order {
		s := t.tokens[id]
		local = local[:0]
		if len(s) > maxMergedPiece {
			continue // no real piece is this long; splitting one costs its length squared
		}
		for i := range s {
			if i == 0 || !utf8.RuneStart(s[i]) {
				continue
			}
			l, okL := ids[s[:i]]
			r, okR := ids[s[i:]]
			if okL && okR {
				local = append(local, split{l, r})
			}
		}
		slices.SortFunc(local, func(a, b split) int { return cmp.Or(cmp.Compare(a.l, b.l), cmp.Compare(a.r, b.r)) })
		for _, sp := range local {
			merges = append(merges, [2]string{t.tokens[sp.l], t.tokens[sp.r]})
		}
	}
	return merges
}

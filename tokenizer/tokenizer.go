package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// Tokenizer is a BPE tokenizer read from a Hugging Face tokenizer.json, in the
// configurations GPT-2 and the LLaMA family ship: byte-level BPE (GPT-2, Llama 3, Qwen2,
// SmolLM: a ByteLevel pre-tokenizer, alone or after a Split regex or Digits), and
// SentencePiece-style BPE with byte fallback (Llama 2, TinyLlama, Mistral: a
// Prepend/Replace normalizer or a Metaspace pre-tokenizer). Text goes through the same
// stages as in the Hugging Face library — added tokens, normalizer, pre-tokenizer, BPE,
// post-processor — and back through the file's decoder. It is safe for concurrent use.
type Tokenizer struct {
	// tokens holds each id's token as the file spells it ("Ġthe", "▁the", "<0x0A>",
	// "<s>"); ok[id] says whether the id is defined.
	tokens []string
	ok     []bool
	// special marks the added tokens flagged special, which decoding for display skips.
	special []bool
	// vocab maps the model's tokens to ids.
	vocab map[string]int32
	// added matches the added tokens in text.
	added addedVocab
	// norm is the normalizer; nil when there is none.
	norm normalizer
	// pre run in order, each on the pieces of the one before.
	pre []preTokenizer
	// byteLevel says a ByteLevel pre-tokenizer is in pre: BPE then starts from bytes.
	byteLevel bool
	// model turns each piece into tokens.
	model *bpeModel
	// dec is the decoder chain; nil means tokens are joined with spaces (the library's
	// behaviour without a decoder).
	dec []decoder
	// prefix and suffix are the ids post-processing puts around a prompt.
	prefix, suffix []int32
	// pieceBytes is the most bytes of a pre-token one model token stands for, and
	// maxTokenBytes the most bytes of text any token does (added tokens too); both 0
	// when unbounded (runs of unknown characters fused into one token).
	pieceBytes, maxTokenBytes int

	// mu guards cache.
	mu sync.Mutex
	// cache memoizes the BPE of frequent pieces.
	cache map[string][]int32
}

// cacheLimit bounds the piece cache; it is cleared when full, which keeps the common
// pieces cached under any input.
const cacheLimit = 1 << 16

// Load reads a tokenizer.json, and the tokenizer_config.json beside it when
// there is one (add_bos_token and add_eos_token decide what a prompt starts and ends
// with, as transformers' Llama tokenizers do).
func Load(path string) (*Tokenizer, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	t, err := parseTokenizer(raw)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
	}
	cfgPath := filepath.Join(filepath.Dir(path), "tokenizer_config.json")
	switch cfg, err := os.ReadFile(cfgPath); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("load tokenizer: %w", err)
	default:
		if err := t.applyConfig(cfg); err != nil {
			return nil, fmt.Errorf("load tokenizer %s: %w", cfgPath, err)
		}
	}
	return t, nil
}

// Parse builds a tokenizer from the bytes of a tokenizer.json and, when not nil, of its
// tokenizer_config.json, as Load reads them from files (model.TokenizerFiles makes them
// for a GGUF checkpoint).
func Parse(tokenizerJSON, tokenizerConfigJSON []byte) (*Tokenizer, error) {
	t, err := parseTokenizer(tokenizerJSON)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if tokenizerConfigJSON != nil {
		if err := t.applyConfig(tokenizerConfigJSON); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: %w", err)
		}
	}
	return t, nil
}

// tokenizerConfig is the part of tokenizer_config.json that changes encoding.
type tokenizerConfig struct {
	// AddBOSToken and AddEOSToken, when present, decide whether a prompt gets the BOS
	// and EOS tokens, over the post-processor of tokenizer.json.
	AddBOSToken *bool `json:"add_bos_token"`
	AddEOSToken *bool `json:"add_eos_token"`
	// BOSToken and EOSToken name them: a string or an object with "content".
	BOSToken json.RawMessage `json:"bos_token"`
	EOSToken json.RawMessage `json:"eos_token"`
}

// applyConfig applies tokenizer_config.json's add_bos_token and add_eos_token.
func (t *Tokenizer) applyConfig(raw []byte) error {
	var c tokenizerConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	side := func(add *bool, name json.RawMessage, field string, cur []int32) ([]int32, error) {
		if add == nil {
			return cur, nil
		}
		if !*add {
			return nil, nil
		}
		tok, err := specialTokenName(name)
		if err != nil || tok == "" {
			return nil, fmt.Errorf("add_%s_token is true but %s_token is missing or not a token name (%v)", field, field, err)
		}
		id, ok := t.TokenID(tok)
		if !ok {
			return nil, fmt.Errorf("%s_token %q is not in the tokenizer's vocabulary", field, tok)
		}
		return []int32{id}, nil
	}
	var err error
	if t.prefix, err = side(c.AddBOSToken, c.BOSToken, "bos", t.prefix); err != nil {
		return err
	}
	t.suffix, err = side(c.AddEOSToken, c.EOSToken, "eos", t.suffix)
	return err
}

// specialTokenName reads a tokenizer_config.json token: "…", {"content": "…"} or null.
func specialTokenName(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("%s is neither a string nor an object with content", raw)
	}
	return o.Content, nil
}

// VocabSize is one more than the largest token id.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenID looks a token up as tokenizer.json spells it: an added token's content
// ("<|endoftext|>") or a vocabulary entry ("Ġthe", "▁the", "<0x0A>").
func (t *Tokenizer) TokenID(s string) (int32, bool) {
	if id, ok := t.added.byContent[s]; ok {
		return id, true
	}
	id, ok := t.vocab[s]
	return id, ok
}

// IsSpecial says whether id is an added token flagged special (BOS, EOS, chat markers).
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}

// PromptAffixes are the ids EncodePrompt puts before and after a prompt's tokens.
func (t *Tokenizer) PromptAffixes() (prefix, suffix []int32) { return t.prefix, t.suffix }

// Encode tokenizes text without special tokens around it (the library's
// add_special_tokens=False): added tokens written in the text are still recognized.
func (t *Tokenizer) Encode(text string) []int32 {
	ids, _ := t.encode(text, -1)
	return ids
}

// EncodePrompt tokenizes a prompt as the checkpoint's own tokenizer does by default
// (add_special_tokens=True): the post-processor's (or tokenizer_config.json's) BOS and
// EOS around the text. A prompt that already starts with the BOS token (a chat template
// that writes it) does not get a second one.
func (t *Tokenizer) EncodePrompt(text string) []int32 {
	ids, _ := t.encodePrompt(text, -1)
	return ids
}

// EncodePromptUpTo is EncodePrompt for a prompt that may hold at most n tokens: it
// stops as soon as the prompt is known to hold more — without tokenizing the rest, so
// that its work is bounded by n rather than by the text — and then reports false.
func (t *Tokenizer) EncodePromptUpTo(text string, n int) ([]int32, bool) {
	return t.encodePrompt(text, max(n, 0))
}

// MaxTokenBytes is the most bytes of text one token stands for (the longest
// vocabulary entry or added token), or 0 when that is unbounded (an unknown token that
// runs of unknown characters are fused into). A text longer than n × MaxTokenBytes
// bytes cannot be n tokens or fewer, whatever it holds — unless a normalizer shrinks it
// (lower-casing or compatibility forms may, slightly).
func (t *Tokenizer) MaxTokenBytes() int { return t.maxTokenBytes }

// encodePrompt is EncodePrompt with at most limit tokens (limit < 0: no limit); false
// when there are more.
func (t *Tokenizer) encodePrompt(text string, limit int) ([]int32, bool) {
	body, ok := t.encode(text, limit)
	if !ok {
		return nil, false
	}
	prefix := t.prefix
	if len(prefix) > 0 && len(body) >= len(prefix) && slices.Equal(body[:len(prefix)], prefix) {
		prefix = nil
	}
	if n := len(prefix) + len(body) + len(t.suffix); limit >= 0 && n > limit {
		return nil, false
	}
	out := make([]int32, 0, len(prefix)+len(body)+len(t.suffix))
	return append(append(append(out, prefix...), body...), t.suffix...), true
}

// encode is Encode stopping once more than limit tokens are certain (limit < 0: no
// limit); false then, with the ids so far.
func (t *Tokenizer) encode(text string, limit int) ([]int32, bool) {
	ids := []int32{}
	for _, seg := range t.added.split(text, 0, false) {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
		} else {
			var ok bool
			if ids, ok = t.encodeSegment(ids, seg, limit); !ok {
				return ids, false
			}
		}
		if limit >= 0 && len(ids) > limit {
			return ids, false
		}
	}
	return ids, true
}

// encodeSegment appends the ids of a stretch of text between added tokens: normalized,
// split again on the added tokens that match normalized text, pre-tokenized, BPE. With
// limit ≥ 0 it stops, reporting false, once the ids are sure to pass it: a pre-token
// that would (its bytes over pieceBytes are the fewest tokens it can make) is not run
// through BPE at all.
func (t *Tokenizer) encodeSegment(ids []int32, seg segment, limit int) ([]int32, bool) {
	text := seg.text
	if t.norm != nil {
		text = t.norm.normalize(text)
	}
	if text == "" {
		return ids, true
	}
	for _, sub := range t.added.split(text, seg.offset, true) {
		if sub.id >= 0 {
			ids = append(ids, sub.id)
			if limit >= 0 && len(ids) > limit {
				return ids, false
			}
			continue
		}
		pieces := []piece{{text: sub.text, first: sub.offset == 0}}
		for _, p := range t.pre {
			pieces = p.preTokenize(pieces)
		}
		for _, p := range pieces {
			if p.text == "" {
				continue
			}
			if limit >= 0 && t.pieceBytes > 0 && len(ids)+(len(p.text)+t.pieceBytes-1)/t.pieceBytes > limit {
				return ids, false
			}
			ids = t.encodePiece(ids, p.text)
			if limit >= 0 && len(ids) > limit {
				return ids, false
			}
		}
	}
	return ids, true
}

// encodePiece appends the BPE of one pre-token, through the cache.
func (t *Tokenizer) encodePiece(ids []int32, word string) []int32 {
	t.mu.Lock()
	cached, ok := t.cache[word]
	t.mu.Unlock()
	if ok {
		return append(ids, cached...)
	}
	out := t.model.encode(word, t.byteLevel)
	if len(word) <= 64 { // long pieces are rare; keep them from filling the cache
		t.mu.Lock()
		if len(t.cache) >= cacheLimit {
			clear(t.cache)
		}
		t.cache[word] = out
		t.mu.Unlock()
	}
	return append(ids, out...)
}

// token returns id's token and whether it is shown: unknown ids, and special tokens
// when skipSpecial is set, are not.
func (t *Tokenizer) token(id int32, skipSpecial bool) (string, bool) {
	if id < 0 || int(id) >= len(t.tokens) || !t.ok[id] || skipSpecial && t.special[id] {
		return "", false
	}
	return t.tokens[id], true
}

// Decode turns ids into text with the file's decoder, special tokens included (the
// library's skip_special_tokens=False). The text is valid UTF-8: bytes that do not form
// a character become U+FFFD as the library's decoders make them.
func (t *Tokenizer) Decode(ids []int32) string { return t.decode(ids, false) }

// DecodeText is Decode without the special tokens (skip_special_tokens=True): the text
// an answer shows.
func (t *Tokenizer) DecodeText(ids []int32) string { return t.decode(ids, true) }

// decode runs the decoder chain over ids' tokens.
func (t *Tokenizer) decode(ids []int32, skipSpecial bool) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if s, ok := t.token(id, skipSpecial); ok {
			toks = append(toks, s)
		}
	}
	if t.dec == nil {
		return ValidUTF8(strings.Join(toks, " "))
	}
	for _, d := range t.dec {
		toks = d.decode(toks)
	}
	return ValidUTF8(strings.Join(toks, ""))
}

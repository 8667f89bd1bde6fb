package tokenizer

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Reading tokenizer.json. Every component gollm does not implement fails the load,
// naming the field and the type, rather than tokenizing differently from the checkpoint.

// tokenizerFile is the part of tokenizer.json gollm reads.
type tokenizerFile struct {
	// AddedTokens hold the special and added tokens, matched before the model.
	AddedTokens []struct {
		ID         *int32 `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized *bool  `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	// Normalizer, PreTokenizer, PostProcessor and Decoder are the pipeline's components.
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	// Model holds the BPE vocabulary and merges.
	Model struct {
		Type         string            `json:"type"`
		Vocab        map[string]int32  `json:"vocab"`
		Merges       []json.RawMessage `json:"merges"`
		Dropout      *float64          `json:"dropout"`
		UnkToken     *string           `json:"unk_token"`
		FuseUnk      bool              `json:"fuse_unk"`
		ByteFallback bool              `json:"byte_fallback"`
		IgnoreMerges bool              `json:"ignore_merges"`
		// ContinuingSubwordPrefix and EndOfWordSuffix must be empty.
		ContinuingSubwordPrefix *string `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string `json:"end_of_word_suffix"`
	} `json:"model"`
}

// component is any normalizer, pre-tokenizer, post-processor or decoder: the fields of
// every type gollm reads, by their JSON names.
type component struct {
	Type string `json:"type"`
	// Sequence's parts.
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Decoders      []json.RawMessage `json:"decoders"`
	Processors    []json.RawMessage `json:"processors"`
	// Prepend.
	Prepend *string `json:"prepend"`
	// Replace and Split: a string or a regular expression; Replace's and Strip's content.
	Pattern *struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Content  *string `json:"content"`
	Behavior string  `json:"behavior"`
	Invert   bool    `json:"invert"`
	// ByteLevel.
	AddPrefixSpace *bool `json:"add_prefix_space"`
	UseRegex       *bool `json:"use_regex"`
	// Metaspace.
	Replacement   *string `json:"replacement"`
	PrependScheme *string `json:"prepend_scheme"`
	Split         *bool   `json:"split"`
	// Digits.
	IndividualDigits bool `json:"individual_digits"`
	// Strip (decoder) and Strip (normalizer).
	Start      int  `json:"start"`
	Stop       int  `json:"stop"`
	StripLeft  bool `json:"strip_left"`
	StripRight bool `json:"strip_right"`
	// TemplateProcessing.
	Single        []json.RawMessage `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int32 `json:"ids"`
	} `json:"special_tokens"`
}

// isNull says whether a component is absent.
func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// readComponent decodes a component.
func readComponent(field string, raw json.RawMessage) (component, error) {
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, fmt.Errorf("%s: %w", field, err)
	}
	return c, nil
}

// parseTokenizer builds a Tokenizer from tokenizer.json's bytes.
func parseTokenizer(raw []byte) (*Tokenizer, error) {
	var f tokenizerFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	t := &Tokenizer{cache: map[string][]int32{}}
	var err error
	if !isNull(f.Normalizer) {
		if t.norm, err = buildNormalizer("normalizer", f.Normalizer); err != nil {
			return nil, err
		}
	}
	if !isNull(f.PreTokenizer) {
		var p preTokenizer
		if p, err = t.buildPreTokenizer("pre_tokenizer", f.PreTokenizer); err != nil {
			return nil, err
		}
		t.pre = []preTokenizer{p}
	}
	if t.model, err = buildModel(&f, t.byteLevel); err != nil {
		return nil, err
	}
	t.vocab = t.model.vocab

	size, maxTok := int32(0), ""
	for tok, id := range t.vocab {
		if id+1 > size {
			size, maxTok = id+1, "model.vocab "+strconv.Quote(tok)
		}
	}
	t.added.byContent = map[string]int32{}
	for i, a := range f.AddedTokens {
		if a.ID == nil || *a.ID < 0 || a.Content == "" {
			return nil, fmt.Errorf("added_tokens[%d]: needs a non-negative id and non-empty content", i)
		}
		if id, ok := t.vocab[a.Content]; ok && id != *a.ID {
			return nil, fmt.Errorf("added_tokens[%d] %q: id %d, but model.vocab gives it %d", i, a.Content, *a.ID, id)
		}
		normalized := !a.Special // the library's default
		if a.Normalized != nil {
			normalized = *a.Normalized
		}
		tok := addedToken{content: a.Content, pattern: a.Content, id: *a.ID, special: a.Special,
			singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip, normalized: normalized}
		if normalized && t.norm != nil {
			tok.pattern = t.norm.normalize(a.Content)
			if tok.pattern == "" {
				return nil, fmt.Errorf("added_tokens[%d] %q: normalizes to nothing", i, a.Content)
			}
		}
		if normalized {
			t.added.norm = append(t.added.norm, tok)
		} else {
			t.added.raw = append(t.added.raw, tok)
		}
		t.added.byContent[a.Content] = *a.ID
		if *a.ID+1 > size {
			size, maxTok = *a.ID+1, fmt.Sprintf("added_tokens[%d] %q", i, a.Content)
		}
	}
	// Token ids index the tables below: ids far sparser than any tokenizer's (a mistake,
	// or a hostile file) must not size them.
	if entries := int64(len(t.vocab)) + int64(len(f.AddedTokens)); int64(size) > 2*entries+1<<16 {
		return nil, fmt.Errorf("%s has id %d, but there are only %d tokens: ids this sparse are not a vocabulary", maxTok, size-1, entries)
	}
	sortLongestFirst(t.added.raw)
	sortLongestFirst(t.added.norm)

	t.tokens = make([]string, size)
	t.ok = make([]bool, size)
	t.special = make([]bool, size)
	for tok, id := range t.vocab {
		if t.ok[id] {
			return nil, fmt.Errorf("model.vocab: id %d is given to more than one token (one is %q)", id, tok)
		}
		t.tokens[id], t.ok[id] = tok, true
	}
	for _, list := range [][]addedToken{t.added.raw, t.added.norm} {
		for _, a := range list {
			t.tokens[a.id], t.ok[a.id] = a.content, true
			t.special[a.id] = a.special
		}
	}

	t.measureTokens()

	if !isNull(f.PostProcessor) {
		if err := t.buildPostProcessor("post_processor", f.PostProcessor); err != nil {
			return nil, err
		}
	}
	if !isNull(f.Decoder) {
		if err := t.buildDecoder("decoder", f.Decoder); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// buildModel reads the BPE model.
func buildModel(f *tokenizerFile, byteLevel bool) (*bpeModel, error) {
	m := &f.Model
	switch {
	case m.Type != "BPE":
		return nil, fmt.Errorf("model.type %q is not supported (want BPE)", m.Type)
	case len(m.Vocab) == 0:
		return nil, fmt.Errorf("model.vocab is missing or empty")
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, fmt.Errorf("model.dropout %g is not supported", *m.Dropout)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "",
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("model.continuing_subword_prefix and end_of_word_suffix are not supported")
	}
	b := &bpeModel{vocab: m.Vocab, merges: make(map[uint64]merge, len(m.Merges)), unk: -1,
		fuseUnk: m.FuseUnk, byteFallback: m.ByteFallback, ignoreMerges: m.IgnoreMerges}
	for tok, id := range m.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("model.vocab[%q]: negative id %d", tok, id)
		}
	}
	if m.UnkToken != nil && *m.UnkToken != "" {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in model.vocab", *m.UnkToken)
		}
		b.unk = id
	}
	for i := range 256 {
		b.byteIDs[i], b.fallback[i] = -1, -1
		if id, ok := m.Vocab[string(byteRunes[i])]; ok {
			b.byteIDs[i] = id
		}
		if id, ok := m.Vocab[byteToken(byte(i))]; ok {
			b.fallback[i] = id
		}
		if byteLevel && b.byteIDs[i] < 0 {
			return nil, fmt.Errorf("model.vocab: no token for byte %#02x (%q); byte-level BPE needs all 256", i, byteRunes[i])
		}
	}
	for rank, rawMerge := range m.Merges {
		left, right, err := parseMerge(rawMerge)
		if err != nil {
			return nil, fmt.Errorf("model.merges[%d]: %w", rank, err)
		}
		l, okL := m.Vocab[left]
		r, okR := m.Vocab[right]
		id, okM := m.Vocab[left+right]
		if !okL || !okR || !okM {
			return nil, fmt.Errorf("model.merges[%d] %q %q: the parts and their join must all be in model.vocab", rank, left, right)
		}
		key := uint64(uint32(l))<<32 | uint64(uint32(r))
		if _, dup := b.merges[key]; !dup { // the first (lowest rank) of a repeated merge counts
			b.merges[key] = merge{rank: int32(rank), id: id}
		}
	}
	return b, nil
}

// parseMerge reads a merge as "left right" or ["left", "right"].
func parseMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		left, right, ok := strings.Cut(s, " ")
		if !ok || left == "" || right == "" || strings.Contains(right, " ") {
			return "", "", fmt.Errorf("%q is not two tokens separated by one space", s)
		}
		return left, right, nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 || pair[0] == "" || pair[1] == "" {
		return "", "", fmt.Errorf("%s is neither \"left right\" nor [\"left\", \"right\"]", raw)
	}
	return pair[0], pair[1], nil
}

// stringOrRegex reads a Replace's or Split's pattern: the literal, or a compiled
// expression (Oniguruma's \s made Unicode, for Split).
func stringOrRegex(field string, c component, split bool) (string, *regexp.Regexp, *splitRegex, error) {
	switch {
	case c.Pattern == nil:
		return "", nil, nil, fmt.Errorf("%s: %s without a pattern", field, c.Type)
	case c.Pattern.String != nil:
		if *c.Pattern.String == "" {
			return "", nil, nil, fmt.Errorf("%s: %s with an empty pattern", field, c.Type)
		}
		return *c.Pattern.String, nil, nil, nil
	case c.Pattern.Regex != nil:
		sr, err := compileSplitRegex(*c.Pattern.Regex)
		if err != nil {
			return "", nil, nil, fmt.Errorf("%s: %w", field, err)
		}
		if split {
			return "", nil, sr, nil
		}
		if sr.ws >= 0 {
			return "", nil, nil, fmt.Errorf("%s: %s pattern with a lookahead is not supported", field, c.Type)
		}
		return "", sr.re, nil, nil
	}
	return "", nil, nil, fmt.Errorf("%s: %s pattern is neither String nor Regex", field, c.Type)
}

// buildNormalizer reads a normalizer.
func buildNormalizer(field string, raw json.RawMessage) (normalizer, error) {
	c, err := readComponent(field, raw)
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		var ns normalizers
		for i, part := range c.Normalizers {
			n, err := buildNormalizer(fmt.Sprintf("%s.normalizers[%d]", field, i), part)
			if err != nil {
				return nil, err
			}
			ns = append(ns, n)
		}
		return ns, nil
	case "Prepend":
		if c.Prepend == nil {
			return nil, fmt.Errorf("%s: Prepend without prepend", field)
		}
		return prependNormalizer{*c.Prepend}, nil
	case "Replace":
		old, re, _, err := stringOrRegex(field, c, false)
		if err != nil {
			return nil, err
		}
		if c.Content == nil {
			return nil, fmt.Errorf("%s: Replace without content", field)
		}
		return replaceNormalizer{old: old, content: *c.Content, re: re}, nil
	case "NFC":
		return unicodeNormalizer{norm.NFC}, nil
	case "NFD":
		return unicodeNormalizer{norm.NFD}, nil
	case "NFKC":
		return unicodeNormalizer{norm.NFKC}, nil
	case "NFKD":
		return unicodeNormalizer{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNormalizer{}, nil
	case "Strip":
		return stripNormalizer{c.StripLeft, c.StripRight}, nil
	}
	return nil, fmt.Errorf("%s: type %q is not supported", field, c.Type)
}

// buildPreTokenizer reads a pre-tokenizer; a ByteLevel one makes the model byte-level.
func (t *Tokenizer) buildPreTokenizer(field string, raw json.RawMessage) (preTokenizer, error) {
	c, err := readComponent(field, raw)
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		var ps preTokenizers
		for i, part := range c.Pretokenizers {
			p, err := t.buildPreTokenizer(fmt.Sprintf("%s.pretokenizers[%d]", field, i), part)
			if err != nil {
				return nil, err
			}
			ps = append(ps, p)
		}
		return ps, nil
	case "ByteLevel":
		t.byteLevel = true
		return byteLevelPre{addPrefixSpace: c.AddPrefixSpace != nil && *c.AddPrefixSpace,
			useRegex: c.UseRegex == nil || *c.UseRegex}, nil
	case "Metaspace":
		repl, err := metaspaceReplacement(field, c)
		if err != nil {
			return nil, err
		}
		return metaspacePre{repl: repl, scheme: metaspaceScheme(c), split: c.Split == nil || *c.Split}, nil
	case "Digits":
		return digitsPre{individual: c.IndividualDigits}, nil
	case "Split":
		if c.Invert {
			return nil, fmt.Errorf("%s: Split with invert is not supported", field)
		}
		b, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, fmt.Errorf("%s: Split: %w", field, err)
		}
		lit, _, re, err := stringOrRegex(field, c, true)
		if err != nil {
			return nil, err
		}
		return splitPre{literal: lit, re: re, behavior: b}, nil
	}
	return nil, fmt.Errorf("%s: type %q is not supported", field, c.Type)
}

// metaspaceReplacement reads Metaspace's one-character replacement.
func metaspaceReplacement(field string, c component) (string, error) {
	if c.Replacement == nil || utf8.RuneCountInString(*c.Replacement) != 1 {
		return "", fmt.Errorf("%s: Metaspace needs a one-character replacement", field)
	}
	return *c.Replacement, nil
}

// metaspaceScheme reads prepend_scheme, or the older add_prefix_space.
func metaspaceScheme(c component) string {
	if c.PrependScheme != nil {
		return *c.PrependScheme
	}
	if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
		return "never"
	}
	return "always"
}

// buildPostProcessor reads the post-processor: ByteLevel changes no ids; a
// TemplateProcessing's single template gives the ids around a prompt.
func (t *Tokenizer) buildPostProcessor(field string, raw json.RawMessage) error {
	c, err := readComponent(field, raw)
	if err != nil {
		return err
	}
	switch c.Type {
	case "Sequence":
		for i, part := range c.Processors {
			if err := t.buildPostProcessor(fmt.Sprintf("%s.processors[%d]", field, i), part); err != nil {
				return err
			}
		}
		return nil
	case "ByteLevel":
		return nil
	case "TemplateProcessing":
		var prefix, suffix []int32
		seen := false
		for i, item := range c.Single {
			var it struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			}
			if err := json.Unmarshal(item, &it); err != nil {
				return fmt.Errorf("%s.single[%d]: %w", field, i, err)
			}
			switch {
			case it.Sequence != nil:
				if seen || it.Sequence.ID != "A" {
					return fmt.Errorf("%s.single[%d]: want one sequence $A, got %q", field, i, it.Sequence.ID)
				}
				seen = true
			case it.SpecialToken != nil:
				st, ok := c.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("%s.single[%d]: special token %q is not in special_tokens", field, i, it.SpecialToken.ID)
				}
				for _, id := range st.IDs {
					if id < 0 || int(id) >= len(t.tokens) || !t.ok[id] {
						return fmt.Errorf("%s: special token %q has id %d outside the vocabulary", field, it.SpecialToken.ID, id)
					}
				}
				if seen {
					suffix = append(suffix, st.IDs...)
				} else {
					prefix = append(prefix, st.IDs...)
				}
			default:
				return fmt.Errorf("%s.single[%d]: neither SpecialToken nor Sequence", field, i)
			}
		}
		if !seen {
			return fmt.Errorf("%s: the single template has no $A", field)
		}
		t.prefix, t.suffix = prefix, suffix
		return nil
	}
	return fmt.Errorf("%s: type %q is not supported", field, c.Type)
}

// buildDecoder reads the decoder chain.
func (t *Tokenizer) buildDecoder(field string, raw json.RawMessage) error {
	c, err := readComponent(field, raw)
	if err != nil {
		return err
	}
	switch c.Type {
	case "Sequence":
		for i, part := range c.Decoders {
			if err := t.buildDecoder(fmt.Sprintf("%s.decoders[%d]", field, i), part); err != nil {
				return err
			}
		}
		if t.dec == nil {
			t.dec = []decoder{} // an empty chain still joins without spaces
		}
		return nil
	case "ByteLevel":
		t.dec = append(t.dec, byteLevelDecoder{})
	case "Replace":
		old, re, _, err := stringOrRegex(field, c, false)
		if err != nil {
			return err
		}
		if c.Content == nil {
			return fmt.Errorf("%s: Replace without content", field)
		}
		t.dec = append(t.dec, replaceDecoder{old: old, content: *c.Content, re: re})
	case "ByteFallback":
		t.dec = append(t.dec, byteFallbackDecoder{})
	case "Fuse":
		t.dec = append(t.dec, fuseDecoder{})
	case "Strip":
		if c.Content == nil || utf8.RuneCountInString(*c.Content) != 1 || c.Start < 0 || c.Stop < 0 {
			return fmt.Errorf("%s: Strip needs a one-character content and non-negative start and stop", field)
		}
		r, _ := utf8.DecodeRuneInString(*c.Content)
		t.dec = append(t.dec, stripDecoder{content: r, start: c.Start, stop: c.Stop})
	case "Metaspace":
		repl, err := metaspaceReplacement(field, c)
		if err != nil {
			return err
		}
		t.dec = append(t.dec, metaspaceDecoder{repl: repl, dropFirst: metaspaceScheme(c) != "never"})
	default:
		return fmt.Errorf("%s: type %q is not supported", field, c.Type)
	}
	return nil
}

// measureTokens sets pieceBytes and maxTokenBytes. A model token stands for the bytes of
// a pre-token it spells: its length in bytes (byte-level models spell each byte as one
// character; a <0xNN> or unknown token stands for one character, fewer bytes than its
// spelling). Runs of unknown characters fused into one unknown token, and added tokens
// that take the whitespace beside them, have no bound.
func (t *Tokenizer) measureTokens() {
	m := t.model
	fullFallback := m.byteFallback
	for _, id := range m.fallback {
		fullFallback = fullFallback && id >= 0
	}
	piece := 0
	if !(m.unk >= 0 && m.fuseUnk && !fullFallback) {
		for tok := range t.vocab {
			n := len(tok)
			if t.byteLevel {
				n = utf8.RuneCountInString(tok)
			}
			piece = max(piece, n, utf8.UTFMax)
		}
	}
	t.pieceBytes, t.maxTokenBytes = piece, piece
	if piece == 0 {
		return
	}
	for _, list := range [][]addedToken{t.added.raw, t.added.norm} {
		for _, a := range list {
			if a.lstrip || a.rstrip {
				// It takes the whitespace beside it, however long.
				t.maxTokenBytes = 0
				return
			}
			t.maxTokenBytes = max(t.maxTokenBytes, len(a.content), len(a.pattern))
		}
	}
}

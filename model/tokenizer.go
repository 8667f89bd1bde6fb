package model

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Tokenizer is a byte-level BPE tokenizer (GPT-2's) read from a Hugging Face
// tokenizer.json. It is safe for concurrent use.
type Tokenizer struct {
	// vocab maps a token as tokenizer.json spells it (bytes as printable runes) to its id.
	vocab map[string]int32
	// pieces holds each id's decoded bytes; nil for ids the file does not define.
	pieces [][]byte
	// byteIDs is the id of each single-byte token, where BPE starts.
	byteIDs [256]int32
	// merges maps a pair of ids (left<<32 | right) to its rank and merged id.
	merges map[uint64]merge
	// added are the added tokens, longest first, matched verbatim before pre-tokenization.
	added []addedToken

	// mu guards cache.
	mu sync.Mutex
	// cache memoizes the BPE of frequent pre-tokens.
	cache map[string][]int32
}

// merge is one BPE merge rule.
type merge struct {
	// rank orders merges: lower merges first.
	rank int32
	// id is the merged token.
	id int32
}

// addedToken is a token matched as a whole in the input, like <|endoftext|>.
type addedToken struct {
	// content is the token's text.
	content string
	// id is its token id.
	id int32
}

// cacheLimit bounds the word cache; it is cleared when full, which keeps the common
// words cached under any input.
const cacheLimit = 1 << 16

// byteRunes is GPT-2's byte→unicode table: printable Latin-1 bytes stand for themselves,
// the others (controls, space, …) map to U+0100 onwards in byte order, so every token is
// a printable string.
var byteRunes, runeBytes = func() ([256]rune, map[rune]byte) {
	var table [256]rune
	inverse := make(map[rune]byte, 256)
	next := rune(256)
	for b := range 256 {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			table[b] = rune(b)
		} else {
			table[b] = next
			next++
		}
		inverse[table[b]] = byte(b)
	}
	return table, inverse
}()

// ByteLevelString spells raw bytes the way byte-level BPE vocabularies do ("Ġthe" for
// " the").
func ByteLevelString(raw []byte) string {
	var sb strings.Builder
	for _, b := range raw {
		sb.WriteRune(byteRunes[b])
	}
	return sb.String()
}

// tokenizerFile is the part of tokenizer.json gollm reads.
type tokenizerFile struct {
	// AddedTokens are the special and added tokens.
	AddedTokens []struct {
		// ID is the token id.
		ID *int32 `json:"id"`
		// Content is the token text.
		Content string `json:"content"`
		// SingleWord, LStrip and RStrip change how the token matches; unsupported.
		SingleWord bool `json:"single_word"`
		LStrip     bool `json:"lstrip"`
		RStrip     bool `json:"rstrip"`
	} `json:"added_tokens"`
	// Normalizer must be null: byte-level BPE sees the text unchanged.
	Normalizer json.RawMessage `json:"normalizer"`
	// PreTokenizer must be ByteLevel.
	PreTokenizer json.RawMessage `json:"pre_tokenizer"`
	// PostProcessor must be null or ByteLevel (which adds no tokens).
	PostProcessor json.RawMessage `json:"post_processor"`
	// Decoder must be null or ByteLevel.
	Decoder json.RawMessage `json:"decoder"`
	// Model is the BPE model.
	Model struct {
		// Type must be "BPE".
		Type string `json:"type"`
		// Vocab maps tokens to ids.
		Vocab map[string]int32 `json:"vocab"`
		// Merges are "left right" strings or [left, right] pairs, by rank.
		Merges []json.RawMessage `json:"merges"`
		// Dropout, if set and non-zero, makes BPE random; unsupported.
		Dropout *float64 `json:"dropout"`
		// ContinuingSubwordPrefix and EndOfWordSuffix must be empty for byte-level BPE.
		ContinuingSubwordPrefix string `json:"continuing_subword_prefix"`
		EndOfWordSuffix         string `json:"end_of_word_suffix"`
	} `json:"model"`
}

// byteLevelOptions are the options of a ByteLevel pre-tokenizer, decoder or post-processor.
type byteLevelOptions struct {
	// Type names the component.
	Type string `json:"type"`
	// AddPrefixSpace prepends a space to the input; unsupported (GPT-2 does not).
	AddPrefixSpace bool `json:"add_prefix_space"`
	// UseRegex splits with GPT-2's pattern; absent means true.
	UseRegex *bool `json:"use_regex"`
}

// LoadTokenizer reads a tokenizer.json whose model is byte-level BPE (GPT-2's).
func LoadTokenizer(path string) (*Tokenizer, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	t, err := parseTokenizer(raw)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
	}
	return t, nil
}

// checkComponent checks that a pipeline component is ByteLevel without a prefix space
// (or absent, where nullOK).
func checkComponent(field string, raw json.RawMessage, nullOK bool) error {
	if len(raw) == 0 || string(raw) == "null" {
		if nullOK {
			return nil
		}
		return fmt.Errorf("%s: missing (want ByteLevel)", field)
	}
	var o byteLevelOptions
	if err := json.Unmarshal(raw, &o); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	switch {
	case o.Type != "ByteLevel":
		return fmt.Errorf("%s: type %q is not supported (want ByteLevel)", field, o.Type)
	case o.AddPrefixSpace && field == "pre_tokenizer":
		return fmt.Errorf("%s: add_prefix_space is not supported", field)
	case o.UseRegex != nil && !*o.UseRegex:
		return fmt.Errorf("%s: use_regex false is not supported", field)
	}
	return nil
}

// parseTokenizer builds a Tokenizer from tokenizer.json's bytes.
func parseTokenizer(raw []byte) (*Tokenizer, error) {
	var f tokenizerFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	m := &f.Model
	switch {
	case m.Type != "BPE":
		return nil, fmt.Errorf("model.type %q is not supported (want BPE)", m.Type)
	case len(m.Vocab) == 0:
		return nil, fmt.Errorf("model.vocab is missing or empty")
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, fmt.Errorf("model.dropout %g is not supported", *m.Dropout)
	case m.ContinuingSubwordPrefix != "" || m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("model.continuing_subword_prefix and end_of_word_suffix must be empty for byte-level BPE")
	case len(f.Normalizer) > 0 && string(f.Normalizer) != "null":
		return nil, fmt.Errorf("normalizer: must be null for byte-level BPE, got %s", f.Normalizer)
	}
	if err := checkComponent("pre_tokenizer", f.PreTokenizer, false); err != nil {
		return nil, err
	}
	if err := checkComponent("decoder", f.Decoder, true); err != nil {
		return nil, err
	}
	if err := checkComponent("post_processor", f.PostProcessor, true); err != nil {
		return nil, err
	}

	t := &Tokenizer{vocab: m.Vocab, merges: make(map[uint64]merge, len(m.Merges)), cache: map[string][]int32{}}
	size := int32(0)
	for tok, id := range m.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("model.vocab[%q]: negative id %d", tok, id)
		}
		size = max(size, id+1)
	}
	for i, a := range f.AddedTokens {
		if a.ID == nil || *a.ID < 0 || a.Content == "" {
			return nil, fmt.Errorf("added_tokens[%d]: needs a non-negative id and non-empty content", i)
		}
		if a.SingleWord || a.LStrip || a.RStrip {
			return nil, fmt.Errorf("added_tokens[%d] %q: single_word, lstrip and rstrip are not supported", i, a.Content)
		}
		if id, ok := m.Vocab[a.Content]; ok && id != *a.ID {
			return nil, fmt.Errorf("added_tokens[%d] %q: id %d, but model.vocab gives it %d", i, a.Content, *a.ID, id)
		}
		t.added = append(t.added, addedToken{a.Content, *a.ID})
		size = max(size, *a.ID+1)
	}
	// Longest first, so that of two added tokens starting at one place the longer wins.
	sort.SliceStable(t.added, func(i, j int) bool { return len(t.added[i].content) > len(t.added[j].content) })

	t.pieces = make([][]byte, size)
	for tok, id := range m.Vocab {
		if t.pieces[id] != nil {
			return nil, fmt.Errorf("model.vocab: id %d is given to more than one token (one is %q)", id, tok)
		}
		t.pieces[id] = decodeByteLevel(tok)
	}
	for _, a := range t.added {
		if _, inVocab := m.Vocab[a.content]; !inVocab {
			t.pieces[a.id] = []byte(a.content)
		}
	}
	for b := range 256 {
		id, ok := m.Vocab[string(byteRunes[b])]
		if !ok {
			return nil, fmt.Errorf("model.vocab: no token for byte %#02x (%q); byte-level BPE needs all 256", b, byteRunes[b])
		}
		t.byteIDs[b] = id
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
		key := uint64(l)<<32 | uint64(r)
		if _, dup := t.merges[key]; !dup { // the first (lowest rank) of a repeated merge counts
			t.merges[key] = merge{rank: int32(rank), id: id}
		}
	}
	return t, nil
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

// decodeByteLevel maps a vocabulary token back to its bytes. A token with a rune outside
// the byte table (an added token stored in the vocab) stands for its own UTF-8, as in
// HF's ByteLevel decoder.
func decodeByteLevel(tok string) []byte {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := runeBytes[r]
		if !ok {
			return []byte(tok)
		}
		out = append(out, b)
	}
	return out
}

// VocabSize is one more than the largest token id.
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }

// TokenID looks a token up as tokenizer.json spells it: an added token's content
// ("<|endoftext|>") or a vocabulary entry in byte-level form ("Ġthe").
func (t *Tokenizer) TokenID(s string) (int32, bool) {
	for _, a := range t.added {
		if a.content == s {
			return a.id, true
		}
	}
	id, ok := t.vocab[s]
	return id, ok
}

// Encode tokenizes text: added tokens are matched verbatim first, the rest is split
// with GPT-2's pre-tokenization pattern and each piece encoded by byte-level BPE.
func (t *Tokenizer) Encode(text string) []int32 {
	ids := []int32{}
	for len(text) > 0 {
		at, tok := t.nextAdded(text)
		ids = t.encodeOrdinary(ids, text[:at])
		if tok == nil {
			break
		}
		ids = append(ids, tok.id)
		text = text[at+len(tok.content):]
	}
	return ids
}

// nextAdded finds the leftmost added token in text (the longest, where several start
// there); it returns len(text) and nil when there is none.
func (t *Tokenizer) nextAdded(text string) (int, *addedToken) {
	best, bestAt := -1, len(text)
	for i := range t.added {
		if at := strings.Index(text[:min(len(text), bestAt+len(t.added[i].content))], t.added[i].content); at >= 0 && at < bestAt {
			best, bestAt = i, at
		}
	}
	if best < 0 {
		return len(text), nil
	}
	return bestAt, &t.added[best]
}

// encodeOrdinary appends the ids of text, which holds no added token.
func (t *Tokenizer) encodeOrdinary(ids []int32, text string) []int32 {
	for len(text) > 0 {
		n := preTokenEnd(text)
		ids = t.encodeWord(ids, text[:n])
		text = text[n:]
	}
	return ids
}

// encodeWord appends the BPE of one pre-token, through the cache.
func (t *Tokenizer) encodeWord(ids []int32, word string) []int32 {
	t.mu.Lock()
	cached, ok := t.cache[word]
	t.mu.Unlock()
	if ok {
		return append(ids, cached...)
	}
	out := t.bpe(word)
	if len(word) <= 64 { // long words are rare; keep them from filling the cache
		t.mu.Lock()
		if len(t.cache) >= cacheLimit {
			clear(t.cache)
		}
		t.cache[word] = out
		t.mu.Unlock()
	}
	return append(ids, out...)
}

// preTokenEnd returns the length of the first pre-token of s under GPT-2's pattern
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// written out by hand because Go's regexp has no lookahead. Alternatives are tried in
// order, as the backtracking engines HF uses do.
func preTokenEnd(s string) int {
	r, w := utf8.DecodeRuneInString(s)
	if r == '\'' {
		for _, c := range [...]string{"s", "t", "re", "ve", "m", "ll", "d"} {
			if strings.HasPrefix(s[1:], c) {
				return 1 + len(c)
			}
		}
	}
	start := 0
	if r == ' ' && len(s) > 1 {
		// " ?" joins one space to a following letter, number or symbol run.
		if r2, w2 := utf8.DecodeRuneInString(s[1:]); !unicode.IsSpace(r2) {
			start, r, w = 1, r2, w2
		}
	}
	if !unicode.IsSpace(r) {
		class := runeClass(r)
		end := start + w
		for end < len(s) {
			r2, w2 := utf8.DecodeRuneInString(s[end:])
			if runeClass(r2) != class {
				break
			}
			end += w2
		}
		return end
	}
	// A whitespace run. At the end of the text it is one token (\s+(?!\S)); before a
	// non-space, \s+(?!\S) backs off by one so the last whitespace character goes with
	// what follows, and a single one is a token of its own (\s+).
	end, last := 0, 0
	for end < len(s) {
		r2, w2 := utf8.DecodeRuneInString(s[end:])
		if !unicode.IsSpace(r2) {
			break
		}
		last = end
		end += w2
	}
	if end == len(s) || last == 0 {
		return end
	}
	return last
}

// runeClass sorts a non-space rune into the pattern's letter (\p{L}), number (\p{N}) and
// other classes.
func runeClass(r rune) int {
	switch {
	case unicode.IsLetter(r):
		return 1
	case unicode.IsNumber(r):
		return 2
	case unicode.IsSpace(r):
		return 3
	default:
		return 0
	}
}

// bpe encodes one pre-token: start from its bytes and repeatedly apply the
// lowest-ranked merge among adjacent pairs, leftmost first. A heap of candidate pairs
// keeps long words O(n log n).
func (t *Tokenizer) bpe(word string) []int32 {
	syms := make([]symbol, len(word))
	for i := range len(word) {
		syms[i] = symbol{id: t.byteIDs[word[i]], prev: i - 1, next: i + 1}
	}
	syms[len(syms)-1].next = -1
	h := &pairHeap{}
	push := func(left int) {
		if left < 0 || syms[left].next < 0 {
			return
		}
		right := syms[left].next
		if m, ok := t.merges[uint64(syms[left].id)<<32|uint64(syms[right].id)]; ok {
			heap.Push(h, candidate{rank: m.rank, left: left, right: right, leftID: syms[left].id, rightID: syms[right].id, id: m.id})
		}
	}
	for i := range syms {
		push(i)
	}
	for h.Len() > 0 {
		c := heap.Pop(h).(candidate)
		l, r := &syms[c.left], &syms[c.right]
		// Skip candidates that an earlier merge made stale.
		if l.dead || r.dead || l.next != c.right || l.id != c.leftID || r.id != c.rightID {
			continue
		}
		l.id = c.id
		r.dead = true
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = c.left
		}
		push(l.prev)
		push(c.left)
	}
	var out []int32
	for i := 0; i >= 0; i = syms[i].next {
		out = append(out, syms[i].id)
	}
	return out
}

// symbol is one token of a word during BPE, in a doubly linked list.
type symbol struct {
	// id is the symbol's token.
	id int32
	// prev and next index the neighbours; -1 at the ends.
	prev, next int
	// dead marks a symbol merged into its left neighbour.
	dead bool
}

// candidate is a possible merge of two adjacent symbols.
type candidate struct {
	// rank is the merge's rank; lower applies first.
	rank int32
	// left and right index the symbols.
	left, right int
	// leftID and rightID are the symbols' tokens when the candidate was made.
	leftID, rightID int32
	// id is the merged token.
	id int32
}

// pairHeap orders candidates by rank, then position.
type pairHeap []candidate

func (h pairHeap) Len() int { return len(h) }
func (h pairHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].left < h[j].left
}
func (h pairHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pairHeap) Push(x any)   { *h = append(*h, x.(candidate)) }
func (h *pairHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// Decode joins the tokens' bytes. Ids outside the vocabulary contribute nothing. The
// result may hold incomplete UTF-8 when ids stop mid-character.
func (t *Tokenizer) Decode(ids []int32) string {
	var sb strings.Builder
	for _, id := range ids {
		sb.Write(t.piece(id))
	}
	return sb.String()
}

// piece returns id's bytes, nil when unknown.
func (t *Tokenizer) piece(id int32) []byte {
	if id < 0 || int(id) >= len(t.pieces) {
		return nil
	}
	return t.pieces[id]
}

// StreamDecoder turns tokens into text one at a time, holding back the bytes of a
// character that a later token completes (byte-level BPE splits multi-byte characters
// across tokens).
type StreamDecoder struct {
	// t is the tokenizer.
	t *Tokenizer
	// pending holds bytes not yet returned.
	pending []byte
}

// NewStreamDecoder starts decoding a new sequence.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder { return &StreamDecoder{t: t} }

// Next adds a token and returns the text it completes, possibly "". Bytes that can
// never become valid UTF-8 are passed through rather than held forever.
func (d *StreamDecoder) Next(id int32) string {
	d.pending = append(d.pending, d.t.piece(id)...)
	cut := len(d.pending)
	// An incomplete character is at most 3 bytes long: look for its first byte.
	for i := max(0, len(d.pending)-3); i < len(d.pending); i++ {
		if utf8.RuneStart(d.pending[i]) && !utf8.FullRune(d.pending[i:]) {
			cut = i
			break
		}
	}
	out := string(d.pending[:cut])
	d.pending = append(d.pending[:0], d.pending[cut:]...)
	return out
}

// Flush returns whatever is held back (an incomplete character at the end).
func (d *StreamDecoder) Flush() string {
	out := string(d.pending)
	d.pending = d.pending[:0]
	return out
}

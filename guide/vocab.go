package guide

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"

	"gollm/tokenizer"
)

// Vocab is a model's vocabulary as guided decoding reads it: each token's bytes, in a
// trie so that tokens sharing a prefix are checked against a constraint once for the
// prefix. It is built once per tokenizer and shared by every constraint and request.
type Vocab struct {
	// size is the number of logits per row: the model's vocabulary, which may have
	// more ids than the tokenizer defines (those are never allowed).
	size int
	// words is the length of a mask in 64-bit words.
	words int
	// bytes are each token's bytes (nil: never allowed).
	bytes [][]byte
	// firstDropsSpace says a sequence's first token loses a leading space in the text.
	firstDropsSpace bool
	// firstDiffers are the ids never allowed first (sorted).
	firstDiffers []int32
	// The trie, in pre-order: node 0 is the empty prefix; node i's children start at
	// i+1 and follow each other at end[child]; nodeByte is the byte into a node; the
	// tokens ending at node i are toks[tokAt[i]:tokAt[i+1]].
	nodeByte []byte
	end      []int32
	tokAt    []int32
	toks     []int32
	// maxLen is the longest token, in bytes.
	maxLen int
	// id identifies the vocabulary in caches.
	id uint64
}

// vocabIDs numbers vocabularies.
var vocabIDs atomic.Uint64

// NewVocab builds the tables of a vocabulary of size ids (the model's logits per row)
// from its tokens' bytes; ids the tokenizer does not define, or defines past size, are
// never allowed.
func NewVocab(tb *tokenizer.TokenBytes, size int) (*Vocab, error) {
	if tb == nil {
		return nil, errors.New("guide: no token bytes")
	}
	if size <= 0 || size > 1<<24 {
		return nil, fmt.Errorf("guide: vocabulary size %d out of range", size)
	}
	v := &Vocab{size: size, words: (size + 63) / 64, bytes: make([][]byte, size),
		firstDropsSpace: tb.FirstDropsSpace, id: vocabIDs.Add(1)}
	type entry struct {
		b  []byte
		id int32
	}
	var es []entry
	for id, b := range tb.Bytes {
		if id >= size || len(b) == 0 {
			continue
		}
		v.bytes[id] = b
		es = append(es, entry{b, int32(id)})
		v.maxLen = max(v.maxLen, len(b))
	}
	for _, id := range tb.FirstDiffers {
		if int(id) < size {
			v.firstDiffers = append(v.firstDiffers, id)
		}
	}
	slices.Sort(v.firstDiffers)
	sort.Slice(es, func(i, j int) bool {
		if c := bytes.Compare(es[i].b, es[j].b); c != 0 {
			return c < 0
		}
		return es[i].id < es[j].id
	})
	// Pre-order construction: path holds the nodes of the current prefix.
	v.nodeByte = append(v.nodeByte, 0)
	v.end = append(v.end, 0)
	v.tokAt = append(v.tokAt, 0)
	path := []int32{0}
	var prev []byte
	for _, e := range es {
		common := 0
		for common < len(prev) && common < len(e.b) && prev[common] == e.b[common] {
			common++
		}
		for len(path) > common+1 {
			n := path[len(path)-1]
			path = path[:len(path)-1]
			v.end[n] = int32(len(v.nodeByte))
		}
		for _, c := range e.b[common:] {
			v.nodeByte = append(v.nodeByte, c)
			v.end = append(v.end, 0)
			v.tokAt = append(v.tokAt, int32(len(v.toks)))
			path = append(path, int32(len(v.nodeByte)-1))
		}
		v.toks = append(v.toks, e.id)
		prev = e.b
	}
	for len(path) > 0 {
		n := path[len(path)-1]
		path = path[:len(path)-1]
		v.end[n] = int32(len(v.nodeByte))
	}
	v.tokAt = append(v.tokAt, int32(len(v.toks)))
	return v, nil
}

// Size is the number of logits per row the masks cover.
func (v *Vocab) Size() int { return v.size }

// MaskWords is the length of a mask in 64-bit words: bit i%64 of word i/64 is token i.
func (v *Vocab) MaskWords() int { return v.words }

// Nodes is the number of trie nodes (the root included).
func (v *Vocab) Nodes() int { return len(v.nodeByte) }

// tokensAt are the tokens ending at trie node n.
func (v *Vocab) tokensAt(n int32) []int32 { return v.toks[v.tokAt[n]:v.tokAt[n+1]] }

package tokenizer

import (
	"container/heap"
	"fmt"
	"strings"
	"unicode/utf8"
)

// bpeModel is tokenizer.json's BPE model: a vocabulary and ranked merges, with the
// options the LLaMA family uses (byte fallback, an unknown token, ignore_merges).
type bpeModel struct {
	// vocab maps tokens to ids.
	vocab map[string]int32
	// merges maps a pair of ids (left<<32 | right) to its rank and merged id.
	merges map[uint64]merge
	// byteIDs is the id of each byte's byte-level token ("Ġ" for 0x20), for byte-level
	// models; -1 where the vocabulary lacks one.
	byteIDs [256]int32
	// fallback is the id of each byte's <0xNN> token, for byte_fallback; -1 where absent.
	fallback [256]int32
	// byteFallback spells characters outside the vocabulary as <0xNN> tokens.
	byteFallback bool
	// unk is the unknown token's id, -1 when there is none (unknown characters are
	// then dropped, as the library does); fuseUnk joins runs of it.
	unk     int32
	fuseUnk bool
	// ignoreMerges takes a piece that is a vocabulary token whole (Llama 3).
	ignoreMerges bool
}

// merge is one BPE merge rule.
type merge struct {
	// rank orders merges: lower merges first.
	rank int32
	// id names the token the merge makes.
	id int32
}

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

// byteToken is the <0xNN> spelling of byte fallback tokens.
func byteToken(b byte) string { return fmt.Sprintf("<0x%02X>", b) }

// encode returns the BPE of one pre-token: byte-level models start from its bytes,
// the others from its characters (unknown ones as <0xNN> bytes or the unknown token);
// then the lowest-ranked merge among adjacent pairs is applied, leftmost first, until
// none applies.
func (m *bpeModel) encode(word string, byteLevel bool) []int32 {
	if m.ignoreMerges {
		key := word
		if byteLevel {
			key = ByteLevelString([]byte(word))
		}
		if id, ok := m.vocab[key]; ok {
			return []int32{id}
		}
	}
	var ids []int32
	if byteLevel {
		ids = make([]int32, 0, len(word))
		for i := range len(word) {
			ids = append(ids, m.byteIDs[word[i]])
		}
	} else {
		ids = m.characters(word)
	}
	if len(ids) == 0 {
		return nil
	}
	return m.mergeAll(ids)
}

// characters maps a word's characters to their tokens.
func (m *bpeModel) characters(word string) []int32 {
	ids := make([]int32, 0, len(word))
	lastUnk := false
	for i, r := range word {
		n := utf8.RuneLen(r)
		if r == utf8.RuneError {
			_, n = utf8.DecodeRuneInString(word[i:])
		}
		if id, ok := m.vocab[word[i:i+n]]; ok {
			ids = append(ids, id)
			lastUnk = false
			continue
		}
		if m.byteFallback {
			all := true
			for j := i; j < i+n; j++ {
				all = all && m.fallback[word[j]] >= 0
			}
			if all {
				for j := i; j < i+n; j++ {
					ids = append(ids, m.fallback[word[j]])
				}
				lastUnk = false
				continue
			}
		}
		if m.unk >= 0 && !(m.fuseUnk && lastUnk) {
			ids = append(ids, m.unk)
		}
		lastUnk = m.unk >= 0
	}
	return ids
}

// mergeAll applies the merges to a symbol sequence. A heap of candidate pairs keeps long
// words O(n log n).
func (m *bpeModel) mergeAll(ids []int32) []int32 {
	syms := make([]symbol, len(ids))
	for i, id := range ids {
		syms[i] = symbol{id: id, prev: i - 1, next: i + 1}
	}
	syms[len(syms)-1].next = -1
	h := &pairHeap{}
	push := func(left int) {
		if left < 0 || syms[left].next < 0 {
			return
		}
		right := syms[left].next
		if mg, ok := m.merges[uint64(uint32(syms[left].id))<<32|uint64(uint32(syms[right].id))]; ok {
			heap.Push(h, candidate{rank: mg.rank, left: left, right: right, leftID: syms[left].id, rightID: syms[right].id, id: mg.id})
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
	out := make([]int32, 0, len(syms))
	for i := 0; i >= 0; i = syms[i].next {
		out = append(out, syms[i].id)
	}
	return out
}

// symbol is one token of a word during BPE, in a doubly linked list.
type symbol struct {
	// id indexes the vocabulary.
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
	// id names the token the merge would make.
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

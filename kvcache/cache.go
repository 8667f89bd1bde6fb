// Package kvcache is gollm's paged KV block manager: a pool of fixed-size blocks, one
// block table per sequence, and optional reuse of the blocks of common prompt prefixes.
//
// The pool only does the bookkeeping; the engine owns the memory the block ids name.
//
// # Lifecycle
//
//  1. New sizes the pool: NumBlocks blocks of TokensPerBlock positions each (the caller
//     takes both from engine.Info).
//  2. Add starts a sequence with its prompt. With reuse enabled (and asked for), the
//     longest chain of full prompt blocks already in the cache is put at the head of its
//     block table and their positions need no computing: Sequence.ReusedTokens says how
//     many. At least one prompt token is always left to compute, so the engine has a
//     position to sample from. Match answers the same question without taking anything.
//  3. Reserve grows the block table so it covers a number of positions, before the
//     engine writes them. It takes all the blocks it needs or none (ErrFull).
//  4. Commit tells the pool how many positions the engine has computed; with reuse, every
//     full prompt block among them becomes findable by later sequences.
//  5. Fork starts a sequence that shares every block of another (the beams of one prompt,
//     or the several samples of one request): each block gains a holder. A block held by
//     more than one sequence is read-only; Writable gives a sequence its own block before
//     it writes a position there (copy-on-write), and says which block the engine must
//     copy into it first.
//  6. Release gives the table back. A block no other sequence holds becomes free; a
//     findable one stays in the cache as "reusable free", still counted free, and is
//     evicted least recently used first when a Reserve needs a block and no plain free
//     block is left. The Sequence is unusable afterwards (ErrReleased).
//
// # Prefix keys
//
// A full prompt block is keyed by a hash chain: the hash of its tokens seeded with the
// key of the block before it. A hit is confirmed exactly: the candidate's tokens must
// equal the prompt's and its parent must be the block matched one step earlier (same id
// and same generation, a counter bumped when a block is evicted), so a hash collision
// or a recycled parent can never splice the wrong KV into a sequence.
//
// A Pool is not safe for concurrent use; the batch manager's worker goroutine owns it.
package kvcache

import (
	"errors"
	"fmt"
	"slices"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrFull means the pool has fewer free blocks than a Reserve needs.
	ErrFull = errors.New("kvcache: not enough free blocks")
	// ErrReleased means the Sequence was already released.
	ErrReleased = errors.New("kvcache: sequence already released")
	// ErrInvalidConfig means New got a pool geometry it cannot use.
	ErrInvalidConfig = errors.New("kvcache: invalid config")
	// ErrTooLong means a Reserve asked for more positions than the whole pool holds.
	ErrTooLong = errors.New("kvcache: sequence longer than the pool")
)

// Config sizes a pool.
type Config struct {
	// NumBlocks is the number of blocks; ids are 0..NumBlocks-1.
	NumBlocks int
	// TokensPerBlock is the number of positions a block holds.
	TokensPerBlock int
	// EnableReuse keeps full prompt blocks findable for later sequences.
	EnableReuse bool
}

// Stats is a snapshot of the pool.
type Stats struct {
	// Max is the number of blocks in the pool.
	Max int
	// Free is the number of blocks a Reserve can take (plain free plus reusable free).
	Free int
	// Used is Max - Free: blocks held by at least one sequence.
	Used int
	// Reusable is the number of free blocks still findable by prefix.
	Reusable int
	// Reused is the total number of blocks handed to sequences by prefix match since
	// the pool was made.
	Reused uint64
	// Sequences is the number of live (unreleased) sequences.
	Sequences int
}

// noBlock marks an absent block id (no parent, empty list end).
const noBlock = -1

// block is one block's bookkeeping.
type block struct {
	// ref is the number of sequences whose table holds the block.
	ref int32
	// cached says the block is findable by its prefix key.
	cached bool
	// gen counts the block's evictions from the cache; parent links carry it.
	gen uint32
	// key is the block's hash chain key while cached.
	key uint64
	// parent and parentGen identify the block before it in its prompt (noBlock: first).
	parent int32
	// parentGen is the parent's gen when this block was cached.
	parentGen uint32
	// tokens are the block's tokens while cached, for the exact comparison.
	tokens []int32
	// prev and next link the reusable free blocks, least recently used first.
	prev, next int32
}

// Pool is a paged KV block pool. See the package comment for the lifecycle.
type Pool struct {
	// tpb is the number of positions per block.
	tpb int
	// reuse enables prefix keys.
	reuse bool
	// blocks holds every block's bookkeeping, indexed by id.
	blocks []block
	// free is a stack of plain free blocks.
	free []int32
	// lruHead and lruTail end the list of reusable free blocks (head: evicted first).
	lruHead, lruTail int32
	// lruLen counts the list's blocks.
	lruLen int
	// index maps a prefix key to the cached blocks with that key (almost always one).
	index map[uint64][]int32
	// reused counts blocks handed out by prefix match.
	reused uint64
	// live counts unreleased sequences.
	live int
}

// New makes a pool with every block free.
func New(cfg Config) (*Pool, error) {
	if cfg.NumBlocks <= 0 {
		return nil, fmt.Errorf("%w: NumBlocks must be positive, got %d", ErrInvalidConfig, cfg.NumBlocks)
	}
	if cfg.TokensPerBlock <= 0 {
		return nil, fmt.Errorf("%w: TokensPerBlock must be positive, got %d", ErrInvalidConfig, cfg.TokensPerBlock)
	}
	if cfg.NumBlocks > 1<<31-1 {
		return nil, fmt.Errorf("%w: NumBlocks %d does not fit an int32 block id", ErrInvalidConfig, cfg.NumBlocks)
	}
	p := &Pool{
		tpb:     cfg.TokensPerBlock,
		reuse:   cfg.EnableReuse,
		blocks:  make([]block, cfg.NumBlocks),
		free:    make([]int32, cfg.NumBlocks),
		lruHead: noBlock,
		lruTail: noBlock,
		index:   map[uint64][]int32{},
	}
	// The stack pops from the end: hand out low ids first, which reads better in logs.
	for i := range p.free {
		p.free[i] = int32(cfg.NumBlocks - 1 - i)
		p.blocks[i].prev, p.blocks[i].next, p.blocks[i].parent = noBlock, noBlock, noBlock
	}
	return p, nil
}

// TokensPerBlock is the number of positions per block.
func (p *Pool) TokensPerBlock() int { return p.tpb }

// NumBlocks is the size of the pool.
func (p *Pool) NumBlocks() int { return len(p.blocks) }

// Free is the number of blocks a Reserve can take now.
func (p *Pool) Free() int { return len(p.free) + p.lruLen }

// BlocksFor is the number of blocks that cover n positions.
func (p *Pool) BlocksFor(n int) int { return (n + p.tpb - 1) / p.tpb }

// Stats returns a snapshot of the pool.
func (p *Pool) Stats() Stats {
	f := p.Free()
	return Stats{Max: len(p.blocks), Free: f, Used: len(p.blocks) - f, Reusable: p.lruLen, Reused: p.reused, Sequences: p.live}
}

// Sequence is one sequence's block table.
type Sequence struct {
	// pool is the owner; nil once released.
	pool *Pool
	// table is the block table: table[i] holds positions [i*T, (i+1)*T).
	table []int32
	// prompt is the prompt the prefix keys are computed from (not copied).
	prompt []int32
	// keyed is the number of leading prompt blocks already matched or committed.
	keyed int
	// chainKey is the key of block keyed-1 (the seed for the next).
	chainKey uint64
	// parent and parentGen name the cached block that block keyed-1 is (or duplicates).
	parent int32
	// parentGen is parent's generation.
	parentGen uint32
	// reusedTokens is the number of prompt positions that came from the cache.
	reusedTokens int
}

// chainSeed is the key "before" a prompt's first block.
const chainSeed uint64 = 0x9e3779b97f4a7c15

// chain mixes one block of tokens into the running key (FNV-1a over the token words,
// finished with a splitmix step so that nearby keys spread out).
func chain(key uint64, toks []int32) uint64 {
	h := key ^ 0xcbf29ce484222325
	for _, t := range toks {
		h ^= uint64(uint32(t))
		h *= 0x100000001b3
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}

// lookup finds the cached block that continues the chain (parent, parentGen) with toks.
func (p *Pool) lookup(key uint64, parent int32, parentGen uint32, toks []int32) int32 {
	for _, id := range p.index[key] {
		b := &p.blocks[id]
		if b.parent == parent && b.parentGen == parentGen && slices.Equal(b.tokens, toks) {
			return id
		}
	}
	return noBlock
}

// reusableBlocks is the most prompt blocks a match may cover: full blocks only, and
// never the last prompt token, which must be computed to sample from.
func (p *Pool) reusableBlocks(promptLen int) int {
	if !p.reuse || promptLen == 0 {
		return 0
	}
	return (promptLen - 1) / p.tpb
}

// Match reports how many leading blocks of prompt Add would reuse, and how many of
// those are now free (reusable free blocks that Add would take out of Free). It
// changes nothing.
func (p *Pool) Match(prompt []int32) (blocks, idle int) {
	key, parent, parentGen := chainSeed, int32(noBlock), uint32(0)
	for i := range p.reusableBlocks(len(prompt)) {
		toks := prompt[i*p.tpb : (i+1)*p.tpb]
		key = chain(key, toks)
		id := p.lookup(key, parent, parentGen, toks)
		if id == noBlock {
			break
		}
		blocks++
		if p.blocks[id].ref == 0 {
			idle++
		}
		parent, parentGen = id, p.blocks[id].gen
	}
	return blocks, idle
}

// Add starts a sequence for prompt. With reuse enabled on the pool and useCache set,
// the cached prefix blocks are taken at once (Sequence.ReusedTokens); otherwise the
// table starts empty. prompt must stay unchanged while the sequence lives. Add never
// fails for lack of blocks: it takes only blocks that Free counts.
func (p *Pool) Add(prompt []int32, useCache bool) *Sequence {
	s := &Sequence{pool: p, prompt: prompt, chainKey: chainSeed, parent: noBlock}
	p.live++
	if !useCache {
		// Still key the prompt's blocks on Commit, so later requests can share them.
		return s
	}
	for i := range p.reusableBlocks(len(prompt)) {
		toks := prompt[i*p.tpb : (i+1)*p.tpb]
		key := chain(s.chainKey, toks)
		id := p.lookup(key, s.parent, s.parentGen, toks)
		if id == noBlock {
			break
		}
		b := &p.blocks[id]
		if b.ref == 0 {
			p.lruRemove(id)
		}
		b.ref++
		s.table = append(s.table, id)
		s.keyed++
		s.chainKey, s.parent, s.parentGen = key, id, b.gen
	}
	s.reusedTokens = s.keyed * p.tpb
	p.reused += uint64(s.keyed)
	return s
}

// ReusedTokens is the number of leading prompt positions whose KV came from the cache.
func (s *Sequence) ReusedTokens() int { return s.reusedTokens }

// Blocks is the block table. The slice is the sequence's own: read it, do not keep it
// past the next Reserve or Release.
func (s *Sequence) Blocks() []int32 { return s.table }

// Capacity is the number of positions the table covers.
func (s *Sequence) Capacity() int {
	if s.pool == nil {
		return 0
	}
	return len(s.table) * s.pool.tpb
}

// Reserve grows the table to cover positions [0, n). It takes all the blocks it needs
// or none: ErrFull when the pool is short (nothing changes), ErrTooLong when n is more
// than the whole pool holds.
func (s *Sequence) Reserve(n int) error {
	p := s.pool
	if p == nil {
		return ErrReleased
	}
	need := p.BlocksFor(n) - len(s.table)
	if need <= 0 {
		return nil
	}
	if p.BlocksFor(n) > len(p.blocks) {
		return fmt.Errorf("%w: %d positions need %d blocks, the pool has %d", ErrTooLong, n, p.BlocksFor(n), len(p.blocks))
	}
	if need > p.Free() {
		return fmt.Errorf("%w: need %d, %d free", ErrFull, need, p.Free())
	}
	for range need {
		s.table = append(s.table, p.take())
	}
	return nil
}

// take pops a plain free block, or evicts the least recently used reusable one.
func (p *Pool) take() int32 {
	var id int32
	if n := len(p.free); n > 0 {
		id = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		id = p.lruHead
		p.lruRemove(id)
		p.uncache(id)
	}
	p.blocks[id].ref = 1
	return id
}

// uncache drops a block's prefix key; its generation moves on so stale parent links
// to it stop matching.
func (p *Pool) uncache(id int32) {
	b := &p.blocks[id]
	ids := p.index[b.key]
	if i := slices.Index(ids, id); i >= 0 {
		ids = slices.Delete(ids, i, i+1)
	}
	if len(ids) == 0 {
		delete(p.index, b.key)
	} else {
		p.index[b.key] = ids
	}
	b.cached = false
	b.gen++
	b.tokens = b.tokens[:0]
	b.parent = noBlock
}

// Commit records that positions [0, n) of the sequence have been computed. With reuse,
// each full prompt block among them becomes findable (unless an identical block is
// already cached: then later sequences find that one).
func (s *Sequence) Commit(n int) {
	p := s.pool
	if p == nil || !p.reuse {
		return
	}
	full := min(n, len(s.prompt)) / p.tpb
	for s.keyed < full && s.keyed < len(s.table) {
		i := s.keyed
		toks := s.prompt[i*p.tpb : (i+1)*p.tpb]
		key := chain(s.chainKey, toks)
		id := s.table[i]
		if dup := p.lookup(key, s.parent, s.parentGen, toks); dup != noBlock {
			// Another sequence computed the same block first; chain on from its copy.
			id = dup
		} else {
			b := &p.blocks[id]
			b.cached, b.key, b.parent, b.parentGen = true, key, s.parent, s.parentGen
			b.tokens = append(b.tokens[:0], toks...)
			p.index[key] = append(p.index[key], id)
		}
		s.keyed++
		s.chainKey, s.parent, s.parentGen = key, id, p.blocks[id].gen
	}
}

// Fork starts a sequence that shares every block of s: the same table, each block with
// one more holder. The fork takes nothing from Free. Shared blocks must not be written:
// see Writable.
func (s *Sequence) Fork() (*Sequence, error) {
	p := s.pool
	if p == nil {
		return nil, ErrReleased
	}
	f := *s
	f.table = slices.Clone(s.table)
	for _, id := range f.table {
		p.blocks[id].ref++
	}
	p.live++
	return &f, nil
}

// Shared says whether the block holding position pos is held by other sequences too
// (a write there needs Writable's copy). Positions past the table are not shared.
func (s *Sequence) Shared(pos int) bool {
	if s.pool == nil || pos < 0 {
		return false
	}
	i := pos / s.pool.tpb
	return i < len(s.table) && s.pool.blocks[s.table[i]].ref > 1
}

// Writable makes the block holding position pos (inside the table) the sequence's own,
// so that the engine may write there. A block other sequences hold too is replaced in
// the table by a fresh one, and copied reports the copy the engine must run before the
// write (src onto dst); the shared block loses this holder. ErrFull when no block is
// free (nothing changes).
func (s *Sequence) Writable(pos int) (src, dst int32, copied bool, err error) {
	p := s.pool
	if p == nil {
		return 0, 0, false, ErrReleased
	}
	i := pos / p.tpb
	if pos < 0 || i >= len(s.table) {
		return 0, 0, false, fmt.Errorf("kvcache: Writable(%d): the table covers %d positions", pos, len(s.table)*p.tpb)
	}
	old := s.table[i]
	if p.blocks[old].ref <= 1 {
		return 0, 0, false, nil
	}
	if p.Free() == 0 {
		return 0, 0, false, fmt.Errorf("%w: need 1 for a copy-on-write, 0 free", ErrFull)
	}
	id := p.take()
	// ref > 1: other holders keep it, so it never becomes free here.
	p.blocks[old].ref--
	s.table[i] = id
	return old, id, true, nil
}

// Release gives the sequence's blocks back. Blocks are released last first, so a
// prompt's later blocks are evicted before the earlier ones their keys depend on.
func (s *Sequence) Release() error {
	p := s.pool
	if p == nil {
		return ErrReleased
	}
	for i := len(s.table) - 1; i >= 0; i-- {
		id := s.table[i]
		b := &p.blocks[id]
		b.ref--
		if b.ref > 0 {
			continue
		}
		if b.cached {
			p.lruPush(id)
		} else {
			p.free = append(p.free, id)
		}
	}
	s.table = nil
	s.pool = nil
	p.live--
	return nil
}

// lruPush appends a block to the reusable free list as the most recently used.
func (p *Pool) lruPush(id int32) {
	b := &p.blocks[id]
	b.prev, b.next = p.lruTail, noBlock
	if p.lruTail != noBlock {
		p.blocks[p.lruTail].next = id
	} else {
		p.lruHead = id
	}
	p.lruTail = id
	p.lruLen++
}

// lruRemove unlinks a block from the reusable free list.
func (p *Pool) lruRemove(id int32) {
	b := &p.blocks[id]
	if b.prev != noBlock {
		p.blocks[b.prev].next = b.next
	} else {
		p.lruHead = b.next
	}
	if b.next != noBlock {
		p.blocks[b.next].prev = b.prev
	} else {
		p.lruTail = b.prev
	}
	b.prev, b.next = noBlock, noBlock
	p.lruLen--
}

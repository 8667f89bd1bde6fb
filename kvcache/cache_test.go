package kvcache

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

func newPool(t *testing.T, blocks, tpb int, reuse bool) *Pool {
	t.Helper()
	p, err := New(Config{NumBlocks: blocks, TokensPerBlock: tpb, EnableReuse: reuse})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// seq counts up from start: distinct, predictable prompts.
func seq(start, n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(start + i)
	}
	return s
}

func TestNewRejectsBadGeometry(t *testing.T) {
	for _, cfg := range []Config{{NumBlocks: 0, TokensPerBlock: 4}, {NumBlocks: 4, TokensPerBlock: 0}, {NumBlocks: -1, TokensPerBlock: 4}} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestReserveAndRelease(t *testing.T) {
	cases := []struct {
		name      string
		blocks    int
		reserves  []int // successive Reserve(n) of one sequence
		wantErr   error // of the last
		wantTable int   // blocks in the table after all
		wantFree  int
	}{
		{"nothing reserved holds nothing", 8, []int{0}, nil, 0, 8},
		{"one position takes one block", 8, []int{1}, nil, 1, 7},
		{"a full block takes one block", 8, []int{4}, nil, 1, 7},
		{"one past a block takes two", 8, []int{5}, nil, 2, 6},
		{"growing takes only the difference", 8, []int{3, 6, 9}, nil, 3, 5},
		{"shrinking requests change nothing", 8, []int{9, 2}, nil, 3, 5},
		{"the whole pool fits", 8, []int{32}, nil, 8, 0},
		{"more than the pool is too long", 8, []int{33}, ErrTooLong, 0, 8},
		{"a failed grow keeps what was held", 8, []int{8, 33}, ErrTooLong, 2, 6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPool(t, tc.blocks, 4, false)
			s := p.Add(nil, false)
			var err error
			for _, n := range tc.reserves {
				err = s.Reserve(n)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("last Reserve: %v, want %v", err, tc.wantErr)
			}
			if len(s.Blocks()) != tc.wantTable || p.Free() != tc.wantFree {
				t.Fatalf("table %d blocks, %d free; want %d and %d", len(s.Blocks()), p.Free(), tc.wantTable, tc.wantFree)
			}
			if err := s.Release(); err != nil {
				t.Fatal(err)
			}
			if p.Free() != tc.blocks {
				t.Fatalf("after Release %d free, want %d", p.Free(), tc.blocks)
			}
			if err := s.Release(); !errors.Is(err, ErrReleased) {
				t.Fatalf("second Release: %v, want ErrReleased", err)
			}
			if err := s.Reserve(1); !errors.Is(err, ErrReleased) {
				t.Fatalf("Reserve after Release: %v, want ErrReleased", err)
			}
		})
	}
}

func TestReserveIsAllOrNothing(t *testing.T) {
	p := newPool(t, 4, 4, false)
	a, b := p.Add(nil, false), p.Add(nil, false)
	if err := a.Reserve(12); err != nil {
		t.Fatal(err)
	}
	if err := b.Reserve(8); !errors.Is(err, ErrFull) {
		t.Fatalf("Reserve(8) with 1 free block: %v, want ErrFull", err)
	}
	if len(b.Blocks()) != 0 || p.Free() != 1 {
		t.Fatalf("a failed Reserve took blocks: table %v, %d free", b.Blocks(), p.Free())
	}
	seen := map[int32]bool{}
	for _, id := range a.Blocks() {
		if seen[id] || id < 0 || id >= 4 {
			t.Fatalf("bad block table %v", a.Blocks())
		}
		seen[id] = true
	}
}

func TestPrefixReuse(t *testing.T) {
	const T = 4
	prompt := seq(100, 3*T+2) // three full blocks and a partial one
	cases := []struct {
		name        string
		reuse       bool
		second      []int32
		wantBlocks  int // blocks the second sequence reuses
		commitFirst int // positions of the first committed before its release
	}{
		{"a shared three-block prefix reuses three blocks", true, append(seq(100, 3*T), 7, 7, 7), 3, len(prompt)},
		{"reuse off reuses nothing", false, append(seq(100, 3*T), 7, 7, 7), 0, len(prompt)},
		{"a prefix differing in block two reuses one block", true, append(append(seq(100, T), 9), seq(101+T, 2*T)...), 1, len(prompt)},
		{"the last prompt token is always computed", true, seq(100, 3*T), 2, len(prompt)},
		{"uncommitted blocks are not findable", true, append(seq(100, 3*T), 7), 1, T + 1},
		{"a different first block reuses nothing", true, append([]int32{5}, seq(101, 3*T)...), 0, len(prompt)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPool(t, 16, T, tc.reuse)
			a := p.Add(prompt, true)
			if err := a.Reserve(len(prompt)); err != nil {
				t.Fatal(err)
			}
			a.Commit(tc.commitFirst)
			first := slices.Clone(a.Blocks())
			if err := a.Release(); err != nil {
				t.Fatal(err)
			}
			if p.Free() != 16 {
				t.Fatalf("%d free after release, want all 16 (cached blocks count as free)", p.Free())
			}
			if n, _ := p.Match(tc.second); n != tc.wantBlocks {
				t.Fatalf("Match = %d blocks, want %d", n, tc.wantBlocks)
			}
			b := p.Add(tc.second, true)
			if b.ReusedTokens() != tc.wantBlocks*T || len(b.Blocks()) != tc.wantBlocks {
				t.Fatalf("reused %d tokens, table %v; want %d blocks", b.ReusedTokens(), b.Blocks(), tc.wantBlocks)
			}
			if !slices.Equal(b.Blocks(), first[:tc.wantBlocks]) {
				t.Fatalf("reused blocks %v are not the first's %v", b.Blocks(), first[:tc.wantBlocks])
			}
			if got := p.Stats().Reused; got != uint64(tc.wantBlocks) {
				t.Fatalf("Stats.Reused = %d, want %d", got, tc.wantBlocks)
			}
			if err := b.Reserve(len(tc.second)); err != nil {
				t.Fatal(err)
			}
			if err := b.Release(); err != nil {
				t.Fatal(err)
			}
			if p.Free() != 16 {
				t.Fatalf("%d free at the end", p.Free())
			}
		})
	}
}

func TestSharedBlocksAreRefCounted(t *testing.T) {
	p := newPool(t, 8, 4, true)
	prompt := seq(1, 9)
	a := p.Add(prompt, true)
	_ = a.Reserve(9)
	a.Commit(9)
	b := p.Add(prompt, true)
	if b.ReusedTokens() != 8 {
		t.Fatalf("b reused %d tokens, want 8", b.ReusedTokens())
	}
	_ = b.Reserve(9)
	if got := p.Stats().Used; got != 4 {
		t.Fatalf("used %d blocks, want 4 (2 shared + 1 each)", got)
	}
	_ = a.Release()
	if got := p.Stats().Used; got != 3 {
		t.Fatalf("after a's release used %d, want 3 (b still holds the shared two)", got)
	}
	_ = b.Release()
	if s := p.Stats(); s.Used != 0 || s.Reusable != 2 {
		t.Fatalf("at the end %+v, want nothing used and the two prefix blocks reusable", s)
	}
}

func TestReusableBlocksAreEvictedLeastRecentlyUsedFirst(t *testing.T) {
	const T = 2
	p := newPool(t, 6, T, true)
	// Three prompts of two full blocks (plus one token), released in order x, y, z.
	x, y, z := seq(10, 5), seq(20, 5), seq(30, 5)
	for _, pr := range [][]int32{x, y, z} {
		s := p.Add(pr, true)
		if err := s.Reserve(4); err != nil {
			t.Fatal(err)
		}
		s.Commit(5)
		_ = s.Release()
	}
	if s := p.Stats(); s.Reusable != 6 || s.Free != 6 {
		t.Fatalf("%+v, want all 6 blocks reusable and free", s)
	}
	// Touch x again so that y is now the least recently used.
	s := p.Add(x, true)
	_ = s.Release()
	// A sequence needing 2 fresh blocks evicts y's (its second block first).
	n := p.Add(nil, false)
	if err := n.Reserve(2 * T); err != nil {
		t.Fatal(err)
	}
	for name, pr := range map[string][]int32{"x": x, "z": z} {
		if got, _ := p.Match(pr); got != 2 {
			t.Errorf("%s: %d blocks still cached, want 2", name, got)
		}
	}
	if got, _ := p.Match(y); got != 0 {
		t.Errorf("y: %d blocks still cached, want 0 (it was the least recently used)", got)
	}
	_ = n.Release()
}

func TestEvictedParentBreaksTheChain(t *testing.T) {
	p := newPool(t, 3, 2, true)
	pr := seq(1, 5) // two full blocks + 1
	a := p.Add(pr, true)
	_ = a.Reserve(4)
	a.Commit(5)
	_ = a.Release() // LRU order: block 1 (second) then block 0 (first)
	// Take two blocks: the free one and the LRU head (the second block).
	b := p.Add(nil, false)
	_ = b.Reserve(4)
	if got, _ := p.Match(pr); got != 1 {
		t.Fatalf("after evicting the second block Match = %d, want 1", got)
	}
	// Now evict the first block too and write other content there.
	_ = b.Release()
	c := p.Add(nil, false)
	_ = c.Reserve(6)
	if got, _ := p.Match(pr); got != 0 {
		t.Fatalf("after evicting everything Match = %d, want 0", got)
	}
	_ = c.Release()
}

func TestRandomWorkloadLeavesThePoolWhole(t *testing.T) {
	const T, N = 4, 64
	p := newPool(t, N, T, true)
	rng := rand.New(rand.NewPCG(1, 1))
	prefixes := [][]int32{seq(0, 12), seq(50, 12), seq(90, 8)}
	var live []*Sequence
	for range 5000 {
		if len(live) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(live))
			if err := live[i].Release(); err != nil {
				t.Fatal(err)
			}
			live = slices.Delete(live, i, i+1)
			continue
		}
		pr := append(slices.Clone(prefixes[rng.IntN(3)]), seq(rng.IntN(1000), rng.IntN(6))...)
		s := p.Add(pr, true)
		if err := s.Reserve(len(pr) + rng.IntN(8)); err != nil {
			if !errors.Is(err, ErrFull) {
				t.Fatal(err)
			}
			_ = s.Release()
			continue
		}
		s.Commit(len(pr))
		live = append(live, s)
		// Every block is held once per table that lists it, and counted used.
		held := map[int32]int{}
		for _, l := range live {
			for _, id := range l.Blocks() {
				held[id]++
			}
		}
		for id, n := range held {
			if int(p.blocks[id].ref) != n {
				t.Fatalf("block %d: ref %d, held by %d tables", id, p.blocks[id].ref, n)
			}
		}
		if st := p.Stats(); st.Used != len(held) {
			t.Fatalf("used %d, %d distinct blocks held", st.Used, len(held))
		}
	}
	for _, s := range live {
		_ = s.Release()
	}
	if s := p.Stats(); s.Free != N || s.Used != 0 || s.Sequences != 0 {
		t.Fatalf("at the end %+v", s)
	}
	if s := p.Stats(); s.Reused == 0 {
		t.Fatal("the workload never reused a block")
	}
}

func TestForkSharesBlocksAndCopiesOnWrite(t *testing.T) {
	p := newPool(t, 8, 4, false)
	root := p.Add(seq(0, 6), false)
	if err := root.Reserve(6); err != nil { // blocks for positions 0-5: two
		t.Fatal(err)
	}
	a, err := root.Fork()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := root.Fork()
	if got := p.Free(); got != 6 {
		t.Fatalf("forks took blocks: %d free, want 6", got)
	}
	if err := root.Release(); err != nil {
		t.Fatal(err)
	}
	if got := p.Free(); got != 6 {
		t.Fatalf("releasing the root freed shared blocks: %d free, want 6", got)
	}
	if !a.Shared(5) || a.Shared(8) {
		t.Errorf("Shared(5) = %v, Shared(8) = %v; want true, false", a.Shared(5), a.Shared(8))
	}
	// a writes position 6 (block 1, shared with b): it gets a copy.
	src, dst, copied, err := a.Writable(6)
	if err != nil || !copied || src != b.Blocks()[1] || dst == src {
		t.Fatalf("a.Writable(6) = %d, %d, %v, %v; want a copy of b's block %d", src, dst, copied, err, b.Blocks()[1])
	}
	if a.Blocks()[1] != dst || a.Blocks()[0] != b.Blocks()[0] {
		t.Errorf("a's table %v after the copy, b's %v", a.Blocks(), b.Blocks())
	}
	// b is now the last holder of the old block: it writes in place.
	if _, _, copied, err := b.Writable(6); err != nil || copied {
		t.Errorf("b.Writable(6): copied %v, err %v; want in place", copied, err)
	}
	if got := p.Free(); got != 5 {
		t.Errorf("%d free after one copy, want 5", got)
	}
	for _, s := range []*Sequence{a, b} {
		if err := s.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if st := p.Stats(); st.Free != 8 || st.Sequences != 0 {
		t.Errorf("after releasing everything: %+v", st)
	}
}

func TestWritableWhenThePoolIsFull(t *testing.T) {
	p := newPool(t, 2, 4, false)
	root := p.Add(seq(0, 6), false)
	if err := root.Reserve(6); err != nil {
		t.Fatal(err)
	}
	f, _ := root.Fork()
	if _, _, _, err := f.Writable(6); !errors.Is(err, ErrFull) {
		t.Errorf("Writable with no free block: %v, want ErrFull", err)
	}
	if f.Blocks()[1] != root.Blocks()[1] {
		t.Error("a failed Writable changed the table")
	}
	if _, _, _, err := f.Writable(9); err == nil {
		t.Error("Writable past the table succeeded")
	}
	_ = f.Release()
	_ = root.Release()
	if _, err := f.Fork(); !errors.Is(err, ErrReleased) {
		t.Errorf("Fork of a released sequence: %v, want ErrReleased", err)
	}
}

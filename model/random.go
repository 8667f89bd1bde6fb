package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
)

// OpenRandom reads dir/config.json as Open does and gives the checkpoint random weights
// held in memory instead of files: every tensor the architecture names, as bfloat16,
// uniform in ±0.03 (norm weights 1), the same for the same seed. Benchmarks of full-size
// shapes use it where their files would not fit the machine's disk. The weights must
// total at most maxBytes, checked before anything is allocated.
func OpenRandom(dir string, seed uint64, maxBytes int64) (*Checkpoint, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("open random checkpoint: %w", err)
	}
	cfg, fam, fields, err := parseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("open random checkpoint: %s: %w", dir, err)
	}
	cfg.DType = "bfloat16"
	c := &Checkpoint{Dir: dir, Config: cfg, fam: fam, fields: fields, tensors: map[string]*Tensor{}}
	type piece struct {
		name  string
		shape []int
		one   bool
	}
	var pieces []piece
	var total int64
	add := func(r Role, l int) error {
		rows, cols, present := c.Config.Shape(r)
		if l >= 0 {
			rows, cols, present = c.Config.LayerShape(r, l)
		}
		if !present {
			return nil
		}
		names := fam.names(&c.Config, r, l)
		split := partRows(&c.Config, r, rows, len(names))
		if names == nil || split == nil {
			return fmt.Errorf("the %s loader has no tensors for role %s", fam.name, r)
		}
		for i, pn := range names {
			shape := []int{split[i], cols}
			switch {
			case r.IsVector():
				shape = []int{split[i]}
			case pn.transposed:
				shape = []int{cols, split[i]}
			}
			pieces = append(pieces, piece{name: fam.prefix + pn.name, shape: shape,
				one: r == RoleFinalNorm || r == RoleAttnNorm || r == RoleMLPNorm})
			total += 2 * int64(split[i]) * int64(cols)
		}
		return nil
	}
	for r := Role(0); r < FirstLayerRole; r++ {
		if err := add(r, -1); err != nil {
			return nil, err
		}
	}
	for l := range cfg.Layers {
		for r := FirstLayerRole; r < NumRoles; r++ {
			if err := add(r, l); err != nil {
				return nil, err
			}
		}
	}
	if total > maxBytes {
		return nil, fmt.Errorf("open random checkpoint: %s: the weights take %d bytes, more than the %d allowed", dir, total, maxBytes)
	}
	ts := make([]*Tensor, len(pieces))
	for i, p := range pieces {
		n := 1
		for _, d := range p.shape {
			n *= d
		}
		ts[i] = &Tensor{Name: p.name, DType: "BF16", Shape: p.shape, Data: make([]byte, 2*n)}
		c.tensors[p.name] = ts[i]
	}
	// The tensors are filled in parallel, each from its own stream (seed, index).
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fillBF16(ts[i].Data, pieces[i].one, rand.New(rand.NewPCG(seed, uint64(i))))
			}
		}()
	}
	for i := range ts {
		next <- i
	}
	close(next)
	wg.Wait()
	return c, nil
}

// fillBF16 writes bfloat16 values into b: 1 when one, else uniform in ±0.03 (each from
// 16 random bits, four a draw).
func fillBF16(b []byte, one bool, rng *rand.Rand) {
	var bits uint64
	for i := 0; i+1 < len(b); i += 2 {
		v := float32(1)
		if !one {
			if i%8 == 0 {
				bits = rng.Uint64()
			}
			v = 0.06 * (float32(uint16(bits))/65536 - 0.5)
			bits >>= 16
		}
		binary.LittleEndian.PutUint16(b[i:], uint16(math.Float32bits(v)>>16))
	}
}

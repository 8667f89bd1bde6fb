package model

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Evict drops the pages of tensor t's data from the process's resident set: for a tensor
// of c whose values have been copied out (converted or quantized at load) and will not
// be read again, so that a checkpoint converted at load does not hold both forms in
// memory. The file's pages stay in the page cache, and reading the tensor afterwards
// reads them back. Only whole pages inside c's read-only mappings are dropped; a tensor
// not in them is left alone.
func (c *Checkpoint) Evict(t *Tensor) {
	if t == nil || len(t.Data) == 0 {
		return
	}
	var maps [][]byte
	for _, st := range c.files {
		maps = append(maps, st.mapped)
	}
	if c.gguf != nil {
		maps = append(maps, c.gguf.mapped)
	}
	start := uintptr(unsafe.Pointer(&t.Data[0]))
	end := start + uintptr(len(t.Data))
	for _, m := range maps {
		if len(m) == 0 {
			continue
		}
		m0 := uintptr(unsafe.Pointer(&m[0]))
		if start < m0 || end > m0+uintptr(len(m)) {
			continue
		}
		page := uintptr(os.Getpagesize())
		lo, hi := (start+page-1)&^(page-1), end&^(page-1)
		if hi > lo {
			_ = unix.Madvise(m[lo-m0:hi-m0], unix.MADV_DONTNEED)
		}
		return
	}
}

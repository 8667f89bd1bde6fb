package cpu

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// buffers hold the weight memory LoadWeights makes itself — tensors converted or
// quantized at load, quantized tensors repacked — in anonymous mappings outside the Go
// heap, unmapped together when the weights are released.
//
// On the heap, such a model would count as live heap, and Go's collector lets garbage
// grow to about the live heap's size before it collects (GOGC=100): the scratch a
// forward step leaves behind would then take the process's resident set toward twice
// the model's size. Off the heap, the collector paces on the engine's own small heap.
type buffers struct {
	mu   sync.Mutex
	maps [][]byte
}

// bytes returns n zeroed bytes, page-aligned; a nil b allocates on the heap.
func (b *buffers) bytes(n int) ([]byte, error) {
	if b == nil || n == 0 {
		return make([]byte, n), nil
	}
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes: %w", n, err)
	}
	b.mu.Lock()
	b.maps = append(b.maps, m)
	b.mu.Unlock()
	return m, nil
}

// float32s returns n zeroed float32 values, as bytes does.
func (b *buffers) float32s(n int) ([]float32, error) {
	m, err := b.bytes(4 * n)
	if err != nil || n == 0 {
		return nil, err
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&m[0])), n), nil
}

// drop unmaps buffer m, when it is one of b's (a buffer replaced by a repacked copy);
// nothing may use it afterwards.
func (b *buffers) drop(m []byte) error {
	if b == nil || len(m) == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, have := range b.maps {
		if &have[0] == &m[0] {
			b.maps = append(b.maps[:i], b.maps[i+1:]...)
			return unix.Munmap(have)
		}
	}
	return nil
}

// free unmaps every buffer; nothing may use them afterwards.
func (b *buffers) free() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, m := range b.maps {
		errs = append(errs, unix.Munmap(m))
	}
	b.maps = nil
	return errors.Join(errs...)
}

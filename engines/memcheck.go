package engines

import (
	"fmt"

	"gollm/bridge/cuda"
	"gollm/engine/cpu"
	"gollm/hostmem"
	"gollm/model"
)

// The memory checks before a load (issue 32, finding 4): a checkpoint far larger than
// the machine used to load until the kernel's OOM killer ended tritonserver, and every
// other model with it. What an engine will hold is known from the descriptor and the
// checked tensor shapes before anything is allocated; so the load compares it with what
// the process may still take (host: MemAvailable and the cgroup limit's remainder; GPU:
// the device's free memory) and is refused, with the sizes, when it does not fit.

// weightElements counts the elements of a checkpoint's weights.
func weightElements(ws []model.Weight) int64 {
	var n int64
	for _, w := range ws {
		n += int64(w.Rows) * int64(w.Cols)
	}
	return n
}

// storedBytes counts the bytes of a checkpoint's weights as it stores them.
func storedBytes(ws []model.Weight) int64 {
	var n int64
	for _, w := range ws {
		for _, p := range w.Parts {
			n += int64(len(p.Tensor.Data))
		}
	}
	return n
}

// cpuWeightBytes is what the CPU engine's weights take in format f: the checkpoint's own
// bytes as stored (mapped from its files, resident once read), or the elements at the
// format's size (the k-quant one a little low: an LM head in Q6_K, a matrix too narrow
// for blocks in Q8_0).
func (m *Model) cpuWeightBytes(f cpu.WeightFormat) int64 {
	switch f {
	case cpu.FormatF32:
		return m.elems * 4
	case cpu.FormatF16, cpu.FormatBF16:
		return m.elems * 2
	case cpu.FormatQ8:
		return m.elems * 34 / 32
	case cpu.FormatQ4K:
		return m.elems * 144 / 256
	}
	return m.stored
}

// kvBytesPerToken is one position's KV cache over all layers, with elements of elem
// bytes.
func (m *Model) kvBytesPerToken(elem int64) int64 {
	return int64(m.cfg.Layers) * 2 * int64(m.cfg.KVHeads) * int64(m.cfg.HeadDim) * elem
}

// fitsHost fails when a CPU engine's weights in format (0 bytes when they are loaded
// already) and its KV pool of tokens positions (kv bytes) need more than mem leaves.
func fitsHost(weights int64, format string, kv int64, tokens int, mem hostmem.Memory) error {
	head := mem.Headroom()
	if head < 0 || weights+kv <= head {
		return nil
	}
	what := fmt.Sprintf("its KV pool (%d positions, %s)", tokens, hostmem.GiB(kv))
	if weights > 0 {
		what = fmt.Sprintf("the weights (cpu_weight_format %s: %s) and %s", format, hostmem.GiB(weights), what)
	}
	return fmt.Errorf("not enough memory for a KIND_CPU instance: %s need %s, but this process may take %s more (%s); "+
		"lower max_tokens_in_paged_kv_cache or max_seq_len if the pool is the larger part, or serve the model where it fits",
		what, hostmem.GiB(weights+kv), hostmem.GiB(head), mem)
}

// fitsDevice fails when need bytes (what says what they are) exceed the free memory of
// GPU device. A device that cannot be read is left to the load, which reports it.
func fitsDevice(device int, need int64, what string) error {
	dev, err := cuda.Device("", device)
	if err != nil || need <= dev.Free {
		return nil
	}
	return fmt.Errorf("not enough GPU memory on device %d (%s, %s): %s need %s, but %s is free; %s",
		device, dev.Name, dev.UUID, what, gib(need), gib(dev.Free), gpuHolders(dev.UUID))
}

package model

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"gollm/tokenizer"
)

// ggufKV is one metadata entry for writeGGUF: a value of a Go type that names its GGUF
// type (uint32, int32, float32, bool, string, []string, []float32, []int32), or raw
// (type and bytes) for hostile ones.
type ggufKV struct {
	key string
	val any
}

// ggufRaw is a metadata value given as its type and encoded bytes.
type ggufRaw struct {
	typ  uint32
	data []byte
}

// ggufTensor is one tensor for writeGGUF: its GGML type, dimensions innermost first, and
// data (padded to the alignment by the writer).
type ggufTensor struct {
	name string
	typ  uint32
	dims []uint64
	data []byte
}

// appendStr appends a GGUF string.
func appendStr(b []byte, s string) []byte {
	return append(binary.LittleEndian.AppendUint64(b, uint64(len(s))), s...)
}

// encodeGGUF writes a GGUF v3 file's bytes.
func encodeGGUF(kvs []ggufKV, tensors []ggufTensor) []byte {
	b := binary.LittleEndian.AppendUint32(nil, ggufMagic)
	b = binary.LittleEndian.AppendUint32(b, 3)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(tensors)))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(kvs)))
	for _, kv := range kvs {
		b = appendStr(b, kv.key)
		switch v := kv.val.(type) {
		case uint32:
			b = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(b, ggufU32), v)
		case int32:
			b = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(b, ggufI32), uint32(v))
		case float32:
			b = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(b, ggufF32), math.Float32bits(v))
		case bool:
			b = binary.LittleEndian.AppendUint32(b, ggufBool)
			if v {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		case string:
			b = appendStr(binary.LittleEndian.AppendUint32(b, ggufString), v)
		case []string:
			b = binary.LittleEndian.AppendUint32(b, ggufArray)
			b = binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(b, ggufString), uint64(len(v)))
			for _, s := range v {
				b = appendStr(b, s)
			}
		case []float32:
			b = binary.LittleEndian.AppendUint32(b, ggufArray)
			b = binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(b, ggufF32), uint64(len(v)))
			for _, f := range v {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
			}
		case []int32:
			b = binary.LittleEndian.AppendUint32(b, ggufArray)
			b = binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(b, ggufI32), uint64(len(v)))
			for _, x := range v {
				b = binary.LittleEndian.AppendUint32(b, uint32(x))
			}
		case ggufRaw:
			b = append(binary.LittleEndian.AppendUint32(b, v.typ), v.data...)
		default:
			panic("encodeGGUF: unsupported value")
		}
	}
	var offset uint64
	offsets := make([]uint64, len(tensors))
	for i, t := range tensors {
		b = appendStr(b, t.name)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(t.dims)))
		for _, d := range t.dims {
			b = binary.LittleEndian.AppendUint64(b, d)
		}
		b = binary.LittleEndian.AppendUint32(b, t.typ)
		offsets[i] = offset
		b = binary.LittleEndian.AppendUint64(b, offset)
		offset += (uint64(len(t.data)) + 31) / 32 * 32
	}
	for len(b)%32 != 0 {
		b = append(b, 0)
	}
	for _, t := range tensors {
		b = append(b, t.data...)
		for len(b)%32 != 0 {
			b = append(b, 0)
		}
	}
	return b
}

// f32Bytes encodes float32 values.
func f32Bytes(v []float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, f := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

// tinyGGUF is a small LLaMA-architecture GGUF model: hidden 64, 2 layers, 4 heads of 16
// with 2 KV heads, inner 96, vocab 259 (a "gpt2" tokenizer: bytes, two merges and an end
// token), the MLP in
// Q8_0, the rest F32, q/k rows permuted as llama.cpp's converter stores them. It also
// returns the canonical (Hugging Face order) float32 values of every tensor by GGUF name.
func tinyGGUF() ([]ggufKV, []ggufTensor, map[string][]float32) {
	rng := rand.New(rand.NewPCG(3, 3))
	// The 256 byte-level tokens, then the merged "AB" and "CD", then "<eos>".
	const H, L, heads, kv, inner, V = 64, 2, 4, 2, 96, 259
	D := H / heads
	tokens := make([]string, V)
	for i := range 256 {
		tokens[i] = tokenizer.ByteLevelString([]byte{byte(i)})
	}
	tokens[256], tokens[257], tokens[258] = "AB", "CD", "<eos>"
	types := make([]int32, V)
	for i := range types {
		types[i] = ggufTokNormal
	}
	types[258] = ggufTokControl
	kvs := []ggufKV{
		{"general.architecture", "llama"}, {"llama.context_length", uint32(128)}, {"llama.embedding_length", uint32(H)},
		{"llama.block_count", uint32(L)}, {"llama.feed_forward_length", uint32(inner)}, {"llama.attention.head_count", uint32(heads)},
		{"llama.attention.head_count_kv", uint32(kv)}, {"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"llama.rope.freq_base", float32(10000)}, {"llama.vocab_size", uint32(V)},
		{"tokenizer.ggml.model", "gpt2"}, {"tokenizer.ggml.pre", "gpt2"}, {"tokenizer.ggml.tokens", tokens},
		{"tokenizer.ggml.token_type", types}, {"tokenizer.ggml.merges", []string{"A B", "C D"}},
		{"tokenizer.ggml.eos_token_id", uint32(258)}, {"tokenizer.chat_template", "{{ messages }}"},
	}
	canon := map[string][]float32{}
	var ts []ggufTensor
	add := func(name string, rows, cols int, typ uint32, heads int) {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 0.1)
		}
		canon[name] = v
		stored := v
		if heads > 0 {
			perm, _ := ropePerm(rows, heads)
			stored = make([]float32, len(v))
			for i, r := range perm {
				copy(stored[i*cols:(i+1)*cols], v[int(r)*cols:int(r+1)*cols])
			}
		}
		dims := []uint64{uint64(cols), uint64(rows)}
		if rows == 1 {
			dims = dims[:1]
		}
		var data []byte
		if typ == 8 {
			rb, _ := RowBytes(DTypeQ8_0, cols)
			data = make([]byte, rows*rb)
			for r := range rows {
				_ = QuantizeRow(DTypeQ8_0, stored[r*cols:(r+1)*cols], data[r*rb:(r+1)*rb])
				_ = DequantizeRow(DTypeQ8_0, data[r*rb:(r+1)*rb], v[r*cols:(r+1)*cols]) // the values it holds
			}
		} else {
			data = f32Bytes(stored)
		}
		ts = append(ts, ggufTensor{name, typ, dims, data})
	}
	add("token_embd.weight", V, H, 0, 0)
	add("output_norm.weight", 1, H, 0, 0)
	for l := range L {
		p := "blk." + string(rune('0'+l)) + "."
		add(p+"attn_norm.weight", 1, H, 0, 0)
		add(p+"attn_q.weight", heads*D, H, 0, heads)
		add(p+"attn_k.weight", kv*D, H, 0, kv)
		add(p+"attn_v.weight", kv*D, H, 0, 0)
		add(p+"attn_output.weight", H, heads*D, 0, 0)
		add(p+"ffn_norm.weight", 1, H, 0, 0)
		add(p+"ffn_gate.weight", inner, H, 8, 0)
		add(p+"ffn_up.weight", inner, H, 8, 0)
		add(p+"ffn_down.weight", H, inner, 8, 0)
	}
	return kvs, ts, canon
}

// writeTemp writes b to a .gguf file in a temporary folder.
func writeTemp(t testing.TB, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.gguf")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestGGUFOpensAsALlamaCheckpoint(t *testing.T) {
	kvs, ts, canon := tinyGGUF()
	path := writeTemp(t, encodeGGUF(kvs, ts))
	// The file and its folder (which has no config.json) are the same checkpoint.
	for _, p := range []string{path, filepath.Dir(path)} {
		c, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		cfg := c.Config
		if cfg.Hidden != 64 || cfg.Layers != 2 || cfg.Heads != 4 || cfg.KVHeads != 2 || cfg.HeadDim != 16 || cfg.Inner != 96 ||
			cfg.VocabSize != 259 || !cfg.TiedHead || cfg.Norm != RMSNorm || !cfg.GatedMLP || cfg.Positions != RotaryPositions ||
			!slices.Equal(cfg.EOSIDs, []int32{258}) || c.GGUF != path {
			t.Errorf("config %+v (GGUF %q)", cfg, c.GGUF)
		}
		ws, err := c.Weights()
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			got, err := w.Float32()
			if err != nil {
				t.Fatal(err)
			}
			var want []float32
			for _, p := range w.Parts {
				want = append(want, canon[p.Tensor.Name]...)
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: the values are not the tensors' in Hugging Face's row order", &w)
			}
		}
		c.Close()
	}
	tok, cfg, err := TokenizerFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cfg), `"chat_template":"{{ messages }}"`) || !strings.Contains(string(tok), `"merges":["A B","C D"]`) {
		t.Errorf("tokenizer files: %s\n%s", tok, cfg)
	}
	tk, err := LoadTokenizer(path)
	if err != nil {
		t.Fatal(err)
	}
	if ids := tk.Encode("ABCD<eos>"); !slices.Equal(ids, []int32{256, 257, 258}) {
		t.Errorf("ABCD with merges A B and C D: %v", ids)
	}
}

func TestGGUFCheckpointsFailNamingWhatIsWrong(t *testing.T) {
	kvs, ts, _ := tinyGGUF()
	without := func(key string) []ggufKV {
		return slices.DeleteFunc(slices.Clone(kvs), func(kv ggufKV) bool { return kv.key == key })
	}
	with := func(key string, v any) []ggufKV {
		out := without(key)
		return append(out, ggufKV{key, v})
	}
	tensorsWith := func(f func(t []ggufTensor) []ggufTensor) []ggufTensor {
		c := slices.Clone(ts)
		return f(c)
	}
	good := encodeGGUF(kvs, ts)
	for _, tc := range []struct {
		name string
		file []byte
		want string
	}{
		{"bad magic", append([]byte("GGUX"), good[4:]...), "not a GGUF file"},
		{"version 1", append(append(slices.Clone(good[:4]), 1, 0, 0, 0), good[8:]...), "GGUF version 1 is not supported"},
		{"a truncated header", good[:200], "truncated"},
		{"a truncated tensor", good[:len(good)-4096], "run past the data region"},
		{"too many metadata entries", func() []byte {
			b := slices.Clone(good)
			binary.LittleEndian.PutUint64(b[16:], 1<<60)
			return b
		}(), "metadata count"},
		{"too many tensors", func() []byte {
			b := slices.Clone(good)
			binary.LittleEndian.PutUint64(b[8:], 1<<40)
			return b
		}(), "exceeds"},
		{"a huge string", encodeGGUF(append(slices.Clone(kvs), ggufKV{"x", ggufRaw{ggufString, binary.LittleEndian.AppendUint64(nil, 1<<62)}}), ts), `metadata "x"`},
		{"a huge array", encodeGGUF(append(slices.Clone(kvs), ggufKV{"x", ggufRaw{ggufArray,
			binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(nil, ggufU64), 1<<61)}}), ts), "a count of"},
		{"an unknown value type", encodeGGUF(append(slices.Clone(kvs), ggufKV{"x", ggufRaw{99, nil}}), ts), "unknown value type 99"},
		{"arrays nested too deep", encodeGGUF(append(slices.Clone(kvs), ggufKV{"x", ggufRaw{ggufArray, func() []byte {
			var b []byte
			for range 6 {
				b = binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(b, ggufArray), 1)
			}
			return b
		}()}}), ts), "nested"},
		{"a duplicate key", encodeGGUF(append(slices.Clone(kvs), kvs[1]), ts), `"llama.context_length" appears twice`},
		{"a bad alignment", encodeGGUF(append(slices.Clone(kvs), ggufKV{"general.alignment", uint32(3)}), ts), "general.alignment"},
		{"an unknown GGML type", encodeGGUF(kvs, tensorsWith(func(t []ggufTensor) []ggufTensor { t[0].typ = 77; return t })), "GGML type 77 is unknown"},
		{"rows not whole blocks", encodeGGUF(kvs, tensorsWith(func(t []ggufTensor) []ggufTensor {
			t[len(t)-1].dims = []uint64{95, 64}
			return t
		})), "not a whole number of Q8_0 blocks"},
		{"dimensions that overflow", encodeGGUF(kvs, tensorsWith(func(t []ggufTensor) []ggufTensor {
			t[0].dims = []uint64{64, 1 << 40, 1 << 40}
			return t
		})), "token_embd.weight"},
		{"five dimensions", encodeGGUF(kvs, tensorsWith(func(t []ggufTensor) []ggufTensor {
			t[0].dims = []uint64{64, 259, 1, 1, 1}
			return t
		})), "5 dimensions"},
		{"a duplicate tensor", encodeGGUF(kvs, append(slices.Clone(ts), ts[0])), "appears twice"},
		{"an unsupported architecture", encodeGGUF(with("general.architecture", "mamba"), ts), `"mamba" is not supported`},
		{"a missing size", encodeGGUF(without("llama.embedding_length"), ts), `"llama.embedding_length": missing`},
		{"a size the tensors do not have", encodeGGUF(with("llama.feed_forward_length", uint32(128)), ts), "blk.0.ffn_gate.weight"},
		{"more layers than the tensors", encodeGGUF(with("llama.block_count", uint32(3)), ts), "llama.block_count"},
		{"a huge vocabulary", encodeGGUF(with("llama.vocab_size", uint32(1<<30)), ts), "llama.vocab_size"},
		{"partial rotary", encodeGGUF(with("llama.rope.dimension_count", uint32(8)), ts), "partial rotary"},
		{"yarn", encodeGGUF(with("llama.rope.scaling.type", "yarn"), ts), `"yarn" is not supported`},
		{"a quantized norm", encodeGGUF(kvs, tensorsWith(func(t []ggufTensor) []ggufTensor {
			t[1] = ggufTensor{"output_norm.weight", 8, []uint64{64}, make([]byte, 68)}
			return t
		})), "output_norm.weight: GGML type Q8_0"},
		{"a Q4_0 matrix", encodeGGUF(kvs, tensorsWith(func(t []ggufTensor) []ggufTensor {
			t[len(t)-1] = ggufTensor{"blk.1.ffn_down.weight", 2, []uint64{96, 64}, make([]byte, 64*3*18)}
			return t
		})), "GGML type Q4_0"},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			path := writeTemp(t, tc.file)
			c, err := Open(path)
			if err == nil {
				_, err = c.Weights()
				c.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
	t.Run("refuses a folder of two GGUF files", func(t *testing.T) {
		dir := t.TempDir()
		for _, n := range []string{"a.gguf", "b.gguf"} {
			if err := os.WriteFile(filepath.Join(dir, n), good, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "a.gguf, b.gguf") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("refuses an unsupported pre-tokenizer", func(t *testing.T) {
		path := writeTemp(t, encodeGGUF(with("tokenizer.ggml.pre", "deepseek-coder"), ts))
		if _, _, err := TokenizerFiles(path); err == nil || !strings.Contains(err.Error(), `"deepseek-coder" is not supported`) {
			t.Errorf("got %v", err)
		}
	})
	t.Run("a file without a tokenizer has none", func(t *testing.T) {
		var kv []ggufKV
		for _, e := range kvs {
			if !strings.HasPrefix(e.key, "tokenizer.") {
				kv = append(kv, e)
			}
		}
		path := writeTemp(t, encodeGGUF(kv, ts))
		if _, err := LoadTokenizer(path); err == nil || !strings.Contains(err.Error(), "no tokenizer") {
			t.Errorf("got %v", err)
		}
	})
}

// FuzzOpenGGUF mutates a small GGUF model and loads it as the CPU engine's loader does:
// Open, every weight resolved and converted to float32, and the tokenizer files made.
// Nothing may panic, take over 5 s, or allocate more than the file's size justifies;
// every failure is an error.
func FuzzOpenGGUF(f *testing.F) {
	kvs, ts, _ := tinyGGUF()
	good := encodeGGUF(kvs, ts)
	f.Add(good)
	f.Add(good[:1000])
	b := slices.Clone(good)
	binary.LittleEndian.PutUint64(b[16:], 1<<40)
	f.Add(b)
	f.Fuzz(func(t *testing.T, file []byte) {
		if len(file) > 1<<16 {
			// Larger files only repeat what the size checks bound, slowly (the seed
			// is 20 KB).
			return
		}
		path := filepath.Join(t.TempDir(), "m.gguf")
		if err := os.WriteFile(path, file, 0o644); err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		done := make(chan error, 1)
		go func() {
			c, err := Open(path)
			if err != nil {
				done <- err
				return
			}
			defer c.Close()
			ws, err := c.Weights()
			if err == nil {
				for i := range ws {
					if _, err = ws[i].Float32(); err != nil {
						break
					}
				}
			}
			_, _, _ = TokenizerFiles(path)
			done <- err
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("loading took over 5 s")
		}
		runtime.ReadMemStats(&after)
		// Float32 weights are at most ~7 bytes a byte of Q4_K; strings and the
		// tokenizer's JSON a few times the metadata; a bounded amount on top.
		budget := 16*uint64(len(file)) + 16<<20
		if got := after.TotalAlloc - before.TotalAlloc; got > budget {
			t.Fatalf("loading %d bytes allocated %d bytes (budget %d)", len(file), got, budget)
		}
	})
}

package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"gollm/model"
)

// encodeRows stores rows×cols values in dtype, row by row.
func encodeRows(t testing.TB, dtype string, v []float32, rows, cols int) []byte {
	t.Helper()
	rb, err := model.RowBytes(dtype, cols)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, rows*rb)
	for r := range rows {
		row, dst := v[r*cols:(r+1)*cols], out[r*rb:(r+1)*rb]
		switch dtype {
		case "F16", "BF16":
			tn, err := model.NewFloatTensor("w", dtype, []int{cols}, row)
			if err != nil {
				t.Fatal(err)
			}
			copy(dst, tn.Data)
		default:
			if err := model.QuantizeRow(dtype, row, dst); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}

// decodeRows is the float32 values rows stored in dtype hold.
func decodeRows(t testing.TB, dtype string, raw []byte, rows, cols int) []float32 {
	t.Helper()
	rb, _ := model.RowBytes(dtype, cols)
	out := make([]float32, rows*cols)
	for r := range rows {
		if err := model.DequantizeRow(dtype, raw[r*rb:(r+1)*rb], out[r*cols:(r+1)*cols]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// randomMatrix returns rows×cols values with the spread of a layer's weights, a few
// of them large (as real weights have).
func randomMatrix(rng *rand.Rand, rows, cols int) []float32 {
	v := randomLogits(rng, rows*cols, 0.05)
	for i := range v {
		if rng.IntN(200) == 0 {
			v[i] *= 20
		}
	}
	return v
}

// rowMatrix wraps one part of rows stored in dtype as a matrix.
func rowMatrix(t testing.TB, dtype string, raw []byte, f32 []float32, rows, cols int, perm []int32) *matrix {
	t.Helper()
	f, ok := formatOf(dtype)
	if !ok {
		t.Fatalf("no format %s", dtype)
	}
	m := &matrix{rows: rows, cols: cols}
	if err := m.addPart(f, rows, raw, f32, perm); err != nil {
		t.Fatal(err)
	}
	return m
}

// interleaved is m with its quantized part's rows interleaved four at a time, as
// LoadWeights stores them (a copy; a float part is left as it is).
func interleaved(m *matrix) *matrix {
	c := &matrix{rows: m.rows, cols: m.cols, parts: slices.Clone(m.parts)}
	if err := c.parts[0].interleave(nil); err != nil {
		panic(err)
	}
	return c
}

func TestSixteenBitKernelsGiveTheFloat32Sums(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	forEachKernelPath(t, func(t *testing.T) {
		for _, dtype := range []string{"F16", "BF16"} {
			for _, cols := range []int{1, 7, 8, 64, 133} {
				w := randomMatrix(rng, 4, cols)
				raw := encodeRows(t, dtype, w, 4, cols)
				wide := decodeRows(t, dtype, raw, 4, cols)
				x := randomLogits(rng, cols, 1)
				rb := 2 * cols
				rows := [4][]byte{raw[:rb], raw[rb : 2*rb], raw[2*rb : 3*rb], raw[3*rb:]}
				got := dot4x16(x, &rows, dtype == "BF16")
				a, b, c, d := dot1x4(x, wide[:cols], wide[cols:2*cols], wide[2*cols:3*cols], wide[3*cols:])
				if want := [4]float32{a, b, c, d}; got != want {
					t.Errorf("%s, %d columns: %v, the same weights in float32 give %v", dtype, cols, got, want)
				}
			}
		}
	})
}

// product is ys = xs·mᵀ with m's mul on a fresh scratch.
func product(m *matrix, xs [][]float32, bias []float32) [][]float32 {
	ys := make([][]float32, len(xs))
	for r := range ys {
		ys[r] = make([]float32, m.rows)
	}
	m.mul(ys, xs, bias, &mulScratch{})
	return ys
}

// rowsOf splits v into rows of cols.
func rowsOf(v []float32, cols int) [][]float32 {
	var out [][]float32
	for i := 0; i < len(v); i += cols {
		out = append(out, v[i:i+cols])
	}
	return out
}

func TestMatrixProductsDoNotDependOnTheRowsAround(t *testing.T) {
	// Every format, through the one-row kernels (a single input row) and the prompt path
	// (tiles, blocks, widened weights): each row's outputs must be the same bits.
	rng := rand.New(rand.NewPCG(6, 6))
	for _, dtype := range []string{"F32", "F16", "BF16", model.DTypeQ8_0, model.DTypeQ4_K, model.DTypeQ6_K} {
		cols := 512
		for _, rows := range []int{4, 7, 30, 600} {
			w := randomMatrix(rng, rows, cols)
			var raw []byte
			var f32 []float32
			if dtype == "F32" {
				f32 = w
			} else {
				raw = encodeRows(t, dtype, w, rows, cols)
			}
			bias := randomLogits(rng, rows, 1)
			xs := rowsOf(randomLogits(rng, 9*cols, 1), cols)
			forEachKernelPath(t, func(t *testing.T) {
				m := rowMatrix(t, dtype, raw, f32, rows, cols, nil)
				all := product(m, xs, bias)
				if model.IsQuantized(dtype) {
					// Rows interleaved four at a time give the same sums.
					il := product(interleaved(m), xs, bias)
					for r := range xs {
						if !slices.Equal(il[r], all[r]) {
							t.Fatalf("%s %d×%d: row %d with the weight rows interleaved differs by %g", dtype, rows, cols, r, maxAbsDiff(il[r], all[r]))
						}
					}
				}
				for r, x := range xs {
					one := product(m, [][]float32{x}, bias)[0]
					if !slices.Equal(one, all[r]) {
						t.Fatalf("%s %d×%d: row %d alone differs from the batch of %d by %g", dtype, rows, cols, r, len(xs), maxAbsDiff(one, all[r]))
					}
				}
				five := product(m, xs[:5], bias)
				for r := range five {
					if !slices.Equal(five[r], all[r]) {
						t.Fatalf("%s %d×%d: row %d of a batch of 5 differs from a batch of 9", dtype, rows, cols, r)
					}
				}
			})
		}
	}
}

func TestAssemblyAndGoKernelsAgree(t *testing.T) {
	if !useAVX2 {
		t.Skip("this CPU lacks AVX2: only the Go kernels run")
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for _, dtype := range []string{"F32", "F16", "BF16", model.DTypeQ8_0, model.DTypeQ4_K, model.DTypeQ6_K} {
		for _, cols := range []int{256, 768, 2048} {
			rows := 37
			w := randomMatrix(rng, rows, cols)
			var raw []byte
			var f32 []float32
			if dtype == "F32" {
				f32 = w
			} else {
				raw = encodeRows(t, dtype, w, rows, cols)
			}
			m := rowMatrix(t, dtype, raw, f32, rows, cols, nil)
			xs := rowsOf(randomLogits(rng, 6*cols, 1), cols)
			asm := product(m, xs, nil)
			hasVNNI, hasTile, hasBF16 := useVNNI, useTile, useBF16
			useAVX2, useVNNI, useTile, useBF16 = false, false, false, false
			goRes := product(m, xs, nil)
			useAVX2 = true
			avx2 := product(m, xs, nil)
			useVNNI, useTile, useBF16 = hasVNNI, hasTile, hasBF16
			if dtype == "BF16" && useBF16 {
				// The bfloat16 kernels: their own definition, exactly (TestBF16KernelsMatchTheirDefinition).
				goRes = productBF16Go(raw, xs, rows, cols)
			}
			for r := range xs {
				if model.IsQuantized(dtype) && !slices.Equal(avx2[r], asm[r]) {
					t.Errorf("%s, %d columns, row %d: the AVX2 and AVX-512 kernels differ by %g", dtype, cols, r, maxAbsDiff(avx2[r], asm[r]))
				}
			}
			for r := range xs {
				switch {
				case model.IsQuantized(dtype):
					// Integer sums and unfused float steps: the same bits.
					if !slices.Equal(asm[r], goRes[r]) {
						t.Errorf("%s, %d columns, row %d: assembly and Go differ by %g", dtype, cols, r, maxAbsDiff(asm[r], goRes[r]))
					}
				case dtype == "BF16" && useBF16:
					if !slices.Equal(asm[r], goRes[r]) {
						t.Errorf("%s, %d columns, row %d: the bfloat16 kernels and dotBF16Go differ by %g", dtype, cols, r, maxAbsDiff(asm[r], goRes[r]))
					}
				default:
					// FMA lanes against Go's one ordered sum: float rounding apart.
					if e := relL2(asm[r], goRes[r]); e > 1e-5 {
						t.Errorf("%s, %d columns, row %d: assembly and Go differ (relative L2 %.3g)", dtype, cols, r, e)
					}
				}
			}
		}
	}
}

// productBF16Go is xs times the bfloat16 rows raw as the bfloat16 kernels define it: each
// input rounded to bfloat16, each output dotBF16Go.
func productBF16Go(raw []byte, xs [][]float32, rows, cols int) [][]float32 {
	ys := make([][]float32, len(xs))
	for r, x := range xs {
		xb := make([]uint16, cols)
		for k := range xb {
			xb[k] = toBF16(x[k])
		}
		ys[r] = make([]float32, rows)
		for j := range rows {
			ys[r][j] = dotBF16Go(xb, raw[j*2*cols:(j+1)*2*cols])
		}
	}
	return ys
}

func TestBF16KernelsMatchTheirDefinition(t *testing.T) {
	if !useBF16 {
		t.Skip("this CPU lacks AVX-512 BF16: bfloat16 weights take the float32 kernels")
	}
	rng := rand.New(rand.NewPCG(9, 9))
	for _, cols := range []int{16, 48, 2048} {
		for _, rows := range []int{1, 5, 6, 7, 37} {
			// One to three input rows take the decode kernel, four and more the tile
			// (its last tile padded); both must give the definition's bits.
			for _, n := range []int{1, 3, 4, 5, 9} {
				w := randomMatrix(rng, rows, cols)
				raw := encodeRows(t, "BF16", w, rows, cols)
				m := rowMatrix(t, "BF16", raw, nil, rows, cols, nil)
				xs := rowsOf(randomLogits(rng, n*cols, 1), cols)
				got := product(m, xs, nil)
				want := productBF16Go(raw, xs, rows, cols)
				wide := decodeRows(t, "BF16", raw, rows, cols)
				for r, x := range xs {
					if !slices.Equal(got[r], want[r]) {
						t.Fatalf("%d×%d weights, %d inputs, row %d: the kernels and dotBF16Go differ by %g", rows, cols, n, r, maxAbsDiff(got[r], want[r]))
					}
					// Each input off by at most 2⁻⁹ of itself: each output by at most 2⁻⁹ of
					// Σ|x·w| (the float32 sums' own rounding far below; 2⁻⁸ leaves room).
					for j := range rows {
						var exact, mag float64
						for k, v := range x {
							p := float64(v) * float64(wide[j*cols+k])
							exact += p
							mag += math.Abs(p)
						}
						if e := math.Abs(float64(got[r][j]) - exact); e > mag/256 {
							t.Errorf("%d×%d weights, %d inputs, output %d,%d: %g, the exact product %g (Σ|x·w| %g)", rows, cols, n, r, j, got[r][j], exact, mag)
						}
					}
				}
			}
		}
	}
}

func TestBF16RoundingIsToNearestEven(t *testing.T) {
	for _, tc := range []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1
		{0x3f808000, 0x3f80}, // a tie, to the even 1
		{0x3f818000, 0x3f82}, // a tie, to the even above
		{0x3f808001, 0x3f81}, // above the tie
		{0xbf80ffff, 0xbf81},
		{0x7f7fffff, 0x7f80}, // the largest float rounds to infinity
		{0x7fc00001, 0x7fc0}, // a NaN stays a NaN
		{0x7f800001, 0x7fc0}, // a signalling NaN too, quieted
	} {
		if got := toBF16(math.Float32frombits(tc.in)); got != tc.want {
			t.Errorf("toBF16(%#08x) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
}

func TestQuantizedProductsApproximateTheFloatOnes(t *testing.T) {
	// Against the float product of the dequantized weights: the weights' own error is
	// not the kernels' to answer for, only the inputs' 8-bit quantization.
	rng := rand.New(rand.NewPCG(8, 8))
	for _, dtype := range []string{model.DTypeQ8_0, model.DTypeQ4_K, model.DTypeQ6_K} {
		forEachKernelPath(t, func(t *testing.T) {
			rows, cols := 64, 1024
			w := randomMatrix(rng, rows, cols)
			raw := encodeRows(t, dtype, w, rows, cols)
			deq := decodeRows(t, dtype, raw, rows, cols)
			xs := rowsOf(randomLogits(rng, 3*cols, 1), cols)
			got := product(rowMatrix(t, dtype, raw, nil, rows, cols, nil), xs, nil)
			want := product(f32Matrix(deq, rows, cols), xs, nil)
			for r := range xs {
				if e := relL2(got[r], want[r]); e > 0.02 {
					t.Errorf("%s row %d: relative L2 error %.3g against the dequantized weights' product", dtype, r, e)
				}
			}
			// And the weights' quantization error itself, for the record.
			exact := product(f32Matrix(w, rows, cols), xs, nil)
			t.Logf("%s: relative L2 error against the unquantized weights' product %.3g", dtype, relL2(got[0], exact[0]))
		})
	}
}

func TestPermutedRowsLandWhereTheyBelong(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	rows, cols := 12, 256
	for _, dtype := range []string{"F32", "F16", model.DTypeQ8_0, model.DTypeQ4_K} {
		w := randomMatrix(rng, rows, cols)
		perm := make([]int32, rows)
		for i := range perm {
			perm[i] = int32(i)
		}
		rng.Shuffle(rows, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		stored := make([]float32, rows*cols) // stored row i is row perm[i]
		for i, p := range perm {
			copy(stored[i*cols:(i+1)*cols], w[int(p)*cols:int(p+1)*cols])
		}
		var raw []byte
		var f32 []float32
		if dtype == "F32" {
			f32 = stored
		} else {
			raw = encodeRows(t, dtype, stored, rows, cols)
			w = make([]float32, rows*cols)
			deq := decodeRows(t, dtype, raw, rows, cols)
			for i, p := range perm {
				copy(w[int(p)*cols:int(p+1)*cols], deq[i*cols:(i+1)*cols])
			}
		}
		m := rowMatrix(t, dtype, raw, f32, rows, cols, perm)
		if model.IsQuantized(dtype) {
			m = interleaved(m)
		}
		for r := range rows {
			got := make([]float32, cols)
			m.row(r, got)
			if !slices.Equal(got, w[r*cols:(r+1)*cols]) {
				t.Errorf("%s: row %d is not the row the permutation puts there", dtype, r)
			}
		}
		xs := rowsOf(randomLogits(rng, 5*cols, 1), cols)
		got := product(m, xs, nil)
		want := product(f32Matrix(w, rows, cols), xs, nil)
		for r := range xs {
			if e := relL2(got[r], want[r]); e > 0.02 {
				t.Errorf("%s row %d: relative L2 error %.3g against the rows in order", dtype, r, e)
			}
		}
	}
}

// BenchmarkMatrixDecode measures one input row against a TinyLlama-sized MLP matrix
// (5632×2048) in each format: bytes read per second are what decode speed comes down to.
func BenchmarkMatrixDecode(b *testing.B) {
	benchMatrix(b, 1)
}

// BenchmarkMatrixPrompt measures 128 input rows against the same matrix.
func BenchmarkMatrixPrompt(b *testing.B) {
	benchMatrix(b, 128)
}

func benchMatrix(b *testing.B, n int) {
	rng := rand.New(rand.NewPCG(10, 10))
	rows, cols := 5632, 2048
	w := randomMatrix(rng, rows, cols)
	xs := rowsOf(randomLogits(rng, n*cols, 1), cols)
	for _, dtype := range []string{"F32", "F16", "BF16", model.DTypeQ8_0, model.DTypeQ4_K, model.DTypeQ6_K} {
		var raw []byte
		var f32 []float32
		if dtype == "F32" {
			f32 = w
		} else {
			raw = encodeRows(b, dtype, w, rows, cols)
		}
		m := rowMatrix(b, dtype, raw, f32, rows, cols, nil)
		ys := make([][]float32, n)
		for r := range ys {
			ys[r] = make([]float32, rows)
		}
		var s mulScratch
		b.Run(dtype, func(b *testing.B) {
			b.SetBytes(m.bytes())
			cpu0 := cpuTime()
			for range b.N {
				m.mul(ys, xs, nil, &s)
			}
			// On a shared machine the process's CPU time says more about the kernels than
			// the wall time does.
			cpu := cpuTime() - cpu0
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e6, "ms/op")
			b.ReportMetric(cpu.Seconds()*1e3/float64(b.N), "cpu-ms/op")
			b.ReportMetric(2*float64(rows*cols*n)*float64(b.N)/cpu.Seconds()/1e9, "GFLOP/cpu-s")
		})
	}
}

var _ = math.Abs

// threadTime is the calling thread's CPU time (the goroutine must be locked to it).
func threadTime() time.Duration {
	var ts syscall.Timespec
	_, _, _ = syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 3 /* CLOCK_THREAD_CPUTIME_ID */, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkKernelMin times one core's kernel on a weight matrix that fits in L2
// (256×2048) against one input row (decode) and 16 (prompt), reporting the least thread
// CPU time of many short runs: on a shared machine, the runs other processes disturbed
// least.
func BenchmarkKernelMin(b *testing.B) {
	rng := rand.New(rand.NewPCG(11, 11))
	rows, cols := 256, 2048
	w := randomMatrix(rng, rows, cols)
	for _, n := range []int{1, 16} {
		xs := rowsOf(randomLogits(rng, n*cols, 1), cols)
		ys := make([][]float32, n)
		for r := range ys {
			ys[r] = make([]float32, rows)
		}
		for _, dtype := range []string{"F32", "F16", "BF16", model.DTypeQ8_0, model.DTypeQ4_K, model.DTypeQ6_K} {
			var raw []byte
			var f32 []float32
			if dtype == "F32" {
				f32 = w
			} else {
				raw = encodeRows(b, dtype, w, rows, cols)
			}
			m := rowMatrix(b, dtype, raw, f32, rows, cols, nil)
			var s mulScratch
			b.Run(fmt.Sprintf("rows=%d/%s", n, dtype), func(b *testing.B) {
				s.a8.quantize(xs, cols)
				s.a8K.quantize(xs, cols)
				for len(s.wide) < 1 {
					s.wide = append(s.wide, nil)
				}
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				best := time.Duration(1 << 62)
				for range b.N {
					for range 20 {
						t := threadTime()
						m.mulPart(&m.parts[0], ys, xs, nil, 0, rows, &s, 0)
						best = min(best, threadTime()-t)
					}
				}
				b.ReportMetric(float64(best.Nanoseconds())/1e3, "µs-min")
				b.ReportMetric(float64(rows*cols*n)/best.Seconds()/1e9, "GMAC/s")
			})
		}
	}
}

// BenchmarkPromptMin times one core's prompt product — 128 input rows against a
// 1024×2048 weight matrix, the inputs' quantizing or packing included — reporting the
// least thread CPU time of several runs. Run it with -cpu 1.
func BenchmarkPromptMin(b *testing.B) {
	rng := rand.New(rand.NewPCG(12, 12))
	rows, cols, n := 1024, 2048, 128
	w := randomMatrix(rng, rows, cols)
	xs := rowsOf(randomLogits(rng, n*cols, 1), cols)
	ys := make([][]float32, n)
	for r := range ys {
		ys[r] = make([]float32, rows)
	}
	for _, dtype := range []string{"F32", "F16", "BF16", model.DTypeQ8_0, model.DTypeQ4_K} {
		var raw []byte
		var f32 []float32
		if dtype == "F32" {
			f32 = w
		} else {
			raw = encodeRows(b, dtype, w, rows, cols)
		}
		m := rowMatrix(b, dtype, raw, f32, rows, cols, nil)
		var s mulScratch
		b.Run(dtype, func(b *testing.B) {
			s.a8.quantize(xs, cols)
			s.a8K.quantize(xs, cols)
			for len(s.wide) < 1 {
				s.wide = append(s.wide, nil)
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			best := time.Duration(1 << 62)
			for range b.N {
				t := threadTime()
				m.mul(ys, xs, nil, &s) // one chunk, on this goroutine, with -cpu 1
				best = min(best, threadTime()-t)
			}
			b.ReportMetric(float64(best.Microseconds())/1e3, "ms-min")
			b.ReportMetric(2*float64(rows*cols*n)/best.Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkDecodeDRAM times one input row against 12 matrices of 5632×2048 in turn —
// more than the L3 cache holds in any format — as a decode step streams a model's
// weights from memory: the bytes a second it reads, over wall time and CPU time.
func BenchmarkDecodeDRAM(b *testing.B) {
	rng := rand.New(rand.NewPCG(13, 13))
	rows, cols, count := 5632, 2048, 12
	w := randomMatrix(rng, rows, cols)
	xs := rowsOf(randomLogits(rng, cols, 1), cols)
	ys := [][]float32{make([]float32, rows)}
	for _, dtype := range []string{"F16", model.DTypeQ8_0, model.DTypeQ4_K, model.DTypeQ6_K} {
		raw := encodeRows(b, dtype, w, rows, cols)
		ms := make([]*matrix, count)
		var total int64
		for i := range ms {
			ms[i] = interleaved(rowMatrix(b, dtype, slices.Clone(raw), nil, rows, cols, nil))
			total += ms[i].bytes()
		}
		var s mulScratch
		b.Run(dtype, func(b *testing.B) {
			b.SetBytes(total)
			cpu0 := cpuTime()
			for range b.N {
				for _, m := range ms {
					m.mul(ys, xs, nil, &s)
				}
			}
			cpu := cpuTime() - cpu0
			b.ReportMetric(float64(total)*float64(b.N)/cpu.Seconds()/1e9, "GB/cpu-s")
		})
	}
}

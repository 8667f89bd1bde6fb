package engines

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/model"
)

// settings are small CPU engine settings.
var settings = Settings{TokensPerBlock: 16, MaxSeqs: 4, MaxSeqLen: 128}

func TestCPUEnginesShareOneCopyOfTheWeights(t *testing.T) {
	m, err := Open("../testdata/gpt2-tiny")
	if err != nil {
		t.Fatal(err)
	}
	// Two instances start at once, as Triton may create them.
	got := make([]engine.Engine, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i], errs[i] = m.NewEngine(CPU, 0, settings) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
		defer got[i].Close()
	}
	if len(m.cpu) != 1 || got[0] == got[1] {
		t.Fatal("the engines are not two engines on one model's weights")
	}
	w := m.cpu[cpuKey{format: cpu.FormatAuto}]
	if e, err := m.NewEngine(CPU, 0, settings); err != nil || len(m.cpu) != 1 || m.cpu[cpuKey{format: cpu.FormatAuto}] != w {
		t.Errorf("a third engine reloaded the weights (%v)", err)
	} else {
		e.Close()
	}
	info := got[0].Info()
	if info.TokensPerBlock != 16 || info.MaxSeqLen != 128 || info.NumBlocks != 32 {
		t.Errorf("info %+v: want 16 positions a block, 128 positions, 4×128/16 = 32 blocks", info)
	}
}

func TestTheDefaultCPUPoolFitsInAQuarterOfTheMemory(t *testing.T) {
	m, err := Open("../testdata/llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	perToken := int64(m.cfg.Layers * 2 * m.cfg.KVHeads * m.cfg.HeadDim * 4)
	total, err := memTotal()
	if err != nil {
		t.Skip("no /proc/meminfo:", err)
	}
	s := settings
	s.MaxSeqs = 1 << 30 // far beyond what fits
	got := int64(m.defaultCPUTokens(s))
	if got*perToken > total/4 || got < int64(s.MaxSeqLen) {
		t.Errorf("%d tokens of %d bytes for a machine of %d bytes", got, perToken, total)
	}
	s.MaxSeqs = 2
	if got := m.defaultCPUTokens(s); got != 2*128 {
		t.Errorf("%d tokens for 2 sequences of 128, want 256", got)
	}
}

func TestABadCheckpointFailsAtOpenNamingTheProblem(t *testing.T) {
	raw, err := os.ReadFile("../testdata/gpt2-tiny/config.json")
	if err != nil {
		t.Fatal(err)
	}
	tensors, err := os.ReadFile("../testdata/gpt2-tiny/model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"an MLP width the tensors do not have", `"n_inner": null`, `"n_inner": 128`, "h.0.mlp.c_fc.weight"},
		{"an epsilon that overflows float32", `"layer_norm_epsilon": 1e-05`, `"layer_norm_epsilon": 1e300`, "field layer_norm_epsilon"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			config := strings.Replace(string(raw), tc.from, tc.to, 1)
			if config == string(raw) {
				t.Fatalf("config.json has no %s", tc.from)
			}
			if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), tensors, 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := Open(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("Open = %v, %v; want an error naming %s and %q", m, err, dir, tc.want)
			}
		})
	}
}

func TestEveryFixtureRunsOnTheCPU(t *testing.T) {
	for _, dir := range []string{"gpt2-tiny", "llama-tiny", "llama3-tiny", "qwen2-tiny", "mistral-tiny"} {
		t.Run(dir, func(t *testing.T) {
			m, err := Open(filepath.Join("..", "testdata", dir))
			if err != nil {
				t.Fatal(err)
			}
			e, err := m.NewEngine(CPU, 0, settings)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if _, ok := e.(*cpu.Engine); !ok {
				t.Fatalf("%T is not the CPU engine", e)
			}
			outs, err := e.Step(&engine.Batch{Seqs: []engine.Sequence{{Tokens: []int32{1, 2, 3}, Blocks: []int32{0}, Sample: true}}})
			if err != nil || outs[0].Token < 0 {
				t.Fatalf("Step = %v, %v", outs, err)
			}
		})
	}
}

// copyFolder copies the checkpoint folder src into a new temporary folder.
func copyFolder(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func TestModelsOfOneFolderShareOneModel(t *testing.T) {
	dir := copyFolder(t, "../testdata/gpt2-tiny")
	a, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The same folder by another path (a symlink) is the same checkpoint.
	link := filepath.Join(t.TempDir(), "alias")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	b, err := Open(link)
	if err != nil {
		t.Fatal(err)
	}
	if a != b || a.Users() != 2 {
		t.Fatalf("two Opens of one folder: %p and %p, %d users; want one Model with 2", a, b, a.Users())
	}
	ea, err := a.NewEngine(CPU, 0, settings)
	if err != nil {
		t.Fatal(err)
	}
	defer ea.Close()
	w := a.cpu[cpuKey{format: cpu.FormatAuto}]
	// The first model goes; the second keeps the weights and makes engines on them.
	a.Release()
	if b.Users() != 1 || b.cpu[cpuKey{format: cpu.FormatAuto}] != w {
		t.Fatalf("after one Release: %d users, weights kept %v; want 1 and true", b.Users(), b.cpu[cpuKey{format: cpu.FormatAuto}] == w)
	}
	eb, err := b.NewEngine(CPU, 0, settings)
	if err != nil {
		t.Fatal(err)
	}
	eb.Close()
	if b.cpu[cpuKey{format: cpu.FormatAuto}] != w {
		t.Error("the second model loaded the weights again")
	}
	b.Release()
	if len(b.cpu) != 0 {
		t.Error("the last Release kept the weights")
	}
	// Once released, or once its files change, the folder opens afresh.
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if c == a || c.Users() != 1 {
		t.Errorf("Open after the last Release: the old Model %v, %d users", c == a, c.Users())
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(filepath.Join(dir, "model.safetensors"), later, later); err != nil {
		t.Fatal(err)
	}
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Release()
	if d == c {
		t.Error("a folder whose weights file changed shares the Model opened before")
	}
}

// TestTensorParallelGPUEngineSaysWhatItNeeds: a split the model does not allow names the
// field; without the CUDA library (or GPUs) the error names tensor_parallel_size and the
// GPU the instance is on. (The engine itself: bridge/cuda's TestGPUTensorParallel*.)
func TestTensorParallelGPUEngineSaysWhatItNeeds(t *testing.T) {
	m, err := Open("../testdata/gpt2-tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release()
	s := settings
	s.TensorParallel = 3
	if _, err := m.NewEngine(GPU, 0, s); err == nil || !strings.Contains(err.Error(), "does not divide the model's 4 attention heads") {
		t.Errorf("3 ranks over 4 heads: %v", err)
	}
	s.TensorParallel, s.ExpertParallel = 2, true
	if _, err := m.NewEngine(GPU, 0, s); err == nil || !strings.Contains(err.Error(), "the model has no mixture of experts") {
		t.Errorf("expert parallelism of a dense model: %v", err)
	}
	s.ExpertParallel = false
	t.Setenv("GOLLM_CUDA_LIB", "/nonexistent/libgollm_cuda.so")
	if _, err := m.NewEngine(GPU, 1, s); err == nil || !strings.Contains(err.Error(), "tensor_parallel_size 2 on GPU 1") {
		t.Errorf("without the library: %v", err)
	}
	mx, err := Open("../testdata/mixtral-tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer mx.Release()
	s.TensorParallel, s.ExpertParallel = 2, true
	if _, err := mx.NewEngine(GPU, 1, s); err == nil || !strings.Contains(err.Error(), "tensor_parallel_size 2 on GPU 1") {
		t.Errorf("expert parallelism of Mixtral's 8 experts over 2, without the library: %v", err)
	}
}

func TestComputeTypeFollowsTheCheckpoint(t *testing.T) {
	for _, c := range []struct{ set, stored, want string }{
		{"", "bfloat16", "bfloat16"},
		{"", "float16", "float16"},
		{"", "float32", "float16"},
		{"float16", "bfloat16", "float16"},
		{"bfloat16", "float32", "bfloat16"},
	} {
		if got := computeType(c.set, c.stored); got != c.want {
			t.Errorf("computeType(%q, %q) = %q, want %q", c.set, c.stored, got, c.want)
		}
	}
}

// TestOneOfManyOpensIsTheFirst opens one folder from eight goroutines at once: exactly one
// Open finds it closed, the rest share it, and the last Release frees it.
func TestOneOfManyOpensIsTheFirst(t *testing.T) {
	const n = 8
	// A copy of its own, which no other test holds open.
	dir := t.TempDir()
	for _, f := range []string{"config.json", "model.safetensors"} {
		raw, err := os.ReadFile(filepath.Join("../testdata/llama-tiny", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	models := make([]*Model, n)
	shared := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			models[i], shared[i], errs[i] = OpenShared(dir)
		}()
	}
	wg.Wait()
	first := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if models[i] != models[0] {
			t.Fatalf("Open %d got another Model", i)
		}
		if !shared[i] {
			first++
		}
	}
	if first != 1 || models[0].Users() != n {
		t.Errorf("%d Opens found the folder closed (want 1), %d users (want %d)", first, models[0].Users(), n)
	}
	for _, m := range models {
		m.Release()
	}
	m, shared0, err := OpenShared(dir)
	if err != nil || shared0 {
		t.Errorf("after every Release: shared %v, %v; want a fresh Model", shared0, err)
	}
	if m != nil {
		m.Release()
	}
}

// TestBadKVScalesFailOnlyAnFP8Cache gives a checkpoint per-head KV scales, which gollm does
// not read: the model opens and serves a float cache, and only an engine that asks for an
// FP8 cache is refused, naming the tensor.
func TestBadKVScalesFailOnlyAnFP8Cache(t *testing.T) {
	src, err := model.Open("../testdata/llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	var tensors []*model.Tensor
	for _, name := range src.Names() {
		tn, _ := src.Tensor(name)
		tensors = append(tensors, &model.Tensor{Name: tn.Name, DType: tn.DType, Shape: tn.Shape, Data: slices.Clone(tn.Data)})
	}
	for l := range src.Config.Layers {
		for _, kind := range []string{"k_scale", "v_scale"} {
			tensors = append(tensors, &model.Tensor{Name: fmt.Sprintf("model.layers.%d.self_attn.%s", l, kind), DType: "F32",
				Shape: []int{2}, Data: make([]byte, 8)})
		}
	}
	src.Close()
	dir := t.TempDir()
	raw, err := os.ReadFile("../testdata/llama-tiny/config.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := model.WriteSafetensors(filepath.Join(dir, "model.safetensors"), tensors, nil); err != nil {
		t.Fatal(err)
	}
	m, err := Open(dir)
	if err != nil {
		t.Fatalf("Open with per-head KV scales: %v", err)
	}
	defer m.Release()
	e, err := m.NewEngine(CPU, 0, settings)
	if err != nil {
		t.Fatalf("a float KV cache: %v", err)
	}
	_ = e.Close()
	s := settings
	s.KVCacheDType = engine.KVFP8
	if _, err := m.NewEngine(CPU, 0, s); err == nil || !strings.Contains(err.Error(), "self_attn.k_scale: shape [2]") {
		t.Errorf("an FP8 KV cache over per-head scales: %v; want the tensor named", err)
	}
}

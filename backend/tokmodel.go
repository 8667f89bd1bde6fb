package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"runtime/debug"

	"go.uber.org/zap"

	"gollm/bridge/triton"
	"gollm/model"
	"gollm/tokenizer"
)

// Tokenizer-only models. TensorRT-LLM serves text through three Triton models — a
// Python "preprocessing" model (text to token ids, word lists to the [2, L] encoding,
// bias words to a vocabulary-sized bias), the "tensorrt_llm" engine model, and a Python
// "postprocessing" model (ids to text) — joined by an "ensemble", and its clients also
// call the three one after another (end_to_end_test.py). gollm's model reads and writes
// text itself, so "ensemble" and "tensorrt_llm" are one checkpoint under two names; a
// model with gollm_role preprocessing or postprocessing is the third and fourth: a model
// of this backend with the tensors of TensorRT-LLM's Python model of that name, reading
// the checkpoint folder's tokenizer and nothing else (no weights, no engine, no KV
// pool). Each request is answered at once, inside Execute: tokenizing one prompt is too
// little work to be worth handing to a goroutine.

// modelRole is gollm_role.
type modelRole string

// The roles.
const (
	// roleModel is the model itself: an engine generating from token ids or text.
	roleModel modelRole = "model"
	// rolePreprocessing tokenizes, as TensorRT-LLM's preprocessing model.
	rolePreprocessing modelRole = "preprocessing"
	// rolePostprocessing detokenizes, as TensorRT-LLM's postprocessing model.
	rolePostprocessing modelRole = "postprocessing"
)

// tokenizerModel is a loaded preprocessing or postprocessing model.
type tokenizerModel struct {
	// cfg holds config.pbtxt's settings, checked at load.
	cfg *modelConfig
	// version identifies the loaded version in logs.
	version uint64
	// log carries the model's name.
	log *zap.Logger
	// run answers one request: its inputs and the outputs it names (nil: all) to its
	// outputs.
	run func(tensors []triton.Tensor, want map[string]bool) ([]output, error)
}

// loadTokenizerModel loads the tokenizer of a model whose role is preprocessing or
// postprocessing, and what its defaults come from: the vocabulary size and end token
// of config.json and generation_config.json beside it (a folder without config.json,
// holding only a tokenizer, takes the tokenizer's size and has no default end token
// beyond the tokenizer files' eos_token).
func loadTokenizerModel(cfg *modelConfig, version uint64, log *zap.Logger) (*tokenizerModel, error) {
	dir := cfg.TokenizerDir
	if dir == "" {
		dir = cfg.ModelPath
	}
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("gollm_role %q reads the tokenizer of %s (tokenizer_dir, else gpt_model_path): %w", cfg.Role, dir, err)
	}
	vocab := tok.VocabSize()
	var endIDs []int32
	switch mc, err := model.ReadConfig(dir); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		// The model's vocabulary, not the tokenizer's: an embedding bias must be as long
		// as the model's (Qwen2 pads its embedding past the tokenizer's ids).
		vocab = max(vocab, mc.VocabSize)
		gen, err := model.LoadGeneration(dir, mc.VocabSize)
		if err != nil {
			return nil, err
		}
		endIDs = mc.EOSIDs
		if gen.EOSIDs != nil {
			endIDs = gen.EOSIDs
		}
	}
	tm := &tokenizerModel{cfg: cfg, version: version, log: log}
	fields := []zap.Field{zap.String("gollm_role", string(cfg.Role)), zap.String("tokenizer", dir),
		zap.Int("vocab", vocab), zap.Uint64("version", version), zap.Int("max_batch_size", cfg.MaxBatchSize)}
	switch cfg.Role {
	case rolePreprocessing:
		special, err := tok.LoadSpecialTokens(dir)
		if err != nil {
			return nil, err
		}
		// TensorRT-LLM's preprocessing hands on the tokenizer's eos_token and pad_token
		// (the end token when it has none); the checkpoint's first end token stands in
		// where the tokenizer files name none.
		end := special.EOS
		if end < 0 && len(endIDs) > 0 {
			end = endIDs[0]
		}
		pad := special.Pad
		if pad < 0 {
			pad = end
		}
		p := &preprocessor{tok: tok, addSpecial: cfg.AddSpecialTokens, endID: end, padID: pad, vocab: vocab}
		tm.run = p.run
		fields = append(fields, zap.Bool("add_special_tokens", cfg.AddSpecialTokens), zap.Int32("end_id", end), zap.Int32("pad_id", pad))
	case rolePostprocessing:
		p := &postprocessor{tok: tok, skipSpecial: cfg.SkipSpecialTokens}
		tm.run = p.run
		fields = append(fields, zap.Bool("skip_special_tokens", cfg.SkipSpecialTokens))
	default:
		return nil, fmt.Errorf("gollm_role %q has no tokenizer-only model", cfg.Role)
	}
	log.Info("tokenizer-only model loaded: no weights, no engine", fields...)
	return tm, nil
}

// tokenizerInstance is an instance of a tokenizer-only model; it answers each request
// inside Execute, so it holds nothing of its own.
type tokenizerInstance struct {
	// tm holds the tokenizer and settings every instance of the model shares.
	tm *tokenizerModel
	// ti is Triton's instance.
	ti triton.ModelInstance
	// log carries the model and instance names.
	log *zap.Logger
}

// newTokenizerInstance makes an instance of a tokenizer-only model; any kind will do,
// as nothing runs on a device.
func newTokenizerInstance(tm *tokenizerModel, ti triton.ModelInstance) (*tokenizerInstance, error) {
	name, err := ti.Name()
	if err != nil {
		return nil, err
	}
	log := tm.log.With(zap.String("instance", name))
	log.Info("instance ready", zap.String("gollm_role", string(tm.cfg.Role)))
	return &tokenizerInstance{tm: tm, ti: ti, log: log}, nil
}

// execute answers a batch of requests, each with its one, final response, and releases
// them.
func (in *tokenizerInstance) execute(reqs []triton.Request) {
	// The requests are the backend's once touched: a panic must not reach the entry
	// point, whose error would hand them back to Triton (compute recovers its own).
	defer logExecutePanic(in.log)
	start := triton.Now()
	for _, r := range reqs {
		in.answer(r, start)
	}
	reportBatch(in.ti, in.log, len(reqs), start)
}

// answer computes one request's outputs and sends them, or its error, as its final
// response; then it reports the request's statistics and releases it.
func (in *tokenizerInstance) answer(r triton.Request, start uint64) {
	id := r.ID()
	ts := triton.Timestamps{ExecStart: start, ComputeStart: triton.Now()}
	outs, err := in.compute(r)
	ts.ComputeEnd = triton.Now()
	if err != nil {
		in.log.Debug("request refused", zap.String("request_id", id), zap.Error(err))
	}
	if serr := in.send(r, outs, err); serr != nil {
		in.log.Error("cannot answer a request", zap.String("request_id", id), zap.Error(serr))
	}
	ts.ExecEnd = triton.Now()
	if serr := in.ti.ReportStatistics(r, err == nil, ts); serr != nil {
		in.log.Debug("report statistics", zap.Error(serr))
	}
	if rerr := r.Release(); rerr != nil {
		in.log.Error("release request", zap.String("request_id", id), zap.Error(rerr))
	}
}

// compute reads a request and runs the model on it; a panic becomes an internal error,
// since the request is the backend's to answer once Execute has it.
func (in *tokenizerInstance) compute(r triton.Request) (outs []output, err error) {
	defer func() {
		if p := recover(); p != nil {
			in.log.Error("panic while answering a request", zap.String("request_id", r.ID()),
				zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
			outs, err = nil, triton.Errorf(triton.CodeInternal, "gollm: internal error: %v", p)
		}
	}()
	tensors, requested, err := requestIO(r)
	if err != nil {
		return nil, err
	}
	var want map[string]bool
	if len(requested) > 0 {
		want = map[string]bool{}
		for _, n := range requested {
			want[n] = true
		}
	}
	outs, err = in.tm.run(tensors, want)
	if err != nil {
		return nil, triton.WithCode(triton.CodeInvalidArg, err)
	}
	return outs, nil
}

// send sends the request's one response: its outputs, or err.
func (in *tokenizerInstance) send(r triton.Request, outs []output, err error) error {
	factory, ferr := triton.NewResponseFactory(r)
	if ferr != nil {
		return errors.Join(ferr, triton.SendRequestError(r, firstErr(err, ferr)))
	}
	defer func() {
		if derr := factory.Delete(); derr != nil {
			in.log.Error("delete response factory", zap.String("request_id", r.ID()), zap.Error(derr))
		}
	}()
	resp, nerr := triton.NewResponse(factory)
	if nerr != nil {
		return errors.Join(nerr, factory.SendFlags(triton.ResponseFinal))
	}
	if err == nil {
		for _, o := range outs {
			if err = resp.AddOutput(o.Name, o.DataType, o.Shape, o.Data); err != nil {
				break
			}
		}
	}
	return resp.Send(triton.ResponseFinal, err)
}

// firstErr is the error a request gets when its response factory cannot be made: its
// own error when it has one, else the factory's.
func firstErr(err, factoryErr error) error {
	if err != nil {
		return err
	}
	return factoryErr
}

// batchInputs are a tokenizer-only model's request tensors by name; TensorRT-LLM's
// Python models take batches, so every tensor has the batch size first.
type batchInputs struct {
	// t keys the request's tensors by input name.
	t map[string]*triton.Tensor
	// batch is every tensor's first dimension.
	batch int
}

// newBatchInputs indexes tensors, refusing a name twice, one in refused (with its
// reason) and one outside known (role names the model in messages). The batch size
// is that of first, which must be present.
func newBatchInputs(tensors []triton.Tensor, role modelRole, first string, known map[string]bool, refused map[string]string) (*batchInputs, error) {
	b := &batchInputs{t: map[string]*triton.Tensor{}}
	for i := range tensors {
		t := &tensors[i]
		if why, ok := refused[t.Name]; ok {
			return nil, fmt.Errorf("input %q is not supported: %s", t.Name, why)
		}
		if !known[t.Name] {
			return nil, fmt.Errorf("input %q is not one gollm's %s model reads", t.Name, role)
		}
		if _, dup := b.t[t.Name]; dup {
			return nil, fmt.Errorf("input %q is given twice", t.Name)
		}
		b.t[t.Name] = t
	}
	t := b.t[first]
	if t == nil {
		return nil, fmt.Errorf("missing input %q", first)
	}
	if len(t.Shape) == 0 || t.Shape[0] < 1 {
		return nil, fmt.Errorf("input %q: shape %v has no batch dimension", first, t.Shape)
	}
	b.batch = int(t.Shape[0])
	return b, nil
}

// checkShape verifies a tensor's data type and batch dimension, and that its bytes fit
// its shape (fixed-size types); it returns the elements per batch item.
func (b *batchInputs) checkShape(name string, dtype triton.DataType) (int, error) {
	t := b.t[name]
	if t.DataType != dtype {
		return 0, fmt.Errorf("input %q: expected data type %v, got %v", name, dtype, t.DataType)
	}
	if len(t.Shape) == 0 || t.Shape[0] != int64(b.batch) {
		return 0, fmt.Errorf("input %q: shape %v; want the batch size %d first", name, t.Shape, b.batch)
	}
	n := int64(1)
	for _, d := range t.Shape[1:] {
		if d < 0 {
			return 0, fmt.Errorf("input %q: shape %v has a negative dimension", name, t.Shape)
		}
		n *= d
	}
	if size := dtype.Size(); size > 0 && int64(len(t.Data)) != n*int64(b.batch)*int64(size) {
		return 0, fmt.Errorf("input %q: %d bytes for shape %v of %v", name, len(t.Data), t.Shape, dtype)
	}
	return int(n), nil
}

// int32Rows returns an INT32 tensor's values, one row per batch item.
func (b *batchInputs) int32Rows(name string) ([][]int32, error) {
	n, err := b.checkShape(name, triton.TypeInt32)
	if err != nil {
		return nil, err
	}
	d := b.t[name].Data
	rows := make([][]int32, b.batch)
	for i := range rows {
		rows[i] = make([]int32, n)
		for j := range rows[i] {
			rows[i][j] = int32(binary.LittleEndian.Uint32(d[4*(i*n+j):]))
		}
	}
	return rows, nil
}

// int32PerItem returns an INT32 tensor holding one value per batch item ([batch, 1]).
func (b *batchInputs) int32PerItem(name string) ([]int32, error) {
	rows, err := b.int32Rows(name)
	if err != nil {
		return nil, err
	}
	v := make([]int32, len(rows))
	for i, r := range rows {
		if len(r) != 1 {
			return nil, fmt.Errorf("input %q: shape %v; want one value per batch item ([%d, 1])", name, b.t[name].Shape, b.batch)
		}
		v[i] = r[0]
	}
	return v, nil
}

// float32Rows returns an FP32 tensor's values, one row per batch item.
func (b *batchInputs) float32Rows(name string) ([][]float32, error) {
	n, err := b.checkShape(name, triton.TypeFP32)
	if err != nil {
		return nil, err
	}
	d := b.t[name].Data
	rows := make([][]float32, b.batch)
	for i := range rows {
		rows[i] = make([]float32, n)
		for j := range rows[i] {
			rows[i][j] = math.Float32frombits(binary.LittleEndian.Uint32(d[4*(i*n+j):]))
		}
	}
	return rows, nil
}

// stringRows returns a BYTES tensor's strings, one row per batch item; each must be
// valid UTF-8.
func (b *batchInputs) stringRows(name string) ([][]string, error) {
	n, err := b.checkShape(name, triton.TypeBytes)
	if err != nil {
		return nil, err
	}
	d := b.t[name].Data
	all := make([]string, 0, n*b.batch)
	for len(d) > 0 {
		if len(d) < 4 {
			return nil, fmt.Errorf("input %q: %d bytes left after %d strings, too few for a length", name, len(d), len(all))
		}
		k := binary.LittleEndian.Uint32(d)
		if uint64(k) > uint64(len(d)-4) {
			return nil, fmt.Errorf("input %q: string %d claims %d bytes, %d are left", name, len(all), k, len(d)-4)
		}
		if len(all) == n*b.batch {
			return nil, fmt.Errorf("input %q: more strings than its shape %v holds", name, b.t[name].Shape)
		}
		s := d[4 : 4+k]
		d = d[4+k:]
		if at := invalidUTF8(s); at >= 0 {
			return nil, fmt.Errorf("input %q: item %d, string %d is not valid UTF-8 (byte offset %d); send text as UTF-8", name, len(all)/max(n, 1), len(all)%max(n, 1), at)
		}
		all = append(all, string(s))
	}
	if len(all) != n*b.batch {
		return nil, fmt.Errorf("input %q: shape %v holds %d strings, the data %d", name, b.t[name].Shape, n*b.batch, len(all))
	}
	rows := make([][]string, b.batch)
	for i := range rows {
		rows[i] = all[i*n : (i+1)*n]
	}
	return rows, nil
}

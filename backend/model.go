package main

import (
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"gollm/bridge/triton"
	"gollm/engines"
	"gollm/model"
	"gollm/tokenizer"
)

// modelState is one loaded model: its configuration, the engines' shared weights and the
// tokenizer its instances share.
type modelState struct {
	// cfg holds config.pbtxt's settings, checked at load.
	cfg *modelConfig
	// version labels the metrics and names the model to the readiness probe at shutdown.
	version uint64
	// log carries the model's name.
	log *zap.Logger
	// weights is the checkpoint, its descriptor read and its tensors checked at load; the
	// weights are read by the instances as their kind needs them (a float32 copy for
	// KIND_CPU, device copies for KIND_GPU), so a GPU-only model neither converts them on
	// the CPU nor keeps them in host memory.
	weights *engines.Model
	// tok is the checkpoint's tokenizer; nil when it has no tokenizer.json.
	tok *tokenizer.Tokenizer
	// draft is the draft model of speculative decoding (draft_model); nil without one.
	draft *draftModel
	// lim are the request limits of this model.
	lim limits
	// tokenizers tokenize long text prompts off Execute (prompt.go).
	tokenizers *tokenizerPool

	// engines counts the instances whose engines are not freed yet; weightsOnce releases
	// the model's reference to the weights once (unloadwatch.go, modelFinalize).
	engines     atomic.Int32
	weightsOnce sync.Once

	// mu guards byTritonID.
	mu sync.Mutex
	// byTritonID finds the requests in flight by their Triton request id, for stop
	// requests; requests without an id are not in it.
	byTritonID map[string]map[*inflight]struct{}
}

// loadModel reads the model's configuration and loads what its gollm_role serves: the
// model itself (a *modelState), or a tokenizer-only model (a *tokenizerModel,
// tokmodel.go) that reads the checkpoint folder's tokenizer and nothing else.
func loadModel(m triton.Model, log *zap.Logger) (any, error) {
	name, err := m.Name()
	if err != nil {
		return nil, err
	}
	log = log.With(zap.String("model", name))
	version, err := m.Version()
	if err != nil {
		return nil, err
	}
	dir, err := m.RepositoryPath()
	if err != nil {
		return nil, err
	}
	raw, err := m.ConfigJSON()
	if err != nil {
		return nil, err
	}
	cfg, err := parseModelConfig(raw, dir, version)
	if err != nil {
		return nil, triton.WithCode(triton.CodeInvalidArg, fmt.Errorf("model %q: %w", name, err))
	}
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}
	if cfg.Role != roleModel {
		tm, err := loadTokenizerModel(cfg, version, log)
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", name, err)
		}
		return tm, nil
	}
	ms, err := loadCheckpoint(cfg, name, version, log)
	if err != nil {
		return nil, err
	}
	return ms, nil
}

// loadCheckpoint checks the model's checkpoint and loads its tokenizer and generation
// defaults.
func loadCheckpoint(cfg *modelConfig, name string, version uint64, log *zap.Logger) (*modelState, error) {
	// The config and the tensors' names, dtypes and shapes only: the weights wait for an
	// instance.
	weights, shared, err := engines.OpenShared(cfg.ModelPath)
	if err != nil {
		return nil, fmt.Errorf("model %q: %w", name, err)
	}
	loaded := false
	defer func() {
		if !loaded {
			weights.Release()
		}
	}()
	if shared {
		log.Info("the checkpoint is open for another model too: its weights are shared, not loaded again",
			zap.String("gpt_model_path", cfg.ModelPath), zap.Int("models", weights.Users()))
	}
	mc := weights.Config()
	maxLen := min(mc.MaxPositions, defaultMaxSeqLen)
	if cfg.MaxSeqLen > 0 {
		if cfg.MaxSeqLen > mc.MaxPositions {
			return nil, triton.WithCode(triton.CodeInvalidArg, fmt.Errorf("model %q: parameter \"max_seq_len\": %d exceeds the checkpoint's %d positions", name, cfg.MaxSeqLen, mc.MaxPositions))
		}
		maxLen = cfg.MaxSeqLen
	}
	if n := cfg.TensorParallelSize; n > 1 {
		// Said now, naming what does not divide, rather than after a long load. The GPUs
		// themselves are counted when an instance starts (engines).
		param := "tensor_parallel_size"
		if cfg.ExpertParallel {
			param = "expert_parallel"
		}
		if _, err := mc.Parallel(n, cfg.ExpertParallel); err != nil {
			return nil, triton.WithCode(triton.CodeInvalidArg, fmt.Errorf("model %q: parameter %q: %w", name, param, err))
		}
	}
	gen, err := model.LoadGeneration(cfg.ModelPath, mc.VocabSize)
	if err != nil {
		return nil, fmt.Errorf("model %q: %w", name, err)
	}
	tok, err := model.LoadTokenizer(cfg.ModelPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		log.Info("the checkpoint has no tokenizer (tokenizer.json, or a GGUF file's tokenizer metadata): text_input and text_output are unavailable", zap.String("path", cfg.ModelPath))
		tok = nil
	case err != nil:
		return nil, fmt.Errorf("model %q: %w", name, err)
	case tok.VocabSize() > mc.VocabSize:
		log.Warn("the tokenizer has more tokens than the model's vocabulary; prompts using them are refused",
			zap.Int("tokenizer", tok.VocabSize()), zap.Int("model", mc.VocabSize))
	}
	draft, err := openDraft(&cfg.Speculation, weights, tok, log)
	if err != nil {
		return nil, triton.WithCode(triton.CodeInvalidArg, fmt.Errorf("model %q: %w", name, err))
	}
	ms := &modelState{
		cfg:     cfg,
		version: version,
		log:     log,
		weights: weights,
		tok:     tok,
		draft:   draft,
		lim: limits{
			VocabSize:            mc.VocabSize,
			MaxSeqLen:            maxLen,
			EndIDs:               mc.EOSIDs,
			Gen:                  gen,
			Decoupled:            cfg.Decoupled,
			ExcludeInputInOutput: cfg.ExcludeInputInOutput,
			MaxBeamWidth:         cfg.MaxBeamWidth,
		},
		byTritonID: map[string]map[*inflight]struct{}{},
	}
	if gen.EOSIDs != nil {
		ms.lim.EndIDs = gen.EOSIDs
	}
	if tok != nil {
		ms.lim.Tokenizer = tok
		if b := tok.MaxTokenBytes(); b > 0 {
			ms.lim.MaxPromptBytes = maxLen * b
		}
	}
	ms.tokenizers = newTokenizerPool()
	ms.lim.Guides = &guides{tok: tok, vocab: mc.VocabSize}
	log.Info("model loaded",
		zap.String("gpt_model_path", cfg.ModelPath), zap.Uint64("version", version),
		zap.String("family", mc.Family), zap.String("model_type", mc.ModelType),
		zap.Int("layers", mc.Layers), zap.Int("hidden", mc.Hidden), zap.Int("heads", mc.Heads), zap.Int("kv_heads", mc.KVHeads),
		zap.Int("vocab", mc.VocabSize), zap.Int("max_seq_len", maxLen),
		zap.String("gpt_model_type", string(cfg.ModelType)), zap.String("batch_scheduler_policy", string(cfg.Policy)),
		zap.Int("max_batch_size", cfg.MaxBatchSize), zap.Bool("decoupled", cfg.Decoupled),
		zap.Bool("tokenizer", tok != nil))
	loaded = true
	return ms, nil
}

// releaseWeights drops the model's references to the shared weights (and the draft
// model's), once.
func (ms *modelState) releaseWeights() {
	ms.weightsOnce.Do(func() {
		ms.weights.Release()
		ms.draft.release()
	})
}

// engineFreed counts an instance's engine freed at the model's unload; with the last,
// the weights go too (the model serves nothing more).
func (ms *modelState) engineFreed() {
	if ms.engines.Add(-1) == 0 {
		ms.releaseWeights()
	}
}

// engineSettings are what an instance's engine is sized with.
func (ms *modelState) engineSettings(log *zap.Logger) engines.Settings {
	return engines.Settings{
		DataType:          ms.cfg.DataType,
		Quantization:      ms.cfg.Quantization,
		KVCacheDType:      ms.cfg.KVCacheDType,
		BatchInvariant:    ms.cfg.BatchInvariant,
		CPUWeightFormat:   ms.cfg.CPUWeightFormat,
		TokensPerBlock:    ms.cfg.TokensPerBlock,
		KVTokens:          ms.cfg.MaxTokensInPagedKVCache,
		KVFreeFraction:    ms.cfg.KVCacheFreeGPUMemFraction,
		GPUMemUtilization: ms.cfg.GPUMemoryUtilization,
		GPUInstances:      func(device int) int { return ms.cfg.GPUInstances[device] },
		MaxSeqs:           ms.cfg.MaxBatchSize,
		MaxSeqLen:         ms.lim.MaxSeqLen,
		TensorParallel:    ms.cfg.TensorParallelSize,
		ExpertParallel:    ms.cfg.ExpertParallel,
		Logger:            log,
	}
}

// track records an in-flight request under its Triton request id.
func (ms *modelState) track(f *inflight) {
	if f.tritonID == "" {
		return
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	set := ms.byTritonID[f.tritonID]
	if set == nil {
		set = map[*inflight]struct{}{}
		ms.byTritonID[f.tritonID] = set
	}
	set[f] = struct{}{}
}

// untrack forgets a finished request.
func (ms *modelState) untrack(f *inflight) {
	if f.tritonID == "" {
		return
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if set := ms.byTritonID[f.tritonID]; set != nil {
		delete(set, f)
		if len(set) == 0 {
			delete(ms.byTritonID, f.tritonID)
		}
	}
}

// stop marks every in-flight request with the given Triton request id to be stopped
// at the next iteration, and returns how many there were.
func (ms *modelState) stop(tritonID string) int {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for f := range ms.byTritonID[tritonID] {
		f.stop.Store(true)
	}
	return len(ms.byTritonID[tritonID])
}

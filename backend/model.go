package main

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"

	"go.uber.org/zap"

	"gollm/bridge/triton"
	"gollm/engine"
	"gollm/model"
)

// modelState is one loaded model: its configuration and the weights and tokenizer its
// instances share.
type modelState struct {
	// cfg is the parsed configuration.
	cfg *modelConfig
	// version is the model version loaded.
	version uint64
	// log carries the model's name.
	log *zap.Logger
	// ckpt is the checkpoint's config.json. The weights are read by the instances as
	// their kind needs them: float32 copies for KIND_CPU (cpuWeights), device copies for
	// KIND_GPU (gpu), so a GPU-only model neither converts them on the CPU nor keeps them
	// in host memory.
	ckpt model.Config
	// cpuMu guards cpu.
	cpuMu sync.Mutex
	// cpu holds the weights every KIND_CPU instance's engine runs on, loaded by the first.
	cpu *engine.CPUWeights
	// gpu shares the weights of the model's KIND_GPU instances, one copy per device.
	gpu gpuShare
	// tok is the checkpoint's tokenizer; nil when it has no tokenizer.json.
	tok *model.Tokenizer
	// lim are the request limits of this model.
	lim limits

	// mu guards byTritonID.
	mu sync.Mutex
	// byTritonID finds the requests in flight by their Triton request id, for stop
	// requests; requests without an id are not in it.
	byTritonID map[string]map[*inflight]struct{}
}

// loadModel reads the model's configuration and loads its checkpoint and tokenizer.
func loadModel(m triton.Model, log *zap.Logger) (*modelState, error) {
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

	// The config (Open refuses a model_type other than gpt2) and the tensor index only:
	// the weights wait for an instance.
	ckpt, err := model.Open(cfg.ModelPath)
	if err != nil {
		return nil, fmt.Errorf("model %q: %w", name, err)
	}
	mc := ckpt.Config
	if err := ckpt.Close(); err != nil {
		return nil, fmt.Errorf("model %q: %s: %w", name, cfg.ModelPath, err)
	}
	tok, err := model.LoadTokenizer(filepath.Join(cfg.ModelPath, "tokenizer.json"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		log.Info("the checkpoint has no tokenizer.json: text_input and text_output are unavailable", zap.String("path", cfg.ModelPath))
		tok = nil
	case err != nil:
		return nil, fmt.Errorf("model %q: %w", name, err)
	case tok.VocabSize() > mc.VocabSize:
		log.Warn("the tokenizer has more tokens than the model's vocabulary; prompts using them are refused",
			zap.Int("tokenizer", tok.VocabSize()), zap.Int("model", mc.VocabSize))
	}
	ms := &modelState{
		cfg:     cfg,
		version: version,
		log:     log,
		ckpt:    mc,
		tok:     tok,
		lim: limits{
			VocabSize:            mc.VocabSize,
			MaxSeqLen:            mc.MaxPositions,
			EndID:                mc.EOSID,
			Decoupled:            cfg.Decoupled,
			ExcludeInputInOutput: cfg.ExcludeInputInOutput,
		},
		byTritonID: map[string]map[*inflight]struct{}{},
	}
	if tok != nil {
		ms.lim.Tokenizer = tok
	}
	if ms.lim.EndID >= int32(ms.lim.VocabSize) {
		ms.lim.EndID = -1
	}
	log.Info("model loaded",
		zap.String("gpt_model_path", cfg.ModelPath), zap.Uint64("version", version),
		zap.Int("layers", mc.Layers), zap.Int("hidden", mc.Hidden),
		zap.Int("vocab", mc.VocabSize), zap.Int("max_seq_len", mc.MaxPositions),
		zap.String("gpt_model_type", string(cfg.ModelType)), zap.String("batch_scheduler_policy", string(cfg.Policy)),
		zap.Int("max_batch_size", cfg.MaxBatchSize), zap.Bool("decoupled", cfg.Decoupled),
		zap.Bool("tokenizer", tok != nil))
	return ms, nil
}

// cpuWeights returns the weights of the KIND_CPU instances, loading them on the first
// call. The float32 checkpoint is dropped once they are built: they keep transposed
// copies of its layer matrices, so keeping it too would hold those twice.
func (ms *modelState) cpuWeights() (*engine.CPUWeights, error) {
	ms.cpuMu.Lock()
	defer ms.cpuMu.Unlock()
	if ms.cpu == nil {
		m, err := model.LoadGPT2Dir(ms.cfg.ModelPath)
		if err != nil {
			return nil, err
		}
		w, err := engine.NewCPUWeights(m)
		if err != nil {
			return nil, fmt.Errorf("load gpt2 %s: %w", ms.cfg.ModelPath, err)
		}
		ms.cpu = w
	}
	return ms.cpu, nil
}

// kvBlocks is the number of KV blocks of an instance's CPU pool:
// max_tokens_in_paged_kv_cache (default max_batch_size × the maximum sequence length)
// in blocks of tokens_per_block, rounded up.
func (ms *modelState) kvBlocks() int {
	tokens := ms.cfg.MaxTokensInPagedKVCache
	if tokens == 0 {
		tokens = ms.cfg.MaxBatchSize * ms.lim.MaxSeqLen
	}
	return (tokens + ms.cfg.TokensPerBlock - 1) / ms.cfg.TokensPerBlock
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

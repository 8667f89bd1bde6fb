package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"gollm/kserve"
	"gollm/model"
	"gollm/tokenizer"
)

// modelTTL is how long a model's description is used before Triton is asked again (a
// model may be reloaded with another configuration under explicit model control).
const modelTTL = 5 * time.Second

// modelInfo is what the frontend knows of one Triton model.
type modelInfo struct {
	// name is the model's name, its OpenAI id.
	name string
	// decoupled says the model may stream (model_transaction_policy).
	decoupled bool
	// inputs and outputs are the tensor names the model's configuration declares.
	inputs, outputs map[string]bool
	// checkpoint is the checkpoint folder, "" when the frontend cannot tell it.
	checkpoint string
	// chat is the chat template; nil with chatErr saying why.
	chat *ChatTemplate
	// chatErr is why there is no chat template.
	chatErr error
	// tok is the checkpoint's tokenizer (token texts for logprobs, prompt lengths);
	// nil with tokErr saying why.
	tok *tokenizer.Tokenizer
	// tokErr is why there is no tokenizer.
	tokErr error
	// vocab is the model's vocabulary size (config.json), 0 when unknown.
	vocab int
	// maxSeqLen is the longest sequence the backend serves (config.json's positions,
	// bounded by the model's max_seq_len parameter), 0 when unknown.
	maxSeqLen int
	// samples says the checkpoint's generation_config.json samples by default
	// (do_sample), so the backend applies its temperature and top-p to requests that
	// leave them out.
	samples bool
	// fetched is when the description was read from Triton.
	fetched time.Time
	// created is when the frontend first saw the model, for /v1/models.
	created int64
}

// checkpointFiles are what the frontend reads from one checkpoint folder, shared by the
// models that serve it.
type checkpointFiles struct {
	// chat is the chat template, nil when there is none.
	chat *ChatTemplate
	// chatErr is why there is no chat template.
	chatErr error
	// tok is the tokenizer, nil when it is unreadable.
	tok *tokenizer.Tokenizer
	// tokErr is why there is no tokenizer.
	tokErr error
	// vocab and maxSeqLen are from config.json (0 when unknown).
	vocab, maxSeqLen int
	// samples is generation_config.json's do_sample.
	samples bool
}

// registry describes Triton's models to the handlers, caching what it read.
type registry struct {
	// client is Triton's gRPC client.
	client kserve.GRPCInferenceServiceClient
	// repository is the model repository's folder on this host ("" if not given), for
	// checkpoints given as relative paths or left to the default.
	repository string
	// overrides map model names to checkpoint folders, before anything Triton says.
	overrides map[string]string
	// log receives diagnostics.
	log *zap.Logger

	// mu guards models and files.
	mu sync.Mutex
	// models are keyed by Triton model name.
	models map[string]*modelInfo
	// files are the checkpoint folders' contents by folder.
	files map[string]*checkpointFiles
	// refreshing marks the models being refreshed in the background.
	refreshing map[string]bool
}

// lookup returns the description of a ready model. A cached one is returned at once;
// when it is older than modelTTL it is refreshed in the background, off the request's
// path (a model unloaded meanwhile fails in Triton with its own "unknown model" error).
func (r *registry) lookup(ctx context.Context, name string) (*modelInfo, *APIError) {
	if name == "" {
		return nil, invalid("model", "missing \"model\": name one of GET /v1/models")
	}
	r.mu.Lock()
	mi := r.models[name]
	stale := mi != nil && time.Since(mi.fetched) >= modelTTL && !r.refreshing[name]
	if stale {
		r.refreshing[name] = true
	}
	r.mu.Unlock()
	if mi != nil {
		if stale {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if _, api := r.fetch(ctx, name); api != nil && api.Status == http.StatusNotFound {
					r.mu.Lock()
					delete(r.models, name)
					r.mu.Unlock()
				}
				r.mu.Lock()
				delete(r.refreshing, name)
				r.mu.Unlock()
			}()
		}
		return mi, nil
	}
	return r.fetch(ctx, name)
}

// fetch reads a model's description from Triton and caches it.
func (r *registry) fetch(ctx context.Context, name string) (*modelInfo, *APIError) {
	ready, err := r.client.ModelReady(ctx, &kserve.ModelReadyRequest{Name: name})
	if err != nil {
		api := fromTriton("ask Triton whether the model is ready", err)
		if api.Status == http.StatusServiceUnavailable || api.Status == http.StatusInternalServerError {
			return nil, api
		}
		return nil, notServing(ctx, r.client, modelNotFound(name))
	}
	if !ready.Ready {
		return nil, notServing(ctx, r.client, modelNotFound(name))
	}
	cfg, err := r.client.ModelConfig(ctx, &kserve.ModelConfigRequest{Name: name})
	if err != nil {
		return nil, fromTriton("read the model's configuration from Triton", err)
	}
	version := ""
	idx, err := r.client.RepositoryIndex(ctx, &kserve.RepositoryIndexRequest{Ready: true})
	if err == nil {
		for _, m := range idx.Models {
			if m.Name == name {
				version = m.Version
			}
		}
	}
	next := r.describe(cfg.Config, version)
	r.mu.Lock()
	if old := r.models[name]; old != nil {
		next.created = old.created
	}
	r.models[name] = next
	r.mu.Unlock()
	return next, nil
}

// describe builds a model's description from its configuration.
func (r *registry) describe(cfg *kserve.ModelConfig, version string) *modelInfo {
	mi := &modelInfo{name: cfg.GetName(), inputs: map[string]bool{}, outputs: map[string]bool{},
		fetched: time.Now(), created: time.Now().Unix()}
	mi.decoupled = cfg.GetModelTransactionPolicy().GetDecoupled()
	for _, in := range cfg.GetInput() {
		mi.inputs[in.GetName()] = true
	}
	for _, out := range cfg.GetOutput() {
		mi.outputs[out.GetName()] = true
	}
	mi.checkpoint = r.checkpointDir(mi.name, cfg.GetParameters()["gpt_model_path"].GetStringValue(), version)
	if mi.checkpoint == "" {
		why := fmt.Errorf("the frontend does not know where model %q's checkpoint is: give gollm-openai -model-repository (the folder tritonserver serves) or -checkpoint %s=FOLDER", mi.name, mi.name)
		mi.chatErr, mi.tokErr = why, why
		return mi
	}
	f := r.checkpointFiles(mi.checkpoint)
	mi.chat, mi.chatErr, mi.tok, mi.tokErr, mi.vocab, mi.samples = f.chat, f.chatErr, f.tok, f.tokErr, f.vocab, f.samples
	mi.maxSeqLen = servedSeqLen(f.maxSeqLen, cfg.GetParameters()["max_seq_len"].GetStringValue())
	return mi
}

// checkpointDir finds a model's checkpoint folder as the backend does: gpt_model_path
// when absolute, else relative to the model's folder in the repository, whose version
// folder is the default. An override comes first. "" when it cannot be told.
func (r *registry) checkpointDir(name, param, version string) string {
	if dir, ok := r.overrides[name]; ok {
		return dir
	}
	if filepath.IsAbs(param) {
		return param
	}
	if r.repository == "" {
		return ""
	}
	if param == "" {
		if version == "" {
			version = "1"
		}
		param = version
	}
	return filepath.Join(r.repository, name, param)
}

// checkpointFiles reads (once per folder) the chat template, tokenizer and sizes.
func (r *registry) checkpointFiles(dir string) *checkpointFiles {
	r.mu.Lock()
	f := r.files[dir]
	r.mu.Unlock()
	if f != nil {
		return f
	}
	f = &checkpointFiles{}
	if g, err := model.GGUFPath(dir); err == nil && g != "" {
		r.ggufFiles(f, dir)
		r.mu.Lock()
		r.files[dir] = f
		r.mu.Unlock()
		return f
	}
	f.chat, f.chatErr = LoadChatTemplate(dir)
	if f.chatErr != nil && !errors.Is(f.chatErr, ErrNoChatTemplate) {
		r.log.Warn("chat template unreadable", zap.String("checkpoint", dir), zap.Error(f.chatErr))
	}
	f.tok, f.tokErr = tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if f.tokErr != nil {
		r.log.Warn("tokenizer unreadable: no logprobs for this model", zap.String("checkpoint", dir), zap.Error(f.tokErr))
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "config.json")); err == nil {
		var c struct {
			// VocabSize sizes logit_bias's embedding_bias.
			VocabSize int `json:"vocab_size"`
			// NPositions is GPT-2's longest sequence.
			NPositions int `json:"n_positions"`
			// MaxPositionEmbeddings is LLaMA's longest sequence.
			MaxPositionEmbeddings int `json:"max_position_embeddings"`
		}
		if json.Unmarshal(raw, &c) == nil {
			f.vocab, f.maxSeqLen = c.VocabSize, max(c.NPositions, c.MaxPositionEmbeddings)
		}
	}
	if gen, err := model.LoadGeneration(dir, f.vocab); err != nil {
		r.log.Warn("generation_config.json unreadable: OpenAI's sampling defaults apply", zap.String("checkpoint", dir), zap.Error(err))
	} else {
		f.samples = gen.Sample
	}
	r.mu.Lock()
	r.files[dir] = f
	r.mu.Unlock()
	return f
}

// ggufFiles fills f from a GGUF checkpoint: its tokenizer and chat template from the
// file's metadata (model.TokenizerFiles), its sizes from its config, no sampling
// defaults.
func (r *registry) ggufFiles(f *checkpointFiles, path string) {
	tok, cfg, err := model.TokenizerFiles(path)
	if err != nil {
		f.tokErr, f.chatErr = err, err
		r.log.Warn("GGUF tokenizer unreadable: no chat template or logprobs for this model", zap.String("checkpoint", path), zap.Error(err))
	} else {
		f.tok, f.tokErr = tokenizer.Parse(tok, cfg)
		f.chat, f.chatErr = ParseChatTemplate(cfg)
		if f.chatErr != nil && !errors.Is(f.chatErr, ErrNoChatTemplate) {
			r.log.Warn("chat template unreadable", zap.String("checkpoint", path), zap.Error(f.chatErr))
		}
	}
	if c, err := model.Open(path); err == nil {
		f.vocab, f.maxSeqLen = c.Config.VocabSize, c.Config.MaxPositions
		_ = c.Close()
	}
}

// backendMaxSeqLen is the backend's default bound on max_seq_len (backend/config.go's
// defaultMaxSeqLen), which a checkpoint with more positions is served at.
const backendMaxSeqLen = 8192

// servedSeqLen is the longest sequence the backend serves for a checkpoint of positions
// positions (0: unknown) and the model's max_seq_len parameter ("" when absent).
func servedSeqLen(positions int, param string) int {
	if positions <= 0 {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(param)); err == nil && n > 0 {
		return min(positions, n)
	}
	return min(positions, backendMaxSeqLen)
}

// list returns the ready models that take text (text_input → text_output).
func (r *registry) list(ctx context.Context) ([]*modelInfo, *APIError) {
	idx, err := r.client.RepositoryIndex(ctx, &kserve.RepositoryIndexRequest{Ready: true})
	if err != nil {
		return nil, fromTriton("list Triton's models", err)
	}
	var out []*modelInfo
	seen := map[string]bool{}
	for _, m := range idx.Models {
		if seen[m.Name] {
			continue
		}
		seen[m.Name] = true
		mi, api := r.lookup(ctx, m.Name)
		if api != nil {
			continue // unloaded in between, or not ready
		}
		if mi.inputs[inTextInput] && mi.outputs[outTextOutput] {
			out = append(out, mi)
		}
	}
	return out, nil
}

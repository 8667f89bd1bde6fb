package main

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"go.uber.org/zap"

	"gollm/batchmanager"
	"gollm/engine"
	"gollm/engines"
	"gollm/model"
	"gollm/speculate"
	"gollm/tokenizer"
)

// Speculative decoding's parameters (README, "Speculative decoding"):
//
//	speculative_decoding_mode     prompt_lookup, draft_model or eagle3; draft_model when
//	                              only speculative_draft_model_path is set
//	speculative_draft_model_path  the draft's checkpoint folder (draft_model, eagle3)
//	num_speculative_tokens        proposals per sequence and step, 1 to 16 (default 4)
//	prompt_lookup_min/max         the n-gram sizes prompt lookup matches (default 2 and 4)
//	speculative_max_step_tokens   the generation rows a step may hold with proposals
//	                              (default 32)
//	speculative_adaptive          false: propose whether or not it pays (default true)

func init() { params = append(params, specParams...) }

// specMode is speculative_decoding_mode.
type specMode string

// The speculative decoding modes.
const (
	specNone         specMode = ""
	specPromptLookup specMode = "prompt_lookup"
	specDraftModel   specMode = "draft_model"
	specEagle3       specMode = "eagle3"
)

// Defaults of the speculation parameters.
const (
	defaultNumSpecTokens = 4
	defaultLookupMin     = 2
	defaultLookupMax     = 4
)

// speculationConfig is a model's speculative decoding settings.
type speculationConfig struct {
	// Mode is speculative_decoding_mode; specNone turns speculation off.
	Mode specMode
	// DraftPath is speculative_draft_model_path made absolute.
	DraftPath string
	// NumTokens is num_speculative_tokens.
	NumTokens int
	// LookupMin and LookupMax are prompt_lookup_min and prompt_lookup_max.
	LookupMin, LookupMax int
	// MaxStepTokens is speculative_max_step_tokens (0: the batch manager's default).
	MaxStepTokens int
	// Pinned is speculative_adaptive false: no policy holds proposals back.
	Pinned bool
	// set names the speculation parameters given, for the checks.
	set map[string]bool
	// inferred says Mode came from speculative_draft_model_path alone: the checkpoint
	// decides between draft_model and eagle3 at load.
	inferred bool
}

// specParams are the speculation parameters of config.pbtxt.
var specParams = []paramSpec{
	{"speculative_decoding_mode", func(c *modelConfig, v string) error {
		m, err := oneOf(v, specPromptLookup, specDraftModel, specEagle3)
		c.Speculation.Mode = m
		return c.Speculation.mark("speculative_decoding_mode", err)
	}},
	{"speculative_draft_model_path", func(c *modelConfig, v string) error {
		c.Speculation.DraftPath = v
		return c.Speculation.mark("speculative_draft_model_path", nil)
	}},
	{"num_speculative_tokens", func(c *modelConfig, v string) (err error) {
		c.Speculation.NumTokens, err = intBetween(v, 1, engine.MaxDraftTokens)
		return c.Speculation.mark("num_speculative_tokens", err)
	}},
	{"prompt_lookup_min", func(c *modelConfig, v string) (err error) {
		c.Speculation.LookupMin, err = intBetween(v, 1, 64)
		return c.Speculation.mark("prompt_lookup_min", err)
	}},
	{"prompt_lookup_max", func(c *modelConfig, v string) (err error) {
		c.Speculation.LookupMax, err = intBetween(v, 1, 64)
		return c.Speculation.mark("prompt_lookup_max", err)
	}},
	{"speculative_max_step_tokens", func(c *modelConfig, v string) (err error) {
		c.Speculation.MaxStepTokens, err = intBetween(v, 1, 1<<16)
		return c.Speculation.mark("speculative_max_step_tokens", err)
	}},
	{"speculative_adaptive", func(c *modelConfig, v string) error {
		on, err := parseBool(v)
		c.Speculation.Pinned = !on
		return c.Speculation.mark("speculative_adaptive", err)
	}},
}

// mark records that a parameter was given (unless it failed to parse).
func (s *speculationConfig) mark(name string, err error) error {
	if err == nil {
		if s.set == nil {
			s.set = map[string]bool{}
		}
		s.set[name] = true
	}
	return err
}

// finish checks the speculation parameters together and fills their defaults; a
// relative draft path is taken from modelDir.
func (s *speculationConfig) finish(c *modelConfig, modelDir string) error {
	if s.Mode == specNone && s.DraftPath != "" {
		s.Mode, s.inferred = specDraftModel, true
	}
	if s.Mode == specNone {
		for _, name := range []string{"num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "speculative_max_step_tokens", "speculative_adaptive"} {
			if s.set[name] {
				return fmt.Errorf(`parameter %q needs speculative decoding: set "speculative_decoding_mode" (prompt_lookup, draft_model or eagle3) or "speculative_draft_model_path"`, name)
			}
		}
		return nil
	}
	if c.ModelType == batchmanager.V1 {
		return fmt.Errorf(`parameter "speculative_decoding_mode" %s: speculative decoding needs in-flight batching, but gpt_model_type is V1`, s.Mode)
	}
	switch s.Mode {
	case specPromptLookup:
		if s.DraftPath != "" {
			return errors.New(`parameter "speculative_draft_model_path": prompt_lookup uses no draft model; set "speculative_decoding_mode" to draft_model or eagle3, or drop the path`)
		}
	default:
		if s.DraftPath == "" {
			return fmt.Errorf(`parameter "speculative_decoding_mode" %s needs "speculative_draft_model_path", the draft's checkpoint folder`, s.Mode)
		}
		for _, name := range []string{"prompt_lookup_min", "prompt_lookup_max"} {
			if s.set[name] {
				return fmt.Errorf(`parameter %q applies to prompt_lookup, not %s`, name, s.Mode)
			}
		}
		if !filepath.IsAbs(s.DraftPath) {
			s.DraftPath = filepath.Join(modelDir, s.DraftPath)
		}
	}
	if s.NumTokens == 0 {
		s.NumTokens = defaultNumSpecTokens
	}
	switch {
	case s.LookupMin == 0 && s.LookupMax == 0:
		s.LookupMin, s.LookupMax = defaultLookupMin, defaultLookupMax
	case s.LookupMin == 0:
		s.LookupMin = min(defaultLookupMin, s.LookupMax)
	case s.LookupMax == 0:
		s.LookupMax = max(defaultLookupMax, s.LookupMin)
	}
	if s.LookupMin > s.LookupMax {
		return fmt.Errorf(`parameters "prompt_lookup_min" %d and "prompt_lookup_max" %d: the minimum exceeds the maximum`, s.LookupMin, s.LookupMax)
	}
	return nil
}

// draftModel is a model's draft (draft_model) or EAGLE-3 head (eagle3), opened and
// checked at load.
type draftModel struct {
	// weights is the draft's checkpoint, shared like any other (engines.Open); nil for
	// an EAGLE-3 head.
	weights *engines.Model
	// eagle is the EAGLE-3 head; nil for a draft model.
	eagle *model.Eagle3
}

// openDraft opens and checks the draft of a model whose vocabulary is vocab and whose
// tokenizer is tok (nil when it has none): the draft must have the same vocabulary and
// tokenizer, so that its token ids mean what the model's do.
func openDraft(s *speculationConfig, target *engines.Model, tok *tokenizer.Tokenizer, log *zap.Logger) (*draftModel, error) {
	if s.Mode != specDraftModel && s.Mode != specEagle3 {
		return nil, nil
	}
	const param = `parameter "speculative_draft_model_path"`
	vocab := target.Config().VocabSize
	isEagle, err := model.IsEagle3(s.DraftPath)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", param, s.DraftPath, err)
	}
	switch {
	case isEagle && s.inferred:
		s.Mode = specEagle3
	case isEagle && s.Mode == specDraftModel:
		return nil, fmt.Errorf("%s %s is an EAGLE-3 head (LlamaForCausalLMEagle3): set \"speculative_decoding_mode\" to eagle3", param, s.DraftPath)
	case !isEagle && s.Mode == specEagle3:
		return nil, fmt.Errorf("%s %s is not an EAGLE-3 head (config.json names no LlamaForCausalLMEagle3 architecture nor a draft_vocab_size)", param, s.DraftPath)
	}
	if s.Mode == specEagle3 {
		return openEagle3(s, target, log)
	}
	w, err := engines.Open(s.DraftPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", param, err)
	}
	ok := false
	defer func() {
		if !ok {
			w.Release()
		}
	}()
	dc := w.Config()
	if dc.VocabSize != vocab {
		return nil, fmt.Errorf("%s %s: the draft's vocabulary has %d tokens, the model's %d: a draft must share the model's tokenizer and vocabulary",
			param, s.DraftPath, dc.VocabSize, vocab)
	}
	dtok, err := tokenizer.Load(filepath.Join(s.DraftPath, "tokenizer.json"))
	switch {
	case errors.Is(err, fs.ErrNotExist) && tok == nil:
		// Neither has a tokenizer: the vocabularies' sizes are all there is to compare.
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s %s: the draft has no tokenizer.json to compare with the model's", param, s.DraftPath)
	case err != nil:
		return nil, fmt.Errorf("%s %s: %w", param, s.DraftPath, err)
	case tok == nil:
		return nil, fmt.Errorf("%s %s: the model has no tokenizer.json to compare with the draft's", param, s.DraftPath)
	default:
		if err := sameTokenizer(tok, dtok); err != nil {
			return nil, fmt.Errorf("%s %s: the draft's tokenizer differs from the model's (%w): a draft must share the model's tokenizer", param, s.DraftPath, err)
		}
	}
	log.Info("speculative decoding with a draft model", zap.String("speculative_draft_model_path", s.DraftPath),
		zap.String("family", dc.Family), zap.Int("layers", dc.Layers), zap.Int("hidden", dc.Hidden),
		zap.Int("num_speculative_tokens", s.NumTokens))
	ok = true
	return &draftModel{weights: w}, nil
}

// sameTokenizer says how two tokenizers differ, if they do: in size, or in the text of a
// token.
func sameTokenizer(a, b *tokenizer.Tokenizer) error {
	if a.VocabSize() != b.VocabSize() {
		return fmt.Errorf("%d tokens against %d", b.VocabSize(), a.VocabSize())
	}
	one := make([]int32, 1)
	for id := range int32(a.VocabSize()) {
		one[0] = id
		if x, y := a.Decode(one), b.Decode(one); x != y || a.IsSpecial(id) != b.IsSpecial(id) {
			return fmt.Errorf("token %d is %q in the draft, %q in the model", id, y, x)
		}
	}
	return nil
}

// release drops the draft's checkpoint.
func (d *draftModel) release() {
	if d != nil && d.weights != nil {
		d.weights.Release()
	}
}

// proposer makes an instance's proposer for its engine eng of kind on device, and its
// settings for the batch manager; the zero Speculation when speculation is off.
func (ms *modelState) proposer(eng engine.Engine, kind engines.Kind, device int, log *zap.Logger) (batchmanager.Speculation, error) {
	s := &ms.cfg.Speculation
	if s.Mode == specNone {
		return batchmanager.Speculation{}, nil
	}
	info := eng.Info()
	if info.MaxDraft == 0 {
		return batchmanager.Speculation{}, fmt.Errorf(`parameter "speculative_decoding_mode" %s: this instance's engine (%s) does not verify proposed tokens; serve the model on KIND_CPU, or drop the speculation parameters`, s.Mode, kind)
	}
	if s.NumTokens > info.MaxDraft {
		return batchmanager.Speculation{}, fmt.Errorf(`parameter "num_speculative_tokens" %d: this instance's engine verifies at most %d per sequence and step`, s.NumTokens, info.MaxDraft)
	}
	sp := batchmanager.Speculation{MaxDraft: s.NumTokens, MaxStepTokens: s.MaxStepTokens, Adaptive: !s.Pinned}
	switch s.Mode {
	case specPromptLookup:
		g, err := speculate.NewNGram(s.LookupMin, s.LookupMax)
		if err != nil {
			return sp, err
		}
		sp.Proposer = g
	case specDraftModel:
		set := ms.engineSettings(log)
		// The draft's pool holds as many positions as the model's.
		set.KVTokens = info.NumBlocks * info.TokensPerBlock
		set.TensorParallel = 0
		de, err := ms.draft.weights.NewEngine(kind, device, set)
		if err != nil {
			return sp, fmt.Errorf(`parameter "speculative_draft_model_path": the draft's engine: %w`, err)
		}
		d, err := speculate.NewDraft(de, info.VocabSize)
		if err != nil {
			_ = de.Close()
			return sp, fmt.Errorf(`parameter "speculative_draft_model_path": %w`, err)
		}
		sp.Proposer = d
	case specEagle3:
		if info.Hidden == 0 {
			return sp, fmt.Errorf(`parameter "speculative_decoding_mode" eagle3: this instance's engine (%s) does not return the model's hidden states, which the head reads; serve the model on KIND_CPU`, kind)
		}
		kv := engine.KVConfig{NumBlocks: info.NumBlocks, TokensPerBlock: info.TokensPerBlock, MaxSeqLen: min(info.MaxSeqLen, ms.draft.eagle.Config.MaxPositions)}
		head, err := ms.weights.NewEagle3Head(ms.draft.eagle, kv)
		if err != nil {
			return sp, fmt.Errorf(`parameter "speculative_draft_model_path": %w`, err)
		}
		g, err := speculate.NewEagle3(head, info.VocabSize)
		if err != nil {
			_ = head.Close()
			return sp, fmt.Errorf(`parameter "speculative_draft_model_path": %w`, err)
		}
		sp.Proposer = g
	}
	return sp, nil
}

// openEagle3 loads and checks an EAGLE-3 head against its target.
func openEagle3(s *speculationConfig, target *engines.Model, log *zap.Logger) (*draftModel, error) {
	const param = `parameter "speculative_draft_model_path"`
	h, err := model.LoadEagle3(s.DraftPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", param, err)
	}
	tc := target.Config()
	c := &h.Config
	switch {
	case c.VocabSize != tc.VocabSize:
		return nil, fmt.Errorf("%s %s: the EAGLE-3 head's vocabulary has %d tokens, the model's %d: a head is trained for one model", param, s.DraftPath, c.VocabSize, tc.VocabSize)
	case c.TargetHidden != tc.Hidden:
		return nil, fmt.Errorf("%s %s: the EAGLE-3 head reads hidden states %d wide, the model's are %d: a head is trained for one model", param, s.DraftPath, c.TargetHidden, tc.Hidden)
	case h.Embed == nil && c.Hidden != tc.Hidden:
		return nil, fmt.Errorf("%s %s: the EAGLE-3 head has no embedding of its own and is %d wide, the model's embedding %d", param, s.DraftPath, c.Hidden, tc.Hidden)
	}
	aux, err := h.AuxLayersFor(tc.Layers)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", param, s.DraftPath, err)
	}
	log.Info("speculative decoding with an EAGLE-3 head", zap.String("speculative_draft_model_path", s.DraftPath),
		zap.Ints("target_layers", aux), zap.Int("draft_vocab", c.DraftVocab), zap.Int("num_speculative_tokens", s.NumTokens))
	return &draftModel{eagle: h}, nil
}

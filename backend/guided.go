package main

import (
	"errors"
	"fmt"
	"sync"

	"gollm/guide"
	"gollm/tokenizer"
)

// Guided decoding's inputs, as TensorRT-LLM's backend names them:
// guided_decoding_guide_type (json, json_schema, regex, ebnf_grammar; structural_tag is
// refused) and guided_decoding_guide (the schema, expression or grammar; none for
// json). The constraint is compiled on the model's vocabulary — the checkpoint's
// tokenizer.json, on the ids path too — and kept in the model's cache by its text.

const (
	inGuideType = "guided_decoding_guide_type"
	inGuide     = "guided_decoding_guide"
)

// maxGuideBytes bounds guided_decoding_guide.
const maxGuideBytes = 1 << 20

// guides compiles a model's constraints: its vocabulary's tables are built on the first
// guided request (a large vocabulary takes a fraction of a second), not at load.
type guides struct {
	// tok is the checkpoint's tokenizer; nil without tokenizer.json.
	tok *tokenizer.Tokenizer
	// vocab is the model's vocabulary size.
	vocab int
	once  sync.Once
	c     *guide.Compiler
	err   error
}

// compiler returns the model's compiler, or why there is none.
func (g *guides) compiler() (*guide.Compiler, error) {
	g.once.Do(func() {
		if g.tok == nil {
			g.err = errors.New("guided decoding needs the checkpoint's tokenizer.json, which it does not have")
			return
		}
		tb, err := g.tok.TokenBytes()
		if err != nil {
			g.err = fmt.Errorf("guided decoding is not available for this tokenizer: %w", err)
			return
		}
		v, err := guide.NewVocab(tb, g.vocab)
		if err != nil {
			g.err = err
			return
		}
		g.c = guide.NewCompiler(v, 0)
	})
	return g.c, g.err
}

// guided reads the guided decoding inputs into p.Req.Guide.
func (in inputs) guided(p *parsedRequest, lim limits) error {
	if in[inGuideType] == nil {
		if in[inGuide] != nil {
			return fmt.Errorf("input %q needs %q (json, json_schema, regex or ebnf_grammar)", inGuide, inGuideType)
		}
		return nil
	}
	typ, err := in.text(inGuideType)
	if err != nil {
		return err
	}
	kind := guide.ParseKind(typ)
	if kind == "" || kind == "none" {
		return nil
	}
	switch kind {
	case guide.KindJSON, guide.KindJSONSchema, guide.KindRegex, guide.KindEBNF, guide.KindJSONObject, guide.KindChoice:
	case guide.KindStructuralTag:
		return fmt.Errorf("input %q: %q is not supported by gollm (json, json_schema, regex and ebnf_grammar are)", inGuideType, typ)
	default:
		return fmt.Errorf("input %q: unknown guide type %q; want json, json_schema, regex or ebnf_grammar", inGuideType, typ)
	}
	text := ""
	if in[inGuide] != nil {
		if n := len(in[inGuide].Data); n > maxGuideBytes+4 {
			return fmt.Errorf("input %q: %d bytes; the most is %d", inGuide, n-4, maxGuideBytes)
		}
		if text, err = in.text(inGuide); err != nil {
			return err
		}
	}
	if text == "" && kind != guide.KindJSON && kind != guide.KindJSONObject {
		return fmt.Errorf("input %q: guide type %q needs %q (the schema, expression or grammar)", inGuideType, typ, inGuide)
	}
	if lim.Guides == nil {
		return fmt.Errorf("input %q: guided decoding is not available for this model", inGuideType)
	}
	c, err := lim.Guides.compiler()
	if err != nil {
		return fmt.Errorf("input %q: %w", inGuideType, err)
	}
	g, err := c.Guide(kind, text)
	if err != nil {
		return fmt.Errorf("input %q: %w", inGuide, err)
	}
	p.Req.Guide = g
	return nil
}

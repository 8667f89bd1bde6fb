package guide

import (
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// Kind names a constraint's kind: the guided_decoding_guide_type values of
// TensorRT-LLM's backend, and gollm's own choice.
type Kind string

const (
	// KindJSON is any JSON object or array (the guide text is ignored).
	KindJSON Kind = "json"
	// KindJSONObject is any JSON object (OpenAI's json_object).
	KindJSONObject Kind = "json_object"
	// KindJSONSchema is a JSON schema.
	KindJSONSchema Kind = "json_schema"
	// KindRegex is a regular expression.
	KindRegex Kind = "regex"
	// KindEBNF is a grammar in the GBNF dialect.
	KindEBNF Kind = "ebnf_grammar"
	// KindChoice is a JSON list of strings.
	KindChoice Kind = "choice"
	// KindStructuralTag is TensorRT-LLM's structural tag, which gollm refuses.
	KindStructuralTag Kind = "structural_tag"
)

// ErrUnsupportedKind says a constraint kind is not implemented.
var ErrUnsupportedKind = errors.New("unsupported guide type")

// Compile compiles a constraint of a kind.
func Compile(kind Kind, text string) (*Grammar, error) {
	switch kind {
	case KindJSON:
		return CompileJSON(false, DefaultJSONOptions)
	case KindJSONObject:
		return CompileJSON(true, DefaultJSONOptions)
	case KindJSONSchema:
		return CompileJSONSchema(text, DefaultJSONOptions)
	case KindRegex:
		return CompileRegex(text)
	case KindEBNF:
		return CompileEBNF(text)
	case KindChoice:
		var list []string
		if err := json.Unmarshal([]byte(text), &list); err != nil {
			return nil, fmt.Errorf("choice: the guide must be a JSON list of strings: %v", err)
		}
		return CompileChoice(list)
	case KindStructuralTag:
		return nil, fmt.Errorf("%w %q: structural tags are not implemented; use json_schema, regex or ebnf_grammar", ErrUnsupportedKind, kind)
	}
	return nil, fmt.Errorf("%w %q: want one of json, json_schema, regex, ebnf_grammar", ErrUnsupportedKind, kind)
}

// Compiler compiles constraints for one vocabulary and keeps the most recently used
// ones (and their refusals), keyed by kind and text, so that a schema sent with every
// request is compiled once. It is safe for concurrent use; requests for a constraint
// being compiled wait for that compile.
type Compiler struct {
	// v is the vocabulary.
	v *Vocab
	// max is how many constraints are kept.
	max int
	// mu guards entries and lru.
	mu      sync.Mutex
	entries map[string]*list.Element
	lru     *list.List
	// hits and misses count lookups.
	hits, misses uint64
}

// cacheEntry is one constraint's compile, done once.
type cacheEntry struct {
	key  string
	once sync.Once
	g    *Guide
	err  error
}

// DefaultCacheSize is how many constraints a Compiler keeps.
const DefaultCacheSize = 256

// NewCompiler makes a compiler for v keeping size constraints (0: the default).
func NewCompiler(v *Vocab, size int) *Compiler {
	if size <= 0 {
		size = DefaultCacheSize
	}
	return &Compiler{v: v, max: size, entries: map[string]*list.Element{}, lru: list.New()}
}

// Vocab returns the vocabulary.
func (c *Compiler) Vocab() *Vocab { return c.v }

// Guide returns the guide of a constraint, compiled on first use.
func (c *Compiler) Guide(kind Kind, text string) (*Guide, error) {
	if kind == KindJSON || kind == KindJSONObject {
		text = ""
	}
	key := string(kind) + "\x00" + text
	c.mu.Lock()
	el, ok := c.entries[key]
	if ok {
		c.lru.MoveToFront(el)
		c.hits++
	} else {
		c.misses++
		el = c.lru.PushFront(&cacheEntry{key: key})
		c.entries[key] = el
		for c.lru.Len() > c.max {
			old := c.lru.Back()
			c.lru.Remove(old)
			delete(c.entries, old.Value.(*cacheEntry).key)
		}
	}
	c.mu.Unlock()
	e := el.Value.(*cacheEntry)
	e.once.Do(func() {
		gr, err := Compile(kind, text)
		if err != nil {
			e.err = err
			return
		}
		e.g, e.err = gr.Bind(c.v)
	})
	return e.g, e.err
}

// Stats returns the cache's hits and misses.
func (c *Compiler) Stats() (hits, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}

// ParseKind reads a guide type name (case-insensitive, "-" as "_").
func ParseKind(s string) Kind {
	return Kind(strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_"))
}

package openai

import "gollm/guide"

// guideCompileEBNF compiles a grammar as the backend would.
func guideCompileEBNF(src string) (*guide.Grammar, error) { return guide.CompileEBNF(src) }

package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gollm/bridge/triton"
	"gollm/tokenizer"
)

// austenLimits are the limits of the austen demo model, with its tokenizer.
func austenLimits(t *testing.T) limits {
	t.Helper()
	tok, err := tokenizer.Load(filepath.Join("..", "model_repository", "austen", "1", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	return limits{VocabSize: 4096, MaxSeqLen: 256, EndIDs: []int32{0}, Decoupled: true, Tokenizer: tok,
		Guides: &guides{tok: tok, vocab: 4096}}
}

func TestParseGuidedDecoding(t *testing.T) {
	lim := austenLimits(t)
	base := []triton.Tensor{i32(inInputIDs, 1, 2, 3), i32(inRequestOutputLen, 8)}
	for _, tc := range []struct {
		name, typ, guide string
	}{
		{"json", "json", ""},
		{"json_schema", "json_schema", `{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`},
		{"regex", "regex", `\d+`},
		{"ebnf_grammar", "ebnf_grammar", `root ::= [0-9]+`},
		{"upper case type", "JSON_SCHEMA", `{"type":"string"}`},
	} {
		ts := append(append([]triton.Tensor{}, base...), str(inGuideType, tc.typ))
		if tc.guide != "" {
			ts = append(ts, str(inGuide, tc.guide))
		}
		p, err := parseRequest(ts, nil, lim)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if p.Req.Guide == nil {
			t.Fatalf("%s: no guide", tc.name)
		}
		if p.Req.Guide.Vocab().Size() != 4096 {
			t.Fatalf("%s: guide vocabulary %d", tc.name, p.Req.Guide.Vocab().Size())
		}
	}
	// The same schema again is the cached guide.
	schema := str(inGuide, `{"type":"array","items":{"type":"boolean"}}`)
	p1, err := parseRequest(append(append([]triton.Tensor{}, base...), str(inGuideType, "json_schema"), schema), nil, lim)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := parseRequest(append(append([]triton.Tensor{}, base...), str(inGuideType, "json_schema"), schema), nil, lim)
	if err != nil || p1.Req.Guide != p2.Req.Guide {
		t.Fatalf("a repeated schema was compiled again (%v)", err)
	}
	// No guide type, or "none": no guide.
	for _, ts := range [][]triton.Tensor{base, append(append([]triton.Tensor{}, base...), str(inGuideType, "none"))} {
		p, err := parseRequest(ts, nil, lim)
		if err != nil || p.Req.Guide != nil {
			t.Fatalf("got guide %v, %v; want none", p.Req.Guide, err)
		}
	}
}

func TestParseGuidedDecodingErrors(t *testing.T) {
	lim := austenLimits(t)
	base := []triton.Tensor{i32(inInputIDs, 1, 2, 3), i32(inRequestOutputLen, 8)}
	with := func(ts ...triton.Tensor) []triton.Tensor { return append(append([]triton.Tensor{}, base...), ts...) }
	noTok := lim
	noTok.Guides = &guides{vocab: 4096}
	for _, tc := range []struct {
		name string
		in   []triton.Tensor
		lim  limits
		want string
	}{
		{"structural tag", with(str(inGuideType, "structural_tag"), str(inGuide, "{}")), lim, `input "guided_decoding_guide_type": "structural_tag" is not supported`},
		{"unknown type", with(str(inGuideType, "yaml")), lim, `unknown guide type "yaml"`},
		{"guide without type", with(str(inGuide, `\d`)), lim, `input "guided_decoding_guide" needs "guided_decoding_guide_type"`},
		{"schema missing", with(str(inGuideType, "json_schema")), lim, `needs "guided_decoding_guide"`},
		{"bad schema", with(str(inGuideType, "json_schema"), str(inGuide, `{"type":"array","uniqueItems":true}`)), lim, `input "guided_decoding_guide": json_schema: keyword "uniqueItems"`},
		{"bad regex", with(str(inGuideType, "regex"), str(inGuide, `(a`)), lim, `input "guided_decoding_guide": regex: at byte 2: missing )`},
		{"bad grammar", with(str(inGuideType, "ebnf_grammar"), str(inGuide, `start ::= "a"`)), lim, `no rule named root`},
		{"nothing matches", with(str(inGuideType, "json_schema"), str(inGuide, `false`)), lim, `no JSON value satisfies the schema`},
		{"no tokenizer", with(str(inGuideType, "json")), noTok, `needs the checkpoint's tokenizer.json`},
		{"wrong type", with(i32(inGuideType, 1)), lim, `input "guided_decoding_guide_type": expected data type BYTES`},
		{"huge guide", with(str(inGuideType, "regex"), str(inGuide, strings.Repeat("a", maxGuideBytes+1))), lim, `bytes; the most is`},
		{"explosive regex", with(str(inGuideType, "regex"), str(inGuide, `(a|b)*a(a|b){30}`)), lim, `too complex`},
	} {
		t0 := time.Now()
		_, err := parseRequest(tc.in, nil, tc.lim)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("%s: refused after %v", tc.name, d)
		}
	}
}

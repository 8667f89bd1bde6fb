package guide

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// JSON schemas. A schema becomes a grammar of the JSON texts it accepts — or of a
// part of them, never more: objects write their properties in the schema's order;
// enum and const values are written compactly; strings use escapes only for the
// characters that need them. Recursion through $ref stays recursion in the grammar.
// Keywords gollm cannot enforce (uniqueItems, multipleOf, patternProperties, …) are
// refused by name rather than ignored; annotations (title, description, default, …)
// and unknown keywords are ignored, as JSON Schema says of unknown keywords.

// JSONOptions shape the JSON a schema's grammar writes.
type JSONOptions struct {
	// MaxWhitespace is the most whitespace characters between two tokens of the
	// JSON (after { [ , : and before } ]); 0 writes it compact; negative: no limit.
	MaxWhitespace int
	// AllowAdditional lets objects have properties the schema does not list when
	// additionalProperties is absent (JSON Schema's default). Off, as OpenAI's strict
	// mode and most structured-output engines do, they have only the listed ones.
	AllowAdditional bool
}

// DefaultJSONOptions are the options of the json_schema and json constraints.
var DefaultJSONOptions = JSONOptions{MaxWhitespace: 16}

// maxSchemaBytes bounds a schema's text.
const maxSchemaBytes = 1 << 20

// maxSchemaDepth bounds a schema's nesting.
const maxSchemaDepth = 64

// maxSchemaItems bounds the members of a schema's lists (properties, enum, anyOf).
const maxSchemaItems = 4096

// SchemaError is a schema the compiler refuses, with where in it.
type SchemaError struct {
	// Path is the JSON pointer of the place at fault ("" for the root).
	Path string
	// Msg says what is wrong.
	Msg string
}

func (e *SchemaError) Error() string {
	if e.Path == "" {
		return "json_schema: " + e.Msg
	}
	return fmt.Sprintf("json_schema: at %s: %s", e.Path, e.Msg)
}

// jsBuilder turns a schema into a grammar.
type jsBuilder struct {
	opt  JSONOptions
	doc  any
	def  *grammarDef
	refs map[string]int
	ws   *expr
	// anyRule is the rule of any JSON value, made on first use.
	anyRule int
	// items counts list members, bounding the work.
	items int
	// order holds each decoded object's keys in the schema's order, by map identity.
	order map[uintptr][]string
}

// CompileJSONSchema compiles a JSON schema (a JSON text): the constrained text is one
// JSON value the schema accepts.
func CompileJSONSchema(schema string, opt JSONOptions) (*Grammar, error) {
	if len(schema) > maxSchemaBytes {
		return nil, &SchemaError{"", fmt.Sprintf("the schema has %d bytes; the most is %d", len(schema), maxSchemaBytes)}
	}
	b := newJSBuilder(opt)
	doc, err := b.decodeSchema(schema)
	if err != nil {
		return nil, err
	}
	b.doc = doc
	root := b.rule("root")
	e, err := b.value(doc, "", 0)
	if err != nil {
		return nil, err
	}
	b.def.bodies[root] = e
	b.def.root = root
	g, err := newGrammar(b.def, "json_schema", schema, DefaultLimits)
	if err != nil {
		if errors.Is(err, ErrMatchesNothing) {
			return nil, &SchemaError{"", "no JSON value satisfies the schema (a false schema, an empty enum, a required property that may not exist, …)"}
		}
		return nil, fmt.Errorf("json_schema: %w", err)
	}
	return g, nil
}

// CompileJSON compiles "any JSON object or array" (TensorRT-LLM's json guide, as
// xgrammar's built-in JSON grammar) or, objectOnly, any JSON object (OpenAI's
// json_object response format).
func CompileJSON(objectOnly bool, opt JSONOptions) (*Grammar, error) {
	b := newJSBuilder(opt)
	root := b.rule("root")
	b.anyValue()
	obj, arr := b.anyObjectArray()
	if objectOnly {
		b.def.bodies[root] = obj
	} else {
		b.def.bodies[root] = alt(obj, arr)
	}
	b.def.root = root
	kind := "json"
	if objectOnly {
		kind = "json_object"
	}
	return newGrammar(b.def, kind, kind, DefaultLimits)
}

func newJSBuilder(opt JSONOptions) *jsBuilder {
	b := &jsBuilder{opt: opt, def: &grammarDef{}, refs: map[string]int{}, anyRule: -1, order: map[uintptr][]string{}}
	wsChars := charClass([]runeRange{{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}})
	switch {
	case opt.MaxWhitespace < 0:
		b.ws = repeat(wsChars, 0, -1)
	default:
		b.ws = repeat(wsChars, 0, opt.MaxWhitespace)
	}
	return b
}

// decodeSchema parses the schema's JSON: numbers kept as written, each object's key
// order remembered (properties are written in it), nesting bounded.
func (b *jsBuilder) decodeSchema(s string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	v, err := b.decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, &SchemaError{"", "not valid JSON: more than one value"}
	}
	return v, nil
}

// decodeValue reads one value.
func (b *jsBuilder) decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > 2*maxSchemaDepth {
		return nil, &SchemaError{"", fmt.Sprintf("the schema nests more than %d levels deep", 2*maxSchemaDepth)}
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, &SchemaError{"", fmt.Sprintf("not valid JSON: %v", err)}
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := map[string]any{}
			var keys []string
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, &SchemaError{"", fmt.Sprintf("not valid JSON: %v", err)}
				}
				k, _ := kt.(string)
				v, err := b.decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				if _, dup := m[k]; !dup {
					keys = append(keys, k)
				}
				m[k] = v
			}
			if _, err := dec.Token(); err != nil {
				return nil, &SchemaError{"", fmt.Sprintf("not valid JSON: %v", err)}
			}
			b.order[reflect.ValueOf(m).Pointer()] = keys
			return m, nil
		case '[':
			list := []any{}
			for dec.More() {
				v, err := b.decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, &SchemaError{"", fmt.Sprintf("not valid JSON: %v", err)}
			}
			return list, nil
		}
	}
	return tok, nil
}

// rule adds a rule.
func (b *jsBuilder) rule(name string) int {
	b.def.names = append(b.def.names, name)
	b.def.bodies = append(b.def.bodies, nil)
	return len(b.def.names) - 1
}

func (b *jsBuilder) fail(path, format string, args ...any) error {
	return &SchemaError{path, fmt.Sprintf(format, args...)}
}

// count bounds the list members the builder handles.
func (b *jsBuilder) count(path string, n int) error {
	b.items += n
	if n > maxSchemaItems || b.items > 16*maxSchemaItems {
		return b.fail(path, "more than %d members in the schema's lists", maxSchemaItems)
	}
	return nil
}

// Keywords by what the builder does with them.
var (
	// annotationKeywords change nothing.
	annotationKeywords = map[string]bool{"title": true, "description": true, "default": true, "examples": true,
		"$schema": true, "$id": true, "$comment": true, "deprecated": true, "readOnly": true, "writeOnly": true,
		"contentMediaType": true, "contentEncoding": true, "$defs": true, "definitions": true, "discriminator": true,
		"$anchor": true, "example": true, "externalDocs": true, "xml": true, "strict": true}
	// refusedKeywords constrain what the grammar cannot.
	refusedKeywords = map[string]string{
		"multipleOf": "multipleOf", "uniqueItems": "uniqueItems", "contains": "contains",
		"minContains": "minContains", "maxContains": "maxContains", "patternProperties": "patternProperties",
		"propertyNames": "propertyNames", "dependentRequired": "dependentRequired",
		"dependentSchemas": "dependentSchemas", "dependencies": "dependencies", "if": "if/then/else",
		"then": "if/then/else", "else": "if/then/else", "not": "not", "$dynamicRef": "$dynamicRef",
		"$recursiveRef": "$recursiveRef", "unevaluatedItems": "unevaluatedItems"}
)

// constraining says whether a keyword (beyond those of its kind) limits values.
func constraining(k string) bool {
	return !annotationKeywords[k] && !strings.HasPrefix(k, "x-")
}

// value is the grammar of the values schema s accepts.
func (b *jsBuilder) value(s any, path string, depth int) (*expr, error) {
	if depth > maxSchemaDepth {
		return nil, b.fail(path, "the schema nests more than %d levels deep", maxSchemaDepth)
	}
	switch v := s.(type) {
	case bool:
		if v {
			return ref(b.anyValue()), nil
		}
		return noneExpr, nil
	case map[string]any:
		return b.object(v, path, depth)
	}
	return nil, b.fail(path, "a schema must be an object or a boolean, got %s", jsonKind(s))
}

// object is the grammar of a schema object.
func (b *jsBuilder) object(m map[string]any, path string, depth int) (*expr, error) {
	for k, v := range m {
		if what, ok := refusedKeywords[k]; ok {
			if k == "uniqueItems" && v == false {
				continue
			}
			if k == "unevaluatedItems" && v == true {
				continue
			}
			return nil, b.fail(path, "keyword %q (%s) is not supported: its constraint cannot be guaranteed", k, what)
		}
	}
	if v, ok := m["unevaluatedProperties"]; ok && v != false && v != true {
		return nil, b.fail(path, "keyword \"unevaluatedProperties\" with a schema is not supported")
	}
	others := func(allowed ...string) []string {
		var out []string
		for k := range m {
			if constraining(k) && !contains(allowed, k) {
				out = append(out, k)
			}
		}
		sort.Strings(out)
		return out
	}
	// nullable (OpenAPI 3.0) adds null.
	if nb, ok := m["nullable"]; ok {
		if nb == true {
			m2 := make(map[string]any, len(m))
			for k, v := range m {
				if k != "nullable" {
					m2[k] = v
				}
			}
			e, err := b.object(m2, path, depth)
			if err != nil {
				return nil, err
			}
			return alt(e, lit("null")), nil
		}
		m2 := make(map[string]any, len(m))
		for k, v := range m {
			if k != "nullable" {
				m2[k] = v
			}
		}
		m = m2
	}
	if r, ok := m["$ref"]; ok {
		if o := others("$ref", "unevaluatedProperties"); len(o) > 0 {
			return nil, b.fail(path, "$ref beside the constraining keywords %q is not supported", o)
		}
		rs, ok := r.(string)
		if !ok {
			return nil, b.fail(path+"/$ref", "$ref must be a string")
		}
		return b.ref(rs, path, depth)
	}
	if subs, ok := m["allOf"]; ok {
		list, ok := subs.([]any)
		if !ok || len(list) == 0 {
			return nil, b.fail(path+"/allOf", "allOf must be a non-empty list")
		}
		if len(list) > 1 {
			return nil, b.fail(path+"/allOf", "allOf with %d schemas is not supported (only one)", len(list))
		}
		if o := others("allOf", "unevaluatedProperties"); len(o) > 0 {
			return nil, b.fail(path, "allOf beside the constraining keywords %q is not supported", o)
		}
		return b.value(list[0], path+"/allOf/0", depth+1)
	}
	for _, key := range []string{"anyOf", "oneOf"} {
		subs, ok := m[key]
		if !ok {
			continue
		}
		if o := others(key, "unevaluatedProperties"); len(o) > 0 {
			return nil, b.fail(path, "%s beside the constraining keywords %q is not supported", key, o)
		}
		list, ok := subs.([]any)
		if !ok || len(list) == 0 {
			return nil, b.fail(path+"/"+key, "%s must be a non-empty list", key)
		}
		if err := b.count(path+"/"+key, len(list)); err != nil {
			return nil, err
		}
		// oneOf is read as anyOf: a value the branches share satisfies it only once
		// they are made exclusive, which the schema's author does.
		parts := make([]*expr, len(list))
		for i, sub := range list {
			e, err := b.value(sub, fmt.Sprintf("%s/%s/%d", path, key, i), depth+1)
			if err != nil {
				return nil, err
			}
			parts[i] = e
		}
		return alt(parts...), nil
	}
	types, err := schemaTypes(m, path)
	if err != nil {
		return nil, err
	}
	if c, ok := m["const"]; ok {
		return b.literals([]any{c}, types, path+"/const", m, "const")
	}
	if en, ok := m["enum"]; ok {
		list, ok := en.([]any)
		if !ok {
			return nil, b.fail(path+"/enum", "enum must be a list")
		}
		if err := b.count(path+"/enum", len(list)); err != nil {
			return nil, err
		}
		return b.literals(list, types, path+"/enum", m, "enum")
	}
	if types == nil {
		types = inferTypes(m)
	}
	parts := make([]*expr, 0, len(types))
	for _, t := range types {
		var e *expr
		var err error
		switch t {
		case "string":
			e, err = b.str(m, path)
		case "integer":
			e, err = b.number(m, path, true)
		case "number":
			e, err = b.number(m, path, false)
		case "boolean":
			e = alt(lit("true"), lit("false"))
		case "null":
			e = lit("null")
		case "object":
			e, err = b.obj(m, path, depth)
		case "array":
			e, err = b.array(m, path, depth)
		}
		if err != nil {
			return nil, err
		}
		parts = append(parts, e)
	}
	return alt(parts...), nil
}

// contains says whether list holds s.
func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// allTypes are the JSON Schema types, in the order their grammars are tried.
var allTypes = []string{"object", "array", "string", "number", "boolean", "null"}

// schemaTypes reads "type": nil when absent.
func schemaTypes(m map[string]any, path string) ([]string, error) {
	t, ok := m["type"]
	if !ok {
		return nil, nil
	}
	var list []any
	switch v := t.(type) {
	case string:
		list = []any{v}
	case []any:
		list = v
	default:
		return nil, &SchemaError{path + "/type", "type must be a string or a list of strings"}
	}
	var out []string
	hasNumber := false
	for _, x := range list {
		s, ok := x.(string)
		if !ok {
			return nil, &SchemaError{path + "/type", "type must be a string or a list of strings"}
		}
		switch s {
		case "string", "integer", "number", "boolean", "null", "object", "array":
		default:
			return nil, &SchemaError{path + "/type", fmt.Sprintf("unknown type %q", s)}
		}
		if !contains(out, s) {
			out = append(out, s)
		}
		hasNumber = hasNumber || s == "number"
	}
	if hasNumber {
		// integer ⊂ number.
		var kept []string
		for _, s := range out {
			if s != "integer" {
				kept = append(kept, s)
			}
		}
		out = kept
	}
	if len(out) == 0 {
		return nil, &SchemaError{path + "/type", "type lists no type"}
	}
	return out, nil
}

// inferTypes are the types a schema without "type" is written as: those its keywords
// describe, or every type.
func inferTypes(m map[string]any) []string {
	var out []string
	has := func(keys ...string) bool {
		for _, k := range keys {
			if _, ok := m[k]; ok {
				return true
			}
		}
		return false
	}
	if has("properties", "required", "additionalProperties", "minProperties", "maxProperties") {
		out = append(out, "object")
	}
	if has("items", "prefixItems", "minItems", "maxItems", "additionalItems") {
		out = append(out, "array")
	}
	if has("minLength", "maxLength", "pattern", "format") {
		out = append(out, "string")
	}
	if has("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") {
		out = append(out, "number")
	}
	if len(out) == 0 {
		return allTypes
	}
	return out
}

// ref is the grammar of a $ref: a rule per target, so that recursion stays recursion.
func (b *jsBuilder) ref(r, path string, depth int) (*expr, error) {
	if !strings.HasPrefix(r, "#") {
		return nil, b.fail(path+"/$ref", "$ref %q is not local (only \"#…\" references are supported)", r)
	}
	if i, ok := b.refs[r]; ok {
		return ref(i), nil
	}
	target, err := b.resolve(r, path)
	if err != nil {
		return nil, err
	}
	i := b.rule(r)
	b.refs[r] = i
	e, err := b.value(target, r[1:], depth+1)
	if err != nil {
		return nil, err
	}
	b.def.bodies[i] = e
	return ref(i), nil
}

// resolve follows a local JSON pointer.
func (b *jsBuilder) resolve(r, path string) (any, error) {
	ptr := r[1:]
	if ptr == "" {
		return b.doc, nil
	}
	if !strings.HasPrefix(ptr, "/") {
		return nil, b.fail(path+"/$ref", "$ref %q: anchors are not supported, only JSON pointers (#/…)", r)
	}
	cur := b.doc
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return nil, b.fail(path+"/$ref", "$ref %q: %q not found", r, tok)
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return nil, b.fail(path+"/$ref", "$ref %q: index %q out of range", r, tok)
			}
			cur = v[i]
		default:
			return nil, b.fail(path+"/$ref", "$ref %q: %q is inside a %s", r, tok, jsonKind(cur))
		}
	}
	return cur, nil
}

// jsonKind names a decoded JSON value's type.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "value"
}

// compactJSON writes a value compactly, keys sorted, without HTML escapes.
func compactJSON(v any) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

// literals is the grammar of enum or const values, those of the schema's types.
func (b *jsBuilder) literals(vals []any, types []string, path string, m map[string]any, key string) (*expr, error) {
	for k := range m {
		switch k {
		case "type", "enum", "const", "unevaluatedProperties":
		default:
			if constraining(k) {
				return nil, b.fail(path, "%s beside the constraining keyword %q is not supported", key, k)
			}
		}
	}
	var parts []*expr
	for _, v := range vals {
		if types != nil {
			k := jsonKind(v)
			ok := contains(types, k)
			if k == "number" && contains(types, "integer") {
				if n, isNum := v.(json.Number); isNum {
					if f, _, err := big.ParseFloat(string(n), 10, 256, big.ToNearestEven); err == nil && f.IsInt() {
						ok = true
					}
				}
			}
			if !ok {
				continue
			}
		}
		s, err := compactJSON(v)
		if err != nil {
			return nil, b.fail(path, "%v", err)
		}
		parts = append(parts, lit(s))
	}
	return alt(parts...), nil
}

// str is the grammar of the strings a schema accepts.
func (b *jsBuilder) str(m map[string]any, path string) (*expr, error) {
	minL, err := intKeyword(m, "minLength", path, 0)
	if err != nil {
		return nil, err
	}
	maxL, err := intKeyword(m, "maxLength", path, -1)
	if err != nil {
		return nil, err
	}
	if maxL >= 0 && maxL < minL {
		return noneExpr, nil
	}
	_, hasLen := m["minLength"]
	if _, ok := m["maxLength"]; ok {
		hasLen = true
	}
	quote := lit(`"`)
	if p, ok := m["pattern"]; ok {
		ps, ok := p.(string)
		if !ok {
			return nil, b.fail(path+"/pattern", "pattern must be a string")
		}
		if hasLen {
			return nil, b.fail(path, "pattern with minLength or maxLength is not supported")
		}
		if _, ok := m["format"]; ok {
			return nil, b.fail(path, "pattern with format is not supported")
		}
		body, err := patternExpr(ps)
		if err != nil {
			return nil, b.fail(path+"/pattern", "%v", err)
		}
		return seq(quote, body, quote), nil
	}
	if f, ok := m["format"]; ok {
		fs, _ := f.(string)
		if re, known := formats[fs]; known {
			if hasLen {
				return nil, b.fail(path, "format %q with minLength or maxLength is not supported", fs)
			}
			n, err := parseRegex(re)
			if err != nil {
				return nil, fmt.Errorf("format %q: %w", fs, err)
			}
			return seq(quote, n.lower(jsonChars), quote), nil
		}
		// Other formats are annotations (JSON Schema's default): any string.
	}
	if maxL > 4096 {
		return nil, b.fail(path+"/maxLength", "maxLength %d is over 4096, the most a grammar counts", maxL)
	}
	return seq(quote, repeat(jsonChars(anyChar), minL, maxL), quote), nil
}

// formats are the string formats whose texts the grammar writes: a regular subset of
// each (RFC 3339 dates and times without leap seconds, no February 29, no year 0).
var formats = map[string]string{
	"date":      dateRe,
	"time":      timeRe,
	"date-time": dateRe + "T" + timeRe,
	"uuid":      `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`,
	"email":     `[a-zA-Z0-9_%+-]+(\.[a-zA-Z0-9_%+-]+)*@[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*\.[a-zA-Z]{2,}`,
	"ipv4":      `((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])`,
}

const (
	dateRe = `(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))`
	timeRe = `([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])`
)

// patternExpr is the grammar of a JSON string's contents matching an ECMAScript
// pattern: a search, unless anchored with ^ and $.
func patternExpr(p string) (*expr, error) {
	startAnchored := strings.HasPrefix(p, "^")
	endAnchored := strings.HasSuffix(p, "$") && !strings.HasSuffix(p, `\$`)
	n, err := parseRegex(p)
	if err != nil {
		return nil, err
	}
	body := n.lower(jsonChars)
	anyText := repeat(jsonChars(anyChar), 0, -1)
	if !startAnchored {
		body = seq(anyText, body)
	}
	if !endAnchored {
		body = seq(body, anyText)
	}
	return body, nil
}

// jsonChars is one character of rs as a JSON string writes it: itself, or its escape
// for " \ and the control characters.
func jsonChars(rs []runeRange) *expr {
	rs = normRanges(rs)
	if len(rs) == 2 && rs[0] == anyChar[0] && rs[1] == anyChar[1] {
		return anyJSONChar
	}
	var plain []runeRange
	var esc []*expr
	for _, r := range normRanges(rs) {
		for lo := r.lo; lo <= r.hi; {
			switch {
			case lo < 0x20:
				hi := min(r.hi, 0x1F)
				for c := lo; c <= hi; c++ {
					esc = append(esc, lit(escapeControl(c)))
				}
				lo = hi + 1
			case lo == '"' || lo == '\\':
				esc = append(esc, lit(`\`+string(lo)))
				lo++
			default:
				hi := r.hi
				if lo < '"' && hi >= '"' {
					hi = '"' - 1
				} else if lo < '\\' && hi >= '\\' {
					hi = '\\' - 1
				}
				plain = append(plain, runeRange{lo, hi})
				lo = hi + 1
			}
		}
	}
	return alt(append([]*expr{charClass(plain)}, esc...)...)
}

// anyJSONChar is any character of a JSON string: a plain one, or any escape (\u
// escapes of the surrogates excepted, so that a character is one code point).
var anyJSONChar = alt(
	charClass([]runeRange{{0x20, '"' - 1}, {'"' + 1, '\\' - 1}, {'\\' + 1, 0x10FFFF}}),
	seq(lit(`\`), alt(charClass([]runeRange{{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'}, {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
		seq(lit("u"), alt(
			seq(charClass([]runeRange{{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}), repeat(hexDigit, 3, 3)),
			seq(charClass([]runeRange{{'d', 'd'}, {'D', 'D'}}), charClass([]runeRange{{'0', '7'}}), repeat(hexDigit, 2, 2)))))))

// hexDigit is one hexadecimal digit.
var hexDigit = charClass([]runeRange{{'0', '9'}, {'a', 'f'}, {'A', 'F'}})

// escapeControl is a control character's JSON escape.
func escapeControl(c rune) string {
	switch c {
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	case '\n':
		return `\n`
	case '\r':
		return `\r`
	case '\t':
		return `\t`
	}
	return fmt.Sprintf(`\u%04x`, c)
}

// intKeyword reads a non-negative integer keyword, def when absent.
func intKeyword(m map[string]any, k, path string, def int) (int, error) {
	v, ok := m[k]
	if !ok {
		return def, nil
	}
	n, isNum := v.(json.Number)
	if !isNum {
		return 0, &SchemaError{path + "/" + k, k + " must be a number"}
	}
	f, _, err := big.ParseFloat(string(n), 10, 256, big.ToNearestEven)
	if err != nil || f.Sign() < 0 || !f.IsInt() {
		return 0, &SchemaError{path + "/" + k, k + " must be a non-negative integer"}
	}
	if f.Cmp(big.NewFloat(1e9)) > 0 {
		return 0, &SchemaError{path + "/" + k, fmt.Sprintf("%s %s is too large", k, n)}
	}
	i, _ := f.Int64()
	return int(i), nil
}

// bound is one end of a numeric range: a whole value, and whether it is excluded.
type bound struct {
	v    *big.Int
	excl bool
}

// rawBound is an end as written.
type rawBound struct {
	v    *big.Float
	excl bool
}

// readBounds reads minimum, maximum and the exclusive ones: the tightest lower and
// upper ends (nil: none).
func readBounds(m map[string]any, path string) (lo, hi *rawBound, err error) {
	read := func(k string) (*big.Float, error) {
		v, ok := m[k]
		if !ok {
			return nil, nil
		}
		if bv, isBool := v.(bool); isBool {
			if bv {
				return nil, &SchemaError{path + "/" + k, "boolean exclusive bounds (draft 4) are not supported; give the bound as a number"}
			}
			return nil, nil
		}
		n, isNum := v.(json.Number)
		if !isNum {
			return nil, &SchemaError{path + "/" + k, k + " must be a number"}
		}
		f, _, err := big.ParseFloat(string(n), 10, 256, big.ToNearestEven)
		if err != nil || f.IsInf() || f.MantExp(nil) > 256 {
			return nil, &SchemaError{path + "/" + k, fmt.Sprintf("%s %s is not a number of at most 77 digits", k, n)}
		}
		return f, nil
	}
	pick := func(incl, excl string, upper bool) (*rawBound, error) {
		var best *rawBound
		for i, k := range []string{incl, excl} {
			f, err := read(k)
			if err != nil {
				return nil, err
			}
			if f == nil {
				continue
			}
			c := &rawBound{f, i == 1}
			if best == nil {
				best = c
				continue
			}
			d := c.v.Cmp(best.v)
			if upper {
				d = -d
			}
			if d > 0 || d == 0 && c.excl {
				best = c
			}
		}
		return best, nil
	}
	if lo, err = pick("minimum", "exclusiveMinimum", false); err != nil {
		return nil, nil, err
	}
	hi, err = pick("maximum", "exclusiveMaximum", true)
	return lo, hi, err
}

// intBound is the integer end of an integer range: the first integer a lower end
// admits (the last an upper end admits).
func intBound(r *rawBound, upper bool) *big.Int {
	if r == nil {
		return nil
	}
	z, acc := r.v.Int(nil) // truncated toward zero
	whole := acc == big.Exact
	switch {
	case !upper && (whole && r.excl || !whole && r.v.Sign() > 0):
		z.Add(z, bigOne)
	case upper && (whole && r.excl || !whole && r.v.Sign() < 0):
		z.Sub(z, bigOne)
	}
	return z
}

// number is the grammar of the numbers (integers) a schema accepts.
func (b *jsBuilder) number(m map[string]any, path string, integer bool) (*expr, error) {
	lo, hi, err := readBounds(m, path)
	if err != nil {
		return nil, err
	}
	if integer {
		l, h := intBound(lo, false), intBound(hi, true)
		if l != nil && h != nil && l.Cmp(h) > 0 {
			return noneExpr, nil
		}
		return intRange(l, h), nil
	}
	if lo == nil && hi == nil {
		return seq(opt(lit("-")), uintText(), opt(seq(lit("."), digits(1, -1))),
			opt(seq(charClass([]runeRange{{'e', 'e'}, {'E', 'E'}}), opt(charClass([]runeRange{{'+', '+'}, {'-', '-'}})), digits(1, -1)))), nil
	}
	whole := func(r *rawBound, k string) (*bound, error) {
		if r == nil {
			return nil, nil
		}
		if !r.v.IsInt() {
			return nil, b.fail(path, "%s %s is not a whole number: bounds of numbers must be whole (integers take any)", k, r.v.Text('g', 20))
		}
		z, _ := r.v.Int(nil)
		return &bound{z, r.excl}, nil
	}
	l, err := whole(lo, "the lower bound")
	if err != nil {
		return nil, err
	}
	h, err := whole(hi, "the upper bound")
	if err != nil {
		return nil, err
	}
	return decimalRange(l, h), nil
}

// digits is n..m decimal digits.
func digits(n, m int) *expr { return repeat(byteRange('0', '9'), n, m) }

// uintText is a natural number without leading zeros.
func uintText() *expr { return alt(lit("0"), seq(byteRange('1', '9'), digits(0, -1))) }

var bigOne = big.NewInt(1)

// intRange is the decimal integers in [lo, hi] (nil: unbounded).
func intRange(lo, hi *big.Int) *expr {
	var parts []*expr
	zero := new(big.Int)
	// Non-negative: [max(lo, 0), hi].
	if hi == nil || hi.Sign() >= 0 {
		a := zero
		if lo != nil && lo.Sign() > 0 {
			a = lo
		}
		parts = append(parts, uintRange(a, hi))
	}
	// Negative: -[max(-hi, 1), -lo].
	if lo == nil || lo.Sign() < 0 {
		a := bigOne
		if hi != nil && hi.Sign() < 0 {
			a = new(big.Int).Neg(hi)
		}
		var b *big.Int
		if lo != nil {
			b = new(big.Int).Neg(lo)
		}
		parts = append(parts, seq(lit("-"), uintRange(a, b)))
	}
	return alt(parts...)
}

// uintRange is the decimal naturals in [a, b] without leading zeros (b nil: no end).
func uintRange(a, b *big.Int) *expr {
	if b != nil && a.Cmp(b) > 0 {
		return noneExpr
	}
	as := a.String()
	var parts []*expr
	for l := len(as); ; l++ {
		lo := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(l-1)), nil)
		if l == 1 {
			lo.SetInt64(0)
		}
		top := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(l)), nil)
		top.Sub(top, bigOne)
		if lo.Cmp(a) < 0 {
			lo = a
		}
		if b == nil && l > len(as)+1 {
			// Every longer number: [1-9][0-9]{l-1,}.
			parts = append(parts, seq(byteRange('1', '9'), digits(l-1, -1)))
			break
		}
		hiL := top
		if b != nil && b.Cmp(top) < 0 {
			hiL = b
		}
		if lo.Cmp(hiL) <= 0 {
			parts = append(parts, sameLenRange(lo.String(), hiL.String()))
		}
		if b != nil && b.Cmp(top) <= 0 {
			break
		}
	}
	return alt(parts...)
}

// sameLenRange is the digit strings between x and y (same length) in numeric order.
func sameLenRange(x, y string) *expr {
	if x == y {
		return lit(x)
	}
	if len(x) == 1 {
		return byteRange(x[0], y[0])
	}
	if x[0] == y[0] {
		return seq(lit(x[:1]), sameLenRange(x[1:], y[1:]))
	}
	n := len(x) - 1
	nines, zeros := strings.Repeat("9", n), strings.Repeat("0", n)
	parts := []*expr{seq(lit(x[:1]), sameLenRange(x[1:], nines))}
	if y[0]-x[0] > 1 {
		parts = append(parts, seq(byteRange(x[0]+1, y[0]-1), digits(n, n)))
	}
	parts = append(parts, seq(lit(y[:1]), sameLenRange(zeros, y[1:])))
	return alt(parts...)
}

// decimalRange is the decimals (no exponent) in a range with whole ends.
func decimalRange(lo, hi *bound) *expr {
	frac := seq(lit("."), digits(1, -1))
	// zeroFrac is a fraction of zeros (the value unchanged); nonzero one that is not.
	zeroFrac := seq(lit("."), repeat(lit("0"), 1, -1))
	nonzero := seq(lit("."), digits(0, -1), byteRange('1', '9'), digits(0, -1))
	var parts []*expr
	zero := new(big.Int)
	// magnitudes writes the numbers of magnitude in [a, b] (ends whole, a ≥ 0; b nil:
	// none), a excluded when aEx, b when bEx.
	magnitudes := func(a *big.Int, aEx bool, b *big.Int, bEx bool) *expr {
		var ps []*expr
		// Integer part a: a itself (unless excluded) or a plus a fraction.
		if b == nil || a.Cmp(b) < 0 {
			if aEx {
				ps = append(ps, seq(lit(a.String()), nonzero))
			} else {
				ps = append(ps, seq(lit(a.String()), opt(frac)))
			}
			// Integer parts a+1 .. b-1, any fraction.
			a1 := new(big.Int).Add(a, bigOne)
			var b1 *big.Int
			if b != nil {
				b1 = new(big.Int).Sub(b, bigOne)
			}
			if b1 == nil || a1.Cmp(b1) <= 0 {
				ps = append(ps, seq(uintRange(a1, b1), opt(frac)))
			}
			// b itself.
			if b != nil && !bEx {
				ps = append(ps, seq(lit(b.String()), opt(zeroFrac)))
			}
		} else if a.Cmp(b) == 0 && !aEx && !bEx {
			ps = append(ps, seq(lit(a.String()), opt(zeroFrac)))
		}
		return alt(ps...)
	}
	// Non-negative part.
	if hi == nil || hi.v.Sign() > 0 || hi.v.Sign() == 0 && !hi.excl {
		a, aEx := zero, false
		if lo != nil && lo.v.Sign() >= 0 {
			a, aEx = lo.v, lo.excl
		}
		var b *big.Int
		bEx := false
		if hi != nil {
			b, bEx = hi.v, hi.excl
		}
		parts = append(parts, magnitudes(a, aEx, b, bEx))
	}
	// Negative part: magnitude in (max(-hi, 0), -lo], never zero.
	if lo == nil || lo.v.Sign() < 0 {
		a, aEx := zero, true
		if hi != nil && hi.v.Sign() < 0 {
			a, aEx = new(big.Int).Neg(hi.v), hi.excl
		}
		var b *big.Int
		bEx := false
		if lo != nil {
			b, bEx = new(big.Int).Neg(lo.v), lo.excl
		}
		parts = append(parts, seq(lit("-"), magnitudes(a, aEx, b, bEx)))
	}
	return alt(parts...)
}

// obj is the grammar of the objects a schema accepts: its properties in the schema's
// order, the required ones always, then (when allowed) others.
func (b *jsBuilder) obj(m map[string]any, path string, depth int) (*expr, error) {
	props, _ := m["properties"].(map[string]any)
	if _, ok := m["properties"]; ok && props == nil {
		return nil, b.fail(path+"/properties", "properties must be an object")
	}
	order := b.propertyOrder(m)
	required := map[string]bool{}
	if r, ok := m["required"]; ok {
		list, ok := r.([]any)
		if !ok {
			return nil, b.fail(path+"/required", "required must be a list of strings")
		}
		for _, x := range list {
			s, ok := x.(string)
			if !ok {
				return nil, b.fail(path+"/required", "required must be a list of strings")
			}
			if !required[s] {
				required[s] = true
				if _, listed := props[s]; !listed {
					order = append(order, s) // required but unlisted: its schema is additionalProperties'
				}
			}
		}
	}
	if err := b.count(path+"/properties", len(order)); err != nil {
		return nil, err
	}
	// additionalProperties: absent is false unless the options say otherwise.
	var extra any = b.opt.AllowAdditional
	if a, ok := m["additionalProperties"]; ok {
		extra = a
	}
	if u, ok := m["unevaluatedProperties"]; ok && u == false {
		extra = false
	}
	extraAllowed := extra != false
	for _, k := range []string{"minProperties", "maxProperties"} {
		if _, ok := m[k]; !ok {
			continue
		}
		n, err := intKeyword(m, k, path, 0)
		if err != nil {
			return nil, err
		}
		switch {
		case k == "minProperties" && n <= len(required):
		case k == "maxProperties" && !extraAllowed && n >= len(order):
		default:
			return nil, b.fail(path+"/"+k, "%s %d is not supported unless the required and listed properties already satisfy it", k, n)
		}
	}
	ws := b.ws
	type member struct {
		e   *expr
		req bool
	}
	var members []member
	for _, name := range order {
		var sub any = true
		if s, ok := props[name]; ok {
			sub = s
		} else {
			sub = extra
			if sub == nil {
				sub = true
			}
		}
		key, err := compactJSON(name)
		if err != nil {
			return nil, err
		}
		v, err := b.value(sub, path+"/properties/"+escapePointer(name), depth+1)
		if err != nil {
			return nil, err
		}
		if v.kind == exprNone {
			if required[name] {
				return noneExpr, nil
			}
			continue // a property that may not exist
		}
		members = append(members, member{seq(lit(key), ws, lit(":"), ws, v), required[name]})
	}
	var extraMember *expr
	if extraAllowed {
		v, err := b.value(extra, path+"/additionalProperties", depth+1)
		if err != nil {
			return nil, err
		}
		if v.kind != exprNone {
			extraMember = seq(b.jsonString(), ws, lit(":"), ws, v)
		}
	}
	comma := seq(ws, lit(","), ws)
	// after(i) is the members from i on, each after a comma (one was written before).
	after := make([]*expr, len(members)+1)
	after[len(members)] = emptyExpr
	if extraMember != nil {
		after[len(members)] = repeat(seq(comma, extraMember), 0, -1)
	}
	for i := len(members) - 1; i >= 0; i-- {
		e := seq(comma, members[i].e)
		if !members[i].req {
			e = opt(e)
		}
		after[i] = seq(e, after[i+1])
	}
	// The first member written is k: every one before it is optional.
	var firsts []*expr
	allOptional := true
	for k := range members {
		firsts = append(firsts, seq(members[k].e, after[k+1]))
		if members[k].req {
			allOptional = false
			break
		}
	}
	if allOptional && extraMember != nil {
		firsts = append(firsts, seq(extraMember, repeat(seq(comma, extraMember), 0, -1)))
	}
	body := alt(firsts...)
	if allOptional {
		body = opt(body)
	}
	return seq(lit("{"), ws, body, ws, lit("}")), nil
}

// propertyOrder is the listed properties in the schema's order.
func (b *jsBuilder) propertyOrder(m map[string]any) []string {
	props, _ := m["properties"].(map[string]any)
	if len(props) == 0 {
		return nil
	}
	order, ok := b.order[reflect.ValueOf(props).Pointer()]
	if !ok {
		for k := range props {
			order = append(order, k)
		}
		sort.Strings(order)
	}
	return slices.Clone(order)
}

// escapePointer escapes a JSON-pointer token.
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// jsonString is any JSON string.
func (b *jsBuilder) jsonString() *expr {
	return seq(lit(`"`), repeat(jsonChars(anyChar), 0, -1), lit(`"`))
}

// array is the grammar of the arrays a schema accepts.
func (b *jsBuilder) array(m map[string]any, path string, depth int) (*expr, error) {
	var prefix []any
	var rest any = true
	if p, ok := m["prefixItems"]; ok {
		list, ok := p.([]any)
		if !ok {
			return nil, b.fail(path+"/prefixItems", "prefixItems must be a list")
		}
		prefix = list
		if it, ok := m["items"]; ok {
			rest = it
		}
	} else if it, ok := m["items"]; ok {
		if list, isList := it.([]any); isList {
			// Draft 7's tuple form.
			prefix = list
			if ai, ok := m["additionalItems"]; ok {
				rest = ai
			}
		} else {
			rest = it
		}
	}
	if err := b.count(path+"/prefixItems", len(prefix)); err != nil {
		return nil, err
	}
	minI, err := intKeyword(m, "minItems", path, 0)
	if err != nil {
		return nil, err
	}
	maxI, err := intKeyword(m, "maxItems", path, -1)
	if err != nil {
		return nil, err
	}
	if maxI >= 0 && maxI < minI {
		return noneExpr, nil
	}
	if minI > 4096 || maxI > 4096 {
		return nil, b.fail(path, "minItems/maxItems over 4096 are not supported")
	}
	ws := b.ws
	// Each position's element grammar: the prefix's, then rest's (a rule of its own,
	// so that a large item is not copied per position).
	var restE *expr
	if rest != false {
		e, err := b.value(rest, path+"/items", depth+1)
		if err != nil {
			return nil, err
		}
		if e.kind != exprNone {
			i := b.rule(path + "/items")
			b.def.bodies[i] = e
			restE = ref(i)
		}
	}
	var elems []*expr
	for i, p := range prefix {
		e, err := b.value(p, fmt.Sprintf("%s/prefixItems/%d", path, i), depth+1)
		if err != nil {
			return nil, err
		}
		elems = append(elems, e)
	}
	// Positions written explicitly: the prefix (as far as maxItems allows), and up to
	// minItems. A position whose schema is false ends the array before it.
	if maxI >= 0 && len(elems) > maxI {
		elems = elems[:maxI]
	}
	for len(elems) < minI {
		if restE == nil {
			return noneExpr, nil // minItems beyond what may exist
		}
		elems = append(elems, restE)
	}
	closed := false
	for i, e := range elems {
		if e.kind == exprNone {
			if i < minI {
				return noneExpr, nil
			}
			elems, closed = elems[:i], true
			break
		}
	}
	if len(elems) < len(prefix) {
		closed = true // the rest come after the prefix only
	}
	explicit := len(elems)
	comma := seq(ws, lit(","), ws)
	// tail: rest elements past the explicit ones.
	tail := emptyExpr
	if restE != nil && !closed {
		switch {
		case maxI < 0:
			tail = repeat(seq(comma, restE), 0, -1)
		case maxI > explicit:
			tail = repeat(seq(comma, restE), 0, maxI-explicit)
		}
	}
	// build(i): elements i.. with element i present.
	var build func(i int) *expr
	build = func(i int) *expr {
		if i == len(elems)-1 {
			return seq(elems[i], tail)
		}
		next := seq(comma, build(i+1))
		if i+1 >= minI {
			next = opt(next)
		}
		return seq(elems[i], next)
	}
	var body *expr
	switch {
	case len(elems) > 0:
		body = build(0)
		if minI == 0 {
			body = opt(body)
		}
	case restE != nil && maxI != 0 && !closed:
		more := repeat(seq(comma, restE), 0, -1)
		if maxI > 0 {
			more = repeat(seq(comma, restE), 0, maxI-1)
		}
		body = opt(seq(restE, more))
	default:
		body = emptyExpr
	}
	return seq(lit("["), ws, body, ws, lit("]")), nil
}

// anyValue is the rule of any JSON value (made once).
func (b *jsBuilder) anyValue() int {
	if b.anyRule >= 0 {
		return b.anyRule
	}
	v := b.rule("any value")
	b.anyRule = v
	obj, arr := b.anyObjectArray()
	num := seq(opt(lit("-")), uintText(), opt(seq(lit("."), digits(1, -1))),
		opt(seq(charClass([]runeRange{{'e', 'e'}, {'E', 'E'}}), opt(charClass([]runeRange{{'+', '+'}, {'-', '-'}})), digits(1, -1))))
	b.def.bodies[v] = alt(obj, arr, b.jsonString(), num, lit("true"), lit("false"), lit("null"))
	return v
}

// anyObjectArray are any JSON object and any JSON array (over the any-value rule).
func (b *jsBuilder) anyObjectArray() (*expr, *expr) {
	v := ref(b.anyValue())
	ws := b.ws
	comma := seq(ws, lit(","), ws)
	member := seq(b.jsonString(), ws, lit(":"), ws, v)
	obj := seq(lit("{"), ws, opt(seq(member, repeat(seq(comma, member), 0, -1))), ws, lit("}"))
	arr := seq(lit("["), ws, opt(seq(v, repeat(seq(comma, v), 0, -1))), ws, lit("]"))
	return obj, arr
}

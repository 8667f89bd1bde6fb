package guide

import (
	"encoding/json"
	"fmt"
	"math/big"
	"regexp"
	"strings"
	"unicode/utf8"
)

// validate checks a decoded JSON value against the keywords the tests' schemas use
// (an independent check of the compiler: written from the JSON Schema specification,
// not from the grammar).
func validate(root, s, v any) error {
	if b, ok := s.(bool); ok {
		if !b {
			return fmt.Errorf("false schema")
		}
		return nil
	}
	m := s.(map[string]any)
	if r, ok := m["$ref"].(string); ok {
		target := root
		for _, tok := range strings.Split(strings.TrimPrefix(r, "#"), "/")[1:] {
			target = target.(map[string]any)[tok]
		}
		if r == "#" {
			target = root
		}
		return validate(root, target, v)
	}
	if list, ok := m["anyOf"].([]any); ok {
		for _, sub := range list {
			if validate(root, sub, v) == nil {
				return nil
			}
		}
		return fmt.Errorf("no anyOf branch accepts %v", v)
	}
	if c, ok := m["const"]; ok && !jsonEqual(c, v) {
		return fmt.Errorf("%v is not the const %v", v, c)
	}
	if e, ok := m["enum"].([]any); ok {
		found := false
		for _, x := range e {
			found = found || jsonEqual(x, v)
		}
		if !found {
			return fmt.Errorf("%v is not in the enum", v)
		}
	}
	if t, ok := m["type"]; ok {
		types := []any{t}
		if l, ok := t.([]any); ok {
			types = l
		}
		match := false
		for _, x := range types {
			match = match || typeOf(v, x.(string))
		}
		if !match {
			return fmt.Errorf("%v is not of type %v", v, t)
		}
	}
	num := func(k string) (*big.Float, bool) {
		n, ok := m[k].(json.Number)
		if !ok {
			return nil, false
		}
		f, _, _ := big.ParseFloat(string(n), 10, 256, big.ToNearestEven)
		return f, true
	}
	switch x := v.(type) {
	case json.Number:
		f, _, err := big.ParseFloat(string(x), 10, 256, big.ToNearestEven)
		if err != nil {
			return err
		}
		if b, ok := num("minimum"); ok && f.Cmp(b) < 0 {
			return fmt.Errorf("%v < minimum %v", x, b)
		}
		if b, ok := num("maximum"); ok && f.Cmp(b) > 0 {
			return fmt.Errorf("%v > maximum %v", x, b)
		}
		if b, ok := num("exclusiveMinimum"); ok && f.Cmp(b) <= 0 {
			return fmt.Errorf("%v <= exclusiveMinimum %v", x, b)
		}
		if b, ok := num("exclusiveMaximum"); ok && f.Cmp(b) >= 0 {
			return fmt.Errorf("%v >= exclusiveMaximum %v", x, b)
		}
	case string:
		n := utf8.RuneCountInString(x)
		if b, ok := num("minLength"); ok {
			if l, _ := b.Int64(); int64(n) < l {
				return fmt.Errorf("%q shorter than %d", x, l)
			}
		}
		if b, ok := num("maxLength"); ok {
			if l, _ := b.Int64(); int64(n) > l {
				return fmt.Errorf("%q longer than %d", x, l)
			}
		}
		if p, ok := m["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(x) {
			return fmt.Errorf("%q does not match %q", x, p)
		}
	case []any:
		if b, ok := num("minItems"); ok {
			if l, _ := b.Int64(); int64(len(x)) < l {
				return fmt.Errorf("%d items < minItems %d", len(x), l)
			}
		}
		if b, ok := num("maxItems"); ok {
			if l, _ := b.Int64(); int64(len(x)) > l {
				return fmt.Errorf("%d items > maxItems %d", len(x), l)
			}
		}
		prefix, _ := m["prefixItems"].([]any)
		for i, it := range x {
			var sub any = true
			if i < len(prefix) {
				sub = prefix[i]
			} else if s, ok := m["items"]; ok {
				sub = s
			}
			if err := validate(root, sub, it); err != nil {
				return fmt.Errorf("item %d: %w", i, err)
			}
		}
	case map[string]any:
		props, _ := m["properties"].(map[string]any)
		if req, ok := m["required"].([]any); ok {
			for _, r := range req {
				if _, ok := x[r.(string)]; !ok {
					return fmt.Errorf("missing required %q", r)
				}
			}
		}
		for k, val := range x {
			sub, ok := props[k]
			if !ok {
				ap, has := m["additionalProperties"]
				if !has {
					ap = true
				}
				sub = ap
			}
			if err := validate(root, sub, val); err != nil {
				return fmt.Errorf("property %q: %w", k, err)
			}
		}
	}
	return nil
}

// typeOf says whether v has the JSON Schema type t.
func typeOf(v any, t string) bool {
	switch x := v.(type) {
	case nil:
		return t == "null"
	case bool:
		return t == "boolean"
	case json.Number:
		if t == "number" {
			return true
		}
		f, _, _ := big.ParseFloat(string(x), 10, 256, big.ToNearestEven)
		return t == "integer" && f.IsInt()
	case string:
		return t == "string"
	case []any:
		return t == "array"
	case map[string]any:
		return t == "object"
	}
	return false
}

// jsonEqual compares decoded JSON values (numbers by value).
func jsonEqual(a, b any) bool {
	an, aok := a.(json.Number)
	bn, bok := b.(json.Number)
	if aok && bok {
		x, _, _ := big.ParseFloat(string(an), 10, 256, big.ToNearestEven)
		y, _, _ := big.ParseFloat(string(bn), 10, 256, big.ToNearestEven)
		return x.Cmp(y) == 0
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

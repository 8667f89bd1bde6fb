package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Structured outputs: response_format json_object and json_schema become the backend's
// guided decoding (guided_decoding_guide_type and guided_decoding_guide), which
// constrains every token the model samples (guide/README.md).

// ResponseFormat is chat's response_format.
type ResponseFormat struct {
	// Type is "text", "json_object" or "json_schema".
	Type string `json:"type"`
	// JSONSchema is json_schema's schema and its name.
	JSONSchema *JSONSchemaFormat `json:"json_schema"`
}

// JSONSchemaFormat is response_format's json_schema.
type JSONSchemaFormat struct {
	// Name names the schema (OpenAI requires one: letters, digits, _ and -, ≤ 64).
	Name string `json:"name"`
	// Description is free text (unused).
	Description string `json:"description"`
	// Schema is the JSON schema.
	Schema json.RawMessage `json:"schema"`
	// Strict asks for OpenAI's strict mode: the schema must then follow its rules (every
	// object lists all its properties as required and sets additionalProperties false).
	Strict *bool `json:"strict"`
}

// schemaName is OpenAI's rule for a schema's (and a function's) name.
var schemaName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// guide is the response format's guided-decoding type and text; "" for plain text.
func (rf *ResponseFormat) guide() (kind, text string, api *APIError) {
	if rf == nil {
		return "", "", nil
	}
	switch rf.Type {
	case "", "text":
		return "", "", nil
	case "json_object":
		return "json_object", "", nil
	case "json_schema":
		js := rf.JSONSchema
		if js == nil {
			return "", "", invalid("response_format", "response_format json_schema needs \"json_schema\": {\"name\": …, \"schema\": …}")
		}
		if !schemaName.MatchString(js.Name) {
			return "", "", invalid("response_format.json_schema.name", "json_schema.name %q must be 1 to 64 letters, digits, _ or -", js.Name)
		}
		schema := bytes.TrimSpace(js.Schema)
		if len(schema) == 0 || schema[0] != '{' {
			return "", "", invalid("response_format.json_schema.schema", "json_schema.schema must be a JSON object")
		}
		if js.Strict != nil && *js.Strict {
			if err := checkStrict(schema); err != nil {
				return "", "", invalid("response_format.json_schema.schema", "Invalid schema for response_format '%s': %v", js.Name, err)
			}
		}
		return "json_schema", string(schema), nil
	}
	return "", "", invalid("response_format.type", "response_format type %q is not one of text, json_object, json_schema", rf.Type)
}

// checkStrict checks OpenAI's strict-mode rules: every object schema with properties
// sets additionalProperties false and requires every property.
func checkStrict(schema []byte) error {
	var doc any
	if err := json.Unmarshal(schema, &doc); err != nil {
		return fmt.Errorf("not valid JSON: %v", err)
	}
	var walk func(v any, path []string) error
	walk = func(v any, path []string) error {
		switch x := v.(type) {
		case map[string]any:
			if props, ok := x["properties"].(map[string]any); ok {
				ctx := "(" + strings.Join(path, ", ") + ")"
				if x["additionalProperties"] != false {
					return fmt.Errorf("in context=%s, 'additionalProperties' is required to be supplied and to be false", ctx)
				}
				req := map[string]bool{}
				if list, ok := x["required"].([]any); ok {
					for _, r := range list {
						if s, ok := r.(string); ok {
							req[s] = true
						}
					}
				}
				names := make([]string, 0, len(props))
				for k := range props {
					names = append(names, k)
				}
				sort.Strings(names)
				for _, k := range names {
					if !req[k] {
						return fmt.Errorf("in context=%s, 'required' is required to be supplied and to be an array including every key in properties; missing '%s'", ctx, k)
					}
				}
			}
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if err := walk(x[k], append(path, "'"+k+"'")); err != nil {
					return err
				}
			}
		case []any:
			for i, e := range x {
				if err := walk(e, append(path, fmt.Sprint(i))); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(doc, nil)
}

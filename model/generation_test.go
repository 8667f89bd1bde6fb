package model

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseGeneration(t *testing.T) {
	const vocab = 1000
	for _, tc := range []struct {
		name, file string
		want       Generation
	}{
		{"one end token", `{"eos_token_id": 2}`, Generation{EOSIDs: []int32{2}}},
		{"a list of end tokens", `{"eos_token_id": [128001, 8, 9]}`, Generation{EOSIDs: []int32{128001, 8, 9}}},
		{"a null end token is none", `{"eos_token_id": null, "bos_token_id": 1}`, Generation{}},
		{"no fields gives no defaults", `{"transformers_version": "5.23.0"}`, Generation{}},
		{"sampling defaults are read", `{"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.05}`,
			Generation{Sample: true, Temperature: 0.6, TopK: 20, TopP: 0.9, RepetitionPenalty: 1.05}},
		{"sampling defaults without do_sample are kept but not sampled", `{"temperature": 0.7, "top_p": 0.8}`,
			Generation{Temperature: 0.7, TopP: 0.8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := vocab
			if len(tc.want.EOSIDs) > 0 && tc.want.EOSIDs[0] >= vocab {
				v = 128256 // Llama 3's vocabulary
			}
			got, err := parseGeneration([]byte(tc.file), v)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"an end token beyond the vocabulary", `{"eos_token_id": [2, 1000]}`, []string{"field eos_token_id", "1000", "vocabulary size 1000"}},
		{"a negative end token", `{"eos_token_id": -1}`, []string{"field eos_token_id", "non-negative"}},
		{"an end token list with a negative id", `{"eos_token_id": [2, -3]}`, []string{"field eos_token_id", "[2, -3]"}},
		{"an end token that is a string", `{"eos_token_id": "</s>"}`, []string{"field eos_token_id", `"</s>"`}},
		{"a negative temperature", `{"temperature": -0.5}`, []string{"field temperature", "negative"}},
		{"a top_p above 1", `{"top_p": 1.5}`, []string{"field top_p", "outside [0, 1]"}},
		{"a negative top_k", `{"top_k": -1}`, []string{"field top_k", "non-negative"}},
		{"a negative repetition penalty", `{"repetition_penalty": -1}`, []string{"field repetition_penalty", "negative"}},
		{"do_sample that is not a boolean", `{"do_sample": "yes"}`, []string{"field do_sample", "true or false"}},
		{"a file that is not JSON", `{"eos_token_id": 2,`, []string{"invalid JSON"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseGeneration([]byte(tc.file), vocab)
			if err == nil {
				t.Fatal("parsed without error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadGeneration(t *testing.T) {
	t.Run("a folder without the file gives no defaults", func(t *testing.T) {
		g, err := LoadGeneration(t.TempDir(), 1000)
		if err != nil || !reflect.DeepEqual(g, Generation{}) {
			t.Errorf("got %+v, %v; want no defaults and no error", g, err)
		}
	})
	t.Run("llama3-tiny's two end tokens are read", func(t *testing.T) {
		g, err := LoadGeneration("../testdata/llama3-tiny", 1000)
		if err != nil || !reflect.DeepEqual(g.EOSIDs, []int32{2, 3}) {
			t.Errorf("got %+v, %v; want end tokens [2 3]", g, err)
		}
	})
	t.Run("a bad file is named with its field", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "generation_config.json")
		for file, want := range map[string]string{`{"top_p": 2}`: "field top_p", `not json`: "invalid JSON"} {
			if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadGeneration(dir, 1000)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: err = %v, want one naming %s and %q", file, err, path, want)
			}
		}
	})
	t.Run("an unreadable file fails", func(t *testing.T) {
		dir := t.TempDir()
		// A folder where the file should be cannot be read as one.
		if err := os.Mkdir(filepath.Join(dir, "generation_config.json"), 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadGeneration(dir, 1000); err == nil || !strings.Contains(err.Error(), "generation_config.json") {
			t.Errorf("err = %v, want one naming generation_config.json", err)
		}
	})
}

package tests

// The demo model (model_repository/austen, issue 19) served as make serve serves it: its
// greedy completions through tritonserver must be transformers' own, which train.py
// recorded in demo/austen/train.log when it trained the checkpoint.

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"gollm/tests/harness"
)

func TestDemoModelWritesTransformersGreedyText(t *testing.T) {
	root, err := harness.Root()
	if err != nil {
		t.Fatal(err)
	}
	want, err := greedyFromTrainLog(root + "/demo/austen/train.log")
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatal("train.log holds no greedy samples")
	}
	s := harness.Start(t, harness.Options{Models: []harness.Model{{Name: "austen", Checkpoint: "model_repository/austen/1"}}})
	for prompt, text := range want {
		ctx := testContext(t, time.Minute)
		// train.py generated 40 new tokens or up to the end token.
		body, err := postJSON(ctx, s.HTTP(), s.HTTPURL()+"/v2/models/austen/generate",
			map[string]any{"text_input": prompt, "max_tokens": 40, "temperature": 0})
		if err != nil {
			t.Fatal(err)
		}
		g, err := decodeGenerate(body)
		if err != nil {
			t.Fatal(err)
		}
		if g.TextOutput == nil || *g.TextOutput != text {
			t.Errorf("%q: text_output %v, transformers' greedy %q", prompt, g.TextOutput, text)
		}
	}
}

// greedyFromTrainLog reads train.log's lines `greedy  'prompt' -> 'text'` (Python reprs).
func greedyFromTrainLog(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "greedy  ")
		if !ok {
			continue
		}
		prompt, rest, err := pyRepr(rest)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, sc.Text(), err)
		}
		rest, ok = strings.CutPrefix(rest, " -> ")
		if !ok {
			return nil, fmt.Errorf("%s: %q: no ' -> '", path, sc.Text())
		}
		text, _, err := pyRepr(rest)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, sc.Text(), err)
		}
		out[prompt] = text
	}
	return out, sc.Err()
}

// pyRepr reads one Python string repr of printable text at the start of s and returns
// the string and what follows it.
func pyRepr(s string) (string, string, error) {
	if s == "" || (s[0] != '\'' && s[0] != '"') {
		return "", "", fmt.Errorf("no quoted string at %q", s)
	}
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == q:
			return b.String(), s[i+1:], nil
		case c == '\\' && i+1 < len(s):
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case '\\', '\'', '"':
				b.WriteByte(s[i])
			default:
				return "", "", fmt.Errorf("escape \\%c not handled", s[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("unterminated string %q", s)
}

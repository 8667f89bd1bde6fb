package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCompareStreamsAcceptsOnlyNearTies(t *testing.T) {
	want := [][]int32{{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}, {5, 6, 7, 8}}
	got := [][]int32{
		{1, 2, 3, 4}, // equal
		{1, 2, 9, 9}, // parts at step 2, a near-tie there
		{1, 9, 9, 9}, // parts at step 1, a wide gap there
		{1, 2, 3},    // a stream that ended early
		{5, 6, 7, 9}, // parts at step 3: the gaps file has no row for this prompt
	}
	ties := &nearTies{Tol: 0.01, Gaps: [][]float64{
		{1, 1, 1, 1},
		{1, 1, 0.005, 1},
		{1, 0.5, 0.001, 1},
		{0.001, 0.001, 0.001, 0.001},
	}}
	equal, accepted, differ := compareStreams(got, want, ties)
	if equal != 1 {
		t.Errorf("equal = %d, want 1", equal)
	}
	if len(accepted) != 1 || !strings.HasPrefix(accepted[0], "prompt 1 parts at step 2") {
		t.Errorf("accepted = %q, want prompt 1 at step 2 only", accepted)
	}
	if len(differ) != 3 {
		t.Fatalf("differ = %q, want prompts 2, 3 and 4", differ)
	}
	for i, p := range []string{"prompt 2 parts at step 1", "prompt 3 parts at step 3", "prompt 4 parts at step 3"} {
		if !strings.HasPrefix(differ[i], p) {
			t.Errorf("differ[%d] = %q, want it to start %q", i, differ[i], p)
		}
	}
	if !strings.Contains(differ[0], "not a near-tie") || !strings.Contains(differ[1], "3 tokens streamed, 4 expected") {
		t.Errorf("differ says why badly: %q", differ)
	}

	// Without a gaps file every difference fails, as before -gaps.
	equal, accepted, differ = compareStreams(got, want, nil)
	if equal != 1 || len(accepted) != 0 || len(differ) != 4 {
		t.Errorf("without gaps: %d equal, %d accepted, %d differ; want 1, 0, 4", equal, len(accepted), len(differ))
	}
}

func TestReadNearTiesRejectsBadFiles(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"good.json":    `{"tol_gap": 0.06, "gaps": [[0.1, 0.2]]}`,
		"notjson.json": `{"tol_gap": 0.06, "gaps": [[0.1`,
		"zerotol.json": `{"tol_gap": 0, "gaps": [[0.1]]}`,
		"nogaps.json":  `{"tol_gap": 0.06, "gaps": []}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if ties, err := readNearTies(filepath.Join(dir, "good.json")); err != nil || ties.Tol != 0.06 || len(ties.Gaps) != 1 {
		t.Errorf("good file: %+v, %v", ties, err)
	}
	for _, name := range []string{"notjson.json", "zerotol.json", "nogaps.json", "missing.json"} {
		if _, err := readNearTies(filepath.Join(dir, name)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

package model

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// eagleFixture is the EAGLE-3 head fixture in the published format (llama-tiny's).
const eagleFixture = "../testdata/eagle3-tiny"

// TestLoadEagle3ReadsThePublishedFormat: the fixture loads with its sizes, its token
// mapping inside the target's vocabulary and its explicit hidden-state layers; the
// default layers of a 32-layer target are 1, 15 and 28 (the inputs of layers 2, 16 and
// 29, where the EAGLE-3 release for Llama 3.1 8B reads them).
func TestLoadEagle3ReadsThePublishedFormat(t *testing.T) {
	ok, err := IsEagle3(eagleFixture)
	if err != nil || !ok {
		t.Fatalf("IsEagle3 = %v, %v", ok, err)
	}
	if ok, _ := IsEagle3("../testdata/llama-tiny"); ok {
		t.Fatal("a LLaMA checkpoint taken for an EAGLE-3 head")
	}
	h, err := LoadEagle3(eagleFixture)
	if err != nil {
		t.Fatal(err)
	}
	c := h.Config
	if c.Hidden != 64 || c.Heads != 4 || c.KVHeads != 2 || c.HeadDim != 16 || c.Inner != 128 || c.VocabSize != 1000 ||
		c.DraftVocab != 256 || c.TargetHidden != 64 || c.Rope.Theta != 10000 || len(h.FC) != 64*192 || len(h.LMHead) != 256*64 || h.Embed != nil {
		t.Fatalf("config %+v, fc %d, head %d", c, len(h.FC), len(h.LMHead))
	}
	prev := -1
	for d, off := range h.D2T {
		tok := d + int(off)
		if tok <= prev || tok >= 1000 {
			t.Fatalf("draft token %d maps to %d after %d", d, tok, prev)
		}
		prev = tok
	}
	if got, err := h.AuxLayersFor(2); err != nil || !slices.Equal(got, []int{0, 1, 1}) {
		t.Fatalf("layers for the fixture's target: %v, %v", got, err)
	}
	h.Config.AuxLayers = nil
	if got, err := h.AuxLayersFor(32); err != nil || !slices.Equal(got, []int{1, 15, 28}) {
		t.Fatalf("default layers of a 32-layer target: %v, %v", got, err)
	}
	if _, err := h.AuxLayersFor(2); err == nil {
		t.Fatal("the default layers of a 2-layer target were accepted")
	}
}

// TestLoadEagle3RefusesWhatDoesNotFit: a missing tensor, a wrong shape, a mapping
// outside the vocabulary and a head of two layers are refused naming them.
func TestLoadEagle3RefusesWhatDoesNotFit(t *testing.T) {
	cfg, err := os.ReadFile(filepath.Join(eagleFixture, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := openSafetensors(filepath.Join(eagleFixture, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.close()
	write := func(t *testing.T, config string, edit func(ts map[string]*Tensor)) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		ts := map[string]*Tensor{}
		for n, x := range ck.tensors {
			c := *x
			c.Data = slices.Clone(x.Data)
			ts[n] = &c
		}
		edit(ts)
		var list []*Tensor
		for _, x := range ts {
			list = append(list, x)
		}
		if err := WriteSafetensors(filepath.Join(dir, "model.safetensors"), list, nil); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, c := range []struct {
		name   string
		config string
		edit   func(ts map[string]*Tensor)
		want   string
	}{
		{"a missing tensor", string(cfg), func(ts map[string]*Tensor) { delete(ts, "midlayer.hidden_norm.weight") }, "tensor midlayer.hidden_norm.weight is missing"},
		{"a wrong shape", string(cfg), func(ts map[string]*Tensor) {
			f := ts["fc.weight"]
			f.Shape = []int{64 * 3, 64}
		}, "tensor fc.weight has shape [192 64], want [64 192]"},
		{"a mapping outside the vocabulary", string(cfg), func(ts map[string]*Tensor) {
			ts["d2t"].Data[8*255] = 0xff
			ts["d2t"].Data[8*255+1] = 0x7f
		}, "outside the vocabulary"},
		{"two layers", strings.Replace(string(cfg), `"num_hidden_layers": 1`, `"num_hidden_layers": 2`, 1), func(map[string]*Tensor) {}, "one decoder layer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadEagle3(write(t, c.config, c.edit))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			}
		})
	}
}

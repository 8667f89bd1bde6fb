package main

import (
	"testing"

	"gollm/engine"
)

// plainEngine overlaps nothing; pipeEngine overlaps on its own.
type plainEngine struct{ engine.Engine }

type pipeEngine struct{ engine.Engine }

func (pipeEngine) Launch(*engine.Batch) error     { return nil }
func (pipeEngine) Wait() ([]engine.Output, error) { return nil, nil }

func TestOverlapSchedulerDefaultsToTheEngine(t *testing.T) {
	on, off := true, false
	for _, tc := range []struct {
		name string
		set  *bool
		eng  engine.Engine
		want bool
	}{
		{"unset, an engine that overlaps on its own (GPU)", nil, pipeEngine{}, true},
		{"unset, an engine that does not (CPU)", nil, plainEngine{}, false},
		{"false on the GPU engine", &off, pipeEngine{}, false},
		{"true on the CPU engine", &on, plainEngine{}, true},
	} {
		if got := overlapOn(tc.set, tc.eng); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

package engines

import (
	"testing"

	"gollm/engine"
)

func TestParseFailStep(t *testing.T) {
	for _, tc := range []struct {
		in   string
		step int
		lost bool
		ok   bool
	}{
		{"3", 3, false, true},
		{" 1 ", 1, false, true},
		{"7:lost", 7, true, true},
		{"0", 0, false, false},
		{"-2", 0, false, false},
		{"x", 0, false, false},
		{"3:gone", 0, false, false},
	} {
		step, lost, err := parseFailStep("GOLLM_X", tc.in)
		if (err == nil) != tc.ok || step != tc.step || lost != tc.lost {
			t.Errorf("parseFailStep(%q) = %d, %v, %v; want %d, %v, ok %v", tc.in, step, lost, err, tc.step, tc.lost, tc.ok)
		}
	}
}

// countingEngine counts its steps.
type countingEngine struct {
	engine.Engine
	steps int
}

func (c *countingEngine) Step(b *engine.Batch) ([]engine.Output, error) {
	c.steps++
	return make([]engine.Output, len(b.Seqs)), nil
}

func TestFaultyEngineFailsItsNthStepOnce(t *testing.T) {
	t.Run("a recoverable fault", func(t *testing.T) {
		t.Setenv(EnvCPUFailStep, "2")
		inner := &countingEngine{}
		e, err := withFaults(inner)
		if err != nil {
			t.Fatal(err)
		}
		rec, ok := e.(engine.Recoverer)
		if !ok {
			t.Fatal("the wrapped engine is no engine.Recoverer")
		}
		for i := 1; i <= 4; i++ {
			_, err := e.Step(&engine.Batch{})
			if (err != nil) != (i == 2) {
				t.Errorf("step %d: error %v", i, err)
			}
		}
		if inner.steps != 3 {
			t.Errorf("the engine ran %d steps, want 3 (the failed one never reaches it)", inner.steps)
		}
		if err := rec.Recover(nil); err != nil {
			t.Errorf("Recover: %v", err)
		}
	})
	t.Run("a lost engine cannot recover", func(t *testing.T) {
		t.Setenv(EnvCPUFailStep, "1:lost")
		e, err := withFaults(&countingEngine{})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.(engine.Recoverer).Recover(nil); err == nil {
			t.Error("Recover succeeded on a lost engine")
		}
	})
	t.Run("a bad value fails the engine's creation", func(t *testing.T) {
		t.Setenv(EnvCPUFailStep, "soon")
		if _, err := withFaults(&countingEngine{}); err == nil {
			t.Error("no error")
		}
	})
	t.Run("unset, the engine is not wrapped", func(t *testing.T) {
		inner := &countingEngine{}
		e, err := withFaults(inner)
		if err != nil || e != engine.Engine(inner) {
			t.Errorf("got %v, %v; want the engine itself", e, err)
		}
	})
}

package engines

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"gollm/engine"
)

// EnvCPUFailStep names the debugging switch that makes a CPU engine's step fail, for
// testing what the batch manager and the backend do with a failing engine without a GPU
// (the CUDA engine's own switch is GOLLM_CUDA_FAIL_STEP, read in cuda/): "N" fails each
// engine's Nth step once, and the engine recovers; "N:lost" fails it and the engine
// cannot recover, as after a lost CUDA context.
const EnvCPUFailStep = "GOLLM_CPU_FAIL_STEP"

// parseFailStep reads a fail-step switch's value: "N" or "N:lost", N ≥ 1.
func parseFailStep(name, v string) (step int, lost bool, err error) {
	num, mode, hasMode := strings.Cut(strings.TrimSpace(v), ":")
	step, err = strconv.Atoi(num)
	if err != nil || step < 1 || (hasMode && mode != "lost") {
		return 0, false, fmt.Errorf("%s=%q: want N or N:lost, with N ≥ 1 the step that fails", name, v)
	}
	return step, hasMode, nil
}

// faulty is an engine whose step failAt fails (GOLLM_CPU_FAIL_STEP).
type faulty struct {
	engine.Engine
	// failAt is the step that fails, counted from 1.
	failAt int
	// lost makes Recover fail.
	lost bool
	// steps counts the steps run.
	steps int
}

// withFaults wraps e when the switch is set.
func withFaults(e engine.Engine) (engine.Engine, error) {
	v, ok := os.LookupEnv(EnvCPUFailStep)
	if !ok || v == "" {
		return e, nil
	}
	n, lost, err := parseFailStep(EnvCPUFailStep, v)
	if err != nil {
		return nil, err
	}
	return &faulty{Engine: e, failAt: n, lost: lost}, nil
}

// Step fails the failAt-th step, before the engine sees it.
func (f *faulty) Step(b *engine.Batch) ([]engine.Output, error) {
	f.steps++
	if f.steps == f.failAt {
		return nil, fmt.Errorf("engines: injected fault at step %d (%s)", f.steps, EnvCPUFailStep)
	}
	return f.Engine.Step(b)
}

// Recover succeeds unless the switch said the engine is lost.
func (f *faulty) Recover(error) error {
	if f.lost {
		return errors.New("engines: injected: the engine is lost (" + EnvCPUFailStep + "=N:lost)")
	}
	return nil
}

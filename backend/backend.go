package main

import (
	"errors"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"gollm/bridge/triton"
)

// The backend's global state. tritonserver may unload the library when its last model
// goes and load it again later; the library is linked with -z nodelete, so the Go
// runtime and these variables survive, and initialize sets them afresh each time.
var (
	// stateMu guards backendLog and families.
	stateMu sync.Mutex
	// backendLog writes into Triton's log; nil outside Initialize…Finalize.
	backendLog *zap.Logger
	// families are the backend's metric families; nil outside Initialize…Finalize or
	// when the server has no metrics.
	families *metricFamilies
	// gauges are the process-wide series (the Go runtime's memory, the GPUs); nil
	// outside Initialize…Finalize or when the server has no metrics.
	gauges *processGauges
)

// currentLogger returns the backend's logger, nil when not initialized.
func currentLogger() *zap.Logger {
	stateMu.Lock()
	defer stateMu.Unlock()
	return backendLog
}

// currentGPUGauges returns the per-GPU gauges, nil when there are none.
func currentGPUGauges() *gpuGauges {
	stateMu.Lock()
	defer stateMu.Unlock()
	if gauges == nil {
		return nil
	}
	return gauges.gpu
}

// currentFamilies returns the backend's metric families, nil when there are none.
func currentFamilies() *metricFamilies {
	stateMu.Lock()
	defer stateMu.Unlock()
	return families
}

// initialize is TRITONBACKEND_Initialize: it finds Triton's functions, checks the API
// versions and sets up logging.
func initialize(b triton.Backend) error {
	if err := triton.Resolve(); err != nil {
		return err
	}
	if err := triton.CheckAPIVersions(); err != nil {
		return err
	}
	log := triton.NewLogger().Named("gollm")
	name, err := b.Name()
	if err != nil {
		return err
	}
	// Metrics are worth a warning, not a failed backend: a server built without them
	// refuses the families.
	fams, err := newMetricFamilies()
	if err != nil {
		log.Warn("no gollm_* metrics on /metrics", zap.Error(err))
		fams = nil
	}
	var pg *processGauges
	if fams != nil {
		if pg, err = startProcessGauges(log); err != nil {
			log.Warn("no process-wide gollm_* gauges on /metrics", zap.Error(err))
			pg = nil
		}
	}
	stateMu.Lock()
	backendLog = log
	families = fams
	gauges = pg
	stateMu.Unlock()
	startCPUProfile(log)
	configureMemory(log)
	// A process that exits with instances loaded (tritonserver's exit timeout expired)
	// ends without running destructors under the backend's goroutines (shutdown.go).
	triton.GuardExit()
	log.Info("backend initialized", zap.String("backend", name),
		zap.String("api", fmt.Sprintf("backend %d.%d, server %d.%d", triton.BackendAPIMajor, triton.BackendAPIMinor, triton.ServerAPIMajor, triton.ServerAPIMinor)))
	return nil
}

// finalize is TRITONBACKEND_Finalize.
func finalize(triton.Backend) error {
	stateMu.Lock()
	log := backendLog
	fams := families
	pg := gauges
	backendLog, families, gauges = nil, nil, nil
	stateMu.Unlock()
	// Triton finalizes every model (and so every instance's metrics) first.
	err := pg.stop()
	if fams != nil {
		err = errors.Join(err, fams.delete())
	}
	if log != nil {
		stopCPUProfile(log)
		if err != nil {
			log.Warn("delete the metric families", zap.Error(err))
		}
		log.Info("backend finalized")
	}
	return nil
}

// errNotInitialized is returned when Triton calls in before TRITONBACKEND_Initialize.
var errNotInitialized = errors.New("gollm: the backend is not initialized")

// modelInitialize is TRITONBACKEND_ModelInitialize: it reads and checks the
// configuration and loads the checkpoint once for the model's instances.
func modelInitialize(m triton.Model) error {
	log := currentLogger()
	if log == nil {
		return errNotInitialized
	}
	if name, err := m.Name(); err == nil {
		if version, err := m.Version(); err == nil {
			// A model loading beside one of its name and version whose unload has begun.
			checkUnloads(name, version)
		}
	}
	st, err := loadModel(m, log)
	if err == nil {
		err = m.SetState(st)
	}
	if err != nil {
		releaseMemory(log, "a failed model load")
	}
	return err
}

// modelFinalize is TRITONBACKEND_ModelFinalize.
func modelFinalize(m triton.Model) error {
	st := m.State()
	m.ClearState()
	switch st := st.(type) {
	case *modelState:
		log := st.log
		st.releaseWeights()
		log.Info("model unloaded")
		// The state is dead from here (nothing references it), so this returns its memory.
		releaseMemory(log, "the model's unload")
	case *tokenizerModel:
		st.log.Info("model unloaded")
		releaseMemory(st.log, "the model's unload")
	}
	return nil
}

// instanceInitialize is TRITONBACKEND_ModelInstanceInitialize: it builds the engine
// and batch manager.
func instanceInitialize(ti triton.ModelInstance) error {
	m, err := ti.Model()
	if err != nil {
		return err
	}
	if tm, ok := m.State().(*tokenizerModel); ok {
		tin, err := newTokenizerInstance(tm, ti)
		if err == nil {
			err = ti.SetState(tin)
		}
		if err == nil {
			triton.InstanceLoaded()
		}
		return err
	}
	ms, ok := m.State().(*modelState)
	if !ok {
		return errors.New("gollm: instance of a model without state")
	}
	in, err := newInstance(ms, ti)
	if err == nil {
		if err = ti.SetState(in); err != nil {
			_ = in.close()
		}
	}
	if err == nil {
		triton.InstanceLoaded()
		ms.engines.Add(1)
		in.startWatch()
	}
	if err != nil {
		// What the instance built is garbage now; the model's share goes at its unload.
		releaseMemory(ms.log, "a failed instance load")
	}
	return err
}

// instanceFinalize is TRITONBACKEND_ModelInstanceFinalize: every request still queued
// or running gets a final error, then everything is freed.
func instanceFinalize(ti triton.ModelInstance) error {
	st := ti.State()
	ti.ClearState()
	if tin, ok := st.(*tokenizerInstance); ok {
		triton.InstanceUnloaded()
		tin.log.Info("instance finalized")
		return nil
	}
	in, _ := st.(*instance)
	if in == nil {
		return nil
	}
	err := in.close()
	triton.InstanceUnloaded()
	in.log.Info("instance finalized")
	return err
}

// instanceExecute is TRITONBACKEND_ModelInstanceExecute. It returns an error only when
// no request was touched (Triton then answers them all); otherwise the backend owns and
// answers every request.
func instanceExecute(ti triton.ModelInstance, reqs []triton.Request) error {
	switch in := ti.State().(type) {
	case *instance:
		in.execute(reqs)
	case *tokenizerInstance:
		in.execute(reqs)
	default:
		return errors.New("gollm: execute on an instance without state")
	}
	return nil
}

package triton

/*
#include <stdlib.h>
#include "api.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Server is the TRITONSERVER_Server a model runs in. Its functions may be called while
// the model is loaded: Triton destroys the server only after every model.
type Server struct {
	// p is Triton's object.
	p *C.TRITONSERVER_Server
}

// Server returns the server the model runs in.
func (m Model) Server() (Server, error) {
	var s *C.TRITONSERVER_Server
	if err := goError(C.gt_TRITONBACKEND_ModelServer(m.p, &s)); err != nil {
		return Server{}, fmt.Errorf("model server: %w", err)
	}
	return Server{p: s}, nil
}

// Stopping reports whether the server is shutting down. TRITONSERVER_ServerStop marks
// the server as exiting before it unloads the models, and from then on
// TRITONSERVER_ServerIsLive fails ("Server exiting"); before the server has finished
// starting it reports not live without an error, which is not a shutdown.
func (s Server) Stopping() bool {
	var live C.bool
	return goError(C.gt_TRITONSERVER_ServerIsLive(s.p, &live)) != nil
}

// ModelReady reports whether Triton serves the named version of a model: false while it
// loads, once its unload has begun, and (with an error) while the server is not ready.
func (s Server) ModelReady(name string, version uint64) (bool, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var ready C.bool
	if err := goError(C.gt_TRITONSERVER_ServerModelIsReady(s.p, cname, C.int64_t(version), &ready)); err != nil {
		return false, fmt.Errorf("model %s version %d ready: %w", name, version, err)
	}
	return bool(ready), nil
}

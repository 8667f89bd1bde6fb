// Package triton is the only Go code that sees Triton's C API. It wraps the server and
// backend functions gollm calls (declared by the project itself in api.h, looked up in
// the process at run time) in Go types: Backend, Model, ModelInstance, Request,
// ResponseFactory, Response, Error, MetricFamily and Metric (Prometheus metrics on
// Triton's /metrics page), and a zap core that writes into Triton's log.
//
// Call Resolve once, in TRITONBACKEND_Initialize, before anything else here.
package triton

import "fmt"

// DataType is TRITONSERVER_DataType.
type DataType int32

// The values of TRITONSERVER_DataType.
const (
	TypeInvalid DataType = iota
	TypeBool
	TypeUint8
	TypeUint16
	TypeUint32
	TypeUint64
	TypeInt8
	TypeInt16
	TypeInt32
	TypeInt64
	TypeFP16
	TypeFP32
	TypeFP64
	TypeBytes
	TypeBF16
)

// dataTypeNames are the names Triton's protocols use (KServe v2 "datatype").
var dataTypeNames = [...]string{"INVALID", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64",
	"INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"}

// dataTypeSizes are the element sizes in bytes; 0 for BYTES (variable) and INVALID.
var dataTypeSizes = [...]int{0, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 0, 2}

// String returns the protocol name of the type ("INT32").
func (t DataType) String() string {
	if t < 0 || int(t) >= len(dataTypeNames) {
		return fmt.Sprintf("DataType(%d)", int32(t))
	}
	return dataTypeNames[t]
}

// Size returns the size of one element in bytes; 0 for BYTES and unknown types.
func (t DataType) Size() int {
	if t < 0 || int(t) >= len(dataTypeSizes) {
		return 0
	}
	return dataTypeSizes[t]
}

// InstanceKind is TRITONSERVER_InstanceGroupKind.
type InstanceKind int32

// The values of TRITONSERVER_InstanceGroupKind.
const (
	KindAuto InstanceKind = iota
	KindCPU
	KindGPU
	KindModel
)

// String returns the config.pbtxt spelling (KIND_CPU).
func (k InstanceKind) String() string {
	switch k {
	case KindAuto:
		return "KIND_AUTO"
	case KindCPU:
		return "KIND_CPU"
	case KindGPU:
		return "KIND_GPU"
	case KindModel:
		return "KIND_MODEL"
	}
	return fmt.Sprintf("InstanceKind(%d)", int32(k))
}

// LogLevel is TRITONSERVER_LogLevel.
type LogLevel int32

// The values of TRITONSERVER_LogLevel.
const (
	LogInfo LogLevel = iota
	LogWarn
	LogError
	LogVerbose
)

// Response and release flags (TRITONSERVER_ResponseCompleteFlag,
// TRITONSERVER_RequestReleaseFlag).
const (
	// ResponseFinal marks the last response of a request.
	ResponseFinal uint32 = 1
	// releaseAll releases a request entirely.
	releaseAll uint32 = 1
)

// artifactFilesystem is TRITONBACKEND_ARTIFACT_FILESYSTEM.
const artifactFilesystem = 0

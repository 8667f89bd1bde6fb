// gollm's own declarations of the parts of Triton's server and backend C API (the
// TRITONSERVER_* and TRITONBACKEND_* functions of tritonserver 2.51, backend API 1.19,
// server API 1.34) that bridge/triton calls. The functions are not linked: gt_resolve
// looks each one up in the process with dlsym(RTLD_DEFAULT) when the backend
// initializes, so the library loads (and this package builds and tests) without
// libtritonserver, and a server lacking a function is reported by name instead of
// failing in the dynamic loader.
#ifndef GOLLM_BRIDGE_TRITON_API_H
#define GOLLM_BRIDGE_TRITON_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The API versions this package is written against.
#define GT_BACKEND_API_MAJOR 1
#define GT_BACKEND_API_MINOR 19
#define GT_SERVER_API_MAJOR 1
#define GT_SERVER_API_MINOR 34

// Opaque handles owned by Triton.
typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONSERVER_Server TRITONSERVER_Server;
typedef struct TRITONSERVER_Message TRITONSERVER_Message;
typedef struct TRITONBACKEND_Backend TRITONBACKEND_Backend;
typedef struct TRITONBACKEND_Model TRITONBACKEND_Model;
typedef struct TRITONBACKEND_ModelInstance TRITONBACKEND_ModelInstance;
typedef struct TRITONBACKEND_Request TRITONBACKEND_Request;
typedef struct TRITONBACKEND_Input TRITONBACKEND_Input;
typedef struct TRITONBACKEND_Output TRITONBACKEND_Output;
typedef struct TRITONBACKEND_ResponseFactory TRITONBACKEND_ResponseFactory;
typedef struct TRITONBACKEND_Response TRITONBACKEND_Response;
typedef struct TRITONSERVER_Parameter TRITONSERVER_Parameter;
typedef struct TRITONSERVER_MetricFamily TRITONSERVER_MetricFamily;
typedef struct TRITONSERVER_Metric TRITONSERVER_Metric;

// Triton's enums are C enums, passed as int. Their values are in types.go.

// GT_API lists every function used, as X(return type, name, parameters, arguments).
// The error functions come first: they are resolved first, so that a missing function
// later in the list can still be reported as a Triton error.
#define GT_API(X)                                                                   \
  X(TRITONSERVER_Error*, TRITONSERVER_ErrorNew, (int code, const char* msg), (code, msg)) \
  X(int, TRITONSERVER_ErrorCode, (TRITONSERVER_Error* err), (err))                  \
  X(const char*, TRITONSERVER_ErrorMessage, (TRITONSERVER_Error* err), (err))       \
  X(TRITONSERVER_Error*, TRITONSERVER_ApiVersion, (uint32_t* major, uint32_t* minor), \
    (major, minor))                                                                 \
  X(bool, TRITONSERVER_LogIsEnabled, (int level), (level))                          \
  X(TRITONSERVER_Error*, TRITONSERVER_LogMessage,                                   \
    (int level, const char* file, int line, const char* msg), (level, file, line, msg)) \
  X(TRITONSERVER_Error*, TRITONSERVER_MessageSerializeToJson,                       \
    (TRITONSERVER_Message* msg, const char** base, size_t* size), (msg, base, size)) \
  X(TRITONSERVER_Error*, TRITONSERVER_MessageDelete, (TRITONSERVER_Message* msg), (msg)) \
  X(TRITONSERVER_Error*, TRITONBACKEND_ApiVersion, (uint32_t* major, uint32_t* minor), \
    (major, minor))                                                                 \
  X(TRITONSERVER_Error*, TRITONBACKEND_BackendName,                                 \
    (TRITONBACKEND_Backend* backend, const char** name), (backend, name))           \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelName,                                   \
    (TRITONBACKEND_Model* model, const char** name), (model, name))                 \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelVersion,                                \
    (TRITONBACKEND_Model* model, uint64_t* version), (model, version))              \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelRepository,                             \
    (TRITONBACKEND_Model* model, int* artifact_type, const char** location),        \
    (model, artifact_type, location))                                               \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelConfig,                                 \
    (TRITONBACKEND_Model* model, uint32_t config_version, TRITONSERVER_Message** config), \
    (model, config_version, config))                                                \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelServer,                                 \
    (TRITONBACKEND_Model* model, TRITONSERVER_Server** server), (model, server))    \
  X(TRITONSERVER_Error*, TRITONSERVER_ServerIsLive, (TRITONSERVER_Server* server, bool* live), \
    (server, live))                                                                 \
  X(TRITONSERVER_Error*, TRITONSERVER_ServerModelIsReady,                           \
    (TRITONSERVER_Server* server, const char* model_name, int64_t model_version,    \
     bool* ready),                                                                  \
    (server, model_name, model_version, ready))                                     \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelState, (TRITONBACKEND_Model* model, void** state), \
    (model, state))                                                                 \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelSetState, (TRITONBACKEND_Model* model, void* state), \
    (model, state))                                                                 \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceName,                           \
    (TRITONBACKEND_ModelInstance* instance, const char** name), (instance, name))   \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceKind,                           \
    (TRITONBACKEND_ModelInstance* instance, int* kind), (instance, kind))           \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceDeviceId,                       \
    (TRITONBACKEND_ModelInstance* instance, int32_t* device_id), (instance, device_id)) \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceModel,                          \
    (TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Model** model), (instance, model)) \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceState,                          \
    (TRITONBACKEND_ModelInstance* instance, void** state), (instance, state))       \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceSetState,                       \
    (TRITONBACKEND_ModelInstance* instance, void* state), (instance, state))        \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceReportStatistics,               \
    (TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, bool success, \
     uint64_t exec_start_ns, uint64_t compute_start_ns, uint64_t compute_end_ns,    \
     uint64_t exec_end_ns),                                                         \
    (instance, request, success, exec_start_ns, compute_start_ns, compute_end_ns, exec_end_ns)) \
  X(TRITONSERVER_Error*, TRITONBACKEND_ModelInstanceReportBatchStatistics,          \
    (TRITONBACKEND_ModelInstance* instance, uint64_t batch_size, uint64_t exec_start_ns, \
     uint64_t compute_start_ns, uint64_t compute_end_ns, uint64_t exec_end_ns),     \
    (instance, batch_size, exec_start_ns, compute_start_ns, compute_end_ns, exec_end_ns)) \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestId,                                   \
    (TRITONBACKEND_Request* request, const char** id), (request, id))               \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestInputCount,                           \
    (TRITONBACKEND_Request* request, uint32_t* count), (request, count))            \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestInputByIndex,                         \
    (TRITONBACKEND_Request* request, uint32_t index, TRITONBACKEND_Input** input),  \
    (request, index, input))                                                        \
  X(TRITONSERVER_Error*, TRITONBACKEND_InputProperties,                             \
    (TRITONBACKEND_Input* input, const char** name, int* datatype, const int64_t** shape, \
     uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count),            \
    (input, name, datatype, shape, dims_count, byte_size, buffer_count))            \
  X(TRITONSERVER_Error*, TRITONBACKEND_InputBuffer,                                 \
    (TRITONBACKEND_Input* input, uint32_t index, const void** buffer, uint64_t* byte_size, \
     int* memory_type, int64_t* memory_type_id),                                    \
    (input, index, buffer, byte_size, memory_type, memory_type_id))                 \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestOutputCount,                          \
    (TRITONBACKEND_Request* request, uint32_t* count), (request, count))            \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestOutputName,                           \
    (TRITONBACKEND_Request* request, uint32_t index, const char** name), (request, index, name)) \
  X(TRITONSERVER_Error*, TRITONBACKEND_RequestRelease,                              \
    (TRITONBACKEND_Request* request, uint32_t release_flags), (request, release_flags)) \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseFactoryNew,                          \
    (TRITONBACKEND_ResponseFactory** factory, TRITONBACKEND_Request* request), (factory, request)) \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseFactoryDelete,                       \
    (TRITONBACKEND_ResponseFactory* factory), (factory))                            \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseFactorySendFlags,                    \
    (TRITONBACKEND_ResponseFactory* factory, uint32_t send_flags), (factory, send_flags)) \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseFactoryIsCancelled,                  \
    (TRITONBACKEND_ResponseFactory* factory, bool* is_cancelled), (factory, is_cancelled)) \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseNew,                                 \
    (TRITONBACKEND_Response** response, TRITONBACKEND_Request* request), (response, request)) \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseNewFromFactory,                      \
    (TRITONBACKEND_Response** response, TRITONBACKEND_ResponseFactory* factory),    \
    (response, factory))                                                            \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseDelete, (TRITONBACKEND_Response* response), \
    (response))                                                                     \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseOutput,                              \
    (TRITONBACKEND_Response* response, TRITONBACKEND_Output** output, const char* name, \
     int datatype, const int64_t* shape, uint32_t dims_count),                      \
    (response, output, name, datatype, shape, dims_count))                          \
  X(TRITONSERVER_Error*, TRITONBACKEND_OutputBuffer,                                \
    (TRITONBACKEND_Output* output, void** buffer, uint64_t byte_size, int* memory_type, \
     int64_t* memory_type_id),                                                      \
    (output, buffer, byte_size, memory_type, memory_type_id))                       \
  X(TRITONSERVER_Error*, TRITONBACKEND_ResponseSend,                                \
    (TRITONBACKEND_Response* response, uint32_t send_flags, TRITONSERVER_Error* error), \
    (response, send_flags, error))                                                  \
  X(TRITONSERVER_Parameter*, TRITONSERVER_ParameterNew,                             \
    (const char* name, int type, const void* value), (name, type, value))           \
  X(TRITONSERVER_Error*, TRITONSERVER_MetricFamilyNew,                              \
    (TRITONSERVER_MetricFamily** family, int kind, const char* name,                \
     const char* description),                                                      \
    (family, kind, name, description))                                              \
  X(TRITONSERVER_Error*, TRITONSERVER_MetricFamilyDelete,                           \
    (TRITONSERVER_MetricFamily* family), (family))                                  \
  X(TRITONSERVER_Error*, TRITONSERVER_MetricNew,                                    \
    (TRITONSERVER_Metric** metric, TRITONSERVER_MetricFamily* family,               \
     const TRITONSERVER_Parameter** labels, uint64_t label_count),                  \
    (metric, family, labels, label_count))                                          \
  X(TRITONSERVER_Error*, TRITONSERVER_MetricDelete, (TRITONSERVER_Metric* metric), (metric)) \
  X(TRITONSERVER_Error*, TRITONSERVER_MetricSet, (TRITONSERVER_Metric* metric, double value), \
    (metric, value))                                                                \
  X(TRITONSERVER_Error*, TRITONSERVER_MetricIncrement,                              \
    (TRITONSERVER_Metric* metric, double value), (metric, value))

// gt_<name> calls Triton's <name> through the pointer gt_resolve found.
#define GT_DECLARE(ret, name, params, args) ret gt_##name params;
GT_API(GT_DECLARE)
#undef GT_DECLARE

// TRITONSERVER_ErrorDelete and TRITONSERVER_ParameterDelete return void, so they stand
// outside the list.
void gt_TRITONSERVER_ErrorDelete(TRITONSERVER_Error* err);
void gt_TRITONSERVER_ParameterDelete(TRITONSERVER_Parameter* param);

// gt_resolve looks every function up; it returns NULL, or the name of the first one the
// process does not have.
const char* gt_resolve(void);

// Helpers that do a few Triton calls in one crossing from Go.

// gt_input_info returns an input's properties.
TRITONSERVER_Error* gt_input_info(TRITONBACKEND_Request* request, uint32_t index,
                                  TRITONBACKEND_Input** input, const char** name,
                                  int* datatype, const int64_t** shape, uint32_t* dims,
                                  uint64_t* byte_size, uint32_t* buffer_count);

// gt_input_copy gathers an input's buffers (in CPU memory) into dst, which holds size
// bytes, the input's byte size.
TRITONSERVER_Error* gt_input_copy(TRITONBACKEND_Input* input, uint32_t buffer_count,
                                  void* dst, uint64_t size);

// gt_response_output adds an output tensor to a response and copies size bytes of data
// into its CPU buffer.
TRITONSERVER_Error* gt_response_output(TRITONBACKEND_Response* response, const char* name,
                                       int datatype, const int64_t* shape, uint32_t dims,
                                       const void* data, uint64_t size);

// gt_factories_cancelled sets cancelled[i] for each of n factories.
TRITONSERVER_Error* gt_factories_cancelled(TRITONBACKEND_ResponseFactory** factories,
                                           size_t n, bool* cancelled);

// gt_metric_new makes a metric of family labelled with n name=value pairs (string
// labels), deleting the label parameters again.
TRITONSERVER_Error* gt_metric_new(TRITONSERVER_MetricFamily* family, const char** names,
                                  const char** values, size_t n, TRITONSERVER_Metric** metric);

// gt_metrics_update applies n updates: metrics[i] is incremented by values[i] when add[i],
// set to it otherwise. It stops at the first error.
TRITONSERVER_Error* gt_metrics_update(TRITONSERVER_Metric** metrics, const double* values,
                                      const bool* add, size_t n);

// gt_monotonic_ns is CLOCK_MONOTONIC in nanoseconds: the clock of std::chrono::steady_clock,
// which Triton's statistics use.
uint64_t gt_monotonic_ns(void);

// State setters and getters that carry a Go cgo.Handle as an integer.
TRITONSERVER_Error* gt_model_set_state(TRITONBACKEND_Model* model, uintptr_t state);
TRITONSERVER_Error* gt_model_state(TRITONBACKEND_Model* model, uintptr_t* state);
TRITONSERVER_Error* gt_instance_set_state(TRITONBACKEND_ModelInstance* instance, uintptr_t state);
TRITONSERVER_Error* gt_instance_state(TRITONBACKEND_ModelInstance* instance, uintptr_t* state);

#endif

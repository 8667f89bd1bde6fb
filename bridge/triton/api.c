// Calls into Triton through function pointers looked up at run time; see api.h.
#define _GNU_SOURCE
#include "api.h"

#include <dlfcn.h>
#include <string.h>
#include <time.h>

// Values of TRITONSERVER_Error_Code, TRITONSERVER_MemoryType and
// TRITONSERVER_ParameterType used here.
enum {
  GT_ERROR_INTERNAL = 1,
  GT_ERROR_INVALID_ARG = 3,
  GT_ERROR_UNSUPPORTED = 5,
  GT_MEMORY_CPU = 0,
  GT_MEMORY_CPU_PINNED = 1,
  GT_PARAMETER_STRING = 0,
};

#define GT_POINTER(ret, name, params, args) static ret(*p_##name) params;
GT_API(GT_POINTER)
#undef GT_POINTER
static void (*p_TRITONSERVER_ErrorDelete)(TRITONSERVER_Error*);
static void (*p_TRITONSERVER_ParameterDelete)(TRITONSERVER_Parameter*);

#define GT_DEFINE(ret, name, params, args) \
  ret gt_##name params { return p_##name args; }
GT_API(GT_DEFINE)
#undef GT_DEFINE

void gt_TRITONSERVER_ErrorDelete(TRITONSERVER_Error* err) { p_TRITONSERVER_ErrorDelete(err); }

void gt_TRITONSERVER_ParameterDelete(TRITONSERVER_Parameter* param) {
  p_TRITONSERVER_ParameterDelete(param);
}

const char* gt_resolve(void) {
  // POSIX lets a function pointer take dlsym's object pointer through a cast.
#define GT_LOOKUP(ret, name, params, args)                       \
  *(void**)(&p_##name) = dlsym(RTLD_DEFAULT, #name);            \
  if (p_##name == NULL) return #name;
  GT_LOOKUP(void, TRITONSERVER_ErrorDelete, (), ())
  GT_API(GT_LOOKUP)
  GT_LOOKUP(void, TRITONSERVER_ParameterDelete, (), ())
#undef GT_LOOKUP
  return NULL;
}

TRITONSERVER_Error* gt_input_info(TRITONBACKEND_Request* request, uint32_t index,
                                  TRITONBACKEND_Input** input, const char** name,
                                  int* datatype, const int64_t** shape, uint32_t* dims,
                                  uint64_t* byte_size, uint32_t* buffer_count) {
  TRITONSERVER_Error* err = p_TRITONBACKEND_RequestInputByIndex(request, index, input);
  if (err != NULL) return err;
  return p_TRITONBACKEND_InputProperties(*input, name, datatype, shape, dims, byte_size,
                                         buffer_count);
}

TRITONSERVER_Error* gt_input_copy(TRITONBACKEND_Input* input, uint32_t buffer_count,
                                  void* dst, uint64_t size) {
  uint64_t off = 0;
  for (uint32_t i = 0; i < buffer_count; i++) {
    const void* buf = NULL;
    uint64_t n = 0;
    int mem = GT_MEMORY_CPU;
    int64_t mem_id = 0;
    TRITONSERVER_Error* err = p_TRITONBACKEND_InputBuffer(input, i, &buf, &n, &mem, &mem_id);
    if (err != NULL) return err;
    if (mem != GT_MEMORY_CPU && mem != GT_MEMORY_CPU_PINNED) {
      return p_TRITONSERVER_ErrorNew(GT_ERROR_UNSUPPORTED,
                                     "input buffer is in GPU memory; gollm reads inputs from CPU memory");
    }
    if (n > size - off) {
      return p_TRITONSERVER_ErrorNew(GT_ERROR_INVALID_ARG,
                                     "input buffers hold more bytes than the input's byte size");
    }
    if (n > 0) memcpy((char*)dst + off, buf, n);
    off += n;
  }
  if (off != size) {
    return p_TRITONSERVER_ErrorNew(GT_ERROR_INVALID_ARG,
                                   "input buffers hold fewer bytes than the input's byte size");
  }
  return NULL;
}

TRITONSERVER_Error* gt_response_output(TRITONBACKEND_Response* response, const char* name,
                                       int datatype, const int64_t* shape, uint32_t dims,
                                       const void* data, uint64_t size) {
  TRITONBACKEND_Output* out = NULL;
  TRITONSERVER_Error* err =
      p_TRITONBACKEND_ResponseOutput(response, &out, name, datatype, shape, dims);
  if (err != NULL) return err;
  // An empty output still needs its (empty) buffer: Triton counts the buffers.
  void* buf = NULL;
  int mem = GT_MEMORY_CPU;
  int64_t mem_id = 0;
  err = p_TRITONBACKEND_OutputBuffer(out, &buf, size, &mem, &mem_id);
  if (err != NULL) return err;
  if (mem != GT_MEMORY_CPU && mem != GT_MEMORY_CPU_PINNED) {
    return p_TRITONSERVER_ErrorNew(GT_ERROR_UNSUPPORTED,
                                   "output buffer is in GPU memory; gollm writes outputs to CPU memory");
  }
  if (size > 0) memcpy(buf, data, size);
  return NULL;
}

TRITONSERVER_Error* gt_factories_cancelled(TRITONBACKEND_ResponseFactory** factories,
                                           size_t n, bool* cancelled) {
  for (size_t i = 0; i < n; i++) {
    cancelled[i] = false;
    TRITONSERVER_Error* err = p_TRITONBACKEND_ResponseFactoryIsCancelled(factories[i], &cancelled[i]);
    if (err != NULL) return err;
  }
  return NULL;
}

TRITONSERVER_Error* gt_metric_new(TRITONSERVER_MetricFamily* family, const char** names,
                                  const char** values, size_t n, TRITONSERVER_Metric** metric) {
  enum { MAX_LABELS = 16 };
  if (n > MAX_LABELS) {
    return p_TRITONSERVER_ErrorNew(GT_ERROR_INVALID_ARG, "a metric takes at most 16 labels");
  }
  const TRITONSERVER_Parameter* labels[MAX_LABELS];
  size_t made = 0;
  TRITONSERVER_Error* err = NULL;
  for (; made < n; made++) {
    labels[made] = p_TRITONSERVER_ParameterNew(names[made], GT_PARAMETER_STRING, values[made]);
    if (labels[made] == NULL) {
      err = p_TRITONSERVER_ErrorNew(GT_ERROR_INTERNAL, "cannot make a metric label");
      break;
    }
  }
  if (err == NULL) err = p_TRITONSERVER_MetricNew(metric, family, labels, n);
  // Triton copies the labels into the metric, so they go at once.
  for (size_t i = 0; i < made; i++) {
    p_TRITONSERVER_ParameterDelete((TRITONSERVER_Parameter*)labels[i]);
  }
  return err;
}

TRITONSERVER_Error* gt_metrics_update(TRITONSERVER_Metric** metrics, const double* values,
                                      const bool* add, size_t n) {
  for (size_t i = 0; i < n; i++) {
    TRITONSERVER_Error* err = add[i] ? p_TRITONSERVER_MetricIncrement(metrics[i], values[i])
                                     : p_TRITONSERVER_MetricSet(metrics[i], values[i]);
    if (err != NULL) return err;
  }
  return NULL;
}

uint64_t gt_monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

TRITONSERVER_Error* gt_model_set_state(TRITONBACKEND_Model* model, uintptr_t state) {
  return p_TRITONBACKEND_ModelSetState(model, (void*)state);
}

TRITONSERVER_Error* gt_model_state(TRITONBACKEND_Model* model, uintptr_t* state) {
  void* p = NULL;
  TRITONSERVER_Error* err = p_TRITONBACKEND_ModelState(model, &p);
  *state = (uintptr_t)p;
  return err;
}

TRITONSERVER_Error* gt_instance_set_state(TRITONBACKEND_ModelInstance* instance,
                                          uintptr_t state) {
  return p_TRITONBACKEND_ModelInstanceSetState(instance, (void*)state);
}

TRITONSERVER_Error* gt_instance_state(TRITONBACKEND_ModelInstance* instance,
                                      uintptr_t* state) {
  void* p = NULL;
  TRITONSERVER_Error* err = p_TRITONBACKEND_ModelInstanceState(instance, &p);
  *state = (uintptr_t)p;
  return err;
}

// trampoline.c — see trampoline.h.
#define _GNU_SOURCE
#include "trampoline.h"

#include <dlfcn.h>
#include <stddef.h>

void* gollm_open(const char* path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
const char* gollm_dlerror(void) { return dlerror(); }
void* gollm_sym(void* h, const char* name) { return dlsym(h, name); }

// gollm_self_path returns the file this code is linked into (an executable, or the
// backend's shared library under tritonserver), or NULL.
const char* gollm_self_path(void) {
  Dl_info info;
  if (dladdr((void*)gollm_self_path, &info) && info.dli_fname) return info.dli_fname;
  return NULL;
}

int32_t call_abi_version(void* f) { return ((int32_t(*)(void))f)(); }

int32_t call_device_count(void* f, int32_t* n, gollm_status* st) {
  return ((int32_t(*)(int32_t*, gollm_status*))f)(n, st);
}

int32_t call_weights_create(void* f, const gollm_weights_params* p, gollm_weights** out,
                            gollm_status* st) {
  return ((int32_t(*)(const gollm_weights_params*, gollm_weights**, gollm_status*))f)(p, out, st);
}

void call_weights_release(void* f, gollm_weights* w) { ((void (*)(gollm_weights*))f)(w); }

int32_t call_engine_create(void* f, gollm_weights* w, const gollm_engine_params* p,
                           gollm_engine** out, gollm_engine_info* info, gollm_status* st) {
  return ((int32_t(*)(gollm_weights*, const gollm_engine_params*, gollm_engine**,
                      gollm_engine_info*, gollm_status*))f)(w, p, out, info, st);
}

int32_t call_step(void* f, gollm_engine* e, const gollm_step_in* in, gollm_step_out* out,
                  gollm_status* st) {
  return ((int32_t(*)(gollm_engine*, const gollm_step_in*, gollm_step_out*, gollm_status*))f)(
      e, in, out, st);
}

int32_t call_launch(void* f, gollm_engine* e, const gollm_step_in* in, int64_t logits_len,
                    gollm_status* st) {
  return ((int32_t(*)(gollm_engine*, const gollm_step_in*, int64_t, gollm_status*))f)(e, in, logits_len,
                                                                                     st);
}

int32_t call_wait(void* f, gollm_engine* e, gollm_step_out* out, gollm_status* st) {
  return ((int32_t(*)(gollm_engine*, gollm_step_out*, gollm_status*))f)(e, out, st);
}

void call_engine_destroy(void* f, gollm_engine* e) { ((void (*)(gollm_engine*))f)(e); }
int32_t call_engine_reset(void* f, gollm_engine* e, gollm_status* st) {
  return ((int32_t(*)(gollm_engine*, gollm_status*))f)(e, st);
}
int32_t call_device_info(void* f, int32_t device, gollm_device_info* out, gollm_status* st) {
  return ((int32_t(*)(int32_t, gollm_device_info*, gollm_status*))f)(device, out, st);
}
int64_t call_weights_bytes(void* f, const gollm_weights* w) {
  return ((int64_t(*)(const gollm_weights*))f)(w);
}
int32_t call_nccl_describe(void* f, const char* lib, gollm_nccl_info* out, gollm_status* st) {
  return ((int32_t(*)(const char*, gollm_nccl_info*, gollm_status*))f)(lib, out, st);
}
int32_t call_comm_create_all(void* f, int32_t n, const int32_t* devices, const char* lib,
                             gollm_comm** out, gollm_status* st) {
  return ((int32_t(*)(int32_t, const int32_t*, const char*, gollm_comm**, gollm_status*))f)(
      n, devices, lib, out, st);
}
int32_t call_comm_abort(void* f, gollm_comm* c, const char* cause, gollm_status* st) {
  return ((int32_t(*)(gollm_comm*, const char*, gollm_status*))f)(c, cause, st);
}
void call_comm_release(void* f, gollm_comm* c) { ((void (*)(gollm_comm*))f)(c); }

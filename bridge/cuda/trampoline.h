// trampoline.h — calls through the function pointers dlsym returns (cgo cannot call a C
// function pointer directly), and the loader helpers.
#ifndef GOLLM_BRIDGE_TRAMPOLINE_H
#define GOLLM_BRIDGE_TRAMPOLINE_H

#include <stdint.h>

#include "gollm.h"

void* gollm_open(const char* path);
const char* gollm_dlerror(void);
void* gollm_sym(void* h, const char* name);
const char* gollm_self_path(void);

int32_t call_abi_version(void* f);
int32_t call_device_count(void* f, int32_t* n, gollm_status* st);
int32_t call_weights_create(void* f, const gollm_weights_params* p, gollm_weights** out,
                            gollm_status* st);
void call_weights_release(void* f, gollm_weights* w);
int32_t call_engine_create(void* f, gollm_weights* w, const gollm_engine_params* p,
                           gollm_engine** out, gollm_engine_info* info, gollm_status* st);
int32_t call_step(void* f, gollm_engine* e, const gollm_step_in* in, gollm_step_out* out,
                  gollm_status* st);
int32_t call_launch(void* f, gollm_engine* e, const gollm_step_in* in, int64_t logits_len,
                    gollm_status* st);
int32_t call_wait(void* f, gollm_engine* e, gollm_step_out* out, gollm_status* st);
void call_engine_destroy(void* f, gollm_engine* e);
int32_t call_engine_reset(void* f, gollm_engine* e, gollm_status* st);
int32_t call_device_info(void* f, int32_t device, gollm_device_info* out, gollm_status* st);
int64_t call_weights_bytes(void* f, const gollm_weights* w);
int32_t call_nccl_describe(void* f, const char* lib, gollm_nccl_info* out, gollm_status* st);
int32_t call_comm_create_all(void* f, int32_t n, const int32_t* devices, const char* lib,
                             gollm_comm** out, gollm_status* st);
int32_t call_comm_abort(void* f, gollm_comm* c, const char* cause, gollm_status* st);
void call_comm_release(void* f, gollm_comm* c);

#endif

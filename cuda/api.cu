// api.cu — the C ABI of gollm.h: each entry point runs its work under guarded, which turns
// every exception (gollm::Error with its code, std::bad_alloc, anything else) into a
// gollm_status, so that nothing crosses the ABI or aborts the process.
#include <cstdio>

#include "internal.h"

using namespace gollm;

namespace {

void fill_status(gollm_status* st, int32_t code, const char* msg) {
  if (!st) return;
  st->code = code;
  std::snprintf(st->message, sizeof st->message, "%s", msg);
}

// guarded runs f, turning exceptions into a status.
template <typename F>
int32_t guarded(gollm_status* st, F&& f) {
  try {
    f();
    fill_status(st, GOLLM_OK, "");
    return GOLLM_OK;
  } catch (const Error& e) {
    fill_status(st, e.code, e.what());
    return e.code;
  } catch (const std::bad_alloc&) {
    fill_status(st, GOLLM_ERR_OUT_OF_MEMORY, "host memory exhausted");
    return GOLLM_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    fill_status(st, GOLLM_ERR_INTERNAL, e.what());
    return GOLLM_ERR_INTERNAL;
  } catch (...) {
    fill_status(st, GOLLM_ERR_INTERNAL, "unknown C++ exception");
    return GOLLM_ERR_INTERNAL;
  }
}

}  // namespace

extern "C" {

int32_t gollm_abi_version(void) { return GOLLM_ABI_VERSION; }

int32_t gollm_device_count(int32_t* count, gollm_status* status) {
  return guarded(status, [&] {
    if (!count) invalid("gollm_device_count: count is NULL");
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    *count = n;
  });
}

int32_t gollm_weights_create(const gollm_weights_params* params, gollm_weights** out,
                             gollm_status* status) {
  return guarded(status, [&] { create_weights(params, out); });
}

void gollm_weights_release(gollm_weights* w) {
  try {
    release_weights(w);
  } catch (...) {
  }
}

int32_t gollm_engine_create(gollm_weights* w, const gollm_engine_params* params,
                            gollm_engine** out, gollm_engine_info* info, gollm_status* status) {
  return guarded(status, [&] { create_engine(w, params, out, info); });
}

int32_t gollm_step(gollm_engine* e, const gollm_step_in* in, gollm_step_out* out,
                   gollm_status* status) {
  return guarded(status, [&] {
    if (!e) invalid("gollm_step: engine is NULL");
    AllocFault af(e->fail_alloc.c_str());
    e->steps++;
    step(e, in, out, fail_this_step(e));
  });
}

int32_t gollm_launch(gollm_engine* e, const gollm_step_in* in, int64_t logits_len,
                     gollm_status* status) {
  return guarded(status, [&] {
    if (!e) invalid("gollm_launch: engine is NULL");
    AllocFault af(e->fail_alloc.c_str());
    e->steps++;
    launch(e, in, logits_len, fail_this_step(e));
  });
}

int32_t gollm_wait(gollm_engine* e, gollm_step_out* out, gollm_status* status) {
  return guarded(status, [&] { wait_step(e, out); });
}

int32_t gollm_engine_reset(gollm_engine* e, gollm_status* status) {
  return guarded(status, [&] { reset_engine(e); });
}

int32_t gollm_device_describe(int32_t device, gollm_device_info* out, gollm_status* status) {
  return guarded(status, [&] { device_info(device, out); });
}

int64_t gollm_weights_bytes(const gollm_weights* w) { return w ? (int64_t)w->arena.bytes : 0; }

void gollm_engine_destroy(gollm_engine* e) {
  try {
    destroy_engine(e);
  } catch (...) {
  }
}

int32_t gollm_nccl_describe(const char* nccl_lib, gollm_nccl_info* out, gollm_status* status) {
  return guarded(status, [&] { nccl_describe(nccl_lib, out); });
}

int32_t gollm_comm_create_all(int32_t n, const int32_t* devices, const char* nccl_lib,
                              gollm_comm** out, gollm_status* status) {
  return guarded(status, [&] { create_comm(n, devices, nccl_lib, out); });
}

int32_t gollm_comm_abort(gollm_comm* comm, const char* cause, gollm_status* status) {
  return guarded(status, [&] { abort_comm(comm, cause); });
}

void gollm_comm_release(gollm_comm* comm) {
  try {
    release_comm(comm);
  } catch (...) {
  }
}

}  // extern "C"

// shim.c — see shim.h.
#include "shim.h"

#include <dlfcn.h>
#include <stdlib.h>

// gn_lib holds the library's entry points; an absent optional one is NULL.
typedef struct {
  void* h;
  int (*init)(void);
  int (*shutdown)(void);
  const char* (*error_string)(int);
  int (*by_uuid)(const char*, gn_device*);
  int (*name)(gn_device, char*, unsigned int);
  int (*memory)(gn_device, gn_memory*);
  int (*utilization)(gn_device, gn_utilization*);
  int (*power)(gn_device, unsigned int*);
  int (*temperature)(gn_device, int, unsigned int*);
  int (*processes)(gn_device, unsigned int*, gn_process*);
  int (*process_name)(unsigned int, char*, unsigned int);
} gn_lib;

// NVML's codes for a missing function and an unsupported query.
enum { GN_NOT_SUPPORTED = 3, GN_FUNCTION_NOT_FOUND = 13 };

void* gn_open(const char* path, const char** err, int* code) {
  *code = 0;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    *err = dlerror();
    return NULL;
  }
  gn_lib* l = calloc(1, sizeof *l);
  if (!l) {
    *err = "out of memory";
    return NULL;
  }
  l->h = h;
#define SYM(f, name) *(void**)(&l->f) = dlsym(h, name)
  SYM(init, "nvmlInit_v2");
  SYM(shutdown, "nvmlShutdown");
  SYM(error_string, "nvmlErrorString");
  SYM(by_uuid, "nvmlDeviceGetHandleByUUID");
  SYM(name, "nvmlDeviceGetName");
  SYM(memory, "nvmlDeviceGetMemoryInfo");
  SYM(utilization, "nvmlDeviceGetUtilizationRates");
  SYM(power, "nvmlDeviceGetPowerUsage");
  SYM(temperature, "nvmlDeviceGetTemperature");
  SYM(processes, "nvmlDeviceGetComputeRunningProcesses_v3");
  SYM(process_name, "nvmlSystemGetProcessName");
#undef SYM
  if (!l->init || !l->shutdown || !l->by_uuid || !l->memory) {
    *err = "the library lacks nvmlInit_v2, nvmlShutdown, nvmlDeviceGetHandleByUUID or nvmlDeviceGetMemoryInfo";
    dlclose(h);
    free(l);
    return NULL;
  }
  int rc = l->init();
  if (rc != 0) {
    *code = rc;
    *err = l->error_string ? l->error_string(rc) : "nvmlInit_v2 failed";
    dlclose(h);
    free(l);
    return NULL;
  }
  return l;
}

int gn_close(void* lib) {
  gn_lib* l = lib;
  int rc = l->shutdown();
  dlclose(l->h);
  free(l);
  return rc;
}

const char* gn_error(void* lib, int code) {
  gn_lib* l = lib;
  return l->error_string ? l->error_string(code) : "NVML error";
}

int gn_device_by_uuid(void* lib, const char* uuid, gn_device* dev) { return ((gn_lib*)lib)->by_uuid(uuid, dev); }

int gn_device_name(void* lib, gn_device dev, char* name, unsigned int len) {
  gn_lib* l = lib;
  return l->name ? l->name(dev, name, len) : GN_FUNCTION_NOT_FOUND;
}

int gn_memory_info(void* lib, gn_device dev, gn_memory* m) { return ((gn_lib*)lib)->memory(dev, m); }

int gn_utilization_rates(void* lib, gn_device dev, gn_utilization* u) {
  gn_lib* l = lib;
  return l->utilization ? l->utilization(dev, u) : GN_FUNCTION_NOT_FOUND;
}

int gn_power_usage(void* lib, gn_device dev, unsigned int* mw) {
  gn_lib* l = lib;
  return l->power ? l->power(dev, mw) : GN_FUNCTION_NOT_FOUND;
}

int gn_temperature(void* lib, gn_device dev, unsigned int* c) {
  gn_lib* l = lib;
  return l->temperature ? l->temperature(dev, 0 /* NVML_TEMPERATURE_GPU */, c) : GN_FUNCTION_NOT_FOUND;
}

int gn_processes(void* lib, gn_device dev, unsigned int* count, gn_process* infos) {
  gn_lib* l = lib;
  return l->processes ? l->processes(dev, count, infos) : GN_FUNCTION_NOT_FOUND;
}

int gn_process_name(void* lib, unsigned int pid, char* name, unsigned int len) {
  gn_lib* l = lib;
  return l->process_name ? l->process_name(pid, name, len) : GN_FUNCTION_NOT_FOUND;
}

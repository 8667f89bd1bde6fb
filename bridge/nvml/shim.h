// shim.h — the few NVML functions gollm reads, called through pointers that dlsym
// returns: libnvidia-ml.so.1 is opened at run time, never linked, because tritonserver
// opens backends with RTLD_NOW, so a symbol left for the loader would stop the backend
// from loading on a machine without the driver. The types follow nvml.h's ABI.
#ifndef GOLLM_BRIDGE_NVML_SHIM_H
#define GOLLM_BRIDGE_NVML_SHIM_H

#include <stdint.h>

typedef void* gn_device;

// gn_memory is nvmlMemory_t.
typedef struct {
  unsigned long long total, free, used;
} gn_memory;

// gn_utilization is nvmlUtilization_t.
typedef struct {
  unsigned int gpu, memory;
} gn_utilization;

// gn_process is nvmlProcessInfo_t (v2, as nvmlDeviceGetComputeRunningProcesses_v3 fills).
typedef struct {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
} gn_process;

// gn_open opens the library at path and initializes NVML; it returns NULL and sets *err
// (a static string, or NVML's) when either fails.
void* gn_open(const char* path, const char** err, int* code);
// gn_close shuts NVML down and closes the library.
int gn_close(void* lib);
const char* gn_error(void* lib, int code);
int gn_device_by_uuid(void* lib, const char* uuid, gn_device* dev);
int gn_device_name(void* lib, gn_device dev, char* name, unsigned int len);
int gn_memory_info(void* lib, gn_device dev, gn_memory* m);
int gn_utilization_rates(void* lib, gn_device dev, gn_utilization* u);
int gn_power_usage(void* lib, gn_device dev, unsigned int* mw);
int gn_temperature(void* lib, gn_device dev, unsigned int* c);
int gn_processes(void* lib, gn_device dev, unsigned int* count, gn_process* infos);
int gn_process_name(void* lib, unsigned int pid, char* name, unsigned int len);

#endif

// A stand-in for libnvidia-ml.so.1 with one GPU, for testing the bridge without a driver.
#include <stdio.h>
#include <string.h>

typedef void* dev_t_;
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_t;

static int inits;
static int the_device;

int nvmlInit_v2(void) { inits++; return 0; }
int nvmlShutdown(void) { return inits-- > 0 ? 0 : 1; }
const char* nvmlErrorString(int rc) {
  switch (rc) {
    case 3: return "Not Supported";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
  }
  return "Unknown Error";
}
int nvmlDeviceGetHandleByUUID(const char* uuid, dev_t_* d) {
  if (strcmp(uuid, "GPU-00000000-1111-2222-3333-444444444444") != 0) return 6;
  *d = &the_device;
  return 0;
}
int nvmlDeviceGetName(dev_t_ d, char* name, unsigned int len) {
  snprintf(name, len, "Fake GPU 80GB");
  return 0;
}
int nvmlDeviceGetMemoryInfo(dev_t_ d, mem_t* m) {
  m->total = 80ull << 30;
  m->used = 30ull << 30;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetUtilizationRates(dev_t_ d, util_t* u) {
  u->gpu = 42;
  u->memory = 7;
  return 0;
}
int nvmlDeviceGetPowerUsage(dev_t_ d, unsigned int* mw) { return 3; /* not supported */ }
int nvmlDeviceGetTemperature(dev_t_ d, int sensor, unsigned int* c) {
  *c = 51;
  return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(dev_t_ d, unsigned int* count, proc_t* infos) {
  if (*count < 2) {
    *count = 2;
    return 7;
  }
  *count = 2;
  infos[0] = (proc_t){1234, 20ull << 30, 0, 0};
  infos[1] = (proc_t){5678, ~0ull, 0, 0};
  return 0;
}
int nvmlSystemGetProcessName(unsigned int pid, char* name, unsigned int len) {
  snprintf(name, len, pid == 1234 ? "tritonserver" : "python3");
  return 0;
}

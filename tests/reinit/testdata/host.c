// host.c plays tritonserver's part for libtriton_gollm.so's backend-level entry points,
// so that reinit_test.go can show what tritonserver 2.51 never does in our runs: the
// library dlclosed after TRITONBACKEND_Finalize and loaded and initialized again. A Go
// runtime cannot be unloaded from a process, so the backend is linked with -z nodelete;
// this program checks that dlclose leaves it mapped and that a second
// TRITONBACKEND_Initialize works. It runs as its own process (one Go runtime per
// process: the test binary never loads the backend).
//
// Usage: host LIBRARY ROUND...   where each ROUND is "BACKEND_API,SERVER_API", the API
// versions this host reports in that round, for example "1.19,1.34".
// Each round: dlopen → TRITONBACKEND_Initialize → TRITONBACKEND_Finalize (also after a
// failed Initialize, as Triton's TritonBackend destructor does) → dlclose. Results go to
// stdout, one "round N: ..." line per step; the backend's log goes to stderr. The last
// line is "reinit ok" when every round kept the library mapped, found the entry points
// at the same addresses, left no Triton error or metric family undeleted and called no
// stub; otherwise the program prints "FAIL: ..." and exits 1.
//
// The backend resolves every Triton function it uses with dlsym(RTLD_DEFAULT) (see
// bridge/triton/api.h); built with -rdynamic, this executable exports them. Only the
// functions Initialize and Finalize call are implemented; the rest are stubs that
// return an error, and calling one fails the run.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Values of TRITONSERVER_Error_Code and TRITONSERVER_LogLevel used here.
enum { CODE_UNSUPPORTED = 5 };
enum { LOG_INFO = 0, LOG_WARN = 1, LOG_ERROR = 2, LOG_VERBOSE = 3 };

// Error is this host's TRITONSERVER_Error.
typedef struct Error {
  int code;
  char* msg;
} Error;

// Backend is this host's TRITONBACKEND_Backend.
typedef struct Backend {
  const char* name;
} Backend;

static Backend backend = {"gollm"};
// The API versions reported in the current round.
static uint32_t backend_major, backend_minor, server_major, server_minor;
// Leak and misuse counters, checked after every round.
static int live_errors, live_families, families_made, live_metrics, stub_calls;

Error* TRITONSERVER_ErrorNew(int code, const char* msg) {
  Error* e = malloc(sizeof *e);
  e->code = code;
  e->msg = strdup(msg);
  live_errors++;
  return e;
}

void TRITONSERVER_ErrorDelete(Error* e) {
  if (e == NULL) return;
  free(e->msg);
  free(e);
  live_errors--;
}

int TRITONSERVER_ErrorCode(Error* e) { return e->code; }

const char* TRITONSERVER_ErrorMessage(Error* e) { return e->msg; }

Error* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor) {
  *major = backend_major;
  *minor = backend_minor;
  return NULL;
}

Error* TRITONSERVER_ApiVersion(uint32_t* major, uint32_t* minor) {
  *major = server_major;
  *minor = server_minor;
  return NULL;
}

Error* TRITONBACKEND_BackendName(Backend* b, const char** name) {
  if (b != &backend) return TRITONSERVER_ErrorNew(3, "BackendName: not the host's backend object");
  *name = b->name;
  return NULL;
}

bool TRITONSERVER_LogIsEnabled(int level) { return level != LOG_VERBOSE; }

Error* TRITONSERVER_LogMessage(int level, const char* file, int line, const char* msg) {
  static const char tag[] = "IWEV";
  fprintf(stderr, "%c %s:%d] %s\n", level >= 0 && level <= 3 ? tag[level] : '?', file, line, msg);
  return NULL;
}

// A metric family is a heap object, so that a double delete or a leak shows.
Error* TRITONSERVER_MetricFamilyNew(void** family, int kind, const char* name,
                                    const char* description) {
  (void)kind;
  (void)description;
  *family = strdup(name);
  live_families++;
  families_made++;
  return NULL;
}

Error* TRITONSERVER_MetricFamilyDelete(void* family) {
  free(family);
  live_families--;
  return NULL;
}

// A metric is a heap object too: the process-wide gauges (gollm_go_heap_bytes, …) are
// made at Initialize, set every second and deleted at Finalize.
Error* TRITONSERVER_MetricNew(void** metric, void* family, const void* labels, uint64_t count) {
  (void)labels;
  (void)count;
  if (family == NULL) return TRITONSERVER_ErrorNew(3, "MetricNew: no family");
  *metric = malloc(1);
  live_metrics++;
  return NULL;
}

Error* TRITONSERVER_MetricDelete(void* metric) {
  free(metric);
  live_metrics--;
  return NULL;
}

Error* TRITONSERVER_MetricSet(void* metric, double value) {
  (void)value;
  if (metric == NULL) return TRITONSERVER_ErrorNew(3, "MetricSet: no metric");
  return NULL;
}

// The stubs: only their addresses matter (the backend resolves all of them at
// Initialize). Their parameters are left out; calling one is a failure anyway.
#define STUB(name)                                                            \
  Error* name(void) {                                                         \
    stub_calls++;                                                             \
    fprintf(stderr, "host: the backend called %s\n", #name);                  \
    return TRITONSERVER_ErrorNew(CODE_UNSUPPORTED, #name ": not implemented in the test host"); \
  }
STUB(TRITONSERVER_MessageSerializeToJson)
STUB(TRITONSERVER_MessageDelete)
STUB(TRITONBACKEND_ModelName)
STUB(TRITONBACKEND_ModelVersion)
STUB(TRITONBACKEND_ModelRepository)
STUB(TRITONBACKEND_ModelConfig)
STUB(TRITONBACKEND_ModelServer)
STUB(TRITONSERVER_ServerIsLive)
STUB(TRITONSERVER_ServerModelIsReady)
STUB(TRITONBACKEND_ModelState)
STUB(TRITONBACKEND_ModelSetState)
STUB(TRITONBACKEND_ModelInstanceName)
STUB(TRITONBACKEND_ModelInstanceKind)
STUB(TRITONBACKEND_ModelInstanceDeviceId)
STUB(TRITONBACKEND_ModelInstanceModel)
STUB(TRITONBACKEND_ModelInstanceState)
STUB(TRITONBACKEND_ModelInstanceSetState)
STUB(TRITONBACKEND_ModelInstanceReportStatistics)
STUB(TRITONBACKEND_ModelInstanceReportBatchStatistics)
STUB(TRITONBACKEND_RequestId)
STUB(TRITONBACKEND_RequestInputCount)
STUB(TRITONBACKEND_RequestInputByIndex)
STUB(TRITONBACKEND_InputProperties)
STUB(TRITONBACKEND_InputBuffer)
STUB(TRITONBACKEND_RequestOutputCount)
STUB(TRITONBACKEND_RequestOutputName)
STUB(TRITONBACKEND_RequestRelease)
STUB(TRITONBACKEND_ResponseFactoryNew)
STUB(TRITONBACKEND_ResponseFactoryDelete)
STUB(TRITONBACKEND_ResponseFactorySendFlags)
STUB(TRITONBACKEND_ResponseFactoryIsCancelled)
STUB(TRITONBACKEND_ResponseNew)
STUB(TRITONBACKEND_ResponseNewFromFactory)
STUB(TRITONBACKEND_ResponseDelete)
STUB(TRITONBACKEND_ResponseOutput)
STUB(TRITONBACKEND_OutputBuffer)
STUB(TRITONBACKEND_ResponseSend)
STUB(TRITONSERVER_MetricIncrement)
#undef STUB

void* TRITONSERVER_ParameterNew(void) {
  stub_calls++;
  fprintf(stderr, "host: the backend called TRITONSERVER_ParameterNew\n");
  return NULL;
}

void TRITONSERVER_ParameterDelete(void) {
  stub_calls++;
  fprintf(stderr, "host: the backend called TRITONSERVER_ParameterDelete\n");
}

static int fail(const char* what) {
  printf("FAIL: %s\n", what);
  return 1;
}

// mappings counts the lines of /proc/self/maps that map path.
static int mappings(const char* path) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (f == NULL) return -1;
  char line[4096];
  int n = 0;
  size_t len = strlen(path);
  while (fgets(line, sizeof line, f) != NULL) {
    char* nl = strchr(line, '\n');
    if (nl != NULL) *nl = '\0';
    size_t l = strlen(line);
    if (l >= len && strcmp(line + l - len, path) == 0) n++;
  }
  fclose(f);
  return n;
}

typedef Error* (*BackendFn)(Backend*);

int main(int argc, char** argv) {
  // Unbuffered, so that the lines written before a crash still reach the test.
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc < 3) {
    fprintf(stderr, "usage: %s LIBRARY BACKEND_API,SERVER_API...\n", argv[0]);
    return 2;
  }
  // /proc/self/maps names the file by its real path.
  char* lib = realpath(argv[1], NULL);
  if (lib == NULL) return fail("the library does not exist");
  if (mappings(lib) != 0) return fail("the library is mapped before the first dlopen");
  void* first_init = NULL;
  for (int r = 1; r < argc - 1; r++) {
    if (sscanf(argv[r + 1], "%u.%u,%u.%u", &backend_major, &backend_minor, &server_major,
               &server_minor) != 4) {
      return fail("a round is not BACKEND_API,SERVER_API");
    }
    families_made = 0;
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
      printf("FAIL: dlopen: %s\n", dlerror());
      return 1;
    }
    BackendFn init = (BackendFn)dlsym(h, "TRITONBACKEND_Initialize");
    BackendFn fini = (BackendFn)dlsym(h, "TRITONBACKEND_Finalize");
    if (init == NULL || fini == NULL) return fail("the library lacks Initialize or Finalize");
    // The same address every round: the code (and the Go runtime) never moved.
    if (first_init == NULL) first_init = (void*)init;
    if ((void*)init != first_init) return fail("TRITONBACKEND_Initialize moved: the library was unloaded");

    Error* err = init(&backend);
    if (err == NULL) {
      printf("round %d: initialize: ok (%d metric families)\n", r, families_made);
    } else {
      printf("round %d: initialize: error %d: %s\n", r, err->code, err->msg);
      TRITONSERVER_ErrorDelete(err);
    }
    err = fini(&backend);
    if (err != NULL) {
      printf("round %d: finalize: error %d: %s\n", r, err->code, err->msg);
      TRITONSERVER_ErrorDelete(err);
      return fail("TRITONBACKEND_Finalize failed");
    }
    printf("round %d: finalize: ok\n", r);

    if (dlclose(h) != 0) {
      printf("FAIL: dlclose: %s\n", dlerror());
      return 1;
    }
    int n = mappings(lib);
    if (n <= 0) return fail("the library is unmapped after dlclose (is it linked with -z nodelete?)");
    printf("round %d: dlclose: still mapped (%d mappings)\n", r, n);
    if (live_errors != 0) return fail("Triton errors were not deleted");
    if (live_families != 0) return fail("metric families were not deleted");
    if (live_metrics != 0) return fail("metrics were not deleted");
    if (stub_calls != 0) return fail("the backend called a function the host only stubs");
  }
  printf("reinit ok\n");
  free(lib);
  return 0;
}

package triton

/*
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

// gt_live counts the backend's model instances between their initialize and finalize.
static atomic_int gt_live;
// gt_guarded is set once the exit handler is registered.
static atomic_flag gt_guarded = ATOMIC_FLAG_INIT;

// gt_on_exit runs first among exit's handlers (it was registered after the libraries'
// static objects). With an instance still loaded the process is exiting under the
// backend's running threads, so it ends the process with exit's status now, before the
// destructors of Triton's objects run while those threads may still use them.
static void gt_on_exit(int status, void* arg) {
  (void)arg;
  int live = atomic_load(&gt_live);
  if (live == 0) return;
  fprintf(stderr,
          "gollm: the process is exiting (status %d) with %d model instance(s) still loaded, as "
          "when tritonserver's exit timeout expires; it ends now, without running exit's "
          "destructors under the backend's threads\n",
          status, live);
  fflush(NULL);
  _exit(status);
}

static void gt_exit_guard(void) {
  if (!atomic_flag_test_and_set(&gt_guarded)) on_exit(gt_on_exit, NULL);
}

static void gt_live_add(int d) { atomic_fetch_add(&gt_live, d); }
*/
import "C"

// GuardExit makes a process exit with model instances still loaded end at once, with
// exit's status, instead of running exit's destructors: tritonserver calls exit(1) when
// its exit timeout expires with models still loaded ("Exit timeout expired. Exiting
// immediately."), and destroying its objects while the backend's goroutines (and its own
// threads) still send responses through them corrupts the heap. A normal exit, after
// every instance is finalized, is untouched. Calling it again is harmless.
func GuardExit() { C.gt_exit_guard() }

// InstanceLoaded counts a model instance as loaded, for GuardExit.
func InstanceLoaded() { C.gt_live_add(1) }

// InstanceUnloaded counts a model instance as finalized, for GuardExit.
func InstanceUnloaded() { C.gt_live_add(-1) }

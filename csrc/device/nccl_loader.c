/* nccl_loader.c — finds NCCL at run time with dlopen, so that nothing links
 * against it and a machine without it still runs (on the host-staged path). */
#include "device/nccl_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int tried;
static void *handle;
static ruccl_nccl_api_t api;
static int loaded_version;
static char reason[320];

static void *open_library(char *from, size_t cap) {
  const char *env = getenv("RUCCL_NCCL_LIBRARY");
  if (env && *env) {
    snprintf(from, cap, "%s (RUCCL_NCCL_LIBRARY)", env);
    void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(reason, sizeof reason, "RUCCL_NCCL_LIBRARY=%s cannot be loaded: %s", env, dlerror());
    return h;
  }
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (h) {
    snprintf(from, cap, "libnccl.so.2, already loaded in this process");
    return h;
  }
  h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h) snprintf(from, cap, "libnccl.so.2");
  else snprintf(reason, sizeof reason, "libnccl.so.2 was not found: %s", dlerror());
  return h;
}

#define SYMBOL(field, name)                                                              \
  do {                                                                                   \
    *(void **)&api.field = dlsym(handle, name);                                          \
    if (!api.field && required) {                                                        \
      snprintf(reason, sizeof reason, "%s has no %s", from, name);                       \
      return 0;                                                                          \
    }                                                                                    \
  } while (0)

static int bind_symbols(const char *from) {
  int required = 1;
  SYMBOL(get_version, "ncclGetVersion");
  SYMBOL(get_unique_id, "ncclGetUniqueId");
  SYMBOL(comm_init_rank_config, "ncclCommInitRankConfig");
  SYMBOL(comm_get_async_error, "ncclCommGetAsyncError");
  SYMBOL(comm_finalize, "ncclCommFinalize");
  SYMBOL(comm_destroy, "ncclCommDestroy");
  SYMBOL(comm_abort, "ncclCommAbort");
  SYMBOL(get_error_string, "ncclGetErrorString");
  SYMBOL(all_reduce, "ncclAllReduce");
  SYMBOL(broadcast, "ncclBroadcast");
  SYMBOL(reduce, "ncclReduce");
  SYMBOL(all_gather, "ncclAllGather");
  SYMBOL(reduce_scatter, "ncclReduceScatter");
  required = 0;
  SYMBOL(get_last_error, "ncclGetLastError");
  return 1;
}

static void load(void) {
  reason[0] = 0;
  const char *off = getenv("RUCCL_NCCL");
  if (off && strcmp(off, "0") == 0) {
    snprintf(reason, sizeof reason, "RUCCL_NCCL=0");
    return;
  }
  char from[300];
  handle = open_library(from, sizeof from);
  if (!handle) return;
  int version = 0;
  if (!bind_symbols(from) || api.get_version(&version) != RUCCL_NCCL_SUCCESS) {
    if (!reason[0]) snprintf(reason, sizeof reason, "%s: ncclGetVersion failed", from);
  } else if (version < RUCCL_NCCL_MIN_VERSION) {
    snprintf(reason, sizeof reason, "%s is NCCL %d.%d.%d; ruccl needs %d.%d or newer", from, version / 10000,
             version / 100 % 100, version % 100, RUCCL_NCCL_MIN_VERSION / 10000, RUCCL_NCCL_MIN_VERSION / 100 % 100);
  } else {
    loaded_version = version;
    ruccl_log(2, "NCCL %d.%d.%d from %s", version / 10000, version / 100 % 100, version % 100, from);
    return;
  }
  dlclose(handle);
  handle = NULL;
  memset(&api, 0, sizeof api);
}

const ruccl_nccl_api_t *ruccl_nccl(int *version) {
  pthread_mutex_lock(&mu);
  if (!tried) {
    tried = 1;
    load();
    if (!loaded_version) ruccl_log(2, "no NCCL (%s): device tensors on distinct GPUs go through host memory", reason);
  }
  const ruccl_nccl_api_t *out = loaded_version ? &api : NULL;
  if (version) *version = loaded_version;
  pthread_mutex_unlock(&mu);
  return out;
}

const char *ruccl_nccl_unavailable_reason(void) {
  ruccl_nccl(NULL);
  return reason;
}

ruccl_result_t ruccl_nccl_code(ruccl_nccl_result_t r) {
  switch (r) {
    case RUCCL_NCCL_SUCCESS:
    case RUCCL_NCCL_IN_PROGRESS: return RUCCL_OK;
    case RUCCL_NCCL_INVALID_ARGUMENT:
    case RUCCL_NCCL_INVALID_USAGE: return RUCCL_ERR_INVALID_ARGUMENT;
    case RUCCL_NCCL_REMOTE_ERROR: return RUCCL_ERR_PEER_LOST;
    case RUCCL_NCCL_UNHANDLED_CUDA_ERROR: return RUCCL_ERR_DEVICE;
    case RUCCL_NCCL_SYSTEM_ERROR: return RUCCL_ERR_IO;
    default: return RUCCL_ERR_PROTOCOL;
  }
}

void ruccl_nccl_unload(void) {
  pthread_mutex_lock(&mu);
  if (handle) dlclose(handle);
  handle = NULL;
  memset(&api, 0, sizeof api);
  loaded_version = 0;
  tried = 0;
  reason[0] = 0;
  pthread_mutex_unlock(&mu);
}

/* cpu_adapter.c — the adapter table and the CPU adapter: host memory as it is, every
 * operation done at once on the calling thread (streams are NULL). */
#include "device.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "testing.h"

static ruccl_result_t cpu_check(ruccl_device_t dev) {
  (void)dev;
  return RUCCL_OK;
}

static ruccl_result_t cpu_uuid(ruccl_device_t dev, ruccl_device_uuid_t *out) {
  (void)dev;
  memset(out, 0, sizeof *out);
  return RUCCL_OK;
}

static ruccl_result_t cpu_stream_create(ruccl_device_t dev, void **stream) {
  (void)dev;
  *stream = NULL;
  return RUCCL_OK;
}

static void cpu_stream_destroy(ruccl_device_t dev, void *stream) { (void)dev, (void)stream; }

static ruccl_result_t cpu_stream_wait(ruccl_device_t dev, void *stream, int64_t deadline_ns) {
  (void)dev, (void)stream, (void)deadline_ns;
  return RUCCL_OK;
}

static ruccl_result_t cpu_host_alloc(ruccl_device_t dev, size_t bytes, void **out) {
  (void)dev;
  *out = malloc(bytes ? bytes : 1);
  return *out ? RUCCL_OK : ruccl_fail(RUCCL_ERR_NO_MEMORY, "host buffer of %zu bytes", bytes);
}

static void cpu_host_free(ruccl_device_t dev, void *p) {
  (void)dev;
  free(p);
}

static ruccl_result_t cpu_copy(ruccl_device_t dev, void *stream, void *dst, const void *src, size_t bytes,
                               ruccl_copy_kind_t kind) {
  (void)dev, (void)stream, (void)kind;
  if (bytes && dst != src) memmove(dst, src, bytes);
  return RUCCL_OK;
}

static ruccl_result_t cpu_reduce(ruccl_device_t dev, void *stream, const ruccl_device_reduce_t *r) {
  (void)dev, (void)stream;
  ruccl_reduce_reference(r);
  return RUCCL_OK;
}

static ruccl_result_t cpu_enter(ruccl_device_t dev, int *saved) {
  (void)dev;
  *saved = 0;
  return RUCCL_OK;
}

static void cpu_leave(int saved) { (void)saved; }

#define CPU_FUNCTIONS                    \
  .check = cpu_check,                    \
  .uuid = cpu_uuid,                      \
  .stream_create = cpu_stream_create,    \
  .stream_destroy = cpu_stream_destroy,  \
  .stream_wait = cpu_stream_wait,        \
  .host_alloc = cpu_host_alloc,          \
  .host_free = cpu_host_free,            \
  .copy = cpu_copy,                      \
  .reduce = cpu_reduce,                  \
  .enter = cpu_enter,                    \
  .leave = cpu_leave

const ruccl_device_adapter_t ruccl_cpu_adapter = {.name = "cpu", .host_accessible = 1, CPU_FUNCTIONS};

/* The CPU adapter as if the host could not reach its memory: the tests of the
   host-staged path (ruccl_testing_pretend_devices(3)). */
static const ruccl_device_adapter_t cpu_staged_adapter = {.name = "cpu (staged, for tests)", .host_accessible = 0,
                                                          CPU_FUNCTIONS};

const ruccl_device_adapter_t *ruccl_device_adapter(ruccl_device_kind_t kind) {
  switch (kind) {
    case RUCCL_DEVICE_CPU: return ruccl_testing_pretended_devices() == 3 ? &cpu_staged_adapter : &ruccl_cpu_adapter;
#ifdef RUCCL_HAVE_CUDA
    case RUCCL_DEVICE_CUDA: return &ruccl_cuda_adapter;
#endif
    default: return NULL;
  }
}

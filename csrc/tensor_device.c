/* tensor_device.c — the adapter table and the CPU adapter (host memory as it is). */
#include "tensor_device.h"

#include <string.h>

#include "error.h"

static ruccl_result_t cpu_check(ruccl_device_t dev) {
  (void)dev;
  return RUCCL_OK;
}

static ruccl_result_t cpu_to_host(ruccl_device_t dev, void *host, const void *src, size_t bytes) {
  (void)dev;
  if (bytes && host != src) memcpy(host, src, bytes);
  return RUCCL_OK;
}

static ruccl_result_t cpu_from_host(ruccl_device_t dev, void *dst, const void *host, size_t bytes) {
  (void)dev;
  if (bytes && host != dst) memcpy(dst, host, bytes);
  return RUCCL_OK;
}

const ruccl_device_adapter_t ruccl_cpu_adapter = {
    .name = "cpu",
    .host_accessible = 1,
    .check = cpu_check,
    .to_host = cpu_to_host,
    .from_host = cpu_from_host,
};

const ruccl_device_adapter_t *ruccl_device_adapter(ruccl_device_kind_t kind) {
  switch (kind) {
    case RUCCL_DEVICE_CPU: return &ruccl_cpu_adapter;
#ifdef RUCCL_HAVE_CUDA
    case RUCCL_DEVICE_CUDA: return &ruccl_cuda_adapter;
#endif
    default: return NULL;
  }
}

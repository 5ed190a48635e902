/* tensor_device.h — the device adapters: how the core reaches a tensor's bytes.
 *
 * The CPU adapter's memory is the host's, so collectives work on it directly.  An
 * adapter whose memory the host cannot touch (CUDA) is host-staged: the core copies
 * the input to host memory, runs the collective there and copies the result back. */
#ifndef RUCCL_TENSOR_DEVICE_H
#define RUCCL_TENSOR_DEVICE_H

#include <stddef.h>

#include "ruccl.h"

typedef struct {
  const char *name;
  int host_accessible; /* the host may read and write the device pointer itself */
  /* RUCCL_OK when this device can be used by this process. */
  ruccl_result_t (*check)(ruccl_device_t dev);
  ruccl_result_t (*to_host)(ruccl_device_t dev, void *host, const void *device_ptr, size_t bytes);
  ruccl_result_t (*from_host)(ruccl_device_t dev, void *device_ptr, const void *host, size_t bytes);
} ruccl_device_adapter_t;

/* The adapter compiled in for this device kind, or NULL. */
const ruccl_device_adapter_t *ruccl_device_adapter(ruccl_device_kind_t kind);

extern const ruccl_device_adapter_t ruccl_cpu_adapter;
#ifdef RUCCL_HAVE_CUDA
extern const ruccl_device_adapter_t ruccl_cuda_adapter;
#endif

#endif

/* cuda_kernels.h — the CUDA adapter's device code (cuda_kernels.cu), callable from C. */
#ifndef RUCCL_CUDA_KERNELS_H
#define RUCCL_CUDA_KERNELS_H

#include "device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Queues the reduction r (device.h's semantics, bit for bit those of
   ruccl_reduce_reference) as one kernel on stream (a cudaStream_t) on the current
   device.  r is checked by the caller (1..RUCCL_DEVICE_REDUCE_MAX buffers each side);
   a launch error is RUCCL_ERR_DEVICE with CUDA's reason as the last error. */
ruccl_result_t ruccl_cuda_reduce_launch(const ruccl_device_reduce_t *r, void *stream);

/* The kernel's element code and dtype dispatch run on the host, over host buffers:
   for the tests, where no GPU is. */
void ruccl_cuda_reduce_on_host(const ruccl_device_reduce_t *r);

#ifdef __cplusplus
}
#endif

#endif

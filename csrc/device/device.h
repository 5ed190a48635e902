/* device.h — the device adapters: how the core reaches a tensor's memory.
 *
 * An adapter is one kind of device (cpu, cuda) seen through a small, asynchronous
 * interface: ordered streams of work, copies between the host and the device,
 * page-locked ("pinned") host memory for staging, and a reduction over the buffers
 * of several ranks that runs on the device itself.  The algorithms and transports
 * never see a device: they move and reduce host buffers.  The rank core uses an
 * adapter to stage a tensor into host memory and back (host-staged path), or to
 * reduce the buffers of ranks that share one device in place (same-device path).
 *
 * The CPU adapter does everything at once on the calling thread; its streams are
 * NULL.  The CUDA adapter (built with RUCCL_CUDA) queues work on CUDA streams; a
 * caller waits with stream_wait before it reads a result on the host. */
#ifndef RUCCL_DEVICE_H
#define RUCCL_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "ruccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What identifies a device across processes: the same value on every process
   that sees the same device (a GPU's UUID; all zero for the host). */
typedef struct {
  uint8_t bytes[16];
} ruccl_device_uuid_t;

typedef enum { RUCCL_COPY_TO_HOST, RUCCL_COPY_FROM_HOST, RUCCL_COPY_ON_DEVICE } ruccl_copy_kind_t;

/* At most this many buffers on each side of one device reduction. */
#define RUCCL_DEVICE_REDUCE_MAX 64

/* One reduction on a device: for every element i,
 *   acc = srcs[0][i] op srcs[1][i] op ... (in that order, in the compute dtype
 *         ruccl_compute_dtype(dtype, divisor ? MEAN : op)),
 *   acc = acc / divisor when divisor is non-zero (MEAN),
 *   dsts[d][i] = acc rounded once to dtype, for every d.
 * A dst may be one of the srcs (in place): every element is read from every
 * source before it is written. */
typedef struct {
  void *dsts[RUCCL_DEVICE_REDUCE_MAX];
  const void *srcs[RUCCL_DEVICE_REDUCE_MAX];
  unsigned ndst, nsrc; /* 1..RUCCL_DEVICE_REDUCE_MAX each */
  size_t count;        /* elements of every buffer */
  ruccl_dtype_t dtype; /* storage dtype of every buffer */
  ruccl_reduce_op_t op; /* SUM, MIN, MAX or PROD (MEAN is SUM with a divisor) */
  unsigned divisor;
} ruccl_device_reduce_t;

typedef struct ruccl_device_adapter {
  const char *name;
  int host_accessible; /* the host may read and write the device's pointers itself */
  /* RUCCL_OK when this process can use the device (RUCCL_ERR_DEVICE and a last
     error that says why otherwise). */
  ruccl_result_t (*check)(ruccl_device_t dev);
  ruccl_result_t (*uuid)(ruccl_device_t dev, ruccl_device_uuid_t *out);
  /* An ordered queue of work on dev (NULL where the adapter works synchronously). */
  ruccl_result_t (*stream_create)(ruccl_device_t dev, void **stream);
  void (*stream_destroy)(ruccl_device_t dev, void *stream);
  /* Blocks until everything queued on the stream is done: RUCCL_OK, the device's
     error (RUCCL_ERR_DEVICE), or RUCCL_ERR_TIMEOUT at deadline_ns (ruccl_now_ns
     clock; 0 = no deadline). */
  ruccl_result_t (*stream_wait)(ruccl_device_t dev, void *stream, int64_t deadline_ns);
  /* Page-locked host memory that the device copies to and from asynchronously. */
  ruccl_result_t (*host_alloc)(ruccl_device_t dev, size_t bytes, void **out);
  void (*host_free)(ruccl_device_t dev, void *p);
  /* Queues a copy of `bytes` on the stream (kind says which side each pointer is on). */
  ruccl_result_t (*copy)(ruccl_device_t dev, void *stream, void *dst, const void *src, size_t bytes,
                         ruccl_copy_kind_t kind);
  /* Queues one reduction over device buffers on the stream. */
  ruccl_result_t (*reduce)(ruccl_device_t dev, void *stream, const ruccl_device_reduce_t *r);
  /* Every function above leaves the calling thread's current device as it was.
     enter makes dev current for work outside the adapter (NCCL's calls take the
     current device), and leave gives back what enter saved. */
  ruccl_result_t (*enter)(ruccl_device_t dev, int *saved);
  void (*leave)(int saved);
} ruccl_device_adapter_t;

/* The adapter compiled in for this device kind, or NULL. */
const ruccl_device_adapter_t *ruccl_device_adapter(ruccl_device_kind_t kind);

extern const ruccl_device_adapter_t ruccl_cpu_adapter;
#ifdef RUCCL_HAVE_CUDA
extern const ruccl_device_adapter_t ruccl_cuda_adapter;
#endif

/* The reduction above computed on the host, element by element, through the same
   operator code as the CUDA kernels (reduce_ops.h): the CPU adapter's reduce and
   the reference the kernels are checked against. */
void ruccl_reduce_reference(const ruccl_device_reduce_t *r);

#ifdef __cplusplus
}
#endif

#endif

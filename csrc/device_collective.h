/* device_collective.h — the rank core's device paths (device/path.h): the whole
 * collective as one device operation when every peer shares one device, and NCCL
 * when each has its own GPU.  agreement.c agrees on the call first. */
#ifndef RUCCL_DEVICE_COLLECTIVE_H
#define RUCCL_DEVICE_COLLECTIVE_H

#include <stdint.h>

#include "agreement.h"
#include "collective.h"
#include "device/nccl_api.h"
#include "rank.h"


/* What one agreed call moves: elements of each peer's block, storage dtype, the op
   (MEAN kept as such), the root's or sender's global index. */
typedef struct {
  ruccl_coll_kind_t kind;
  ruccl_device_t device;
  ruccl_dtype_t dtype;
  size_t count; /* all_gather: of the input; reduce_scatter: of the output; else of the tensor */
  ruccl_reduce_op_t op;
  unsigned root;
} ruccl_device_call_t;

/* Same device: the node's peer at local index 0 runs the collective over every
   peer's buffers (ptrs by global index; given there only) on its stream, waits for
   it within the deadline and sends each other local peer the outcome; every peer
   returns the same code. */
ruccl_result_t ruccl_same_device_run(ruccl_comm_t *c, const ruccl_team_t *local, const ruccl_device_call_t *call,
                                     const ruccl_buffer_ptrs_t *ptrs, int64_t deadline_ns);

/* NCCL.  connect: this peer's NCCL communicator (rank = its global index) from the
   unique id the judge made, non-blocking, within the deadline.  launch: queues the
   call on the comm's stream (MEAN as a sum).  wait:
   until the device is done, NCCL reports an error, or the deadline (then the NCCL
   communicator is aborted).  abort: this peer's NCCL communicator, now.  release: at
   finish (finalize, then destroy; abort if that does not complete in time). */
ruccl_result_t ruccl_nccl_connect(ruccl_comm_t *c, const ruccl_nccl_unique_id_t *id, ruccl_device_t dev,
                                  int64_t deadline_ns);
ruccl_result_t ruccl_nccl_launch(ruccl_comm_t *c, const ruccl_device_call_t *call, const void *in, void *out);
ruccl_result_t ruccl_nccl_wait(ruccl_comm_t *c, ruccl_device_t dev, int64_t deadline_ns);
/* MEAN: the sum NCCL made, divided once on the device (the division ruCCL's other
   paths make), after wait. */
ruccl_result_t ruccl_nccl_divide(ruccl_comm_t *c, const ruccl_device_call_t *call, void *out, int64_t deadline_ns);
void ruccl_nccl_abort(ruccl_comm_t *c);
void ruccl_nccl_release(ruccl_comm_t *c);

#endif

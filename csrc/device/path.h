/* path.h — which of the data paths a collective takes, decided by the judge of the
 * agreement from every participant's facts, so that all of them take the same one.
 *
 *   HOST         every tensor is in host memory: the algorithms work on it directly.
 *   SAME_DEVICE  every participant is a logical rank of one process on one device:
 *                one device reduction over all their buffers, no host round trip.
 *   NCCL         every participant has its own GPU and the same usable NCCL: ruCCL
 *                agrees on the call, then NCCL moves the data on the devices.
 *   HOST_STAGED  everything else (several processes on one GPU, which NCCL refuses;
 *                no NCCL; tensors on different kinds of device): device -> pinned
 *                host memory -> the shm/TCP transports -> device. */
#ifndef RUCCL_PATH_H
#define RUCCL_PATH_H

#include <stddef.h>
#include <stdint.h>

#include "device/device.h"

typedef enum { RUCCL_PATH_HOST, RUCCL_PATH_HOST_STAGED, RUCCL_PATH_SAME_DEVICE, RUCCL_PATH_NCCL } ruccl_path_t;

#define RUCCL_PATH_MIXED_DEVICES (-1) /* device_kind of a call whose tensors are on different devices */

typedef struct {
  int32_t device_kind;      /* ruccl_device_kind_t of the call's tensors, or RUCCL_PATH_MIXED_DEVICES */
  ruccl_device_uuid_t uuid; /* of that device */
  uint32_t process;         /* the node index: a node's peers are threads of one process */
  int32_t nccl_version;     /* of the NCCL this process loaded; 0 = none */
} ruccl_path_facts_t;

/* facts[i] of participant i (peer order).  own_dtype: NCCL would compute the call as
   ruCCL does: it only moves data, or reduces in the tensors' own dtype, and not with
   float MIN/MAX (NCCL reduces float16 in float16 and int8 MEAN in int8, and its
   fmin/fmax drop a NaN, none of which is ruCCL's arithmetic).  wanted: a path asked for (RUCCL_PATH), taken
   where it can carry the call (NCCL instead of the same-device path for one rank, the
   host-staged path instead of either), else -1; the reason says when it could not.
   why: a short reason (cap bytes). */
ruccl_path_t ruccl_choose_path(const ruccl_path_facts_t *facts, unsigned n, int own_dtype, int wanted, char *why,
                               size_t cap);
const char *ruccl_path_name(ruccl_path_t path);
/* A path's name (or "auto": -1) as ruccl_choose_path's wanted; -2 for no path's name. */
int ruccl_path_parse(const char *name);

#endif

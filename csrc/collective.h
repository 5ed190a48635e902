/* collective.h — one collective call as the rank core sees it. */
#ifndef RUCCL_COLLECTIVE_H
#define RUCCL_COLLECTIVE_H

#include "ruccl.h"

typedef enum {
  RUCCL_COLL_ALL_REDUCE,
  RUCCL_COLL_BROADCAST,
  RUCCL_COLL_REDUCE,
  RUCCL_COLL_ALL_GATHER,
  RUCCL_COLL_REDUCE_SCATTER,
  RUCCL_COLL_BARRIER,
  RUCCL_COLL_NUM_KINDS
} ruccl_coll_kind_t;

typedef struct {
  ruccl_coll_kind_t kind;
  const ruccl_tensor_t *in; /* broadcast: the sender's tensor (NULL on receivers) */
  ruccl_tensor_t *out;      /* reduce: meaningful on the root only */
  ruccl_reduce_op_t op;
  uint32_t root_peer; /* reduce */
} ruccl_request_t;

/* Agrees with every participant on the call, then runs it.  Returns the same code
   on every participant for any disagreement, before any output is written. */
ruccl_result_t ruccl_collective_run(ruccl_comm_t *comm, const ruccl_request_t *req);

const char *ruccl_coll_kind_name(ruccl_coll_kind_t kind);

#endif

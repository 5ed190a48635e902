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
  uint32_t root_peer; /* reduce; broadcast when root_named */
  int root_named;     /* broadcast: root_peer sends `out` (ruccl_broadcast_from); in is unused */
} ruccl_call_t;

/* Whether each output element of a kind comes from the same element of the inputs
   (in and out have one size, the call can run in place or in slices). */
static inline int ruccl_coll_elementwise(int32_t kind) {
  return kind == RUCCL_COLL_ALL_REDUCE || kind == RUCCL_COLL_BROADCAST || kind == RUCCL_COLL_REDUCE;
}
/* Whether a kind of collective reduces (and so takes an op and a compute dtype). */
static inline int ruccl_coll_reduces(int32_t kind) {
  return kind == RUCCL_COLL_ALL_REDUCE || kind == RUCCL_COLL_REDUCE || kind == RUCCL_COLL_REDUCE_SCATTER;
}
static inline int64_t ruccl_numel(const ruccl_tensor_t *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

/* Agrees with every participant on the call, then runs it.  Returns the same code
   on every participant for any disagreement, before any output is written. */
ruccl_result_t ruccl_collective_run(ruccl_comm_t *comm, const ruccl_call_t *req);

const char *ruccl_coll_kind_name(ruccl_coll_kind_t kind);

/* Shared with the point-to-point calls (p2p.c). */
#define RUCCL_DETAIL_MAX 192
/* RUCCL_OK, or why t cannot take part (INVALID_ARGUMENT, UNSUPPORTED, DEVICE) in
   detail (RUCCL_DETAIL_MAX bytes). */
ruccl_result_t ruccl_check_tensor(const ruccl_tensor_t *t, const char *what, char *detail);
/* The global index of a peer id, or -1 when it is no participant. */
int ruccl_peer_index(const ruccl_comm_t *c, uint32_t id);

#endif

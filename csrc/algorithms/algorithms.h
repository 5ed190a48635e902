/* algorithms.h — the collective algorithms, each a sequence of team steps.
 *
 * Buffers are host memory of a compute dtype (see dtype.h); `count` is elements per
 * peer block.  src may equal dst (in place); inputs are never written otherwise.
 * `divisor` > 0 divides the reduced result once, on the peer that completes it, so
 * every peer receives the same bits.  scratch is a per-call buffer provider. */
#ifndef RUCCL_ALGORITHMS_H
#define RUCCL_ALGORITHMS_H

#include "transport.h"

typedef struct {
  void *(*get)(void *ctx, int slot, size_t bytes); /* NULL on allocation failure */
  void *ctx;
} ruccl_scratch_t;

typedef struct {
  const void *src;
  void *dst;
  size_t count;
  ruccl_dtype_t dtype; /* a compute dtype */
  ruccl_reduce_op_t op; /* SUM, MIN, MAX or PROD (MEAN is SUM with divisor) */
  unsigned divisor;
  unsigned root; /* team position, for rooted collectives */
  unsigned arity; /* tree only */
  ruccl_scratch_t scratch;
} ruccl_args_t;

typedef ruccl_result_t (*ruccl_algo_fn)(const ruccl_team_t *team, const ruccl_args_t *a);

/* One row per strategy: which function runs each collective. */
typedef struct {
  const char *name;
  ruccl_algo_fn all_reduce;     /* src, dst: count */
  ruccl_algo_fn broadcast;      /* src (root only), dst: count */
  ruccl_algo_fn reduce;         /* src: count; dst (root only): count */
  ruccl_algo_fn all_gather;     /* src: count; dst: n x count */
  ruccl_algo_fn reduce_scatter; /* src: n x count; dst: count */
} ruccl_algorithm_table_t;

extern const ruccl_algorithm_table_t ruccl_centralized_algorithms;
extern const ruccl_algorithm_table_t ruccl_tree_algorithms;
extern const ruccl_algorithm_table_t ruccl_ring_algorithms;

/* Helpers the algorithm files share (algo_common.c). */
size_t ruccl_args_elem(const ruccl_args_t *a);
/* dst = src (copy when they differ), then divided by divisor if set: the n == 1 case,
   and the root's own contribution. */
void ruccl_local_result(void *dst, const void *src, size_t count, ruccl_dtype_t dt, unsigned divisor);
/* Balanced split of count into n chunks: [begin, end) of chunk i. */
void ruccl_chunk(size_t count, unsigned n, unsigned i, size_t *begin, size_t *len);
/* Receive from `peer` and reduce into dst: dst = local op incoming (divided by
   divisor when non-zero). */
ruccl_result_t ruccl_recv_reduce(const ruccl_team_t *team, int peer, void *dst, const void *local, size_t count,
                                 const ruccl_args_t *a, unsigned divisor);

#endif

/* algo_internal.h — building blocks shared by the algorithm files (not a public
   interface of the core). */
#ifndef RUCCL_ALGO_INTERNAL_H
#define RUCCL_ALGO_INTERNAL_H

#include "algorithms.h"

/* Every peer's `count` elements to `root`, into dst blocks in team order. */
ruccl_result_t ruccl_algo_gather_to(const ruccl_team_t *t, unsigned root, const void *src, void *dst, size_t count,
                              size_t elem);
/* Block p of root's `full` to peer p's dst. */
ruccl_result_t ruccl_algo_scatter_from(const ruccl_team_t *t, unsigned root, const void *full, void *dst, size_t count,
                                 size_t elem);
/* Everyone sends src to root, which reduces in team order into acc (divisor applied
   with the last contribution). */
ruccl_result_t ruccl_algo_reduce_direct(const ruccl_team_t *t, unsigned root, const void *src, void *acc, size_t count,
                                  const ruccl_args_t *a);

#endif

/* centralized.c — the centralized strategy: every peer talks to one root, which
   reduces (or gathers) and sends the result back.  Fewest steps: the choice for
   small messages. */
#include "algo_internal.h"

static ruccl_result_t central_all_reduce(const ruccl_team_t *t, const ruccl_args_t *a) {
  size_t bytes = a->count * ruccl_args_elem(a);
  ruccl_result_t rc = ruccl_algo_reduce_direct(t, 0, a->src, a->dst, a->count, a);
  if (rc != RUCCL_OK) return rc;
  if (t->me == 0) return ruccl_team_send_all(t, a->dst, bytes);
  return ruccl_team_recv(t, 0, a->dst, bytes);
}

static ruccl_result_t central_broadcast(const ruccl_team_t *t, const ruccl_args_t *a) {
  size_t bytes = a->count * ruccl_args_elem(a);
  if (t->me != a->root) return ruccl_team_recv(t, (int)a->root, a->dst, bytes);
  ruccl_result_t rc = ruccl_team_send_all(t, a->src, bytes);
  if (rc == RUCCL_OK) ruccl_local_result(a->dst, a->src, a->count, a->dtype, 0);
  return rc;
}

static ruccl_result_t central_reduce(const ruccl_team_t *t, const ruccl_args_t *a) {
  return ruccl_algo_reduce_direct(t, a->root, a->src, a->dst, a->count, a);
}

static ruccl_result_t central_all_gather(const ruccl_team_t *t, const ruccl_args_t *a) {
  size_t elem = ruccl_args_elem(a);
  ruccl_result_t rc = ruccl_algo_gather_to(t, 0, a->src, a->dst, a->count, elem);
  if (rc != RUCCL_OK) return rc;
  size_t total = (size_t)t->n * a->count * elem;
  if (t->me == 0) return ruccl_team_send_all(t, a->dst, total);
  return ruccl_team_recv(t, 0, a->dst, total);
}

static ruccl_result_t central_reduce_scatter(const ruccl_team_t *t, const ruccl_args_t *a) {
  size_t elem = ruccl_args_elem(a);
  size_t total = (size_t)t->n * a->count;
  void *full = NULL;
  if (t->me == 0) {
    full = a->scratch.get(a->scratch.ctx, 0, total * elem);
    if (!full && total) return RUCCL_ERR_NO_MEMORY;
  }
  ruccl_result_t rc = ruccl_algo_reduce_direct(t, 0, a->src, full, total, a);
  if (rc != RUCCL_OK) return rc;
  return ruccl_algo_scatter_from(t, 0, full, a->dst, a->count, elem);
}

const ruccl_algorithm_table_t ruccl_centralized_algorithms = {
    .name = "centralized",
    .all_reduce = central_all_reduce,
    .broadcast = central_broadcast,
    .reduce = central_reduce,
    .all_gather = central_all_gather,
    .reduce_scatter = central_reduce_scatter,
};

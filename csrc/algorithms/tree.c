/* tree.c — the tree strategy (any arity k): reductions flow up a k-ary tree rooted
   at the collective's root, results flow down it.  Depth log_k(n): the choice for
   medium messages and many peers. */
#include "algo_internal.h"
#include "../error.h"

/* Tree positions are relative to the root: q = (me - root) mod n; the children of q
   are q*k+1 .. q*k+k, its parent (q-1)/k. */
static unsigned to_team(const ruccl_team_t *t, unsigned root, unsigned q) { return (q + root) % t->n; }

static ruccl_result_t tree_reduce_to(const ruccl_team_t *t, unsigned root, unsigned k, const void *src, void *acc,
                                     size_t count, const ruccl_args_t *a) {
  unsigned n = t->n, q = (t->me + n - root) % n;
  size_t first = (size_t)q * k + 1;
  size_t last = first + k; /* exclusive */
  if (last > n) last = n;
  if (first >= n) { /* leaf */
    if (q == 0) ruccl_local_result(acc, src, count, a->dtype, a->divisor);
    else return ruccl_team_send(t, (int)to_team(t, root, (q - 1) / k), src, count * ruccl_args_elem(a));
    return RUCCL_OK;
  }
  for (size_t c = first; c < last; c++) {
    unsigned divisor = (q == 0 && c == last - 1) ? a->divisor : 0;
    ruccl_result_t rc =
        ruccl_recv_reduce(t, (int)to_team(t, root, (unsigned)c), acc, c == first ? src : acc, count, a, divisor);
    if (rc != RUCCL_OK) return rc;
  }
  if (q == 0) return RUCCL_OK;
  return ruccl_team_send(t, (int)to_team(t, root, (q - 1) / k), acc, count * ruccl_args_elem(a));
}

/* Non-roots receive into buf; everyone forwards buf (the root: src) to its children. */
static ruccl_result_t tree_bcast_from(const ruccl_team_t *t, unsigned root, unsigned k, const void *src, void *buf,
                                      size_t bytes) {
  unsigned n = t->n, q = (t->me + n - root) % n;
  const void *from = src;
  if (q != 0) {
    ruccl_result_t rc = ruccl_team_recv(t, (int)to_team(t, root, (q - 1) / k), buf, bytes);
    if (rc != RUCCL_OK) return rc;
    from = buf;
  }
  size_t first = (size_t)q * k + 1;
  for (size_t c = first; c < first + k && c < n; c++) {
    ruccl_result_t rc = ruccl_team_send(t, (int)to_team(t, root, (unsigned)c), from, bytes);
    if (rc != RUCCL_OK) return rc;
  }
  return RUCCL_OK;
}

static ruccl_result_t tree_all_reduce(const ruccl_team_t *t, const ruccl_args_t *a) {
  ruccl_result_t rc = tree_reduce_to(t, 0, a->arity, a->src, a->dst, a->count, a);
  if (rc != RUCCL_OK) return rc;
  return tree_bcast_from(t, 0, a->arity, a->dst, a->dst, a->count * ruccl_args_elem(a));
}

static ruccl_result_t tree_broadcast(const ruccl_team_t *t, const ruccl_args_t *a) {
  ruccl_result_t rc = tree_bcast_from(t, a->root, a->arity, a->src, a->dst, a->count * ruccl_args_elem(a));
  if (rc == RUCCL_OK && t->me == a->root) ruccl_local_result(a->dst, a->src, a->count, a->dtype, 0);
  return rc;
}

static ruccl_result_t tree_reduce(const ruccl_team_t *t, const ruccl_args_t *a) {
  void *acc = a->dst;
  if (t->me != a->root) {
    acc = a->scratch.get(a->scratch.ctx, 0, a->count * ruccl_args_elem(a));
    if (!acc && a->count) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "tree reduce scratch");
  }
  return tree_reduce_to(t, a->root, a->arity, a->src, acc, a->count, a);
}

static ruccl_result_t tree_all_gather(const ruccl_team_t *t, const ruccl_args_t *a) {
  size_t elem = ruccl_args_elem(a);
  ruccl_result_t rc = ruccl_algo_gather_to(t, 0, a->src, a->dst, a->count, elem);
  if (rc != RUCCL_OK) return rc;
  return tree_bcast_from(t, 0, a->arity, a->dst, a->dst, (size_t)t->n * a->count * elem);
}

static ruccl_result_t tree_reduce_scatter(const ruccl_team_t *t, const ruccl_args_t *a) {
  size_t elem = ruccl_args_elem(a);
  size_t total = (size_t)t->n * a->count;
  void *full = a->scratch.get(a->scratch.ctx, 0, total * elem);
  if (!full && total) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "tree reduce-scatter scratch");
  ruccl_result_t rc = tree_reduce_to(t, 0, a->arity, a->src, full, total, a);
  if (rc != RUCCL_OK) return rc;
  return ruccl_algo_scatter_from(t, 0, full, a->dst, a->count, elem);
}

const ruccl_algorithm_table_t ruccl_tree_algorithms = {
    .name = "tree",
    .all_reduce = tree_all_reduce,
    .broadcast = tree_broadcast,
    .reduce = tree_reduce,
    .all_gather = tree_all_gather,
    .reduce_scatter = tree_reduce_scatter,
};

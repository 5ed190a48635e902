/* hierarchy.c — collectives across nodes: a local phase among this node's peers
 * (local strategy, in-process transport), a global phase among the node leaders
 * (local index 0 of each node; global strategy, TCP), and a local phase back.
 *
 * Peer order is ascending id across all nodes, and ids of different nodes may
 * interleave: the leaders exchange node-major blocks and permute them to and from
 * peer order.  MEAN divides once, in the global phase, by the number of peers of
 * all nodes; every result comes from one place and is copied, so all peers get the
 * same bits. */
#include "hierarchy.h"

#include <string.h>

#include "dtype.h"
#include "error.h"
#include "rank.h"

#define LEADER 0

static void *slot(ruccl_comm_t *c, int k, size_t bytes) { return ruccl_comm_scratch(c, k, bytes); }

/* The arguments of one phase that does not divide: every local phase, and the
   leaders' moves (broadcast, all-gather).  MEAN's division is the leaders' job. */
static ruccl_args_t phase_args(const ruccl_args_t *a, const void *src, void *dst, size_t count, unsigned root,
                               unsigned arity) {
  ruccl_args_t l = *a;
  l.src = src;
  l.dst = dst;
  l.count = count;
  l.root = root;
  l.divisor = 0;
  l.arity = arity;
  return l;
}

static ruccl_result_t hier_all_reduce(const ruccl_hier_t *h, const ruccl_args_t *a) {
  /* One peer per node (every torch process): no local phase, and the leaders'
     all-reduce reads the input where it is instead of after a copy into dst. */
  int alone = h->local_team->n == 1;
  ruccl_result_t rc = RUCCL_OK;
  if (!alone) {
    ruccl_args_t l = phase_args(a, a->src, a->dst, a->count, LEADER, h->local_arity);
    rc = h->local->reduce(h->local_team, &l);
  }
  if (rc == RUCCL_OK && h->net_team) {
    ruccl_args_t n = *a;
    n.src = alone ? a->src : a->dst;
    n.arity = h->global_arity;
    rc = h->global->all_reduce(h->net_team, &n);
  }
  if (alone) return rc;
  if (rc != RUCCL_OK) return rc;
  ruccl_args_t b = phase_args(a, a->dst, a->dst, a->count, LEADER, h->local_arity);
  return h->local->broadcast(h->local_team, &b);
}

static ruccl_result_t hier_broadcast(const ruccl_hier_t *h, const ruccl_args_t *a) {
  const ruccl_group_t *g = h->comm->group;
  unsigned root_node = g->node_of[a->root], root_local = g->local_of[a->root];
  ruccl_result_t rc = RUCCL_OK;
  if (g->node_index == root_node) {
    ruccl_args_t l = phase_args(a, a->src, a->dst, a->count, root_local, h->local_arity);
    rc = h->local->broadcast(h->local_team, &l);
    if (rc == RUCCL_OK && h->net_team) {
      ruccl_args_t n = phase_args(a, a->dst, a->dst, a->count, root_node, h->global_arity);
      rc = h->global->broadcast(h->net_team, &n);
    }
    return rc;
  }
  if (h->net_team) {
    ruccl_args_t n = phase_args(a, NULL, a->dst, a->count, root_node, h->global_arity);
    rc = h->global->broadcast(h->net_team, &n);
  }
  if (rc != RUCCL_OK) return rc;
  ruccl_args_t l = phase_args(a, a->dst, a->dst, a->count, LEADER, h->local_arity);
  return h->local->broadcast(h->local_team, &l);
}

static ruccl_result_t hier_reduce(const ruccl_hier_t *h, const ruccl_args_t *a) {
  ruccl_comm_t *c = h->comm;
  const ruccl_group_t *g = c->group;
  unsigned root_node = g->node_of[a->root], root_local = g->local_of[a->root];
  size_t bytes = a->count * ruccl_args_elem(a);
  int root_is_leader = g->node_index == root_node && root_local == LEADER;
  void *acc = NULL;
  if (h->net_team) {
    acc = slot(c, 3, bytes);
    if (!acc) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "node reduce buffer");
  }
  ruccl_args_t l = phase_args(a, a->src, acc, a->count, LEADER, h->local_arity);
  ruccl_result_t rc = h->local->reduce(h->local_team, &l);
  if (rc == RUCCL_OK && h->net_team) {
    void *result = NULL;
    if (g->node_index == root_node) {
      result = root_is_leader ? a->dst : slot(c, 4, bytes);
      if (!result) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "node reduce result");
    }
    ruccl_args_t n = *a;
    n.src = acc;
    n.dst = result;
    n.root = root_node;
    n.arity = h->global_arity;
    rc = h->global->reduce(h->net_team, &n);
    if (rc == RUCCL_OK && g->node_index == root_node && !root_is_leader)
      rc = ruccl_team_send(h->local_team, (int)root_local, result, bytes);
  } else if (rc == RUCCL_OK && g->node_index == root_node && c->index == root_local) {
    rc = ruccl_team_recv(h->local_team, LEADER, a->dst, bytes);
  }
  return rc;
}

static ruccl_result_t hier_all_gather(const ruccl_hier_t *h, const ruccl_args_t *a) {
  ruccl_comm_t *c = h->comm;
  const ruccl_group_t *g = c->group;
  size_t elem = ruccl_args_elem(a), block = a->count * elem, n_local = g->n;
  char *node_blocks = NULL, *all_blocks = NULL;
  if (h->net_team) {
    node_blocks = slot(c, 3, n_local * block);
    all_blocks = slot(c, 4, (size_t)g->n_total * block);
    if (!node_blocks || !all_blocks) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "node all-gather buffers");
  }
  ruccl_result_t rc = ruccl_algo_gather_to(h->local_team, LEADER, a->src, node_blocks, a->count, elem);
  if (rc == RUCCL_OK && h->net_team) {
    ruccl_args_t n = phase_args(a, node_blocks, all_blocks, n_local * a->count, 0, h->global_arity);
    rc = h->global->all_gather(h->net_team, &n);
    for (size_t i = 0; rc == RUCCL_OK && i < g->n_total; i++) /* node-major -> peer order */
      memcpy((char *)a->dst + (size_t)g->node_members[i] * block, all_blocks + i * block, block);
  }
  if (rc != RUCCL_OK) return rc;
  ruccl_args_t b = phase_args(a, a->dst, a->dst, (size_t)g->n_total * a->count, LEADER, h->local_arity);
  return h->local->broadcast(h->local_team, &b);
}

static ruccl_result_t hier_reduce_scatter(const ruccl_hier_t *h, const ruccl_args_t *a) {
  ruccl_comm_t *c = h->comm;
  const ruccl_group_t *g = c->group;
  size_t elem = ruccl_args_elem(a), block = a->count * elem, n_local = g->n, total = g->n_total;
  char *summed = NULL, *node_major = NULL;
  if (h->net_team) {
    summed = slot(c, 3, total * block);
    node_major = slot(c, 4, total * block);
    if (!summed || !node_major) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "node reduce-scatter buffers");
  }
  ruccl_args_t l = phase_args(a, a->src, summed, total * a->count, LEADER, h->local_arity);
  ruccl_result_t rc = h->local->reduce(h->local_team, &l);
  if (rc == RUCCL_OK && h->net_team) {
    for (size_t i = 0; i < total; i++) /* peer order -> node-major */
      memcpy(node_major + i * block, summed + (size_t)g->node_members[i] * block, block);
    ruccl_args_t n = *a;
    n.src = node_major;
    n.dst = summed; /* this node's n_local blocks, in local order */
    n.count = n_local * a->count;
    n.arity = h->global_arity;
    rc = h->global->reduce_scatter(h->net_team, &n);
  }
  if (rc != RUCCL_OK) return rc;
  return ruccl_algo_scatter_from(h->local_team, LEADER, summed, a->dst, a->count, elem);
}

ruccl_result_t ruccl_hier_run(const ruccl_hier_t *h, int kind, const ruccl_args_t *a) {
  switch (kind) {
    case RUCCL_COLL_ALL_REDUCE: return hier_all_reduce(h, a);
    case RUCCL_COLL_BROADCAST: return hier_broadcast(h, a);
    case RUCCL_COLL_REDUCE: return hier_reduce(h, a);
    case RUCCL_COLL_ALL_GATHER: return hier_all_gather(h, a);
    case RUCCL_COLL_REDUCE_SCATTER: return hier_reduce_scatter(h, a);
    default: return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "no hierarchical form for collective %d", kind);
  }
}

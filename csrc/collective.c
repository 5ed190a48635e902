/* collective.c — the rank core's collective path: check the call and agree on it
 * with every participant (agreement.c), stage tensors to host memory of the compute
 * dtype, choose the algorithm from the strategy table, run it (or a device path), and
 * stage the result back. */
#include "collective.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agreement.h"
#include "algorithms/algorithms.h"
#include "device/nccl_loader.h"
#include "device/path.h"
#include "device_collective.h"
#include "dtype.h"
#include "error.h"
#include "hierarchy.h"
#include "net/session.h"
#include "rank.h"
#include "testing.h"

const char *ruccl_coll_kind_name(ruccl_coll_kind_t kind) {
  static const char *const names[RUCCL_COLL_NUM_KINDS] = {"all_reduce", "broadcast",      "reduce",
                                                          "all_gather", "reduce_scatter", "barrier"};
  return (unsigned)kind < RUCCL_COLL_NUM_KINDS ? names[kind] : "unknown";
}


/* ---- staging and dispatch --------------------------------------------------------- */

static void *scratch_get(void *ctx, int slot, size_t bytes) { return ruccl_comm_scratch(ctx, slot, bytes); }

/* Host memory of dtype cdt (t's own, or its compute dtype) holding t's elements
   (fill: copied in from t). */
static ruccl_result_t stage_in(ruccl_comm_t *c, const ruccl_tensor_t *t, ruccl_dtype_t cdt, int slot, int fill,
                               void **host) {
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(t->device.kind);
  size_t count = (size_t)ruccl_numel(t);
  if (ad->host_accessible && cdt == t->dtype) {
    *host = t->data;
    return RUCCL_OK;
  }
  void *buf = ruccl_comm_scratch(c, slot, count * ruccl_dtype_size(cdt));
  if (!buf && count) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "staging %zu elements", count);
  *host = buf;
  if (!fill || !count) return RUCCL_OK;
  if (ad->host_accessible) {
    ruccl_to_compute(t->data, t->dtype, buf, cdt, count);
    return RUCCL_OK;
  }
  /* From the device into pinned memory, then (a type that computes wider) widened. */
  size_t raw_bytes = count * ruccl_dtype_size(t->dtype);
  void *raw = ruccl_comm_staging(c, RUCCL_STAGING_SLOT, raw_bytes, t->device);
  if (!raw) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "pinned staging of %zu bytes", raw_bytes);
  ruccl_result_t rc = ruccl_comm_copy(c, t->device, raw, t->data, raw_bytes, RUCCL_COPY_TO_HOST);
  if (rc == RUCCL_OK) ruccl_to_compute(raw, t->dtype, buf, cdt, count);
  return rc;
}

static ruccl_result_t stage_out(ruccl_comm_t *c, const ruccl_tensor_t *t, ruccl_dtype_t cdt, const void *host) {
  if (host == t->data) return RUCCL_OK;
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(t->device.kind);
  size_t count = (size_t)ruccl_numel(t);
  if (!count) return RUCCL_OK;
  if (ad->host_accessible) {
    ruccl_from_compute(host, cdt, t->data, t->dtype, count);
    return RUCCL_OK;
  }
  size_t raw_bytes = count * ruccl_dtype_size(t->dtype);
  void *raw = ruccl_comm_staging(c, RUCCL_STAGING_SLOT, raw_bytes, t->device);
  if (!raw) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "pinned staging of %zu bytes", raw_bytes);
  ruccl_from_compute(host, cdt, raw, t->dtype, count);
  return ruccl_comm_copy(c, t->device, t->data, raw, raw_bytes, RUCCL_COPY_FROM_HOST);
}

static const ruccl_algorithm_table_t *const strategy_table[] = {
    [RUCCL_STRATEGY_CENTRALIZED] = &ruccl_centralized_algorithms,
    [RUCCL_STRATEGY_TREE] = &ruccl_tree_algorithms,
    [RUCCL_STRATEGY_RING] = &ruccl_ring_algorithms,
};

/* AUTO: few steps for small messages, the bandwidth-optimal ring for large ones. */
#define AUTO_SMALL_BYTES (32 * 1024)
#define AUTO_LARGE_BYTES (256 * 1024)

static ruccl_strategy_t choose_strategy(ruccl_strategy_t s, ruccl_coll_kind_t kind, size_t bytes, unsigned n) {
  if (s.kind != RUCCL_STRATEGY_AUTO) return s;
  ruccl_strategy_t r = {RUCCL_STRATEGY_RING, 2};
  if (bytes < AUTO_SMALL_BYTES)
    r.kind = n <= 4 ? RUCCL_STRATEGY_CENTRALIZED : RUCCL_STRATEGY_TREE;
  else if (bytes < AUTO_LARGE_BYTES && kind != RUCCL_COLL_ALL_GATHER && kind != RUCCL_COLL_REDUCE_SCATTER)
    r.kind = RUCCL_STRATEGY_TREE;
  return r;
}

static ruccl_algo_fn algo_for(const ruccl_algorithm_table_t *t, ruccl_coll_kind_t kind) {
  switch (kind) {
    case RUCCL_COLL_ALL_REDUCE: return t->all_reduce;
    case RUCCL_COLL_BROADCAST: return t->broadcast;
    case RUCCL_COLL_REDUCE: return t->reduce;
    case RUCCL_COLL_ALL_GATHER: return t->all_gather;
    case RUCCL_COLL_REDUCE_SCATTER: return t->reduce_scatter;
    default: return NULL;
  }
}

/* The host-staged path's slices (execute_sliced). */
#define STAGING_SLICE_BYTES ((size_t)4 << 20)

typedef struct {
  ruccl_args_t args;
  void *dst;   /* host result, staged back into out when it is not out itself */
  int writes_out;
  int staged;  /* args.src and args.dst are set (deferred for device tensors until the path is known) */
} prepared_t;

static int host_accessible(const ruccl_tensor_t *t) {
  return !t || ruccl_device_adapter(t->device.kind)->host_accessible;
}

/* Host buffers for the algorithms: the tensors themselves, or staged copies. */
static ruccl_result_t stage_call(ruccl_comm_t *c, const ruccl_call_t *r, prepared_t *p) {
  const ruccl_tensor_t *in = r->in;
  ruccl_tensor_t *out = r->out;
  ruccl_args_t *a = &p->args;
  void *src = NULL, *dst = NULL;
  ruccl_result_t rc = RUCCL_OK;
  if (in) rc = stage_in(c, in, a->dtype, 1, 1, &src);
  if (rc == RUCCL_OK && p->writes_out) {
    if (in && in->data == out->data && ruccl_coll_elementwise(r->kind)) dst = src; /* in place: one staged buffer */
    else rc = stage_in(c, out, a->dtype, 2, 0, &dst);
  }
  /* Empty tensors may have NULL data; the algorithms still do offset arithmetic. */
  static char empty[16];
  a->src = src ? src : empty;
  a->dst = dst ? dst : (p->writes_out ? empty : NULL);
  p->dst = dst;
  p->staged = rc == RUCCL_OK;
  return rc;
}

/* Sizes the call and stages host tensors before the agreement, so that a peer that
   cannot (no memory) says so in its descriptor. */
static ruccl_result_t prepare(ruccl_comm_t *c, const ruccl_call_t *r, prepared_t *p) {
  ruccl_group_t *g = c->group;
  const ruccl_tensor_t *in = r->in;
  ruccl_tensor_t *out = r->out;
  ruccl_args_t *a = &p->args;
  memset(p, 0, sizeof *p);
  p->writes_out = out && (r->kind != RUCCL_COLL_REDUCE || r->root_peer == c->peer_id);
  const ruccl_tensor_t *typed = in ? in : out;
  /* Reductions run in the compute dtype; data that is only moved keeps its bits. */
  a->dtype = ruccl_coll_reduces(r->kind) ? ruccl_compute_dtype(typed->dtype, r->op) : typed->dtype;
  a->op = r->op == RUCCL_MEAN ? RUCCL_SUM : r->op;
  a->divisor = r->op == RUCCL_MEAN ? g->n_total : 0;
  a->scratch.get = scratch_get;
  a->scratch.ctx = c;
  switch (r->kind) {
    case RUCCL_COLL_BROADCAST: a->count = (size_t)ruccl_numel(out); break;
    case RUCCL_COLL_REDUCE: a->count = (size_t)ruccl_numel(in); a->root = (unsigned)ruccl_peer_index(c, r->root_peer); break;
    case RUCCL_COLL_REDUCE_SCATTER: a->count = (size_t)ruccl_numel(out); break;
    default: a->count = (size_t)ruccl_numel(in); break;
  }
  /* Device memory is staged only once the agreement has chosen the host-staged path;
     the pinned slices a sliced one would use are taken now, so that a peer without
     them says so in its descriptor (the whole-tensor staging is voted on instead). */
  if (host_accessible(in) && host_accessible(p->writes_out ? out : NULL)) return stage_call(c, r, p);
  const ruccl_tensor_t *dev_t = !host_accessible(in) ? in : out;
  int sliceable = ruccl_coll_elementwise(r->kind) && a->dtype == typed->dtype; /* as decide_path slices */
  if (sliceable && a->count) {
    size_t es = ruccl_dtype_size(a->dtype), slice = STAGING_SLICE_BYTES / es;
    size_t cap = (a->count < slice ? a->count : slice) * es;
    if (!ruccl_comm_staging(c, 1, cap, dev_t->device) || !ruccl_comm_staging(c, 2, cap, dev_t->device))
      return ruccl_fail(RUCCL_ERR_NO_MEMORY, "pinned staging of 2 x %zu bytes: %s", cap, ruccl_last_error());
  }
  return RUCCL_OK;
}

static ruccl_result_t run_algorithm(ruccl_comm_t *c, const ruccl_team_t *local, const ruccl_team_t *net,
                                    ruccl_coll_kind_t kind, ruccl_args_t *a) {
  const ruccl_group_t *g = c->group;
  size_t bytes = a->count * ruccl_dtype_size(a->dtype);
  ruccl_strategy_t ls = choose_strategy(g->config.local_strategy, kind, bytes, local->n);
  const ruccl_algorithm_table_t *table = strategy_table[ls.kind];
  if (g->num_nodes == 1) {
    a->arity = ls.arity;
    ruccl_log(2, "peer %u: %s #%" PRIu64 " of %zu elements by %s", c->peer_id, ruccl_coll_kind_name(kind),
              c->seq, a->count, table->name);
    snprintf(c->algorithm, sizeof c->algorithm, "%s", table->name);
    return algo_for(table, kind)(local, a);
  }
  ruccl_strategy_t gs = choose_strategy(g->config.global_strategy, kind, bytes * g->n, g->num_nodes);
  ruccl_hier_t h = {.comm = c,
                    .local = table,
                    .global = strategy_table[gs.kind],
                    .local_arity = ls.arity,
                    .global_arity = gs.arity,
                    .local_team = local,
                    .net_team = net};
  ruccl_log(2, "peer %u: %s #%" PRIu64 " of %zu elements by %s within the node, %s across %u nodes", c->peer_id,
            ruccl_coll_kind_name(kind), c->seq, a->count, table->name, h.global->name, g->num_nodes);
  if (local->n > 1)
    snprintf(c->algorithm, sizeof c->algorithm, "%s within the node, %s across %u nodes", table->name,
             h.global->name, g->num_nodes);
  else
    snprintf(c->algorithm, sizeof c->algorithm, "%s across %u nodes", h.global->name, g->num_nodes);
  return ruccl_hier_run(&h, kind, a);
}

static ruccl_result_t execute(ruccl_comm_t *c, const ruccl_team_t *local, const ruccl_team_t *net,
                              const ruccl_call_t *r, prepared_t *p) {
  ruccl_result_t rc = run_algorithm(c, local, net, r->kind, &p->args);
  if (rc == RUCCL_OK && p->writes_out) rc = stage_out(c, r->out, p->args.dtype, p->dst);
  return rc;
}

/* Host-staged in slices (the verdict's `sliced`: an all-reduce, broadcast or reduce
 * whose arithmetic runs in the tensors' own dtype).  Each slice is a collective of
 * its own over the same slice of every peer's tensors, so that the device's copies
 * overlap the host's work: while the peers reduce slice k in pinned memory, the
 * stream brings slice k+1 up from the device and takes slice k-1 back.  A peer whose
 * tensors are in host memory works on them in place, slice by slice. */
static ruccl_result_t execute_sliced(ruccl_comm_t *c, const ruccl_team_t *local, const ruccl_team_t *net,
                                     const ruccl_call_t *r, prepared_t *p) {
  const ruccl_tensor_t *in = r->in, *out = p->writes_out ? r->out : NULL;
  const ruccl_tensor_t *dev_t = !host_accessible(in) ? in : out;
  int in_dev = !host_accessible(in), out_dev = !host_accessible(out);
  size_t es = ruccl_dtype_size(p->args.dtype), count = p->args.count;
  size_t slice = STAGING_SLICE_BYTES / es;
  static char empty[16];
  void *buf[2] = {NULL, NULL}, *stream = NULL;
  const ruccl_device_adapter_t *ad = NULL;
  ruccl_result_t rc = RUCCL_OK;
  int64_t deadline = local->deadline_ns;
  if (in_dev || out_dev) {
    ad = ruccl_device_adapter(dev_t->device.kind);
    size_t cap = (count < slice ? count : slice) * es;
    buf[0] = ruccl_comm_staging(c, 1, cap, dev_t->device);
    buf[1] = ruccl_comm_staging(c, 2, cap, dev_t->device);
    if (!buf[0] || !buf[1]) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "pinned staging of 2 x %zu bytes", cap);
    rc = ruccl_comm_stream(c, dev_t->device, &stream);
    if (rc == RUCCL_OK && in_dev && count)
      rc = ad->copy(in->device, stream, buf[0], in->data, (count < slice ? count : slice) * es, RUCCL_COPY_TO_HOST);
  }
  for (size_t k = 0, off = 0; rc == RUCCL_OK && off < count; k++, off += slice) {
    size_t n = count - off < slice ? count - off : slice;
    void *mine = buf[k % 2];
    if (ad) rc = ad->stream_wait(dev_t->device, stream, deadline); /* slice k is up; k-1 is back */
    size_t next = off + slice;
    if (rc == RUCCL_OK && in_dev && next < count)
      rc = ad->copy(in->device, stream, buf[(k + 1) % 2], (const char *)in->data + next * es,
                    (count - next < slice ? count - next : slice) * es, RUCCL_COPY_TO_HOST);
    if (rc != RUCCL_OK) break;
    ruccl_args_t a = p->args;
    a.count = n;
    a.src = in ? (in_dev ? mine : (char *)in->data + off * es) : empty;
    a.dst = out ? (out_dev ? mine : (char *)out->data + off * es) : NULL;
    if (in && out && in_dev != out_dev) { /* one on the device, one on the host: work on a copy */
      if (out_dev) memcpy(mine, a.src, n * es), a.src = a.dst = mine; /* the input stays as it was */
      else memcpy(a.dst, a.src, n * es), a.src = a.dst;
    }
    rc = run_algorithm(c, local, net, r->kind, &a);
    if (rc == RUCCL_OK && out_dev)
      rc = ad->copy(out->device, stream, (char *)out->data + off * es, a.dst, n * es, RUCCL_COPY_FROM_HOST);
  }
  if (rc == RUCCL_OK && ad) rc = ad->stream_wait(dev_t->device, stream, deadline);
  /* a failure leaves copies queued on the user's tensors: give them a moment to end */
  if (rc != RUCCL_OK && ad && stream) ad->stream_wait(dev_t->device, stream, ruccl_deadline_after_ms(1000));
  return rc;
}
/* ---- device paths ------------------------------------------------------------------ */

static ruccl_device_call_t device_call(const ruccl_comm_t *c, const ruccl_call_t *r, const coll_desc_t *d,
                                       unsigned sender_pos) {
  const ruccl_tensor_t *t = r->in ? r->in : r->out;
  ruccl_device_call_t call = {.kind = r->kind, .device = t->device, .dtype = t->dtype, .op = r->op};
  (void)d;
  switch (r->kind) {
    case RUCCL_COLL_BROADCAST: call.count = (size_t)ruccl_numel(r->out); call.root = sender_pos; break;
    case RUCCL_COLL_REDUCE_SCATTER: call.count = (size_t)ruccl_numel(r->out); break;
    case RUCCL_COLL_REDUCE:
      call.count = (size_t)ruccl_numel(r->in);
      call.root = (unsigned)ruccl_peer_index(c, r->root_peer);
      break;
    default: call.count = (size_t)ruccl_numel(r->in); break;
  }
  return call;
}

/* A second round after a local step that can fail on some peers only (staging,
   an NCCL launch): every peer returns the same code.  The deadline is one timeout
   past the collective's, the same on every peer, so that peers that failed at the
   collective's deadline still tell each other why.  *agreed: the round itself
   completed (a failed one breaks the session); *all_failed: every peer failed. */
static ruccl_result_t vote(ruccl_comm_t *c, const ruccl_team_t *local, const ruccl_team_t *net,
                           const coll_desc_t *desc, ruccl_result_t mine_rc, int *agreed, int *all_failed) {
  coll_desc_t mine = *desc;
  mine.fuse_bytes = 0; /* no input rides with a vote */
  mine.local_error = (int32_t)mine_rc;
  if (mine_rc != RUCCL_OK) snprintf(mine.detail, sizeof mine.detail, "%s", ruccl_last_error());
  ruccl_team_t vote_local = *local, vote_net;
  vote_local.deadline_ns = ruccl_deadline_later(local->deadline_ns, ruccl_comm_timeout(c));
  if (net) {
    vote_net = *net;
    vote_net.deadline_ns = vote_local.deadline_ns;
  }
  coll_verdict_t v;
  coll_extras_t none;
  int transport_failed = 0;
  ruccl_result_t rc = ruccl_agree(c, &vote_local, net ? &vote_net : NULL, &mine, 1, NULL, &v, &none, NULL, &transport_failed);
  *agreed = !transport_failed;
  *all_failed = !transport_failed && v.failures == (int32_t)c->group->n_total;
  return rc;
}

/* NCCL moves the data of an agreed call.  Connecting and launching are local steps
   that can fail on some peers only; a second round (a vote) tells every peer before
   anyone waits on NCCL.  When every peer failed to launch, nothing is in flight and
   the session stays usable (*usable); otherwise the launched peers abort their NCCL
   communicators and the session breaks, with the same code everywhere. */
static ruccl_result_t nccl_path(ruccl_comm_t *c, const ruccl_team_t *local, const ruccl_team_t *net,
                                const ruccl_call_t *r, const coll_desc_t *desc, const coll_verdict_t *v,
                                const coll_extras_t *x, int *usable) {
  ruccl_device_call_t call = device_call(c, r, desc, (unsigned)v->sender_pos);
  int root_only_out = r->kind == RUCCL_COLL_REDUCE && r->root_peer != c->peer_id;
  void *out = root_only_out ? NULL : r->out->data;
  ruccl_result_t rc = RUCCL_OK;
  if (v->nccl_new) rc = ruccl_nccl_connect(c, &x->nccl_id, call.device, local->deadline_ns);
  if (rc == RUCCL_OK) rc = ruccl_nccl_launch(c, &call, r->in ? r->in->data : NULL, out);
  int agreed = 0, all_failed = 0;
  ruccl_result_t voted = vote(c, local, net, desc, rc, &agreed, &all_failed);
  if (voted != RUCCL_OK) {
    /* A launch NCCL refused on every peer left nothing in flight: the session goes on.
       The communicators are dropped all the same (NCCL keeps a refused launch as the
       communicator's error), and the next NCCL collective connects anew. */
    *usable = all_failed && voted == RUCCL_ERR_INVALID_ARGUMENT;
    ruccl_nccl_abort(c);
    return voted;
  }
  rc = ruccl_nccl_wait(c, call.device, local->deadline_ns);
  if (rc == RUCCL_OK) rc = ruccl_nccl_divide(c, &call, out, local->deadline_ns);
  return rc;
}

ruccl_result_t ruccl_collective_run(ruccl_comm_t *c, const ruccl_call_t *req) {
  if (!c) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "%s: communicator is NULL", ruccl_coll_kind_name(req->kind));
  ruccl_call_t named = *req;
  if (req->kind == RUCCL_COLL_BROADCAST && req->root_named) named.in = req->root_peer == c->peer_id ? req->out : NULL;
  const ruccl_call_t *r = &named;
  ruccl_group_t *g = c->group;
  if (atomic_load(&g->reset))
    return ruccl_fail(RUCCL_ERR_NOT_REGISTERED, "peer %u: this handle was discarded by ruccl_reset()", c->peer_id);
  c->algorithm[0] = '\0';
  ruccl_result_t rc = ruccl_group_status(g);
  if (rc != RUCCL_OK) return rc;

  ruccl_inproc_port_t port = {.t = &g->inproc, .index = c->index, .cancel = &g->cancel, .finished = g->finished,
                              .names = g->peer_ids_store, .timeout_ms = &c->timeout_ms};
  ruccl_team_t team = {
      .ops = &ruccl_inproc_ops,
      .endpoint = &port,
      .n = g->n,
      .me = c->index,
      .members = NULL,
      .deadline_ns = ruccl_deadline_after_ms(ruccl_comm_timeout(c)),
  };
  ruccl_team_t net_team = {
      .ops = ruccl_session_transport(),
      .endpoint = g->net,
      .n = g->num_nodes,
      .me = g->node_index,
      .members = NULL,
      .deadline_ns = team.deadline_ns,
  };
  const ruccl_team_t *net = g->net && c->index == 0 ? &net_team : NULL;
  coll_desc_t desc;
  ruccl_describe(c, r, &desc);
  prepared_t prep;
  if (desc.local_error == RUCCL_OK && r->kind != RUCCL_COLL_BARRIER) {
    rc = prepare(c, r, &prep);
    if (rc != RUCCL_OK) {
      desc.local_error = (int32_t)rc;
      snprintf(desc.detail, sizeof desc.detail, "%s", ruccl_last_error());
    }
  }
  ruccl_fuse_t fuse = {0};
  if (desc.local_error == RUCCL_OK && r->kind == RUCCL_COLL_ALL_REDUCE && g->n == 1 && net && prep.staged &&
      (g->config.global_strategy.kind == RUCCL_STRATEGY_AUTO ||
       g->config.global_strategy.kind == RUCCL_STRATEGY_CENTRALIZED)) {
    fuse = (ruccl_fuse_t){prep.args.src, prep.args.dst, prep.args.count * ruccl_dtype_size(prep.args.dtype), &prep.args};
    if (fuse.bytes > 0 && fuse.bytes <= FUSE_MAX_BYTES) desc.fuse_bytes = (uint32_t)fuse.bytes;
  }
  switch (ruccl_testing_take_corruption()) {
    case 1: desc.ndim = 1000; break;
    case 2: memset(desc.detail, 'x', sizeof desc.detail); break;
    case 3: desc.dtype = 99; break;
    default: break;
  }
  coll_verdict_t verdict;
  coll_extras_t extras;
  const coll_desc_t *all = NULL;
  int transport_failed = 0;
  snprintf(c->algorithm, sizeof c->algorithm, "agreement");
  rc = ruccl_agree(c, &team, net, &desc, 0, desc.fuse_bytes ? &fuse : NULL, &verdict, &extras, &all, &transport_failed);
  c->seq++;
  if (rc != RUCCL_OK) {
    /* A verdict leaves the session as it was.  A failed exchange leaves peers blocked
       on one another: break the session so that each of them returns now. */
    if (transport_failed) ruccl_group_break(g, rc);
    return rc;
  }
  if (r->kind == RUCCL_COLL_BARRIER) return RUCCL_OK;
  if (verdict.path != c->last_path) {
    ruccl_log(2, "peer %u: %s #%" PRIu64 " takes the %s path: %s", c->peer_id, ruccl_coll_kind_name(r->kind),
              c->seq - 1, ruccl_path_name((ruccl_path_t)verdict.path),
              verdict.path == RUCCL_PATH_HOST ? "every tensor is in host memory" : extras.path_why);
    c->last_path = verdict.path;
  }
  ruccl_testing_path_taken(verdict.path);
  if (verdict.fused) {
    snprintf(c->algorithm, sizeof c->algorithm, "fused into the agreement");
    ruccl_log(2, "peer %u: all_reduce #%" PRIu64 " of %zu elements with the agreement, reduced by node 0 of %u",
              c->peer_id, c->seq - 1, prep.args.count, g->num_nodes);
    rc = prep.writes_out ? stage_out(c, r->out, prep.args.dtype, prep.dst) : RUCCL_OK;
    if (rc != RUCCL_OK) ruccl_group_break(g, rc);
    return rc;
  }
  int usable = 0;
  switch (verdict.path) {
    case RUCCL_PATH_SAME_DEVICE: {
      snprintf(c->algorithm, sizeof c->algorithm, "same-device");
      ruccl_device_call_t call = device_call(c, r, &desc, (unsigned)verdict.sender_pos);
      ruccl_buffer_ptrs_t ptrs[RUCCL_DEVICE_REDUCE_MAX];
      for (unsigned i = 0; all && i < g->n_total && i < RUCCL_DEVICE_REDUCE_MAX; i++) ptrs[i] = all[i].buffers;
      rc = ruccl_same_device_run(c, &team, &call, ptrs, team.deadline_ns);
      break;
    }
    case RUCCL_PATH_NCCL:
      snprintf(c->algorithm, sizeof c->algorithm, "nccl");
      rc = nccl_path(c, &team, net, r, &desc, &verdict, &extras, &usable); break;
    default:
      if (r->kind == RUCCL_COLL_BROADCAST) prep.args.root = (unsigned)verdict.sender_pos;
      if (verdict.sliced) {
        ruccl_testing_path_taken(4);
        rc = execute_sliced(c, &team, net, r, &prep);
        break;
      }
      if (!prep.staged) { /* device tensors, whole: staged now, and every peer told how that went */
        int agreed = 0, all_failed = 0;
        rc = vote(c, &team, net, &desc, stage_call(c, r, &prep), &agreed, &all_failed);
        usable = agreed; /* nothing moved between peers yet, nor was any output written */
        if (rc != RUCCL_OK) break;
      }
      rc = execute(c, &team, net, r, &prep);
      break;
  }
  if (rc != RUCCL_OK && !usable) ruccl_group_break(g, rc);
  return rc;
}

/* agreement.c — what the peers of a collective settle before any data moves: each
 * peer checks its own call (describe), every descriptor goes to peer position 0, which
 * judges them all, chooses the data path, and sends one verdict back (agree).  So
 * every peer returns the same code and message, no output is written before the
 * verdict, and a peer with bad arguments still takes part, which keeps sequence
 * numbers aligned and the communicator usable.  collective.c runs what was agreed;
 * agreement_wire.c encodes the messages between nodes.  (ruccl_comm_agree, which must
 * survive lost peers, has an agreement of its own: recovery.c.) */
#include "agreement.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/nccl_loader.h"
#include "device/path.h"
#include "dtype.h"
#include "error.h"
#include "rank.h"
#include "testing.h"

/* ---- local checks ---------------------------------------------------------------- */

static void shape_text(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t used = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, i ? ", %" PRId64 : "%" PRId64, shape[i]);
  if (used < cap) snprintf(buf + used, cap - used, "]");
}

static int same_shape(const ruccl_tensor_t *a, const ruccl_tensor_t *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

/* A tensor the core can work on, or why not. */
ruccl_result_t ruccl_check_tensor(const ruccl_tensor_t *t, const char *what, char *detail) {
  if (!t) return snprintf(detail, DETAIL_MAX, "%s tensor is NULL", what), RUCCL_ERR_INVALID_ARGUMENT;
  if (!ruccl_dtype_valid(t->dtype))
    return snprintf(detail, DETAIL_MAX, "%s dtype %d is not a ruccl_dtype_t", what, (int)t->dtype),
           RUCCL_ERR_INVALID_ARGUMENT;
  if (t->ndim < 0 || t->ndim > RUCCL_MAX_DIMS)
    return snprintf(detail, DETAIL_MAX, "%s ndim %d is outside 0..%d", what, t->ndim, RUCCL_MAX_DIMS),
           RUCCL_ERR_INVALID_ARGUMENT;
  int64_t limit = INT64_MAX / 8, numel = 1;
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] < 0)
      return snprintf(detail, DETAIL_MAX, "%s shape[%d] = %" PRId64 " is negative", what, i, t->shape[i]),
             RUCCL_ERR_INVALID_ARGUMENT;
    if (t->shape[i] && numel > limit / t->shape[i])
      return snprintf(detail, DETAIL_MAX, "%s has more elements than fit in memory", what),
             RUCCL_ERR_INVALID_ARGUMENT;
    numel *= t->shape[i];
  }
  if (numel > 0 && !t->data)
    return snprintf(detail, DETAIL_MAX, "%s data is NULL for %" PRId64 " elements", what, numel),
           RUCCL_ERR_INVALID_ARGUMENT;
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(t->device.kind);
  if (!ad)
    return snprintf(detail, DETAIL_MAX, "%s is on device kind %d, which this build does not support", what,
                    (int)t->device.kind),
           RUCCL_ERR_UNSUPPORTED;
  if (ad->check(t->device) != RUCCL_OK) /* the adapter's last error says why ("cuda:0 is not usable: ...") */
    return snprintf(detail, DETAIL_MAX, "%s tensor: %s", what, ruccl_last_error_detail()), RUCCL_ERR_DEVICE;
  return RUCCL_OK;
}

/* in and out of one peer must agree with each other: out holds `ratio_out` times
   (or 1/ratio_in of) in's elements, and the same dtype. */
static ruccl_result_t check_pair(const ruccl_tensor_t *in, const ruccl_tensor_t *out, int64_t out_numel,
                                 int exact_shape, char *detail) {
  if (in->dtype != out->dtype)
    return snprintf(detail, DETAIL_MAX, "input is %s but output is %s", ruccl_dtype_name(in->dtype),
                    ruccl_dtype_name(out->dtype)),
           RUCCL_ERR_DTYPE_MISMATCH;
  if (exact_shape ? !same_shape(in, out) : ruccl_numel(out) != out_numel) {
    char a[96], b[96];
    shape_text(a, sizeof a, in->ndim, in->shape);
    shape_text(b, sizeof b, out->ndim, out->shape);
    return snprintf(detail, DETAIL_MAX, "input shape %s does not fit output shape %s", a, b),
           RUCCL_ERR_SHAPE_MISMATCH;
  }
  return RUCCL_OK;
}

int ruccl_peer_index(const ruccl_comm_t *c, uint32_t id) {
  const ruccl_group_t *g = c->group;
  for (unsigned i = 0; i < g->n_total; i++)
    if (g->all_ids[i] == id) return (int)i;
  return -1;
}

/* Where the call's tensors are (checked: every tensor given is valid). */
static void describe_device(const ruccl_comm_t *c, const ruccl_call_t *r, coll_desc_t *d) {
  const ruccl_tensor_t *mine[2] = {r->in, r->out};
  if (r->kind == RUCCL_COLL_REDUCE && r->root_peer != c->peer_id) mine[1] = NULL;
  const ruccl_tensor_t *first = NULL;
  int mixed = 0;
  for (int i = 0; i < 2; i++) {
    if (!mine[i]) continue;
    if (!first) first = mine[i];
    else if (mine[i]->device.kind != first->device.kind || mine[i]->device.index != first->device.index) mixed = 1;
  }
  ruccl_path_facts_t *f = &d->facts;
  f->process = c->group->node_index;
  f->device_kind = mixed ? RUCCL_PATH_MIXED_DEVICES : first ? (int32_t)first->device.kind : RUCCL_DEVICE_CPU;
  int pretend = ruccl_testing_pretended_devices();
  if (pretend && f->device_kind == RUCCL_DEVICE_CPU) { /* tests: host memory posing as devices */
    f->device_kind = RUCCL_DEVICE_CUDA;
    f->uuid.bytes[0] = 1;
    if (pretend >= 2) memcpy(f->uuid.bytes + 1, &c->global_index, sizeof c->global_index);
  } else if (f->device_kind == RUCCL_DEVICE_CUDA &&
             ruccl_device_adapter(first->device.kind)->uuid(first->device, &f->uuid) != RUCCL_OK) {
    d->local_error = RUCCL_ERR_DEVICE; /* without its identity, no path can be chosen safely */
    snprintf(d->detail, sizeof d->detail, "%s", ruccl_last_error());
  }
  if (f->device_kind == RUCCL_DEVICE_CUDA && pretend != 3) ruccl_nccl(&f->nccl_version);
  d->nccl_stale = c->nccl_comm && first &&
                  (first->device.kind != c->nccl_dev.kind || first->device.index != c->nccl_dev.index);
  d->buffers.in = r->in ? (uint64_t)(uintptr_t)r->in->data : 0;
  d->buffers.out = mine[1] ? (uint64_t)(uintptr_t)mine[1]->data : 0;
}

/* Fills the descriptor; a local error is recorded in it, not returned. */
void ruccl_describe(const ruccl_comm_t *c, const ruccl_call_t *r, coll_desc_t *d) {
  memset(d, 0, sizeof *d);
  d->seq = c->seq;
  d->kind = (int32_t)r->kind;
  d->op = (int32_t)r->op;
  d->root_id = r->root_peer;
  unsigned n = c->group->n_total;
  const ruccl_tensor_t *shape_from = NULL;
  ruccl_result_t rc = RUCCL_OK;
  char *detail = d->detail;
  if (ruccl_coll_reduces(r->kind) && (unsigned)r->op >= RUCCL_NUM_REDUCE_OPS) {
    rc = RUCCL_ERR_INVALID_ARGUMENT;
    snprintf(detail, DETAIL_MAX, "reduce op %d is not a ruccl_reduce_op_t", (int)r->op);
  }
  switch (r->kind) {
    case RUCCL_COLL_ALL_REDUCE:
      if (rc == RUCCL_OK) rc = ruccl_check_tensor(r->in, "input", detail);
      if (rc == RUCCL_OK) rc = ruccl_check_tensor(r->out, "output", detail);
      if (rc == RUCCL_OK) rc = check_pair(r->in, r->out, 0, 1, detail);
      shape_from = r->in;
      break;
    case RUCCL_COLL_BROADCAST:
      d->sender = r->in != NULL;
      d->root_named = r->root_named;
      rc = ruccl_check_tensor(r->out, "output", detail);
      if (rc == RUCCL_OK && r->root_named && ruccl_peer_index(c, r->root_peer) < 0) {
        rc = RUCCL_ERR_INVALID_ARGUMENT;
        snprintf(detail, DETAIL_MAX, "root %u is not a participant", r->root_peer);
      }
      if (rc == RUCCL_OK && r->in) rc = ruccl_check_tensor(r->in, "send", detail);
      if (rc == RUCCL_OK && r->in) rc = check_pair(r->in, r->out, 0, 1, detail);
      shape_from = r->out;
      break;
    case RUCCL_COLL_REDUCE:
      if (rc == RUCCL_OK) rc = ruccl_check_tensor(r->in, "input", detail);
      if (rc == RUCCL_OK && ruccl_peer_index(c, r->root_peer) < 0) {
        rc = RUCCL_ERR_INVALID_ARGUMENT;
        snprintf(detail, DETAIL_MAX, "root %u is not a participant", r->root_peer);
      }
      if (rc == RUCCL_OK && r->root_peer == c->peer_id) {
        rc = ruccl_check_tensor(r->out, "root output", detail);
        if (rc == RUCCL_OK) rc = check_pair(r->in, r->out, 0, 1, detail);
      }
      shape_from = r->in;
      break;
    case RUCCL_COLL_ALL_GATHER:
      rc = ruccl_check_tensor(r->in, "input", detail);
      if (rc == RUCCL_OK) rc = ruccl_check_tensor(r->out, "output", detail);
      if (rc == RUCCL_OK && ruccl_numel(r->in) > INT64_MAX / 8 / (int64_t)n) {
        rc = RUCCL_ERR_INVALID_ARGUMENT;
        snprintf(detail, DETAIL_MAX, "%u blocks of the input do not fit in memory", n);
      }
      if (rc == RUCCL_OK) rc = check_pair(r->in, r->out, ruccl_numel(r->in) * (int64_t)n, 0, detail);
      shape_from = r->in;
      break;
    case RUCCL_COLL_REDUCE_SCATTER:
      if (rc == RUCCL_OK) rc = ruccl_check_tensor(r->in, "input", detail);
      if (rc == RUCCL_OK) rc = ruccl_check_tensor(r->out, "output", detail);
      if (rc == RUCCL_OK && ruccl_numel(r->out) > INT64_MAX / 8 / (int64_t)n) {
        rc = RUCCL_ERR_INVALID_ARGUMENT;
        snprintf(detail, DETAIL_MAX, "%u blocks of the output do not fit in memory", n);
      }
      if (rc == RUCCL_OK && ruccl_numel(r->in) != ruccl_numel(r->out) * (int64_t)n) {
        char a[96], b[96];
        shape_text(a, sizeof a, r->in->ndim, r->in->shape);
        shape_text(b, sizeof b, r->out->ndim, r->out->shape);
        rc = RUCCL_ERR_SHAPE_MISMATCH;
        snprintf(detail, DETAIL_MAX, "input %s must hold %u x output %s", a, n, b);
      }
      if (rc == RUCCL_OK && r->in->dtype != r->out->dtype) rc = check_pair(r->in, r->out, 0, 0, detail);
      shape_from = r->in;
      break;
    default: break;
  }
  d->local_error = (int32_t)rc;
  if (rc == RUCCL_OK && r->kind != RUCCL_COLL_BARRIER) describe_device(c, r, d);
  if (rc == RUCCL_OK && shape_from) {
    d->dtype = (int32_t)shape_from->dtype;
    d->ndim = shape_from->ndim;
    memcpy(d->shape, shape_from->shape, sizeof(int64_t) * (size_t)shape_from->ndim);
  }
}

/* ---- agreement ------------------------------------------------------------------- */

static int32_t judge(const ruccl_comm_t *c, const coll_desc_t *all, char *msg) {
  unsigned n = c->group->n_total;
  const uint32_t *ids = c->group->all_ids;
  const coll_desc_t *a = &all[0];
  for (unsigned i = 0; i < n; i++) {
    const char *why = ruccl_desc_malformed(&all[i]);
    if (why)
      return snprintf(msg, VERDICT_MAX, "peer %u sent a malformed descriptor: its %s is out of range", ids[i], why),
             RUCCL_ERR_PROTOCOL;
  }
  const char *kind = ruccl_coll_kind_name((ruccl_coll_kind_t)a->kind);
  for (unsigned i = 0; i < n; i++)
    if (all[i].local_error != RUCCL_OK)
      return snprintf(msg, VERDICT_MAX, "%s #%" PRIu64 ": peer %u: %s", ruccl_coll_kind_name(all[i].kind),
                      all[i].seq, ids[i], all[i].detail),
             all[i].local_error;
  for (unsigned i = 1; i < n; i++) {
    const coll_desc_t *b = &all[i];
    if (b->seq != a->seq)
      return snprintf(msg, VERDICT_MAX, "peer %u is at collective #%" PRIu64 ", peer %u at #%" PRIu64, ids[i],
                      b->seq, ids[0], a->seq),
             RUCCL_ERR_PROTOCOL;
    if (b->kind != a->kind)
      return snprintf(msg, VERDICT_MAX, "collective #%" PRIu64 ": peer %u called %s, peer %u called %s", a->seq,
                      ids[0], kind, ids[i], ruccl_coll_kind_name(b->kind)),
             RUCCL_ERR_OP_MISMATCH;
  }
  if (a->kind == RUCCL_COLL_BARRIER) return RUCCL_OK;
  for (unsigned i = 1; i < n; i++) {
    const coll_desc_t *b = &all[i];
    if (b->dtype != a->dtype)
      return snprintf(msg, VERDICT_MAX, "%s #%" PRIu64 ": peer %u has dtype %s, peer %u has %s", kind, a->seq,
                      ids[0], ruccl_dtype_name(a->dtype), ids[i], ruccl_dtype_name(b->dtype)),
             RUCCL_ERR_DTYPE_MISMATCH;
    if (b->ndim != a->ndim || memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) != 0) {
      char sa[96], sb[96];
      shape_text(sa, sizeof sa, a->ndim, a->shape);
      shape_text(sb, sizeof sb, b->ndim, b->shape);
      return snprintf(msg, VERDICT_MAX, "%s #%" PRIu64 ": peer %u has shape %s, peer %u has %s", kind, a->seq,
                      ids[0], sa, ids[i], sb),
             RUCCL_ERR_SHAPE_MISMATCH;
    }
  }
  for (unsigned i = 1; ruccl_coll_reduces(a->kind) && i < n; i++)
    if (all[i].op != a->op)
      return snprintf(msg, VERDICT_MAX, "%s #%" PRIu64 ": peer %u reduces with %s, peer %u with %s", kind,
                      a->seq, ids[0], ruccl_op_name(a->op), ids[i], ruccl_op_name(all[i].op)),
             RUCCL_ERR_OP_MISMATCH;
  for (unsigned i = 1; a->kind == RUCCL_COLL_REDUCE && i < n; i++)
    if (all[i].root_id != a->root_id)
      return snprintf(msg, VERDICT_MAX, "reduce #%" PRIu64 ": peer %u names root %u, peer %u names root %u", a->seq,
                      ids[0], a->root_id, ids[i], all[i].root_id),
             RUCCL_ERR_ROOT_MISMATCH;
  for (unsigned i = 1; a->kind == RUCCL_COLL_BROADCAST && i < n; i++)
    if (all[i].root_named != a->root_named || (a->root_named && all[i].root_id != a->root_id)) {
      char ra[32] = "none (a send tensor)", rb[32] = "none (a send tensor)";
      if (a->root_named) snprintf(ra, sizeof ra, "%u", a->root_id);
      if (all[i].root_named) snprintf(rb, sizeof rb, "%u", all[i].root_id);
      return snprintf(msg, VERDICT_MAX, "broadcast #%" PRIu64 ": peer %u names root %s, peer %u names root %s",
                      a->seq, ids[0], ra, ids[i], rb),
             RUCCL_ERR_ROOT_MISMATCH;
    }
  if (a->kind == RUCCL_COLL_BROADCAST) {
    unsigned senders = 0;
    for (unsigned i = 0; i < n; i++) senders += all[i].sender != 0;
    if (senders != 1)
      return snprintf(msg, VERDICT_MAX, "broadcast #%" PRIu64 ": %u peers passed a send tensor, exactly one must",
                      a->seq, senders),
             RUCCL_ERR_BROADCAST_SENDERS;
  }
  return RUCCL_OK;
}

/* RUCCL_PATH (the judge's): a data path asked for, or -1 (auto). */
static int wanted_path(void) {
  const char *name = getenv("RUCCL_PATH");
  int p = ruccl_path_parse(name);
  if (p == -2) {
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1)) ruccl_log(1, "RUCCL_PATH=%s is no path (auto, host-staged, same-device, nccl)", name);
    p = -1;
  }
  return p;
}

/* The data path of an agreed call (device/path.h), with a new NCCL unique id when
   the path is NCCL and the communicators are not yet connected.  Runs on the judge. */
static void decide_path(ruccl_comm_t *c, const coll_desc_t *all, coll_verdict_t *v, coll_extras_t *x) {
  unsigned n = c->group->n_total;
  int any_device = 0;
  for (unsigned i = 0; i < n && !any_device; i++) any_device = all[i].facts.device_kind != RUCCL_DEVICE_CPU;
  v->path = RUCCL_PATH_HOST;
  if (!any_device || all[0].kind == RUCCL_COLL_BARRIER) return;
  ruccl_path_facts_t *facts = malloc(sizeof *facts * n);
  if (!facts) {
    v->path = RUCCL_PATH_HOST_STAGED;
    snprintf(x->path_why, sizeof x->path_why, "no memory to weigh the paths");
    return;
  }
  for (unsigned i = 0; i < n; i++) facts[i] = all[i].facts;
  /* NCCL computes as ruCCL does: data that only moves, or a reduction in the tensors'
     own dtype, except float MIN and MAX (NCCL's fmin/fmax drop a NaN, ruCCL's keep it) */
  ruccl_dtype_t dt = (ruccl_dtype_t)all[0].dtype;
  ruccl_reduce_op_t op = (ruccl_reduce_op_t)all[0].op;
  int float_min_max = (dt == RUCCL_FLOAT32 || dt == RUCCL_FLOAT64) && (op == RUCCL_MIN || op == RUCCL_MAX);
  int same_type = !ruccl_coll_reduces(all[0].kind) || ruccl_compute_dtype(dt, op) == dt;
  int own_dtype = same_type && !(ruccl_coll_reduces(all[0].kind) && float_min_max);
  v->path = (int32_t)ruccl_choose_path(facts, n, own_dtype, wanted_path(), x->path_why, sizeof x->path_why);
  free(facts);
  v->sliced = v->path == RUCCL_PATH_HOST_STAGED && same_type && ruccl_coll_elementwise(all[0].kind);
  int stale = 0;
  for (unsigned i = 0; i < n; i++) stale |= all[i].nccl_stale;
  if (v->path == RUCCL_PATH_NCCL && (!c->nccl_comm || stale)) { /* every peer connects anew */
    const ruccl_nccl_api_t *nc = ruccl_nccl(NULL);
    if (nc && nc->get_unique_id(&x->nccl_id) == RUCCL_NCCL_SUCCESS) {
      v->nccl_new = 1;
    } else {
      v->path = RUCCL_PATH_HOST_STAGED;
      snprintf(x->path_why, sizeof x->path_why, "NCCL could not make a unique id");
    }
  }
}

/* Node 0: reduces the inputs that came with the descriptors into fuse->dst, in node
   order (inputs: node k's at k * FUSE_MAX_BYTES), as the centralized all-reduce would. */
static void reduce_fused(const ruccl_group_t *g, const ruccl_fuse_t *fuse, const unsigned char *inputs) {
  const ruccl_args_t *a = fuse->args;
  size_t count = fuse->bytes / ruccl_dtype_size(a->dtype);
  unsigned received = 0, others = g->num_nodes - 1;
  for (unsigned k = 0; k < g->num_nodes; k++) {
    if (k == g->node_index) continue;
    received++;
    ruccl_reduce_kernel(fuse->dst, received == 1 ? fuse->src : fuse->dst, inputs + (size_t)k * FUSE_MAX_BYTES, count,
                        a->dtype, a->op, received == others ? a->divisor : 0);
  }
}

/* agreement.h: one round, over the in-process team and (node leaders) the nodes. */
ruccl_result_t ruccl_agree(ruccl_comm_t *c, const ruccl_team_t *local, const ruccl_team_t *net,
                           const coll_desc_t *mine, int vote, const ruccl_fuse_t *fuse, coll_verdict_t *out,
                           coll_extras_t *x, const coll_desc_t **all_out, int *transport_failed) {
  *transport_failed = 1;
  const ruccl_group_t *g = c->group;
  coll_verdict_t *v = out;
  memset(v, 0, sizeof *v);
  x->path_why[0] = 0;
  if (all_out) *all_out = NULL;
  unsigned n_local = local->n;
  ruccl_result_t rc;
  if (local->me != 0) {
    rc = ruccl_team_send(local, 0, mine, sizeof *mine);
    if (rc == RUCCL_OK) rc = ruccl_team_recv(local, 0, v, sizeof *v);
    if (rc == RUCCL_OK && v->extras) rc = ruccl_team_recv(local, 0, x, sizeof *x);
    if (rc != RUCCL_OK) return rc;
  } else {
    /* slot 3 holds every descriptor: this node's first, then (node 0) all by global index */
    coll_desc_t *all = ruccl_comm_scratch(c, 3, sizeof(coll_desc_t) * (g->n_total + 2 * (size_t)n_local));
    if (!all) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "agreement buffer for %u peers", g->n_total);
    coll_desc_t *node = all + g->n_total, *incoming = node + n_local;
    node[0] = *mine;
    for (unsigned p = 1; p < n_local; p++) {
      rc = ruccl_team_recv(local, (int)p, &node[p], sizeof node[p]);
      if (rc != RUCCL_OK) return rc;
    }
    /* Between nodes the messages travel encoded (agreement.h) */
    size_t node_bytes = (size_t)RUCCL_DESC_WIRE_BYTES * n_local;
    unsigned char *wire = net ? ruccl_comm_scratch(c, 5, node_bytes) : NULL;
    unsigned char vw[RUCCL_VERDICT_WIRE_BYTES], xw[RUCCL_EXTRAS_WIRE_BYTES];
    if (net && !wire) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "agreement buffer for %u peers", n_local);
    if (net && net->me != 0) {
      for (unsigned l = 0; l < n_local; l++) ruccl_desc_encode(&node[l], wire + (size_t)l * RUCCL_DESC_WIRE_BYTES);
      rc = ruccl_team_send(net, 0, wire, node_bytes);
      if (rc == RUCCL_OK && fuse && mine->fuse_bytes) rc = ruccl_team_send(net, 0, fuse->src, mine->fuse_bytes);
      if (rc == RUCCL_OK) rc = ruccl_team_recv(net, 0, vw, sizeof vw);
      if (rc == RUCCL_OK) ruccl_verdict_decode(vw, v);
      if (rc == RUCCL_OK && v->extras) rc = ruccl_team_recv(net, 0, xw, sizeof xw);
      if (rc == RUCCL_OK && v->extras) ruccl_extras_decode(xw, x);
      if (rc == RUCCL_OK) rc = ruccl_verdict_check(g->n_total, v, x);
      if (rc == RUCCL_OK && v->fused && !(fuse && mine->fuse_bytes))
        rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "node 0 sent a fused result to a node that sent no input");
      if (rc == RUCCL_OK && v->fused) rc = ruccl_team_recv(net, 0, fuse->dst, fuse->bytes);
      if (rc != RUCCL_OK) return rc;
    } else {
      unsigned char *inputs = NULL; /* the inputs that came with the descriptors, by node */
      for (unsigned k = 0; k < g->num_nodes; k++) {
        coll_desc_t *from = node;
        if (k != g->node_index) {
          from = incoming;
          rc = ruccl_team_recv(net, (int)k, wire, node_bytes);
          if (rc != RUCCL_OK) return rc;
          for (unsigned l = 0; l < n_local; l++) ruccl_desc_decode(wire + (size_t)l * RUCCL_DESC_WIRE_BYTES, &from[l]);
          uint32_t fb = n_local == 1 ? from[0].fuse_bytes : 0;
          if (fb > FUSE_MAX_BYTES || (n_local != 1 && from[0].fuse_bytes))
            return ruccl_fail(RUCCL_ERR_PROTOCOL, "node %u announced %u bytes of input with its descriptor", k,
                              from[0].fuse_bytes);
          if (fb && !inputs) {
            inputs = ruccl_comm_scratch(c, 4, (size_t)g->num_nodes * FUSE_MAX_BYTES);
            if (!inputs) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "inputs of %u nodes", g->num_nodes);
          }
          if (fb) rc = ruccl_team_recv(net, (int)k, inputs + (size_t)k * FUSE_MAX_BYTES, fb);
          if (rc != RUCCL_OK) return rc;
        }
        for (unsigned l = 0; l < n_local; l++) all[g->node_members[k * n_local + l]] = from[l];
      }
      v->seq = mine->seq;
      v->code = judge(c, all, v->message);
      for (unsigned p = 0; p < g->n_total; p++) {
        if (all[p].sender) v->sender_pos = (int32_t)p;
        v->failures += all[p].local_error != RUCCL_OK;
      }
      if (v->code == RUCCL_OK && !vote) {
        decide_path(c, all, v, x);
        /* every peer has the same last path; a barrier moves no data and keeps it */
        v->extras = v->nccl_new || (all[0].kind != RUCCL_COLL_BARRIER && v->path != c->last_path);
        v->fused = fuse && inputs && v->path == RUCCL_PATH_HOST;
        for (unsigned p = 0; v->fused && p < g->n_total; p++) v->fused = all[p].fuse_bytes == fuse->bytes;
        if (v->fused) reduce_fused(g, fuse, inputs);
      }
      if (all_out) *all_out = all;
      if (net) {
        ruccl_verdict_encode(v, vw);
        rc = ruccl_team_send_all(net, vw, sizeof vw);
        if (rc == RUCCL_OK && v->extras) ruccl_extras_encode(x, xw);
        if (rc == RUCCL_OK && v->extras) rc = ruccl_team_send_all(net, xw, sizeof xw);
        if (rc == RUCCL_OK && v->fused) rc = ruccl_team_send_all(net, fuse->dst, fuse->bytes);
        if (rc != RUCCL_OK) return rc;
      }
    }
    rc = ruccl_team_send_all(local, v, sizeof *v);
    if (rc == RUCCL_OK && v->extras) rc = ruccl_team_send_all(local, x, sizeof *x);
    if (rc != RUCCL_OK) return rc;
  }
  *transport_failed = 0;
  if (v->code != RUCCL_OK) {
    char full[VERDICT_MAX + 64];
    snprintf(full, sizeof full, "%s: %s", ruccl_error_string((ruccl_result_t)v->code), v->message);
    ruccl_set_last_error(full);
    ruccl_log(1, "peer %u: %s", c->peer_id, full);
    return (ruccl_result_t)v->code;
  }
  return RUCCL_OK;
}


/* collective.c — the rank core's collective path: check the call locally, agree on
 * it with every participant, stage tensors to host memory of the compute dtype,
 * choose the algorithm from the strategy table, run it, and stage the result back.
 *
 * Agreement: every peer sends a descriptor of its call (sequence number, kind,
 * dtype, shape, op, root, whether it sends, and any local argument error) to peer
 * position 0, which judges them all and sends one verdict back.  So every peer
 * returns the same code and message, no output is written before the verdict, and a
 * peer with bad arguments still takes part, which keeps sequence numbers aligned and
 * the communicator usable. */
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


/* A small all-reduce between nodes of one peer each rides with the agreement: every
   node sends its input right after its descriptor, node 0 reduces the inputs once
   every descriptor agrees (in node order, as the centralized algorithm does, so the
   bits are the same), and the result follows the verdict.  One exchange with node 0
   instead of the agreement's and then the algorithm's.  A verdict against the call
   (or a node that could not fuse) leaves every output as it was: the inputs that
   came along are dropped. */
typedef struct {
  const void *src;
  void *dst;
  size_t bytes;
  const ruccl_args_t *args;
} fuse_t;


const char *ruccl_coll_kind_name(ruccl_coll_kind_t kind) {
  static const char *const names[RUCCL_COLL_NUM_KINDS] = {"all_reduce", "broadcast",      "reduce",
                                                          "all_gather", "reduce_scatter", "barrier"};
  return (unsigned)kind < RUCCL_COLL_NUM_KINDS ? names[kind] : "unknown";
}

/* Whether each output element of a kind comes from the same element of the inputs
   (in and out have one size, the call can run in place or in slices). */
static int elementwise(int32_t kind) {
  return kind == RUCCL_COLL_ALL_REDUCE || kind == RUCCL_COLL_BROADCAST || kind == RUCCL_COLL_REDUCE;
}

/* Whether a kind of collective reduces (and so takes an op and a compute dtype). */
static int kind_reduces(int32_t kind) {
  return kind == RUCCL_COLL_ALL_REDUCE || kind == RUCCL_COLL_REDUCE || kind == RUCCL_COLL_REDUCE_SCATTER;
}

/* ---- local checks ---------------------------------------------------------------- */

static int64_t numel_of(const ruccl_tensor_t *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

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
  if (exact_shape ? !same_shape(in, out) : numel_of(out) != out_numel) {
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
static void describe(const ruccl_comm_t *c, const ruccl_call_t *r, coll_desc_t *d) {
  memset(d, 0, sizeof *d);
  d->seq = c->seq;
  d->kind = (int32_t)r->kind;
  d->op = (int32_t)r->op;
  d->root_id = r->root_peer;
  unsigned n = c->group->n_total;
  const ruccl_tensor_t *shape_from = NULL;
  ruccl_result_t rc = RUCCL_OK;
  char *detail = d->detail;
  if (kind_reduces(r->kind) && (unsigned)r->op >= RUCCL_NUM_REDUCE_OPS) {
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
      if (rc == RUCCL_OK && numel_of(r->in) > INT64_MAX / 8 / (int64_t)n) {
        rc = RUCCL_ERR_INVALID_ARGUMENT;
        snprintf(detail, DETAIL_MAX, "%u blocks of the input do not fit in memory", n);
      }
      if (rc == RUCCL_OK) rc = check_pair(r->in, r->out, numel_of(r->in) * (int64_t)n, 0, detail);
      shape_from = r->in;
      break;
    case RUCCL_COLL_REDUCE_SCATTER:
      if (rc == RUCCL_OK) rc = ruccl_check_tensor(r->in, "input", detail);
      if (rc == RUCCL_OK) rc = ruccl_check_tensor(r->out, "output", detail);
      if (rc == RUCCL_OK && numel_of(r->out) > INT64_MAX / 8 / (int64_t)n) {
        rc = RUCCL_ERR_INVALID_ARGUMENT;
        snprintf(detail, DETAIL_MAX, "%u blocks of the output do not fit in memory", n);
      }
      if (rc == RUCCL_OK && numel_of(r->in) != numel_of(r->out) * (int64_t)n) {
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
  for (unsigned i = 1; kind_reduces(a->kind) && i < n; i++)
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
  int same_type = !kind_reduces(all[0].kind) || ruccl_compute_dtype(dt, op) == dt;
  int own_dtype = same_type && !(kind_reduces(all[0].kind) && float_min_max);
  v->path = (int32_t)ruccl_choose_path(facts, n, own_dtype, wanted_path(), x->path_why, sizeof x->path_why);
  free(facts);
  v->sliced = v->path == RUCCL_PATH_HOST_STAGED && same_type && elementwise(all[0].kind);
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

/* Returns the verdict's code (and sets the thread's last error from its message),
   or the transport's error if the agreement itself could not complete (then
   *transport_failed is set).  The verdict goes to *out; the judge also gets every
   descriptor, by global index, in *all_out (NULL elsewhere).  vote: the round only
   collects local errors (after an NCCL launch), without choosing a path. */
/* Node 0: reduces the inputs that came with the descriptors into fuse->dst, in node
   order (inputs: node k's at k * FUSE_MAX_BYTES), as the centralized all-reduce would. */
static void reduce_fused(const ruccl_group_t *g, const fuse_t *fuse, const unsigned char *inputs) {
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

static ruccl_result_t agree(ruccl_comm_t *c, const ruccl_team_t *local, const ruccl_team_t *net,
                            const coll_desc_t *mine, int vote, const fuse_t *fuse, coll_verdict_t *out,
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

/* ---- staging and dispatch --------------------------------------------------------- */

static void *scratch_get(void *ctx, int slot, size_t bytes) { return ruccl_comm_scratch(ctx, slot, bytes); }

/* Host memory of dtype cdt (t's own, or its compute dtype) holding t's elements
   (fill: copied in from t). */
static ruccl_result_t stage_in(ruccl_comm_t *c, const ruccl_tensor_t *t, ruccl_dtype_t cdt, int slot, int fill,
                               void **host) {
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(t->device.kind);
  size_t count = (size_t)numel_of(t);
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
  size_t count = (size_t)numel_of(t);
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
    if (in && in->data == out->data && elementwise(r->kind)) dst = src; /* in place: one staged buffer */
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
  a->dtype = kind_reduces(r->kind) ? ruccl_compute_dtype(typed->dtype, r->op) : typed->dtype;
  a->op = r->op == RUCCL_MEAN ? RUCCL_SUM : r->op;
  a->divisor = r->op == RUCCL_MEAN ? g->n_total : 0;
  a->scratch.get = scratch_get;
  a->scratch.ctx = c;
  switch (r->kind) {
    case RUCCL_COLL_BROADCAST: a->count = (size_t)numel_of(out); break;
    case RUCCL_COLL_REDUCE: a->count = (size_t)numel_of(in); a->root = (unsigned)ruccl_peer_index(c, r->root_peer); break;
    case RUCCL_COLL_REDUCE_SCATTER: a->count = (size_t)numel_of(out); break;
    default: a->count = (size_t)numel_of(in); break;
  }
  /* Device memory is staged only once the agreement has chosen the host-staged path;
     the pinned slices a sliced one would use are taken now, so that a peer without
     them says so in its descriptor (the whole-tensor staging is voted on instead). */
  if (host_accessible(in) && host_accessible(p->writes_out ? out : NULL)) return stage_call(c, r, p);
  const ruccl_tensor_t *dev_t = !host_accessible(in) ? in : out;
  int sliceable = elementwise(r->kind) && a->dtype == typed->dtype; /* as decide_path slices */
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
    case RUCCL_COLL_BROADCAST: call.count = (size_t)numel_of(r->out); call.root = sender_pos; break;
    case RUCCL_COLL_REDUCE_SCATTER: call.count = (size_t)numel_of(r->out); break;
    case RUCCL_COLL_REDUCE:
      call.count = (size_t)numel_of(r->in);
      call.root = (unsigned)ruccl_peer_index(c, r->root_peer);
      break;
    default: call.count = (size_t)numel_of(r->in); break;
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
  ruccl_result_t rc = agree(c, &vote_local, net ? &vote_net : NULL, &mine, 1, NULL, &v, &none, NULL, &transport_failed);
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
  describe(c, r, &desc);
  prepared_t prep;
  if (desc.local_error == RUCCL_OK && r->kind != RUCCL_COLL_BARRIER) {
    rc = prepare(c, r, &prep);
    if (rc != RUCCL_OK) {
      desc.local_error = (int32_t)rc;
      snprintf(desc.detail, sizeof desc.detail, "%s", ruccl_last_error());
    }
  }
  fuse_t fuse = {0};
  if (desc.local_error == RUCCL_OK && r->kind == RUCCL_COLL_ALL_REDUCE && g->n == 1 && net && prep.staged &&
      (g->config.global_strategy.kind == RUCCL_STRATEGY_AUTO ||
       g->config.global_strategy.kind == RUCCL_STRATEGY_CENTRALIZED)) {
    fuse = (fuse_t){prep.args.src, prep.args.dst, prep.args.count * ruccl_dtype_size(prep.args.dtype), &prep.args};
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
  rc = agree(c, &team, net, &desc, 0, desc.fuse_bytes ? &fuse : NULL, &verdict, &extras, &all, &transport_failed);
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

/* p2p.c — point-to-point calls (ruccl_isend, ruccl_irecv, their requests, and the
 * blocking and batched forms on top).
 *
 * A send hands its message to the receiver's mailbox (p2p_match.h): directly when
 * the receiver is a thread of this process, over the nodes' point-to-point
 * connections otherwise (net/p2p_net.h).  A receive is posted on its own peer's
 * mailbox and completes when a message matches it.  Nothing here touches the
 * collectives' transports or their ordering, so point-to-point calls may come from
 * any thread at any time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "dtype.h"
#include "error.h"
#include "rank.h"
#include "testing.h"
#include "device/device.h"
#include "net/p2p_net.h"

struct ruccl_request {
  ruccl_group_t *group; /* referenced: the mailbox outlives any handle */
  ruccl_comm_t *comm;   /* for the device copy of a receive; gone once its peer finished */
  unsigned local;       /* the owner's local index */
  int is_recv;
  int posted; /* a receive on its mailbox */
  ruccl_p2p_recv_t recv;
  int64_t deadline_ns;
  ruccl_result_t send_result;
  ruccl_tensor_t tensor; /* the caller's tensor (a receive lands there) */
  void *host;            /* a staging buffer, when the host cannot reach the tensor */
  int landed;            /* a receive's device copy was made (or failed) */
};

static const char *kind_name(int recv) { return recv ? "recv" : "send"; }

static size_t tensor_bytes(const ruccl_tensor_t *t) {
  size_t count = 1;
  for (int d = 0; d < t->ndim; d++) count *= (size_t)t->shape[d];
  return count * ruccl_dtype_size(t->dtype);
}

/* The handle is usable, and the tensor and the other side are valid; sets *peer to
   the other side's global index (or RUCCL_P2P_ANY).  Nothing has moved yet. */
static ruccl_result_t check_call(ruccl_comm_t *c, const ruccl_tensor_t *t, uint32_t peer_id, int recv,
                                 ruccl_request_t **req, uint32_t *peer) {
  if (!c) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "%s: communicator is NULL", kind_name(recv));
  if (!req) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "%s: request output pointer is NULL", kind_name(recv));
  *req = NULL;
  ruccl_group_t *g = c->group;
  if (atomic_load(&g->reset))
    return ruccl_fail(RUCCL_ERR_NOT_REGISTERED, "peer %u: this handle was discarded by ruccl_reset()", c->peer_id);
  ruccl_result_t rc = ruccl_group_status(g);
  if (rc != RUCCL_OK) return rc;
  char detail[RUCCL_DETAIL_MAX];
  rc = ruccl_check_tensor(t, kind_name(recv), detail);
  if (rc != RUCCL_OK) return ruccl_fail(rc, "peer %u: %s", c->peer_id, detail);
  if (recv && peer_id == RUCCL_ANY_PEER) {
    *peer = RUCCL_P2P_ANY;
    return RUCCL_OK;
  }
  int gi = ruccl_peer_index(c, peer_id);
  if (gi < 0)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "peer %u: %s names peer %u, which is no participant", c->peer_id,
                      kind_name(recv), peer_id);
  *peer = (uint32_t)gi;
  return RUCCL_OK;
}

static ruccl_request_t *new_request(ruccl_comm_t *c, const ruccl_tensor_t *t, int recv) {
  ruccl_request_t *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->group = c->group;
  r->comm = c;
  r->local = c->index;
  r->is_recv = recv;
  r->tensor = *t;
  r->deadline_ns = ruccl_deadline_after_ms(ruccl_comm_timeout(c));
  ruccl_group_ref(c->group);
  return r;
}

static void free_host(ruccl_request_t *r) {
  if (r->host) ruccl_device_adapter(r->tensor.device.kind)->host_free(r->tensor.device, r->host);
  r->host = NULL;
}

/* Host memory for the tensor's bytes: its own, or a staging buffer (filled from the
   device for a send). */
static ruccl_result_t stage(ruccl_comm_t *c, ruccl_request_t *r, size_t bytes, void **host) {
  const ruccl_tensor_t *t = &r->tensor;
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(t->device.kind);
  if (ad->host_accessible || !bytes) {
    *host = t->data;
    return RUCCL_OK;
  }
  ruccl_result_t rc = ad->host_alloc(t->device, bytes, &r->host);
  if (rc != RUCCL_OK) return rc;
  *host = r->host;
  return r->is_recv ? RUCCL_OK : ruccl_comm_copy(c, t->device, r->host, t->data, bytes, RUCCL_COPY_TO_HOST);
}

ruccl_result_t ruccl_isend(ruccl_comm_t *c, const ruccl_tensor_t *tensor, uint32_t dst_peer, int32_t tag,
                           ruccl_request_t **req) {
  uint32_t dst = 0;
  ruccl_result_t rc = check_call(c, tensor, dst_peer, 0, req, &dst);
  if (rc != RUCCL_OK) return rc;
  ruccl_group_t *g = c->group;
  ruccl_request_t *r = new_request(c, tensor, 0);
  if (!r) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "send request");
  size_t bytes = tensor_bytes(tensor);
  void *host = NULL;
  rc = stage(c, r, bytes, &host);
  if (rc == RUCCL_OK && g->node_of[dst] == g->node_index) {
    rc = ruccl_mailbox_deliver(&g->mail[g->local_of[dst]], c->global_index, tag, host, bytes);
    if (rc == RUCCL_ERR_PEER_FINISHED)
      rc = ruccl_fail(rc, "peer %u: send to peer %u, which has finished its session", c->peer_id, dst_peer);
    else if (rc != RUCCL_OK)
      rc = ruccl_fail(rc, "peer %u: no memory to hold a message of %zu bytes for peer %u", c->peer_id, bytes, dst_peer);
  } else if (rc == RUCCL_OK) {
    rc = ruccl_p2p_net_send(g->net, g->node_of[dst], c->global_index, dst, tag, host, bytes, r->deadline_ns);
  }
  free_host(r);
  if (rc != RUCCL_OK) {
    ruccl_request_free(r);
    return rc;
  }
  r->send_result = RUCCL_OK;
  *req = r;
  return RUCCL_OK;
}

ruccl_result_t ruccl_irecv(ruccl_comm_t *c, ruccl_tensor_t *tensor, uint32_t src_peer, int32_t tag,
                           ruccl_request_t **req) {
  uint32_t src = 0;
  ruccl_result_t rc = check_call(c, tensor, src_peer, 1, req, &src);
  if (rc != RUCCL_OK) return rc;
  ruccl_request_t *r = new_request(c, tensor, 1);
  if (!r) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "receive request");
  size_t bytes = tensor_bytes(tensor);
  void *host = NULL;
  rc = stage(c, r, bytes, &host);
  if (rc != RUCCL_OK) {
    ruccl_request_free(r);
    return rc;
  }
  r->recv.src = src;
  r->recv.tag = tag;
  r->recv.buf = host;
  r->recv.bytes = bytes;
  ruccl_group_t *g = c->group;
  ruccl_mailbox_post(&g->mail[c->index], &r->recv);
  r->posted = 1;
  /* A peer of this process that finished sends nothing more (its finish fails the
     receives posted before it; this one may have come after). */
  if (src != RUCCL_P2P_ANY && g->node_of[src] == g->node_index && atomic_load(&g->finished[g->local_of[src]])) {
    uint32_t from = src;
    char why[96];
    snprintf(why, sizeof why, "peer %u finished its session", g->all_ids[src]);
    ruccl_mailbox_fail_sources(&g->mail[c->index], &from, 1, RUCCL_ERR_PEER_FINISHED, why);
  }
  *req = r;
  return RUCCL_OK;
}

static ruccl_result_t session_status(void *ctx) { return ruccl_group_status(ctx); }

/* A completed receive's result, its bytes on the device first where they were staged. */
static ruccl_result_t outcome(ruccl_request_t *r) {
  if (!r->is_recv) return r->send_result;
  ruccl_group_t *g = r->group;
  if (r->recv.result == RUCCL_OK && r->host && !r->landed) {
    r->landed = 1;
    if (atomic_load(&g->finished[r->local])) {
      r->recv.result = RUCCL_ERR_NOT_REGISTERED;
      snprintf(r->recv.why, sizeof r->recv.why, "its peer finished before the message was copied to the device");
    } else if (ruccl_comm_copy(r->comm, r->tensor.device, r->tensor.data, r->host, r->recv.bytes,
                               RUCCL_COPY_FROM_HOST) != RUCCL_OK) {
      r->recv.result = RUCCL_ERR_DEVICE;
      snprintf(r->recv.why, sizeof r->recv.why, "%s", ruccl_last_error_detail());
    }
  }
  if (r->recv.result == RUCCL_OK) return RUCCL_OK;
  ruccl_result_t session = ruccl_group_status(g); /* a failed session is the root cause */
  if (session != RUCCL_OK) return session;
  uint32_t from = r->recv.src == RUCCL_P2P_ANY ? RUCCL_ANY_PEER : g->all_ids[r->recv.src];
  if (from == RUCCL_ANY_PEER)
    return ruccl_fail(r->recv.result, "receive (tag %d) from any peer: %s", (int)r->recv.tag, r->recv.why);
  return ruccl_fail(r->recv.result, "receive (tag %d) from peer %u: %s", (int)r->recv.tag, from, r->recv.why);
}

/* Waits until wait_until for one of reqs (one owner) to complete: its position, or -1. */
static long wait_some(ruccl_request_t *const *reqs, size_t n, int64_t wait_until) {
  ruccl_request_t *first = NULL;
  for (size_t i = 0; i < n; i++) {
    if (!reqs[i]) continue;
    if (!reqs[i]->is_recv) return (long)i; /* a send is complete when posted */
    if (!first) first = reqs[i];
  }
  if (!first) return -1;
  ruccl_p2p_recv_t *stack_rs[16];
  int64_t stack_dl[16];
  ruccl_p2p_recv_t **rs = n <= 16 ? stack_rs : malloc(sizeof *rs * n);
  int64_t *dl = n <= 16 ? stack_dl : malloc(sizeof *dl * n);
  long hit = -1;
  if (rs && dl) {
    for (size_t i = 0; i < n; i++) {
      rs[i] = reqs[i] ? &reqs[i]->recv : NULL;
      dl[i] = reqs[i] ? reqs[i]->deadline_ns : 0;
    }
    hit = ruccl_mailbox_wait_any(&first->group->mail[first->local], rs, dl, n, wait_until, session_status,
                                 first->group);
  }
  if (rs != stack_rs) free(rs);
  if (dl != stack_dl) free(dl);
  return hit;
}

ruccl_result_t ruccl_test(ruccl_request_t *r, int *done) {
  if (!r || !done) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "test: request or done is NULL");
  *done = wait_some(&r, 1, 0) == 0;
  return *done ? outcome(r) : RUCCL_OK;
}

ruccl_result_t ruccl_wait(ruccl_request_t *r) {
  if (!r) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "wait: request is NULL");
  if (r->is_recv) {
    ruccl_testing_receiving_step();
    ruccl_testing_pause(); /* a test lags here, before it looks at what arrived */
  }
  wait_some(&r, 1, INT64_MAX);
  ruccl_testing_step_done();
  return outcome(r);
}

ruccl_result_t ruccl_wait_any(ruccl_request_t *const *reqs, size_t n, int64_t timeout_ms, size_t *index) {
  if (!index || (n && !reqs)) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "wait_any: reqs or index is NULL");
  const ruccl_request_t *owner = NULL;
  for (size_t i = 0; i < n; i++) {
    if (!reqs[i] || !reqs[i]->is_recv) continue;
    if (owner && (owner->group != reqs[i]->group || owner->local != reqs[i]->local))
      return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "wait_any: the requests belong to more than one communicator");
    owner = reqs[i];
  }
  long hit = wait_some(reqs, n, timeout_ms < 0 ? INT64_MAX : ruccl_deadline_after_ms(timeout_ms));
  if (hit < 0) return ruccl_fail(RUCCL_ERR_TIMEOUT, "wait_any: none of %zu requests completed within %lld ms", n,
                                 (long long)timeout_ms);
  *index = (size_t)hit;
  return RUCCL_OK;
}

ruccl_result_t ruccl_request_source(const ruccl_request_t *r, uint32_t *peer) {
  if (!r || !peer) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "request_source: request or peer is NULL");
  if (!r->is_recv) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "request_source: a send has no source");
  int done = 0;
  if (ruccl_test((ruccl_request_t *)r, &done) != RUCCL_OK || !done)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "request_source: the receive has not completed successfully");
  *peer = r->group->all_ids[r->recv.source];
  return RUCCL_OK;
}

void ruccl_request_free(ruccl_request_t *r) {
  if (!r) return;
  if (r->posted)
    ruccl_mailbox_cancel(&r->group->mail[r->local], &r->recv, RUCCL_ERR_INVALID_ARGUMENT, "freed while pending");
  free_host(r);
  ruccl_group_unref(r->group);
  free(r);
}

/* ---- the blocking and batched forms ------------------------------------------------ */

ruccl_result_t ruccl_p2p_group(ruccl_comm_t *c, const ruccl_p2p_op_t *ops, size_t n) {
  if (!c) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "p2p: communicator is NULL");
  if (n == 0) {
    if (atomic_load(&c->group->reset))
      return ruccl_fail(RUCCL_ERR_NOT_REGISTERED, "peer %u: this handle was discarded by ruccl_reset()", c->peer_id);
    return ruccl_group_status(c->group);
  }
  if (!ops) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "peer %u: p2p ops is NULL for %zu ops", c->peer_id, n);
  for (size_t i = 0; i < n; i++) /* every op checked before any moves */
    if (ops[i].kind != RUCCL_P2P_SEND && ops[i].kind != RUCCL_P2P_RECV)
      return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "peer %u: p2p op %zu has kind %d, neither send nor recv",
                        c->peer_id, i, (int)ops[i].kind);
  for (size_t i = 0; i < n; i++) {
    uint32_t peer;
    ruccl_request_t *unused;
    ruccl_result_t rc = check_call(c, ops[i].tensor, ops[i].peer, ops[i].kind == RUCCL_P2P_RECV, &unused, &peer);
    if (rc != RUCCL_OK) return ruccl_fail(rc, "p2p op %zu: %s", i, ruccl_last_error_detail());
  }
  ruccl_request_t **reqs = calloc(n, sizeof *reqs);
  if (!reqs) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "%zu p2p requests", n);
  ruccl_result_t first = RUCCL_OK;
  char why[RUCCL_DETAIL_MAX + 64] = "";
  /* Receives first: a send to oneself then meets its receive at once. */
  for (int pass = 0; pass < 2 && first == RUCCL_OK; pass++)
    for (size_t i = 0; i < n && first == RUCCL_OK; i++) {
      const ruccl_p2p_op_t *op = &ops[i];
      if ((op->kind == RUCCL_P2P_RECV) != (pass == 0)) continue;
      first = op->kind == RUCCL_P2P_RECV ? ruccl_irecv(c, op->tensor, op->peer, op->tag, &reqs[i])
                                          : ruccl_isend(c, op->tensor, op->peer, op->tag, &reqs[i]);
      if (first != RUCCL_OK) snprintf(why, sizeof why, "%s", ruccl_last_error());
    }
  for (size_t i = 0; i < n; i++) {
    if (!reqs[i]) continue;
    /* After a failure, receives still pending are withdrawn rather than waited out. */
    ruccl_result_t rc = first == RUCCL_OK ? ruccl_wait(reqs[i]) : RUCCL_OK;
    if (rc != RUCCL_OK && first == RUCCL_OK) {
      first = rc;
      snprintf(why, sizeof why, "%s", ruccl_last_error());
    }
    ruccl_request_free(reqs[i]);
  }
  free(reqs);
  if (first != RUCCL_OK) ruccl_set_last_error(why);
  return first;
}

ruccl_result_t ruccl_send(ruccl_comm_t *c, const ruccl_tensor_t *tensor, uint32_t dst_peer) {
  ruccl_p2p_op_t op = {.kind = RUCCL_P2P_SEND, .tensor = (ruccl_tensor_t *)tensor, .peer = dst_peer};
  return ruccl_p2p_group(c, &op, 1);
}

ruccl_result_t ruccl_recv(ruccl_comm_t *c, ruccl_tensor_t *tensor, uint32_t src_peer) {
  ruccl_p2p_op_t op = {.kind = RUCCL_P2P_RECV, .tensor = tensor, .peer = src_peer};
  return ruccl_p2p_group(c, &op, 1);
}

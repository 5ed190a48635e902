/* p2p.c — point-to-point sends and receives (ruccl_send, ruccl_recv, ruccl_p2p_group).
 *
 * They need no agreement: a send and its receive meet in the transport, which pairs
 * messages per pair of peers in order and checks on arrival that both sides meant a
 * point-to-point message of the same size.  A group runs peer by peer in ascending
 * global index; with one peer, the i-th send and the i-th receive travel in one
 * step.  Whoever is waiting on whom, the partner a peer waits on is always further
 * along that order than the one it waits for, so mirrored groups cannot deadlock. */
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "dtype.h"
#include "error.h"
#include "rank.h"
#include "device/device.h"
#include "net/transport_tcp.h"

typedef struct {
  const ruccl_p2p_op_t *op;
  size_t order; /* position in the caller's list */
  int peer;     /* global index */
  size_t bytes;
  void *host;   /* the bytes on the host: the tensor's own, or a staging buffer */
} p2p_item_t;

static const char *kind_name(ruccl_p2p_kind_t k) { return k == RUCCL_P2P_SEND ? "send" : "recv"; }

static int by_peer_then_order(const void *a, const void *b) {
  const p2p_item_t *x = a, *y = b;
  if (x->peer != y->peer) return x->peer < y->peer ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

/* Checks one operation; nothing has moved yet, so an error here loses nothing. */
static ruccl_result_t check_op(ruccl_comm_t *c, const ruccl_p2p_op_t *op, size_t i, p2p_item_t *it) {
  const ruccl_group_t *g = c->group;
  char detail[RUCCL_DETAIL_MAX];
  if (op->kind != RUCCL_P2P_SEND && op->kind != RUCCL_P2P_RECV)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "peer %u: p2p op %zu has kind %d, neither send nor recv", c->peer_id,
                      i, (int)op->kind);
  ruccl_result_t rc = ruccl_check_tensor(op->tensor, kind_name(op->kind), detail);
  if (rc != RUCCL_OK) return ruccl_fail(rc, "peer %u: p2p op %zu: %s", c->peer_id, i, detail);
  int peer = ruccl_peer_index(c, op->peer);
  if (peer < 0)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "peer %u: %s names peer %u, which is no participant", c->peer_id,
                      kind_name(op->kind), op->peer);
  if (g->node_of[peer] != g->node_index && (c->index != 0 || g->local_of[peer] != 0))
    return ruccl_fail(RUCCL_ERR_UNSUPPORTED,
                      "peer %u: %s with peer %u on another node: between nodes only each node's first peer "
                      "exchanges point-to-point",
                      c->peer_id, kind_name(op->kind), op->peer);
  size_t count = 1;
  for (int d = 0; d < op->tensor->ndim; d++) count *= (size_t)op->tensor->shape[d];
  *it = (p2p_item_t){.op = op, .order = i, .peer = peer, .bytes = count * ruccl_dtype_size(op->tensor->dtype)};
  return RUCCL_OK;
}

/* Host memory for each tensor: its own when the host can reach it, else a buffer
   (filled from the device for a send). */
static ruccl_result_t stage(ruccl_comm_t *c, p2p_item_t *it) {
  const ruccl_tensor_t *t = it->op->tensor;
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(t->device.kind);
  if (ad->host_accessible || !it->bytes) {
    it->host = t->data;
    return RUCCL_OK;
  }
  ruccl_result_t rc = ad->host_alloc(t->device, it->bytes, &it->host);
  if (rc != RUCCL_OK) return rc;
  return it->op->kind == RUCCL_P2P_SEND
             ? ruccl_comm_copy(c, t->device, it->host, t->data, it->bytes, RUCCL_COPY_TO_HOST)
             : RUCCL_OK;
}

static void unstage(p2p_item_t *it, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const ruccl_tensor_t *t = it[i].op ? it[i].op->tensor : NULL;
    if (t && it[i].host && it[i].host != t->data) ruccl_device_adapter(t->device.kind)->host_free(t->device, it[i].host);
  }
}

/* Sends to oneself and receives from oneself pair up in order, as with any peer:
   the k-th send with the k-th receive.  Checked before anything moves. */
static ruccl_result_t check_self(const ruccl_comm_t *c, const p2p_item_t *items, size_t n) {
  int me = (int)c->global_index;
  size_t s = 0, r = 0;
  for (;;) {
    while (s < n && (items[s].peer != me || items[s].op->kind != RUCCL_P2P_SEND)) s++;
    while (r < n && (items[r].peer != me || items[r].op->kind != RUCCL_P2P_RECV)) r++;
    if (s == n && r == n) return RUCCL_OK;
    if (s == n || r == n)
      return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "peer %u: a %s to itself has no matching %s in its group",
                        c->peer_id, s < n ? "send" : "recv", s < n ? "recv" : "send");
    if (items[s].bytes != items[r].bytes)
      return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "peer %u: a send of %zu bytes to itself meets a recv of %zu",
                        c->peer_id, items[s].bytes, items[r].bytes);
    s++, r++;
  }
}

/* Every operation with one peer, its i-th send and i-th receive in one step. */
static ruccl_result_t exchange_with(ruccl_comm_t *c, p2p_item_t *items, size_t n, const ruccl_team_t *local,
                                    const ruccl_team_t *net) {
  const ruccl_group_t *g = c->group;
  int peer = items[0].peer;
  p2p_item_t **sends = malloc(sizeof *sends * n * 2);
  if (!sends) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "p2p step lists");
  p2p_item_t **recvs = sends + n;
  size_t ns = 0, nr = 0;
  for (size_t i = 0; i < n; i++) {
    if (items[i].op->kind == RUCCL_P2P_SEND) sends[ns++] = &items[i];
    else recvs[nr++] = &items[i];
  }
  int same_node = g->node_of[peer] == g->node_index;
  const ruccl_team_t *team = same_node ? local : net;
  int pos = same_node ? (int)g->local_of[peer] : (int)g->node_of[peer];
  ruccl_result_t rc = RUCCL_OK;
  for (size_t k = 0; rc == RUCCL_OK && (k < ns || k < nr); k++) {
    p2p_item_t *s = k < ns ? sends[k] : NULL, *r = k < nr ? recvs[k] : NULL;
    if ((unsigned)peer == c->global_index) { /* paired and sized by check_self */
      if (s->bytes) memmove(r->host, s->host, s->bytes);
      continue;
    }
    ruccl_xfer_t x = {.send_peer = s ? pos : RUCCL_NO_PEER,
                      .send_buf = s ? s->host : NULL,
                      .send_bytes = s ? s->bytes : 0,
                      .recv_peer = r ? pos : RUCCL_NO_PEER,
                      .recv_buf = r ? r->host : NULL,
                      .recv_bytes = r ? r->bytes : 0,
                      .p2p = 1};
    rc = ruccl_team_xfer(team, &x);
  }
  free(sends);
  return rc;
}

ruccl_result_t ruccl_p2p_group(ruccl_comm_t *c, const ruccl_p2p_op_t *ops, size_t n) {
  if (!c) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "p2p: communicator is NULL");
  ruccl_group_t *g = c->group;
  if (atomic_load(&g->reset))
    return ruccl_fail(RUCCL_ERR_NOT_REGISTERED, "peer %u: this handle was discarded by ruccl_reset()", c->peer_id);
  ruccl_result_t rc = ruccl_group_status(g);
  if (rc != RUCCL_OK || n == 0) return rc;
  if (!ops) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "peer %u: p2p ops is NULL for %zu ops", c->peer_id, n);
  p2p_item_t *items = calloc(n, sizeof *items);
  if (!items) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "%zu p2p ops", n);
  for (size_t i = 0; rc == RUCCL_OK && i < n; i++) rc = check_op(c, &ops[i], i, &items[i]);
  if (rc == RUCCL_OK) rc = check_self(c, items, n);
  for (size_t i = 0; rc == RUCCL_OK && i < n; i++) rc = stage(c, &items[i]);
  if (rc != RUCCL_OK) {
    unstage(items, n);
    free(items);
    return rc;
  }
  qsort(items, n, sizeof *items, by_peer_then_order);
  int64_t deadline = ruccl_deadline_after_ms(g->config.timeout_ms);
  ruccl_team_t local = {.ops = &ruccl_inproc_ops, .endpoint = c, .n = g->n, .me = c->index, .deadline_ns = deadline};
  ruccl_team_t net = {.ops = &ruccl_tcp_ops, .endpoint = g->net, .n = g->num_nodes, .me = g->node_index,
                      .deadline_ns = deadline};
  for (size_t i = 0; rc == RUCCL_OK && i < n;) {
    size_t j = i;
    while (j < n && items[j].peer == items[i].peer) j++;
    rc = exchange_with(c, items + i, j - i, &local, &net);
    i = j;
  }
  if (rc == RUCCL_OK) /* receives land on the device */
    for (size_t i = 0; rc == RUCCL_OK && i < n; i++) {
      const ruccl_tensor_t *t = items[i].op->tensor;
      if (items[i].op->kind == RUCCL_P2P_RECV && items[i].host != t->data)
        rc = ruccl_comm_copy(c, t->device, t->data, items[i].host, items[i].bytes, RUCCL_COPY_FROM_HOST);
    }
  unstage(items, n);
  free(items);
  /* A step that failed half-way leaves bytes in flight between the pair: like a failed
     collective, it ends the session for everyone rather than let them pair wrongly. */
  if (rc != RUCCL_OK) ruccl_group_break(g, rc);
  return rc;
}

ruccl_result_t ruccl_send(ruccl_comm_t *c, const ruccl_tensor_t *tensor, uint32_t dst_peer) {
  ruccl_p2p_op_t op = {.kind = RUCCL_P2P_SEND, .tensor = (ruccl_tensor_t *)tensor, .peer = dst_peer};
  return ruccl_p2p_group(c, &op, 1);
}

ruccl_result_t ruccl_recv(ruccl_comm_t *c, ruccl_tensor_t *tensor, uint32_t src_peer) {
  ruccl_p2p_op_t op = {.kind = RUCCL_P2P_RECV, .tensor = tensor, .peer = src_peer};
  return ruccl_p2p_group(c, &op, 1);
}

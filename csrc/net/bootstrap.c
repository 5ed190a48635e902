/* bootstrap.c — a node joins its group through the orchestrator and learns every
   other node's data address. */
#include "bootstrap.h"

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../config.h"
#include "../error.h"
#include "../transport.h"
#include "wire.h"

static uint32_t min_id(const ruccl_join_t *j) {
  uint32_t m = j->peer_ids[0];
  for (uint32_t i = 1; i < j->num_local; i++)
    if (j->peer_ids[i] < m) m = j->peer_ids[i];
  return m;
}

static int by_min_id(const void *a, const void *b) {
  uint32_t x = min_id(a), y = min_id(b);
  return x < y ? -1 : x > y;
}

ruccl_result_t ruccl_bootstrap_join(const char *host_port, const unsigned char key[RUCCL_AUTH_KEY_BYTES],
                                    const ruccl_join_t *me, int64_t deadline_ns, int *fd_out, ruccl_table_t *table) {
  char host[RUCCL_MAX_ADDRESS];
  int port, fd = -1;
  /* The JOIN first: once connected the handshake only answers (the orchestrator
     gives a pending handshake a few seconds).  The JOIN travels inside the
     handshake: the orchestrator reads it once we proved the secret. */
  size_t len = 0;
  unsigned char *wire = NULL;
  ruccl_result_t rc = ruccl_split_host_port(host_port, host, sizeof host, &port);
  if (rc == RUCCL_OK && !(wire = ruccl_join_encode(me, &len))) rc = ruccl_fail(RUCCL_ERR_NO_MEMORY, "JOIN");
  if (rc == RUCCL_OK) rc = ruccl_tcp_connect(host, port, deadline_ns, &fd);
  if (rc == RUCCL_ERR_TIMEOUT) rc = ruccl_fail(RUCCL_ERR_TIMEOUT, "the orchestrator at %s is unreachable", host_port);
  if (rc == RUCCL_OK) rc = ruccl_auth_client(fd, key, RUCCL_FRAME_JOIN, wire, (uint32_t)len, deadline_ns);
  free(wire);
  if (rc != RUCCL_OK && fd < 0) return rc;
  if (rc == RUCCL_OK)
    ruccl_log(2, "joined group '%s' at the orchestrator %s: waiting for its %u nodes", me->group, host_port,
              me->num_nodes);
  unsigned char *buf = rc == RUCCL_OK ? malloc(RUCCL_WIRE_MAX_CONTROL) : NULL;
  if (rc == RUCCL_OK && !buf) rc = ruccl_fail(RUCCL_ERR_NO_MEMORY, "TABLE buffer");
  /* An ERROR, or the TABLE in chunks (ruccl_table_decode_chunk) until it is whole. */
  memset(table, 0, sizeof *table);
  uint32_t filled = 0;
  while (rc == RUCCL_OK && (!table->nodes || filled < table->num_nodes)) {
    uint16_t type = 0;
    uint32_t n = 0;
    rc = ruccl_frame_recv(fd, &type, buf, RUCCL_WIRE_MAX_CONTROL, &n, deadline_ns);
    if (rc == RUCCL_ERR_TIMEOUT && table->nodes)
      rc = ruccl_fail(RUCCL_ERR_TIMEOUT, "the orchestrator sent %u of %u nodes' addresses before the timeout", filled,
                      table->num_nodes);
    else if (rc == RUCCL_ERR_TIMEOUT)
      rc = ruccl_fail(RUCCL_ERR_TIMEOUT, "not every node of group '%s' joined before the timeout", me->group);
    if (rc == RUCCL_OK && type == RUCCL_FRAME_ERROR && !table->nodes) {
      ruccl_result_t code;
      char message[RUCCL_ERROR_MESSAGE_MAX + 1];
      rc = ruccl_error_decode(buf, n, &code, message);
      if (rc == RUCCL_OK) rc = ruccl_fail(code, "orchestrator: %s", message);
    } else if (rc == RUCCL_OK && type == RUCCL_FRAME_NODE_LOST && n == RUCCL_NODE_LOST_BYTES) {
      /* a node that had its table went before this one had all of its own */
      uint32_t id = ruccl_node_lost_decode(buf);
      rc = ruccl_fail(RUCCL_ERR_PEER_LOST, "the orchestrator says the node of peer %u went before it linked", id);
    } else if (rc == RUCCL_OK && type == RUCCL_FRAME_TABLE) {
      rc = ruccl_table_decode_chunk(buf, n, table, &filled);
    } else if (rc == RUCCL_OK) {
      rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "orchestrator answered with frame type %u", type);
    }
  }
  if (rc != RUCCL_OK) ruccl_table_free(table);
  free(buf);
  if (rc == RUCCL_OK && table->num_nodes != me->num_nodes) {
    rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "orchestrator listed %u nodes, %u expected", table->num_nodes, me->num_nodes);
    ruccl_table_free(table);
  }
  if (rc != RUCCL_OK) {
    close(fd);
    return rc;
  }
  ruccl_table_sort(table);
  *fd_out = fd;
  return RUCCL_OK;
}

void ruccl_table_sort(ruccl_table_t *table) {
  qsort(table->nodes, table->num_nodes, sizeof *table->nodes, by_min_id);
}

static ruccl_result_t orchestrator_join(void *ctx, const ruccl_config_t *cfg,
                                        const unsigned char key[RUCCL_AUTH_KEY_BYTES], const ruccl_join_t *me,
                                        int64_t deadline_ns, int *handle, ruccl_table_t *table) {
  (void)ctx;
  return ruccl_bootstrap_join(cfg->global_address, key, me, deadline_ns, handle, table);
}

static void orchestrator_leave(void *ctx, int handle) {
  (void)ctx;
  ruccl_bootstrap_leave(handle);
}

const ruccl_bootstrap_t ruccl_orchestrator_bootstrap = {
    .name = "orchestrator",
    .join = orchestrator_join,
    .leave = orchestrator_leave,
};

void ruccl_bootstrap_leave(int fd) {
  if (fd < 0) return;
  ruccl_frame_send(fd, RUCCL_FRAME_LEAVE, NULL, 0, ruccl_now_ns() + 1000000000);
  close(fd);
}

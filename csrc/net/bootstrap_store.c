/* bootstrap_store.c — the rendezvous through a caller's key-value store (torch's
   c10d::Store behind the PyTorch backend): no orchestrator, no extra server.

   Each node takes a ticket from a counter; tickets [k*N, (k+1)*N) make session k of
   the group (so a store that outlives one session serves the next), and ticket t
   publishes its JOIN under ".../<k>/node/<t mod N>".  Every node then reads all N
   JOINs and checks them itself: a differing configuration or a peer id claimed twice
   is seen by every node, with the same code the orchestrator would give.

   A job restarted on the same store (torchrun keeps its store across restarts) may
   find the counter off a session's boundary: an attempt whose nodes took some tickets
   of a session, then died before the rest did (a worker killed while it started).
   The next attempt's first nodes then land in that dead session, the others in the
   next one, and every restart would repeat it.  So a node checks that its session is
   alive: the node of the session's first ticket listened before it joined and stays
   there until its own table is complete (it then counts itself in ".../<k>/complete").
   If that node's data port refuses connections and nobody of the session ever
   completed, the session is a dead attempt's leftover: the node takes the next ticket
   instead, and the attempt's nodes meet in the next session. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../error.h"
#include "../transport.h"
#include "bootstrap.h"
#include "wire.h"

static ruccl_result_t store_rc(ruccl_result_t rc, const char *what, const char *key) {
  if (rc == RUCCL_OK) return rc;
  if (rc == RUCCL_ERR_TIMEOUT) return ruccl_fail(rc, "store: %s '%s' did not come before the timeout", what, key);
  return ruccl_fail(rc, "store: %s '%s' failed", what, key);
}

static ruccl_result_t check_table(const ruccl_join_t *me, const ruccl_table_t *t) {
  for (uint32_t k = 0; k < t->num_nodes; k++) {
    const ruccl_join_t *j = &t->nodes[k];
    if (j->num_nodes != me->num_nodes || memcmp(j->digest, me->digest, sizeof me->digest) != 0 ||
        strcmp(j->group, me->group) != 0)
      return ruccl_fail(RUCCL_ERR_CONFIG_MISMATCH,
                        "node %s:%u joined group '%s' with a configuration that differs from the others'", j->address,
                        j->data_port, me->group);
  }
  for (uint32_t k = 0; k < t->num_nodes; k++)
    for (uint32_t m = k + 1; m < t->num_nodes; m++)
      for (uint32_t a = 0; a < t->nodes[k].num_local; a++)
        for (uint32_t b = 0; b < t->nodes[m].num_local; b++)
          if (t->nodes[k].peer_ids[a] == t->nodes[m].peer_ids[b])
            return ruccl_fail(RUCCL_ERR_DUPLICATE_REGISTRATION, "peer id %u is registered on two nodes of group '%s'",
                              t->nodes[k].peer_ids[a], me->group);
  return RUCCL_OK;
}

/* The counter of a session's nodes whose table was complete (see above). */
static void complete_key(char *key, size_t cap, const char *group, int64_t session) {
  snprintf(key, cap, "ruccl/%s/%" PRId64 "/complete", group, session);
}

/* Whether session `session`, whose first ticket's JOIN is `first`, is a dead attempt's
   leftover (see above).  Any doubt (the port answers, the store fails) says no: the
   set-up then reports what it finds, as it always did. */
static int dead_session(const ruccl_store_t *st, const char *group, int64_t session, const ruccl_join_t *first) {
  int fd = -1;
  ruccl_result_t rc = ruccl_tcp_connect_ex(first->address, (int)first->data_port,
                                           ruccl_now_ns() + 2000LL * 1000000, 0, &fd);
  if (fd >= 0) close(fd); /* there: a data port drops a probe quietly */
  if (rc != RUCCL_ERR_PEER_LOST) return 0;
  char key[RUCCL_MAX_GROUP_NAME + 64];
  int64_t completed = 0;
  complete_key(key, sizeof key, group, session);
  return st->add(st->ctx, key, 0, &completed) == RUCCL_OK && completed == 0;
}

/* One ticket: publishes `me` in its session and reads that session's N JOINs into
   `table` (sorted by nothing yet: index = ticket order).  *dead says the session is a
   dead attempt's leftover (the caller takes another ticket). */
static ruccl_result_t join_session(const ruccl_store_t *st, const ruccl_join_t *me, int64_t deadline_ns,
                                   ruccl_table_t *table, int64_t *session_out, int *dead) {
  uint32_t n = me->num_nodes;
  char key[RUCCL_MAX_GROUP_NAME + 64];
  int64_t ticket = 0;
  *dead = 0;
  snprintf(key, sizeof key, "ruccl/%s/joins", me->group);
  ruccl_result_t rc = store_rc(st->add(st->ctx, key, 1, &ticket), "add", key);
  if (rc != RUCCL_OK) return rc;
  if (ticket < 1) return ruccl_fail(RUCCL_ERR_PROTOCOL, "store: counter '%s' gave %" PRId64, key, ticket);
  int64_t session = (ticket - 1) / n;
  uint32_t index = (uint32_t)((ticket - 1) % n);
  *session_out = session;
  size_t len = 0;
  unsigned char *wire = ruccl_join_encode(me, &len);
  if (!wire) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "JOIN");
  snprintf(key, sizeof key, "ruccl/%s/%" PRId64 "/node/%u", me->group, session, index);
  rc = store_rc(st->set(st->ctx, key, wire, len), "set", key);
  free(wire);
  const size_t cap = RUCCL_WIRE_MAX_CONTROL; /* a longer value is no JOIN */
  unsigned char *buf = rc == RUCCL_OK ? malloc(cap) : NULL;
  if (rc == RUCCL_OK && !buf) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "JOIN buffer");
  table->num_nodes = n;
  table->nodes = rc == RUCCL_OK ? calloc(n, sizeof *table->nodes) : NULL;
  if (rc == RUCCL_OK && !table->nodes) rc = ruccl_fail(RUCCL_ERR_NO_MEMORY, "table of %u nodes", n);
  for (uint32_t k = 0; rc == RUCCL_OK && k < n; k++) {
    snprintf(key, sizeof key, "ruccl/%s/%" PRId64 "/node/%u", me->group, session, k);
    int64_t left_ms = (deadline_ns - ruccl_now_ns()) / 1000000;
    size_t got = 0;
    rc = store_rc(st->get(st->ctx, key, buf, cap, &got, left_ms > 0 ? left_ms : 0), "key", key);
    if (rc == RUCCL_ERR_TIMEOUT)
      rc = ruccl_fail(RUCCL_ERR_TIMEOUT, "not every node of group '%s' joined before the timeout", me->group);
    if (rc == RUCCL_OK && got > cap)
      rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "store: '%s' holds %zu bytes, no JOIN is that long", key, got);
    if (rc == RUCCL_OK) rc = ruccl_join_decode(buf, got, &table->nodes[k]);
    /* the first ticket's node, once its JOIN is here: is the session alive? */
    if (rc == RUCCL_OK && k == 0 && index != 0 && dead_session(st, me->group, session, &table->nodes[0])) {
      ruccl_log(1, "store: session %" PRId64 " of group '%s' is a dead attempt's (its first node, %s:%u, is gone "
                "and nobody completed it): taking another ticket", session, me->group, table->nodes[0].address,
                table->nodes[0].data_port);
      *dead = 1;
      break;
    }
  }
  free(buf);
  if (rc != RUCCL_OK || *dead) ruccl_table_free(table);
  return rc;
}

static ruccl_result_t store_join(void *ctx, const ruccl_config_t *cfg, const unsigned char auth_key[RUCCL_AUTH_KEY_BYTES],
                                 const ruccl_join_t *me, int64_t deadline_ns, int *handle, ruccl_table_t *table) {
  (void)ctx, (void)auth_key; /* the store is trusted as torch's is: the links authenticate */
  const ruccl_store_t *st = &cfg->store;
  int64_t session = 0;
  int dead = 1;
  ruccl_result_t rc = RUCCL_OK;
  while (rc == RUCCL_OK && dead) rc = join_session(st, me, deadline_ns, table, &session, &dead);
  if (rc == RUCCL_OK) rc = check_table(me, table);
  if (rc == RUCCL_OK) { /* this session is alive from now on: count this node in */
    char key[RUCCL_MAX_GROUP_NAME + 64];
    int64_t completed = 0;
    complete_key(key, sizeof key, me->group, session);
    rc = store_rc(st->add(st->ctx, key, 1, &completed), "add", key);
  }
  if (rc != RUCCL_OK) {
    ruccl_table_free(table);
    return rc;
  }
  ruccl_table_sort(table);
  *handle = -1;
  return RUCCL_OK;
}

/* Nothing to leave: the keys stay for the store's lifetime, the next session of the
   group takes the next tickets. */
static void store_leave(void *ctx, int handle) { (void)ctx, (void)handle; }

const ruccl_bootstrap_t ruccl_store_bootstrap = {
    .name = "store",
    .join = store_join,
    .leave = store_leave,
};

/* session.c — turns a node's completed local rendezvous into a multi-node session:
   open the data service, join through the orchestrator (or the caller's store),
   link to node 0 and the ring neighbours (the other pairs link on first use:
   transport_tcp.h), and number every peer of the session in ascending-id order. */
#include "session.h"

#include <openssl/crypto.h>
#include <signal.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../config.h"
#include "../error.h"
#include "../rank.h"
#include "../testing.h"
#include "agree_net.h"
#include "bootstrap.h"
#include "p2p_net.h"
#include "shm_link.h"
#include "transport_tcp.h"

/* How long a silent node may stay silent (0: no watch): the configuration's, else
   RUCCL_LIVENESS_TIMEOUT_MS, else the default. */
int64_t ruccl_session_liveness_ms(const ruccl_config_t *cfg) {
  if (cfg->liveness_timeout_ms >= 0) return cfg->liveness_timeout_ms;
  const char *e = getenv("RUCCL_LIVENESS_TIMEOUT_MS");
  if (!e || !*e) return RUCCL_DEFAULT_LIVENESS_TIMEOUT_MS;
  char *end = NULL;
  long long v = strtoll(e, &end, 10);
  if (*end || v < 0) {
    ruccl_log(1, "RUCCL_LIVENESS_TIMEOUT_MS=%s is not a number of milliseconds: using %d", e,
              RUCCL_DEFAULT_LIVENESS_TIMEOUT_MS);
    return RUCCL_DEFAULT_LIVENESS_TIMEOUT_MS;
  }
  return v;
}

/* The set-up grace (RUCCL_LIVENESS_SETUP_GRACE_MS, default 2 min): at least the
   liveness timeout, at most the session's timeout; 0 when liveness is off. */
static int64_t setup_grace_ms(int64_t liveness_ms, int64_t timeout_ms) {
  if (liveness_ms <= 0) return 0;
  int64_t grace_ms = RUCCL_LIVENESS_SETUP_GRACE_MS;
  const char *e = getenv("RUCCL_LIVENESS_SETUP_GRACE_MS");
  if (e && *e) {
    char *end = NULL;
    long long v = strtoll(e, &end, 10);
    if (*end || v <= 0)
      ruccl_log(1, "RUCCL_LIVENESS_SETUP_GRACE_MS=%s is not a number of ms: using %d", e, RUCCL_LIVENESS_SETUP_GRACE_MS);
    else
      grace_ms = v;
  }
  if (grace_ms < liveness_ms) grace_ms = liveness_ms;
  if (grace_ms > timeout_ms) grace_ms = timeout_ms;
  return grace_ms;
}

/* What every node must agree on, hashed (the secret is proven by the handshake).
   The liveness timeout too: a node that does not watch does not beat either, and a
   watching successor would take its silence for a loss. */
static void config_digest(const ruccl_config_t *c, int64_t liveness_ms, unsigned char out[RUCCL_DIGEST_BYTES]) {
  uint32_t fields[6] = {c->num_devices, (uint32_t)c->local_strategy.kind, c->local_strategy.arity,
                        (uint32_t)c->global_strategy.kind, c->global_strategy.arity, c->num_nodes};
  unsigned char liveness[8];
  uint64_t ms = (uint64_t)liveness_ms;
  for (int i = 0; i < 8; i++) liveness[i] = (unsigned char)(ms >> (8 * i)); /* little-endian on the wire */
  unsigned int len = RUCCL_DIGEST_BYTES;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  EVP_DigestUpdate(ctx, fields, sizeof fields);
  EVP_DigestUpdate(ctx, liveness, sizeof liveness);
  EVP_DigestUpdate(ctx, c->group_name, strlen(c->group_name));
  EVP_DigestFinal_ex(ctx, out, &len);
  EVP_MD_CTX_free(ctx);
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Fills the global numbering from the table (nodes sorted by smallest id). */
static ruccl_result_t number_peers(ruccl_group_t *g, const ruccl_table_t *t, unsigned me) {
  unsigned n = g->n, nodes = t->num_nodes, total = n * nodes;
  for (unsigned k = 0; k < nodes; k++)
    if (t->nodes[k].num_local != n)
      return ruccl_fail(RUCCL_ERR_CONFIG_MISMATCH, "node %u has %u peers, this node %u", k, t->nodes[k].num_local, n);
  uint32_t *ids = malloc(sizeof *ids * total);
  unsigned *members = malloc(sizeof *members * total), *node_of = malloc(sizeof *node_of * total),
           *local_of = malloc(sizeof *local_of * total);
  if (!ids || !members || !node_of || !local_of) {
    free(ids), free(members), free(node_of), free(local_of);
    return ruccl_fail(RUCCL_ERR_NO_MEMORY, "peer tables");
  }
  for (unsigned k = 0; k < nodes; k++)
    for (unsigned l = 0; l < n; l++) ids[k * n + l] = t->nodes[k].peer_ids[l];
  qsort(ids, total, sizeof *ids, cmp_u32);
  for (unsigned k = 0; k < nodes; k++) {
    uint32_t local[RUCCL_WIRE_MAX_LOCAL];
    memcpy(local, t->nodes[k].peer_ids, sizeof(uint32_t) * n);
    qsort(local, n, sizeof *local, cmp_u32);
    for (unsigned l = 0; l < n; l++) {
      uint32_t *hit = bsearch(&local[l], ids, total, sizeof *ids, cmp_u32);
      unsigned gi = (unsigned)(hit - ids);
      members[k * n + l] = gi;
      node_of[gi] = k;
      local_of[gi] = l;
    }
  }
  g->n_total = total;
  g->num_nodes = nodes;
  g->node_index = me;
  g->all_ids = ids;
  g->node_members = members;
  g->node_of = node_of;
  g->local_of = local_of;
  return RUCCL_OK;
}

/* Point-to-point arrivals for a peer of this node go to its mailbox. */
static ruccl_mailbox_t *mailbox_of(void *ctx, uint32_t global_index) {
  ruccl_group_t *g = ctx;
  if (global_index >= g->n_total || g->node_of[global_index] != g->node_index) return NULL;
  return &g->mail[g->local_of[global_index]];
}

/* Another node stopped the session and said why on its control connection. */
static void node_stopped(void *ctx, unsigned node, ruccl_result_t code) {
  ruccl_fail(code, "node %u stopped the session (%s)", node, ruccl_error_string(code));
  ruccl_group_break(ctx, code);
}

/* The node before this one in the ring of nodes went silent for longer than the
   liveness timeout. */
static void node_silent(void *ctx, unsigned node, int64_t ms) {
  ruccl_fail(RUCCL_ERR_PEER_LOST, "node %u sent nothing for %lld ms, more than the liveness timeout "
             "(RUCCL_LIVENESS_TIMEOUT_MS): frozen, cut off or gone", node, (long long)ms);
  ruccl_group_break(ctx, RUCCL_ERR_PEER_LOST);
}

/* A node's connections of the session of `group`, their data service listening on
   host:port (0: any free port) before anything joins. */
static ruccl_result_t listening_net(const char *group, const unsigned char key[RUCCL_AUTH_KEY_BYTES],
                                    int64_t timeout_ms, int64_t grace_ms, const ruccl_bootstrap_t *bootstrap,
                                    const char *host, unsigned port, ruccl_net_t **out) {
  ruccl_net_t *net = calloc(1, sizeof *net);
  if (!net) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "network session");
  snprintf(net->group, sizeof net->group, "%s", group);
  memcpy(net->key, key, sizeof net->key);
  net->timeout_ms = timeout_ms;
  net->setup_grace_ms = grace_ms;
  net->bootstrap = bootstrap;
  ruccl_result_t rc = ruccl_net_listen(net, host, port);
  if (rc != RUCCL_OK) {
    OPENSSL_cleanse(net->key, sizeof net->key);
    free(net);
    return rc;
  }
  *out = net;
  return RUCCL_OK;
}

/* This node is node `me` of table: numbers g's peers from it, and links. */
static ruccl_result_t join_table(ruccl_group_t *g, ruccl_net_t *net, const ruccl_table_t *table, unsigned me,
                                 int64_t deadline) {
  ruccl_result_t rc = number_peers(g, table, me);
  if (rc != RUCCL_OK) return rc;
  ruccl_p2p_routes_t routes = {
      .mailbox = mailbox_of, .ctx = g, .n_total = g->n_total, .node_of = g->node_of, .stopped = node_stopped,
      .silent = node_silent};
  rc = ruccl_net_prepare(net, table, me);
  if (rc == RUCCL_OK) rc = ruccl_agree_net_init(net);
  if (rc == RUCCL_OK) rc = ruccl_p2p_net_init(net, &routes);
  if (rc == RUCCL_OK) rc = ruccl_session_transport()->connect(net, deadline);
  return rc;
}

ruccl_result_t ruccl_session_connect(ruccl_group_t *g, struct ruccl_net **out) {
  const ruccl_config_t *cfg = &g->config;
  const ruccl_bootstrap_t *bootstrap =
      ruccl_config_has_store(cfg) ? &ruccl_store_bootstrap : &ruccl_orchestrator_bootstrap;
  int64_t deadline = ruccl_deadline_after_ms(cfg->timeout_ms);
  const int64_t liveness_ms = ruccl_session_liveness_ms(cfg); /* agreed in the digest, then watched */
  unsigned char secret[RUCCL_MAX_SECRET], key[RUCCL_AUTH_KEY_BYTES];
  size_t secret_len = 0;
  ruccl_result_t rc = ruccl_config_session_secret(cfg, secret, &secret_len);
  if (rc == RUCCL_OK) rc = ruccl_auth_key(secret, secret_len, key);
  OPENSSL_cleanse(secret, sizeof secret);
  ruccl_net_t *net = NULL;
  if (rc == RUCCL_OK)
    rc = listening_net(cfg->group_name, key, cfg->timeout_ms, setup_grace_ms(liveness_ms, cfg->timeout_ms), bootstrap,
                       cfg->node_address, cfg->data_service_port, &net);
  OPENSSL_cleanse(key, sizeof key);
  if (rc != RUCCL_OK) return rc;
  net->cancel = &g->cancel;
  ruccl_join_t *me = calloc(1, sizeof *me);
  ruccl_table_t table = {0};
  if (!me) rc = ruccl_fail(RUCCL_ERR_NO_MEMORY, "JOIN");
  if (rc == RUCCL_OK) {
    snprintf(me->group, sizeof me->group, "%s", cfg->group_name);
    me->num_nodes = cfg->num_nodes;
    config_digest(cfg, liveness_ms, me->digest);
    snprintf(me->address, sizeof me->address, "%s", cfg->node_address);
    me->data_port = (uint32_t)net->data_port;
    ruccl_host_id(me->host);
    me->num_local = g->n;
    for (unsigned i = 0; i < g->n; i++) me->peer_ids[i] = g->peer_ids_store[i];
    rc = bootstrap->join(bootstrap->ctx, cfg, net->key, me, deadline, &net->orchestrator_fd, &table);
    if (bootstrap == &ruccl_orchestrator_bootstrap) net->orchestrator_news = net->orchestrator_fd;
    if (rc == RUCCL_OK && ruccl_testing_die_after_table() == 1) _exit(7); /* a crash right after the table */
    if (rc == RUCCL_OK && ruccl_testing_die_after_table() == 2) raise(SIGSTOP); /* frozen right after it */
  }
  unsigned my_node = 0;
  if (rc == RUCCL_OK) {
    for (unsigned k = 0; k < table.num_nodes; k++)
      if (table.nodes[k].data_port == me->data_port && strcmp(table.nodes[k].address, me->address) == 0 &&
          table.nodes[k].peer_ids[0] == me->peer_ids[0])
        my_node = k;
    rc = join_table(g, net, &table, my_node, deadline);
  }
  ruccl_table_free(&table);
  free(me);
  if (rc != RUCCL_OK) {
    bootstrap->leave(bootstrap->ctx, net->orchestrator_fd);
    ruccl_session_discard(net);
    return rc;
  }
  ruccl_p2p_net_start_liveness(net, liveness_ms);
  *out = net; /* the registry publishes it, under its lock */
  ruccl_log(2, "group '%s': node %u of %u connected, %u peers in all", cfg->group_name, my_node, g->num_nodes,
            g->n_total);
  return RUCCL_OK;
}

ruccl_result_t ruccl_session_open(const struct ruccl_net *old, const ruccl_config_t *cfg, struct ruccl_net **out) {
  /* the old bootstrap, with no handle: nothing to leave */
  return listening_net(cfg->group_name, old->key, old->timeout_ms, old->setup_grace_ms, old->bootstrap,
                       old->nodes[old->me].address, 0, out);
}

unsigned ruccl_session_port(const struct ruccl_net *net) { return (unsigned)net->data_port; }

ruccl_result_t ruccl_session_join(ruccl_group_t *g, struct ruccl_net *net, const ruccl_table_t *table, unsigned me) {
  net->cancel = &g->cancel;
  ruccl_result_t rc = join_table(g, net, table, me, ruccl_deadline_after_ms(g->config.timeout_ms));
  if (rc != RUCCL_OK) return rc;
  ruccl_p2p_net_start_liveness(net, ruccl_session_liveness_ms(&g->config));
  ruccl_log(2, "group '%s': node %u of %u of a shrunk session connected, %u peers in all", g->config.group_name, me,
            g->num_nodes, g->n_total);
  return RUCCL_OK;
}

void ruccl_session_discard(struct ruccl_net *net) {
  ruccl_session_transport()->close(net, 0);
  OPENSSL_cleanse(net->key, sizeof net->key);
  free(net);
}

void ruccl_session_close(ruccl_group_t *g, int finished) {
  if (!g->net) return;
  const ruccl_bootstrap_t *bootstrap = g->net->bootstrap;
  bootstrap->leave(bootstrap->ctx, g->net->orchestrator_fd);
  ruccl_session_transport()->close(g->net, finished);
  free(g->net);
  g->net = NULL;
}

const ruccl_transport_ops_t *ruccl_session_transport(void) { return &ruccl_tcp_ops; }

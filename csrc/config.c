/* config.c — the collective configuration: defaults, validating setters, and the
   checks made at registration (all-or-none multi-node settings, agreement). */
#include "config.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

ruccl_config_t ruccl_config_default(void) {
  ruccl_config_t c;
  memset(&c, 0, sizeof c);
  c.num_devices = 1;
  c.local_strategy.kind = RUCCL_STRATEGY_AUTO;
  c.local_strategy.arity = 2;
  c.global_strategy.kind = RUCCL_STRATEGY_AUTO;
  c.global_strategy.arity = 2;
  c.num_nodes = 1;
  c.timeout_ms = RUCCL_DEFAULT_TIMEOUT_MS;
  c.liveness_timeout_ms = -1; /* unset: RUCCL_LIVENESS_TIMEOUT_MS, else the default */
  strcpy(c.group_name, RUCCL_DEFAULT_GROUP_NAME);
  return c;
}

#define NEED_CONFIG(c) \
  if (!(c)) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "config is NULL")

ruccl_result_t ruccl_config_set_num_devices(ruccl_config_t *c, unsigned n) {
  NEED_CONFIG(c);
  if (n == 0 || n > RUCCL_MAX_LOCAL_PEERS)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "num_devices must be in 1..%d, got %u", RUCCL_MAX_LOCAL_PEERS, n);
  c->num_devices = n;
  return RUCCL_OK;
}

static ruccl_result_t check_strategy(ruccl_strategy_t s) {
  if ((unsigned)s.kind > RUCCL_STRATEGY_RING)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "unknown strategy kind %d", (int)s.kind);
  if (s.kind == RUCCL_STRATEGY_TREE && (s.arity < 1 || s.arity > RUCCL_MAX_LOCAL_PEERS))
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "tree arity must be in 1..%d, got %u", RUCCL_MAX_LOCAL_PEERS,
                      s.arity);
  return RUCCL_OK;
}

static ruccl_strategy_t normalized(ruccl_strategy_t s) {
  if (s.kind != RUCCL_STRATEGY_TREE) s.arity = 2; /* arity means nothing elsewhere: keep it comparable */
  return s;
}

static ruccl_result_t set_strategy(ruccl_strategy_t *field, ruccl_strategy_t s) {
  ruccl_result_t rc = check_strategy(s);
  if (rc == RUCCL_OK) *field = normalized(s);
  return rc;
}

ruccl_result_t ruccl_config_set_local_strategy(ruccl_config_t *c, ruccl_strategy_t s) {
  NEED_CONFIG(c);
  return set_strategy(&c->local_strategy, s);
}

ruccl_result_t ruccl_config_set_global_strategy(ruccl_config_t *c, ruccl_strategy_t s) {
  NEED_CONFIG(c);
  return set_strategy(&c->global_strategy, s);
}

ruccl_result_t ruccl_config_set_num_nodes(ruccl_config_t *c, unsigned n) {
  NEED_CONFIG(c);
  if (n == 0 || n > RUCCL_MAX_NODES)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "num_nodes must be in 1..%d, got %u", RUCCL_MAX_NODES, n);
  c->num_nodes = n;
  c->multi_node_set |= RUCCL_CONFIG_NUM_NODES;
  return RUCCL_OK;
}

static ruccl_result_t copy_text(char *dst, size_t cap, const char *src, const char *what) {
  if (!src || !*src) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "%s is NULL or empty", what);
  size_t len = strlen(src);
  if (len >= cap) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "%s is longer than %zu bytes", what, cap - 1);
  memcpy(dst, src, len + 1);
  return RUCCL_OK;
}

ruccl_result_t ruccl_config_set_global_address(ruccl_config_t *c, const char *host_port) {
  NEED_CONFIG(c);
  ruccl_result_t rc = copy_text(c->global_address, sizeof c->global_address, host_port, "global address");
  if (rc == RUCCL_OK) c->multi_node_set |= RUCCL_CONFIG_GLOBAL_ADDRESS;
  return rc;
}

ruccl_result_t ruccl_config_set_node_address(ruccl_config_t *c, const char *host) {
  NEED_CONFIG(c);
  ruccl_result_t rc = copy_text(c->node_address, sizeof c->node_address, host, "node address");
  if (rc == RUCCL_OK) c->multi_node_set |= RUCCL_CONFIG_NODE_ADDRESS;
  return rc;
}

ruccl_result_t ruccl_config_set_data_service_port(ruccl_config_t *c, unsigned port) {
  NEED_CONFIG(c);
  if (port > 65535) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "data service port %u is above 65535", port);
  c->data_service_port = port;
  c->multi_node_set |= RUCCL_CONFIG_DATA_SERVICE_PORT;
  return RUCCL_OK;
}

ruccl_result_t ruccl_config_set_timeout_ms(ruccl_config_t *c, int64_t ms) {
  NEED_CONFIG(c);
  if (ms <= 0) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "timeout must be > 0 ms, got %lld", (long long)ms);
  c->timeout_ms = ms;
  return RUCCL_OK;
}

ruccl_result_t ruccl_config_set_liveness_timeout_ms(ruccl_config_t *c, int64_t ms) {
  NEED_CONFIG(c);
  if (ms < 0)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "liveness timeout must be >= 0 ms (0: no watch), got %lld",
                      (long long)ms);
  c->liveness_timeout_ms = ms;
  return RUCCL_OK;
}

ruccl_result_t ruccl_config_set_secret(ruccl_config_t *c, const void *key, size_t len) {
  NEED_CONFIG(c);
  if (len > RUCCL_MAX_SECRET)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "secret is %zu bytes, at most %d allowed", len, RUCCL_MAX_SECRET);
  if (len > 0 && !key) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "secret key is NULL");
  memset(c->secret, 0, sizeof c->secret);
  if (len) memcpy(c->secret, key, len);
  c->secret_len = len;
  return RUCCL_OK;
}

ruccl_result_t ruccl_config_set_group_name(ruccl_config_t *c, const char *name) {
  NEED_CONFIG(c);
  return copy_text(c->group_name, sizeof c->group_name, name, "group name");
}

ruccl_result_t ruccl_config_set_store(ruccl_config_t *c, const ruccl_store_t *store) {
  NEED_CONFIG(c);
  if (!store || !store->set || !store->get || !store->add)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "store is NULL or lacks set, get or add");
  c->store = *store;
  c->multi_node_set |= RUCCL_CONFIG_GLOBAL_ADDRESS;
  return RUCCL_OK;
}

int ruccl_config_has_store(const ruccl_config_t *c) { return c->store.set != NULL; }

ruccl_result_t ruccl_config_validate(const ruccl_config_t *c) {
  NEED_CONFIG(c);
  if (c->num_devices == 0 || c->num_devices > RUCCL_MAX_LOCAL_PEERS)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "num_devices must be in 1..%d, got %u", RUCCL_MAX_LOCAL_PEERS,
                      c->num_devices);
  if (c->timeout_ms <= 0) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "timeout must be > 0 ms");
  if (check_strategy(c->local_strategy) != RUCCL_OK || check_strategy(c->global_strategy) != RUCCL_OK)
    return RUCCL_ERR_INVALID_ARGUMENT;
  if (c->secret_len > RUCCL_MAX_SECRET) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "secret too long");
  if (memchr(c->group_name, 0, sizeof c->group_name) == NULL || c->group_name[0] == 0)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "group name is empty or not terminated");
  unsigned set = c->multi_node_set & RUCCL_CONFIG_MULTI_NODE_ALL;
  if (set != 0 && set != RUCCL_CONFIG_MULTI_NODE_ALL)
    return ruccl_fail(RUCCL_ERR_INVALID_CONFIG,
                      "num_nodes, global_address, node_address and data_service_port are set together or not at "
                      "all (set:%s%s%s%s)",
                      (set & RUCCL_CONFIG_NUM_NODES) ? " num_nodes" : "",
                      (set & RUCCL_CONFIG_GLOBAL_ADDRESS) ? " global_address" : "",
                      (set & RUCCL_CONFIG_NODE_ADDRESS) ? " node_address" : "",
                      (set & RUCCL_CONFIG_DATA_SERVICE_PORT) ? " data_service_port" : "");
  if (set == RUCCL_CONFIG_MULTI_NODE_ALL) {
    unsigned char secret[RUCCL_MAX_SECRET];
    size_t len = 0;
    ruccl_result_t rc = ruccl_config_session_secret(c, secret, &len);
    OPENSSL_cleanse(secret, sizeof secret);
    if (rc != RUCCL_OK) return rc;
  }
  if (set == 0 && c->num_nodes != 1)
    return ruccl_fail(RUCCL_ERR_INVALID_CONFIG, "num_nodes %u without the other multi-node settings", c->num_nodes);
  if (memchr(c->global_address, 0, sizeof c->global_address) == NULL ||
      memchr(c->node_address, 0, sizeof c->node_address) == NULL)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "address not terminated");
  return RUCCL_OK;
}

int ruccl_config_is_multi_node(const ruccl_config_t *c) {
  return (c->multi_node_set & RUCCL_CONFIG_MULTI_NODE_ALL) == RUCCL_CONFIG_MULTI_NODE_ALL;
}

const char *ruccl_config_difference(const ruccl_config_t *a, const ruccl_config_t *b) {
  if (a->num_devices != b->num_devices) return "num_devices";
  if (a->local_strategy.kind != b->local_strategy.kind || a->local_strategy.arity != b->local_strategy.arity)
    return "local strategy";
  if (a->global_strategy.kind != b->global_strategy.kind || a->global_strategy.arity != b->global_strategy.arity)
    return "global strategy";
  if (a->num_nodes != b->num_nodes || a->multi_node_set != b->multi_node_set) return "num_nodes";
  if (strcmp(a->global_address, b->global_address) != 0) return "global address";
  if (a->store.set != b->store.set || a->store.get != b->store.get || a->store.add != b->store.add ||
      a->store.ctx != b->store.ctx)
    return "store";
  if (a->secret_len != b->secret_len || memcmp(a->secret, b->secret, a->secret_len) != 0) return "secret";
  return NULL;
}

ruccl_result_t ruccl_secret_from_file(const char *path, unsigned char out[RUCCL_MAX_SECRET], size_t *len) {
  if (!path || !out || !len) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "secret file, out or len is NULL");
  *len = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return ruccl_fail(RUCCL_ERR_INVALID_CONFIG, "cannot read the secret file %s: %s", path, strerror(errno));
  size_t n = fread(out, 1, RUCCL_MAX_SECRET, f);
  int extra = fgetc(f), failed = ferror(f);
  fclose(f);
  if (failed || extra != EOF || n == 0) {
    OPENSSL_cleanse(out, RUCCL_MAX_SECRET);
    if (failed) return ruccl_fail(RUCCL_ERR_INVALID_CONFIG, "the secret file %s could not be read", path);
    if (n == 0) return ruccl_fail(RUCCL_ERR_INVALID_CONFIG, "the secret file %s is empty", path);
    return ruccl_fail(RUCCL_ERR_INVALID_CONFIG, "the secret file %s holds more than %d bytes", path, RUCCL_MAX_SECRET);
  }
  *len = n;
  return RUCCL_OK;
}

ruccl_result_t ruccl_secret_from_env(unsigned char out[RUCCL_MAX_SECRET], size_t *len) {
  if (!out || !len) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "out or len is NULL");
  *len = 0;
  const char *s = getenv("RUCCL_SECRET");
  if (s && *s) {
    size_t n = strlen(s);
    if (n > RUCCL_MAX_SECRET)
      return ruccl_fail(RUCCL_ERR_INVALID_CONFIG, "RUCCL_SECRET is %zu bytes, at most %d allowed", n, RUCCL_MAX_SECRET);
    memcpy(out, s, n);
    *len = n;
    return RUCCL_OK;
  }
  const char *path = getenv("RUCCL_SECRET_FILE");
  if (path && *path) return ruccl_secret_from_file(path, out, len);
  return ruccl_fail(RUCCL_ERR_INVALID_CONFIG, "neither RUCCL_SECRET nor RUCCL_SECRET_FILE is set");
}

ruccl_result_t ruccl_config_session_secret(const ruccl_config_t *c, unsigned char out[RUCCL_MAX_SECRET],
                                           size_t *len) {
  if (c->secret_len) {
    memcpy(out, c->secret, c->secret_len);
    *len = c->secret_len;
    return RUCCL_OK;
  }
  ruccl_result_t rc = ruccl_secret_from_env(out, len);
  if (rc != RUCCL_ERR_INVALID_CONFIG) return rc;
  char why[256];
  snprintf(why, sizeof why, "%s", ruccl_last_error_detail());
  return ruccl_fail(rc, "a multi-node configuration needs a secret (%s); " RUCCL_SECRET_HOWTO, why);
}

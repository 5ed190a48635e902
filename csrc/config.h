/* config.h — configuration checks used at registration. */
#ifndef RUCCL_CONFIG_H
#define RUCCL_CONFIG_H

#include "ruccl.h"

#define RUCCL_MAX_LOCAL_PEERS 1024
#define RUCCL_MAX_NODES 4096

/* RUCCL_OK, INVALID_ARGUMENT (a field out of range) or INVALID_CONFIG (only some of
   the four multi-node settings). */
ruccl_result_t ruccl_config_validate(const ruccl_config_t *c);
int ruccl_config_is_multi_node(const ruccl_config_t *c);
/* The rendezvous goes through a key-value store (ruccl_config_set_store). */
int ruccl_config_has_store(const ruccl_config_t *c);
/* NULL when a and b agree on everything the peers must agree on, else the name of
   the first field that differs. */
const char *ruccl_config_difference(const ruccl_config_t *a, const ruccl_config_t *b);

/* The secret a session authenticates with: the configuration's, else the
   environment's (ruccl_secret_from_env); INVALID_CONFIG, saying how to give one,
   when there is none.  The caller wipes out (OPENSSL_cleanse) when done with it. */
ruccl_result_t ruccl_config_session_secret(const ruccl_config_t *c, unsigned char out[RUCCL_MAX_SECRET],
                                           size_t *len);
#define RUCCL_SECRET_HOWTO \
  "give every node the same secret: ruccl_config_set_secret(), or the environment variable RUCCL_SECRET, or " \
  "RUCCL_SECRET_FILE naming a file that holds it"

#endif

/* bootstrap.h — a node's side of the orchestrator rendezvous. */
#ifndef RUCCL_BOOTSTRAP_H
#define RUCCL_BOOTSTRAP_H

#include "bootstrap_wire.h"
#include "wire.h"

/* Connects to the orchestrator at host_port, authenticates with the session's key
   (ruccl_auth_key, stretched once per session), sends `me`, and waits
   until every node of the group has joined: then *table lists them all, sorted by
   their smallest peer id, and *fd stays open for the session (close it, or send
   LEAVE, to leave).  Errors: RUCCL_ERR_TIMEOUT (unreachable, or the others never
   came), RUCCL_ERR_AUTH, and the orchestrator's verdict (CONFIG_MISMATCH,
   DUPLICATE_REGISTRATION). */
ruccl_result_t ruccl_bootstrap_join(const char *host_port, const unsigned char key[RUCCL_AUTH_KEY_BYTES],
                                    const ruccl_join_t *me, int64_t deadline_ns, int *fd, ruccl_table_t *table);
void ruccl_bootstrap_leave(int fd);

/* The seam a session's rendezvous goes through: the orchestrator by default; the
   PyTorch backend puts torch's own key-value store behind the same two calls
   (every node publishes its JOIN under the group's key and reads the others'), so
   that no extra server is needed there.  join fills the table sorted as above;
   handle is whatever leave needs (the orchestrator's socket); key is the session's
   handshake key (wire.h), for a rendezvous that authenticates. */
typedef struct {
  const char *name;
  ruccl_result_t (*join)(void *ctx, const ruccl_config_t *cfg, const unsigned char key[RUCCL_AUTH_KEY_BYTES],
                         const ruccl_join_t *me, int64_t deadline_ns, int *handle, ruccl_table_t *table);
  void (*leave)(void *ctx, int handle);
  void *ctx;
} ruccl_bootstrap_t;

extern const ruccl_bootstrap_t ruccl_orchestrator_bootstrap;
extern const ruccl_bootstrap_t ruccl_store_bootstrap; /* config.store (bootstrap_store.c) */
/* Sorts a table's nodes by their smallest peer id: every node numbers them alike. */
void ruccl_table_sort(ruccl_table_t *table);

#endif

/* bootstrap.h — a node's side of the orchestrator rendezvous. */
#ifndef RUCCL_BOOTSTRAP_H
#define RUCCL_BOOTSTRAP_H

#include "bootstrap_wire.h"

/* Connects to the orchestrator at host_port, authenticates, sends `me`, and waits
   until every node of the group has joined: then *table lists them all, sorted by
   their smallest peer id, and *fd stays open for the session (close it, or send
   LEAVE, to leave).  Errors: RUCCL_ERR_TIMEOUT (unreachable, or the others never
   came), RUCCL_ERR_AUTH, and the orchestrator's verdict (CONFIG_MISMATCH,
   DUPLICATE_REGISTRATION). */
ruccl_result_t ruccl_bootstrap_join(const char *host_port, const void *secret, size_t secret_len,
                                    const ruccl_join_t *me, int64_t deadline_ns, int *fd, ruccl_table_t *table);
void ruccl_bootstrap_leave(int fd);

#endif

/* session.h — setting up and tearing down a group's multi-node session. */
#ifndef RUCCL_SESSION_H
#define RUCCL_SESSION_H

#include "ruccl.h"
#include "../transport.h"

struct ruccl_group;
struct ruccl_net;
/* Called by the local peer of index 0 once the local rendezvous is complete; *net is
   the session's connections, for the caller to publish as g->net. */
ruccl_result_t ruccl_session_connect(struct ruccl_group *g, struct ruccl_net **net);
/* finished: tell the other nodes this one finished (else it just goes away). */
void ruccl_session_close(struct ruccl_group *g, int finished);
/* A shrink's survivors: a data service for the session to come, on this node's
   address (any free port), with the same secret as old's; then, once every node's
   port is agreed, ruccl_session_join makes it node `me` of table, the session of g
   (numbers its peers, links, watches liveness).  ruccl_session_discard closes one
   that is not used (or whose join failed). */
ruccl_result_t ruccl_session_open(const struct ruccl_net *old, const ruccl_config_t *cfg, struct ruccl_net **net);
unsigned ruccl_session_port(const struct ruccl_net *net);
struct ruccl_table;
ruccl_result_t ruccl_session_join(struct ruccl_group *g, struct ruccl_net *net, const struct ruccl_table *table,
                                  unsigned me);
void ruccl_session_discard(struct ruccl_net *net);
/* How long a silent node may stay silent (0: no watch): the configuration's, else
   RUCCL_LIVENESS_TIMEOUT_MS, else the default. */
int64_t ruccl_session_liveness_ms(const ruccl_config_t *cfg);
/* The transport between the nodes; its endpoint is the session's net. */
const ruccl_transport_ops_t *ruccl_session_transport(void);

#endif

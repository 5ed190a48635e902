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
/* The transport between the nodes; its endpoint is the session's net. */
const ruccl_transport_ops_t *ruccl_session_transport(void);

#endif

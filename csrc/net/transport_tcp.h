/* transport_tcp.h — the transport between the nodes of a session: one
   authenticated socket per pair of nodes, driven by each node's leader thread, and
   a shared-memory data path instead of the socket's where both nodes share a host. */
#ifndef RUCCL_TRANSPORT_TCP_H
#define RUCCL_TRANSPORT_TCP_H

#include <pthread.h>
#include <stdatomic.h>

#include "../transport.h"
#include "bootstrap_wire.h"
#include "shm_link.h"

typedef struct ruccl_net {
  unsigned num_nodes, me;
  int *fds;       /* by node index; -1 for me.  Always open: control, ABORT, liveness */
  ruccl_shm_link_t *shm; /* by node index: the data path to a node of this host (map NULL: TCP) */
  int listen_fd;  /* the data service, kept open to refuse strangers during the session */
  int data_port;
  int orchestrator_fd;   /* the rendezvous handle (the orchestrator's socket) */
  const void *bootstrap; /* the ruccl_bootstrap_t that joined, to leave through */
  pthread_t guard; /* accepts and drops connections after the session is set up */
  int guard_running;
  int wake[2];
  atomic_int aborted; /* the sockets were shut down */
  atomic_int abort_code; /* why this node shut them (set before aborted) */
  atomic_int *tx;     /* by node, a TCP data socket's writer: TX_IDLE, TX_MESSAGE (part of one sent), TX_CLOSED */
  const atomic_int *reset, *broken; /* the group's state, checked while waiting */
  const char *broken_why;           /* the group's: why it broke, written before *broken */
  char group[RUCCL_MAX_GROUP_NAME];
  unsigned char secret[RUCCL_MAX_SECRET];
  size_t secret_len;
  int64_t timeout_ms; /* the session's: how long a finishing node waits for its peers to take what it sent */
  unsigned char *bounce; /* reduce-on-receive staging */
  int64_t spin_ns, sleepy_ns; /* an idle wait on shared memory spins, then yields declared sleepy, then sleeps */
  struct ruccl_p2p_net *p2p; /* point-to-point streams (p2p_net.h) */
} ruccl_net_t;
typedef struct ruccl_p2p_net ruccl_p2p_net_t;

/* Opens the data service (port 0 = any) before joining, so its port can be announced. */
ruccl_result_t ruccl_net_listen(ruccl_net_t *net, const char *host, unsigned port);
/* With the table from the orchestrator: connects to every lower node, accepts every
   higher one, each connection authenticated with the secret; strangers are refused. */
ruccl_result_t ruccl_net_connect_all(ruccl_net_t *net, const ruccl_table_t *table, unsigned me,
                                     int64_t deadline_ns);
/* Tells every other node why this one stops (code), then shuts the sockets so that
   nobody waits on us. */
void ruccl_net_abort(ruccl_net_t *net, ruccl_result_t code);
/* A clean end: tells the others this node finished, waits until they have taken
   everything it sent (bounded by the session's timeout), closes everything. */
void ruccl_net_close(ruccl_net_t *net, int finished);

/* RESET or the failure that broke the session, else RUCCL_OK. */
ruccl_result_t ruccl_net_session_state(const ruccl_net_t *net);
/* Waits until the other end of each fds[i] >= 0 has taken every byte sent on it
   (the kernel's send queue is empty) or closed, or the deadline passes. */
void ruccl_net_wait_taken(const ruccl_net_t *net, const int *fds, unsigned n, int64_t deadline_ns);

extern const ruccl_transport_ops_t ruccl_tcp_ops; /* endpoint: ruccl_net_t */

#endif

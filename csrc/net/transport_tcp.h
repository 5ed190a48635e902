/* transport_tcp.h — the transport between the nodes of a session: one
   authenticated socket per pair of nodes that talk, driven by each node's leader
   thread, and a shared-memory data path instead of the socket's where both nodes
   share a host.
 *
 * Links are made where they are used.  At set-up each node links to node 0 (which
 * hears every node in each collective's agreement) and to its neighbours in the ring
 * of nodes (liveness, ring algorithms), so the links always form one connected
 * graph that carries an abort to every node.  Any other pair links the first time
 * an algorithm moves data between them: the higher node dials the lower one's data
 * port, and the lower one's data-port thread takes it while its leader waits.  A
 * session of N nodes so holds about 2N connections instead of N(N-1)/2. */
#ifndef RUCCL_TRANSPORT_TCP_H
#define RUCCL_TRANSPORT_TCP_H

#include <pthread.h>
#include <stdatomic.h>

#include "../cancel.h"
#include "../transport.h"
#include "bootstrap_wire.h"
#include "shm_link.h"
#include "wire.h"

#define RUCCL_SESSION_ID_BYTES 16

/* Where a node of the session is reached (from the rendezvous table). */
typedef struct {
  char address[RUCCL_MAX_ADDRESS];
  unsigned port;
  char host[RUCCL_WIRE_HOST_BYTES];
} ruccl_node_addr_t;

/* Connections to the data port in their handshake at once; more wait to be accepted. */
#define RUCCL_PORT_HANDSHAKES 32

typedef struct ruccl_net {
  unsigned num_nodes, me;
  ruccl_node_addr_t *nodes; /* by node index */
  /* By node index: the link's socket, -1 while there is none (and for me).  Set once,
     under links_lock, after shm[k]; read without it by the leader (atomically). */
  int *fds;
  ruccl_shm_link_t *shm; /* by node index: the data path to a node of this host (map NULL: TCP) */
  pthread_mutex_t links_lock; /* publishing a link, and ruccl_net_abort walking them */
  atomic_uint shm_links; /* shared-memory links this node holds */
  unsigned shm_budget;   /* at most (RUCCL_SHM_LINKS, else RUCCL_SHM_MAX_LINKS) */
  int crowded;           /* more of the session's processes on this host than cores */
  int listen_fd;  /* the data service, kept open to refuse strangers during the session */
  int data_port;
  int orchestrator_fd;   /* the rendezvous handle (the orchestrator's socket) */
  int orchestrator_news; /* that socket when it is one (-1 with a store): set-up watches it for NODE_LOST */
  const void *bootstrap; /* the ruccl_bootstrap_t that joined, to leave through */
  pthread_t guard; /* the data port's thread: accepts, hands each connection to a handshake thread */
  int guard_running;
  pthread_mutex_t port_mu; /* the handshakes under way */
  pthread_cond_t port_cv;
  int port_ready, port_busy;
  int port_fds[RUCCL_PORT_HANDSHAKES]; /* their sockets, -1: a free slot */
  int wake[2];
  atomic_int aborted; /* the sockets were shut down */
  atomic_int abort_code; /* why this node shut them (set before aborted) */
  atomic_int *tx;     /* by node, a TCP data socket's writer: TX_IDLE, TX_MESSAGE (part of one sent), TX_CLOSED */
  const ruccl_cancel_t *cancel; /* the session's state, checked while waiting */
  char group[RUCCL_MAX_GROUP_NAME];
  unsigned char key[RUCCL_AUTH_KEY_BYTES]; /* the handshake's, stretched from the secret (wire.h) */
  unsigned char session[RUCCL_SESSION_ID_BYTES]; /* this session's id: a digest of its table */
  int64_t timeout_ms; /* the session's: how long a finishing node waits for its peers to take what it sent */
  /* How long a node may take connections on its data port and answer none of them
     before set-up calls it lost (frozen); 0: until the timeout (liveness off). */
  int64_t setup_grace_ms;
  unsigned char *bounce; /* reduce-on-receive staging */
  int64_t spin_ns, sleepy_ns; /* an idle wait on shared memory spins, then yields declared sleepy, then sleeps */
  struct ruccl_p2p_net *p2p; /* point-to-point streams (p2p_net.h) */
  struct ruccl_agree_net *agree; /* the fault-tolerant agreement's state (agree_net.h) */
} ruccl_net_t;
typedef struct ruccl_p2p_net ruccl_p2p_net_t;

/* Opens the data service (port 0 = any) before joining, so its port can be announced. */
ruccl_result_t ruccl_net_listen(ruccl_net_t *net, const char *host, unsigned port);
/* With the table from the orchestrator, before anything may connect: where every
   node is. */
ruccl_result_t ruccl_net_prepare(ruccl_net_t *net, const ruccl_table_t *table, unsigned me);
/* Makes the set-up links (node 0 and the ring neighbours): dials the lower ones,
   takes the higher ones, each connection authenticated with the secret; strangers
   are refused.  Then the data port stays open for the links made later. */
ruccl_result_t ruccl_net_connect_all(ruccl_net_t *net, int64_t deadline_ns);
/* Opens an authenticated connection to node k's data port with its first frame
   (type, payload) inside the handshake, after the link's context (group, session,
   this node, node k), so that a frame of another group, session or pair is refused:
   the one way every connection between nodes starts. */
ruccl_result_t ruccl_net_dial(ruccl_net_t *net, unsigned k, uint16_t type, const void *hello, size_t len,
                              int64_t deadline_ns, int *fd);
/* Tells every other node why this one stops (code), then shuts the sockets so that
   nobody waits on us. */
void ruccl_net_abort(ruccl_net_t *net, ruccl_result_t code);
/* A clean end: tells the others this node finished, waits until they have taken
   everything it sent (bounded by the session's timeout), closes everything. */
void ruccl_net_close(ruccl_net_t *net, int finished);

/* Shared-memory links one node may hold by default (each maps 8 MB): pairs beyond
   use TCP.  RUCCL_SHM_LINKS sets another bound. */
#define RUCCL_SHM_MAX_LINKS 64

/* RESET or the failure that broke the session, else RUCCL_OK. */
ruccl_result_t ruccl_net_session_state(const ruccl_net_t *net);
/* Waits until the other end of each fds[i] >= 0 has taken every byte sent on it
   (the kernel's send queue is empty) or closed, or the deadline passes. */
void ruccl_net_wait_taken(const ruccl_net_t *net, const int *fds, unsigned n, int64_t deadline_ns);

extern const ruccl_transport_ops_t ruccl_tcp_ops; /* endpoint: ruccl_net_t */

#endif

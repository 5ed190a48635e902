/* links.c — the links of the TCP transport between nodes (transport_tcp.h): a link
 * per pair that talks, made at set-up (node 0 and the ring neighbours) or on first
 * use, authenticated through the data port, shared memory where both nodes share a
 * host; the data port's thread and its handshakes (which also take the point-to-point
 * streams and the nodes' agreement rounds); set-up's waits and probes; abort and
 * close.  The step that moves the bytes is transport_tcp.c's. */
#include "links.h"

#include <arpa/inet.h>
#include <linux/sockios.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../dtype.h"
#include "../error.h"
#include "../le.h"
#include "../testing.h"
#include "agree_net.h"
#include "p2p_net.h"
#include "wire.h"

/* A connection's handshake during set-up: a session of a thousand processes on a few
   cores can keep an expected node from answering for seconds (2 s refused some) */
#define SETUP_HANDSHAKE_NS (15LL * 1000000000)
#define RUCCL_FRAME_NODE 20
#define RUCCL_FRAME_SHM 21     /* lower node -> higher: a segment to use, or none */
#define RUCCL_FRAME_SHM_ACK 22 /* higher -> lower: opened it, or not */

/* A link's hello (after the context the handshake authenticates: group, session,
   both node indices) is the dialling node's host id, RUCCL_HOST_ID_BYTES bytes: a
   node of the same host is offered shared memory. */

/* A shared-memory offer: the segment's name (zero padded; empty: none) and its
   token, bytes only. */
typedef struct {
  char name[RUCCL_SHM_NAME_MAX];
  unsigned char token[RUCCL_SHM_TOKEN_BYTES];
} shm_offer_t;

/* Whether the whole header went (else the socket had no room for all of it). */
static int send_header_now(int fd, uint32_t kind, uint32_t code) {
  msg_header_t h = msg_header(kind, code, 0);
  return send(fd, h.b, sizeof h.b, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof h.b;
}

/* ---- links ------------------------------------------------------------------------- */

/* Whether nodes a and b link at set-up: one of them is node 0, or they are
   neighbours in the ring of nodes. */
static int setup_pair(unsigned a, unsigned b, unsigned n) {
  return a != b && (a == 0 || b == 0 || (a + 1) % n == b || (b + 1) % n == a);
}

/* Takes a share of this node's shared-memory budget (1), or finds it spent (0);
   give_shm_share hands one back. */
static void give_shm_share(ruccl_net_t *net) { atomic_fetch_sub(&net->shm_links, 1); }
static int take_shm_share(ruccl_net_t *net) {
  if (atomic_fetch_add(&net->shm_links, 1) < net->shm_budget) return 1;
  give_shm_share(net);
  return 0;
}

static void drop_link(ruccl_net_t *net, ruccl_shm_link_t *link) {
  if (!link->map) return;
  ruccl_shm_close(link);
  give_shm_share(net);
}

/* Makes fd (and link) node k's link, unless this node is stopping the session:
   then the other node hears why on it and it closes. */
static ruccl_result_t publish_link(ruccl_net_t *net, unsigned k, int fd, ruccl_shm_link_t *link) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  pthread_mutex_lock(&net->links_lock);
  int aborted = atomic_load(&net->aborted), stopping = aborted || link_fd(net, k) >= 0;
  if (!stopping) {
    net->shm[k] = *link;
    if (net->crowded && link->map) ruccl_shm_set_eager(&net->shm[k]);
    atomic_store(&net->tx[k], TX_IDLE);
    __atomic_store_n(&net->fds[k], fd, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&net->links_lock);
  if (!stopping) return RUCCL_OK;
  if (aborted) send_header_now(fd, MSG_ABORT, (uint32_t)atomic_load(&net->abort_code));
  close(fd);
  drop_link(net, link);
  ruccl_result_t rc = ruccl_net_session_state(net);
  return rc != RUCCL_OK ? rc : ruccl_fail(RUCCL_ERR_PROTOCOL, "node %u linked to node %u twice", net->me, k);
}

/* The lower node of a pair on one host offers a segment; the higher one opens it
   and says whether it could.  Either way the socket stays for control. */
static ruccl_result_t offer_shm(ruccl_net_t *net, int fd, unsigned node, const char *peer_host,
                                ruccl_shm_link_t *link, int64_t deadline_ns) {
  char host[RUCCL_HOST_ID_BYTES];
  ruccl_host_id(host);
  shm_offer_t offer;
  memset(&offer, 0, sizeof offer);
  memset(link, 0, sizeof *link);
  if (ruccl_shm_allowed() && host[0] && strncmp(host, peer_host, sizeof host) == 0 && take_shm_share(net) &&
      ruccl_shm_create(link, offer.name, offer.token) != RUCCL_OK) {
    offer.name[0] = 0;
    give_shm_share(net);
  }
  ruccl_result_t rc = ruccl_frame_send(fd, RUCCL_FRAME_SHM, &offer, sizeof offer, deadline_ns);
  if (rc != RUCCL_OK || !offer.name[0]) {
    if (offer.name[0]) ruccl_shm_unlink(offer.name), drop_link(net, link);
    return rc;
  }
  unsigned char ok[4];
  uint32_t len = 0;
  uint16_t type = 0;
  rc = ruccl_frame_recv(fd, &type, ok, sizeof ok, &len, deadline_ns);
  ruccl_shm_unlink(offer.name); /* both ends have it mapped (or never will) */
  if (rc == RUCCL_OK && type == RUCCL_FRAME_SHM_ACK && len == sizeof ok && ruccl_get_le32(ok) == 1)
    ruccl_log(2, "node %u: shared memory with node %u", net->me, node);
  else
    drop_link(net, link);
  return rc;
}

static ruccl_result_t accept_shm(ruccl_net_t *net, int fd, unsigned node, ruccl_shm_link_t *link, int64_t deadline_ns) {
  shm_offer_t offer;
  uint32_t len = 0;
  uint16_t type = 0;
  memset(link, 0, sizeof *link);
  ruccl_result_t rc = ruccl_frame_recv(fd, &type, &offer, sizeof offer, &len, deadline_ns);
  if (rc != RUCCL_OK) return rc;
  if (type != RUCCL_FRAME_SHM || len != sizeof offer)
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "node %u: expected a shared-memory offer from node %u", net->me, node);
  offer.name[sizeof offer.name - 1] = 0;
  if (!offer.name[0]) return RUCCL_OK;
  uint32_t ok = ruccl_shm_allowed() && take_shm_share(net);
  if (ok && ruccl_shm_open(link, offer.name, offer.token) != RUCCL_OK) {
    ok = 0;
    give_shm_share(net);
  }
  unsigned char wire[4];
  ruccl_put_le32(wire, ok);
  rc = ruccl_frame_send(fd, RUCCL_FRAME_SHM_ACK, wire, sizeof wire, deadline_ns);
  if (rc != RUCCL_OK) drop_link(net, link);
  return rc;
}

ruccl_result_t ruccl_net_listen(ruccl_net_t *net, const char *host, unsigned port) {
  net->listen_fd = -1;
  net->orchestrator_fd = -1;
  net->orchestrator_news = -1;
  net->wake[0] = net->wake[1] = -1;
  atomic_init(&net->aborted, 0);
  atomic_init(&net->abort_code, RUCCL_OK);
  atomic_init(&net->shm_links, 0);
  pthread_mutex_init(&net->links_lock, NULL);
  return ruccl_tcp_listen(host, (int)port, &net->listen_fd, &net->data_port);
}

/* A link's context, ahead of the first frame in the handshake: the group (zero
   padded), the session id, the dialling node and the dialled one (u32 little-endian). */
#define LINK_CONTEXT_BYTES (RUCCL_MAX_GROUP_NAME + RUCCL_SESSION_ID_BYTES + 8)
#define LINK_FIRST_MAX 256 /* the largest first frame after the context */
#define LINK_CONNECT_NS (10LL * 1000000000)
#define SETUP_PROBE_NS (1000LL * 1000000)         /* a node awaited at set-up is probed this often */
#define SETUP_PROBE_CONNECT_NS (500LL * 1000000)

static void link_context(const ruccl_net_t *net, unsigned from, unsigned to, unsigned char out[LINK_CONTEXT_BYTES]) {
  memset(out, 0, RUCCL_MAX_GROUP_NAME);
  memcpy(out, net->group, strnlen(net->group, RUCCL_MAX_GROUP_NAME - 1));
  memcpy(out + RUCCL_MAX_GROUP_NAME, net->session, RUCCL_SESSION_ID_BYTES);
  ruccl_put_le32(out + RUCCL_MAX_GROUP_NAME + RUCCL_SESSION_ID_BYTES, from);
  ruccl_put_le32(out + RUCCL_MAX_GROUP_NAME + RUCCL_SESSION_ID_BYTES + 4, to);
}

ruccl_result_t ruccl_net_dial(ruccl_net_t *net, unsigned k, uint16_t type, const void *hello, size_t len,
                              int64_t deadline_ns, int *fd) {
  *fd = -1;
  if (len > LINK_FIRST_MAX) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "a first frame of %zu bytes", len);
  unsigned char first[LINK_CONTEXT_BYTES + LINK_FIRST_MAX];
  link_context(net, net->me, k, first);
  if (len) memcpy(first + LINK_CONTEXT_BYTES, hello, len);
  /* Its data port listened before it joined: a node of the table that does not answer
     for LINK_CONNECT_NS is gone (refused: it died), not slow. */
  int64_t connect_by = ruccl_now_ns() + LINK_CONNECT_NS;
  ruccl_result_t rc = ruccl_tcp_connect_ex(net->nodes[k].address, (int)net->nodes[k].port,
                                           connect_by < deadline_ns ? connect_by : deadline_ns, 0, fd);
  if (rc == RUCCL_ERR_TIMEOUT && connect_by < deadline_ns)
    rc = ruccl_fail(RUCCL_ERR_PEER_LOST, "node %u's data port at %s:%u does not answer: %s", k, net->nodes[k].address,
                    net->nodes[k].port, ruccl_last_error_detail());
  /* A frozen process's kernel still takes the connection; nothing answers it: lost
     after the set-up grace, not the whole timeout. */
  int64_t answer_by = net->setup_grace_ms > 0 ? ruccl_deadline_later(ruccl_now_ns(), net->setup_grace_ms) : deadline_ns;
  if (answer_by > deadline_ns) answer_by = deadline_ns;
  if (rc == RUCCL_OK) rc = ruccl_auth_client(*fd, net->key, type, first, (uint32_t)(LINK_CONTEXT_BYTES + len), answer_by);
  if (rc == RUCCL_ERR_TIMEOUT && answer_by < deadline_ns)
    rc = ruccl_fail(RUCCL_ERR_PEER_LOST, "node %u's data port at %s:%u took the connection but answered nothing for "
                    "%lld ms (RUCCL_LIVENESS_SETUP_GRACE_MS): its process is frozen or stuck", k,
                    net->nodes[k].address, net->nodes[k].port, (long long)net->setup_grace_ms);
  if (rc != RUCCL_OK && *fd >= 0) close(*fd), *fd = -1;
  return rc;
}

/* links.h */
ruccl_result_t ruccl_net_dial_node(ruccl_net_t *net, unsigned j, int64_t deadline_ns) {
  char host[RUCCL_HOST_ID_BYTES];
  ruccl_host_id(host);
  int fd;
  ruccl_shm_link_t link = {0};
  ruccl_result_t rc = ruccl_net_dial(net, j, RUCCL_FRAME_NODE, host, sizeof host, deadline_ns, &fd);
  if (rc == RUCCL_OK) rc = accept_shm(net, fd, j, &link, deadline_ns);
  if (rc == RUCCL_OK) return publish_link(net, j, fd, &link);
  if (fd >= 0) close(fd);
  ruccl_result_t mine = ruccl_net_session_state(net);
  if (mine != RUCCL_OK) return mine;
  /* a wrong secret or a bad answer says so; a node that is not there is lost */
  return ruccl_fail(rc == RUCCL_ERR_IO ? RUCCL_ERR_PEER_LOST : rc, "node %u cannot connect to node %u at %s:%u: %s",
                    net->me, j, net->nodes[j].address, net->nodes[j].port, ruccl_last_error());
}

/* An authenticated connection's first frame (type, len bytes) on the data port:
   takes it as a link from a higher node not yet linked, or as a point-to-point
   stream.  Returns 1 when fd is no longer the caller's (*node: the node now linked,
   -1 for a stream or a link refused late); 0: the caller closes fd. */
static int take_connection(ruccl_net_t *net, int fd, uint16_t type, const void *first, uint32_t len, unsigned from,
                           int64_t deadline_ns, int *node) {
  *node = -1;
  if (type == RUCCL_FRAME_P2P) return ruccl_p2p_net_adopt(net, fd, from, first, len, deadline_ns);
  if (type == RUCCL_FRAME_AGREE) return ruccl_agree_net_serve(net, fd, from, first, len);
  if (type != RUCCL_FRAME_NODE || len != RUCCL_HOST_ID_BYTES) return 0;
  char host[RUCCL_HOST_ID_BYTES];
  memcpy(host, first, sizeof host);
  host[sizeof host - 1] = 0;
  unsigned k = from; /* the handshake proved which node dials */
  if (k <= net->me || link_fd(net, k) >= 0) return 0;
  ruccl_shm_link_t link;
  if (offer_shm(net, fd, k, host, &link, deadline_ns) != RUCCL_OK) return 0;
  if (publish_link(net, k, fd, &link) == RUCCL_OK) *node = (int)k; /* else it closed fd */
  return 1;
}

/* The handshake of a connection on the data port, and the first frame it carries:
   RUCCL_OK when the dialler proved the secret for this group, this session and this
   node (*from: its node index; buf, *len: the frame after the context), else why not
   (PEER_LOST: it closed before it finished). */
static ruccl_result_t first_frame(ruccl_net_t *net, int fd, int64_t deadline_ns, uint16_t *type, unsigned char *buf,
                                  uint32_t *len, unsigned *from) {
  unsigned char got[LINK_CONTEXT_BYTES + LINK_FIRST_MAX];
  uint32_t n = 0;
  ruccl_result_t rc = ruccl_auth_server(fd, net->key, type, got, sizeof got, &n, deadline_ns);
  if (rc != RUCCL_OK) return rc;
  unsigned char want[LINK_CONTEXT_BYTES];
  uint32_t k = n >= LINK_CONTEXT_BYTES ? ruccl_get_le32(got + LINK_CONTEXT_BYTES - 8) : 0;
  link_context(net, k, net->me, want);
  if (n < LINK_CONTEXT_BYTES || memcmp(got, want, LINK_CONTEXT_BYTES) != 0 || k >= net->num_nodes || k == net->me)
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "a node proved the secret for another group, session or node");
  *from = k;
  *len = n - LINK_CONTEXT_BYTES;
  memcpy(buf, got + LINK_CONTEXT_BYTES, *len);
  return RUCCL_OK;
}

/* ---- the data port ----------------------------------------------------------------
 *
 * A thread of its own accepts every connection and hands it to a handshake thread
 * (at most RUCCL_PORT_HANDSHAKES at once, each within SETUP_HANDSHAKE_NS; with every
 * slot taken, connections wait in the listen queue), so that a stranger that
 * connects and says nothing holds one slot, never the port: the links of set-up and
 * the ones made later, and the point-to-point streams, come in beside it.  Stopping
 * shuts the sockets still in their handshake and waits for their threads. */

typedef struct {
  ruccl_net_t *net;
  int fd;
  int slot;
} handshake_t;

static void *handshake_main(void *arg) {
  handshake_t h = *(handshake_t *)arg;
  free(arg);
  ruccl_net_t *net = h.net;
  int64_t deadline = ruccl_now_ns() + SETUP_HANDSHAKE_NS; /* a crowded host's node may be slow */
  unsigned char first[LINK_FIRST_MAX];
  uint16_t type = 0;
  uint32_t len = 0;
  unsigned from = 0;
  int node = -1;
  ruccl_result_t shake = first_frame(net, h.fd, deadline, &type, first, &len, &from);
  int shook = shake == RUCCL_OK;
  int taken = shook && take_connection(net, h.fd, type, first, len, from, deadline, &node);
  pthread_mutex_lock(&net->port_mu);
  net->port_fds[h.slot] = -1; /* before the close below: stop_port never shuts a reused number */
  pthread_mutex_unlock(&net->port_mu);
  if (!taken) {
    /* after the handshake: a stranger learns nothing, a wrong secret learns it is wrong.
       One that closed before it said anything is a waiting node's probe (set-up), or a
       node that gave up: no warning. */
    ruccl_log(shake == RUCCL_ERR_PEER_LOST ? 2 : 1, "node %u: refused a connection on the data port (%s)", net->me,
              shook ? "not a node of this session" : ruccl_last_error());
    close(h.fd);
  }
  OPENSSL_thread_stop();
  pthread_mutex_lock(&net->port_mu);
  net->port_busy--;
  pthread_cond_broadcast(&net->port_cv);
  pthread_mutex_unlock(&net->port_mu);
  return NULL;
}

static void *port_main(void *arg) {
  ruccl_net_t *net = arg;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (;;) {
    pthread_mutex_lock(&net->port_mu);
    int full = net->port_busy >= RUCCL_PORT_HANDSHAKES;
    pthread_mutex_unlock(&net->port_mu);
    if (full) { /* the next connections wait in the listen queue until a slot frees */
      struct pollfd w = {.fd = net->wake[0], .events = POLLIN};
      if (poll(&w, 1, 10) == 1) break;
      continue;
    }
    int fd = ruccl_accept_until_woken(net->listen_fd, net->wake[0]);
    if (fd < 0) break;
    pthread_mutex_lock(&net->port_mu);
    int slot = -1;
    for (int i = 0; i < RUCCL_PORT_HANDSHAKES && slot < 0; i++)
      if (net->port_fds[i] < 0) slot = i;
    handshake_t *h = slot >= 0 ? malloc(sizeof *h) : NULL;
    pthread_t t;
    if (h) *h = (handshake_t){net, fd, slot};
    if (h && pthread_create(&t, &attr, handshake_main, h) == 0) {
      net->port_fds[slot] = fd;
      net->port_busy++;
    } else {
      free(h);
      ruccl_log(1, "node %u: refused a connection on the data port (no thread for its handshake)", net->me);
      close(fd);
    }
    pthread_mutex_unlock(&net->port_mu);
  }
  pthread_attr_destroy(&attr);
  return NULL;
}

static ruccl_result_t start_port(ruccl_net_t *net) {
  pthread_mutex_init(&net->port_mu, NULL);
  pthread_cond_init(&net->port_cv, NULL);
  for (int i = 0; i < RUCCL_PORT_HANDSHAKES; i++) net->port_fds[i] = -1;
  net->port_busy = 0;
  net->port_ready = 1;
  if (pipe2(net->wake, O_CLOEXEC) != 0) return ruccl_fail(RUCCL_ERR_IO, "pipe: %s", strerror(errno));
  if (pthread_create(&net->guard, NULL, port_main, net) != 0) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "data port thread");
  net->guard_running = 1;
  return RUCCL_OK;
}

/* No connection is taken from here on: the port thread stops, the handshakes under
   way are cut short and their threads finish. */
static void stop_port(ruccl_net_t *net) {
  if (net->guard_running) {
    char b = 1;
    if (write(net->wake[1], &b, 1) != 1) {
    }
    pthread_join(net->guard, NULL);
    net->guard_running = 0;
  }
  if (!net->port_ready) return;
  pthread_mutex_lock(&net->port_mu);
  for (int i = 0; i < RUCCL_PORT_HANDSHAKES; i++)
    if (net->port_fds[i] >= 0) shutdown(net->port_fds[i], SHUT_RDWR);
  while (net->port_busy) pthread_cond_wait(&net->port_cv, &net->port_mu);
  pthread_mutex_unlock(&net->port_mu);
  pthread_mutex_destroy(&net->port_mu);
  pthread_cond_destroy(&net->port_cv);
  net->port_ready = 0;
}

/* Set-up: waits until every higher set-up neighbour has linked (through the port). */
/* Set-up: what the orchestrator says meanwhile.  A node of the session that went
   without leaving (it crashed after it got the table, its connection broke) will
   never link: PEER_LOST now, not the registration's timeout. */
static ruccl_result_t orchestrator_news(ruccl_net_t *net) {
  struct pollfd p = {.fd = net->orchestrator_news, .events = POLLIN};
  if (net->orchestrator_news < 0 || poll(&p, 1, 0) != 1) return RUCCL_OK;
  unsigned char buf[64];
  uint16_t type = 0;
  uint32_t len = 0;
  ruccl_result_t rc = ruccl_frame_recv(net->orchestrator_news, &type, buf, sizeof buf, &len, ruccl_now_ns() + 1000000000);
  net->orchestrator_news = -1; /* one look: whatever it said, nothing more is read there */
  if (rc == RUCCL_OK && type == RUCCL_FRAME_NODE_LOST && len == RUCCL_NODE_LOST_BYTES) {
    uint32_t id = ruccl_node_lost_decode(buf);
    return ruccl_fail(RUCCL_ERR_PEER_LOST, "node %u: the orchestrator says the node of peer %u went before it linked",
                      net->me, id);
  }
  if (rc != RUCCL_OK) return ruccl_fail(RUCCL_ERR_PEER_LOST, "node %u: lost the orchestrator during set-up (%s)", net->me,
                                        ruccl_last_error_detail());
  return ruccl_fail(RUCCL_ERR_PROTOCOL, "node %u: the orchestrator sent frame type %u during set-up", net->me, type);
}

/* Set-up: whether node k, awaited, is still there.  Its data port listened before it
   joined and stays open for its session: refused means its session ended, its process
   exited or its registration failed (a rendezvous through a store has no orchestrator to
   say so).  A port that takes the connection answers it with the handshake's first
   frame at once; a frozen process's kernel still takes connections but nothing answers
   (*silent).  The connection closes after a look (the port drops it quietly). */
static ruccl_result_t probe_node(ruccl_net_t *net, unsigned k, int *silent) {
  int fd = -1;
  *silent = 0;
  ruccl_result_t rc = ruccl_tcp_connect_ex(net->nodes[k].address, (int)net->nodes[k].port,
                                           ruccl_now_ns() + SETUP_PROBE_CONNECT_NS, 0, &fd);
  if (rc == RUCCL_OK && fd >= 0) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r;
    do r = poll(&p, 1, (int)(SETUP_PROBE_CONNECT_NS / 1000000)); while (r < 0 && errno == EINTR);
    *silent = r == 0;
  }
  if (fd >= 0) close(fd);
  if (rc == RUCCL_ERR_PEER_LOST)
    return ruccl_fail(RUCCL_ERR_PEER_LOST, "node %u: node %u's data port at %s:%u refuses connections: its session "
                      "ended (its process exited or its registration failed) before it linked", net->me, k,
                      net->nodes[k].address, net->nodes[k].port);
  return RUCCL_OK; /* there, or slow to answer: it may still link */
}

static ruccl_result_t await_setup_links(ruccl_net_t *net, int64_t deadline_ns) {
  for (unsigned k = net->me + 1; k < net->num_nodes; k++) {
    if (!setup_pair(net->me, k, net->num_nodes)) continue;
    int64_t probe_at = ruccl_now_ns() + SETUP_PROBE_NS;
    int64_t silent_since = 0; /* the first of the probes in a row that nothing answered */
    for (unsigned naps = 0; link_fd(net, k) < 0; naps++) {
      ruccl_result_t rc = ruccl_net_session_state(net);
      if (rc == RUCCL_OK) rc = orchestrator_news(net);
      if (rc == RUCCL_OK && ruccl_now_ns() >= probe_at) {
        int silent = 0;
        int64_t probed = ruccl_now_ns();
        rc = probe_node(net, k, &silent);
        if (!silent) silent_since = 0;
        else if (!silent_since) silent_since = probed;
        if (rc == RUCCL_OK && silent_since && net->setup_grace_ms > 0 &&
            ruccl_now_ns() - silent_since >= net->setup_grace_ms * 1000000)
          rc = ruccl_fail(RUCCL_ERR_PEER_LOST, "node %u: node %u's data port at %s:%u takes connections but answered "
                          "none for %lld ms (RUCCL_LIVENESS_SETUP_GRACE_MS): its process is frozen or stuck", net->me,
                          k, net->nodes[k].address, net->nodes[k].port,
                          (long long)((ruccl_now_ns() - silent_since) / 1000000));
        if (link_fd(net, k) >= 0) rc = RUCCL_OK; /* it linked meanwhile (and went since: the session will say) */
        probe_at = ruccl_now_ns() + SETUP_PROBE_NS;
      }
      if (rc != RUCCL_OK) return rc;
      if (ruccl_now_ns() >= deadline_ns)
        return ruccl_fail(RUCCL_ERR_TIMEOUT, "node %u: node %u did not connect within the timeout", net->me, k);
      struct timespec nap = {0, naps < 100 ? 100000 : 2000000};
      nanosleep(&nap, NULL);
    }
  }
  return RUCCL_OK;
}

/* How this node waits on shared memory.  A host with no more of the session's
   processes than this process may run on: spin, yield a while, then sleep, as the
   peer is most likely running.  One with more: do not spin (the process waited for
   needs the core) but yield at once, declared sleepy, and sleep after the same
   while: a yield hands the core to a runnable peer within the microsecond, where a
   sleep makes every answer wait for a wake-up.  One with a throng (more than
   THRONG_PER_CORE processes a core): sleep at once, for there the yields of the
   many cost the one that is to answer more than its wake-up does (the ring's 8 B
   all-reduce of 256 processes on 2 cores takes twice as long with them).
   docs/reference.md §2 has the figures. */
#define THRONG_PER_CORE 32

static void plan_waits(ruccl_net_t *net) {
  unsigned on_host = 1;
  const char *mine = net->nodes[net->me].host;
  if (ruccl_shm_allowed() && mine[0])
    for (unsigned i = 0; i < net->num_nodes; i++) on_host += i != net->me && strcmp(net->nodes[i].host, mine) == 0;
  cpu_set_t set;
  unsigned cores = sched_getaffinity(0, sizeof set, &set) == 0 ? (unsigned)CPU_COUNT(&set) : 1;
  net->crowded = on_host > cores;
  int throng = on_host > THRONG_PER_CORE * cores;
  net->spin_ns = net->crowded ? 0 : RUCCL_SPIN_NS;
  net->sleepy_ns = throng ? 0 : RUCCL_SHM_SLEEPY_NS;
  ruccl_log(2, "node %u: %u of the session's processes on this host, %u cores: %s waits", net->me, on_host, cores,
            throng ? "sleeping" : net->crowded ? "yielding" : "spinning");
}

/* The session's id: a digest of the group and the table, the same on every node and
   another for a session whose nodes listen elsewhere. */
static void session_id(ruccl_net_t *net) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  unsigned char u[4];
  int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 &&
           EVP_DigestUpdate(c, net->group, strnlen(net->group, sizeof net->group)) == 1;
  ruccl_put_le32(u, net->num_nodes);
  ok = ok && EVP_DigestUpdate(c, u, 4) == 1;
  for (unsigned i = 0; ok && i < net->num_nodes; i++) {
    const ruccl_node_addr_t *a = &net->nodes[i];
    ruccl_put_le32(u, a->port);
    ok = EVP_DigestUpdate(c, a->address, strnlen(a->address, sizeof a->address) + 1) == 1 &&
         EVP_DigestUpdate(c, u, 4) == 1 && EVP_DigestUpdate(c, a->host, strnlen(a->host, sizeof a->host) + 1) == 1;
  }
  ok = ok && EVP_DigestFinal_ex(c, md, &md_len) == 1;
  EVP_MD_CTX_free(c);
  if (ok) memcpy(net->session, md, RUCCL_SESSION_ID_BYTES);
  else RAND_bytes(net->session, RUCCL_SESSION_ID_BYTES); /* out of memory: this node links with nobody */
}

ruccl_result_t ruccl_net_prepare(ruccl_net_t *net, const ruccl_table_t *table, unsigned me) {
  net->num_nodes = table->num_nodes;
  net->me = me;
  net->nodes = calloc(net->num_nodes, sizeof *net->nodes);
  net->fds = malloc(sizeof(int) * net->num_nodes);
  net->shm = calloc(net->num_nodes, sizeof *net->shm);
  net->bounce = malloc(BOUNCE_BYTES);
  net->tx = calloc(net->num_nodes, sizeof *net->tx);
  if (!net->nodes || !net->fds || !net->shm || !net->bounce || !net->tx)
    return ruccl_fail(RUCCL_ERR_NO_MEMORY, "node connections");
  for (unsigned i = 0; i < net->num_nodes; i++) {
    atomic_init(&net->tx[i], TX_IDLE);
    net->fds[i] = -1;
    ruccl_node_addr_t *a = &net->nodes[i];
    snprintf(a->address, sizeof a->address, "%s", table->nodes[i].address);
    a->port = table->nodes[i].data_port;
    snprintf(a->host, sizeof a->host, "%s", table->nodes[i].host);
  }
  session_id(net);
  plan_waits(net);
  net->shm_budget = RUCCL_SHM_MAX_LINKS;
  const char *e = getenv("RUCCL_SHM_LINKS");
  if (e && *e) {
    char *end = NULL;
    long v = strtol(e, &end, 10);
    if (*end || v < 0 || v > 65536)
      ruccl_log(1, "RUCCL_SHM_LINKS=%s is not a number of links: using %d", e, RUCCL_SHM_MAX_LINKS);
    else
      net->shm_budget = (unsigned)v;
  }
  return RUCCL_OK;
}

ruccl_result_t ruccl_net_connect_all(ruccl_net_t *net, int64_t deadline_ns) {
  unsigned me = net->me;
  ruccl_result_t rc = start_port(net); /* the higher nodes dial in while this one dials out */
  if (rc != RUCCL_OK) return rc;
  for (unsigned j = 0; j < me; j++) {
    if (!setup_pair(me, j, net->num_nodes)) continue;
    rc = ruccl_net_dial_node(net, j, deadline_ns);
    if (rc != RUCCL_OK) return rc;
    ruccl_log(2, "node %u: connected to node %u at %s:%u", me, j, net->nodes[j].address, net->nodes[j].port);
  }
  rc = await_setup_links(net, deadline_ns);
  if (rc != RUCCL_OK) return ruccl_fail(rc, "node %u: not every higher node connected: %s", me, ruccl_last_error());
  return RUCCL_OK;
}

void ruccl_net_abort(ruccl_net_t *net, ruccl_result_t code) {
  if (!net->fds) return;
  int none = RUCCL_OK;
  atomic_compare_exchange_strong(&net->abort_code, &none, (int)code);
  if (atomic_exchange(&net->aborted, 1)) return;
  int64_t deadline = ruccl_now_ns() + 1000000000LL; /* the notices' whole budget */
  pthread_mutex_lock(&net->links_lock); /* no link appears meanwhile (publish_link sees aborted) */
  for (unsigned i = 0; i < net->num_nodes; i++) {
    if (net->fds[i] < 0) continue;
    /* In band where no message is half sent (a receiver that reads on gets it), and
       on the control connection always: a receiver that was sending when the
       socket shut may never read that far. */
    int idle = TX_IDLE;
    if (atomic_compare_exchange_strong(&net->tx[i], &idle, TX_CLOSED))
      send_header_now(net->fds[i], MSG_ABORT, (uint32_t)code);
    ruccl_p2p_net_notify(net, i, code, deadline);
  }
  for (unsigned i = 0; i < net->num_nodes; i++)
    if (net->fds[i] >= 0) shutdown(net->fds[i], SHUT_RDWR);
  pthread_mutex_unlock(&net->links_lock);
}

/* Whether the other end has closed or reset the connection; what it sent is
   dropped (this node has finished: nothing it could say still matters). */
static int peer_closed(int fd) {
  char sink[4096];
  for (;;) {
    ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (r > 0) continue;
    if (r < 0 && errno == EINTR) continue;
    return !(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  }
}

/* A clean end.  Every byte this node sent is still on its way to a peer that may
   lag behind (the last step of the last collective, a point-to-point message), so
   the links stay up until each peer has it:
   - the PEER_FINISHED notice goes after the data, in order on the socket (written
     whole, never cut short by a full buffer), then FIN;
   - this node waits until the peer's kernel has acknowledged all of it (SIOCOUTQ
     is 0), or the peer closed its end, or the session's timeout passes.  Closing
     earlier could reset the connection (a close with unread bytes sends RST), and
     a reset throws away whatever had not reached the peer yet.
   Over shared memory the data is in the ring, which stays mapped on the peer's
   side; the receiver takes what the ring holds before it believes the notice
   (check_shm_sockets), so the same wait on the socket is all it takes. */
void ruccl_net_wait_taken(const ruccl_net_t *net, const int *fds, unsigned n, int64_t deadline_ns) {
  char *wait_for = calloc(n, 1);
  unsigned waiting = 0;
  for (unsigned i = 0; wait_for && i < n; i++)
    if (fds[i] >= 0) wait_for[i] = 1, waiting++;
  while (waiting && ruccl_now_ns() < deadline_ns) {
    for (unsigned i = 0; i < n; i++) {
      if (!wait_for[i]) continue;
      int queued = 0;
      if (ioctl(fds[i], SIOCOUTQ, &queued) != 0 || queued == 0 || peer_closed(fds[i])) wait_for[i] = 0, waiting--;
    }
    if (waiting) {
      struct timespec pause = {0, 200000};
      nanosleep(&pause, NULL);
    }
  }
  if (waiting) ruccl_log(1, "node %u: finished, but %u node(s) had not taken all it sent within the timeout", net->me,
                         waiting);
  free(wait_for);
}

static void finish_links(ruccl_net_t *net) {
  if (!net->fds || atomic_exchange(&net->aborted, 1)) return;
  int64_t deadline = ruccl_deadline_after_ms(net->timeout_ms);
  int *fds = net->fds;
  for (unsigned i = 0; i < net->num_nodes; i++) {
    if (fds[i] < 0) continue;
    /* Written whole, by hand rather than with ruccl_write_all: a peer that finished
       first has closed its end, which is no failure to record or log. */
    msg_header_t h = msg_header(MSG_ABORT, RUCCL_ERR_PEER_FINISHED, 0);
    const char *p = (const char *)h.b;
    size_t left = sizeof h.b;
    while (left && ruccl_now_ns() < deadline) {
      ssize_t w = send(fds[i], p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        p += w, left -= (size_t)w;
      } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        struct pollfd pf = {.fd = fds[i], .events = POLLOUT};
        poll(&pf, 1, 1);
      } else {
        break; /* the peer is gone */
      }
    }
    shutdown(fds[i], SHUT_WR);
  }
  ruccl_net_wait_taken(net, fds, net->num_nodes, deadline);
}

void ruccl_net_close(ruccl_net_t *net, int finished) {
  ruccl_agree_net_stop(net); /* an answer waiting for this node gives up */
  stop_port(net); /* no link or stream opens from here on */
  ruccl_agree_net_close(net);
  /* A session that stopped (a lost node, an abort) has nothing left worth waiting
     for: a peer cut off would hold the close for the whole timeout. */
  if (atomic_load(&net->aborted)) finished = 0;
  ruccl_p2p_net_close(net, finished);
  OPENSSL_cleanse(net->key, sizeof net->key); /* nothing dials or answers any more */
  if (finished) finish_links(net);
  for (unsigned i = 0; net->fds && i < net->num_nodes; i++) {
    if (net->fds[i] >= 0) close(net->fds[i]);
    if (net->shm) ruccl_shm_close(&net->shm[i]);
  }
  free(net->shm);
  net->shm = NULL;
  if (net->listen_fd >= 0) close(net->listen_fd);
  if (net->wake[0] >= 0) close(net->wake[0]);
  if (net->wake[1] >= 0) close(net->wake[1]);
  free(net->fds);
  free(net->bounce);
  free(net->tx);
  free(net->nodes);
  net->nodes = NULL;
  net->tx = NULL;
  net->fds = NULL;
  net->bounce = NULL;
  net->listen_fd = -1;
}

/* orchestrator.c — the multi-node rendezvous server.
 *
 * Each connection must first pass the handshake (wire.h: a SPAKE2 key exchange and
 * proofs, the JOIN inside them: group name, node count, config digest, its data
 * address, its peer ids).
 * When num_nodes nodes of a group have joined, every one of them receives the
 * TABLE of all nodes' data addresses and peer ids; the data plane then runs
 * directly between the nodes.  A node's connection stays open for the session; when
 * every node has left (LEAVE or closed), the group's session is over and the name
 * can start a new one.  Strangers, wrong secrets and malformed frames are dropped
 * without touching any session.  Handshakes run in one event loop (a stranger costs a
 * socket, never a thread; see "the front" below); a node that has proven the secret
 * gets a thread of its own, which also sends it its table, so that a slow reader
 * holds up no one else.  A node's host that
 * dies or is cut off sends no FIN: TCP keepalive (KEEPALIVE_*) finds the half-open
 * connection within some 11 s, and the node leaves its session like one that closed,
 * so that it holds no group name. */
#include <arpa/inet.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../config.h"
#include "../error.h"
#include "../transport.h"
#include "bootstrap_wire.h"
#include "wire.h"

#define TABLE_CHUNK_TIMEOUT_NS (10LL * 1000000000) /* one chunk of the table to one node */
/* keepalive probes after 5 s of silence, every 2 s, 3 unanswered: the peer is gone */
#define KEEPALIVE_IDLE_S 5
#define KEEPALIVE_INTERVAL_S 2
#define KEEPALIVE_PROBES 3

typedef struct conn conn_t;
typedef struct session session_t;

struct conn {
  int fd;
  ruccl_orchestrator_t *orch;
  conn_t *next; /* all connections */
  session_t *session;
  conn_t *next_in_session;
  ruccl_join_t join;
  pthread_t thread;
  int wake; /* eventfd: its session's table is ready, or news for it below */
  int lost_pending; /* another node of its session went without LEAVE (lost_id: its smallest peer id) */
  uint32_t lost_id;
};

struct session {
  char group[RUCCL_MAX_GROUP_NAME];
  uint32_t num_nodes;
  unsigned char digest[RUCCL_DIGEST_BYTES];
  unsigned joined;
  int started; /* the table is ready: each node's thread sends it */
  unsigned char **chunks; /* the TABLE's frames (NULL: it could not be encoded) */
  size_t *chunk_lens;
  uint32_t num_chunks;
  conn_t *nodes;
  session_t *next;
};

struct ruccl_orchestrator {
  int listen_fd;
  int port;
  int wake[2]; /* a byte here stops the accept loop */
  unsigned char key[RUCCL_AUTH_KEY_BYTES]; /* stretched from the secret (wire.h) */
  pthread_t acceptor;
  pthread_mutex_t mu;
  pthread_cond_t idle;
  int stopping;
  unsigned live; /* connection threads running */
  conn_t *conns;
  session_t *sessions;
};

/* ---- sessions (orchestrator lock held) ---------------------------------------------- */

static session_t *find_session(ruccl_orchestrator_t *o, const char *group) {
  for (session_t *s = o->sessions; s; s = s->next)
    if (strcmp(s->group, group) == 0) return s;
  return NULL;
}

static void drop_session(ruccl_orchestrator_t *o, session_t *s) {
  for (session_t **p = &o->sessions; *p; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      break;
    }
  for (conn_t *c = s->nodes; c; c = c->next_in_session) c->session = NULL;
  for (uint32_t k = 0; s->chunks && k < s->num_chunks; k++) free(s->chunks[k]);
  free(s->chunks);
  free(s->chunk_lens);
  free(s);
}

static void leave_session(ruccl_orchestrator_t *o, conn_t *c) {
  session_t *s = c->session;
  if (!s) return;
  for (conn_t **p = &s->nodes; *p; p = &(*p)->next_in_session)
    if (*p == c) {
      *p = c->next_in_session;
      break;
    }
  c->session = NULL;
  s->joined--;
  if (s->joined == 0) drop_session(o, s);
}

static void send_error_frame(int fd, ruccl_result_t code, const char *msg) {
  unsigned char e[4 + RUCCL_ERROR_MESSAGE_MAX];
  size_t n = ruccl_error_encode(code, msg, e);
  ruccl_frame_send(fd, RUCCL_FRAME_ERROR, e, (uint32_t)n, ruccl_now_ns() + 1000000000);
}

/* Fails every pending node of s and forgets the session. */
static void fail_session(ruccl_orchestrator_t *o, session_t *s, ruccl_result_t code, const char *msg) {
  for (conn_t *c = s->nodes; c; c = c->next_in_session) {
    send_error_frame(c->fd, code, msg);
    shutdown(c->fd, SHUT_RDWR);
  }
  drop_session(o, s);
}

/* Encodes the table in chunks of at most a control frame and wakes the session's
   nodes' threads, each of which sends it to its node (send_table): no node waits for
   another to read, and the lock is not held while the bytes go out. */
static void start_session(session_t *s) {
  ruccl_table_t table = {.num_nodes = s->joined, .nodes = calloc(s->joined, sizeof(ruccl_join_t))};
  unsigned k = 0;
  for (conn_t *c = s->nodes; c && table.nodes; c = c->next_in_session) table.nodes[k++] = c->join;
  uint32_t cap = table.num_nodes; /* at least one node a chunk */
  s->chunks = table.nodes ? calloc(cap, sizeof *s->chunks) : NULL;
  s->chunk_lens = table.nodes ? calloc(cap, sizeof *s->chunk_lens) : NULL;
  int ok = s->chunks && s->chunk_lens;
  for (uint32_t first = 0; ok && first < table.num_nodes;) {
    uint32_t next = first;
    unsigned char *wire = ruccl_table_encode_chunk(&table, first, RUCCL_WIRE_MAX_CONTROL, &next,
                                                   &s->chunk_lens[s->num_chunks]);
    ok = wire != NULL;
    if (ok) s->chunks[s->num_chunks++] = wire;
    first = next;
  }
  if (!ok) { /* out of memory: no node gets a table; each is cut off (it fails its join) */
    for (uint32_t i = 0; s->chunks && i < s->num_chunks; i++) free(s->chunks[i]);
    free(s->chunks);
    s->chunks = NULL;
    s->num_chunks = 0;
  }
  ruccl_table_free(&table);
  s->started = 1;
  uint64_t one = 1;
  for (conn_t *c = s->nodes; c; c = c->next_in_session)
    if (write(c->wake, &one, sizeof one) != sizeof one) { /* an eventfd counter does not fill */
    }
}

/* This node's thread, once it has joined: waits for its session's table (or for the
   node to go: a node that gives up closes its connection, and must leave the pending
   session), then sends it, each chunk with its own deadline.  Returns whether the
   node has its table. */
static int send_table(ruccl_orchestrator_t *o, conn_t *c) {
  for (;;) {
    pthread_mutex_lock(&o->mu);
    session_t *s = c->session;
    int started = s && s->started, gone = !s || o->stopping;
    unsigned char **chunks = started ? s->chunks : NULL;
    size_t *lens = started ? s->chunk_lens : NULL;
    uint32_t n = started ? s->num_chunks : 0;
    pthread_mutex_unlock(&o->mu);
    if (gone) return 0;
    if (started) {
      /* the chunks stay until the session is dropped, which waits for this node */
      if (!chunks) return 0;
      for (uint32_t k = 0; k < n; k++)
        if (ruccl_frame_send(c->fd, RUCCL_FRAME_TABLE, chunks[k], (uint32_t)lens[k],
                             ruccl_now_ns() + TABLE_CHUNK_TIMEOUT_NS) != RUCCL_OK)
          return 0;
      return 1;
    }
    struct pollfd pf[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->wake, .events = POLLIN}};
    if (poll(pf, 2, -1) < 0 && errno != EINTR) return 0;
    if (pf[0].revents) return 0; /* the node spoke (or went) before its table: it left */
  }
}

/* A node's JOIN: returns RUCCL_OK when it was added (the table may have gone out). */
static ruccl_result_t admit(ruccl_orchestrator_t *o, conn_t *c, char *why, size_t cap) {
  const ruccl_join_t *j = &c->join;
  session_t *s = find_session(o, j->group);
  if (s && s->started) {
    snprintf(why, cap, "group '%s' already has a running session of %u nodes", j->group, s->num_nodes);
    return RUCCL_ERR_DUPLICATE_REGISTRATION;
  }
  if (s && (s->num_nodes != j->num_nodes || memcmp(s->digest, j->digest, sizeof s->digest) != 0)) {
    snprintf(why, cap, "node %s:%u joined group '%s' with a configuration that differs from the others'",
             j->address, j->data_port, j->group);
    fail_session(o, s, RUCCL_ERR_CONFIG_MISMATCH, why);
    return RUCCL_ERR_CONFIG_MISMATCH;
  }
  if (s) {
    for (conn_t *other = s->nodes; other; other = other->next_in_session)
      for (uint32_t a = 0; a < other->join.num_local; a++)
        for (uint32_t b = 0; b < j->num_local; b++)
          if (other->join.peer_ids[a] == j->peer_ids[b]) {
            snprintf(why, cap, "peer id %u is registered on two nodes of group '%s'", j->peer_ids[b], j->group);
            return RUCCL_ERR_DUPLICATE_REGISTRATION;
          }
  } else {
    s = calloc(1, sizeof *s);
    if (!s) return snprintf(why, cap, "out of memory"), RUCCL_ERR_NO_MEMORY;
    snprintf(s->group, sizeof s->group, "%s", j->group);
    s->num_nodes = j->num_nodes;
    memcpy(s->digest, j->digest, sizeof s->digest);
    s->next = o->sessions;
    o->sessions = s;
  }
  /* keep join order: nodes are listed in the order they arrived, sorted later */
  conn_t **tail = &s->nodes;
  while (*tail) tail = &(*tail)->next_in_session;
  *tail = c;
  c->next_in_session = NULL;
  c->session = s;
  s->joined++;
  if (s->joined == s->num_nodes) start_session(s);
  return RUCCL_OK;
}

/* A JOIN for a group whose session still runs may have overtaken that session's
   LEAVEs (one thread per connection): give its nodes a moment to finish leaving
   before admit() calls the name taken.  Called with o->mu held. */
#define LEAVE_GRACE_NS 2000000000LL
static void wait_out_running_session(ruccl_orchestrator_t *o, const char *group) {
  int64_t until = ruccl_now_ns() + LEAVE_GRACE_NS;
  for (;;) {
    session_t *s = find_session(o, group);
    if (o->stopping || !s || !s->started) return;
    int64_t now = ruccl_now_ns();
    if (now >= until) return;
    /* o->idle is broadcast whenever a connection ends; the cond uses the realtime
       clock, so wait in short slices measured on the monotonic one. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 20000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&o->idle, &o->mu, &ts);
  }
}

/* ---- connections ------------------------------------------------------------------ */

/* Lock held: c went without LEAVE; every other node of its session hears it (a node
   still setting up stops waiting for c's links).  Each node's own thread sends it
   (after its table, never inside one of its frames). */
static void tell_node_lost(conn_t *c) {
  uint32_t id = UINT32_MAX;
  for (uint32_t a = 0; a < c->join.num_local; a++)
    if (c->join.peer_ids[a] < id) id = c->join.peer_ids[a];
  uint64_t one = 1;
  for (conn_t *other = c->session->nodes; other; other = other->next_in_session) {
    if (other == c || other->lost_pending) continue;
    other->lost_pending = 1;
    other->lost_id = id;
    if (write(other->wake, &one, sizeof one) != sizeof one) { /* an eventfd counter does not fill */
    }
  }
  ruccl_log(1, "orchestrator: the node of peer %u left group '%s' without LEAVE: telling the others", id,
            c->join.group);
}

/* A joined node's thread, once its table went: until the node leaves (LEAVE, close,
   or stop), passes on news of its session.  Returns whether it left with LEAVE. */
static int serve_session(ruccl_orchestrator_t *o, conn_t *c) {
  unsigned char buf[256]; /* a node sends nothing but LEAVE once it has joined */
  for (;;) {
    struct pollfd pf[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->wake, .events = POLLIN}};
    if (poll(pf, 2, -1) < 0 && errno != EINTR) return 0;
    if (pf[1].revents) {
      uint64_t v;
      if (read(c->wake, &v, sizeof v) != sizeof v) { /* the counter was read meanwhile */
      }
      pthread_mutex_lock(&o->mu);
      int pending = c->lost_pending;
      uint32_t id = c->lost_id;
      pthread_mutex_unlock(&o->mu);
      unsigned char w[RUCCL_NODE_LOST_BYTES];
      ruccl_node_lost_encode(id, w);
      if (pending) ruccl_frame_send(c->fd, RUCCL_FRAME_NODE_LOST, w, sizeof w, ruccl_now_ns() + 1000000000);
    }
    if (!pf[0].revents) continue;
    uint16_t type = 0;
    uint32_t len = 0;
    if (ruccl_frame_recv(c->fd, &type, buf, sizeof buf, &len, ruccl_now_ns() + TABLE_CHUNK_TIMEOUT_NS) != RUCCL_OK)
      return 0;
    if (type == RUCCL_FRAME_LEAVE) return 1;
  }
}

static void *serve(void *arg) {
  conn_t *c = arg;
  ruccl_orchestrator_t *o = c->orch;
  ruccl_result_t rc = RUCCL_OK;
  int left = 0;
  if (rc == RUCCL_OK) {
    char why[256];
    pthread_mutex_lock(&o->mu);
    wait_out_running_session(o, c->join.group);
    rc = o->stopping ? RUCCL_ERR_IO : admit(o, c, why, sizeof why);
    pthread_mutex_unlock(&o->mu);
    if (rc != RUCCL_OK) send_error_frame(c->fd, rc, why);
  }
  if (rc == RUCCL_OK && !send_table(o, c)) shutdown(c->fd, SHUT_RDWR);
  if (rc == RUCCL_OK) left = serve_session(o, c); /* the session runs: until the node leaves */
  if (rc == RUCCL_OK && !left) { /* it went without leaving: the others may be waiting for its links */
    pthread_mutex_lock(&o->mu);
    if (c->session && c->session->started && !o->stopping) tell_node_lost(c);
    pthread_mutex_unlock(&o->mu);
  }
  /* Free this thread's OpenSSL state now: stop() waits for `live`, not for the
     thread's exit, and the process may end right after it. */
  OPENSSL_thread_stop();
  pthread_mutex_lock(&o->mu);
  leave_session(o, c);
  for (conn_t **p = &o->conns; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  close(c->fd);
  close(c->wake);
  free(c);
  o->live--;
  pthread_cond_broadcast(&o->idle);
  pthread_mutex_unlock(&o->mu);
  return NULL;
}

/* ---- the front: handshakes of connections not yet proven -------------------------
 *
 * One thread accepts every connection and runs its handshake as an event loop (poll):
 * a stranger costs a socket and a slot here, never a thread.  At most PENDING_MAX
 * handshakes are under way, each for PENDING_HANDSHAKE_NS; when a connection comes
 * with every slot taken, the oldest handshake is dropped, so idle strangers cannot
 * keep a node out.  A connection that proves the secret, its JOIN inside the proof,
 * gets a thread of its own (serve) for the rest of its session. */

#define PENDING_MAX 4096
#define PENDING_HANDSHAKE_NS (10LL * 1000000000) /* hundreds of nodes at once on a few busy cores */
#define PENDING_FIRST_BYTES 1024 /* an AUTH payload's buffer to begin with (a JOIN of a few peers) */
#define ACCEPT_BACKOFF_NS (50LL * 1000000) /* out of descriptors: leave the queue a while */

typedef struct {
  int fd;
  int64_t deadline;
  ruccl_auth_server_t auth; /* the key exchange's state: its HELLO, this side's secret scalar */
  unsigned char h[RUCCL_FRAME_HEADER_BYTES];
  size_t h_have;
  unsigned char *buf; /* the AUTH payload, grown as it arrives (not as its header claims) */
  uint32_t need, have, cap;
} pending_t;

static void set_keepalive(int fd) {
  /* the same bound while data waits unacknowledged (keepalive does not probe then) */
  int on = 1, idle = KEEPALIVE_IDLE_S, interval = KEEPALIVE_INTERVAL_S, probes = KEEPALIVE_PROBES,
      unacked_ms = (KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES) * 1000;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &unacked_ms, sizeof unacked_ms) != 0)
    ruccl_log(1, "orchestrator: no TCP keepalive on a connection (%s): a host that vanishes holds its group",
              strerror(errno));
}

/* A proven node with its JOIN: a thread of its own from here on. */
static void start_conn(ruccl_orchestrator_t *o, int fd, const ruccl_join_t *join) {
  conn_t *c = calloc(1, sizeof *c);
  if (!c || (c->wake = eventfd(0, EFD_CLOEXEC)) < 0) {
    free(c);
    close(fd);
    return;
  }
  c->fd = fd;
  c->orch = o;
  c->join = *join;
  set_keepalive(fd);
  pthread_mutex_lock(&o->mu);
  c->next = o->conns;
  o->conns = c;
  o->live++;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&c->thread, &attr, serve, c) != 0) {
    o->conns = c->next;
    o->live--;
    close(fd);
    close(c->wake);
    free(c);
  }
  pthread_attr_destroy(&attr);
  pthread_mutex_unlock(&o->mu);
}

/* A slot whose handshake is over: its buffer freed, its key-exchange state wiped. */
static void clear_pending(pending_t *p) {
  free(p->buf);
  OPENSSL_cleanse(p, sizeof *p);
  p->fd = -1;
}

static void drop_pending(pending_t *p) {
  close(p->fd);
  clear_pending(p);
}

/* Reads what arrived; returns 1 when the handshake is over (the node went on to a
   thread of its own, or the connection was dropped), 0 while it waits for more. */
static int pending_read(ruccl_orchestrator_t *o, pending_t *p) {
  while (p->h_have < sizeof p->h) {
    ssize_t r = recv(p->fd, p->h + p->h_have, sizeof p->h - p->h_have, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (r <= 0) return drop_pending(p), 1;
    p->h_have += (size_t)r;
  }
  if (!p->buf) {
    uint16_t type = 0;
    uint32_t n = 0;
    if (ruccl_frame_header_decode(p->h, &type, &n) != RUCCL_OK || type != RUCCL_FRAME_AUTH ||
        n < RUCCL_AUTH_HEAD_BYTES || n > RUCCL_WIRE_MAX_CONTROL)
      return drop_pending(p), 1; /* not a handshake of ours: nothing is answered */
    p->need = n;
    p->cap = n < PENDING_FIRST_BYTES ? n : PENDING_FIRST_BYTES;
    if (!(p->buf = malloc(p->cap))) return drop_pending(p), 1;
  }
  while (p->have < p->need) {
    if (p->have == p->cap) { /* 4096 strangers announcing 64 KB each cost what they send */
      uint32_t cap = p->cap * 2 < p->need ? p->cap * 2 : p->need;
      unsigned char *grown = realloc(p->buf, cap);
      if (!grown) return drop_pending(p), 1;
      p->buf = grown, p->cap = cap;
    }
    ssize_t r = recv(p->fd, p->buf + p->have, p->cap - p->have, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (r <= 0) return drop_pending(p), 1;
    p->have += (uint32_t)r;
  }
  uint16_t type = 0;
  const unsigned char *first = NULL;
  uint32_t len = 0;
  unsigned char proof[RUCCL_AUTH_PROOF_BYTES];
  ruccl_result_t rc = ruccl_auth_check(o->key, &p->auth, p->buf, p->need, &type, &first, &len, proof);
  int64_t soon = ruccl_now_ns() + 1000000000;
  if (rc == RUCCL_ERR_AUTH) {
    ruccl_log(1, "orchestrator: refused a connection that does not know the session secret");
    ruccl_frame_send(p->fd, RUCCL_FRAME_AUTH_FAIL, NULL, 0, soon);
  }
  ruccl_join_t join;
  if (rc == RUCCL_OK && (type != RUCCL_FRAME_JOIN || ruccl_join_decode(first, len, &join) != RUCCL_OK)) {
    ruccl_log(1, "orchestrator: a node proved the secret but sent no valid JOIN");
    ruccl_frame_send(p->fd, RUCCL_FRAME_AUTH_OK, proof, sizeof proof, soon);
    rc = RUCCL_ERR_PROTOCOL;
  }
  if (rc == RUCCL_OK) rc = ruccl_frame_send(p->fd, RUCCL_FRAME_AUTH_OK, proof, sizeof proof, soon);
  if (rc != RUCCL_OK) return drop_pending(p), 1;
  start_conn(o, p->fd, &join);
  clear_pending(p);
  return 1;
}

/* A new connection: its HELLO goes at once (a fresh socket has room for it). */
static int pending_start(ruccl_orchestrator_t *o, pending_t *p, int fd) {
  memset(p, 0, sizeof *p);
  p->fd = fd;
  p->deadline = ruccl_now_ns() + PENDING_HANDSHAKE_NS;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  unsigned char frame[RUCCL_FRAME_HEADER_BYTES + RUCCL_AUTH_HELLO_BYTES];
  if (ruccl_auth_hello(o->key, &p->auth) != RUCCL_OK) return drop_pending(p), 0;
  ruccl_frame_header_encode(RUCCL_FRAME_HELLO, RUCCL_AUTH_HELLO_BYTES, frame);
  memcpy(frame + RUCCL_FRAME_HEADER_BYTES, p->auth.hello, RUCCL_AUTH_HELLO_BYTES);
  if (send(fd, frame, sizeof frame, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof frame) return drop_pending(p), 0;
  return 1;
}

static void *front_loop(void *arg) {
  ruccl_orchestrator_t *o = arg;
  pending_t *pend = calloc(PENDING_MAX, sizeof *pend);
  struct pollfd *pfd = calloc(PENDING_MAX + 2, sizeof *pfd);
  unsigned np = 0;
  int64_t backoff_until = 0;
  fcntl(o->listen_fd, F_SETFL, fcntl(o->listen_fd, F_GETFL) | O_NONBLOCK); /* accept until the queue is empty */
  while (pend && pfd) {
    int64_t now = ruccl_now_ns(), next = now + 1000000000;
    for (unsigned i = 0; i < np;) { /* past their deadline: dropped */
      if (pend[i].deadline <= now) {
        drop_pending(&pend[i]);
        pend[i] = pend[--np];
      } else {
        if (pend[i].deadline < next) next = pend[i].deadline;
        i++;
      }
    }
    int listening = now >= backoff_until;
    if (!listening && backoff_until < next) next = backoff_until;
    pfd[0] = (struct pollfd){.fd = o->wake[0], .events = POLLIN};
    pfd[1] = (struct pollfd){.fd = listening ? o->listen_fd : -1, .events = POLLIN};
    for (unsigned i = 0; i < np; i++) pfd[2 + i] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
    int r = poll(pfd, np + 2, (int)((next - now) / 1000000 + 1));
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    if (pfd[0].revents) break;
    for (unsigned i = np; i-- > 0;) /* backwards: a finished one takes the last's place */
      if (pfd[2 + i].revents && pending_read(o, &pend[i])) pend[i] = pend[--np];
    if (!(pfd[1].revents & POLLIN)) continue;
    for (int k = 0; k < 64; k++) { /* a burst of nodes at once */
      int fd = accept4(o->listen_fd, NULL, NULL, SOCK_CLOEXEC);
      if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
        backoff_until = ruccl_now_ns() + ACCEPT_BACKOFF_NS; /* they stay queued; no spinning on them */
        break;
      }
      if (fd < 0) break;
      if (np == PENDING_MAX) { /* every slot taken: the oldest handshake goes */
        unsigned oldest = 0;
        for (unsigned i = 1; i < np; i++)
          if (pend[i].deadline < pend[oldest].deadline) oldest = i;
        drop_pending(&pend[oldest]);
        pend[oldest] = pend[--np];
      }
      if (pending_start(o, &pend[np], fd)) np++;
    }
  }
  for (unsigned i = 0; pend && i < np; i++) drop_pending(&pend[i]);
  free(pend);
  free(pfd);
  OPENSSL_thread_stop();
  return NULL;
}

ruccl_result_t ruccl_orchestrator_start(const char *listen_host_port, const void *secret, size_t secret_len,
                                        ruccl_orchestrator_t **out) {
  if (!listen_host_port || !out) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "listen address or out is NULL");
  *out = NULL;
  if (secret_len > RUCCL_MAX_SECRET || (secret_len && !secret))
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "secret must be at most %d bytes", RUCCL_MAX_SECRET);
  char host[RUCCL_MAX_ADDRESS];
  int port;
  ruccl_result_t rc = ruccl_split_host_port(listen_host_port, host, sizeof host, &port);
  if (rc != RUCCL_OK) return rc;
  unsigned char env_secret[RUCCL_MAX_SECRET] = {0};
  if (secret_len == 0) { /* no orchestrator without a secret: nodes have one */
    rc = ruccl_secret_from_env(env_secret, &secret_len);
    if (rc != RUCCL_OK) {
      char why[256];
      snprintf(why, sizeof why, "%s", ruccl_last_error_detail());
      return ruccl_fail(rc, "the orchestrator needs a secret (%s); " RUCCL_SECRET_HOWTO, why);
    }
    secret = env_secret;
  }
  ruccl_orchestrator_t *o = calloc(1, sizeof *o);
  if (!o) rc = ruccl_fail(RUCCL_ERR_NO_MEMORY, "orchestrator");
  if (o) rc = ruccl_tcp_listen(host, port, &o->listen_fd, &o->port);
  if (rc == RUCCL_OK && pipe2(o->wake, O_CLOEXEC) != 0) {
    close(o->listen_fd);
    rc = ruccl_fail(RUCCL_ERR_IO, "pipe: %s", strerror(errno));
  }
  if (rc != RUCCL_OK) {
    OPENSSL_cleanse(env_secret, sizeof env_secret);
    free(o);
    return rc;
  }
  rc = ruccl_auth_key(secret, secret_len, o->key);
  OPENSSL_cleanse(env_secret, sizeof env_secret);
  if (rc != RUCCL_OK) {
    close(o->listen_fd);
    close(o->wake[0]);
    close(o->wake[1]);
    free(o);
    return rc;
  }
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->idle, NULL);
  if (pthread_create(&o->acceptor, NULL, front_loop, o) != 0) {
    close(o->listen_fd);
    close(o->wake[0]);
    close(o->wake[1]);
    OPENSSL_cleanse(o->key, sizeof o->key);
    free(o);
    return ruccl_fail(RUCCL_ERR_NO_MEMORY, "orchestrator thread");
  }
  ruccl_log(2, "orchestrator listening on %s:%d", host, o->port);
  *out = o;
  return RUCCL_OK;
}

int ruccl_orchestrator_port(const ruccl_orchestrator_t *o) { return o ? o->port : -1; }

ruccl_result_t ruccl_orchestrator_stop(ruccl_orchestrator_t *o) {
  if (!o) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "orchestrator is NULL");
  char byte = 1;
  if (write(o->wake[1], &byte, 1) != 1) { /* the pipe cannot be full: one byte, once */
  }
  pthread_join(o->acceptor, NULL);
  pthread_mutex_lock(&o->mu);
  o->stopping = 1;
  for (conn_t *c = o->conns; c; c = c->next) shutdown(c->fd, SHUT_RDWR);
  while (o->live) pthread_cond_wait(&o->idle, &o->mu);
  while (o->sessions) drop_session(o, o->sessions);
  pthread_mutex_unlock(&o->mu);
  close(o->listen_fd);
  close(o->wake[0]);
  close(o->wake[1]);
  pthread_mutex_destroy(&o->mu);
  pthread_cond_destroy(&o->idle);
  OPENSSL_cleanse(o->key, sizeof o->key);
  free(o);
  return RUCCL_OK;
}

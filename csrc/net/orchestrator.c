/* orchestrator.c — the multi-node rendezvous server.
 *
 * Each connection must first pass the HMAC challenge-response; then it sends one
 * JOIN (group name, node count, config digest, its data address, its peer ids).
 * When num_nodes nodes of a group have joined, every one of them receives the
 * TABLE of all nodes' data addresses and peer ids; the data plane then runs
 * directly between the nodes.  A node's connection stays open for the session; when
 * every node has left (LEAVE or closed), the group's session is over and the name
 * can start a new one.  Strangers, wrong secrets and malformed frames are dropped
 * without touching any session.  One thread per connection: sessions are few and
 * short-lived, and a blocked stranger cannot stall anyone else; each node's thread
 * also sends that node its table, so that a slow reader holds up no one else.  A node's host that
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

#define HANDSHAKE_TIMEOUT_NS (10LL * 1000000000)
#define TABLE_CHUNK_TIMEOUT_NS (10LL * 1000000000) /* one chunk of the table to one node */
/* keepalive probes after 5 s of silence, every 2 s, 3 unanswered: the peer is gone */
#define KEEPALIVE_IDLE_S 5
#define KEEPALIVE_INTERVAL_S 2
#define KEEPALIVE_PROBES 3
#define SESSION_IDLE_NS (24LL * 3600 * 1000000000) /* a joined node may wait this long */

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
  int wake; /* eventfd: its session's table is ready */
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
  ruccl_error_wire_t e;
  memset(&e, 0, sizeof e);
  e.code = htonl((uint32_t)code);
  snprintf(e.message, sizeof e.message, "%s", msg);
  ruccl_frame_send(fd, RUCCL_FRAME_ERROR, &e, sizeof e, ruccl_now_ns() + 1000000000);
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

static void *serve(void *arg) {
  conn_t *c = arg;
  ruccl_orchestrator_t *o = c->orch;
  /* The JOIN comes inside the handshake, once the node has proven the secret */
  unsigned char *buf = malloc(RUCCL_WIRE_MAX_CONTROL);
  uint16_t type = 0;
  uint32_t len = 0;
  ruccl_result_t rc = buf ? ruccl_auth_server(c->fd, o->key, &type, buf, RUCCL_WIRE_MAX_CONTROL, &len,
                                              ruccl_now_ns() + HANDSHAKE_TIMEOUT_NS)
                          : ruccl_fail(RUCCL_ERR_NO_MEMORY, "orchestrator connection");
  if (rc == RUCCL_OK && (type != RUCCL_FRAME_JOIN || ruccl_join_decode(buf, len, &c->join) != RUCCL_OK))
    rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "orchestrator: the first frame of the handshake is not a valid JOIN");
  if (rc == RUCCL_OK) {
    char why[256];
    pthread_mutex_lock(&o->mu);
    wait_out_running_session(o, c->join.group);
    rc = o->stopping ? RUCCL_ERR_IO : admit(o, c, why, sizeof why);
    pthread_mutex_unlock(&o->mu);
    if (rc != RUCCL_OK) send_error_frame(c->fd, rc, why);
  }
  if (rc == RUCCL_OK && !send_table(o, c)) shutdown(c->fd, SHUT_RDWR);
  if (rc == RUCCL_OK) {
    /* The session runs; we only wait for this node to leave (LEAVE, close, or stop). */
    uint16_t type = 0;
    uint32_t len = 0;
    while (ruccl_frame_recv(c->fd, &type, buf, RUCCL_WIRE_MAX_CONTROL, &len, ruccl_now_ns() + SESSION_IDLE_NS) ==
               RUCCL_OK &&
           type != RUCCL_FRAME_LEAVE) {
    }
  }
  free(buf);
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

static void *accept_loop(void *arg) {
  ruccl_orchestrator_t *o = arg;
  for (;;) {
    int fd = ruccl_accept_until_woken(o->listen_fd, o->wake[0]);
    if (fd < 0) return NULL;
    conn_t *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    c->fd = fd;
    c->orch = o;
    c->wake = eventfd(0, EFD_CLOEXEC);
    if (c->wake < 0) {
      close(fd);
      free(c);
      continue;
    }
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
  if (pthread_create(&o->acceptor, NULL, accept_loop, o) != 0) {
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

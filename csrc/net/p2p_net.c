/* p2p_net.c — point-to-point messages between nodes (see p2p_net.h). */
#include "p2p_net.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../error.h"
#include "../le.h"
#include "../testing.h"
#include "wire.h"

#define POLL_SLICE_MS 50
#define SINK_BYTES (64 * 1024)
#define PAUSED_POLL_MS 5 /* a paused stream looks again this often for room or a receive */
#define HELLO_BYTES (RUCCL_MAX_GROUP_NAME + 4)

enum { FRAME_MESSAGE = 1, FRAME_END = 2, FRAME_ABORT = 3, FRAME_BEAT = 4 };

typedef struct {
  pthread_mutex_t mu; /* one sender at a time; held for a whole message */
  int fd;             /* -1: not opened yet */
  ruccl_result_t failed;
  char why[200];
} out_conn_t;

typedef struct {
  int fd; /* -1: none (yet, or any more) */
  unsigned char hdr[RUCCL_P2P_FRAME_BYTES];
  size_t hdr_done;
  int in_message, ended;
  size_t len, done;
  int drop; /* no mailbox takes it */
  ruccl_arrival_t arrival;
  /* Its header is in, but the mailbox's unexpected queue is full and no receive takes
     it: nothing more is read from this stream until one does (header fields kept). */
  int paused;
  uint32_t p_src, p_dst;
  int32_t p_tag;
  uint64_t p_len;
} in_conn_t;

struct ruccl_p2p_net {
  unsigned num_nodes, me;
  ruccl_p2p_routes_t routes;
  out_conn_t *out;
  pthread_mutex_t in_mu; /* in[].fd, the reader's start */
  in_conn_t *in;
  pthread_t reader;
  int reader_running;
  int wake[2];
  atomic_int stop;
  char *sink;
  size_t unexpected_cap; /* bytes a mailbox holds unexpected from the network before streams pause */
  /* Liveness: this node beats to its successor in the ring of nodes and watches its
     predecessor (heard: when a byte of its stream last came; quiet: it finished or
     its stream ended, nothing more to watch). */
  int64_t liveness_ns; /* 0: off */
  /* Until the predecessor's first byte (heard still at watch_from) it may still be
     setting up (in a large session the last node connects long after the first is
     ready): it is given the session's timeout then, the liveness timeout after. */
  int64_t watch_from, setup_grace_ns;
  unsigned succ, pred;
  atomic_llong *heard;
  atomic_int pred_quiet;
  atomic_int beat_stop;
  pthread_t beater;
  int beater_running;
  pthread_mutex_t beat_mu;
  pthread_cond_t beat_cv;
  ruccl_net_t *net;
};

/* ---- encoding ------------------------------------------------------------------- */

static void encode_frame(unsigned char f[RUCCL_P2P_FRAME_BYTES], uint32_t kind, uint32_t src, uint32_t dst,
                         int32_t tag, uint64_t len) {
  ruccl_put_le32(f, kind);
  ruccl_put_le32(f + 4, src);
  ruccl_put_le32(f + 8, dst);
  ruccl_put_le32(f + 12, (uint32_t)tag);
  ruccl_put_le64(f + 16, len);
}

/* ---- set-up --------------------------------------------------------------------- */

ruccl_result_t ruccl_p2p_net_init(ruccl_net_t *net, const ruccl_p2p_routes_t *routes) {
  unsigned n = net->num_nodes;
  ruccl_p2p_net_t *p = calloc(1, sizeof *p);
  if (!p) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "point-to-point connections");
  p->num_nodes = n;
  p->me = net->me;
  /* The ring of liveness: fixed before any stream reader starts (a reader that sees
     its stream end compares the sender with pred). */
  p->succ = (p->me + 1) % n;
  p->pred = (p->me + n - 1) % n;
  p->routes = *routes;
  p->out = calloc(n, sizeof *p->out);
  p->in = calloc(n, sizeof *p->in);
  p->sink = malloc(SINK_BYTES);
  p->heard = calloc(n, sizeof *p->heard);
  p->wake[0] = p->wake[1] = -1;
  if (!p->out || !p->in || !p->sink || !p->heard || pipe2(p->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    free(p->out), free(p->in), free(p->sink), free(p->heard);
    if (p->wake[0] >= 0) close(p->wake[0]), close(p->wake[1]);
    free(p);
    return ruccl_fail(RUCCL_ERR_NO_MEMORY, "point-to-point connections");
  }
  for (unsigned k = 0; k < n; k++) {
    pthread_mutex_init(&p->out[k].mu, NULL);
    p->out[k].fd = -1;
    p->in[k].fd = -1;
  }
  pthread_mutex_init(&p->in_mu, NULL);
  pthread_mutex_init(&p->beat_mu, NULL);
  ruccl_cond_init_monotonic(&p->beat_cv);
  atomic_init(&p->stop, 0);
  atomic_init(&p->pred_quiet, 0);
  atomic_init(&p->beat_stop, 0);
  p->net = net;
  p->unexpected_cap = (size_t)RUCCL_P2P_UNEXPECTED_MB << 20;
  const char *e = getenv("RUCCL_P2P_UNEXPECTED_MB");
  if (e && *e) {
    char *end = NULL;
    unsigned long long mb = strtoull(e, &end, 10);
    if (*end || mb == 0 || mb > (1ull << 30))
      ruccl_log(1, "RUCCL_P2P_UNEXPECTED_MB=%s is not a number of MiB: using %d", e, RUCCL_P2P_UNEXPECTED_MB);
    else
      p->unexpected_cap = (size_t)mb << 20;
  }
  net->p2p = p;
  return RUCCL_OK;
}

/* ---- receiving ------------------------------------------------------------------ */

/* The stream from node k ended (code: PEER_FINISHED after its end frame, else why
   it broke): what was arriving fails, and so do receives waiting for its peers. */
static void stream_over(ruccl_p2p_net_t *p, unsigned k, ruccl_result_t code, const char *why) {
  in_conn_t *in = &p->in[k];
  if (in->in_message && !in->drop) ruccl_arrival_end(&in->arrival, code, why);
  in->in_message = 0;
  if (k == p->pred) atomic_store(&p->pred_quiet, 1); /* its end, or a break the data sockets see too */
  pthread_mutex_lock(&p->in_mu);
  close(in->fd);
  in->fd = -1;
  pthread_mutex_unlock(&p->in_mu);
  uint32_t *srcs = malloc(sizeof *srcs * p->routes.n_total);
  size_t ns = 0;
  for (uint32_t gi = 0; srcs && gi < p->routes.n_total; gi++)
    if (p->routes.node_of[gi] == k) srcs[ns++] = gi;
  for (uint32_t gi = 0; srcs && gi < p->routes.n_total; gi++) {
    ruccl_mailbox_t *mb = p->routes.node_of[gi] == p->me ? p->routes.mailbox(p->routes.ctx, gi) : NULL;
    if (mb) ruccl_mailbox_fail_sources(mb, srcs, ns, code, why);
  }
  free(srcs);
  ruccl_log(code == RUCCL_ERR_PEER_FINISHED ? 2 : 1, "node %u: point-to-point stream from node %u over: %s", p->me, k,
            why);
}

/* A whole header: checked, then where its bytes go.  RUCCL_OK or why the stream is
   unusable. */
static ruccl_result_t header_in(ruccl_p2p_net_t *p, unsigned k, in_conn_t *in, char *why, size_t cap) {
  uint32_t kind = ruccl_get_le32(in->hdr), src = ruccl_get_le32(in->hdr + 4), dst = ruccl_get_le32(in->hdr + 8);
  int32_t tag = (int32_t)ruccl_get_le32(in->hdr + 12);
  uint64_t len = ruccl_get_le64(in->hdr + 16);
  in->hdr_done = 0;
  if (kind == FRAME_END && !in->ended) {
    in->ended = 1;
    return RUCCL_OK;
  }
  if (kind == FRAME_BEAT && len == 0) return RUCCL_OK; /* heard: pump stamped it */
  if (kind == FRAME_ABORT && len == 0) {
    uint32_t code = (uint32_t)tag;
    if (code == RUCCL_OK || code >= RUCCL_NUM_RESULTS) code = RUCCL_ERR_PEER_LOST;
    if (p->routes.stopped) p->routes.stopped(p->routes.ctx, k, (ruccl_result_t)code);
    return RUCCL_OK;
  }
  const ruccl_p2p_routes_t *r = &p->routes;
  if (kind != FRAME_MESSAGE || in->ended || src >= r->n_total || r->node_of[src] != k || dst >= r->n_total ||
      r->node_of[dst] != p->me || len > RUCCL_P2P_MAX_MESSAGE) {
    snprintf(why, cap, "node %u sent a malformed point-to-point frame (kind %u, from %u to %u, %llu bytes)", k, kind,
             src, dst, (unsigned long long)len);
    return RUCCL_ERR_PROTOCOL;
  }
  in->paused = 1;
  in->p_src = src, in->p_dst = dst, in->p_tag = tag, in->p_len = len;
  return RUCCL_OK;
}

/* A message whose header is in begins, if its mailbox can take it now (1); else the
   stream stays paused (0). */
static int begin_message(ruccl_p2p_net_t *p, in_conn_t *in) {
  ruccl_mailbox_t *mb = p->routes.mailbox(p->routes.ctx, in->p_dst);
  if (mb && !ruccl_arrival_may_begin(mb, in->p_src, in->p_tag, (size_t)in->p_len, p->unexpected_cap)) return 0;
  in->paused = 0;
  in->in_message = 1;
  in->len = (size_t)in->p_len;
  in->done = 0;
  in->drop = !mb;
  if (mb) ruccl_arrival_begin(mb, in->p_src, in->p_tag, in->len, &in->arrival);
  return 1;
}

/* Reads what node k's stream holds.  Returns 0 while it goes on. */
static int pump(ruccl_p2p_net_t *p, unsigned k) {
  in_conn_t *in = &p->in[k];
  char why[240];
  for (;;) {
    if (in->paused && !begin_message(p, in)) return 0; /* its sender waits */
    if (in->in_message && in->done == in->len) {
      if (!in->drop) ruccl_arrival_end(&in->arrival, RUCCL_OK, NULL);
      in->in_message = 0;
      continue;
    }
    char *dst;
    size_t want;
    if (!in->in_message) {
      dst = (char *)in->hdr + in->hdr_done;
      want = sizeof in->hdr - in->hdr_done;
    } else {
      dst = in->drop ? NULL : ruccl_arrival_target(&in->arrival, in->done);
      want = in->len - in->done;
      if (!dst) {
        dst = p->sink;
        if (want > SINK_BYTES) want = SINK_BYTES;
      }
    }
    ssize_t got = recv(in->fd, dst, want, MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (got <= 0) {
      if (got == 0 && in->ended && !in->in_message && in->hdr_done == 0) {
        snprintf(why, sizeof why, "node %u finished its session", k);
        stream_over(p, k, RUCCL_ERR_PEER_FINISHED, why);
      } else {
        snprintf(why, sizeof why, "lost node %u's point-to-point connection (%s)", k,
                 got == 0 ? "closed" : strerror(errno));
        stream_over(p, k, RUCCL_ERR_PEER_LOST, why);
      }
      return 1;
    }
    atomic_store_explicit(&p->heard[k], ruccl_now_ns(), memory_order_relaxed);
    if (in->in_message) {
      in->done += (size_t)got;
      continue;
    }
    in->hdr_done += (size_t)got;
    if (in->hdr_done < sizeof in->hdr) continue;
    ruccl_result_t rc = header_in(p, k, in, why, sizeof why);
    if (rc != RUCCL_OK) {
      stream_over(p, k, rc, why);
      return 1;
    }
  }
}

static void *reader_main(void *arg) {
  ruccl_p2p_net_t *p = arg;
  struct pollfd *pf = malloc(sizeof *pf * (p->num_nodes + 1));
  unsigned *node = malloc(sizeof *node * (p->num_nodes + 1));
  while (pf && node && !atomic_load(&p->stop)) {
    nfds_t n = 0;
    pf[n++] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
    int paused = 0;
    pthread_mutex_lock(&p->in_mu);
    for (unsigned k = 0; k < p->num_nodes; k++) {
      if (p->in[k].fd < 0) continue;
      if (p->in[k].paused) { /* not polled (its bytes wait): looked at again below */
        paused = 1;
        continue;
      }
      node[n] = k, pf[n++] = (struct pollfd){.fd = p->in[k].fd, .events = POLLIN};
    }
    pthread_mutex_unlock(&p->in_mu);
    if (poll(pf, n, paused ? PAUSED_POLL_MS : 1000) < 0 && errno != EINTR) break;
    for (unsigned k = 0; paused && k < p->num_nodes; k++) {
      if (p->in[k].fd < 0 || !p->in[k].paused) continue;
      /* Its node is not silent: this one stopped reading it.  Liveness resumes with
         the stream (a node frozen meanwhile is found by the data links). */
      atomic_store_explicit(&p->heard[k], ruccl_now_ns(), memory_order_relaxed);
      pump(p, k);
    }
    if (pf[0].revents) {
      char b[64];
      while (read(p->wake[0], b, sizeof b) > 0) {
      }
    }
    for (nfds_t i = 1; i < n; i++)
      if (pf[i].revents) pump(p, node[i]);
  }
  free(pf);
  free(node);
  OPENSSL_thread_stop();
  return NULL;
}

int ruccl_p2p_net_adopt(ruccl_net_t *net, int fd, unsigned from, const void *hello, size_t len, int64_t deadline_ns) {
  ruccl_p2p_net_t *p = net->p2p;
  if (!p || len != HELLO_BYTES) return 0;
  char group[RUCCL_MAX_GROUP_NAME];
  memcpy(group, hello, sizeof group);
  group[sizeof group - 1] = 0;
  uint32_t k = ruccl_get_le32((const unsigned char *)hello + RUCCL_MAX_GROUP_NAME);
  if (k != from || strcmp(group, net->group) != 0 || k >= p->num_nodes || k == p->me) return 0;
  pthread_mutex_lock(&p->in_mu);
  int taken = p->in[k].fd < 0 && !atomic_load(&p->stop);
  if (taken) {
    uint32_t ok = 1;
    unsigned char wire[4];
    ruccl_put_le32(wire, ok);
    taken = ruccl_frame_send(fd, RUCCL_FRAME_P2P_ACK, wire, sizeof wire, deadline_ns) == RUCCL_OK;
  }
  if (taken) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    memset(&p->in[k], 0, sizeof p->in[k]);
    p->in[k].fd = fd;
    if (!p->reader_running) p->reader_running = pthread_create(&p->reader, NULL, reader_main, p) == 0;
    taken = p->reader_running;
    if (!taken) p->in[k].fd = -1;
  }
  pthread_mutex_unlock(&p->in_mu);
  if (taken) {
    char b = 1;
    if (write(p->wake[1], &b, 1) < 0) {
    }
    ruccl_log(2, "node %u: node %u opened a point-to-point stream", p->me, k);
  }
  return taken;
}

/* ---- sending -------------------------------------------------------------------- */

/* Connection lock held. */
static ruccl_result_t open_out(ruccl_net_t *net, unsigned k, int64_t deadline_ns) {
  ruccl_p2p_net_t *p = net->p2p;
  int fd = -1;
  unsigned char hello[HELLO_BYTES] = {0};
  snprintf((char *)hello, RUCCL_MAX_GROUP_NAME, "%s", net->group);
  ruccl_put_le32(hello + RUCCL_MAX_GROUP_NAME, p->me);
  ruccl_result_t rc = ruccl_net_dial(net, k, RUCCL_FRAME_P2P, hello, sizeof hello, deadline_ns, &fd);
  if (rc == RUCCL_OK) {
    unsigned char ack[4];
    uint16_t type = 0;
    uint32_t len = 0;
    rc = ruccl_frame_recv(fd, &type, ack, sizeof ack, &len, deadline_ns);
    if (rc == RUCCL_OK && (type != RUCCL_FRAME_P2P_ACK || len != sizeof ack || ruccl_get_le32(ack) != 1))
      rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "node %u refused a point-to-point stream", k);
  }
  if (rc != RUCCL_OK) {
    if (fd >= 0) close(fd);
    return ruccl_fail(rc == RUCCL_ERR_TIMEOUT ? rc : RUCCL_ERR_PEER_LOST,
                      "node %u cannot open a point-to-point connection to node %u at %s:%u (it may have finished): %s",
                      p->me, k, net->nodes[k].address, net->nodes[k].port, ruccl_last_error_detail());
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  p->out[k].fd = fd;
  ruccl_log(2, "node %u: opened a point-to-point connection to node %u", p->me, k);
  return RUCCL_OK;
}

/* Connection lock held: a frame or message cut short leaves the stream unusable;
   later sends to the node fail with rc and this thread's error. */
static void out_failed(out_conn_t *o, ruccl_result_t rc) {
  if (o->fd >= 0) close(o->fd);
  o->fd = -1;
  o->failed = rc;
  snprintf(o->why, sizeof o->why, "%s", ruccl_last_error());
}

/* Writes all of buf, waiting for room until the deadline; gives up when the
   session fails meanwhile. */
static ruccl_result_t write_out(ruccl_net_t *net, unsigned k, int fd, const void *buf, size_t len,
                                int64_t deadline_ns) {
  const char *at = buf;
  while (len) {
    ssize_t w = send(fd, at, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      at += w, len -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return ruccl_fail(RUCCL_ERR_PEER_LOST, "node %u lost its point-to-point connection to node %u (%s)",
                        net->p2p->me, k, strerror(errno));
    ruccl_result_t rc = ruccl_net_session_state(net);
    if (rc != RUCCL_OK) return rc;
    int64_t now = ruccl_now_ns();
    if (now >= deadline_ns)
      return ruccl_fail(RUCCL_ERR_TIMEOUT, "node %u: node %u took no point-to-point bytes within the timeout",
                        net->p2p->me, k);
    int64_t left_ms = (deadline_ns - now) / 1000000 + 1;
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    poll(&pf, 1, left_ms < POLL_SLICE_MS ? (int)left_ms : POLL_SLICE_MS);
  }
  return RUCCL_OK;
}

ruccl_result_t ruccl_p2p_net_send(ruccl_net_t *net, unsigned node, uint32_t src, uint32_t dst, int32_t tag,
                                  const void *buf, size_t bytes, int64_t deadline_ns) {
  ruccl_p2p_net_t *p = net->p2p;
  out_conn_t *o = &p->out[node];
  pthread_mutex_lock(&o->mu);
  ruccl_result_t rc = o->failed;
  if (rc != RUCCL_OK) {
    ruccl_set_last_error(o->why);
  } else {
    rc = ruccl_net_session_state(net);
    if (rc == RUCCL_OK && o->fd < 0) rc = open_out(net, node, deadline_ns);
    unsigned char f[RUCCL_P2P_FRAME_BYTES];
    encode_frame(f, FRAME_MESSAGE, src, dst, tag, bytes);
    if (rc == RUCCL_OK) rc = write_out(net, node, o->fd, f, sizeof f, deadline_ns);
    if (rc == RUCCL_OK && bytes) rc = write_out(net, node, o->fd, buf, bytes, deadline_ns);
    if (rc != RUCCL_OK) out_failed(o, rc);
  }
  pthread_mutex_unlock(&o->mu);
  return rc;
}

/* ---- control -------------------------------------------------------------------- */

static void notify(ruccl_net_t *net, ruccl_p2p_net_t *p, unsigned node, ruccl_result_t code, int64_t deadline_ns);

void ruccl_p2p_net_notify(ruccl_net_t *net, unsigned node, ruccl_result_t code, int64_t deadline_ns) {
  ruccl_p2p_net_t *p = net->p2p;
  if (!p || node >= p->num_nodes || node == p->me) return;
  char cause[512]; /* this thread's error is why the session stops: a notice that fails must not replace it */
  snprintf(cause, sizeof cause, "%s", ruccl_last_error());
  notify(net, p, node, code, deadline_ns);
  ruccl_set_last_error(cause);
}

static void notify(ruccl_net_t *net, ruccl_p2p_net_t *p, unsigned node, ruccl_result_t code, int64_t deadline_ns) {
  out_conn_t *o = &p->out[node];
  /* A sender holds the lock for a whole message (which the other side drains as it
     comes): wait for the boundary, within the budget. */
  while (pthread_mutex_trylock(&o->mu) != 0) {
    if (ruccl_now_ns() >= deadline_ns) {
      ruccl_log(1, "node %u: could not tell node %u why the session stops", p->me, node);
      return;
    }
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
  }
  ruccl_result_t rc = o->failed;
  if (rc == RUCCL_OK && o->fd < 0) rc = open_out(net, node, deadline_ns);
  if (rc == RUCCL_OK) {
    unsigned char f[RUCCL_P2P_FRAME_BYTES];
    encode_frame(f, FRAME_ABORT, 0, 0, (int32_t)code, 0);
    rc = write_out(net, node, o->fd, f, sizeof f, deadline_ns);
  }
  pthread_mutex_unlock(&o->mu);
  if (rc != RUCCL_OK) ruccl_log(1, "node %u: could not tell node %u why the session stops: %s", p->me, node,
                                ruccl_last_error());
}

/* Whether node k's data port refuses connections: its process is gone (or its session
   closed), so no notice of why will come from it.  A port that takes the connection,
   or does not answer within the probe's bound, may still send one. */
static int port_refuses(const ruccl_net_t *net, unsigned k) {
  int fd = -1;
  ruccl_result_t rc = ruccl_tcp_connect_ex(net->nodes[k].address, (int)net->nodes[k].port,
                                           ruccl_now_ns() + 50000000, 0, &fd);
  if (fd >= 0) close(fd);
  return rc == RUCCL_ERR_PEER_LOST;
}

void ruccl_p2p_net_await_notice(const ruccl_net_t *net, unsigned node, int ms) {
  ruccl_p2p_net_t *p = net->p2p;
  if (!p || node >= p->num_nodes) return;
  int seen = 0; /* a stream from the node, which its end then settles */
  int gone = 0; /* its data port refuses: a node that is gone (killed) says nothing more */
  for (int i = 0; i < ms; i++) {
    if (ruccl_net_session_state(net) != RUCCL_OK) return;
    pthread_mutex_lock(&p->in_mu);
    int streaming = p->in[node].fd >= 0;
    pthread_mutex_unlock(&p->in_mu);
    if (seen && !streaming) return; /* the reader took all the stream held */
    if (i == 0 && !streaming) gone = port_refuses(net, node);
    /* a notice it sent just before it went is a stream being taken by now */
    if (gone && !streaming && i >= 3) return;
    seen |= streaming;
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
  }
}

/* ---- liveness ------------------------------------------------------------------ */

/* One beat to the successor, unless a message is on its way there (its bytes are
   beats enough) or the connection failed (the data sockets report that). */
static void beat(ruccl_p2p_net_t *p, int64_t deadline_ns) {
  out_conn_t *o = &p->out[p->succ];
  if (pthread_mutex_trylock(&o->mu) != 0) return;
  ruccl_result_t rc = o->failed;
  if (rc == RUCCL_OK && o->fd < 0) rc = open_out(p->net, p->succ, deadline_ns);
  if (rc == RUCCL_OK) {
    unsigned char f[RUCCL_P2P_FRAME_BYTES];
    encode_frame(f, FRAME_BEAT, 0, 0, 0, 0);
    rc = write_out(p->net, p->succ, o->fd, f, sizeof f, deadline_ns);
    if (rc != RUCCL_OK) out_failed(o, rc); /* open_out's failure, above, is retried next beat */
  }
  pthread_mutex_unlock(&o->mu);
}

static void *beater_main(void *arg) {
  ruccl_p2p_net_t *p = arg;
  const int64_t period = p->liveness_ns / 4;
  pthread_mutex_lock(&p->beat_mu);
  while (!atomic_load(&p->beat_stop)) {
    pthread_mutex_unlock(&p->beat_mu);
    int64_t now = ruccl_now_ns();
    if (!ruccl_testing_beats_silenced()) beat(p, now + period);
    now = ruccl_now_ns();
    const int64_t heard = atomic_load_explicit(&p->heard[p->pred], memory_order_relaxed);
    const int64_t silent = now - heard;
    const int64_t limit = heard == p->watch_from && p->setup_grace_ns > p->liveness_ns ? p->setup_grace_ns
                                                                                        : p->liveness_ns;
    if (silent > limit && !atomic_load(&p->pred_quiet) && !atomic_load(&p->beat_stop) &&
        ruccl_net_session_state(p->net) == RUCCL_OK) {
      atomic_store(&p->pred_quiet, 1);
      ruccl_log(1, "node %u: node %u sent nothing for %lld ms", p->me, p->pred, (long long)(silent / 1000000));
      if (p->routes.silent) p->routes.silent(p->routes.ctx, p->pred, silent / 1000000);
    }
    int64_t wake = ruccl_now_ns() + period;
    struct timespec until = {.tv_sec = wake / 1000000000, .tv_nsec = wake % 1000000000};
    pthread_mutex_lock(&p->beat_mu);
    if (!atomic_load(&p->beat_stop)) pthread_cond_timedwait(&p->beat_cv, &p->beat_mu, &until);
  }
  pthread_mutex_unlock(&p->beat_mu);
  OPENSSL_thread_stop();
  return NULL;
}

/* ms in ns, at most a quarter of INT64_MAX (room for a clock reading plus it). */
static int64_t ms_to_ns(int64_t ms) { return ms > INT64_MAX / 4 / 1000000 ? INT64_MAX / 4 : ms * 1000000; }

void ruccl_p2p_net_start_liveness(ruccl_net_t *net, int64_t timeout_ms) {
  ruccl_p2p_net_t *p = net->p2p;
  if (!p || p->num_nodes < 2 || timeout_ms <= 0) return;
  p->liveness_ns = ms_to_ns(timeout_ms);
  /* Until its first byte the predecessor may still be setting up: it gets the set-up
     grace (net->setup_grace_ms), the liveness timeout after. */
  p->setup_grace_ns = ms_to_ns(net->setup_grace_ms > timeout_ms ? net->setup_grace_ms : timeout_ms);
  /* A byte from the predecessor may have come already (its stream opened early):
     then the liveness timeout applies from that byte on, with no grace. */
  long long never = 0;
  p->watch_from = ruccl_now_ns();
  if (!atomic_compare_exchange_strong(&p->heard[p->pred], &never, p->watch_from)) p->watch_from = -1;
  p->beater_running = pthread_create(&p->beater, NULL, beater_main, p) == 0;
  if (!p->beater_running) ruccl_log(1, "node %u: no liveness thread: a frozen peer is found by the timeout only", p->me);
}

/* ---- the end -------------------------------------------------------------------- */

void ruccl_p2p_net_close(ruccl_net_t *net, int finished) {
  ruccl_p2p_net_t *p = net->p2p;
  if (!p) return;
  if (p->beater_running) { /* the beats end first: nothing is sent after the end frames */
    atomic_store(&p->beat_stop, 1);
    pthread_mutex_lock(&p->beat_mu);
    pthread_cond_broadcast(&p->beat_cv);
    pthread_mutex_unlock(&p->beat_mu);
    pthread_join(p->beater, NULL);
    p->beater_running = 0;
  }
  int64_t deadline = ruccl_deadline_after_ms(net->timeout_ms);
  int *fds = malloc(sizeof *fds * p->num_nodes);
  for (unsigned k = 0; k < p->num_nodes; k++) {
    out_conn_t *o = &p->out[k];
    pthread_mutex_lock(&o->mu);
    if (fds) fds[k] = -1;
    if (o->fd >= 0 && finished) {
      unsigned char f[RUCCL_P2P_FRAME_BYTES];
      encode_frame(f, FRAME_END, 0, 0, 0, 0);
      if (write_out(net, k, o->fd, f, sizeof f, deadline) == RUCCL_OK) {
        shutdown(o->fd, SHUT_WR);
        if (fds) fds[k] = o->fd;
      }
    }
    pthread_mutex_unlock(&o->mu);
  }
  if (fds && finished) ruccl_net_wait_taken(net, fds, p->num_nodes, deadline);
  free(fds);
  atomic_store(&p->stop, 1);
  char b = 1;
  if (write(p->wake[1], &b, 1) < 0) {
  }
  pthread_mutex_lock(&p->in_mu);
  int running = p->reader_running;
  pthread_mutex_unlock(&p->in_mu);
  if (running) pthread_join(p->reader, NULL);
  for (unsigned k = 0; k < p->num_nodes; k++) {
    in_conn_t *in = &p->in[k];
    if (in->fd >= 0) {
      if (in->in_message && !in->drop) ruccl_arrival_end(&in->arrival, RUCCL_ERR_PEER_LOST, "the session closed");
      close(in->fd);
    }
    if (p->out[k].fd >= 0) close(p->out[k].fd);
    pthread_mutex_destroy(&p->out[k].mu);
  }
  pthread_mutex_destroy(&p->in_mu);
  pthread_mutex_destroy(&p->beat_mu);
  pthread_cond_destroy(&p->beat_cv);
  close(p->wake[0]);
  close(p->wake[1]);
  free(p->out), free(p->in), free(p->sink), free(p->heard);
  free(p);
  net->p2p = NULL;
}

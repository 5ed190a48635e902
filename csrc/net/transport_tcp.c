/* transport_tcp.c — the TCP transport between nodes: one step (transport.h), over
 * the links of links.c.
 *
 * Every data message is a 16-byte header (kind, code, length) and its payload.  A
 * step sends and receives at once over non-blocking sockets with poll(), so a ring
 * step never deadlocks on full socket buffers; a reduce-on-receive folds the bytes
 * into the destination as they arrive, through a small bounce buffer.  ABORT
 * headers carry why a node stopped, so that every survivor returns the same code;
 * a socket that closes without one is a lost peer. */
#include "links.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../dtype.h"
#include "../error.h"
#include "../testing.h"
#include "p2p_net.h"

/* ---- one step ---------------------------------------------------------------------- */

typedef struct {
  int fd, node;
  int awaiting; /* the node is higher and has not linked yet: fd is -1 until it does */
  ruccl_shm_link_t *shm; /* NULL: the socket carries the data */
  msg_header_t hdr;
  size_t hdr_done;
  const char *buf;
  size_t len, done;
} out_state_t;

typedef struct {
  int fd, node;
  int awaiting;
  ruccl_shm_link_t *shm;
  msg_header_t hdr;
  size_t hdr_done;
  size_t len, done; /* payload bytes expected and consumed */
  size_t pend;      /* bounce bytes not yet reduced */
  const ruccl_xfer_t *x;
} in_state_t;

/* Whether a step still has bytes to move (header or payload) in that direction. */
static int out_pending(const out_state_t *o) { return o->fd >= 0 && (o->hdr_done < sizeof o->hdr || o->done < o->len); }
static int in_pending(const in_state_t *in) {
  return in->fd >= 0 && (in->hdr_done < sizeof in->hdr || in->done < in->len);
}

/* A connection broke: if the other node said why (an ABORT waiting to be read),
   that is the answer; else it is lost. */
static ruccl_result_t lost(const ruccl_net_t *net, int fd, int node, const char *what) {
  int saved = errno;
  /* This node's own reset or failure shut the sockets: that is the cause, not the
     connection. */
  ruccl_result_t mine = ruccl_net_session_state(net);
  /* The node may have said why on its control connection: its reader thread is a
     moment away from telling us. */
  if (mine == RUCCL_OK) {
    ruccl_p2p_net_await_notice(net, (unsigned)node, 200);
    mine = ruccl_net_session_state(net);
  }
  if (mine != RUCCL_OK) return mine;
  msg_header_t h;
  if (recv(fd, h.b, sizeof h.b, MSG_DONTWAIT | MSG_PEEK) == (ssize_t)sizeof h.b && msg_kind(&h) == MSG_ABORT) {
    uint32_t code = msg_code(&h);
    if (code != RUCCL_OK && code < RUCCL_NUM_RESULTS)
      return ruccl_fail((ruccl_result_t)code, "node %d stopped the session (%s)", node,
                        ruccl_error_string((ruccl_result_t)code));
  }
  return ruccl_fail(RUCCL_ERR_PEER_LOST, "node %u lost node %d while %s (%s)", net->me, node, what,
                    saved ? strerror(saved) : "connection closed");
}

/* A shared-memory ring whose counters cannot be right: nothing more is read from
   or written into it, and the session stops with PROTOCOL. */
static ruccl_result_t corrupt_ring(const ruccl_net_t *net, int node) {
  ruccl_result_t mine = ruccl_net_session_state(net);
  if (mine != RUCCL_OK) return mine;
  return ruccl_fail(RUCCL_ERR_PROTOCOL, "node %u: the shared-memory ring with node %d is corrupt (its counters are more than a ring apart)",
                    net->me, node);
}

static ruccl_result_t pump_out(ruccl_net_t *net, out_state_t *o) {
  while (o->hdr_done < sizeof o->hdr || o->done < o->len) {
    const char *p;
    size_t n;
    if (o->hdr_done < sizeof o->hdr) {
      p = (const char *)o->hdr.b + o->hdr_done;
      n = sizeof o->hdr - o->hdr_done;
    } else {
      p = o->buf + o->done;
      n = o->len - o->done;
    }
    ssize_t w;
    if (o->shm) {
      size_t m = ruccl_shm_write(o->shm, p, n);
      if (m == RUCCL_SHM_CORRUPT) return corrupt_ring(net, o->node);
      if (m == 0) return RUCCL_OK; /* ring full */
      w = (ssize_t)m;
    } else {
      w = send(o->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return RUCCL_OK;
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return lost(net, o->fd, o->node, "sending");
    if (o->hdr_done < sizeof o->hdr) o->hdr_done += (size_t)w;
    else o->done += (size_t)w;
  }
  return RUCCL_OK;
}

static ruccl_result_t header_arrived(ruccl_net_t *net, in_state_t *in) {
  uint32_t kind = msg_kind(&in->hdr);
  if (kind == MSG_ABORT) {
    /* This node's own reset or stop, if any, came first: the other's notice answers it */
    ruccl_result_t mine = ruccl_net_session_state(net);
    if (mine != RUCCL_OK) return mine;
    uint32_t code = msg_code(&in->hdr);
    if (code == RUCCL_OK || code >= RUCCL_NUM_RESULTS) code = RUCCL_ERR_PEER_LOST;
    return ruccl_fail((ruccl_result_t)code, "node %d stopped the session (%s)", in->node,
                      ruccl_error_string((ruccl_result_t)code));
  }
  uint64_t len = msg_len(&in->hdr);
  if (kind != (in->x->p2p ? MSG_P2P : MSG_DATA) || len != in->len)
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "node %u expected %zu bytes from node %d, got a message of kind %u, %llu bytes",
                      net->me, in->len, in->node, kind, (unsigned long long)len);
  return RUCCL_OK;
}

static void fold(ruccl_net_t *net, in_state_t *in, size_t elem) {
  const ruccl_xfer_t *x = in->x;
  size_t whole = in->pend / elem * elem;
  if (!whole) return;
  size_t at = in->done - in->pend; /* payload offset of the bounce's first byte */
  ruccl_reduce_kernel((char *)x->recv_buf + at, (const char *)x->reduce_local + at, net->bounce, whole / elem,
                      x->dtype, x->op, x->divisor);
  memmove(net->bounce, net->bounce + whole, in->pend - whole);
  in->pend -= whole;
}

static ruccl_result_t pump_in(ruccl_net_t *net, in_state_t *in) {
  const ruccl_xfer_t *x = in->x;
  size_t elem = x->reduce_local ? ruccl_dtype_size(x->dtype) : 1;
  for (;;) {
    char *p;
    size_t n;
    if (in->hdr_done < sizeof in->hdr) {
      p = (char *)in->hdr.b + in->hdr_done;
      n = sizeof in->hdr - in->hdr_done;
    } else if (in->done < in->len) {
      if (x->reduce_local && in->shm && in->pend == 0) {
        /* Shared memory: reduce straight out of the ring, no bounce copy, while
           whole, aligned elements lie contiguous there. */
        const void *ring;
        size_t m = ruccl_shm_peek(in->shm, &ring);
        if (m == RUCCL_SHM_CORRUPT) return corrupt_ring(net, in->node);
        if (m > in->len - in->done) m = in->len - in->done;
        size_t whole = m / elem * elem;
        if (whole && (uintptr_t)ring % elem == 0) {
          ruccl_reduce_kernel((char *)x->recv_buf + in->done, (const char *)x->reduce_local + in->done, ring,
                              whole / elem, x->dtype, x->op, x->divisor);
          ruccl_shm_consume(in->shm, whole);
          in->done += whole;
          continue;
        }
        if (!m) return RUCCL_OK; /* ring empty */
        /* an element split by the ring's end, or unaligned: through the bounce */
      }
      if (x->reduce_local) {
        p = (char *)net->bounce + in->pend;
        n = BOUNCE_BYTES - in->pend;
        if (n > in->len - in->done) n = in->len - in->done;
      } else {
        p = (char *)x->recv_buf + in->done;
        n = in->len - in->done;
      }
    } else {
      return RUCCL_OK;
    }
    ssize_t r;
    if (in->shm) {
      size_t m = ruccl_shm_read(in->shm, p, n);
      if (m == RUCCL_SHM_CORRUPT) return corrupt_ring(net, in->node);
      if (m == 0) return RUCCL_OK; /* ring empty */
      r = (ssize_t)m;
    } else {
      r = recv(in->fd, p, n, MSG_DONTWAIT);
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return RUCCL_OK;
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) errno = 0;
    if (r <= 0) return lost(net, in->fd, in->node, "receiving");
    if (in->hdr_done < sizeof in->hdr) {
      in->hdr_done += (size_t)r;
      if (in->hdr_done == sizeof in->hdr) {
        ruccl_result_t rc = header_arrived(net, in);
        if (rc != RUCCL_OK) return rc;
      }
      continue;
    }
    in->done += (size_t)r;
    if (x->reduce_local) {
      in->pend += (size_t)r;
      fold(net, in, elem);
    }
  }
}

ruccl_result_t ruccl_net_session_state(const ruccl_net_t *net) {
  if (net->cancel) {
    ruccl_result_t rc = ruccl_cancel_state(net->cancel);
    if (rc != RUCCL_OK) return rc;
  }
  int code = atomic_load(&net->abort_code); /* this node is stopping the session (the flag above follows) */
  if (code != RUCCL_OK && atomic_load(&net->aborted))
    return ruccl_fail((ruccl_result_t)code, "this node stopped the session (%s)", ruccl_error_string((ruccl_result_t)code));
  return RUCCL_OK;
}

/* What a readable control socket says: 1 when it is a PEER_FINISHED notice (the
   node ended its session cleanly), 0 for anything else (another ABORT, or a closed
   connection: the node is gone). */
static int says_finished(int fd) {
  msg_header_t h;
  return recv(fd, h.b, sizeof h.b, MSG_DONTWAIT | MSG_PEEK) == (ssize_t)sizeof h.b && msg_kind(&h) == MSG_ABORT &&
         msg_code(&h) == RUCCL_ERR_PEER_FINISHED;
}

/* A shared-memory link's socket carries no data: readable means an ABORT or a
   closed connection.  A node that finished wrote everything it will ever send into
   the ring before it said so on the socket, so a receive from it first takes what
   the ring holds and fails only if that is not enough; a send to it, or any other
   news, fails now. */
static ruccl_result_t check_shm_sockets(ruccl_net_t *net, out_state_t *o, int out_busy, in_state_t *in,
                                        int in_busy) {
  struct pollfd p[2];
  int np = 0, nodes[2];
  if (out_busy && o->shm) nodes[np] = o->node, p[np++] = (struct pollfd){.fd = o->fd, .events = POLLIN};
  if (in_busy && in->shm && !(np && o->fd == in->fd))
    nodes[np] = in->node, p[np++] = (struct pollfd){.fd = in->fd, .events = POLLIN};
  if (np == 0 || poll(p, (nfds_t)np, 0) <= 0) return RUCCL_OK;
  for (int i = 0; i < np; i++) {
    if (!p[i].revents) continue;
    errno = 0;
    int only_in = in_busy && in->shm && p[i].fd == in->fd && !(out_busy && o->shm && o->fd == p[i].fd);
    if (only_in && says_finished(p[i].fd)) {
      ruccl_result_t rc = pump_in(net, in); /* the ring holds all it will ever get */
      if (rc != RUCCL_OK) return rc;
      if (!in_pending(in)) continue;
    }
    return lost(net, p[i].fd, nodes[i], "waiting on shared memory");
  }
  return RUCCL_OK;
}

static ruccl_result_t xfer_loop(ruccl_net_t *net, out_state_t *op, in_state_t *inp, atomic_int *tx, int64_t deadline_ns,
                                ruccl_shm_link_t **sleepy);

/* Points one direction of a step at node k's link: made now when this node is the
   one to dial (k is lower), else awaited (the data port takes k's dial). */
static ruccl_result_t find_link(ruccl_net_t *net, unsigned k, int64_t deadline_ns, int *fd, int *awaiting,
                                ruccl_shm_link_t **shm) {
  *fd = link_fd(net, k);
  if (*fd < 0 && k < net->me) {
    ruccl_result_t rc = ruccl_net_dial_node(net, k, deadline_ns);
    if (rc != RUCCL_OK) return rc;
    *fd = link_fd(net, k);
    ruccl_log(2, "node %u: linked to node %u on first use", net->me, k);
  }
  *awaiting = *fd < 0;
  *shm = *fd >= 0 && net->shm[k].map ? &net->shm[k] : NULL;
  return RUCCL_OK;
}

/* The sender takes the socket from IDLE to MESSAGE for the message (*tx: held). */
static ruccl_result_t take_tx(ruccl_net_t *net, const out_state_t *o, atomic_int **tx) {
  *tx = NULL;
  if (o->fd < 0 || o->shm) return RUCCL_OK;
  int idle = TX_IDLE;
  if (!atomic_compare_exchange_strong(&net->tx[o->node], &idle, TX_MESSAGE)) {
    ruccl_result_t rc = ruccl_net_session_state(net);
    return rc != RUCCL_OK ? rc : ruccl_fail(RUCCL_ERR_PEER_LOST, "the node connections are closed");
  }
  *tx = &net->tx[o->node];
  return RUCCL_OK;
}

/* A higher node this step waits for has linked meanwhile: the step takes its link. */
static ruccl_result_t attach_awaited(ruccl_net_t *net, out_state_t *o, in_state_t *in, atomic_int **tx) {
  ruccl_result_t rc = RUCCL_OK;
  if (o->awaiting && link_fd(net, (unsigned)o->node) >= 0) {
    int unused;
    find_link(net, (unsigned)o->node, 0, &o->fd, &unused, &o->shm);
    o->awaiting = 0;
    rc = take_tx(net, o, tx);
  }
  if (in->awaiting && link_fd(net, (unsigned)in->node) >= 0) {
    int unused;
    find_link(net, (unsigned)in->node, 0, &in->fd, &unused, &in->shm);
    in->awaiting = 0;
  }
  return rc;
}

static ruccl_result_t net_xfer(void *endpoint, const ruccl_xfer_t *x, int64_t deadline_ns) {
  ruccl_net_t *net = endpoint;
  out_state_t o = {.fd = -1};
  in_state_t in = {.fd = -1};
  if (atomic_load(&net->aborted)) {
    ruccl_result_t rc = ruccl_net_session_state(net);
    return rc != RUCCL_OK ? rc : ruccl_fail(RUCCL_ERR_PEER_LOST, "the node connections are closed");
  }
  ruccl_result_t rc = RUCCL_OK;
  /* Dial before waiting: a node waits only for higher ones, which dial first. */
  if (x->recv_peer != RUCCL_NO_PEER) {
    in.node = x->recv_peer;
    in.len = x->recv_bytes;
    in.x = x;
    rc = find_link(net, (unsigned)in.node, deadline_ns, &in.fd, &in.awaiting, &in.shm);
  }
  if (rc == RUCCL_OK && x->send_peer != RUCCL_NO_PEER) {
    o.node = x->send_peer;
    o.buf = x->send_buf;
    o.len = x->send_bytes;
    o.hdr = msg_header(x->p2p ? MSG_P2P : MSG_DATA, 0, x->send_bytes);
    rc = find_link(net, (unsigned)o.node, deadline_ns, &o.fd, &o.awaiting, &o.shm);
  }
  atomic_int *tx = NULL; /* held while the message is partly sent */
  if (rc == RUCCL_OK) rc = take_tx(net, &o, &tx);
  if (rc != RUCCL_OK) return rc;
  ruccl_shm_link_t *sleepy = NULL; /* the link this thread declared it may sleep on */
  rc = xfer_loop(net, &o, &in, tx, deadline_ns, &sleepy);
  if (sleepy) ruccl_shm_sleepy(sleepy, -1);
  return rc;
}

/* Moves the message(s) of net_xfer until done, failed or past the deadline. */
static ruccl_result_t xfer_loop(ruccl_net_t *net, out_state_t *op, in_state_t *inp, atomic_int *tx, int64_t deadline_ns,
                                ruccl_shm_link_t **sleepy) {
  out_state_t o = *op;
  in_state_t in = *inp;
  int64_t sleepy_since = 0;
  int64_t idle_since = 0;
  int slept = 0;
  for (unsigned spins = 0;; spins++) {
    size_t before = o.hdr_done + o.done + in.hdr_done + in.done;
    ruccl_result_t rc = RUCCL_OK;
    if (o.awaiting || in.awaiting) rc = attach_awaited(net, &o, &in, &tx);
    if (rc != RUCCL_OK) return rc;
    if (out_pending(&o)) rc = pump_out(net, &o);
    if (tx && rc == RUCCL_OK && !out_pending(&o)) { /* all of it is the kernel's: a boundary again */
      int mid = TX_MESSAGE;
      atomic_compare_exchange_strong(tx, &mid, TX_IDLE);
      tx = NULL;
    }
    if (spins == 0 && in.fd >= 0 && ruccl_testing_pause() && rc == RUCCL_OK) {
      /* a test lags here, then looks at its peers before at what arrived */
      rc = ruccl_net_session_state(net);
      if (rc == RUCCL_OK) rc = check_shm_sockets(net, &o, out_pending(&o), &in, 1);
    }
    if (rc == RUCCL_OK && in_pending(&in)) rc = pump_in(net, &in);
    if (rc != RUCCL_OK) return rc;
    int out_busy = o.awaiting || out_pending(&o);
    int in_busy = in.awaiting || in_pending(&in);
    if (!out_busy && !in_busy) return RUCCL_OK;
    int progress = o.hdr_done + o.done + in.hdr_done + in.done != before;
    int64_t now = 0;
    if ((spins & 255) == 0 || !progress) {
      now = ruccl_now_ns();
      if (now >= deadline_ns)
        return ruccl_fail(RUCCL_ERR_TIMEOUT, "node %u timed out waiting for node %d: %s within the timeout of %lld ms",
                          net->me, in_busy ? in.node : o.node,
                          (in_busy ? in.awaiting : o.awaiting) ? "it did not connect" : "no answer",
                          (long long)net->timeout_ms);
      rc = ruccl_net_session_state(net);
      if (rc == RUCCL_OK && ((spins & 255) == 0 || slept)) rc = check_shm_sockets(net, &o, out_busy, &in, in_busy);
      slept = 0;
      if (rc != RUCCL_OK) return rc;
    }
    if (progress) {
      idle_since = 0;
      if (*sleepy) ruccl_shm_sleepy(*sleepy, -1), *sleepy = NULL;
      continue;
    }
    /* Spin briefly before sleeping: waking a sleeping process costs tens of
       microseconds here.  Shared memory then yields the core; sockets poll. */
    if (!idle_since) idle_since = now;
    int spinning = now - idle_since < net->spin_ns;
    if ((out_busy && o.shm) || (in_busy && in.shm)) {
      if (spinning) {
        ruccl_cpu_relax();
        continue;
      }
      /* Then yield, declared sleepy on the link's doorbell (the one received from,
         else sent to), and after a while sleep on it; with another link or a
         socket busy too, woken every millisecond to look at that.  The control
         sockets are looked at after every sleep. */
      if (!*sleepy) {
        *sleepy = in_busy && in.shm ? in.shm : o.shm;
        ruccl_shm_sleepy(*sleepy, 1);
        sleepy_since = now;
      }
      if (now - sleepy_since < net->sleepy_ns) {
        sched_yield();
        continue;
      }
      int want_read = in_busy && in.shm == *sleepy, want_write = out_busy && o.shm == *sleepy;
      int other = (out_busy && o.shm != *sleepy) || (in_busy && in.shm != *sleepy);
      int64_t until = now + (other ? 1000000 : SHM_SLEEP_NS);
      ruccl_shm_wait(*sleepy, want_read, want_write, until < deadline_ns ? until : deadline_ns);
      slept = 1;
      continue;
    }
    if (spinning) continue;
    struct pollfd p[2];
    int np = 0;
    if (out_busy && !o.awaiting) p[np++] = (struct pollfd){.fd = o.fd, .events = POLLOUT};
    if (in_busy && !in.awaiting) {
      if (np && p[0].fd == in.fd) p[0].events |= POLLIN;
      else p[np++] = (struct pollfd){.fd = in.fd, .events = POLLIN};
    }
    int64_t left_ms = (deadline_ns - now) / 1000000 + 1;
    int slice = o.awaiting || in.awaiting ? 1 : POLL_SLICE_MS; /* a link appears without a wake-up */
    int r = poll(p, (nfds_t)np, left_ms < slice ? (int)left_ms : slice);
    if (r < 0 && errno != EINTR) return ruccl_fail(RUCCL_ERR_IO, "poll: %s", strerror(errno));
  }
}

static ruccl_result_t net_connect_op(void *endpoint, int64_t deadline_ns) {
  return ruccl_net_connect_all(endpoint, deadline_ns);
}
static void net_abort_op(void *endpoint, ruccl_result_t code) { ruccl_net_abort(endpoint, code); }
static void net_close_op(void *endpoint, int finished) { ruccl_net_close(endpoint, finished); }

const ruccl_transport_ops_t ruccl_tcp_ops = {
    .name = "tcp",
    .connect = net_connect_op,
    .xfer = net_xfer,
    .abort = net_abort_op,
    .close = net_close_op,
};

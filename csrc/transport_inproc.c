/* transport_inproc.c — the in-process transport.
 *
 * Each directed pair has a one-message mailbox.  The sender publishes a pointer to
 * its own buffer (POSTED); the receiver claims it (READING), copies or reduces
 * straight out of it into its destination, and releases it (DONE); the sender then
 * empties the mailbox and may reuse the buffer.  A sender that gives up (timeout,
 * reset, a broken session) retracts a message nobody has claimed, and waits out one
 * that is being read, so that no thread ever reads a buffer whose owner has left.
 *
 * Waits spin briefly (waking a sleeping thread costs tens of microseconds) and then
 * sleep on a condition variable; every wait re-checks the session's state, the peer
 * it waits for, and the deadline. */
#include "transport_inproc.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtype.h"
#include "error.h"
#include "testing.h"

enum { INPROC_EMPTY, INPROC_POSTED, INPROC_READING, INPROC_DONE };

#define SLEEP_SLICE_NS 20000000 /* sleepers re-check state at least this often */

int ruccl_inproc_init(ruccl_inproc_t *t, unsigned n) {
  memset(t, 0, sizeof *t);
  t->n = n;
  t->channels = calloc((size_t)n * n, sizeof *t->channels);
  if (!t->channels) return -1;
  for (size_t i = 0; i < (size_t)n * n; i++) atomic_init(&t->channels[i].state, INPROC_EMPTY);
  ruccl_cond_init_monotonic(&t->cv);
  pthread_mutex_init(&t->mu, NULL);
  atomic_init(&t->sleepers, 0);
  return 0;
}

void ruccl_inproc_destroy(ruccl_inproc_t *t) {
  free(t->channels);
  t->channels = NULL;
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
}

void ruccl_inproc_wake(ruccl_inproc_t *t) {
  /* Pairs with the sleeper's increment-then-recheck: either the sleeper sees the new
     state, or we see the sleeper and wake it. */
  if (atomic_load(&t->sleepers) > 0) {
    pthread_mutex_lock(&t->mu);
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
  }
}

static int64_t timeout_of(const ruccl_inproc_port_t *p) { return __atomic_load_n(p->timeout_ms, __ATOMIC_RELAXED); }

static ruccl_result_t blocking_reason(const ruccl_inproc_port_t *p, unsigned peer, int64_t deadline_ns) {
  ruccl_result_t rc = ruccl_cancel_state(p->cancel);
  if (rc != RUCCL_OK) return rc;
  if (atomic_load(&p->finished[peer]))
    return ruccl_fail(RUCCL_ERR_PEER_FINISHED, "peer %u is waiting for peer %u, which has finished its session",
                      p->names[p->index], p->names[peer]);
  if (ruccl_now_ns() >= deadline_ns)
    return ruccl_fail(RUCCL_ERR_TIMEOUT, "peer %u timed out waiting for peer %u: no answer within the timeout of %lld ms",
                      p->names[p->index], p->names[peer], (long long)timeout_of(p));
  return RUCCL_OK;
}

/* Waits until ch->state == want, or returns why it cannot. */
static ruccl_result_t wait_state(const ruccl_inproc_port_t *p, ruccl_inproc_channel_t *ch, int want, unsigned peer,
                                 int64_t deadline_ns) {
  if (atomic_load(&ch->state) == want) return RUCCL_OK;
  int64_t spin_until = ruccl_now_ns() + RUCCL_SPIN_NS;
  for (unsigned i = 1;; i++) {
    if (atomic_load(&ch->state) == want) return RUCCL_OK;
    ruccl_cpu_relax();
    if ((i & 127) == 0) {
      if (ruccl_now_ns() >= spin_until) break;
      sched_yield();
    }
  }
  ruccl_inproc_t *t = p->t;
  for (;;) {
    if (atomic_load(&ch->state) == want) return RUCCL_OK;
    ruccl_result_t rc = blocking_reason(p, peer, deadline_ns);
    /* The peer may have delivered and then finished between our two loads: its
       delivery is stored before its finish, so a second look is conclusive. */
    if (rc != RUCCL_OK) return atomic_load(&ch->state) == want ? RUCCL_OK : rc;
    int64_t wake = ruccl_now_ns() + SLEEP_SLICE_NS;
    if (wake > deadline_ns) wake = deadline_ns;
    struct timespec ts = {.tv_sec = wake / 1000000000, .tv_nsec = wake % 1000000000};
    pthread_mutex_lock(&t->mu);
    atomic_fetch_add(&t->sleepers, 1);
    if (atomic_load(&ch->state) != want && !atomic_load(p->cancel->reset) && !atomic_load(p->cancel->broken) &&
        !atomic_load(&p->finished[peer])) {
      ruccl_testing_blocking(1);
      pthread_cond_timedwait(&t->cv, &t->mu, &ts);
      ruccl_testing_blocking(-1);
    }
    atomic_fetch_sub(&t->sleepers, 1);
    pthread_mutex_unlock(&t->mu);
  }
}

static void retract(ruccl_inproc_t *t, ruccl_inproc_channel_t *ch) {
  int expected = INPROC_POSTED;
  if (atomic_compare_exchange_strong(&ch->state, &expected, INPROC_EMPTY)) return;
  /* The receiver holds it (READING, a bounded copy) or has released it (DONE). */
  for (unsigned i = 1; atomic_load(&ch->state) == INPROC_READING; i++) {
    ruccl_cpu_relax();
    if ((i & 127) == 0) sched_yield(); /* the reader may be preempted on a busy machine */
  }
  atomic_store(&ch->state, INPROC_EMPTY);
  ruccl_inproc_wake(t);
}

static ruccl_result_t receive(const ruccl_inproc_port_t *p, const ruccl_xfer_t *x, unsigned from, int64_t deadline_ns) {
  ruccl_inproc_t *t = p->t;
  ruccl_inproc_channel_t *ch = &t->channels[(size_t)from * t->n + p->index];
  ruccl_testing_pause();
  for (;;) {
    ruccl_result_t rc = wait_state(p, ch, INPROC_POSTED, from, deadline_ns);
    if (rc != RUCCL_OK) return rc;
    int expected = INPROC_POSTED;
    if (atomic_compare_exchange_strong(&ch->state, &expected, INPROC_READING)) break;
    /* the sender retracted between our load and our claim: wait again */
  }
  ruccl_result_t rc = RUCCL_OK;
  if (ch->p2p != x->p2p) {
    rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "peer %u expected a %s message from peer %u, got a %s one", p->names[p->index],
                    x->p2p ? "point-to-point" : "collective", p->names[from],
                    ch->p2p ? "point-to-point" : "collective");
  } else if (ch->bytes != x->recv_bytes) {
    rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "peer %u expected %zu bytes from peer %u, got %zu", p->names[p->index],
                    x->recv_bytes, p->names[from], ch->bytes);
  } else if (x->recv_bytes) {
    if (x->reduce_local) {
      size_t count = x->recv_bytes / ruccl_dtype_size(x->dtype);
      ruccl_reduce_kernel(x->recv_buf, x->reduce_local, ch->ptr, count, x->dtype, x->op, x->divisor);
    } else {
      memcpy(x->recv_buf, ch->ptr, x->recv_bytes);
    }
  }
  atomic_store(&ch->state, INPROC_DONE);
  ruccl_inproc_wake(t);
  return rc;
}

static ruccl_result_t inproc_xfer(void *endpoint, const ruccl_xfer_t *x, int64_t deadline_ns) {
  const ruccl_inproc_port_t *p = endpoint;
  ruccl_inproc_t *t = p->t;
  ruccl_inproc_channel_t *out = NULL;
  if (x->send_peer != RUCCL_NO_PEER) {
    out = &t->channels[(size_t)p->index * t->n + (unsigned)x->send_peer];
    out->ptr = x->send_buf;
    out->bytes = x->send_bytes;
    out->p2p = x->p2p;
    atomic_store(&out->state, INPROC_POSTED);
    ruccl_inproc_wake(t);
  }
  ruccl_result_t rc = RUCCL_OK;
  if (x->recv_peer != RUCCL_NO_PEER) rc = receive(p, x, (unsigned)x->recv_peer, deadline_ns);
  if (out) {
    if (rc == RUCCL_OK) rc = wait_state(p, out, INPROC_DONE, (unsigned)x->send_peer, deadline_ns);
    if (rc == RUCCL_OK) {
      atomic_store(&out->state, INPROC_EMPTY);
    } else {
      retract(t, out);
    }
  }
  return rc;
}

/* The cancel state already says why: the sleepers only need to look. */
static void inproc_abort(void *endpoint, ruccl_result_t code) {
  (void)code;
  ruccl_inproc_wake(((const ruccl_inproc_port_t *)endpoint)->t);
}

/* The peers of a process share its memory: nothing to connect, nothing to close
   (the registry owns the transport's state and frees it with the group). */
static ruccl_result_t inproc_connect(void *endpoint, int64_t deadline_ns) {
  (void)endpoint, (void)deadline_ns;
  return RUCCL_OK;
}
static void inproc_close(void *endpoint, int finished) { (void)endpoint, (void)finished; }

const ruccl_transport_ops_t ruccl_inproc_ops = {
    .name = "inproc",
    .connect = inproc_connect,
    .xfer = inproc_xfer,
    .abort = inproc_abort,
    .close = inproc_close,
};

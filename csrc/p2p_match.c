/* p2p_match.c — point-to-point matching (see p2p_match.h). */
#include "p2p_match.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "testing.h"
#include "transport.h"

#define WAIT_SLICE_NS 20000000 /* waiters re-check the session at least this often */

struct ruccl_unexpected {
  uint32_t src;
  int32_t tag;
  size_t bytes;
  char *data;
  int whole;              /* every byte has arrived */
  ruccl_p2p_recv_t *taker; /* a receive matched it while it was still arriving */
  struct ruccl_unexpected *next;
};

int ruccl_mailbox_init(ruccl_mailbox_t *mb) {
  memset(mb, 0, sizeof *mb);
  if (ruccl_cond_init_monotonic(&mb->cv) != 0) return -1;
  if (pthread_mutex_init(&mb->mu, NULL) != 0) {
    pthread_cond_destroy(&mb->cv);
    return -1;
  }
  return 0;
}

static void free_unexpected(ruccl_mailbox_t *mb) {
  for (ruccl_unexpected_t *m = mb->unexpected, *next; m; m = next) {
    next = m->next;
    free(m->data);
    free(m);
  }
  mb->unexpected = mb->unexpected_tail = NULL;
  mb->unexpected_bytes = 0;
}

void ruccl_mailbox_destroy(ruccl_mailbox_t *mb) {
  free_unexpected(mb);
  pthread_mutex_destroy(&mb->mu);
  pthread_cond_destroy(&mb->cv);
}

static int matches(uint32_t want_src, int32_t want_tag, uint32_t src, int32_t tag) {
  return (want_src == RUCCL_P2P_ANY || want_src == src) && want_tag == tag;
}

/* Lock held. */
static void complete(ruccl_mailbox_t *mb, ruccl_p2p_recv_t *r, ruccl_result_t code, uint32_t source, const char *why) {
  r->result = code;
  r->source = source;
  r->on = NULL;
  r->cancel = 0;
  snprintf(r->why, sizeof r->why, "%s", why ? why : "");
  r->state = RUCCL_RECV_DONE;
  pthread_cond_broadcast(&mb->cv);
}

/* Lock held: fills r from a whole message (the message is consumed either way). */
static void take(ruccl_mailbox_t *mb, ruccl_p2p_recv_t *r, uint32_t src, const void *data, size_t bytes) {
  if (bytes != r->bytes) {
    char why[160];
    snprintf(why, sizeof why, "a message of %zu bytes (tag %d) met a receive of %zu bytes", bytes, (int)r->tag,
             r->bytes);
    complete(mb, r, RUCCL_ERR_PROTOCOL, src, why);
    return;
  }
  if (bytes) memcpy(r->buf, data, bytes);
  complete(mb, r, RUCCL_OK, src, NULL);
}

static void unlink_posted(ruccl_mailbox_t *mb, ruccl_p2p_recv_t *r) {
  ruccl_p2p_recv_t *prev = NULL;
  for (ruccl_p2p_recv_t *p = mb->posted; p; prev = p, p = p->next) {
    if (p != r) continue;
    if (prev) prev->next = p->next;
    else mb->posted = p->next;
    if (mb->posted_tail == p) mb->posted_tail = prev;
    p->next = NULL;
    return;
  }
}

static void unlink_unexpected(ruccl_mailbox_t *mb, ruccl_unexpected_t *m) {
  ruccl_unexpected_t *prev = NULL;
  for (ruccl_unexpected_t *p = mb->unexpected; p; prev = p, p = p->next) {
    if (p != m) continue;
    if (prev) prev->next = p->next;
    else mb->unexpected = p->next;
    if (mb->unexpected_tail == p) mb->unexpected_tail = prev;
    mb->unexpected_bytes -= m->bytes;
    return;
  }
}

static ruccl_p2p_recv_t *first_posted(ruccl_mailbox_t *mb, uint32_t src, int32_t tag) {
  for (ruccl_p2p_recv_t *r = mb->posted; r; r = r->next)
    if (matches(r->src, r->tag, src, tag)) return r;
  return NULL;
}

static ruccl_unexpected_t *new_unexpected(uint32_t src, int32_t tag, size_t bytes) {
  ruccl_unexpected_t *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->data = malloc(bytes ? bytes : 1);
  if (!m->data) {
    free(m);
    return NULL;
  }
  m->src = src, m->tag = tag, m->bytes = bytes;
  return m;
}

static void append_unexpected(ruccl_mailbox_t *mb, ruccl_unexpected_t *m) {
  if (mb->unexpected_tail) mb->unexpected_tail->next = m;
  else mb->unexpected = m;
  mb->unexpected_tail = m;
  mb->unexpected_bytes += m->bytes;
}

void ruccl_mailbox_close(ruccl_mailbox_t *mb, ruccl_result_t code, const char *why) {
  pthread_mutex_lock(&mb->mu);
  mb->closed = 1;
  for (ruccl_p2p_recv_t *r = mb->posted, *next; r; r = next) {
    next = r->next;
    r->next = NULL;
    complete(mb, r, code, 0, why);
  }
  mb->posted = mb->posted_tail = NULL;
  for (ruccl_unexpected_t *m = mb->unexpected; m; m = m->next)
    if (m->taker) complete(mb, m->taker, code, 0, why), m->taker = NULL;
  /* Messages still arriving belong to the network's thread until it ends them. */
  ruccl_unexpected_t **p = &mb->unexpected;
  mb->unexpected_tail = NULL;
  while (*p) {
    ruccl_unexpected_t *m = *p;
    if (m->whole) {
      *p = m->next;
      mb->unexpected_bytes -= m->bytes;
      free(m->data);
      free(m);
    } else {
      mb->unexpected_tail = m;
      p = &m->next;
    }
  }
  pthread_mutex_unlock(&mb->mu);
}

void ruccl_mailbox_wake(ruccl_mailbox_t *mb) {
  pthread_mutex_lock(&mb->mu);
  pthread_cond_broadcast(&mb->cv);
  pthread_mutex_unlock(&mb->mu);
}

void ruccl_mailbox_post(ruccl_mailbox_t *mb, ruccl_p2p_recv_t *r) {
  pthread_mutex_lock(&mb->mu);
  r->next = NULL;
  r->on = NULL;
  r->cancel = 0;
  if (mb->closed) {
    complete(mb, r, RUCCL_ERR_NOT_REGISTERED, 0, "this peer finished its session");
    pthread_mutex_unlock(&mb->mu);
    return;
  }
  for (ruccl_unexpected_t *m = mb->unexpected; m; m = m->next) {
    if (m->taker || !matches(r->src, r->tag, m->src, m->tag)) continue;
    if (m->whole) {
      unlink_unexpected(mb, m);
      take(mb, r, m->src, m->data, m->bytes);
      free(m->data);
      free(m);
    } else { /* still arriving: it is ours once whole */
      m->taker = r;
      r->on = m;
      r->state = RUCCL_RECV_POSTED;
    }
    pthread_mutex_unlock(&mb->mu);
    return;
  }
  r->state = RUCCL_RECV_POSTED;
  if (mb->posted_tail) mb->posted_tail->next = r;
  else mb->posted = r;
  mb->posted_tail = r;
  pthread_mutex_unlock(&mb->mu);
}

ruccl_result_t ruccl_mailbox_deliver(ruccl_mailbox_t *mb, uint32_t src, int32_t tag, const void *buf, size_t bytes) {
  pthread_mutex_lock(&mb->mu);
  if (mb->closed) {
    pthread_mutex_unlock(&mb->mu);
    return RUCCL_ERR_PEER_FINISHED;
  }
  /* A message of this sender and tag may still be arriving ahead of this one only
     over the network, which a thread of this process never is. */
  ruccl_p2p_recv_t *r = first_posted(mb, src, tag);
  if (r) {
    unlink_posted(mb, r);
    take(mb, r, src, buf, bytes);
    pthread_mutex_unlock(&mb->mu);
    return RUCCL_OK;
  }
  ruccl_unexpected_t *m = new_unexpected(src, tag, bytes);
  if (!m) {
    pthread_mutex_unlock(&mb->mu);
    return RUCCL_ERR_NO_MEMORY;
  }
  if (bytes) memcpy(m->data, buf, bytes);
  m->whole = 1;
  append_unexpected(mb, m);
  pthread_mutex_unlock(&mb->mu);
  return RUCCL_OK;
}

/* Lock held: r is not DONE; after this nothing writes into its buffer. */
static void withdraw(ruccl_mailbox_t *mb, ruccl_p2p_recv_t *r) {
  if (r->state == RUCCL_RECV_POSTED) {
    if (r->on) {
      r->on->taker = NULL; /* the message waits for the next receive */
      r->on = NULL;
    } else {
      unlink_posted(mb, r);
    }
    return;
  }
  if (r->state == RUCCL_RECV_CLAIMED) { /* the network writes into buf: it lets go at its next read */
    r->cancel = 1;
    while (r->state == RUCCL_RECV_CLAIMED) pthread_cond_wait(&mb->cv, &mb->mu);
  }
}

void ruccl_mailbox_cancel(ruccl_mailbox_t *mb, ruccl_p2p_recv_t *r, ruccl_result_t code, const char *why) {
  pthread_mutex_lock(&mb->mu);
  if (r->state != RUCCL_RECV_DONE && r->state != RUCCL_RECV_IDLE) {
    withdraw(mb, r);
    if (r->state != RUCCL_RECV_DONE) complete(mb, r, code, 0, why);
  }
  pthread_mutex_unlock(&mb->mu);
}

long ruccl_mailbox_wait_any(ruccl_mailbox_t *mb, ruccl_p2p_recv_t *const *rs, const int64_t *deadlines, size_t n,
                            int64_t wait_until, ruccl_p2p_status_fn status, void *ctx) {
  pthread_mutex_lock(&mb->mu);
  for (;;) {
    int64_t now = ruccl_now_ns();
    int64_t next = wait_until;
    for (size_t i = 0; i < n; i++) {
      ruccl_p2p_recv_t *r = rs[i];
      if (!r) continue;
      if (r->state != RUCCL_RECV_DONE && now >= deadlines[i]) {
        withdraw(mb, r);
        if (r->state != RUCCL_RECV_DONE)
          complete(mb, r, RUCCL_ERR_TIMEOUT, 0, "no matching message arrived within the timeout");
      }
      if (r->state == RUCCL_RECV_DONE) {
        pthread_mutex_unlock(&mb->mu);
        return (long)i;
      }
      if (deadlines[i] < next) next = deadlines[i];
    }
    ruccl_result_t rc = status ? status(ctx) : RUCCL_OK;
    if (rc != RUCCL_OK) {
      const char *why = ruccl_last_error();
      long first = -1;
      for (size_t i = 0; i < n; i++) {
        if (!rs[i]) continue;
        withdraw(mb, rs[i]);
        if (rs[i]->state != RUCCL_RECV_DONE) complete(mb, rs[i], rc, 0, why);
        if (first < 0) first = (long)i;
      }
      pthread_mutex_unlock(&mb->mu);
      return first;
    }
    if (now >= wait_until) {
      pthread_mutex_unlock(&mb->mu);
      return -1;
    }
    int64_t wake = now + WAIT_SLICE_NS;
    if (wake > next) wake = next;
    struct timespec ts = {.tv_sec = wake / 1000000000, .tv_nsec = wake % 1000000000};
    ruccl_testing_blocking(1);
    pthread_cond_timedwait(&mb->cv, &mb->mu, &ts);
    ruccl_testing_blocking(-1);
  }
}

void ruccl_mailbox_fail_sources(ruccl_mailbox_t *mb, const uint32_t *srcs, size_t n, ruccl_result_t code,
                                const char *why) {
  pthread_mutex_lock(&mb->mu);
  for (ruccl_p2p_recv_t *r = mb->posted, *next; r; r = next) {
    next = r->next;
    for (size_t i = 0; i < n; i++) {
      if (r->src != srcs[i]) continue;
      unlink_posted(mb, r);
      complete(mb, r, code, 0, why);
      break;
    }
  }
  pthread_mutex_unlock(&mb->mu);
}

/* ---- arrivals over the network -------------------------------------------------- */

int ruccl_arrival_may_begin(ruccl_mailbox_t *mb, uint32_t src, int32_t tag, size_t bytes, size_t cap) {
  pthread_mutex_lock(&mb->mu);
  int may = mb->closed || first_posted(mb, src, tag) || mb->unexpected_bytes == 0 ||
            (mb->unexpected_bytes <= cap && bytes <= cap - mb->unexpected_bytes);
  pthread_mutex_unlock(&mb->mu);
  return may;
}

void ruccl_arrival_begin(ruccl_mailbox_t *mb, uint32_t src, int32_t tag, size_t bytes, ruccl_arrival_t *a) {
  *a = (ruccl_arrival_t){.mb = mb, .src = src, .tag = tag, .bytes = bytes};
  pthread_mutex_lock(&mb->mu);
  if (mb->closed) {
    pthread_mutex_unlock(&mb->mu);
    return;
  }
  ruccl_p2p_recv_t *r = first_posted(mb, src, tag);
  if (r) {
    unlink_posted(mb, r);
    if (r->bytes == bytes) {
      r->state = RUCCL_RECV_CLAIMED;
      a->recv = r;
    } else {
      take(mb, r, src, NULL, bytes); /* the size error; the bytes are dropped */
    }
    pthread_mutex_unlock(&mb->mu);
    return;
  }
  a->msg = new_unexpected(src, tag, bytes);
  if (a->msg) append_unexpected(mb, a->msg);
  else ruccl_log(1, "dropped a point-to-point message of %zu bytes from peer index %u: out of memory", bytes, src);
  pthread_mutex_unlock(&mb->mu);
}

/* Lock held: a->recv's owner gave up after `done` bytes landed in its buffer; they
   move to a buffer of the mailbox's, ahead of anything that came later from this
   sender, and the message waits for another receive. */
static void let_go(ruccl_arrival_t *a, size_t done) {
  ruccl_p2p_recv_t *r = a->recv;
  ruccl_unexpected_t *m = new_unexpected(a->src, a->tag, a->bytes);
  if (m) {
    if (done) memcpy(m->data, r->buf, done);
    m->next = a->mb->unexpected;
    a->mb->unexpected = m;
    if (!a->mb->unexpected_tail) a->mb->unexpected_tail = m;
    a->mb->unexpected_bytes += m->bytes;
  }
  a->msg = m;
  a->recv = NULL;
  r->state = RUCCL_RECV_POSTED; /* withdraw() completes it */
  r->cancel = 0;
  pthread_cond_broadcast(&a->mb->cv);
}

char *ruccl_arrival_target(ruccl_arrival_t *a, size_t done) {
  if (a->recv) {
    pthread_mutex_lock(&a->mb->mu);
    if (a->recv->cancel) let_go(a, done);
    pthread_mutex_unlock(&a->mb->mu);
    if (a->recv) return (char *)a->recv->buf + done;
  }
  return a->msg ? a->msg->data + done : NULL;
}

void ruccl_arrival_end(ruccl_arrival_t *a, ruccl_result_t code, const char *why) {
  ruccl_mailbox_t *mb = a->mb;
  pthread_mutex_lock(&mb->mu);
  if (a->recv && a->recv->cancel && code == RUCCL_OK) let_go(a, a->bytes); /* whole, but no longer wanted */
  if (a->recv) {
    ruccl_p2p_recv_t *r = a->recv;
    if (r->cancel) r->state = RUCCL_RECV_POSTED; /* let withdraw() finish it */
    else complete(mb, r, code, a->src, code == RUCCL_OK ? NULL : why);
    pthread_cond_broadcast(&mb->cv);
  } else if (a->msg) {
    ruccl_unexpected_t *m = a->msg;
    ruccl_p2p_recv_t *taker = m->taker;
    if (code == RUCCL_OK && !mb->closed) {
      m->whole = 1;
      if (taker) {
        unlink_unexpected(mb, m);
        take(mb, taker, m->src, m->data, m->bytes);
        free(m->data);
        free(m);
      }
    } else {
      unlink_unexpected(mb, m);
      if (taker) complete(mb, taker, code == RUCCL_OK ? RUCCL_ERR_NOT_REGISTERED : code, 0, why);
      free(m->data);
      free(m);
    }
  }
  a->recv = NULL;
  a->msg = NULL;
  pthread_mutex_unlock(&mb->mu);
}

/* agree_net.c — the nodes' fault-tolerant agreement (agree_net.h). */
#include "agree_net.h"

#include <openssl/crypto.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../error.h"
#include "../le.h"
#include "../testing.h"
#include "wire.h"

enum { STATE_CONTRIBUTION = 1, STATE_DECISION = 2, STATE_NOT_YET = 3, STATE_MISMATCH = 4 };
#define HELLO_BYTES 20             /* round u64, the round's set digest u64, flags u32 */
#define HELLO_PULL 1u              /* flags: only asking whether it decided */
#define WAIT_SLICE_NS 20000000LL   /* a waiting node looks at its coordinator this often at most */
#define PULL_FIRST_NS 100000000LL  /* and pulls from it this often for the first second, */
#define PULL_LATER_NS 250000000LL  /* then this often */
#define ANSWER_NS 10000000000LL    /* sending one answer */
#define ACK_NS 2000000000LL        /* a node's acknowledgement of a decision */
#define PULL_NS 2000000000LL       /* a pull's answer (given at once: longer is silence) */

const unsigned char ruccl_agree_mismatch[1];

struct ruccl_agree_net {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stopping;
  uint64_t round; /* the round this node is in (or was last in) */
  uint64_t digest; /* that round's set of nodes taking part */
  unsigned char *mine;
  uint32_t mine_len;
  uint64_t decided; /* the last round decided here */
  unsigned char *decision;
  uint32_t decision_len;
  uint64_t abandoned;    /* a round this node gave up (its timeout): it answers nothing of it */
  uint64_t broke_round;  /* the round whose asking coordinators broke off: */
  unsigned char *broke;  /* by node */
};

ruccl_result_t ruccl_agree_net_init(ruccl_net_t *net) {
  struct ruccl_agree_net *a = calloc(1, sizeof *a);
  if (a) a->broke = calloc(net->num_nodes, 1);
  if (!a || !a->broke) {
    free(a);
    return ruccl_fail(RUCCL_ERR_NO_MEMORY, "agreement state");
  }
  pthread_mutex_init(&a->mu, NULL);
  ruccl_cond_init_monotonic(&a->cv);
  net->agree = a;
  return RUCCL_OK;
}

void ruccl_agree_net_stop(ruccl_net_t *net) {
  struct ruccl_agree_net *a = net->agree;
  if (!a) return;
  pthread_mutex_lock(&a->mu);
  a->stopping = 1;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
}

void ruccl_agree_net_close(ruccl_net_t *net) {
  struct ruccl_agree_net *a = net->agree;
  if (!a) return;
  net->agree = NULL;
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cv);
  free(a->mine);
  free(a->decision);
  free(a->broke);
  free(a);
}

static void timed_wait(struct ruccl_agree_net *a, int64_t until_ns) {
  struct timespec ts = {.tv_sec = until_ns / 1000000000, .tv_nsec = until_ns % 1000000000};
  pthread_cond_timedwait(&a->cv, &a->mu, &ts);
}

/* Mutex held: keeps the decision of round r (the first one heard wins). */
static void keep_decision(struct ruccl_agree_net *a, uint64_t r, const unsigned char *d, uint32_t len) {
  if (a->decided >= r) return;
  unsigned char *copy = malloc(len ? len : 1);
  if (!copy) return;
  memcpy(copy, d, len);
  free(a->decision);
  a->decision = copy;
  a->decision_len = len;
  a->decided = r;
  pthread_cond_broadcast(&a->cv);
}

static void hello_encode(unsigned char out[HELLO_BYTES], uint64_t round, uint64_t digest, uint32_t flags) {
  ruccl_put_le64(out, round);
  ruccl_put_le64(out + 8, digest);
  ruccl_put_le32(out + 16, flags);
}

/* A reply: kind u32, then the body (a contribution or a decision). */
static ruccl_result_t send_state(int fd, uint32_t kind, const unsigned char *body, uint32_t len) {
  unsigned char *reply = malloc(4 + (size_t)len);
  if (!reply) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "agreement answer");
  ruccl_put_le32(reply, kind);
  if (len) memcpy(reply + 4, body, len);
  ruccl_result_t rc = ruccl_frame_send(fd, RUCCL_FRAME_AGREE_STATE, reply, 4 + len, ruccl_now_ns() + ANSWER_NS);
  free(reply);
  return rc;
}

/* ---- the answering side (the data port's handshake thread) ------------------------- */

static void answer(ruccl_net_t *net, int fd, unsigned from, uint64_t r, uint64_t digest, uint32_t flags) {
  struct ruccl_agree_net *a = net->agree;
  int64_t deadline = ruccl_deadline_after_ms(net->timeout_ms);
  pthread_mutex_lock(&a->mu);
  if (!(flags & HELLO_PULL)) /* a coordinator's question waits until this node is in the round */
    while (!a->stopping && a->round < r && a->decided < r && a->abandoned != r && ruccl_now_ns() < deadline)
      timed_wait(a, ruccl_now_ns() + WAIT_SLICE_NS * 5);
  uint32_t kind = 0, len = 0;
  unsigned char *body = NULL;
  if (a->stopping || a->abandoned == r) {
    kind = 0; /* nothing: the asker sees the connection close */
  } else if (a->decided == r) {
    kind = STATE_DECISION, len = a->decision_len;
  } else if (flags & HELLO_PULL) { /* not decided: in the round, or on its way to it */
    kind = a->decided < r && a->round <= r ? STATE_NOT_YET : 0;
  } else if (a->round == r && a->digest != digest) {
    kind = STATE_MISMATCH;
  } else if (a->round == r) {
    kind = STATE_CONTRIBUTION, len = a->mine_len;
  }
  if (len) {
    body = malloc(len);
    if (body) memcpy(body, kind == STATE_DECISION ? a->decision : a->mine, len);
    else kind = 0;
  }
  pthread_mutex_unlock(&a->mu);
  ruccl_result_t rc = kind ? send_state(fd, kind, body, len) : RUCCL_ERR_PEER_LOST;
  free(body);
  if (rc != RUCCL_OK || kind == STATE_DECISION || kind == STATE_NOT_YET) return;
  unsigned char *decision = malloc(RUCCL_WIRE_MAX_CONTROL);
  uint16_t type = 0;
  uint32_t dlen = 0;
  rc = decision ? ruccl_frame_recv(fd, &type, decision, RUCCL_WIRE_MAX_CONTROL, &dlen, deadline) : RUCCL_ERR_NO_MEMORY;
  unsigned char *kept = NULL;
  uint32_t kept_len = 0;
  pthread_mutex_lock(&a->mu);
  if (rc == RUCCL_OK && type == RUCCL_FRAME_AGREE_DECIDE) {
    keep_decision(a, r, decision, dlen);
    /* the acknowledgement says which decision this node keeps: a coordinator that was
       taken for lost and went on learns the others' */
    if (a->decided == r && (kept = malloc(a->decision_len ? a->decision_len : 1)))
      memcpy(kept, a->decision, a->decision_len), kept_len = a->decision_len;
  } else if (a->decided < r) { /* the coordinator went before it decided: look to the next */
    if (a->broke_round != r) memset(a->broke, 0, net->num_nodes), a->broke_round = r;
    if (from < net->num_nodes) a->broke[from] = 1;
    pthread_cond_broadcast(&a->cv);
  }
  pthread_mutex_unlock(&a->mu);
  if (kept) ruccl_frame_send(fd, RUCCL_FRAME_AGREE_ACK, kept, kept_len, ruccl_now_ns() + ACK_NS);
  free(kept);
  free(decision);
}

int ruccl_agree_net_serve(ruccl_net_t *net, int fd, unsigned from, const void *first, size_t len) {
  if (!net->agree || len != HELLO_BYTES) return 0;
  const unsigned char *h = first;
  answer(net, fd, from, ruccl_get_le64(h), ruccl_get_le64(h + 8), ruccl_get_le32(h + 16));
  close(fd);
  return 1;
}

/* ---- the asking side --------------------------------------------------------------- */

/* Asks node k a question of round r (flags: HELLO_PULL, or 0: a coordinator's) and
   reads the answer by `by`: the answer's kind (0: none; *rc says why when it is not
   RUCCL_OK), its body in buf[4 .. *got) (buf holds RUCCL_WIRE_MAX_CONTROL bytes).  The
   connection stays open in *fd (-1: none) for the caller to close or go on with. */
static uint32_t question(ruccl_net_t *net, unsigned k, uint64_t r, uint64_t digest, uint32_t flags, int64_t by,
                         unsigned char *buf, uint32_t *got, int *fd, ruccl_result_t *rc) {
  unsigned char hello[HELLO_BYTES];
  hello_encode(hello, r, digest, flags);
  uint16_t type = 0;
  *got = 0;
  *rc = ruccl_net_dial(net, k, RUCCL_FRAME_AGREE, hello, sizeof hello, by, fd);
  if (*rc == RUCCL_OK) *rc = ruccl_frame_recv(*fd, &type, buf, RUCCL_WIRE_MAX_CONTROL, got, by);
  return *rc == RUCCL_OK && type == RUCCL_FRAME_AGREE_STATE && *got >= 4 ? ruccl_get_le32(buf) : 0;
}

/* One question of a coordinator to node `node`, on a thread of its own: the answer's
   kind (0: none, why says why) and body (a copy: the caller frees it), and the
   connection (kept open for the decision). */
typedef struct {
  ruccl_net_t *net;
  unsigned node;
  uint64_t round, digest;
  uint32_t len; /* a contribution's length */
  int64_t deadline_ns;
  int fd;
  uint32_t kind;
  unsigned char *body;
  uint32_t body_len;
  char why[160];
} ask_t;

static void *ask_main(void *arg) {
  ask_t *q = arg;
  unsigned char *buf = malloc(RUCCL_WIRE_MAX_CONTROL);
  ruccl_result_t rc = RUCCL_OK;
  uint32_t got = 0, kind = 0;
  if (buf) kind = question(q->net, q->node, q->round, q->digest, 0, q->deadline_ns, buf, &got, &q->fd, &rc);
  else rc = ruccl_fail(RUCCL_ERR_NO_MEMORY, "agreement answer");
  if (kind == STATE_MISMATCH || kind == STATE_DECISION || (kind == STATE_CONTRIBUTION && got - 4 == q->len)) {
    q->body_len = got - 4;
    q->body = kind == STATE_MISMATCH ? NULL : malloc(q->body_len ? q->body_len : 1);
    if (q->body) memcpy(q->body, buf + 4, q->body_len);
    if (q->body || kind == STATE_MISMATCH) q->kind = kind;
    if (q->kind && ruccl_testing_die_in_agreement() == 1) _exit(9); /* the tests' coordinator that dies mid-round */
  }
  if (!q->kind) snprintf(q->why, sizeof q->why, "%s", rc != RUCCL_OK ? ruccl_last_error() : "it answered out of turn");
  free(buf);
  OPENSSL_thread_stop();
  return NULL;
}

/* This node coordinates round r: asks every higher node it does not suspect. */
static ruccl_result_t coordinate(ruccl_net_t *net, uint64_t r, uint64_t digest, const void *mine, uint32_t len,
                                 ruccl_agree_combine_t combine, void *ctx, unsigned char *suspect, int64_t deadline_ns,
                                 unsigned char *decision, uint32_t cap, uint32_t *dlen) {
  struct ruccl_agree_net *a = net->agree;
  unsigned n = net->num_nodes;
  int *fds = malloc(sizeof *fds * n);
  const unsigned char **contribs = calloc(n, sizeof *contribs);
  unsigned char *buf = malloc(RUCCL_WIRE_MAX_CONTROL);
  unsigned char *held = NULL; /* a decision some node already holds */
  uint32_t held_len = 0;
  if (!fds || !contribs || !buf) {
    free(fds), free(contribs), free(buf);
    return ruccl_fail(RUCCL_ERR_NO_MEMORY, "agreement of %u nodes", n);
  }
  for (unsigned k = 0; k < n; k++) fds[k] = -1;
  contribs[net->me] = mine;
  /* every node is asked at once, each on a thread of its own: the answers come as
     soon as each node is in the round, and the handshakes overlap */
  ask_t *asks = calloc(n, sizeof *asks);
  pthread_t *threads = calloc(n, sizeof *threads);
  char *started = calloc(n, 1);
  if (!asks || !threads || !started) {
    free(asks), free(threads), free(started), free(fds), free(contribs), free(buf);
    return ruccl_fail(RUCCL_ERR_NO_MEMORY, "agreement of %u nodes", n);
  }
  for (unsigned k = net->me + 1; k < n; k++) {
    if (suspect[k]) continue;
    asks[k] = (ask_t){.net = net, .node = k, .round = r, .digest = digest, .len = len, .deadline_ns = deadline_ns,
                      .fd = -1};
    started[k] = pthread_create(&threads[k], NULL, ask_main, &asks[k]) == 0;
    if (!started[k]) ask_main(&asks[k]); /* no thread: asked here */
  }
  for (unsigned k = net->me + 1; k < n; k++) {
    if (suspect[k]) continue;
    if (started[k]) pthread_join(threads[k], NULL);
    ask_t *q = &asks[k];
    if (q->kind == STATE_MISMATCH) {
      contribs[k] = ruccl_agree_mismatch; /* in the round, with another set of nodes: the decision says so */
      fds[k] = q->fd;
    } else if (q->kind == STATE_DECISION && !held) {
      held = q->body, held_len = q->body_len, fds[k] = q->fd;
    } else if (q->kind == STATE_DECISION) {
      free(q->body);
      fds[k] = q->fd;
    } else if (q->kind == STATE_CONTRIBUTION) {
      contribs[k] = q->body;
      fds[k] = q->fd;
    } else {
      ruccl_log(2, "node %u: agreement round %llu: node %u is lost (%s)", net->me, (unsigned long long)r, k, q->why);
      if (q->fd >= 0) close(q->fd);
      suspect[k] = 1;
    }
  }
  free(asks);
  free(threads);
  free(started);
  ruccl_result_t rc = RUCCL_OK;
  if (!held && ruccl_now_ns() >= deadline_ns)
    rc = ruccl_fail(RUCCL_ERR_TIMEOUT, "node %u: the agreement (round %llu) did not complete within the timeout",
                    net->me, (unsigned long long)r);
  pthread_mutex_lock(&a->mu);
  if (rc == RUCCL_OK && !held && a->decided == r) { /* another coordinator's decision reached this node meanwhile */
    held = malloc(a->decision_len ? a->decision_len : 1);
    if (held) memcpy(held, a->decision, a->decision_len), held_len = a->decision_len;
  }
  pthread_mutex_unlock(&a->mu);
  if (rc == RUCCL_OK && held) {
    *dlen = held_len <= cap ? held_len : cap;
    memcpy(decision, held, *dlen);
  } else if (rc == RUCCL_OK) {
    combine(ctx, n, contribs, len, decision, cap, dlen);
  }
  for (unsigned k = 0; rc == RUCCL_OK && k < n; k++) {
    if (fds[k] < 0) continue;
    ruccl_frame_send(fds[k], RUCCL_FRAME_AGREE_DECIDE, decision, *dlen, ruccl_now_ns() + ANSWER_NS);
    if (ruccl_testing_die_in_agreement() == 2) _exit(9); /* the tests' coordinator that dies while deciding */
  }
  int adopted = 0;
  for (unsigned k = 0; k < n; k++) {
    if (fds[k] < 0) continue;
    uint16_t type = 0;
    uint32_t got = 0;
    /* a node that kept another decision (this node was taken for lost meanwhile): that one stands */
    if (rc == RUCCL_OK && !adopted &&
        ruccl_frame_recv(fds[k], &type, buf, RUCCL_WIRE_MAX_CONTROL, &got, ruccl_now_ns() + ACK_NS) == RUCCL_OK &&
        type == RUCCL_FRAME_AGREE_ACK && (got != *dlen || memcmp(buf, decision, got) != 0) && got <= cap) {
      memcpy(decision, buf, got);
      *dlen = got;
      adopted = 1;
    }
    close(fds[k]);
    if (k != net->me && contribs[k] != ruccl_agree_mismatch) free((void *)contribs[k]);
  }
  if (rc == RUCCL_OK) {
    pthread_mutex_lock(&a->mu);
    keep_decision(a, r, decision, *dlen);
    pthread_mutex_unlock(&a->mu);
  }
  free(held);
  free(buf);
  free(contribs);
  free(fds);
  return rc;
}

/* Asks node c whether it decided round r: 1 and the decision kept here when it has,
   0 when it is there and has not yet (or said the sets differ), -1 when it is gone
   (refuses, closes) or left the round, -2 when it said nothing within PULL_NS. */
static int pull(ruccl_net_t *net, unsigned c, uint64_t r, uint64_t digest, int64_t deadline_ns) {
  struct ruccl_agree_net *a = net->agree;
  int64_t by = ruccl_now_ns() + PULL_NS;
  if (by > deadline_ns) by = deadline_ns;
  int fd = -1;
  unsigned char *buf = malloc(RUCCL_WIRE_MAX_CONTROL);
  ruccl_result_t rc = RUCCL_ERR_NO_MEMORY;
  uint32_t got = 0, kind = buf ? question(net, c, r, digest, HELLO_PULL, by, buf, &got, &fd, &rc) : 0;
  if (fd >= 0) close(fd);
  int out = -1;
  if (kind == STATE_DECISION) {
    pthread_mutex_lock(&a->mu);
    keep_decision(a, r, buf + 4, got - 4);
    pthread_mutex_unlock(&a->mu);
    out = 1;
  } else if (kind == STATE_NOT_YET || kind == STATE_MISMATCH) {
    out = 0;
  }
  if (out < 0 && rc == RUCCL_ERR_TIMEOUT) out = ruccl_now_ns() >= deadline_ns ? 0 : -2; /* the caller's timeout says */
  free(buf);
  return out;
}

ruccl_result_t ruccl_agree_net_run(ruccl_net_t *net, uint64_t round, const void *mine, uint32_t len,
                                   const unsigned char *skip, ruccl_agree_combine_t combine, void *ctx,
                                   int64_t liveness_ms, int64_t deadline_ns, unsigned char *decision, uint32_t cap,
                                   uint32_t *dlen) {
  struct ruccl_agree_net *a = net->agree;
  unsigned n = net->num_nodes;
  unsigned char *copy = malloc(len ? len : 1), *suspect = calloc(n, 1);
  if (!copy || !suspect) {
    free(copy), free(suspect);
    return ruccl_fail(RUCCL_ERR_NO_MEMORY, "agreement round");
  }
  memcpy(copy, mine, len);
  /* the set of nodes taking part (not skipped), as a digest every question carries */
  uint64_t digest = 1469598103934665603ull; /* FNV-1a */
  for (unsigned k = 0; k < n; k++) {
    suspect[k] = skip && skip[k] && k != net->me;
    digest = (digest ^ suspect[k]) * 1099511628211ull;
  }
  pthread_mutex_lock(&a->mu);
  free(a->mine);
  a->mine = copy;
  a->mine_len = len;
  a->digest = digest;
  a->round = round;
  pthread_cond_broadcast(&a->cv); /* a coordinator's question may be waiting for this */
  pthread_mutex_unlock(&a->mu);

  ruccl_result_t rc = RUCCL_OK;
  int64_t started = ruccl_now_ns(), next_pull = 0, silent_since = 0;
  unsigned watched = n;
  for (;;) {
    pthread_mutex_lock(&a->mu);
    if (a->decided == round) {
      *dlen = a->decision_len <= cap ? a->decision_len : cap;
      memcpy(decision, a->decision, *dlen);
      pthread_mutex_unlock(&a->mu);
      break;
    }
    unsigned c = 0;
    while (c < n && suspect[c]) c++;
    if (c < n && a->broke_round == round && a->broke[c] && c != net->me) {
      suspect[c] = 1;
      pthread_mutex_unlock(&a->mu);
      ruccl_log(2, "node %u: agreement round %llu: coordinator node %u broke off", net->me,
                (unsigned long long)round, c);
      continue;
    }
    if (c == net->me) {
      pthread_mutex_unlock(&a->mu);
      rc = coordinate(net, round, digest, mine, len, combine, ctx, suspect, deadline_ns, decision, cap, dlen);
      break;
    }
    int64_t now = ruccl_now_ns();
    if (now >= deadline_ns) {
      pthread_mutex_unlock(&a->mu);
      rc = ruccl_fail(RUCCL_ERR_TIMEOUT, "node %u: no agreement (round %llu) within the timeout: coordinator node %u "
                      "neither decided nor was found lost", net->me, (unsigned long long)round, c);
      break;
    }
    timed_wait(a, now + WAIT_SLICE_NS < deadline_ns ? now + WAIT_SLICE_NS : deadline_ns);
    pthread_mutex_unlock(&a->mu);
    if (watched != c) watched = c, next_pull = 0, silent_since = 0;
    if (ruccl_now_ns() < next_pull) continue;
    /* Ask the coordinator: it may have decided and left (this node's copy lost with a
       coordinator before it), or be gone. */
    int got = pull(net, c, round, digest, deadline_ns);
    next_pull = ruccl_now_ns() + (ruccl_now_ns() - started < 1000000000LL ? PULL_FIRST_NS : PULL_LATER_NS);
    if (got == -2)
      ruccl_log(2, "node %u: agreement round %llu: coordinator node %u said nothing to a pull within %lld ms", net->me,
                (unsigned long long)round, c, PULL_NS / 1000000);
    if (got != -2) silent_since = 0;
    else if (!silent_since) silent_since = ruccl_now_ns();
    if (got == -2 && liveness_ms > 0 && ruccl_now_ns() - silent_since >= liveness_ms * 1000000) got = -1; /* frozen */
    if (got == -1) {
      ruccl_log(2, "node %u: agreement round %llu: coordinator node %u is gone, frozen or out of the round", net->me,
                (unsigned long long)round, c);
      suspect[c] = 1;
    }
  }
  if (rc != RUCCL_OK) { /* what this node brought stands no more: it answers nothing of the round */
    pthread_mutex_lock(&a->mu);
    a->abandoned = round;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
  }
  free(suspect);
  return rc;
}

/* agree_net.c — the nodes' fault-tolerant agreement (agree_net.h). */
#include "agree_net.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../error.h"
#include "../le.h"
#include "../testing.h"
#include "wire.h"

#define STATE_CONTRIBUTION 1
#define STATE_DECISION 2
#define WAIT_SLICE_NS 20000000LL   /* a waiting node looks at its coordinator this often at most */
#define PROBE_EVERY_NS 100000000LL /* and probes its data port this often */
#define PROBE_NS 300000000LL       /* a probe's connect, and the port's first answer */
#define ANSWER_NS 10000000000LL    /* sending one answer */

struct ruccl_agree_net {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stopping;
  uint64_t round; /* the round this node is in (or was last in) */
  unsigned char *mine;
  uint32_t mine_len;
  uint64_t decided; /* the last round decided here */
  unsigned char *decision;
  uint32_t decision_len;
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
static int keep_decision(struct ruccl_agree_net *a, uint64_t r, const unsigned char *d, uint32_t len) {
  if (a->decided >= r) return 0;
  unsigned char *copy = malloc(len ? len : 1);
  if (!copy) return 0;
  memcpy(copy, d, len);
  free(a->decision);
  a->decision = copy;
  a->decision_len = len;
  a->decided = r;
  pthread_cond_broadcast(&a->cv);
  return 1;
}

/* ---- the answering side (the data port's handshake thread) ------------------------- */

static void answer(ruccl_net_t *net, int fd, unsigned from, const void *first, size_t len);

int ruccl_agree_net_serve(ruccl_net_t *net, int fd, unsigned from, const void *first, size_t len) {
  if (!net->agree || len != 8) return 0;
  answer(net, fd, from, first, len);
  close(fd);
  return 1;
}

static void answer(ruccl_net_t *net, int fd, unsigned from, const void *first, size_t len) {
  (void)len;
  struct ruccl_agree_net *a = net->agree;
  uint64_t r = ruccl_get_le64(first);
  int64_t deadline = ruccl_deadline_after_ms(net->timeout_ms);
  pthread_mutex_lock(&a->mu);
  while (!a->stopping && a->round < r && a->decided < r && ruccl_now_ns() < deadline)
    timed_wait(a, ruccl_now_ns() + WAIT_SLICE_NS * 5);
  uint32_t kind = 0, body = 0;
  unsigned char *reply = NULL;
  if (!a->stopping && (a->decided == r || (a->round == r && a->decided < r))) {
    kind = a->decided == r ? STATE_DECISION : STATE_CONTRIBUTION;
    body = kind == STATE_DECISION ? a->decision_len : a->mine_len;
    reply = malloc(4 + (size_t)body);
    if (reply) {
      ruccl_put_le32(reply, kind);
      memcpy(reply + 4, kind == STATE_DECISION ? a->decision : a->mine, body);
    }
  }
  pthread_mutex_unlock(&a->mu);
  if (!reply) return; /* stopping, another round, or no memory: the asker sees the connection close */
  ruccl_result_t rc = ruccl_frame_send(fd, RUCCL_FRAME_AGREE_STATE, reply, 4 + body, ruccl_now_ns() + ANSWER_NS);
  free(reply);
  if (rc != RUCCL_OK || kind == STATE_DECISION) return;
  unsigned char *decision = malloc(RUCCL_WIRE_MAX_CONTROL);
  uint16_t type = 0;
  uint32_t dlen = 0;
  rc = decision ? ruccl_frame_recv(fd, &type, decision, RUCCL_WIRE_MAX_CONTROL, &dlen, deadline) : RUCCL_ERR_NO_MEMORY;
  pthread_mutex_lock(&a->mu);
  if (rc == RUCCL_OK && type == RUCCL_FRAME_AGREE_DECIDE) {
    keep_decision(a, r, decision, dlen);
  } else if (a->decided < r) { /* the coordinator went before it decided: look to the next */
    if (a->broke_round != r) memset(a->broke, 0, net->num_nodes), a->broke_round = r;
    if (from < net->num_nodes) a->broke[from] = 1;
    pthread_cond_broadcast(&a->cv);
  }
  pthread_mutex_unlock(&a->mu);
  free(decision);
}

/* ---- the asking side --------------------------------------------------------------- */

/* Whether node k's data port is there: *gone when it refuses (its process ended),
   *silent when it takes the connection but says nothing (frozen). */
static void probe(const ruccl_net_t *net, unsigned k, int *gone, int *silent) {
  int fd = -1;
  *gone = *silent = 0;
  ruccl_result_t rc =
      ruccl_tcp_connect_ex(net->nodes[k].address, (int)net->nodes[k].port, ruccl_now_ns() + PROBE_NS, 0, &fd);
  if (rc == RUCCL_ERR_PEER_LOST || rc == RUCCL_ERR_IO) *gone = 1;
  else if (rc != RUCCL_OK) *silent = 1;
  if (fd >= 0) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r;
    do r = poll(&p, 1, (int)(PROBE_NS / 1000000)); while (r < 0 && errno == EINTR);
    *silent = r == 0;
    close(fd);
  }
}

/* This node coordinates round r: asks every higher node it does not suspect. */
static ruccl_result_t coordinate(ruccl_net_t *net, uint64_t r, const void *mine, uint32_t len,
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
  unsigned char hello[8];
  ruccl_put_le64(hello, r);
  for (unsigned k = net->me + 1; k < n && !held; k++) {
    if (suspect[k]) continue;
    int fd = -1;
    ruccl_result_t rc = ruccl_net_dial(net, k, RUCCL_FRAME_AGREE, hello, sizeof hello, deadline_ns, &fd);
    uint16_t type = 0;
    uint32_t got = 0;
    if (rc == RUCCL_OK) rc = ruccl_frame_recv(fd, &type, buf, RUCCL_WIRE_MAX_CONTROL, &got, deadline_ns);
    uint32_t kind = rc == RUCCL_OK && type == RUCCL_FRAME_AGREE_STATE && got >= 4 ? ruccl_get_le32(buf) : 0;
    if (kind == STATE_DECISION || (kind == STATE_CONTRIBUTION && got - 4 == len)) {
      unsigned char *copy = malloc(got - 4 ? got - 4 : 1);
      if (copy) memcpy(copy, buf + 4, got - 4);
      if (kind == STATE_DECISION) held = copy, held_len = got - 4;
      else contribs[k] = copy;
      if (copy) {
        fds[k] = fd;
        if (ruccl_testing_die_in_agreement()) _exit(9); /* the tests' coordinator that dies mid-round */
        continue;
      }
    }
    ruccl_log(2, "node %u: agreement round %llu: node %u is lost (%s)", net->me, (unsigned long long)r, k,
              rc != RUCCL_OK ? ruccl_last_error() : "it answered out of turn");
    if (fd >= 0) close(fd);
    suspect[k] = 1;
  }
  pthread_mutex_lock(&a->mu);
  if (!held && a->decided == r) { /* another coordinator's decision reached this node meanwhile */
    held = malloc(a->decision_len ? a->decision_len : 1);
    if (held) memcpy(held, a->decision, a->decision_len), held_len = a->decision_len;
  }
  pthread_mutex_unlock(&a->mu);
  if (held) {
    *dlen = held_len <= cap ? held_len : cap;
    memcpy(decision, held, *dlen);
  } else {
    combine(ctx, n, contribs, len, decision, cap, dlen);
  }
  for (unsigned k = 0; k < n; k++) {
    if (fds[k] < 0) continue;
    ruccl_frame_send(fds[k], RUCCL_FRAME_AGREE_DECIDE, decision, *dlen, ruccl_now_ns() + ANSWER_NS);
    close(fds[k]);
    if (k != net->me) free((void *)contribs[k]);
  }
  pthread_mutex_lock(&a->mu);
  keep_decision(a, r, decision, *dlen);
  pthread_mutex_unlock(&a->mu);
  free(held);
  free(buf);
  free(contribs);
  free(fds);
  return RUCCL_OK;
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
  for (unsigned k = 0; skip && k < n; k++) suspect[k] = skip[k] && k != net->me;
  memcpy(copy, mine, len);
  pthread_mutex_lock(&a->mu);
  free(a->mine);
  a->mine = copy;
  a->mine_len = len;
  a->round = round;
  pthread_cond_broadcast(&a->cv); /* a coordinator's question may be waiting for this */
  pthread_mutex_unlock(&a->mu);

  ruccl_result_t rc = RUCCL_OK;
  int64_t next_probe = 0, silent_since = 0;
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
      rc = coordinate(net, round, mine, len, combine, ctx, suspect, deadline_ns, decision, cap, dlen);
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
    if (watched != c) watched = c, silent_since = 0, next_probe = 0;
    if (ruccl_now_ns() < next_probe) continue;
    int gone = 0, silent = 0;
    probe(net, c, &gone, &silent);
    next_probe = ruccl_now_ns() + PROBE_EVERY_NS;
    if (!silent) silent_since = 0;
    else if (!silent_since) silent_since = ruccl_now_ns();
    if (gone || (silent && liveness_ms > 0 && ruccl_now_ns() - silent_since >= liveness_ms * 1000000)) {
      ruccl_log(2, "node %u: agreement round %llu: coordinator node %u is %s", net->me, (unsigned long long)round, c,
                gone ? "gone (its data port refuses)" : "silent past the liveness timeout");
      suspect[c] = 1;
    }
  }
  free(suspect);
  return rc;
}

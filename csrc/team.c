/* team.c — maps an algorithm's team positions onto global peer indices and hands
   each step to the team's transport; the clock and the cancel state every
   transport's waits share. */
#include <stdint.h>
#include <time.h>

#include "cancel.h"
#include "error.h"
#include "testing.h"
#include "transport.h"

ruccl_result_t ruccl_cancel_state(const ruccl_cancel_t *c) {
  if (atomic_load(c->reset)) return ruccl_fail(RUCCL_ERR_RESET, "ruccl_reset() discarded this session");
  /* broken_why is written once, before the store that sets broken: reading it
     after seeing broken needs no lock (and must take none: waiters call this while
     holding a transport's mutex). */
  int broken = atomic_load(c->broken);
  if (broken) {
    ruccl_set_last_error(c->broken_why);
    return (ruccl_result_t)broken;
  }
  return RUCCL_OK;
}

int64_t ruccl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int ruccl_cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(cv, &attr);
  pthread_condattr_destroy(&attr);
  return rc;
}

int64_t ruccl_deadline_after_ms(int64_t ms) {
  int64_t now = ruccl_now_ns();
  if (ms <= 0) return now;
  if (ms > (INT64_MAX - now) / 1000000) return INT64_MAX;
  return now + ms * 1000000;
}

int64_t ruccl_deadline_later(int64_t deadline_ns, int64_t ms) {
  int64_t grace = ruccl_deadline_after_ms(ms) - ruccl_now_ns();
  return deadline_ns > INT64_MAX - grace ? INT64_MAX : deadline_ns + grace;
}

static int global_index(const ruccl_team_t *team, int pos) {
  if (pos == RUCCL_NO_PEER || !team->members) return pos;
  return (int)team->members[pos];
}

ruccl_result_t ruccl_team_xfer(const ruccl_team_t *team, const ruccl_xfer_t *x) {
  ruccl_xfer_t g = *x;
  g.send_peer = global_index(team, x->send_peer);
  g.recv_peer = global_index(team, x->recv_peer);
  if (g.recv_peer != RUCCL_NO_PEER) ruccl_testing_receiving_step();
  ruccl_result_t rc = team->ops->xfer(team->endpoint, &g, team->deadline_ns);
  ruccl_testing_step_done();
  return rc;
}

ruccl_result_t ruccl_team_send(const ruccl_team_t *team, int peer, const void *buf, size_t bytes) {
  ruccl_xfer_t x = {.send_peer = peer, .send_buf = buf, .send_bytes = bytes, .recv_peer = RUCCL_NO_PEER};
  return ruccl_team_xfer(team, &x);
}

ruccl_result_t ruccl_team_recv(const ruccl_team_t *team, int peer, void *buf, size_t bytes) {
  ruccl_xfer_t x = {.send_peer = RUCCL_NO_PEER, .recv_peer = peer, .recv_buf = buf, .recv_bytes = bytes};
  return ruccl_team_xfer(team, &x);
}

ruccl_result_t ruccl_team_send_all(const ruccl_team_t *team, const void *buf, size_t bytes) {
  for (unsigned p = 0; p < team->n; p++) {
    if (p == team->me) continue;
    ruccl_result_t rc = ruccl_team_send(team, (int)p, buf, bytes);
    if (rc != RUCCL_OK) return rc;
  }
  return RUCCL_OK;
}

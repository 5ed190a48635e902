/* transport.h — the one interface every transport (in-process, and later shared
   memory and TCP) implements, and the team an algorithm runs over.
 *
 * An algorithm only ever calls ruccl_team_xfer(): one step that may send a buffer
 * to one peer and receive (optionally reducing on receipt) from another, both by
 * position in the team.  Messages between a pair are FIFO; a step returns when its
 * send has been taken and its receive has landed, so the caller may reuse both
 * buffers.  Which transport carries the bytes is invisible to it. */
#ifndef RUCCL_TRANSPORT_H
#define RUCCL_TRANSPORT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ruccl.h"

#define RUCCL_NO_PEER (-1)

typedef struct {
  int send_peer; /* team position, or RUCCL_NO_PEER */
  const void *send_buf;
  size_t send_bytes;
  int recv_peer; /* team position, or RUCCL_NO_PEER */
  void *recv_buf;
  size_t recv_bytes;
  /* Reduce on receipt: recv_buf = reduce_local op incoming (count = recv_bytes /
     element size), then divided by divisor when it is non-zero.  NULL: plain copy. */
  const void *reduce_local;
  ruccl_dtype_t dtype;
  ruccl_reduce_op_t op;
  unsigned divisor;
  /* A point-to-point message (ruccl_send/recv), not a collective's: each side says
     which kind it sends and expects, and a receiver that finds the other kind fails
     with RUCCL_ERR_PROTOCOL instead of taking the bytes. */
  int p2p;
} ruccl_xfer_t;

/* A transport, over an endpoint only it knows the type of.  Its life: connect (once,
   after the endpoint knows its peers), any number of xfer, abort at any time from any
   thread, close (once, after the last xfer has returned). */
typedef struct ruccl_transport_ops {
  const char *name;
  /* Makes the connections the endpoint needs before its first step (a transport may
     make others on first use); by deadline_ns, or RUCCL_ERR_TIMEOUT. */
  ruccl_result_t (*connect)(void *endpoint, int64_t deadline_ns);
  /* One step; send_peer / recv_peer are the endpoint's own peer numbers (the team
     has mapped them). */
  ruccl_result_t (*xfer)(void *endpoint, const ruccl_xfer_t *x, int64_t deadline_ns);
  /* The session stops (its cancel state says so already, or code says why): every
     wait on this endpoint returns promptly, and the other ends hear code. */
  void (*abort)(void *endpoint, ruccl_result_t code);
  /* Ends the endpoint's connections.  finished: every step of this end is done and
     the other ends are told so (they may drain what it sent); else it just goes away. */
  void (*close)(void *endpoint, int finished);
} ruccl_transport_ops_t;

/* The peers one algorithm runs over: a subset of the session's peers (all of them
   for a flat strategy, the local peers or the node leaders for a hierarchical one),
   listed by their global index. */
typedef struct {
  const ruccl_transport_ops_t *ops;
  void *endpoint;
  unsigned n;              /* team size */
  unsigned me;             /* my position in the team */
  const unsigned *members; /* position -> global peer index; NULL = identity */
  int64_t deadline_ns;     /* CLOCK_MONOTONIC; every wait of this collective ends by then */
} ruccl_team_t;

ruccl_result_t ruccl_team_xfer(const ruccl_team_t *team, const ruccl_xfer_t *x);

/* Shorthands for the common one-sided steps. */
ruccl_result_t ruccl_team_send(const ruccl_team_t *team, int peer, const void *buf, size_t bytes);
ruccl_result_t ruccl_team_recv(const ruccl_team_t *team, int peer, void *buf, size_t bytes);
/* The same buffer to every other member, in position order. */
ruccl_result_t ruccl_team_send_all(const ruccl_team_t *team, const void *buf, size_t bytes);

int64_t ruccl_now_ns(void);
/* Initializes a condition variable whose timed waits take CLOCK_MONOTONIC
   deadlines (ruccl_now_ns); returns pthread_cond_init's result. */
int ruccl_cond_init_monotonic(pthread_cond_t *cv);

/* Waits spin this long before sleeping or yielding: waking a sleeping thread or
   process costs tens of microseconds on these machines. */
#define RUCCL_SPIN_NS 50000

static inline void ruccl_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}
/* now + ms, saturating at INT64_MAX instead of overflowing. */
int64_t ruccl_deadline_after_ms(int64_t ms);
/* deadline_ns moved ms later (saturating): a wait that must outlast another's. */
int64_t ruccl_deadline_later(int64_t deadline_ns, int64_t ms);

#endif

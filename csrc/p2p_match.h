/* p2p_match.h — point-to-point matching: one mailbox per local peer, holding the
   receives it has posted and the messages that arrived before a receive wanted them.
 *
 * A message carries its sender's global index and a tag.  It goes to the first
 * posted receive (in post order) that names its sender (or any sender) and its tag;
 * with none, it waits in the mailbox's unexpected queue, in arrival order, where a
 * later receive finds it.  Between one sender and one receiver, messages of one tag
 * are therefore matched in the order they were sent and received, whatever else
 * (other tags, other peers, collectives) is going on.
 *
 * Sends are eager: a message is handed over whole, into the receive's buffer or a
 * buffer of the mailbox's own, so a send never waits for its receive to be posted
 * and two peers sending to each other first cannot deadlock.
 *
 * Two producers fill a mailbox: a thread of the same process (ruccl_mailbox_deliver,
 * one copy under the mailbox's lock) and the network's receiving thread, which
 * streams a message's bytes in as they come (ruccl_arrival_*).  Nothing here knows
 * of groups, transports or devices; waits take a callback that says whether the
 * session still stands. */
#ifndef RUCCL_P2P_MATCH_H
#define RUCCL_P2P_MATCH_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ruccl.h"

#define RUCCL_P2P_ANY UINT32_MAX /* a receive's source: any sender */

typedef struct ruccl_unexpected ruccl_unexpected_t;

/* A posted receive, as the mailbox sees it (embedded in the API's request). */
typedef struct ruccl_p2p_recv {
  uint32_t src; /* sender's global index, or RUCCL_P2P_ANY */
  int32_t tag;
  void *buf;
  size_t bytes;
  /* Below: the mailbox's, under its lock. */
  int state;              /* RUCCL_RECV_* */
  int cancel;             /* the owner gave up while the network was writing buf */
  ruccl_unexpected_t *on; /* matched to a message still arriving */
  ruccl_result_t result;  /* once DONE */
  uint32_t source;        /* once DONE and OK: who sent it */
  char why[200];          /* once DONE with an error */
  struct ruccl_p2p_recv *next;
} ruccl_p2p_recv_t;

enum { RUCCL_RECV_IDLE, RUCCL_RECV_POSTED, RUCCL_RECV_CLAIMED, RUCCL_RECV_DONE };

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* a receive completed, or a claim was released */
  ruccl_p2p_recv_t *posted, *posted_tail;
  ruccl_unexpected_t *unexpected, *unexpected_tail;
  size_t unexpected_bytes; /* held in the unexpected queue */
  int closed;              /* the peer finished: deliveries are refused */
} ruccl_mailbox_t;

int ruccl_mailbox_init(ruccl_mailbox_t *mb);
/* Frees every unexpected message; no receive may be posted any more. */
void ruccl_mailbox_destroy(ruccl_mailbox_t *mb);
/* The peer finished: its posted receives fail with code, later deliveries are
   refused, and what waited unexpected is freed. */
void ruccl_mailbox_close(ruccl_mailbox_t *mb, ruccl_result_t code, const char *why);

/* Wakes the mailbox's waiters so that they look at the session again. */
void ruccl_mailbox_wake(ruccl_mailbox_t *mb);

/* Posts r (src, tag, buf, bytes set): completes it at once from the unexpected
   queue when a message waits there, else queues it. */
void ruccl_mailbox_post(ruccl_mailbox_t *mb, ruccl_p2p_recv_t *r);

/* A thread of this process hands over a message: copied into a matching receive,
   or into a buffer of the mailbox's.  PEER_FINISHED when the mailbox is closed,
   NO_MEMORY when it cannot be held. */
ruccl_result_t ruccl_mailbox_deliver(ruccl_mailbox_t *mb, uint32_t src, int32_t tag, const void *buf, size_t bytes);

/* Whether the session still stands (RUCCL_OK) or why not. */
typedef ruccl_result_t (*ruccl_p2p_status_fn)(void *ctx);

/* Waits for any of rs[0..n) (all posted on mb; NULL entries are skipped) to be
   DONE: returns its position, or -1 when wait_until passed first.  A receive whose
   own deadline (deadlines[i], CLOCK_MONOTONIC) passes is completed with TIMEOUT, and
   every pending one with the status's error when the session fails: both count as
   done.  rs may hold receives that are DONE already. */
long ruccl_mailbox_wait_any(ruccl_mailbox_t *mb, ruccl_p2p_recv_t *const *rs, const int64_t *deadlines, size_t n,
                            int64_t wait_until, ruccl_p2p_status_fn status, void *ctx);

/* Withdraws a receive that is not DONE (nothing is written into its buffer after
   this returns) and completes it with code.  A message it was matched to stays for
   the next receive. */
void ruccl_mailbox_cancel(ruccl_mailbox_t *mb, ruccl_p2p_recv_t *r, ruccl_result_t code, const char *why);

/* ---- the network's side: a message whose bytes arrive over time ------------------ */

typedef struct {
  ruccl_mailbox_t *mb;
  uint32_t src;
  int32_t tag;
  size_t bytes;
  ruccl_p2p_recv_t *recv;  /* claimed: the bytes go straight into its buffer */
  ruccl_unexpected_t *msg; /* or into a buffer of the mailbox's */
  /* neither: the bytes are dropped (a receive of another size, no memory, closed) */
} ruccl_arrival_t;

/* Whether a message of `bytes` from src with tag may begin arriving now: a posted
   receive takes it, the mailbox is closed (it is dropped), or the unexpected queue
   can hold it (less than cap bytes with it, or empty: one message is always held).
   Otherwise the network leaves it in its connection until a receive is posted or
   the queue drains (backpressure: its sender waits, not this node's memory). */
int ruccl_arrival_may_begin(ruccl_mailbox_t *mb, uint32_t src, int32_t tag, size_t bytes, size_t cap);
/* A message's header arrived: where should its bytes go? */
void ruccl_arrival_begin(ruccl_mailbox_t *mb, uint32_t src, int32_t tag, size_t bytes, ruccl_arrival_t *a);
/* Where the bytes from offset `done` go (NULL: drop them).  A receive whose owner
   gave up meanwhile is let go here: what it got so far moves to a buffer of the
   mailbox's, and the message waits for the next receive. */
char *ruccl_arrival_target(ruccl_arrival_t *a, size_t done);
/* The message is whole (RUCCL_OK), or its connection broke (code, why): a receive
   that took part of it fails with that. */
void ruccl_arrival_end(ruccl_arrival_t *a, ruccl_result_t code, const char *why);

/* Fails every posted receive that names one of srcs[0..n) (not those from any
   sender) with code: their senders' node is gone. */
void ruccl_mailbox_fail_sources(ruccl_mailbox_t *mb, const uint32_t *srcs, size_t n, ruccl_result_t code,
                                const char *why);

#endif

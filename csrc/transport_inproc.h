/* transport_inproc.h — the in-process transport: peers are threads of one process,
   so a receiver reads the sender's buffer directly (no serialization, one pass that
   copies or reduces), and the sender waits until it has been read. */
#ifndef RUCCL_TRANSPORT_INPROC_H
#define RUCCL_TRANSPORT_INPROC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cancel.h"
#include "transport.h"

/* One directed mailbox, sender -> receiver, holding at most one message. */
typedef struct {
  atomic_int state; /* INPROC_EMPTY, _POSTED, _READING, _DONE */
  int p2p;          /* ruccl_xfer_t.p2p of the message */
  const void *ptr;  /* published by the POSTED store */
  size_t bytes;
  char pad[64 - 2 * sizeof(int) - sizeof(void *) - sizeof(size_t)]; /* one cache line */
} ruccl_inproc_channel_t;

typedef struct {
  unsigned n;
  ruccl_inproc_channel_t *channels; /* n * n, [from * n + to] */
  pthread_mutex_t mu;               /* only for sleeping */
  pthread_cond_t cv;
  atomic_int sleepers;
} ruccl_inproc_t;

/* One peer's end of the in-process transport: the endpoint of ruccl_inproc_ops. */
typedef struct {
  ruccl_inproc_t *t;
  unsigned index;               /* this peer's position */
  const ruccl_cancel_t *cancel; /* the session's state */
  const atomic_int *finished;   /* by position: that peer finished its session */
  const uint32_t *names;        /* by position: the peer ids that messages name */
  const int64_t *timeout_ms;    /* the handle's timeout (read atomically), for messages */
} ruccl_inproc_port_t;

int ruccl_inproc_init(ruccl_inproc_t *t, unsigned n);
void ruccl_inproc_destroy(ruccl_inproc_t *t);
/* Wakes every thread sleeping in this transport so it re-checks the session state. */
void ruccl_inproc_wake(ruccl_inproc_t *t);

extern const ruccl_transport_ops_t ruccl_inproc_ops; /* endpoint: a ruccl_inproc_port_t */

#endif

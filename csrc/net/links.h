/* links.h — what the two halves of the TCP transport share: links.c (the links
   between nodes: made at set-up or on first use, through the data port; abort and
   close) and transport_tcp.c (one step: the pump that moves a message each way over
   a socket or a shared-memory ring).  Liveness is p2p_net.c's; the nodes'
   fault-tolerant agreement, agree_net.c's.  Internal to csrc/net. */
#ifndef RUCCL_NET_LINKS_H
#define RUCCL_NET_LINKS_H

#include <stdint.h>

#include "../le.h"
#include "transport_tcp.h"

#define BOUNCE_BYTES (256 * 1024)
#define POLL_SLICE_MS 50
#define SHM_SLEEP_NS 20000000 /* a sleep on a doorbell looks at the session at least this often */

enum { MSG_DATA = 1, MSG_ABORT = 2, MSG_P2P = 3 }; /* MSG_P2P: a point-to-point message's data */
/* A data socket's writer, so that an ABORT never lands inside a message: the leader
   takes a socket from IDLE to MESSAGE for each message and back once the kernel has
   all of it; ruccl_net_abort takes it from IDLE to CLOSED and writes its notice in
   band, or, finding a message half sent, sends it on the control connection. */
enum { TX_IDLE = 0, TX_MESSAGE = 1, TX_CLOSED = 2 };

/* A message's header on a data socket or ring: kind u32, code u32 (an ABORT's),
   payload length u64, little-endian (le.h). */
#define MSG_HEADER_BYTES 16
typedef struct {
  unsigned char b[MSG_HEADER_BYTES];
} msg_header_t;

static inline msg_header_t msg_header(uint32_t kind, uint32_t code, uint64_t len) {
  msg_header_t h;
  ruccl_put_le32(h.b, kind);
  ruccl_put_le32(h.b + 4, code);
  ruccl_put_le64(h.b + 8, len);
  return h;
}
static inline uint32_t msg_kind(const msg_header_t *h) { return ruccl_get_le32(h->b); }
static inline uint32_t msg_code(const msg_header_t *h) { return ruccl_get_le32(h->b + 4); }
static inline uint64_t msg_len(const msg_header_t *h) { return ruccl_get_le64(h->b + 8); }

/* Node k's link socket, or -1 while there is none (published once, under links_lock). */
static inline int link_fd(const ruccl_net_t *net, unsigned k) { return __atomic_load_n(&net->fds[k], __ATOMIC_ACQUIRE); }

/* This node links to lower node j: dials it, says who it is, takes the memory it
   offers, and publishes the link. */
ruccl_result_t ruccl_net_dial_node(ruccl_net_t *net, unsigned j, int64_t deadline_ns);

#endif

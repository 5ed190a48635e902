/* p2p_net.h — point-to-point messages between nodes, on connections of their own.
 *
 * A node opens a connection to another the first time one of its peers sends there
 * (through the other's data port, authenticated like every connection) and sends
 * on it only; it reads what others send on the connections they opened to it.  So
 * the collectives' sockets and shared-memory rings never carry a point-to-point
 * byte, each direction of a pair has one writer per message (the sending thread,
 * under the connection's lock) and one reader (this node's receiving thread), and
 * nodes that never exchange point-to-point never connect for it.
 *
 * The same connections carry control: a node that stops the session while one of
 * its data sockets has a message half sent says why here (an abort never lands in
 * the middle of a message).
 *
 * And liveness: each node beats on its connection to the next node of the ring of
 * nodes (index + 1, modulo their number) every quarter of the liveness timeout,
 * from a thread of its own (so a node that computes for hours still beats), and
 * watches the previous node's stream: any byte of it counts.  A predecessor silent
 * for longer than the timeout (frozen, cut off, or its host gone) stops the session
 * with PEER_LOST, which the abort notices carry to every other node.  Whatever set
 * of nodes freezes, some survivor watches one of them.
 *
 * Frame (little-endian, 24 bytes, then the payload): u32 kind (1 message, 2 end:
 * the sending node finished, 3 abort: the sending node stopped the session, the
 * code in the tag field, 4 beat), u32 source global index, u32 destination global index,
 * i32 tag, u64 payload bytes (0 but for a message).  The receiving thread streams each message
 * into its mailbox (p2p_match.h) as it arrives. */
#ifndef RUCCL_P2P_NET_H
#define RUCCL_P2P_NET_H

#include <stddef.h>
#include <stdint.h>

#include "../p2p_match.h"
#include "bootstrap_wire.h"
#include "transport_tcp.h"

#define RUCCL_FRAME_P2P 23     /* opener -> data port: "point-to-point from node k" */
#define RUCCL_FRAME_P2P_ACK 24 /* data port -> opener: taken */
#define RUCCL_P2P_FRAME_BYTES 24
#define RUCCL_P2P_MAX_MESSAGE (1ull << 40) /* bytes; a larger length is a protocol error */
/* MiB a local peer holds of messages from other nodes that no receive wanted yet;
   past it the connections they come on pause until a receive is posted (their
   senders wait).  RUCCL_P2P_UNEXPECTED_MB sets another bound. */
#define RUCCL_P2P_UNEXPECTED_MB 1024
/* ms a node's predecessor has for its first beat after this node starts watching (it
   may still be setting up), and a node awaited at set-up has to answer on its data
   port; RUCCL_LIVENESS_SETUP_GRACE_MS sets another.  Never less than the liveness
   timeout, never more than the session's timeout (session.c). */
#define RUCCL_LIVENESS_SETUP_GRACE_MS 120000

/* Where this node's peers' mailboxes are (global index -> mailbox, NULL when that
   peer is not on this node), and every peer's node. */
typedef struct {
  ruccl_mailbox_t *(*mailbox)(void *ctx, uint32_t global_index);
  void *ctx;
  unsigned n_total;
  const unsigned *node_of; /* by global index */
  /* Node `node` stopped the session with code (its notice on the control connection). */
  void (*stopped)(void *ctx, unsigned node, ruccl_result_t code);
  /* Node `node` sent nothing for ms milliseconds, more than the liveness timeout. */
  void (*silent)(void *ctx, unsigned node, int64_t ms);
} ruccl_p2p_routes_t;

/* After ruccl_net_connect_all: beats to the next node and watches the previous one
   (timeout_ms <= 0: not at all). */
void ruccl_p2p_net_start_liveness(ruccl_net_t *net, int64_t timeout_ms);

/* After ruccl_net_prepare (which knows where every node is), before
   ruccl_net_connect_all (a node ahead may open a stream during set-up). */
ruccl_result_t ruccl_p2p_net_init(ruccl_net_t *net, const ruccl_p2p_routes_t *routes);

/* Sends one message to peer dst on node `node` (opening the connection on first
   use); returns once the kernel has all of it.  A failure closes that connection:
   later sends to the node fail with the same code. */
ruccl_result_t ruccl_p2p_net_send(ruccl_net_t *net, unsigned node, uint32_t src, uint32_t dst, int32_t tag,
                                  const void *buf, size_t bytes, int64_t deadline_ns);

/* For the data port: an authenticated connection whose first frame (hello, len
   bytes) was RUCCL_FRAME_P2P.  Takes fd (returns 1: a stream from a node of this
   session, acknowledged) or leaves it to the caller to close (0). */
int ruccl_p2p_net_adopt(ruccl_net_t *net, int fd, unsigned from, const void *hello, size_t len, int64_t deadline_ns);

/* Tells node `node` on the control connection (opened if need be) that this node
   stops the session with code.
   Gives up at the deadline, or when a point-to-point message is half sent there. */
void ruccl_p2p_net_notify(ruccl_net_t *net, unsigned node, ruccl_result_t code, int64_t deadline_ns);
/* A connection to node `node` broke: waits up to ms for a notice of why (the
   session's state changes) or for the node's control stream to end. */
void ruccl_p2p_net_await_notice(const ruccl_net_t *net, unsigned node, int ms);

/* The end: with finished, every opened connection gets an end frame and is kept
   until the other node has taken all of it (bounded by the session's timeout);
   then the receiving thread stops and everything closes. */
void ruccl_p2p_net_close(ruccl_net_t *net, int finished);

#endif

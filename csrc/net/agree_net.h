/* agree_net.h — a fault-tolerant agreement among the nodes of a session, on
 * connections of its own through the nodes' data ports: it needs none of the
 * session's links, so it works after they were shut (a revoke, a lost node).
 *
 * Each round, every live node brings a contribution (bytes, the same length on every
 * node) and leaves with the same decision (bytes), made from the contributions by the
 * caller's combine function, with NULL for each node found lost.
 *
 * Rotating coordinator, crash-stop: the coordinator of a round is the lowest node
 * this node does not suspect.  It dials every higher node it does not suspect
 * (RUCCL_FRAME_AGREE, the question in the handshake) and asks for its state; the
 * node's data port answers once that node has entered the round: its contribution,
 * or the decision it already holds.  A node that refuses, breaks the connection or
 * stays silent past the liveness timeout is suspected (lost).  With every answer in,
 * the coordinator adopts a decision some node already holds, or else combines the
 * contributions, sends the decision back on each connection, and reads each node's
 * acknowledgement: the decision that node keeps (the first it heard), which the
 * coordinator adopts when it differs (the others took it for lost and went on).
 *
 * A node that waits for its coordinator pulls from it every 100-250 ms (a question
 * with the pull flag, answered at once: the decision, or not yet).  It suspects the
 * coordinator when its data port refuses (the process died), when the connection it
 * was asked on breaks before the decision came, when the pull finds it gone or out of
 * the round, or when it stays silent past the liveness timeout (frozen); then it looks
 * to the next one.  A node that decided answers every later question with its
 * decision, so once any live node decided, every live node that asks decides the
 * same; a node whose timeout ends the round answers nothing more of it.
 *
 * Every question carries a digest of the set of nodes the asker expects in the
 * round (those not skipped).  A node whose set differs answers "mismatch"; the
 * coordinator gives combine ruccl_agree_mismatch for it, so the decision can say
 * that the callers disagree.
 *
 * Frames after the handshake (ruccl_frame_send): STATE (node -> asker: u32 kind
 * 1 contribution / 2 decision / 3 not yet / 4 mismatch, then its bytes), DECIDE
 * (coordinator -> node: the decision's bytes) and ACK (node -> coordinator: the
 * decision it keeps). */
#ifndef RUCCL_AGREE_NET_H
#define RUCCL_AGREE_NET_H

#include <stddef.h>
#include <stdint.h>

#include "transport_tcp.h"

#define RUCCL_FRAME_AGREE 25        /* asker -> data port (the first frame): round u64, digest u64, flags u32 */
#define RUCCL_FRAME_AGREE_STATE 26  /* node -> coordinator */
#define RUCCL_FRAME_AGREE_DECIDE 27 /* coordinator -> node */
#define RUCCL_FRAME_AGREE_ACK 28    /* node -> coordinator */

/* What combine gets for a node that takes part with another set of nodes (the
   callers' exclusions differ). */
extern const unsigned char ruccl_agree_mismatch[1];

/* Combines the contributions of one round (contribs[k] NULL: node k is lost;
   ruccl_agree_mismatch: node k expects another set of nodes) into
   the decision (at most cap bytes; *len its length). */
typedef void (*ruccl_agree_combine_t)(void *ctx, unsigned num_nodes, const unsigned char *const *contribs,
                                      uint32_t contrib_len, unsigned char *decision, uint32_t cap, uint32_t *len);

/* With the net, before its data port opens; freed by ruccl_agree_net_close. */
ruccl_result_t ruccl_agree_net_init(ruccl_net_t *net);
/* Wakes every answer waiting for this node (the port is stopping); after the port
   stopped, frees the state. */
void ruccl_agree_net_stop(ruccl_net_t *net);
void ruccl_agree_net_close(ruccl_net_t *net);

/* One round (rounds count from 1, one after another, the same on every node).
   RUCCL_OK with the decision in decision[0..*len), or TIMEOUT at the deadline (the
   round is then abandoned here: this node answers nothing more of it), or NO_MEMORY.  skip (by node, or NULL): nodes not to wait for (they take no part: a
   shrink excludes every peer of theirs), counted lost.  liveness_ms: how long a
   silent node may stay silent (0: until the deadline). */
ruccl_result_t ruccl_agree_net_run(ruccl_net_t *net, uint64_t round, const void *mine, uint32_t len,
                                   const unsigned char *skip, ruccl_agree_combine_t combine, void *ctx,
                                   int64_t liveness_ms, int64_t deadline_ns, unsigned char *decision, uint32_t cap,
                                   uint32_t *dlen);

/* For the data port: an authenticated connection whose first frame was
   RUCCL_FRAME_AGREE.  Answers it (in the handshake thread), closes fd and returns 1;
   0 (a malformed question): the caller closes fd. */
int ruccl_agree_net_serve(ruccl_net_t *net, int fd, unsigned from, const void *first, size_t len);

#endif

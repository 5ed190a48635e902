/* agreement.h — what the peers of a collective tell each other before any data moves
 * (agreement.c, for collective.c): every peer's descriptor of its call, node 0's verdict and, when the
 * path changes or NCCL connects, the verdict's extras.
 *
 * Within a process these travel as the structs below.  Between nodes they travel in
 * the explicit encoding of this file: fixed widths, little-endian, every field in its
 * place (no padding, no pointer, the same bytes on every ABI), and a receiver checks
 * every field before it uses one (ruccl_desc_malformed, ruccl_verdict_check). */
#ifndef RUCCL_AGREEMENT_H
#define RUCCL_AGREEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "algorithms/algorithms.h"
#include "collective.h"
#include "device/nccl_api.h"
#include "device/path.h"
#include "transport.h"

typedef struct {
  uint64_t in, out; /* a peer's buffers (0 where it has none) */
} ruccl_buffer_ptrs_t;

#define DETAIL_MAX RUCCL_DETAIL_MAX
#define VERDICT_MAX 448
/* A small all-reduce's input that rides with the descriptor (ruccl_fuse_t below). */
#define FUSE_MAX_BYTES 4096

typedef struct {
  uint64_t seq;
  int32_t kind, dtype, op, ndim;
  int64_t shape[RUCCL_MAX_DIMS];
  uint32_t root_id;
  int32_t root_named; /* broadcast */
  int32_t sender;
  int32_t local_error;
  char detail[DETAIL_MAX];
  ruccl_path_facts_t facts;     /* where this peer's tensors are (device/path.h) */
  int32_t nccl_stale;           /* this peer's NCCL communicator is for another GPU */
  uint32_t fuse_bytes;          /* this node's input follows the descriptor (fuse_t), 0: not */
  ruccl_buffer_ptrs_t buffers;  /* and their addresses (used within one process only) */
} coll_desc_t;

typedef struct {
  uint64_t seq;
  int32_t code;
  int32_t sender_pos; /* broadcast: the one sender's team position */
  int32_t failures;   /* peers that reported a local error */
  int32_t path;       /* ruccl_path_t every peer takes */
  int32_t nccl_new;   /* NCCL path: connect with the id in the extras first */
  int32_t sliced;     /* host-staged path: in slices (execute_sliced) */
  int32_t extras;     /* a coll_extras_t follows the verdict */
  int32_t fused;      /* node 0 reduced the inputs that came with the descriptors: the result follows */
  char message[VERDICT_MAX];
} coll_verdict_t;

/* What follows a verdict only when the path changed or NCCL connects: the verdict
   itself stays small, for it travels with every collective. */
typedef struct {
  char path_why[96];
  ruccl_nccl_unique_id_t nccl_id;
} coll_extras_t;

/* A small all-reduce between nodes of one peer each rides with the agreement: every
   node sends its input right after its descriptor, node 0 reduces the inputs once
   every descriptor agrees (in node order, as the centralized algorithm does, so the
   bits are the same), and the result follows the verdict.  One exchange with node 0
   instead of the agreement's and then the algorithm's.  A verdict against the call
   (or a node that could not fuse) leaves every output as it was: the inputs that
   came along are dropped. */
typedef struct {
  const void *src;
  void *dst;
  size_t bytes;
  const ruccl_args_t *args;
} ruccl_fuse_t;

/* agreement.c: this peer's descriptor of its call; a local error (a bad argument, a
   device that cannot be used) is recorded in it, not returned. */
void ruccl_describe(const ruccl_comm_t *c, const ruccl_call_t *r, coll_desc_t *d);
/* One round: every descriptor to position 0, which judges them (and, unless vote,
   chooses the path and may reduce a fused input), and one verdict back.  Returns the
   verdict's code (the thread's last error set from its message), or the transport's
   error when the round itself could not complete (*transport_failed set).  The judge
   also gets every descriptor, by global index, in *all_out (NULL elsewhere).  vote:
   the round only collects local errors (after an NCCL launch, a staging). */
ruccl_result_t ruccl_agree(ruccl_comm_t *c, const ruccl_team_t *local, const ruccl_team_t *net,
                           const coll_desc_t *mine, int vote, const ruccl_fuse_t *fuse, coll_verdict_t *out,
                           coll_extras_t *x, const coll_desc_t **all_out, int *transport_failed);

/* Encoded sizes (bytes). */
#define RUCCL_DESC_WIRE_BYTES                                                                     \
  (8 + 4 * 4 + 8 * RUCCL_MAX_DIMS + 4 * 4 + DETAIL_MAX + (4 + 16 + 4 + 4) + 4 + 4 + 8 + 8)
#define RUCCL_VERDICT_WIRE_BYTES (8 + 8 * 4 + VERDICT_MAX)
#define RUCCL_EXTRAS_WIRE_BYTES (96 + RUCCL_NCCL_UNIQUE_ID_BYTES)

void ruccl_desc_encode(const coll_desc_t *d, unsigned char out[RUCCL_DESC_WIRE_BYTES]);
void ruccl_desc_decode(const unsigned char in[RUCCL_DESC_WIRE_BYTES], coll_desc_t *d);
void ruccl_verdict_encode(const coll_verdict_t *v, unsigned char out[RUCCL_VERDICT_WIRE_BYTES]);
void ruccl_verdict_decode(const unsigned char in[RUCCL_VERDICT_WIRE_BYTES], coll_verdict_t *v);
void ruccl_extras_encode(const coll_extras_t *x, unsigned char out[RUCCL_EXTRAS_WIRE_BYTES]);
void ruccl_extras_decode(const unsigned char in[RUCCL_EXTRAS_WIRE_BYTES], coll_extras_t *x);

/* Whether a descriptor (another node's: untrusted) holds only what it may: values in
   their enums' ranges, a rank the shape arrays hold, a terminated detail, an input
   no longer than a fused one.  A peer that reports a local error (a bad argument of
   its caller's, an op out of range say) is judged by that alone.  Returns what is
   wrong, or NULL. */
const char *ruccl_desc_malformed(const coll_desc_t *d);

/* A verdict (and its extras, when v->extras says they came) from node 0, checked
   before any of it is used: a code in range, a terminated message, a sender that is
   one of the n_total peers, a known path.  RUCCL_ERR_PROTOCOL otherwise. */
ruccl_result_t ruccl_verdict_check(unsigned n_total, const coll_verdict_t *v, const coll_extras_t *x);

#endif
